"""keras_vit against the original Flax model itself, not a transcription of it.

tests/weights/flax_reference/ holds tiny checkpoints written by
google-research/vision_transformer's `VisionTransformer` and the logits it
gives (tools/make_flax_reference.py; versions.json says which commit and
versions): a class-token model with pre-logits, a non-square `gap` model
and a hybrid. Each loads here with the original's logits, eager and
compiled, at its stored size and at a new one, where the position
embeddings must be those of the original's `load_pretrained`.
"""

import json

import keras
import numpy as np
import pytest

import keras_vit
from tests.helpers import ROOT, TINY_WIDTHS, assert_close_rel

REFERENCE = ROOT / "tests" / "weights" / "flax_reference"
# The generator's configs as keras_vit builder keywords (the sizes are the
# stored images').
CASES = {
    "token": dict(patch_size=4, representation_size=8, num_classes=5),
    "gap": dict(patch_size=4, classifier="gap", num_classes=3),
    "hybrid": dict(patch_size=1, resnet=(1,), resnet_width_factor=0.5, num_classes=4),
}
# Rounding differs at ~1e-6 of the logits (full-size models: at most
# 3.5e-6 on every backend). The exact GELU for the tanh one moves these by
# 1.4e-4 or more, LayerNorm's epsilon 1e-5 for 1e-6 the `gap` case's by 1.1e-5.
TOLERANCE = 1e-5


def reference(case):
    with np.load(REFERENCE / f"{case}.io.npz") as io:
        return dict(io)


def build(case, size):
    return keras_vit.ViT(None, input_shape=(*size, 3), weights=str(REFERENCE / f"{case}.npz"), **TINY_WIDTHS,
                         **CASES[case])


def test_the_reference_was_made_by_the_original():
    versions = json.loads((REFERENCE / "versions.json").read_text())
    assert versions["vision_transformer"] and versions["flax"]
    with np.load(REFERENCE / "token.npz") as checkpoint:  # the original's flattened names, float32
        assert "Transformer/encoderblock_1/MlpBlock_0/Dense_1/kernel" in checkpoint.files
        assert "pre_logits/kernel" in checkpoint.files and checkpoint["cls"].dtype == np.float32


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_the_original_flax_models(case):
    io = reference(case)
    model = build(case, io["images"].shape[1:3])
    assert_close_rel(keras.ops.convert_to_numpy(model(io["images"])), io["logits"], TOLERANCE, f"{case} eager")
    assert_close_rel(model.predict(io["images"], verbose=0), io["logits"], TOLERANCE, f"{case} compiled")


@pytest.mark.parametrize("case", ["token", "hybrid"])
def test_a_new_resolution_equals_the_originals_load_pretrained(case):
    io = reference(case)
    model = build(case, io["resized_images"].shape[1:3])
    posemb = keras.ops.convert_to_numpy(model.get_layer("posembed_input").pos_embedding)
    np.testing.assert_allclose(posemb, io["resized_pos_embedding"], rtol=0, atol=1e-7)
    assert_close_rel(model.predict(io["resized_images"], verbose=0), io["resized_logits"], TOLERANCE, case)
