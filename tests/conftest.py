import gc
import signal

import keras
import pytest


def _full_float32_matmuls():
    """The suite compares float32 results within 1e-5 to 1e-4 of references
    computed in full float32. NVIDIA GPUs from Ampere on multiply float32
    matrices in TF32 by default under JAX and TensorFlow, and PyTorch
    convolves in it: 9e-4 of ViT-B/16's logits on an H200
    (benchmarks/device_parity.py). On a GPU the suite asks for full float32,
    so that it tests the code and not the device's default; CPUs compute in
    full float32 anyway."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        if jax.default_backend() != "cpu":
            jax.config.update("jax_default_matmul_precision", "highest")
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    elif backend == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


_full_float32_matmuls()


def _interruptible():
    """A suite started in the background by a script (`cmd &` in a shell
    without job control) inherits SIGINT ignored, and Python keeps it so:
    the tests of a Ctrl-C (a notebook's interrupt) got no KeyboardInterrupt,
    and their worker processes none either. Python's own handler, as in a
    terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_interruptible()


def pytest_addoption(parser):
    parser.addoption(
        "--large", action="store_true", default=False,
        help="also run the tests marked `large` (full-size models, one forward "
        "pass each); scripts/run_tests.sh and CI always pass it",
    )


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.backend.backend()}"


def pytest_collection_modifyitems(config, items):
    if config.getoption("--large"):
        return
    skip = pytest.mark.skip(reason="full-size model: opt in with --large")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    # What is alive now (the frameworks' modules, the test modules) lives to
    # the end: kept out of the cyclic collector's full passes, which the
    # models of a long run (a million objects) otherwise make ever longer.
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _fixed_seed():
    keras.utils.set_random_seed(0)


@pytest.fixture
def local_bucket(tmp_path, monkeypatch):
    """Serves `tmp_path/bucket` over HTTP on the loopback interface, as the
    checkpoints' mirror (`KERAS_VIT_WEIGHTS_URL`), with a fresh cache."""
    import functools
    import http.server
    import threading

    root = tmp_path / "bucket"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # shutdown() waits for the loop's next poll: 0.5 s by default, per test.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("KERAS_VIT_CACHE_DIR", str(tmp_path / "cache"))
    yield root
    server.shutdown()
