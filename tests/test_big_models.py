"""Big models on small accelerators (issue 23): gradient checkpointing
(`remat=`) gives the numbers without it, and LoRA trains adapters only,
saves them alone, and merges for export."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from tests.helpers import ROOT  # noqa: F401 - the suite's path set-up

BACKEND = keras.backend.backend()
TINY = dict(hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32, patch_size=4)
SHAPE = (8, 8, 3)


def _model(remat, seed=3, **overrides):
    """A tiny ViT whose weights are all random (the head included: a zero
    head passes no gradient to the rest)."""
    keras.utils.set_random_seed(seed)
    model = keras_vit.ViT(None, input_shape=SHAPE, num_classes=5, remat=remat, **{**TINY, **overrides})
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        variable.assign(rng.normal(0.0, 0.3, tuple(variable.shape)).astype("float32"))
    return model


def _batch(n=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, *SHAPE)).astype("float32")
    return x, np.eye(5, dtype="float32")[rng.integers(0, 5, n)]


def _gradients(model, x, y):
    """`(loss, [gradient of each trainable weight])` of one training call
    (dropout and drop-path active)."""
    loss_fn = training.SoftmaxCrossEntropy()
    # Unseeded dropout draws from PyTorch's own generator there: each
    # model's call starts from the same state.
    keras.utils.set_random_seed(11)
    if BACKEND == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        others = [v.value for v in model.non_trainable_variables]

        def loss(trainable):
            logits, _ = model.stateless_call(trainable, others, x, training=True)
            return loss_fn(y, logits)

        value, grads = jax.value_and_grad(loss)(trainable)
        return float(value), [np.asarray(g) for g in grads]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            value = loss_fn(y, model(x, training=True))
        return float(value), [g.numpy() for g in tape.gradient(value, model.trainable_variables)]
    value = loss_fn(y, model(x, training=True))
    value.backward()
    return float(value), [v.value.grad.detach().cpu().numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("regularised", [False, True], ids=["plain", "dropout_and_drop_path"])
def test_remat_gives_the_same_logits_and_gradients(regularised):
    """Within 1e-6 of the model without remat, with dropout, attention
    dropout and drop-path drawing in training (the recomputation must draw
    the forward's masks: it did not on TensorFlow and PyTorch before the
    block restarted its seed generators)."""
    extra = dict(dropout_rate=0.2, attention_dropout_rate=0.1, drop_path_rate=0.3) if regularised else {}
    x, y = _batch()
    plain, rematted = _model(False, **extra), _model(True, **extra)
    assert [b.remat for b in rematted.layers if hasattr(b, "remat")] == [True, True]
    for a, b in zip(plain.weights, rematted.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    logits = []
    for model in (rematted, plain):
        keras.utils.set_random_seed(7)
        logits.append(keras.ops.convert_to_numpy(model(x, training=True)))
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-6, atol=1e-6)
    loss_a, grads_a = _gradients(plain, x, y)
    loss_b, grads_b = _gradients(rematted, x, y)
    assert loss_b == pytest.approx(loss_a, rel=1e-6) and len(grads_a) == len(grads_b) == len(plain.trainable_weights)
    for weight, a, b in zip(plain.trainable_weights, grads_a, grads_b):
        assert np.abs(a).max() > 0, weight.path  # every weight gets a gradient
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6, err_msg=weight.path)


def test_remat_fit_with_accumulation_and_save_load(tmp_path):
    """`fit` (compiled: XLA on JAX and TensorFlow) with 2 accumulated
    micro-batches ends with the weights of the run without remat, and the
    flag survives `.keras` save and load."""
    x, y = _batch(8, seed=1)
    models = []
    for remat in (False, True):
        model = _model(remat, dropout_rate=0.1, drop_path_rate=0.2)
        model.compile(optimizer=training.finetuning_optimizer(0.1, 4, warmup_steps=1, gradient_accumulation_steps=2),
                      loss=training.SoftmaxCrossEntropy())
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
        assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2
        models.append(model)
    for a, b in zip(*(m.weights for m in models)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(b), keras.ops.convert_to_numpy(a), rtol=1e-5,
                                   atol=1e-6, err_msg=a.path)
    path = str(tmp_path / "remat.keras")
    models[1].save(path)
    loaded = keras.saving.load_model(path, compile=False)
    assert all(layer.remat for layer in loaded.layers if isinstance(layer, keras_vit.layers.TransformerEncoderBlock))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(models[1](x)),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="`remat` must be a bool. Received: remat='yes'"):
        _model("yes")
