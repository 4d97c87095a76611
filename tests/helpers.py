"""Shared test helpers, in the spirit of keras-hub's `TestCase`: random
weights, the parity tolerance, gradients per backend, the table of model
kinds, and the checks every layer and model kind goes through (config and
serialization round trip, saving, a gradient reaching every weight)."""

import json
import pathlib
import shutil

import keras
import numpy as np

# The repository root (tests are laid out like the package, one folder deep).
ROOT = pathlib.Path(__file__).resolve().parent.parent

# The model kinds keras_vit builds, tiny: builder keywords for
# `keras_vit.ViT(None, **TINY_WIDTHS, **MODEL_KINDS[kind])`. One table for
# every test that must hold for each kind (anatomy, gradients, saving).
TINY_WIDTHS = dict(hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32)
MODEL_KINDS = {
    "plain": dict(patch_size=8, input_shape=(16, 24, 3), num_classes=5),
    "gap": dict(patch_size=8, input_shape=(16, 24, 3), classifier="gap", include_top=False),
    "pre_logits": dict(patch_size=4, input_shape=(16, 16, 3), representation_size=12, num_classes=7),
    # Root (stride 4) + one stage of one unit (stride 1) x patch 2.
    "hybrid": dict(patch_size=2, input_shape=(32, 32, 3), resnet=(1,), resnet_width_factor=0.5,
                   classifier="gap", num_classes=3),
    "root_only": dict(patch_size=2, input_shape=(32, 48, 3), resnet=(), resnet_width_factor=0.5,
                      include_top=False),
    # Later families' options (tests/weights/test_timm_families.py checks them
    # against timm): DINOv2 with registers, and a CLIP-like pre-norm model
    # pooling by average with a class token and fc_norm.
    "registers": dict(patch_size=8, input_shape=(16, 24, 3), num_classes=4, gelu="exact", layer_scale_init=0.1,
                      num_register_tokens=2, no_embed_class=True, qk_norm=True),
    "pre_norm_fc_norm": dict(patch_size=8, input_shape=(16, 16, 3), num_classes=3, gelu="quick", pre_norm=True,
                             patch_bias=False, layer_norm_epsilon=1e-5, classifier="gap", class_token=True,
                             fc_norm=True),
}


def tiny_model(kind, **overrides):
    """A model of one kind of `MODEL_KINDS`."""
    import keras_vit

    return keras_vit.ViT(None, **{**TINY_WIDTHS, **MODEL_KINDS[kind], **overrides})


def random_images(model, batch=2, seed=0):
    """Images in [-1, 1] of the model's input size."""
    shape = tuple(model.input_shape[1:])
    return np.random.default_rng(seed).uniform(-1, 1, (batch, *shape)).astype("float32")


def randomize_weights(model, seed=0, scale=0.5):
    """Gives every variable random values (zero-initialised ones included),
    so that parity tests exercise every weight."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape = tuple(variable.shape)
        value = rng.normal(0.0, scale, shape)
        if "gamma" in variable.path or "scale" in variable.path:
            value = 1.0 + value
        variable.assign(value.astype(variable.dtype))
    return model


def assert_close_rel(actual, expected, tol=1e-4, what="output"):
    """|actual - expected| <= tol * max|expected| (the project's parity rule)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    scale = float(np.max(np.abs(expected)))
    err = float(np.max(np.abs(actual - expected)))
    assert scale > 0, f"{what}: the reference is all zeros, the test is void"
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol} x {scale:.3g}"


def gradients(model, x, y=None, training=True):
    """Gradients of a scalar loss w.r.t. every trainable variable, as numpy."""
    backend = keras.backend.backend()
    variables = model.trainable_variables

    def loss_of(out):
        out = out if not isinstance(out, (list, tuple)) else out[0]
        return keras.ops.sum(keras.ops.square(out))

    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_of(model(x, training=training))
        grads = tape.gradient(loss, [v.value for v in variables])
        return [np.zeros(v.shape) if g is None else np.asarray(g) for v, g in zip(variables, grads)]
    if backend == "jax":
        import jax

        trainable = [v.value for v in variables]
        non_trainable = [v.value for v in model.non_trainable_variables]

        def f(tv):
            out, _ = model.stateless_call(tv, non_trainable, x, training=training)
            return loss_of(out)

        return [np.asarray(g) for g in jax.jit(jax.grad(f))(trainable)]
    model.zero_grad() if hasattr(model, "zero_grad") else None
    loss = loss_of(model(x, training=training))
    loss.backward()
    grads = [v.value.grad for v in variables]
    return [np.zeros(v.shape) if g is None else g.detach().cpu().numpy() for v, g in zip(variables, grads)]


def lazy_build(build):
    """Runs `build()` without allocating or initialising any weight.

    In a StatelessScope Keras defers variable initialisation; the deferred
    variables are then dropped with the session state instead of being
    initialised when the next scope exits. Shapes (and so parameter counts)
    are real.
    """
    with keras.StatelessScope(initialize_variables=False):
        result = build()
    keras.backend.clear_session(free_memory=False)
    return result


def fast_jax_compiles():
    """Generator for a module fixture: on JAX, XLA's optimisation passes
    cost more than they save on tiny models run once or twice."""
    if keras.backend.backend() != "jax":
        yield
        return
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", before)


def torch_graphs(function, *inputs, calls=1, then=()):
    """The number of graphs `torch.compile` makes of `function` over
    `calls` calls on `inputs`, then one call on each argument tuple of
    `then`: 1 when it traces whole and once. Counted by a backend of
    our own, not `torch._dynamo.explain`, which resets torch.compile's
    caches: later tests would compile again what earlier ones left (a
    dynamic-size model at the lowest versions: 35 s instead of 1.5 s)."""
    import torch

    compiled = []
    step = torch.compile(function, backend=lambda graph, example_inputs: compiled.append(graph) or graph.forward)
    for arguments in [inputs] * calls + list(then):
        step(*arguments)
    return len(compiled)


def _numpy(out):
    if isinstance(out, (list, tuple)):
        return [keras.ops.convert_to_numpy(o) for o in out]
    return keras.ops.convert_to_numpy(out)


def _config_json(obj):
    return json.loads(json.dumps(obj.get_config()))


def assert_every_weight_gets_a_gradient(model, x):
    """Every trainable variable gets a non-zero gradient of a loss of the
    outputs. Randomise the weights first: zero-initialised ones (the head,
    gn3 scales) would block every gradient upstream of them."""
    grads = gradients(model, x, training=False)
    names = [v.path for v in model.trainable_variables]
    assert len(grads) == len(names) > 0
    dead = [n for n, g in zip(names, grads) if not np.any(np.abs(g) > 0)]
    assert not dead, f"no gradient reaches {dead}"


def assert_saving_round_trip(model, x, directory, atol=1e-6):
    """`.keras` (safe mode) and `.weights.h5` give back the same outputs and
    the same config."""
    expected = _numpy(model(x, training=False))
    path = str(directory / f"{model.name}.keras")
    model.save(path)
    revived = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(_numpy(revived(x, training=False)), expected, atol=atol)
    assert _config_json(revived) == _config_json(model)
    weights_path = str(directory / f"{model.name}.weights.h5")
    model.save_weights(weights_path)
    fresh = model.__class__.from_config(model.get_config())
    fresh.load_weights(weights_path)
    for a, b in zip(model.weights, fresh.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), a.path)
    return revived


def assert_layer_round_trip(cls, kwargs, x, atol=1e-6):
    """A layer's config holds its arguments, survives JSON, rebuilds a layer
    with the same outputs, and (de)serializes under keras_vit's package name."""
    layer = cls(**kwargs, name="layer")
    out = _numpy(layer(x))
    config = layer.get_config()
    for key, value in kwargs.items():
        assert config[key] == (list(value) if isinstance(value, tuple) else value) or (
            config[key] == value
        ), (key, config[key], value)
    revived = cls.from_config(json.loads(json.dumps(config)))
    assert _config_json(revived) == json.loads(json.dumps(config))
    revived(x)
    revived.set_weights(layer.get_weights())
    np.testing.assert_allclose(_numpy(revived(x)), out, atol=atol)
    serialized = keras.saving.serialize_keras_object(layer)
    assert serialized["registered_name"] == f"keras_vit>{cls.__name__}"
    assert type(keras.saving.deserialize_keras_object(serialized)) is cls


class CopyCheckpointAfterEpoch0(keras.callbacks.Callback):
    """Copies the `BackupAndResume` directory `directory` to `copy` as the
    second epoch starts: the first epoch's checkpoint, as a run killed then
    would leave it (the end-of-epoch checkpoint is written when the next
    step starts; the lock is left out)."""

    def __init__(self, directory, copy):
        super().__init__()
        self.directory, self.copy = directory, copy

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == 1 and batch == 0:
            shutil.copytree(self.directory, self.copy, ignore=shutil.ignore_patterns("*.lock"))
