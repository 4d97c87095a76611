"""Shared test helpers: random weights, tolerances, gradients per backend."""

import keras
import numpy as np


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
