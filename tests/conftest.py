import gc

import keras
import pytest


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
