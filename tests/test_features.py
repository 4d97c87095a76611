"""`keras_vit.feature_maps` (issue 25): the patch tokens as `(B, H/P, W/P, D)`
maps for dense-prediction heads, for plain, register-token and hybrid
models."""

import keras
import numpy as np
import pytest

import keras_vit
from tests.helpers import MODEL_KINDS, random_images, randomize_weights, tiny_model


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


def test_feature_maps_need_the_token_sequence():
    with pytest.raises(ValueError, match="include_top=False, pooling=None"):
        keras_vit.feature_maps(tiny_model("plain"))
