"""Masked patch prediction (paper Sec. 4.6): corruption statistics, colour
targets at the quantisation boundaries, the loss, a short pre-training run
and fine-tuning from its checkpoint."""

import os
import runpy
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.preprocessing import scale_pixels
from keras_vit.pretraining import (
    CLEAN,
    KEPT,
    MASKED,
    REPLACED,
    MaskedPatchPrediction,
    PatchCorruption,
    patch_targets,
    quantize_colors,
)
from keras_vit.weights.npz import checkpoint_variables
from tests.helpers import ROOT

RECIPE = os.path.join(ROOT, "recipes", "pretrain_mpp.py")
TINY = dict(hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32, patch_size=8)


@pytest.fixture(scope="module")
def backbone():
    return keras_vit.ViT(None, include_top=False, input_shape=(16, 24, 3), **TINY)


def _np(x):
    return keras.ops.convert_to_numpy(x)


def test_corruption_statistics():
    batch, num = 256, 64
    layer = PatchCorruption(seed=3)
    b, i = np.meshgrid(np.arange(batch), np.arange(num), indexing="ij")
    tokens = np.stack([b, i], axis=-1).astype("float32")  # token = (image, position)
    layer.build(tokens.shape)
    layer.mask_embedding.assign(np.array([-7.0, -7.0], "float32"))
    out, kind = (_np(t) for t in layer(tokens))

    corrupted = kind != CLEAN
    # Exactly 50 % of the patches of every image.
    np.testing.assert_array_equal(corrupted.sum(axis=1), num // 2)
    # 80 / 10 / 10 among the 8192 corrupted patches (standard errors ~0.005).
    shares = [np.mean(kind[corrupted] == k) for k in (MASKED, REPLACED, KEPT)]
    np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.02)
    # Every position is chosen about half of the time.
    per_position = corrupted.mean(axis=0)
    assert per_position.min() > 0.3 and per_position.max() < 0.7
    # What each kind holds.
    np.testing.assert_array_equal(out[kind == MASKED], -7.0)
    np.testing.assert_array_equal(out[(kind == CLEAN) | (kind == KEPT)],
                                  tokens[(kind == CLEAN) | (kind == KEPT)])
    replaced = kind == REPLACED
    np.testing.assert_array_equal(out[replaced][:, 0], b[replaced])  # same image
    assert np.all(out[replaced][:, 1] != i[replaced])  # another position
    offsets = (out[replaced][:, 1] - i[replaced]) % num
    assert set(offsets.astype(int)) == set(range(1, num))  # any other position
    # A new draw at every call.
    assert np.any(_np(layer(tokens)[1]) != kind)


def test_corruption_arguments():
    with pytest.raises(ValueError, match="corruption_rate=0"):
        PatchCorruption(corruption_rate=0)
    with pytest.raises(ValueError, match="mask_fraction=0.9, random_fraction=0.2"):
        PatchCorruption(mask_fraction=0.9, random_fraction=0.2)
    layer = PatchCorruption(corruption_rate=0.15, mask_fraction=1.0, random_fraction=0.0, seed=0)
    # 15 % of 196 patches (the paper's other setting): round(29.4) = 29.
    assert layer.num_corrupted(196) == 29
    kind = _np(layer(np.zeros((4, 196, 2), "float32"))[1])
    np.testing.assert_array_equal((kind == MASKED).sum(axis=1), 29)


def _uint8_patch_image():
    """An 8x8 uint8 image of four 4x4 patches whose means sit at bin edges."""
    image = np.zeros((8, 8, 3), np.uint8)
    # Patch (0, 0): R half 0 / half 64 -> mean 32; G 31; B 255.
    image[0:2, 0:4, 0], image[2:4, 0:4, 0] = 0, 64
    image[0:4, 0:4, 1], image[0:4, 0:4, 2] = 31, 255
    # Patch (0, 1): R half 0 / half 63 -> 31.5; G 224; B 223.
    image[0:2, 4:8, 0], image[2:4, 4:8, 0] = 0, 63
    image[0:4, 4:8, 1], image[0:4, 4:8, 2] = 224, 223
    # Patch (1, 0): R half 223 / half 224 -> 223.5; G 0; B 128.
    image[4:6, 0:4, 0], image[6:8, 0:4, 0] = 223, 224
    image[4:8, 0:4, 1], image[4:8, 0:4, 2] = 0, 128
    # Patch (1, 1): white.
    image[4:8, 4:8] = 255
    return image


def test_mean_colour_targets_at_bin_edges():
    image = keras_vit.preprocess_input(_uint8_patch_image()[None])
    # uint8 bins of 32: (1, 0, 7), (0, 7, 6), (6, 0, 4), (7, 7, 7).
    expected = [1 * 64 + 0 + 7, 0 + 7 * 8 + 6, 6 * 64 + 0 + 4, 511]
    np.testing.assert_array_equal(_np(patch_targets(image, (4, 4))), [expected])
    # An int patch size, as every other API takes it (it was a TypeError).
    np.testing.assert_array_equal(_np(patch_targets(image, 4)), [expected])
    with pytest.raises(ValueError, match=r"Received: patch_size=\(0, 0\)"):  # a ZeroDivisionError
        patch_targets(image, (0, 0))
    with pytest.raises(ValueError, match=r"Received: images of shape \(8, 8, 3\)"):  # an IndexError
        patch_targets(image[0], 4)
    # Equal bins of 255/8 differ only for the mean 223.5 (7.01 bins: 7).
    uniform = _np(patch_targets(image, (4, 4), quantization="uniform"))
    np.testing.assert_array_equal(uniform, [[71, 62, 7 * 64 + 4, 511]])
    # One bit per channel: 127 -> 0, 128 -> 1 (index r*4 + g*2 + b).
    colours = keras_vit.preprocess_input(np.array([[127, 128, 255], [0, 0, 128]], np.uint8))
    np.testing.assert_array_equal(_np(quantize_colors(colours, bits=1)), [3, 1])
    # The value range is a parameter: [0, 1] colours.
    np.testing.assert_array_equal(
        _np(quantize_colors(np.array([[0.0, 0.5, 1.0]]), value_range=(0, 1))), [0 + 3 * 8 + 7]
    )
    with pytest.raises(ValueError, match="bits=9"):
        quantize_colors(colours, bits=9)


def test_targets_under_mixed_precision_are_the_images_colours():
    """Under `mixed_bfloat16`, Keras rounded the model's input to bfloat16
    before the targets were computed: grey 32 (-0.749) became 31.9, bin 0
    instead of 1 (4 % of flat patches off on TensorFlow and PyTorch)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = MaskedPatchPrediction(keras_vit.ViT(None, include_top=False, input_shape=(8, 16, 3), **TINY), seed=0)
    finally:
        keras.config.set_dtype_policy(previous)
    pixels = np.zeros((1, 8, 16, 3), "float32")
    pixels[:, :, :8], pixels[:, :, 8:] = 32.0, 224.0
    outputs = model(keras_vit.preprocess_input(pixels), training=True)
    np.testing.assert_array_equal(_np(outputs["targets"]), [[1 * 64 + 1 * 8 + 1, 511]])
    # The head computes in float32, as the classifier's (it was bfloat16:
    # logits of about 17 off by up to 0.07).
    assert keras.backend.standardize_dtype(outputs["predictions"].dtype) == "float32"
    assert keras.backend.standardize_dtype(model.encoder.outputs[0].dtype) == "bfloat16"


def test_targets_are_the_colours_the_patch_embedding_reads():
    """A backbone that preprocesses its own input (0-255 pixels, any pixel
    statistics) or resizes it first: the targets are those of the image its
    patch embedding reads (they were all class 511, the 0-255 pixels read as
    [-1, 1] values, and a resize failed in the loss)."""
    pixels = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3)).astype("float32")

    def targets(images, **kwargs):
        backbone = keras_vit.ViT(None, include_top=False, **{**TINY, "patch_size": 4}, **kwargs)
        return _np(MaskedPatchPrediction(backbone, seed=0)(images)["targets"])

    expected = targets(keras_vit.preprocess_input(pixels), input_shape=(8, 8, 3))
    assert len(np.unique(expected)) > 4
    np.testing.assert_array_equal(targets(pixels, input_shape=(8, 8, 3), include_preprocessing=True), expected)
    np.testing.assert_array_equal(targets(pixels, input_shape=(8, 8, 3), include_preprocessing=True,
                                          pixel_mean=(0.485, 0.456, 0.406), pixel_std=(0.229, 0.224, 0.225)),
                                  expected)
    inputs = keras.Input((16, 16, 3))
    resized = targets(np.repeat(np.repeat(keras_vit.preprocess_input(pixels), 2, 1), 2, 2),
                      input_tensor=keras.layers.Resizing(8, 8, interpolation="nearest")(inputs))
    np.testing.assert_array_equal(resized, expected)


def test_pixel_targets_log_no_accuracy():
    """`"pixels"` is a regression: no accuracy (it logged 0.0 every epoch)."""
    backbone = keras_vit.ViT(None, include_top=False, input_shape=(16, 16, 3), **TINY)
    model = MaskedPatchPrediction(backbone, target="pixels", seed=0)
    model.compile(optimizer="sgd")
    logs = model.evaluate(np.zeros((2, 16, 16, 3), "float32"), verbose=0, return_dict=True)
    assert set(logs) == {"loss"}
    colours = MaskedPatchPrediction(backbone, seed=0)
    colours.compile(optimizer="sgd")
    assert set(colours.evaluate(np.zeros((2, 16, 16, 3), "float32"), verbose=0, return_dict=True)) == {
        "loss", "accuracy"}


def test_downsampled_and_pixel_targets():
    uint8 = _uint8_patch_image()
    image = keras_vit.preprocess_input(uint8[None])
    cells = _np(patch_targets(image, (4, 4), target="downsampled", downsample_grid=2))
    assert cells.shape == (1, 4, 4)
    # Patch (0, 0) in 2x2 cells: top cells R 0, bottom R 64 (level 2); G 0, B 7.
    np.testing.assert_array_equal(cells[0, 0], [7, 7, 2 * 64 + 7, 2 * 64 + 7])
    np.testing.assert_array_equal(cells[0, 3], [511] * 4)
    pixels = _np(patch_targets(image, (4, 4), target="pixels"))
    assert pixels.shape == (1, 4, 48)
    scaled = scale_pixels(uint8.astype(np.float32))  # the library's one formula
    np.testing.assert_allclose(pixels[0, 1], scaled[0:4, 4:8].ravel(), atol=1e-6)
    np.testing.assert_allclose(pixels[0, 2], scaled[4:8, 0:4].ravel(), atol=1e-6)
    with pytest.raises(ValueError, match="downsample_grid=3"):
        patch_targets(image, (4, 4), target="downsampled", downsample_grid=3)


def _cross_entropy(logits, targets):
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    return lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]


@pytest.mark.parametrize("target", ["mean_color", "downsampled", "pixels"])
def test_loss_equals_manual_computation(backbone, target):
    model = MaskedPatchPrediction(backbone, target=target, seed=1)
    rng = np.random.default_rng(0)
    kernel = model.head.kernel
    kernel.assign(rng.normal(0, 0.5, kernel.shape).astype("float32"))
    images = rng.uniform(-1, 1, (3, 16, 24, 3)).astype("float32")
    out = model.predict_on_batch(images)
    weights = out["corruption"] > 0
    assert weights.sum() == 3 * 3  # half of the 6 patches of each image
    if target == "mean_color":
        assert out["predictions"].shape == (3, 6, 512)
        per_patch = _cross_entropy(out["predictions"], out["targets"])
    elif target == "downsampled":
        assert out["predictions"].shape == (3, 6, 16, 512)
        per_patch = _cross_entropy(out["predictions"], out["targets"]).mean(-1)
    else:
        assert out["predictions"].shape == (3, 6, 8 * 8 * 3)
        per_patch = ((out["predictions"] - out["targets"]) ** 2).mean(-1)
    expected = per_patch[weights].mean()
    loss = float(_np(model.mpp_loss(out)[0]))
    assert loss == pytest.approx(expected, rel=1e-5)
    np.testing.assert_array_equal(out["targets"], _np(patch_targets(images, (8, 8), target)))


def test_encoder_is_the_backbone_graph_with_a_hook_after_the_embedding(backbone):
    """With corruption that keeps every patch, the MPP encoder's tokens are the
    backbone's own output (class token, position embedding and blocks as the
    builder wired them), and the predictions skip the class token."""
    model = MaskedPatchPrediction(backbone, mask_fraction=0.0, random_fraction=0.0, seed=0)
    images = np.random.default_rng(1).uniform(-1, 1, (3, 16, 24, 3)).astype("float32")
    tokens, kind, seen = model.encoder(images, training=False)
    np.testing.assert_array_equal(_np(seen), images)
    np.testing.assert_allclose(_np(tokens), _np(backbone(images, training=False)), atol=1e-6)
    assert set(np.unique(_np(kind))) == {CLEAN, KEPT}
    out = model.predict_on_batch(images)
    assert out["predictions"].shape == (3, 6, 512)


def test_weights_shared_with_backbone_and_config(tmp_path):
    # A backbone without a class token: one output token per patch.
    backbone = keras_vit.ViT(
        None, include_top=False, input_shape=(16, 24, 3), classifier="gap", **TINY)
    model = MaskedPatchPrediction(backbone, head_hidden_size=8, seed=0)
    backbone_ids = {id(v) for v in backbone.weights}
    extra = [v for v in model.weights if id(v) not in backbone_ids]
    # Only the mask embedding, the head and its transform are new.
    assert sorted("/".join(v.path.split("/")[-2:]) for v in extra) == sorted([
        "corruption/mask_embedding", "mpp_head/kernel", "mpp_head/bias",
        "mpp_transform/kernel", "mpp_transform/bias",
        "mpp_transform_norm/gamma", "mpp_transform_norm/beta",
    ])
    assert backbone_ids <= {id(v) for v in model.weights}
    out = model.predict_on_batch(np.zeros((3, 16, 24, 3), "float32"))
    assert out["predictions"].shape == (3, 6, 512)
    # Config round trip and weights round trip.
    clone = MaskedPatchPrediction.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    path = str(tmp_path / "mpp.weights.h5")
    model.save_weights(path)
    clone.load_weights(path)
    for a, b in zip(model.weights, clone.weights):
        np.testing.assert_array_equal(_np(a), _np(b))


@pytest.mark.one_backend
def test_a_saved_model_loads_after_import_keras_vit(tmp_path):
    """`keras_vit` imports `pretraining`, which registers the class: a
    `.keras` file failed to load ("Could not locate class") unless the user
    had imported `keras_vit.pretraining` themselves."""
    path = str(tmp_path / "mpp.keras")
    MaskedPatchPrediction(keras_vit.ViT(None, include_top=False, input_shape=(16, 16, 3), **TINY), seed=0).save(path)
    code = "import sys, keras, keras_vit; print(type(keras.saving.load_model(sys.argv[1])).__name__)"
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.stdout.split()[-1:] == ["MaskedPatchPrediction"], out.stderr[-2000:]


def test_bad_backbones(backbone):
    classifier = keras_vit.ViT(None, input_shape=(16, 24, 3), num_classes=3, **TINY)
    with pytest.raises(ValueError, match="include_top=False, pooling=None"):
        MaskedPatchPrediction(classifier)
    hybrid = keras_vit.ViT(
        None, resnet=(), resnet_width_factor=0.5, input_shape=(32, 32, 3), include_top=False,
        classifier="gap", **{**TINY, "patch_size": 2},
    )
    with pytest.raises(ValueError, match="hybrid"):
        MaskedPatchPrediction(hybrid)
    with pytest.raises(ValueError, match="target='colour'"):
        MaskedPatchPrediction(backbone, target="colour")
    with pytest.raises(ValueError, match="downsample_grid=3"):
        MaskedPatchPrediction(backbone, target="downsampled", downsample_grid=3)
    dynamic = keras_vit.ViT(None, include_top=False, input_shape=(None, None, 3), **TINY)
    with pytest.raises(ValueError, match="fixed image size.*dynamic-size"):
        MaskedPatchPrediction(dynamic)


def test_short_run_then_finetune_from_checkpoint(tmp_path):
    recipe = runpy.run_path(RECIPE, run_name="recipe")
    result = recipe["main"](["--smoke", f"--run_dir={tmp_path}"])
    losses = result["history"]["loss"]
    # 24 steps on smooth synthetic colour fields; chance is ln(512) = 6.24.
    assert losses[0] < 6.3 and losses[-1] < losses[0] - 0.1, losses
    assert os.path.exists(tmp_path / "mpp.weights.h5")

    # Fine-tuning starts from the encoder: a normal classifier loads it.
    classifier = keras_vit.ViT(
        None, input_shape=recipe["SMOKE_INPUT_SHAPE"], num_classes=3, weights=result["encoder_npz"],
        **recipe["SMOKE_MODEL"],
    )
    pretrained = checkpoint_variables(keras.saving.load_model(result["backbone_keras"]))
    loaded = checkpoint_variables(classifier)
    assert set(loaded) - set(pretrained) == {"head/kernel", "head/bias"}
    for key, variable in pretrained.items():
        np.testing.assert_array_equal(_np(loaded[key]), _np(variable), err_msg=key)
    # The new head starts at zero, as for any fine-tuning.
    np.testing.assert_array_equal(_np(classifier.get_layer("head").kernel), 0.0)
    # And the encoder was trained: its final LayerNorm scale left its
    # initial value (ones).
    assert np.abs(_np(classifier.get_layer("encoder_norm").gamma) - 1.0).max() > 1e-3
