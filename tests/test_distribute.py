"""keras_vit.distribute: every mode's set-up and errors, and `fit` run for
real on simulated devices (JAX: 8 CPU devices, data and model parallel;
TensorFlow: MirroredStrategy on 2 logical CPUs), compared with one device.

The multi-device runs happen in a subprocess: the device count must be set
before the backend initialises."""

import json
import os
import re
import subprocess
import sys
import tempfile

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import distribute, training
from tests.helpers import ROOT as REPO_ROOT

BACKEND = keras.backend.backend()
ROOT = str(REPO_ROOT)
TINY = dict(
    hidden_size=16, mlp_dim=32, num_heads=4, num_layers=1, patch_size=8,
    input_shape=(16, 16, 3), num_classes=5,
)


def child_env(**extra):
    """Environment of a test subprocess. JAX children share a persistent
    compilation cache, so that only the first one compiles the model's
    initialisers and train step (tens of seconds on a small CPU)."""
    cache = os.path.join(tempfile.gettempdir(), f"keras_vit_tests_jax_cache_{os.getuid()}")
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR", cache),
        **extra,
    }


def run_child(function, env):
    """Runs `function()` of this module in a fresh interpreter; returns the
    JSON it prints last."""
    env = child_env(**env)
    code = f"from tests.test_distribute import {function}; {function}()"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# In-process: modes, errors, helpers
# --------------------------------------------------------------------------


def _determinism_without_tensorflow():
    sys.modules["tensorflow"] = None  # as if not installed: `import tensorflow` fails
    import keras

    from keras_vit import distribute

    distribute.enable_determinism()
    enabled = None
    if keras.backend.backend() == "torch":
        import torch

        enabled = torch.are_deterministic_algorithms_enabled()
    print(json.dumps({"torch_deterministic": enabled}))


@pytest.mark.one_backend  # each backend without TensorFlow, in its own process
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_determinism_needs_no_tensorflow(backend):
    """A `pip install keras-vit[torch]` user (no TensorFlow, so no tf.data)
    gets the backend's part: the switch raised ModuleNotFoundError."""
    pytest.importorskip(backend)
    result = run_child("_determinism_without_tensorflow", {"KERAS_BACKEND": backend})
    assert result["torch_deterministic"] is (True if backend == "torch" else None)


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="mode='gpu'"):
        distribute.get_distribution("gpu")


def test_modes_of_other_backends_are_clear_errors():
    wrong = {
        "tensorflow": ["data_parallel", "model_parallel"],
        "jax": ["mirrored"],
        "torch": ["tpu", "mirrored", "data_parallel", "model_parallel"],
    }[BACKEND]
    for mode in wrong:
        with pytest.raises(ValueError, match=f"mode='{mode}' is not available"):
            distribute.get_distribution(mode)
    with pytest.raises(ValueError, match="model_parallel_size"):
        distribute.get_distribution("none", model_parallel_size=2)
    # Multi-worker TensorFlow is not offered (keras-team/keras#20585).
    with pytest.raises(ValueError, match="mode='multi_worker'"):
        distribute.get_distribution("multi_worker")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TF_CONFIG is read by TensorFlow only")
def test_several_tensorflow_workers_are_refused_with_advice(monkeypatch):
    """`fit` cannot run under MultiWorkerMirroredStrategy; a TF_CONFIG with
    two workers must not silently train two separate models."""
    config = {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    for mode in ("auto", "mirrored", "none"):
        with pytest.raises(RuntimeError, match="keras-team/keras#20585") as info:
            distribute.get_distribution(mode)
        assert "multi_host=True" in str(info.value) and f"mode={mode!r}" in str(info.value)


@pytest.mark.skipif(BACKEND != "jax", reason="multi_host is JAX's")
def test_multi_host_refusals_come_before_the_start(monkeypatch):
    """What trained silently wrong or could never be saved, refused before
    `keras.distribution.initialize()`: weights sharded over hosts (Keras
    fetches a weight whole to save it), a training pipeline with seed=None
    built before the start (each host read its part of a batch from another
    order), and a process of several started without multi_host (a run of
    its own)."""
    import tensorflow as tf

    from keras_vit.data import pipelines
    from keras_vit.data.sources import DataSource

    with pytest.raises(ValueError, match="mode='model_parallel', multi_host=True"):
        distribute.get_distribution("model_parallel", multi_host=True)
    monkeypatch.setattr(pipelines, "unseeded_training_pipelines", 0)
    source = DataSource(tf.data.Dataset.from_tensor_slices(
        {"image": np.zeros((4, 8, 8, 3), "uint8"), "label": np.zeros(4, "int64")}), num_classes=2, num_examples=4)
    pipelines.finetune_pipeline(source, training=False, batch_size=2, image_size=8)
    pipelines.finetune_pipeline(source, training=True, batch_size=2, image_size=8, seed=0)
    assert pipelines.unseeded_training_pipelines == 0  # evaluation and seeded pipelines are alike everywhere
    pipelines.finetune_pipeline(source, training=True, batch_size=2, image_size=8)
    with pytest.raises(RuntimeError, match=r"1 keras_vit training pipeline\(s\) were built with seed=None before"):
        distribute.get_distribution("data_parallel", multi_host=True)
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
    with pytest.raises(RuntimeError, match="This process is one of several.*Received: multi_host=False"):
        distribute.get_distribution("data_parallel")
    # Keras takes no numpy input there, and the outputs span every host.
    monkeypatch.setattr(distribute, "process_count", lambda: 2)
    with pytest.raises(NotImplementedError, match="pad_to_batch=True.*Received: 2 processes"):
        distribute.DistributionSetup("data_parallel", "jax", num_replicas=4).predict(None, np.zeros((3, 2)))


@pytest.mark.skipif(BACKEND != "jax", reason="multi_host is JAX's")
def test_multi_host_start_without_a_cluster_and_after_jax_started_it():
    """No KERAS_DISTRIBUTION_* variables: an error naming them (JAX's bare
    "coordinator_address should be defined" before). After the script's own
    `jax.distributed.initialize`: the seed agreement alone (it called
    jax.distributed.initialize a second time, and failed), which seeds
    TensorFlow too: with Python's generator alone seeded, `seed=None`
    pipelines drew their orders apart on every host."""
    code = """if True:
        import os, random, sys
        random.seed(0)
        from keras_vit import distribute
        try:
            distribute.get_distribution("data_parallel", multi_host=True)
        except ValueError as error:
            print("refused:", error)
        import jax
        jax.distributed.initialize(coordinator_address="localhost:" + sys.argv[1], num_processes=1, process_id=0)
        print("after:", distribute.get_distribution("data_parallel", multi_host=True))
        import tensorflow as tf
        print("draw:", int(tf.random.uniform([], maxval=2**31 - 1, dtype=tf.int64)))
    """
    env = child_env(KERAS_BACKEND="jax")
    for name in ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID"):
        env.pop(name, None)
    draws = []
    for port in _free_ports(2):  # two runs of one script: two hosts' random states
        result = subprocess.run([sys.executable, "-c", code, str(port)], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "refused: multi_host=True found no cluster: set KERAS_DISTRIBUTION_JOB_ADDRESSES" in result.stdout
        assert "after: DistributionSetup(mode='data_parallel'" in result.stdout
        draws.append(result.stdout.split("draw:")[1])
    assert draws[0] == draws[1]


def test_tpu_without_a_tpu_is_a_clear_error():
    if BACKEND == "torch":
        pytest.skip("no TPU mode with torch (covered by the test above)")
    with pytest.raises(RuntimeError, match="mode='tpu'") as info:
        distribute.get_distribution("tpu")
    assert "No TPU" in str(info.value)


def test_none_and_auto_on_one_device():
    for mode in ("none", "auto"):
        setup = distribute.get_distribution(mode)
        assert setup.mode == "none" and setup.num_replicas == 1
        assert setup.backend == BACKEND
        with setup.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        x = np.random.default_rng(0).normal(size=(5, 3)).astype("float32")
        # predict pads nothing on one device and returns every row.
        out = setup.predict(model, x, batch_size=2, verbose=0)
        np.testing.assert_allclose(out, keras.ops.convert_to_numpy(model(x)), atol=1e-6)


def test_tf_config_workers_and_tpu_hints(monkeypatch):
    config = {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    assert distribute._tf_config_workers() == 3
    for text in ("not json", "[1]"):  # json's bare error came from TensorFlow's resolver, later
        monkeypatch.setenv("TF_CONFIG", text)
        with pytest.raises(ValueError, match=re.escape(f"Received: TF_CONFIG={text!r}")):
            distribute._tf_config_workers()
    for name in ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID"):
        monkeypatch.delenv(name, raising=False)
    hint = os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")
    assert distribute._tpu_hint() == hint
    monkeypatch.setenv("TPU_NAME", "my-tpu")
    assert distribute._tpu_hint()


def test_per_replica_batch_size():
    setup = distribute.DistributionSetup("data_parallel", BACKEND, num_replicas=8)
    assert setup.per_replica_batch_size(512) == 64
    with pytest.raises(ValueError, match="global_batch_size=100"):
        setup.per_replica_batch_size(100)
    assert setup.per_replica_batch_size(np.int64(512)) == 64
    with pytest.raises(ValueError, match="global_batch_size=True"):
        distribute.DistributionSetup("none", BACKEND, num_replicas=1).per_replica_batch_size(True)
    # A string was read as one device per character, an empty list as 0 replicas.
    for devices in ("cpu:0", []):
        with pytest.raises(ValueError, match=r"`devices` must be None \(all\) or a non-empty list"):
            distribute.get_distribution("auto", devices=devices)
    # A device twice counted two replicas; JAX then failed building the
    # model with a bare AssertionError.
    with pytest.raises(ValueError, match=re.escape("names a device twice. Received: devices=['cpu:0', 'CPU:0']")):
        distribute.get_distribution("auto", devices=["cpu:0", "CPU:0"])
    # `tpu` was ignored where no TPU is looked for.
    for mode in ("none", "auto") if BACKEND != "tensorflow" else ("none", "mirrored"):
        with pytest.raises(ValueError, match=rf"not used with mode='{mode}' .* Received: tpu='local'"):
            distribute.get_distribution(mode, tpu="local")


# --------------------------------------------------------------------------
# JAX on 8 simulated CPU devices
# --------------------------------------------------------------------------


def _tiny_setup():
    """The same initial weights, data and optimizer in every process."""
    rng = np.random.default_rng(0)
    model = keras_vit.ViT(None, **TINY)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.3, tuple(variable.shape)).astype("float32"))
    weights = model.get_weights()
    x = rng.uniform(-1, 1, (48, 16, 16, 3)).astype("float32")
    y = np.eye(5, dtype="float32")[rng.integers(0, 5, 48)]
    return weights, x, y


def _fit_losses(setup, weights, x, y, optimizer_fn, batch_size=16):
    with setup.scope():
        model = keras_vit.ViT(None, **TINY)
        model.set_weights(weights)
        model.compile(optimizer=optimizer_fn(), loss=training.SigmoidCrossEntropy())
        history = model.fit(x, y, batch_size=batch_size, epochs=3, shuffle=False, verbose=0)
    return model, [float(v) for v in history.history["loss"]]


def _clipped_sgd():
    # Large enough gradients that clipping at 1.0 is active.
    return training.MomentumSGD(0.05, accumulator_dtype="float32", global_clipnorm=1.0)


# Below every accumulated gradient's global norm in `_accumulation_report`
# (1.0 was not: the sixth update's norm is ~0.9), so clipping shapes every
# compared update.
CLIP = 0.5
RECORDED_UPDATES = 8


class _NormRecordingSGD(training.MomentumSGD):
    """MomentumSGD that also stores, per update, the global norm of the
    accumulated (mean) gradient that its clipping sees, in
    `update_norms[update]`: evidence that clipping acts on the accumulated
    updates. Test-only; the update itself is the parent's, untouched.

    Under `tf.distribute` the micro-batch gradients are summed across
    replicas first, as the parent does (an extra all-reduce, for the
    record only)."""

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        # Written in replica context under tf.distribute: the first
        # replica's value is kept (all replicas hold the same sum).
        self.update_norms = self.add_variable(
            shape=(RECORDED_UPDATES,), initializer="zeros", dtype="float32",
            name="update_norms", aggregation="only_first_replica",
        )

    def apply(self, grads, trainable_variables=None):
        from keras import ops

        grads = list(grads)
        if trainable_variables is not None and not self.built:
            self.build(list(trainable_variables))
        if trainable_variables is None:
            indices = range(len(grads))
        else:
            indices = [self._get_variable_index(v) for v in trainable_variables]
        present = [(i, g) for i, g in zip(indices, grads) if g is not None]
        summed = [g for _, g in present]
        context = distribute.tf_replica_context()
        if context is not None:
            summed = context.all_reduce("sum", summed)
        means = [
            (self._accumulators[i] + g) / self.accumulation_steps
            for (i, _), g in zip(present, summed)
        ]
        norm = ops.sqrt(sum(ops.sum(ops.square(ops.cast(m, "float32"))) for m in means))
        slot = ops.equal(ops.arange(RECORDED_UPDATES), ops.cast(self.iterations, "int32"))
        record = ops.logical_and(slot, self._is_update_step())
        self.assign(self.update_norms, ops.where(record, norm, self.update_norms.value))
        return super().apply(grads, trainable_variables)


def _scheduled_sgd(accumulation=None):
    """Warmup + cosine, clipping active: with `accumulation=k`, micro-batches
    of 1/k the size must give the same updates (the accumulated optimizer
    records each update's pre-clipping global norm)."""
    schedule = training.WarmupDecay(0.05, total_steps=10, warmup_steps=2)
    kind = _NormRecordingSGD if accumulation else training.MomentumSGD
    return kind(
        schedule, accumulator_dtype="float32", global_clipnorm=CLIP,
        gradient_accumulation_steps=accumulation,
    )


def _accumulation_report(setup, weights, x, y, report, name, whole=None):
    """Fits 3 epochs of 2 updates, each from 2 accumulated micro-batches of
    8 under `setup`; stores the largest weight difference from one device
    fed the whole batches of 16 without accumulation (`whole`: that model,
    fitted here when None), and each update's pre-clipping global norm.
    Returns `whole`, for the next report on the same data."""
    if whole is None:
        none = distribute.DistributionSetup("none", keras.backend.backend())
        whole, _ = _fit_losses(none, weights, x, y, _scheduled_sgd, batch_size=16)
    model, _ = _fit_losses(setup, weights, x, y, lambda: _scheduled_sgd(2), batch_size=8)
    report[name] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), whole.get_weights())
    )
    report[name + "_moved"] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(whole.get_weights(), weights)
    )
    report[name + "_updates"] = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    # The global norm of each update's accumulated gradient, before clipping.
    norms = keras.ops.convert_to_numpy(model.optimizer.update_norms)
    report[name + "_norms"] = [float(v) for v in norms[: report[name + "_updates"]]]
    return whole


def _assert_clipping_active(report, name):
    """Every compared update's accumulated gradient is above the clipping
    threshold, so clipping shaped each of the updates compared."""
    norms = report[name + "_norms"]
    assert len(norms) == report[name + "_updates"], (name, norms)
    assert min(norms) > CLIP, (name, norms)
    # The recorded norm is the global one (summed over replicas/devices):
    # the same as one device's.
    np.testing.assert_allclose(norms, report["accum_single_norms"], rtol=1e-5, err_msg=name)


def _new_variables_outside_the_scope(setup):
    """`enable_lora`, `reset_head` and `quantize` outside the scope of a
    distributed model: one clear error each (fit failed later with JAX's
    "incompatible devices" or TensorFlow's bare AssertionError); inside,
    the first two work."""
    with setup.scope():
        model = keras_vit.ViT(None, **TINY)
    errors = []
    for add in (lambda m: keras_vit.enable_lora(m, rank=2), lambda m: keras_vit.reset_head(m, 3),
                lambda m: m.quantize("int8")):
        try:
            add(model)
            errors.append("no error")
        except ValueError as error:
            errors.append(str(error))
    with setup.scope():
        adapted = keras_vit.reset_head(keras_vit.enable_lora(model, rank=2), 3)
        adapted.compile(optimizer=training.MomentumSGD(0.01), loss=training.SigmoidCrossEntropy())
        rng = np.random.default_rng(2)
        adapted.fit(rng.uniform(-1, 1, (16, 16, 16, 3)).astype("float32"), np.eye(3, dtype="float32")[[0, 1] * 8],
                    batch_size=8, epochs=1, verbose=0)
    return errors


def _built_before_the_distribution(setup):
    """A model built before the distribution, then used inside its scope:
    one clear error from each of `fit`, `evaluate` and `predict` (JAX's
    trainer said "Received incompatible devices for jitted computation")."""
    model = keras_vit.ViT(None, **TINY)
    model.compile(optimizer=training.MomentumSGD(0.01), loss=training.SigmoidCrossEntropy())
    x = np.random.default_rng(2).uniform(-1, 1, (16, 16, 16, 3)).astype("float32")
    y = np.eye(5, dtype="float32")[[0, 1] * 8]
    errors = []
    with setup.scope():
        for use in (lambda: model.fit(x, y, batch_size=8, verbose=0), lambda: model.evaluate(x, y, verbose=0),
                    lambda: model.predict(x, verbose=0)):
            try:
                use()
                errors.append("no error")
            except ValueError as error:
                errors.append(str(error))
    return errors


def _assert_new_variables_need_the_scope(errors, devices):
    assert len(errors) == 3
    for error, function in zip(errors, ("enable_lora", "reset_head", "quantize")):
        assert error.startswith(f"`{function}` adds variables to model") and (
            f"distributed over {devices} devices: call it inside the `setup.scope()`") in error, error


def _jax_child():
    import jax

    report = {}
    # A real (single-process) multi-host initialisation: jax.distributed.
    setup = distribute.get_distribution("data_parallel", multi_host=True)
    report["processes"] = jax.process_count()
    report["replicas"] = setup.num_replicas
    # The reference of the two-process test: this one process, 8 devices.
    report["hosts_reference"] = _hosts_fit(setup)
    weights, x, y = _tiny_setup()
    xa, ya = x[:32], y[:32]
    x, y = x[:16], y[:16]  # one step per epoch: three steps

    none = distribute.DistributionSetup("none", "jax")
    single, report["single"] = _fit_losses(none, weights, x, y, _clipped_sgd)
    model, report["data_parallel"] = _fit_losses(setup, weights, x, y, _clipped_sgd)
    report["dp_weights_error"] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), single.get_weights())
    )
    # The batch really is split over the 8 devices.
    layout = setup.distribution.get_data_layout((16, 16, 16, 3))
    report["data_axes"] = list(layout.axes)

    # predict on 100 rows: plain predict fails on the last batch, ours pads.
    rows = np.random.default_rng(1).uniform(-1, 1, (100, 16, 16, 3)).astype("float32")
    want = single.predict(rows, batch_size=16, verbose=0)
    with setup.scope():
        # (model.predict alone fails here: the last 4 rows do not divide
        # over 8 devices.)
        got = setup.predict(model, rows, batch_size=12, verbose=0)
    report["predict_rows"] = int(got.shape[0])
    report["predict_error"] = float(np.max(np.abs(got - want)))

    # Model parallel on a 2 x 4 mesh.
    setup = distribute.get_distribution("model_parallel", model_parallel_size=4)
    report["mp"] = [setup.num_replicas, setup.model_parallel_size]
    model, report["model_parallel"] = _fit_losses(setup, weights, x, y, _clipped_sgd)
    report["mp_weights_error"] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), single.get_weights())
    )
    report["outside_scope"] = _new_variables_outside_the_scope(setup)
    report["built_before"] = _built_before_the_distribution(setup)
    # Gradient accumulation (2 micro-batches of 8 rows over 8 devices, one
    # row each) equals one device fed the whole batches of 16.
    whole = _accumulation_report(none, weights, xa, ya, report, "accum_single")
    dp = distribute.get_distribution("data_parallel")
    _accumulation_report(dp, weights, xa, ya, report, "accum_dp", whole)
    _accumulation_report(setup, weights, xa, ya, report, "accum_mp", whole)
    shards = {}
    for variable in model.trainable_variables + model.optimizer.variables:
        value = variable.value
        shards[variable.path] = [list(value.shape), list(value.addressable_shards[0].data.shape)]
    # A bfloat16 momentum buffer (the fine-tuning default) is sharded like
    # its weight too.
    with setup.scope():
        finetuning = training.finetuning_optimizer(0.01, total_steps=10, warmup_steps=2)
        finetuning.build(model.trainable_variables)
    for variable in finetuning.variables:
        if "trace" in variable.path:
            value = variable.value
            shards[variable.path] = [list(value.shape), list(value.addressable_shards[0].data.shape), str(value.dtype)]
    report["shards"] = shards
    print(json.dumps(report))


@pytest.fixture(scope="module")
def jax_child(tmp_path_factory):
    """`_jax_child`'s report; its weights after `_hosts_fit` are in
    `reference.npz` of the returned directory."""
    if BACKEND != "jax":
        pytest.skip("keras.distribution runs on JAX only")
    directory = tmp_path_factory.mktemp("jax_child")
    report = run_child(
        "_jax_child",
        {
            "KERAS_BACKEND": "jax",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0",
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{_free_ports(1)[0]}",
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "1",
            "KERAS_DISTRIBUTION_PROCESS_ID": "0",
            "KERAS_VIT_TEST_OUT": str(directory / "reference.npz"),
        },
    )
    return report, directory


def test_jax_data_and_model_parallel_on_8_cpu_devices(jax_child):
    report = jax_child[0]
    assert report["processes"] == 1 and report["replicas"] == 8
    assert report["data_axes"] == ["batch", None, None, None]
    single = np.array(report["single"])
    assert single[0] > single[-1]  # it trains
    np.testing.assert_allclose(report["data_parallel"], single, rtol=1e-5)
    np.testing.assert_allclose(report["model_parallel"], single, rtol=1e-5)
    assert report["dp_weights_error"] < 1e-5 and report["mp_weights_error"] < 1e-5
    _assert_new_variables_need_the_scope(report["outside_scope"], 8)
    assert len(report["built_before"]) == 3
    for error, function in zip(report["built_before"], ("fit", "evaluate", "predict")):
        assert error.startswith("Model 'vit") and (
            f"outside the distribution now active (8 devices): its variables live on one device, which `{function}`"
        ) in error, error
    # Accumulated micro-batches == whole batches, on 1 and 8 devices, with
    # the schedule advancing once per update (6 updates from 12 batches).
    for name in ("accum_single", "accum_dp", "accum_mp"):
        assert report[name] < 1e-5, (name, report[name])
        assert report[name + "_updates"] == 6 and report[name + "_moved"] > 1e-2
        _assert_clipping_active(report, name)

    # Uneven batches: `predict` pads and slices.
    assert report["predict_rows"] == 100 and report["predict_error"] < 1e-5

    # Attention and MLP kernels (and their optimizer slots) are split 4 ways
    # along heads / hidden units; the rest is whole on every device.
    assert report["mp"] == [2, 4]
    shards = report["shards"]
    block = "encoderblock_0/"
    attention = block + "MultiHeadDotProductAttention_1/"
    for name in ("query", "key", "value"):
        assert shards[attention + name + "/kernel"] == [[16, 4, 4], [16, 1, 4]]
    assert shards[attention + "attention_output/kernel"] == [[4, 4, 16], [1, 4, 16]]
    assert shards[block + "MlpBlock_3/Dense_0/kernel"] == [[16, 32], [16, 8]]
    assert shards[block + "MlpBlock_3/Dense_1/kernel"] == [[32, 16], [8, 16]]
    slots = [p for p in shards if "Dense_0_kernel" in p and "trace" in p]
    assert slots and all(shards[p][:2] == [[16, 32], [16, 8]] for p in slots)
    assert any(shards[p][2:] == ["bfloat16"] for p in slots)
    replicated = (
        "embedding/kernel", "head/kernel", attention + "query/bias",
        "posembed_input/pos_embedding",
    )
    for path in replicated:
        assert shards[path][0] == shards[path][1], path


def test_layout_map_replicates_indivisible_weights():
    if BACKEND != "jax":
        pytest.skip("keras.distribution layouts are a JAX feature")
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((1, len(devices)), ("batch", "model"), devices)
    layout_map = distribute.vit_layout_map(mesh)
    path = "encoderblock_3/MultiHeadDotProductAttention_1/query/kernel"
    assert tuple(layout_map[path].axes) == (None, "model", None)
    assert layout_map["encoderblock_3/MlpBlock_3/Dense_1/kernel"].axes == ("model", None)
    assert layout_map["encoderblock_3/MlpBlock_3/Dense_1/bias"] is None
    with pytest.raises(ValueError, match="model_axis='tensor'"):
        distribute.vit_layout_map(mesh, model_axis="tensor")


# --------------------------------------------------------------------------
# TensorFlow MirroredStrategy on 2 logical CPUs
# --------------------------------------------------------------------------


def _tf_child():
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    report = {}
    weights, x, y = _tiny_setup()
    x, y = x[:16], y[:16]
    none = distribute.get_distribution("none")
    single, report["single"] = _fit_losses(none, weights, x, y, _clipped_sgd)
    setup = distribute.get_distribution("mirrored", devices=["/cpu:0", "/cpu:1"])
    report["replicas"] = setup.num_replicas
    model, report["mirrored"] = _fit_losses(setup, weights, x, y, _clipped_sgd)
    report["weights_error"] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), single.get_weights())
    )
    report["outside_scope"] = _new_variables_outside_the_scope(setup)
    # The first gradient's global norm: clipping at 1.0 is active, so
    # clipping each replica's half before the sum (what Keras does) would
    # not match one device.
    probe = keras_vit.ViT(None, **TINY)
    probe.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = training.SigmoidCrossEntropy()(y, probe(x, training=True))
    grads = tape.gradient(loss, [v.value for v in probe.trainable_variables])
    report["gradient_norm"] = float(tf.linalg.global_norm(grads))

    # Uneven batches: 7 rows in batches of 4 (the last one, 3 rows, splits 2/1).
    rows = np.random.default_rng(1).uniform(-1, 1, (7, 16, 16, 3)).astype("float32")
    with setup.scope():
        model.fit(rows, np.zeros((7, 5), "float32"), batch_size=4, epochs=1, verbose=0)
        got = setup.predict(model, rows, batch_size=4, verbose=0)
    report["predict_error"] = float(np.max(np.abs(got - model(rows))))

    # Gradient accumulation under MirroredStrategy (Keras' own fails there:
    # a cross-replica merge_call inside its cond) equals one device fed the
    # whole batches.
    _, xa, ya = _tiny_setup()
    whole = _accumulation_report(none, weights, xa[:32], ya[:32], report, "accum_single")
    _accumulation_report(setup, weights, xa[:32], ya[:32], report, "accum_mirrored", whole)
    report["predict_rows"] = int(got.shape[0])

    # BackupAndResume: running the finished fit again trains no further (it
    # crashed reading the mirrored step counter, on every resume).
    backup = tempfile.mkdtemp()

    def fit_with_backup():
        with setup.scope():
            fitted = keras_vit.ViT(None, **TINY)
            fitted.set_weights(weights)
            fitted.compile(optimizer=training.finetuning_optimizer(0.01, 4, warmup_steps=1),
                           loss=training.SigmoidCrossEntropy())
            fitted.fit(x, y, batch_size=8, epochs=2, verbose=0,
                       callbacks=[training.BackupAndResume(backup, save_freq="epoch")])
        return fitted.get_weights()

    report["resume_error"] = max(float(np.max(np.abs(a - b))) for a, b in zip(fit_with_backup(), fit_with_backup()))
    # Masked patch prediction's loss is scaled as Keras scales a compiled
    # loss: ln 512 with a zero head (it was 2 ln 512 on 2 replicas, and the
    # gradients doubled).
    from keras_vit.pretraining import MaskedPatchPrediction

    with setup.scope():
        backbone = keras_vit.ViT(None, include_top=False, **{k: v for k, v in TINY.items() if k != "num_classes"})
        mpp = MaskedPatchPrediction(backbone, seed=1)
        mpp.compile(optimizer=training.MomentumSGD(0.0))
        report["mpp_loss"] = mpp.evaluate(x, batch_size=8, verbose=0, return_dict=True)["loss"]

    # Its corruption: each replica its own rows of one draw for the global
    # batch, as one device (every replica drew the same pattern).
    def corruption(scope):
        with scope.scope():
            backbone = keras_vit.ViT(None, include_top=False, **{k: v for k, v in TINY.items() if k != "num_classes"})
            return MaskedPatchPrediction(backbone, seed=2).predict(x[:16], batch_size=8, verbose=0)["corruption"]

    kinds = corruption(setup)
    report["mpp_halves_differ"] = bool((kinds[:4] != kinds[4:8]).any() and (kinds[8:12] != kinds[12:]).any())
    report["mpp_kinds_as_one_device"] = bool((kinds == corruption(none)).all())

    # Drop-path likewise (every replica dropped the same paths): the
    # replicas' outputs are one device's for the global batch, and the
    # two replicas' halves (the same rows) differ.
    def drop_path_outputs(scope):
        with scope.scope():
            block = keras_vit.layers.TransformerEncoderBlock(num_heads=2, mlp_dim=8, drop_path_rate=0.5, seed=3)
            block.build((None, 3, 4))
            block.set_weights([np.full(w.shape, 0.1, "float32") for w in block.get_weights()])
            rows = np.tile(np.random.default_rng(2).uniform(1, 2, (8, 3, 4)).astype("float32"), (2, 1, 1))
            batches = tf.data.Dataset.from_tensor_slices(rows).batch(16)
            if scope is none:
                return block(next(iter(batches)), training=True).numpy()
            out = setup.strategy.run(tf.function(lambda b: block(b, training=True)),
                                     args=(next(iter(setup.strategy.experimental_distribute_dataset(batches))),))
            return np.concatenate([t.numpy() for t in out.values])

    paths = drop_path_outputs(setup)
    report["drop_path_error"] = float(np.max(np.abs(paths - drop_path_outputs(none))))
    report["drop_path_halves_differ"] = bool(np.abs(paths[:8] - paths[8:]).max() > 1e-3)

    # A TPU name that does not answer: the error says so in one line.
    try:
        distribute.get_distribution("tpu", tpu="local")
        report["tpu"] = "no error"
    except RuntimeError as error:
        report["tpu"] = str(error)
    print(json.dumps(report))


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute is TensorFlow only")
def test_tf_mirrored_strategy_on_2_logical_cpus():
    report = run_child("_tf_child", {"KERAS_BACKEND": "tensorflow"})
    assert report["replicas"] == 2
    single = np.array(report["single"])
    assert single[0] > single[-1]
    # Global clipping of the summed gradient: same as one device.
    np.testing.assert_allclose(report["mirrored"], single, rtol=1e-5)
    assert report["weights_error"] < 1e-5
    _assert_new_variables_need_the_scope(report["outside_scope"], 2)
    assert report["gradient_norm"] > 2.0  # clipping is active
    for name in ("accum_single", "accum_mirrored"):
        assert report[name] < 1e-5, (name, report[name])
        assert report[name + "_updates"] == 6 and report[name + "_moved"] > 1e-2
        _assert_clipping_active(report, name)
    assert report["predict_rows"] == 7 and report["predict_error"] < 1e-5
    assert "No TPU" in report["tpu"] and "tpu='local'" in report["tpu"]
    assert report["resume_error"] == 0.0
    assert report["mpp_loss"] == pytest.approx(np.log(512), rel=1e-5)
    assert report["mpp_halves_differ"] and report["mpp_kinds_as_one_device"]
    assert report["drop_path_halves_differ"] and report["drop_path_error"] < 1e-6


# --------------------------------------------------------------------------
# JAX: 2 real processes x 2 CPU devices == 1 process x 8 devices
# --------------------------------------------------------------------------


def _free_ports(count):
    """`count` distinct free ports: the sockets stay bound until all are
    chosen, so two coordinators never get the same port."""
    import contextlib
    import socket

    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _hosts_fit(setup):
    """The run compared across host layouts: the paper's fine-tuning
    optimizer (bf16 momentum, clip 1.0, warmup + cosine, 2 accumulated
    micro-batches), 6 micro-batches of 8 rows (global), from a `tf.data`
    pipeline of global batches that Keras shards per host: each process
    reads only its share of every batch. Process 0 saves the weights to
    $KERAS_VIT_TEST_OUT."""
    import jax
    import tensorflow as tf

    weights, x, y = _tiny_setup()
    dataset = tf.data.Dataset.from_tensor_slices((x[:48], y[:48])).batch(8)
    with setup.scope():
        model = keras_vit.ViT(None, **TINY)
        model.set_weights(weights)
        model.compile(
            optimizer=training.finetuning_optimizer(
                0.05, total_steps=4, warmup_steps=1, gradient_accumulation_steps=2
            ),
            loss=training.SigmoidCrossEntropy(),
        )
        history = model.fit(dataset, epochs=1, verbose=0)
        host_batch = next(iter(setup.distribution.distribute_dataset(dataset)))[0].shape[0]
    if jax.process_index() == 0:
        np.savez(os.environ["KERAS_VIT_TEST_OUT"], *model.get_weights())
    return {
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "updates": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        "host_batch": int(host_batch),
        "loss": float(history.history["loss"][0]),
        # What BackupAndResume gathers to stop every process with one's failure.
        "gathered": distribute.all_processes(10 + jax.process_index()),
    }


def _jax_hosts_child():
    """One host of a multi-process run, seeded apart as users seed hosts
    for their dropout (`seed + process_index`): Keras' start left the seeds
    apart, and the model's initial weights failed in `device_put`."""
    import tensorflow as tf

    keras.utils.set_random_seed(7 + int(os.environ["KERAS_DISTRIBUTION_PROCESS_ID"]))
    setup = distribute.get_distribution("data_parallel", multi_host=True)
    # What a seed=None pipeline draws its order from.
    tf_draws = distribute.all_processes(int(tf.random.uniform([], maxval=2**31 - 1, dtype=tf.int64)))
    print(json.dumps(dict(_hosts_fit(setup), tf_draws_agree=len(set(tf_draws)) == 1)))


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution multi-host runs on JAX")
def test_jax_two_processes_equal_one_process(jax_child, tmp_path):
    port = _free_ports(1)[0]

    def launch(index):
        env = child_env(
            KERAS_BACKEND="jax",
            XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0",
            KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
            KERAS_DISTRIBUTION_NUM_PROCESSES="2",
            KERAS_DISTRIBUTION_PROCESS_ID=str(index),
            KERAS_VIT_TEST_OUT=str(tmp_path / "hosts.npz"),
        )
        code = "from tests.test_distribute import _jax_hosts_child; _jax_hosts_child()"
        return subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )

    def finish(process):
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, out[-2000:] + err[-4000:]
        return json.loads(out.strip().splitlines()[-1])

    # 2 processes x 2 devices against 1 process x 8 devices (the 8-device
    # test's child: one process fewer to start).
    hosts = [launch(i) for i in range(2)]
    reports = [finish(p) for p in hosts]
    single, directory = dict(jax_child[0]["hosts_reference"]), jax_child[1]
    loss = single.pop("loss")
    assert single == {"processes": 1, "devices": 8, "local_devices": 8, "updates": 3, "host_batch": 8,
                      "gathered": [10]}
    for report in reports:
        assert report.pop("loss") == pytest.approx(loss, rel=1e-5) and report.pop("tf_draws_agree")
        assert report == {"processes": 2, "devices": 4, "local_devices": 2, "updates": 3, "host_batch": 4,
                          "gathered": [10, 11]}
    start = _tiny_setup()[0]
    with np.load(tmp_path / "hosts.npz") as a, np.load(directory / "reference.npz") as b:
        got, want = [a[k] for k in a.files], [b[k] for k in b.files]
    assert max(float(np.max(np.abs(g - w))) for g, w in zip(got, want)) < 1e-5
    assert max(float(np.max(np.abs(w - s))) for w, s in zip(want, start)) > 1e-2
