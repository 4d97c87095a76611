"""`reset_head` and `freeze_backbone`: head values, shared weights, frozen
counts, and a training step that moves only the head."""

import keras
import numpy as np
import pytest

import keras_vit
from tests.helpers import randomize_weights

TINY = dict(input_shape=(16, 16, 3), hidden_size=8, mlp_dim=16, num_heads=2, num_layers=1, patch_size=8)


def tiny(**kwargs):
    return randomize_weights(keras_vit.ViT(None, **{**TINY, **kwargs}))


def images(n=4, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, 16, 16, 3)).astype("float32")


def test_reset_head_is_zero_and_drops_pre_logits():
    model = tiny(num_classes=21, representation_size=8)
    new = keras_vit.reset_head(model, 5, bias=-2.0)
    head = new.get_layer("head")
    np.testing.assert_array_equal(head.kernel.numpy(), np.zeros((8, 5)))
    np.testing.assert_array_equal(head.bias.numpy(), np.full(5, -2.0))
    np.testing.assert_array_equal(new.predict(images(), verbose=0), np.full((4, 5), -2.0))
    # The paper's fine-tuning head: pooled token -> zero D x K layer.
    assert "pre_logits" not in [layer.name for layer in new.layers]
    assert head.input is model.get_layer("pool").output
    # Every other layer (and its weights) is shared with the source model.
    assert new.get_layer("encoderblock_0") is model.get_layer("encoderblock_0")
    assert len(new.weights) == len(model.weights) - 2  # pre_logits gone, a new head for the old


def test_reset_head_keeps_pre_logits_when_asked():
    model = tiny(num_classes=21, representation_size=6)
    new = keras_vit.reset_head(model, 3, keep_pre_logits=True, activation="softmax")
    assert new.get_layer("pre_logits") is model.get_layer("pre_logits")
    assert tuple(new.get_layer("head").kernel.shape) == (6, 3)
    np.testing.assert_allclose(new.predict(images(), verbose=0), np.full((4, 3), 1 / 3), rtol=1e-6)


@pytest.mark.parametrize("kind", ["pre_norm_fc_norm", "map"])
def test_reset_head_after_fc_norm_or_attention_pooling(kind):
    """Issue 24: the new head follows what the checkpoint's head read (the
    normalised pooled features after `fc_norm`, or the attention-pooling
    head), so fine-tuning starts from the same features."""
    from tests.helpers import MODEL_KINDS

    options = MODEL_KINDS["pre_norm_fc_norm"] if kind != "map" else dict(classifier="map", class_token=False)
    model = tiny(**{**{k: v for k, v in options.items() if k not in ("input_shape", "patch_size")},
                    "num_classes": 4})
    new = keras_vit.reset_head(model, 3)
    assert new.get_layer("head").input is model.get_layer("head").input
    np.testing.assert_array_equal(new.predict(images(), verbose=0), np.zeros((4, 3)))
    frozen = keras_vit.freeze_backbone(new)
    assert [w.path for w in frozen.trainable_weights] == ["head/kernel", "head/bias"]


def test_reset_head_on_a_pooled_backbone_and_errors():
    backbone = tiny(include_top=False, pooling="gap", classifier="gap")
    new = keras_vit.reset_head(backbone, np.int64(7))  # a class count from numpy is an int too
    assert new.output.shape == (None, 7) and new.get_layer("head").input is backbone.output
    with pytest.raises(ValueError, match=r"Received: model 'vit' with output shape \(None, 5, 8\)"):
        keras_vit.reset_head(tiny(include_top=False), 7)
    with pytest.raises(ValueError, match="Received: num_classes=0"):
        keras_vit.reset_head(tiny(), 0)
    with pytest.raises(ValueError, match="Received: keep_pre_logits='yes'"):
        keras_vit.reset_head(tiny(), 2, keep_pre_logits="yes")
    # Issue 21: a bias that is not a number failed inside Keras' initialiser.
    for bias in ("abc", True, float("nan"), None):
        with pytest.raises(ValueError, match=rf"`bias` must be a finite number. Received: bias={bias!r}"):
            keras_vit.reset_head(tiny(), 2, bias=bias)


def test_freeze_backbone_counts_and_training_moves_only_the_head():
    model = keras_vit.freeze_backbone(keras_vit.reset_head(tiny(representation_size=8), 3))
    assert [w.path for w in model.trainable_weights] == ["head/kernel", "head/bias"]
    assert len(model.non_trainable_weights) == len(model.weights) - 2
    frozen = sum(int(np.prod(w.shape)) for w in model.non_trainable_weights)
    assert frozen == model.count_params() - (8 * 3 + 3)
    before = [w.numpy().copy() for w in model.weights]
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images(), np.array([0, 1, 2, 0]), epochs=1, batch_size=4, verbose=0)
    for weight, old in zip(model.weights, before):
        changed = not np.array_equal(weight.numpy(), old)
        assert changed == weight.path.startswith("head/"), weight.path
    with pytest.raises(ValueError, match="no layer named 'head'"):
        keras_vit.freeze_backbone(tiny(include_top=False, pooling="token"))


def test_frozen_backbone_stays_frozen_after_keras_save_and_load(tmp_path):
    """Issue 21: a restored encoder block builds its sub-layers (Keras'
    MultiHeadAttention's projections too) after `trainable=False` is set;
    they stay frozen. Unfreezing the loaded model's layers unfreezes all."""
    model = keras_vit.freeze_backbone(keras_vit.reset_head(tiny(num_layers=2), 3))
    model.save(tmp_path / "probe.keras")
    for loaded in (keras.saving.load_model(tmp_path / "probe.keras"),
                   keras.Model.from_config(model.get_config())):
        assert [w.path for w in loaded.trainable_weights] == ["head/kernel", "head/bias"]
        assert len(loaded.non_trainable_weights) == len(model.weights) - 2
        for layer in loaded.layers:  # (`loaded.trainable = True` is skipped on TF: already True)
            layer.trainable = True
        assert len(loaded.trainable_weights) == len(model.weights)


def test_reset_head_keeps_a_single_input_structure(recwarn):
    """Calling the new model with an array, as users do, gives no Keras
    warning about the input structure (a list of one input would)."""
    import warnings

    model = keras_vit.reset_head(keras_vit.ViT(None, num_layers=1, hidden_size=16, num_heads=2,
                                               mlp_dim=32, patch_size=8, input_shape=(16, 16, 3),
                                               num_classes=3), num_classes=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model(np.zeros((2, 16, 16, 3), "float32"))
    assert tuple(out.shape) == (2, 4)
