"""Hybrid ResNet+ViT models: StdConv2D, parameter counts, parity with timm's
hybrid ViT on the same `.npz`, saving, gradients, loading rules and errors."""

import functools

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers import StdConv2D
from keras_vit.models import resnet as resnet_lib
from keras_vit import variants
from keras_vit.weights import export_npz, load_weights, read_npz, registry
from keras_vit.weights.npz import POSEMB_KEY, checkpoint_variables
from tests.helpers import assert_close_rel, assert_every_weight_gets_a_gradient, lazy_build, randomize_weights

# google-research/vision_transformer, vit_jax/models_test.py (num_classes=1000,
# 224 px), and the same definitions re-counted at 384 px.
PARAM_COUNTS = {
    "R+ViT-Ti_16": (6_337_704, 6_355_944),
    "R26+ViT-S_32": (36_431_912, 36_468_392),
    "R26+ViT-B_32": (101_383_976, 101_456_936),
    "R50+ViT-B_16": (98_659_112, 98_950_952),
    "R50+ViT-L_32": (328_994_856, 329_092_136),
}
# Position-embedding and embedding-kernel shapes at 224 px (dumped from the
# original model definition). R+Ti/16 has stride 32, not the 16 of its name.
SHAPES = {
    "R+ViT-Ti_16": ((1, 50, 192), (8, 8, 64, 192)),
    "R26+ViT-S_32": ((1, 50, 384), (1, 1, 2048, 384)),
    "R26+ViT-B_32": ((1, 50, 768), (1, 1, 2048, 768)),
    "R50+ViT-B_16": ((1, 197, 768), (1, 1, 1024, 768)),
    "R50+ViT-L_32": ((1, 50, 1024), (1, 1, 2048, 1024)),
}
CONSTRUCTORS = {
    "R+ViT-Ti_16": keras_vit.RViTTi16,
    "R26+ViT-S_32": keras_vit.R26ViTS32,
    "R26+ViT-B_32": keras_vit.R26ViTB32,
    "R50+ViT-B_16": keras_vit.R50ViTB16,
    "R50+ViT-L_32": keras_vit.R50ViTL32,
}

# Tiny hybrids (GroupNorm needs widths that are multiples of 32).
# "stages": root width 32, two stages, the first with an identity-shortcut
#   unit; stride 8.
# "root": the root alone with 4x4 patches on it, as R+Ti/16; stride 16. Its
#   width stays 64 so that GroupNorm(32) sees two channels per group: with
#   one, it would normalise away any per-channel kernel scale.
# "small": one stage of one unit, one Transformer block, for the tests that
#   are not about numerics (their cost on jax is mostly compilation).
TINY = {
    "stages": dict(resnet=(2, 1), patch_size=1, resnet_width_factor=0.5),
    "root": dict(resnet=(), patch_size=4, resnet_width_factor=1),
    "small": dict(resnet=(1,), patch_size=2, resnet_width_factor=0.5, num_layers=1),
}
# The Transformer part of tests/models/test_models.py's tiny models (shared jax
# compilations when the suite runs in one process).
TRANSFORMER = dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2)
LOW, HIGH = 64, 96
NUM_CLASSES = 5


def tiny_hybrid(kind, size=LOW, **kwargs):
    fields = {**TRANSFORMER, **TINY[kind], **kwargs}
    return keras_vit.ViT(
        None, input_shape=(size, size, 3), num_classes=NUM_CLASSES, **fields
    )


def images(size, batch=2, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, size, size, 3)).astype("float32")


def run(model, x):
    """Outputs as numpy. On jax one compiled call is much cheaper than eager
    op-by-op dispatch (each new op shape compiles on its own)."""
    if keras.backend.backend() == "jax":
        out = model.predict_on_batch(x)
    else:
        out = model(x, training=False)
    if isinstance(out, (list, tuple)):
        return [keras.ops.convert_to_numpy(o) for o in out]
    return keras.ops.convert_to_numpy(out)


def randomize_hybrid(model, seed=0):
    """Random weights everywhere; StdConv kernels get per-output-channel
    scales spanning five orders of magnitude and non-zero means, so that any
    other standardisation formula changes the outputs."""
    randomize_weights(model, seed=seed, scale=0.2)
    rng = np.random.default_rng(seed + 1)
    for layer in model.layers:
        if isinstance(layer, StdConv2D):
            shape = tuple(layer.kernel.shape)
            scale = 10.0 ** rng.uniform(-4, 1, shape[-1])
            mean = rng.normal(0, 3, shape[-1]) * scale
            layer.kernel.assign((rng.normal(0, 1, shape) * scale + mean).astype("float32"))
    return model


# --- StdConv2D -------------------------------------------------------------


def numpy_std_conv(x, w, stride, formula="original"):
    """Reference in float64: standardise, pad as TF "SAME", convolve."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    w = w - w.mean(axis=(0, 1, 2))
    if formula == "original":  # (w - mean) / (std + 1e-5)
        w = w / (w.std(axis=(0, 1, 2)) + 1e-5)
    else:  # timm's hybrids: (w - mean) / sqrt(var + 1e-8)
        w = w / np.sqrt(w.var(axis=(0, 1, 2)) + 1e-8)
    kh, kw = w.shape[:2]
    h, wd = x.shape[1:3]
    oh, ow = -(-h // stride), -(-wd // stride)
    ph, pw = max((oh - 1) * stride + kh - h, 0), max((ow - 1) * stride + kw - wd, 0)
    # TF SAME: the odd extra pixel of padding goes at the bottom / right.
    xp = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    out = np.zeros((x.shape[0], oh, ow, w.shape[-1]))
    for i in range(kh):
        for j in range(kw):
            window = xp[:, i : i + stride * oh : stride, j : j + stride * ow : stride]
            out += np.einsum("bhwc,co->bhwo", window, w[i, j])
    return out


@pytest.mark.parametrize("kernel_size, stride, size", [(3, 2, 8), (7, 2, 10)])
def test_std_conv_matches_numpy_reference(kernel_size, stride, size):
    # Even sizes with stride 2: SAME padding is asymmetric here (3x3 on 8:
    # 0 before, 1 after; 7x7 on 10: 2 before, 3 after).
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, size, size, 4)).astype("float32")
    # Zeros: the kernel is assigned below (and jax compiles every truncated
    # normal shape separately).
    layer = StdConv2D(6, kernel_size, stride, kernel_initializer="zeros")
    model = keras.Sequential([keras.Input(x.shape[1:]), layer])
    scale = 10.0 ** np.arange(-4, 2)  # one order of magnitude per channel
    w = rng.normal(size=tuple(layer.kernel.shape)) * scale + 2 * scale
    layer.kernel.assign(w.astype("float32"))
    out = run(model, x)
    assert out.shape == layer.compute_output_shape(x.shape)
    assert_close_rel(out, numpy_std_conv(x, w, stride), what="StdConv2D")
    # The comparison can tell the original formula from timm's.
    with pytest.raises(AssertionError):
        assert_close_rel(out, numpy_std_conv(x, w, stride, formula="timm"))
    # The variable keeps the raw kernel (the checkpoints store it raw).
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.kernel), w.astype("float32"))


def test_std_conv_standardises_in_float32_under_mixed_precision():
    """Keras hands a mixed-precision layer's float32 variables to `call`
    cast to bfloat16: the kernel, whose mean is large next to its spread,
    was centred there (a relative error of 0.13 in this layer's output,
    0.043-0.049 in this tiny hybrid's logits; 0.004 and 0.008-0.011
    standardised in float32)."""
    rng = np.random.default_rng(0)
    w = (0.5 + 0.01 * rng.normal(size=(3, 3, 4, 8))).astype("float32")
    x = rng.normal(size=(2, 8, 8, 4)).astype("float32")
    reference = numpy_std_conv(x, w, 1)
    layer = StdConv2D(8, 3, dtype="mixed_bfloat16")
    layer.build(x.shape)
    layer.kernel.assign(w)
    out = keras.ops.convert_to_numpy(keras.ops.cast(layer(x), "float32"))
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 0.02
    model = randomize_hybrid(tiny_hybrid("stages"))
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = tiny_hybrid("stages")
    finally:
        keras.config.set_dtype_policy("float32")
    mixed.set_weights(model.get_weights())
    x = images(LOW)
    expected, got = run(model, x), run(mixed, x).astype("float32")
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.025  # 0.043-0.049 before


def test_std_conv_config_round_trip():
    layer = StdConv2D(8, (3, 1), strides=(2, 1), epsilon=1e-4, name="c")
    config = layer.get_config()
    clone = StdConv2D.from_config(config)
    assert clone.get_config() == config
    assert (clone.filters, clone.kernel_size, clone.strides, clone.epsilon) == (
        8, (3, 1), (2, 1), 1e-4,
    )
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(revived) is StdConv2D and revived.get_config() == config


def test_std_conv_rejects_bad_arguments():
    with pytest.raises(ValueError, match="Received: filters=0"):
        StdConv2D(0, 3)
    with pytest.raises(ValueError, match="Received: kernel_size="):
        StdConv2D(4, (3, 0))
    with pytest.raises(ValueError, match="Received: epsilon=-1"):
        StdConv2D(4, 3, epsilon=-1)


# --- Variants, counts, names --------------------------------------------------


@pytest.mark.one_backend
@pytest.mark.parametrize("name", sorted(PARAM_COUNTS))
def test_param_counts_shapes_and_names(name):
    count_224, count_384 = PARAM_COUNTS[name]
    stages = variants.VARIANTS[name]["resnet"]

    def build_and_inspect():
        model = CONSTRUCTORS[name]()  # the class-style constructor
        stage_outputs = [
            tuple(model.get_layer(f"block{s}").output.shape) for s in range(1, len(stages) + 1)
        ]
        return (
            model.name,
            model.count_params(),
            tuple(model.get_layer("posembed_input").pos_embedding.shape),
            tuple(model.get_layer("embedding").kernel.shape),
            tuple(model.get_layer("pool_root").output.shape),
            stage_outputs,
            model.get_layer("embedding").input is model.get_layer(
                f"block{len(stages)}" if stages else "pool_root"
            ).output,
            set(checkpoint_variables(model)),
        )

    model_name, count, posemb, kernel, root, stage_outputs, feeds, keys = lazy_build(
        build_and_inspect
    )
    assert count == count_224
    assert (posemb, kernel) == SHAPES[name]
    assert lazy_build(
        lambda: keras_vit.get_model(name, input_shape=(384, 384, 3)).count_params()
    ) == count_384
    assert model_name == variants.model_name(name) and model_name.replace("_", "").isalnum()
    # The stem's intermediate outputs, by name (feature pyramids).
    assert root == (None, 56, 56, 64)
    assert stage_outputs == [
        (None, 56 // 2**i, 56 // 2**i, 256 * 2**i) for i in range(len(stages))
    ]
    assert feeds
    # The original checkpoint keys: root 3 arrays, 9 per unit, 3 more per
    # stage for the projection shortcut of its first unit.
    resnet_keys = {k for k in keys if k.startswith(("conv_root", "gn_root", "block"))}
    assert len(resnet_keys) == 3 + 9 * sum(stages) + 3 * len(stages)
    assert {"conv_root/kernel", "gn_root/scale", "gn_root/bias"} <= resnet_keys
    for s, units in enumerate(stages, start=1):
        assert f"block{s}/unit1/conv_proj/kernel" in keys
        assert f"block{s}/unit{units}/gn3/scale" in keys
        assert f"block{s}/unit{units + 1}/conv1/kernel" not in keys
        if units > 1:
            assert f"block{s}/unit2/conv_proj/kernel" not in keys


def test_hybrid_table_and_augreg_names():
    hybrids = {n for n, f in variants.VARIANTS.items() if f["resnet"] is not None}
    assert hybrids == set(PARAM_COUNTS)
    for short, name in [
        ("R_Ti_16", "R+ViT-Ti_16"), ("R26_S_32", "R26+ViT-S_32"), ("R50_L_32", "R50+ViT-L_32"),
        ("R26+S/32", "R26+ViT-S_32"),
    ]:
        config_name, fields = variants.resolve_variant(short)
        assert config_name == name and fields["dropout_rate"] == 0.0
        assert fields["resnet"] == variants.VARIANTS[name]["resnet"]
    assert variants.VARIANTS["R50+ViT-B_16"]["resnet"] == (3, 4, 9)
    assert variants.VARIANTS["R50+ViT-B_16"]["dropout_rate"] == 0.1
    strides = {n: resnet_lib.stem_stride(variants.VARIANTS[n]["resnet"]) for n in SHAPES}
    assert strides == {
        "R+ViT-Ti_16": 4, "R26+ViT-S_32": 32, "R26+ViT-B_32": 32,
        "R50+ViT-B_16": 16, "R50+ViT-L_32": 32,
    }
    # Registered hybrid checkpoints resolve to bucket paths before any download.
    assert registry.resolve("augreg", "R+ViT-Ti_16").startswith("augreg/R_Ti_16-i21k-")
    assert registry.resolve("imagenet21k", "R50+ViT-B_16") == "imagenet21k/R50+ViT-B_16.npz"


# --- Parity with timm ---------------------------------------------------------


def _timm_hybrid(kind, size, std_formula="original"):
    import torch
    from timm.layers import GroupNormAct, HybridEmbed, StdConv2dSame
    from timm.layers.padding import pad_same
    from timm.models.resnetv2 import ResNetV2, create_resnetv2_stem
    from timm.models.vision_transformer import VisionTransformer

    class OriginalStdConv(StdConv2dSame):
        """timm's StdConv2dSame with the original's (w - mean) / (std + 1e-5)."""

        def forward(self, x):
            if self.same_pad:
                x = pad_same(x, self.kernel_size, self.stride, self.dilation)
            w = self.weight
            w = w - w.mean(dim=(1, 2, 3), keepdim=True)
            w = w / (w.std(dim=(1, 2, 3), keepdim=True, unbiased=False) + 1e-5)
            return torch.nn.functional.conv2d(
                x, w, self.bias, self.stride, self.padding, self.dilation, self.groups
            )

    if std_formula == "original":
        conv = OriginalStdConv
    else:  # timm's own hybrids
        conv = functools.partial(StdConv2dSame, eps=1e-8)
    norm = functools.partial(GroupNormAct, num_groups=32, eps=1e-6)
    width = int(64 * TINY[kind]["resnet_width_factor"])
    stages = TINY[kind]["resnet"]
    if stages:
        backbone = ResNetV2(
            layers=stages, channels=tuple(4 * width * 2**i for i in range(len(stages))),
            stem_chs=width, num_classes=0, global_pool="", preact=False,
            stem_type="same", conv_layer=conv, norm_layer=norm,
        )
    else:
        backbone = create_resnetv2_stem(
            3, out_chs=width, stem_type="same", preact=False, conv_layer=conv, norm_layer=norm,
        )
    model = VisionTransformer(
        img_size=size, patch_size=TINY[kind]["patch_size"],
        embed_dim=TRANSFORMER["hidden_size"], depth=TRANSFORMER["num_layers"],
        num_heads=TRANSFORMER["num_heads"],
        mlp_ratio=TRANSFORMER["mlp_dim"] / TRANSFORMER["hidden_size"],
        num_classes=NUM_CLASSES, global_pool="token",
        embed_layer=functools.partial(HybridEmbed, backbone=backbone),
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6),
        act_layer=functools.partial(torch.nn.GELU, approximate="tanh"),
    )
    return model.eval()


def _timm_outputs(kind, size, path, x, std_formula="original"):
    """Stem feature map (NHWC), tokens after the final norm, logits; float64."""
    import torch

    model = _timm_hybrid(kind, size, std_formula)
    model.load_pretrained(path)  # timm's own reader of the original .npz
    model = model.double()
    with torch.no_grad():
        t = torch.from_numpy(x.transpose(0, 3, 1, 2)).double()
        stem = model.patch_embed.backbone(t).numpy().transpose(0, 2, 3, 1)
        tokens = model.forward_features(t)
        logits = model.forward_head(tokens).numpy()
    return stem, tokens.numpy(), logits


def _keras_outputs(model, x):
    probe = keras.Model(
        model.input,
        [model.get_layer("embedding").input, model.get_layer("encoder_norm").output, model.output],
    )
    return run(probe, x)


def _zoom_posemb(path, out_path, new_grid):
    """The original's resampling (scipy zoom, order 1) written into a copy."""
    import scipy.ndimage

    arrays = dict(np.load(path))
    posemb = arrays[POSEMB_KEY]
    cls, grid = posemb[:, :1], posemb[0, 1:]
    side = int(np.sqrt(len(grid)))
    grid = grid.reshape(side, side, -1)
    zoom = (new_grid / side, new_grid / side, 1)
    grid = scipy.ndimage.zoom(grid, zoom, order=1).reshape(1, new_grid * new_grid, -1)
    arrays[POSEMB_KEY] = np.concatenate([cls, grid], axis=1)
    np.savez(out_path, **arrays)


def _gn_as_4d(path, out_path):
    # Pre-Linen files store GroupNorm scale/bias as (1, 1, 1, C).
    arrays = dict(np.load(path))
    for key, value in arrays.items():
        if "/gn" in f"/{key}" and value.ndim == 1:
            arrays[key] = value.reshape(1, 1, 1, -1)
    np.savez(out_path, **arrays)


def _export_random_hybrid(kind, tmp_path):
    """A random tiny hybrid at LOW px, exported with (1, 1, 1, C) GroupNorm
    parameters as in the pre-Linen files."""
    source = randomize_hybrid(tiny_hybrid(kind))
    path = str(tmp_path / "hybrid.npz")
    export_npz(source, path)
    _gn_as_4d(path, path)
    assert read_npz(path)["gn_root/scale"].shape[:3] == (1, 1, 1)
    return source, path


def _check_parity(model, kind, path, size, tmp_path):
    """Compares stem, tokens and logits with timm reading the same file; at
    another resolution the reference's position embeddings are resampled as
    the original does (scipy zoom, order 1), ours by our loader."""
    stride = resnet_lib.stem_stride(TINY[kind]["resnet"]) * TINY[kind]["patch_size"]
    if size != LOW:
        zoomed = str(tmp_path / f"zoomed_{size}.npz")
        _zoom_posemb(path, zoomed, size // stride)
        path = zoomed
    x = images(size)
    ours = _keras_outputs(model, x)
    for what, a, b in zip(("stem", "tokens", "logits"), ours, _timm_outputs(kind, size, path, x)):
        assert_close_rel(a, b, what=f"{kind} {what} @{size}")
    # The weights are such that timm's own standardisation (sqrt(var + eps))
    # visibly differs: the comparison above can fail.
    timm_formula = _timm_outputs(kind, size, path, x, std_formula="timm")
    with pytest.raises(AssertionError):
        assert_close_rel(ours[0], timm_formula[0])


@pytest.mark.timm
def test_parity_with_timm(tmp_path):
    source, path = _export_random_hybrid("stages", tmp_path)
    _check_parity(source, "stages", path, LOW, tmp_path)
    # Higher resolution: our loader reads the file (GroupNorm as (1, 1, 1, C))
    # and resamples the position embeddings.
    big = tiny_hybrid("stages", size=HIGH)
    assert any("resampled" in note for note in load_weights(big, path))
    _check_parity(big, "stages", path, HIGH, tmp_path)


@pytest.mark.timm
def test_parity_with_timm_root_only(tmp_path):
    # The R+Ti/16 layout (root, then patches on its feature map), loaded at
    # a higher resolution than it was exported at.
    _, path = _export_random_hybrid("root", tmp_path)
    big = tiny_hybrid("root", size=HIGH)
    assert any("resampled" in note for note in load_weights(big, path))
    _check_parity(big, "root", path, HIGH, tmp_path)


def test_group_norm_params_load_from_either_shape(tmp_path):
    source = randomize_hybrid(tiny_hybrid("small"), seed=7)
    flat, four_d = str(tmp_path / "flat.npz"), str(tmp_path / "4d.npz")
    export_npz(source, flat)
    _gn_as_4d(flat, four_d)
    assert np.load(four_d)["block1/unit1/gn_proj/bias"].shape == (1, 1, 1, 128)
    expected = {k: keras.ops.convert_to_numpy(v) for k, v in checkpoint_variables(source).items()}
    model = tiny_hybrid("small")
    for path in (flat, four_d):
        randomize_weights(model, seed=8)
        load_weights(model, path)
        for key, variable in checkpoint_variables(model).items():
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), expected[key], key)


# --- Saving, gradients, initialisation -------------------------------------------


def test_keras_save_and_load(tmp_path):
    model = randomize_hybrid(tiny_hybrid("small"))
    x = images(LOW)
    expected = run(model, x)
    path = str(tmp_path / "hybrid.keras")
    model.save(path)
    revived = keras.models.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(run(revived, x), expected)
    assert isinstance(revived.get_layer("block1_unit1_conv2"), StdConv2D)
    assert revived.get_layer("conv_root").strides == (2, 2)
    assert revived.get_layer("gn_root").epsilon == 1e-6


def test_global_channels_first_builds_the_same_hybrid():
    """Under `keras.config.set_image_data_format("channels_first")` (a
    PyTorch user's keras.json) the root's max-pool pooled over (W, C): another
    network (half the channels, rows not pooled), trained silently."""
    model = randomize_hybrid(tiny_hybrid("stages"))
    x = images(LOW)
    expected = run(model, x)
    keras.config.set_image_data_format("channels_first")
    try:
        other = tiny_hybrid("stages")
    finally:
        keras.config.set_image_data_format("channels_last")
    assert other.get_layer("pool_root").output.shape == model.get_layer("pool_root").output.shape
    other.set_weights(model.get_weights())
    np.testing.assert_array_equal(run(other, x), expected)


def test_gradient_reaches_every_weight():
    model = tiny_hybrid("small", size=32)
    # Random weights: the zero-initialised head and gn3 scales would
    # otherwise block every upstream gradient.
    randomize_weights(model, seed=3, scale=0.2)
    names = [v.path for v in model.trainable_variables]
    assert any("conv_root" in n for n in names) and any("block1_unit1_gn3" in n for n in names)
    assert len(names) == len(model.weights)
    assert_every_weight_gets_a_gradient(model, images(32, batch=1))


def test_fresh_hybrid_initialisation():
    model = tiny_hybrid("small")
    weight = keras.ops.convert_to_numpy
    # gn3 scale zero-init (models_resnet.py): each unit starts as its shortcut.
    np.testing.assert_array_equal(weight(model.get_layer("block1_unit1_gn3").gamma), 0.0)
    np.testing.assert_array_equal(weight(model.get_layer("block1_unit1_gn2").gamma), 1.0)
    for name in ("gn_root", "block1_unit1_gn_proj"):
        gn = model.get_layer(name)
        assert (gn.groups, gn.epsilon) == (32, 1e-6)
    assert model.get_layer("block1_unit1_conv1").epsilon == 1e-5


# --- Errors --------------------------------------------------------------------


def test_wrong_input_size_names_value_and_stride():
    with pytest.raises(ValueError, match=r"effective stride 32x32.*input_shape=\(240, 240, 3\)"):
        keras_vit.get_model("R+ViT-Ti_16", input_shape=(240, 240, 3))
    with pytest.raises(ValueError, match=r"effective stride 16x16.*input_shape=\(232, 224, 3\)"):
        keras_vit.R50ViTB16(input_shape=(232, 224, 3))


def test_bad_resnet_arguments():
    with pytest.raises(ValueError, match=r"Received: resnet=\(2, 0\)"):
        keras_vit.ViT(None, resnet=(2, 0))
    with pytest.raises(ValueError, match="Received: resnet='R50'"):
        keras_vit.ViT(None, resnet="R50")
    with pytest.raises(ValueError, match="Received: resnet_width_factor=0.3"):
        keras_vit.ViT(None, resnet=(1,), resnet_width_factor=0.3)
    with pytest.raises(ValueError, match="Received: resnet_width_factor=2"):
        keras_vit.ViT("testing", resnet_width_factor=2)
    # NaN and infinity raised from `int`, naming neither.
    for factor in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"Received: resnet_width_factor={factor}"):
            resnet_lib.check_resnet((1,), factor)
    # Numpy numbers (from an array) as Python ints: they were refused.
    stages, width = resnet_lib.check_resnet(tuple(np.array([3, 4])), np.float32(0.5))
    assert (stages, width) == ((3, 4), 32) and all(type(n) is int for n in stages)


def test_plain_checkpoint_into_hybrid_fails_and_changes_nothing(tmp_path):
    plain = randomize_weights(
        keras_vit.ViT(None, **TRANSFORMER, patch_size=8, input_shape=(LOW, LOW, 3),
                      num_classes=NUM_CLASSES),
        seed=5,
    )
    path = str(tmp_path / "plain.npz")
    export_npz(plain, path)
    model = randomize_hybrid(tiny_hybrid("small"))
    before = [keras.ops.convert_to_numpy(v).copy() for v in model.weights]
    with pytest.raises(ValueError) as info:
        load_weights(model, path)
    message = str(info.value)
    assert "no ResNet stem (plain ViT)" in message
    assert "missing from the checkpoint: conv_root/kernel" in message
    assert "the model is unchanged" in message
    for variable, value in zip(model.weights, before):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), value)
    # And the other way round.
    hybrid_path = str(tmp_path / "hybrid.npz")
    export_npz(model, hybrid_path)
    with pytest.raises(ValueError, match="not in the model: conv_root/kernel"):
        load_weights(plain, hybrid_path)
