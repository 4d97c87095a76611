"""`keras_vit.feature_maps` (issue 25): the patch tokens as `(B, H/P, W/P, D)`
maps for dense-prediction heads, for plain, register-token and hybrid
models."""

import keras
import numpy as np
import pytest

import keras_vit
from tests.helpers import MODEL_KINDS, TINY_WIDTHS, random_images, randomize_weights, tiny_model


@pytest.mark.parametrize("kind", ["plain", "registers", "root_only", "fc_norm"])
def test_feature_maps_are_the_patch_tokens_as_a_grid(kind, tmp_path):
    """`fc_norm`: a model that normalises after pooling has no norm layer on
    its token sequence (refused as "not a keras_vit ViT" before)."""
    overrides = {} if kind == "root_only" else dict(include_top=False, pooling=None, classifier="token")
    if kind == "fc_norm":
        kind, overrides = "plain", dict(overrides, fc_norm=True)
    model = randomize_weights(tiny_model(kind, **overrides))
    maps = keras_vit.feature_maps(model)
    images = random_images(model)
    tokens = model.predict(images, verbose=0)
    grid = maps.predict(images, verbose=0)
    parts = keras_vit.models.anatomy(model)
    height, width = MODEL_KINDS[kind]["input_shape"][:2]
    assert grid.shape == (2, height // parts.patch_size[0], width // parts.patch_size[1], 16)
    expected = tokens[:, parts.num_prefix_tokens:].reshape(grid.shape)
    np.testing.assert_array_equal(grid, expected)
    # Token r * cols + c is the patch at row r, column c.
    np.testing.assert_array_equal(grid[:, 1, 0], tokens[:, parts.num_prefix_tokens + grid.shape[2]])
    path = str(tmp_path / "maps.keras")
    maps.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path).predict(images, verbose=0), grid, atol=1e-6)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_feature_maps_keep_the_models_dtype_under_another_global_policy(policy):
    """A float32 model's maps made after `set_dtype_policy("mixed_bfloat16")`
    (a later notebook cell) came out bfloat16, 8e-3 off; a mixed model's
    stay its bfloat16 tokens."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = randomize_weights(tiny_model("plain", include_top=False, pooling=None, classifier="token"))
    finally:
        keras.config.set_dtype_policy(previous)
    images = random_images(model)
    keras.config.set_dtype_policy("mixed_bfloat16" if policy == "float32" else "float32")
    try:
        maps = keras_vit.feature_maps(model)
    finally:
        keras.config.set_dtype_policy(previous)
    tokens = keras.ops.convert_to_numpy(model(images))
    grid = keras.ops.convert_to_numpy(maps(images))
    assert grid.dtype == tokens.dtype == ("float32" if policy == "float32" else "bfloat16")
    np.testing.assert_array_equal(grid, tokens[:, 1:].reshape(grid.shape))


def test_feature_maps_need_the_token_sequence():
    with pytest.raises(ValueError, match="include_top=False, pooling=None"):
        keras_vit.feature_maps(tiny_model("plain"))


def test_feature_maps_of_a_model_built_on_resized_images(tmp_path):
    """`input_tensor` after a resize: the grid came from the model's own
    64-px input (8x8, not 4x4), and the reshape folded the difference into
    the batch: 4 images gave 1 map, without an error."""
    inputs = keras.Input((64, 64, 3))
    model = randomize_weights(keras_vit.ViT(
        None, **{**TINY_WIDTHS, "patch_size": 8}, input_tensor=keras.layers.Resizing(32, 32)(inputs),
        include_top=False))
    images = np.random.default_rng(0).uniform(-1, 1, (4, 64, 64, 3)).astype("float32")
    maps = keras_vit.feature_maps(model)
    grid = maps.predict(images, verbose=0)
    tokens = model.predict(images, verbose=0)
    assert grid.shape == (4, 4, 4, 16)
    np.testing.assert_array_equal(grid, tokens[:, 1:].reshape(grid.shape))
    maps.save(tmp_path / "maps.keras")
    np.testing.assert_allclose(keras.saving.load_model(tmp_path / "maps.keras").predict(images, verbose=0), grid,
                               atol=1e-6)
    # Tokens and images that do not match are refused, not reshaped.
    with pytest.raises(ValueError, match=r"17 tokens are not 1 prefix tokens and a 8x8 grid of images of \(64, 64\) "
                                         r"px at stride \(8, 8\)"):
        keras_vit.features.PatchGrid(1, (8, 8))(tokens, images)
