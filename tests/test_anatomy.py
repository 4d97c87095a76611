"""`keras_vit.models.anatomy` (defined in `keras_vit/anatomy.py`): the one reader of a model's structure, on a
table of model kinds (plain, gap, pre-logits, hybrid, root-only hybrid)."""

import re

import keras
import pytest

import keras_vit
from keras_vit.models import anatomy
from tests.helpers import MODEL_KINDS, tiny_model

# kind (tests.helpers.MODEL_KINDS): the expected anatomy fields
EXPECTED = {
    "plain": dict(grid=(2, 3), patch_size=(8, 8), num_prefix_tokens=1, hybrid=False,
                  has_pre_logits=False, num_classes=5, outputs_tokens=False,
                  embedding_patch_size=(8, 8), resnet=None, resnet_width=None),
    "gap": dict(grid=(2, 3), patch_size=(8, 8), num_prefix_tokens=0, hybrid=False,
                has_pre_logits=False, num_classes=None, outputs_tokens=True),
    "pre_logits": dict(grid=(4, 4), patch_size=(4, 4), num_prefix_tokens=1, hybrid=False,
                       has_pre_logits=True, num_classes=7, outputs_tokens=False),
    "hybrid": dict(grid=(4, 4), patch_size=(8, 8), num_prefix_tokens=0, hybrid=True,
                   has_pre_logits=False, num_classes=3, outputs_tokens=False,
                   embedding_patch_size=(2, 2), resnet=(1,), resnet_width=32),
    "root_only": dict(grid=(4, 6), patch_size=(8, 8), num_prefix_tokens=1, hybrid=True,
                      has_pre_logits=False, num_classes=None, outputs_tokens=True,
                      embedding_patch_size=(2, 2), resnet=(), resnet_width=32),
    "registers": dict(grid=(2, 3), num_prefix_tokens=3, posemb_prefix_tokens=0, has_class_token=True,
                      num_classes=4, outputs_tokens=False),
    "pre_norm_fc_norm": dict(grid=(2, 2), num_prefix_tokens=1, posemb_prefix_tokens=1, has_class_token=True,
                             num_classes=3, outputs_tokens=False),
}


def test_the_kind_table_is_complete():
    assert sorted(EXPECTED) == sorted(MODEL_KINDS)


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
def test_anatomy_of_every_model_kind(kind):
    keywords, expected = MODEL_KINDS[kind], EXPECTED[kind]
    model = tiny_model(kind)
    parts = anatomy(model)
    for field, value in expected.items():
        assert getattr(parts, field) == value, (kind, field, getattr(parts, field))
    assert (parts.hidden_size, parts.mlp_dim, parts.num_heads, parts.num_layers) == (16, 32, 2, 2)
    assert parts.block_names == ("encoderblock_0", "encoderblock_1")
    assert parts.image_size == keywords["input_shape"][:2] and parts.channels == 3
    assert parts.num_tokens == parts.num_prefix_tokens + parts.grid[0] * parts.grid[1]
    # The token count agrees with the model's own block input.
    assert model.get_layer("encoderblock_0").input.shape[1] == parts.num_tokens


def test_anatomy_refuses_other_models_naming_them(tmp_path):
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="not_a_vit")
    with pytest.raises(ValueError, match="not a keras_vit ViT.*not_a_vit"):
        anatomy(other)
    # A ViT wrapped in the user's model: named, with the way out (the hint came only from `get_layer`).
    vit = keras_vit.ViT(None, input_shape=(16, 16, 3), num_classes=2, patch_size=8, hidden_size=8, num_layers=1,
                        num_heads=2, mlp_dim=8, name="my_vit")
    augment = keras.Sequential([keras.layers.Rescaling(1.0)], name="augment")
    wrapped = keras.Sequential([keras.Input((16, 16, 3)), augment, vit], name="wrapper")
    twice = keras.Sequential([keras.Input((16, 16, 3)), wrapped], name="twice")
    for outer, path in ((wrapped, ".get_layer('my_vit')"), (twice, ".get_layer('wrapper').get_layer('my_vit')")):
        with pytest.raises(ValueError, match=rf"not a keras_vit ViT; it holds one as a layer: pass "
                                             rf"model{re.escape(path)}. Received: model='{outer.name}'"):
            anatomy(outer)
    assert anatomy(twice.get_layer("wrapper").get_layer("my_vit")).num_layers == 1
    # Loading weights into it says the same (its own check came first).
    keras_vit.export_npz(vit, tmp_path / "vit.npz")
    with pytest.raises(ValueError, match=r"not a keras_vit ViT; it holds one as a layer: pass "
                                         r"model.get_layer\('wrapper'\).get_layer\('my_vit'\)"):
        keras_vit.load_weights(twice, str(tmp_path / "vit.npz"))


def test_anatomy_reads_the_tensor_the_vit_was_built_on():
    """An `input_tensor` after a resize or crop: the geometry is the ViT's
    (the model's raw 64 px input gave patches of 21 px, a "hybrid", and the
    registered weights of another resolution)."""
    resized = keras.layers.Resizing(16, 24)(keras.Input((64, 64, 3)))
    parts = anatomy(tiny_model("plain", input_tensor=resized, input_shape=None))
    assert (parts.image_size, parts.grid, parts.patch_size, parts.hybrid) == ((16, 24), (2, 3), (8, 8), False)

