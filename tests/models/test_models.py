"""ViT models: parameter counts, the keras.applications arguments, saving,
gradients and argument validation."""


import re

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import variants
from tests.helpers import (
    MODEL_KINDS,
    TINY_WIDTHS,
    assert_every_weight_gets_a_gradient,
    assert_saving_round_trip,
    lazy_build,
    random_images,
    randomize_weights,
    tiny_model,
)

# google-research/vision_transformer, vit_jax/models_test.py (num_classes=1000,
# 224 px); the 384-px column re-computed from the same definitions.
PARAM_COUNTS = {
    "testing": (21_390, 25_190),
    "testing-unpooled": (21_370, 25_170),
    "ViT-Ti_16": (5_717_416, 5_790_376),
    "ViT-S_16": (22_050_664, 22_196_584),
    "ViT-S_32": (22_878_952, 22_915_432),
    "ViT-B_8": (86_576_872, 87_744_232),
    "ViT-B_16": (86_567_656, 86_859_496),
    "ViT-B_32": (88_224_232, 88_297_192),
    "ViT-L_16": (304_326_632, 304_715_752),
    "ViT-L_32": (306_535_400, 306_632_680),
    "ViT-H_14": (632_045_800, 632_651_240),
    "ViT-S_16-gap-norep": (22_049_896, 22_195_816),
    "ViT-B_16-gap-norep": (86_566_120, 86_857_960),
    "ViT-S_32-gap-norep": (22_878_184, 22_914_664),
    "ViT-B_32-gap-norep": (88_222_696, 88_295_656),
}
TINY = dict(
    hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, patch_size=8,
    input_shape=(32, 32, 3),
)


@pytest.mark.one_backend
def test_constructors_exports_and_catalogue_derive_from_the_variant_table():
    """Issue 22: a variant is one row of `keras_vit/variants.py`; the
    constructors, `__all__`, `list_models` and the AugReg file names follow."""
    from keras_vit.weights import registry

    assert len(variants.CONSTRUCTORS) == 14 and set(variants.CONSTRUCTORS) <= set(keras_vit.__all__)
    for function, config in variants.CONSTRUCTORS.items():
        constructor = getattr(keras_vit, function)
        assert constructor.__name__ == function and constructor.__doc__.startswith(f"Builds {config} (")
    listed = {info.name: info.constructor for info in keras_vit.list_models()}
    constructors = {config: function for function, config in variants.CONSTRUCTORS.items()}
    assert listed == {name: constructors.get(name) for name in variants.VARIANTS}
    assert listed["R+ViT-Ti_16"] == "RViTTi16" and listed["ViT-B_16-gap-norep"] is None
    upstream = "-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0"
    for config in registry.AUGREG_RECOMMENDED:
        short = variants.augreg_name(config)
        assert registry.AUGREG_FILE.match(short + upstream).group("model") == short
    assert registry.AUGREG_FILE.match("H_14" + upstream) is None  # not in the AugReg release


def test_param_table_covers_every_plain_variant():
    plain = {name for name, f in variants.VARIANTS.items() if f.get("resnet") is None}
    assert plain <= set(PARAM_COUNTS)


# Shapes and counts are the same on every backend (every forward-pass test
# builds these layers on all three).
@pytest.mark.one_backend
@pytest.mark.parametrize("name", sorted(PARAM_COUNTS))
def test_param_counts(name):
    # Built without initialising weights: shapes are real, nothing is drawn.
    count_224 = lazy_build(lambda: keras_vit.get_model(name).count_params())
    # 384 px for H/14 is a 27x27 grid in the original (VALID padding drops
    # the last 6 pixels); keras_vit asks for the exact multiple, 378.
    side = 378 if name == "ViT-H_14" else 384
    count_384 = lazy_build(
        lambda: keras_vit.get_model(name, input_shape=(side, side, 3)).count_params()
    )
    assert (count_224, count_384) == PARAM_COUNTS[name]


@pytest.mark.one_backend
@pytest.mark.parametrize(
    "constructor, config",
    [
        (keras_vit.ViTTi16, "ViT-Ti_16"), (keras_vit.ViTS16, "ViT-S_16"),
        (keras_vit.ViTS32, "ViT-S_32"), (keras_vit.ViTB8, "ViT-B_8"),
        (keras_vit.ViTB16, "ViT-B_16"), (keras_vit.ViTB32, "ViT-B_32"),
        (keras_vit.ViTL16, "ViT-L_16"), (keras_vit.ViTL32, "ViT-L_32"),
        (keras_vit.ViTH14, "ViT-H_14"),
    ],
)
def test_constructors_use_the_table(constructor, config):
    # A tiny override of depth keeps this fast; everything else from the table.
    model = lazy_build(lambda: constructor(num_classes=7))
    fields = variants.VARIANTS[config]
    block = model.get_layer(f"encoderblock_{fields['num_layers'] - 1}")
    assert block.num_heads == fields["num_heads"]
    assert block.mlp_dim == fields["mlp_dim"]
    assert model.get_layer("embedding").patch_size == (fields["patch_size"],) * 2
    assert model.get_layer("embedding").hidden_size == fields["hidden_size"]
    assert model.output.shape == (None, 7)
    assert model.name == variants.model_name(config)
    assert config in constructor.__doc__


def test_augreg_and_slash_names_resolve():
    def build(name):
        model = keras_vit.get_model(name)
        return model.name, model.get_layer("dropout").rate

    assert lazy_build(lambda: build("B_16")) == ("vit_b_16", 0.0)
    assert lazy_build(lambda: build("S/32")) == ("vit_s_32", 0.0)
    # AugReg fine-tuning uses dropout 0 (vit_jax configs/augreg.py).
    assert lazy_build(lambda: build("L_16")) == ("vit_l_16", 0.0)
    assert lazy_build(lambda: build("ViT-L_16")) == ("vit_l_16", 0.1)
    # The constructor's name, as `available_weights` and `list_models` give it.
    assert lazy_build(lambda: build("ViTL16")) == ("vit_l_16", 0.1)
    # `name` is the Keras model's name, as for `ViT` (issue 21: it clashed
    # with get_model's own first argument).
    assert lazy_build(lambda: keras_vit.get_model("testing", name="x").name) == "x"


def test_model_names_are_valid_identifiers():
    for name in variants.VARIANTS:
        assert variants.model_name(name).replace("_", "").isalnum()


@pytest.mark.parametrize(
    "include_top, pooling, classifier, expected",
    [
        (True, None, "token", (None, 5)),
        (True, None, "gap", (None, 5)),
        (True, None, "unpooled", (None, 16, 5)),
        (True, None, "token_unpooled", (None, 17, 5)),
        (False, None, "token", (None, 17, 16)),
        (False, None, "gap", (None, 16, 16)),
        (False, "token", "token", (None, 16)),
        (False, "gap", "token", (None, 16)),
        (False, "avg", "gap", (None, 16)),
    ],
)
def test_outputs_of_include_top_and_pooling(include_top, pooling, classifier, expected):
    model = keras_vit.ViT(
        None, include_top=include_top, pooling=pooling, classifier=classifier,
        num_classes=5, **TINY,
    )
    assert model.output.shape == expected
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    assert model.predict(x, verbose=0).shape == (2,) + expected[1:]


def test_pooling_values():
    model = keras_vit.ViT(None, include_top=False, **TINY)
    randomize_weights(model)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    tokens = keras.ops.convert_to_numpy(model(x))
    for pooling, expected in (("token", tokens[:, 0]), ("gap", tokens.mean(axis=1))):
        pooled = keras_vit.ViT(None, include_top=False, pooling=pooling, **TINY)
        pooled.set_weights(model.get_weights())
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(pooled(x)), expected, rtol=1e-5, atol=1e-5
        )


def test_representation_size_pre_logits_with_tanh():
    model = keras_vit.ViT(None, representation_size=12, num_classes=3, **TINY)
    assert model.get_layer("pre_logits").units == 12
    features = keras_vit.ViT(
        None, include_top=False, pooling="token", representation_size=12, **TINY
    )
    assert features.output.shape == (None, 12)
    randomize_weights(features)
    x = np.random.default_rng(2).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    out = keras.ops.convert_to_numpy(features(x))
    assert np.all(np.abs(out) <= 1.0) and np.std(out) > 0.1


def test_head_and_class_token_initialisation():
    model = keras_vit.ViT(None, num_classes=4, head_bias_init=-10.0, **TINY)
    head = model.get_layer("head")
    np.testing.assert_array_equal(head.kernel.numpy(), 0.0)
    np.testing.assert_array_equal(head.bias.numpy(), -10.0)
    np.testing.assert_array_equal(model.get_layer("cls").cls.numpy(), 0.0)
    posemb = model.get_layer("posembed_input").pos_embedding.numpy()
    assert 0.015 < posemb.std() < 0.025
    mlp_bias = model.get_layer("encoderblock_0").mlp.dense_0.bias.numpy()
    assert 0 < np.abs(mlp_bias).max() < 1e-5


@pytest.mark.parametrize("shape", [(32, 48, 3), (48, 32, 3), (64, 64, 3)])
def test_non_square_and_other_sizes(shape):
    model = keras_vit.ViT(None, **{**TINY, "input_shape": shape})
    rows, cols = shape[0] // 8, shape[1] // 8
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, rows * cols + 1, 16)


def test_a_fixed_size_model_refuses_other_sizes_in_fit_evaluate_and_predict():
    """Sizes and channels. Keras checks a model's input shape in `model(x)`, but its JAX trainer
    calls the layers directly in `fit`, `evaluate` and `predict`, and its
    TensorFlow trainer retraces them at relaxed shapes when the size
    changes: there a 32-px model took 36-px images (4x4 patches, the last 4
    pixels of each side dropped) without a word, and other sizes failed deep
    inside. `ImageSizeCheck` refuses them on every backend, naming the size
    (in a TensorFlow graph of unknown size, through a reshape that fails);
    on PyTorch Keras' own check answers first. The model is still whole
    afterwards, on every backend (on JAX through `ViTModel`; Keras' trainer
    alone lost the variables to an error inside `predict`'s step). JAX's
    trainer also took 6 channels, a grouped convolution, without a word."""
    errors = (ValueError,)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        errors += (tf.errors.InvalidArgumentError,)
    y = np.eye(3, dtype="float32")[[0, 1]]
    good = np.ones((2, 32, 32, 3), "float32")
    model = keras_vit.ViT(None, **{**TINY, "num_classes": 3})
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    for name in ("fit", "evaluate", "predict"):
        call = getattr(model, name)
        labels = () if name == "predict" else (y,)
        call(good, *labels, verbose=0)  # Keras' set-up and first trace at 32 px
        for side in (36, 16):
            logits = model.predict(good, verbose=0)
            ours = (r"The image height must be 32: this model takes images of 32x32 pixels\..*"
                    rf"Received: images of shape \(2, {side}, {side}, 3\)")
            # (A batch of unknown size in a function TensorFlow traced again.)
            keras_own = rf"expected shape=\(None, 32, 32, 3\), found shape=\((2|None), {side}, {side}, 3\)"
            graph = rf"Input to reshape is a tensor with {side} values, but the requested shape has 32"
            with pytest.raises(errors, match=f"{ours}|{keras_own}|{graph}"):
                call(np.ones((2, side, side, 3), "float32"), *labels, verbose=0)
            np.testing.assert_array_equal(model.predict(good, verbose=0), logits, err_msg=f"{name} at {side} px")
        for channels in (6, 1):
            with pytest.raises(errors, match=rf"must have 3 channel\(s\).*Received: images of shape \((2|None), 32, 32, "
                                             rf"{channels}\)|expected shape=\(None, 32, 32, 3\), found shape="
                                             rf"\((2|None), 32, 32, {channels}\)|Input to reshape is a tensor with "
                                             rf"{channels} values, but the requested shape has 3"):
                call(np.ones((2, 32, 32, channels), "float32"), *labels, verbose=0)
            np.testing.assert_array_equal(model.predict(good, verbose=0), logits, err_msg=f"{name}, {channels} ch")
    # One side fixed, one open: the fixed side is checked too (JAX's predict took 24 rows for 16).
    half = keras_vit.ViT(None, **{**TINY, "input_shape": (32, None, 3), "image_size": (32, 32), "num_classes": 3})
    assert half.predict(np.ones((2, 32, 48, 3), "float32"), verbose=0).shape == (2, 3)
    with pytest.raises(errors, match=r"The image height must be 32: this model takes images of 32xany pixels|"
                                     r"expected shape=\(None, 32, None, 3\)|Input to reshape"):
        half.predict(np.ones((2, 48, 32, 3), "float32"), verbose=0)


def test_a_float64_model_gives_float64_logits():
    """Under a float64 policy the head was float32 (as under mixed
    precision): the logits came back float32, 1e-7 from float64's."""
    if keras.backend.backend() == "jax" and not __import__("jax").config.jax_enable_x64:
        pytest.skip("float64 on JAX needs JAX_ENABLE_X64")
    # floatx too: PyTorch's and JAX's Keras otherwise take float64 arrays in as float32.
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        model = randomize_weights(keras_vit.ViT(None, **TINY))
        images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3))
        logits = model.predict(images, verbose=0)
        head = model.get_layer("head")
        features = keras.ops.convert_to_numpy(keras.Model(model.input, head.input).predict(images, verbose=0))
    finally:
        keras.config.set_floatx("float32")
        keras.config.set_dtype_policy("float32")
    assert logits.dtype == np.float64 and {v.dtype for v in model.weights} == {"float64"}
    # A new head follows the model's dtype, not the global policy's.
    assert keras_vit.reset_head(model, 3).get_layer("head").dtype == "float64"
    assert keras_vit.reset_head(randomize_weights(keras_vit.ViT(None, **TINY)), 3).get_layer("head").dtype == "float32"
    if keras.backend.backend() == "torch":
        return  # Keras' PyTorch matmul computes float64 operands at float32's precision (Keras 3.15)
    kernel, bias = (keras.ops.convert_to_numpy(v) for v in head.weights)
    np.testing.assert_allclose(logits, features @ kernel + bias, rtol=1e-12, atol=1e-12)


def test_input_tensor():
    inputs = keras.Input((32, 32, 3))
    model = keras_vit.ViT(None, input_tensor=inputs, include_top=False, pooling="gap", **{
        k: v for k, v in TINY.items() if k != "input_shape"
    })
    assert model.inputs[0] is inputs
    assert model.output.shape == (None, 16)
    # The same shape given twice is accepted.
    assert keras_vit.ViT(None, **TINY, input_tensor=keras.Input(TINY["input_shape"])).input_shape == (None, 32, 32, 3)


def test_intermediate_blocks_can_be_tapped():
    model = keras_vit.ViT(None, **TINY)
    feature_model = keras.Model(
        model.input,
        [model.get_layer(f"encoderblock_{i}").output for i in range(2)],
    )
    x = np.zeros((1, 32, 32, 3), "float32")
    outs = feature_model.predict(x, verbose=0)
    assert [o.shape for o in outs] == [(1, 17, 16)] * 2


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
def test_every_model_kind_saves_and_loads_the_same(kind, tmp_path):
    """`.keras` in safe mode and `.weights.h5`: same outputs, same config
    (drop path on, so its schedule is part of the config)."""
    model = randomize_weights(tiny_model(kind, drop_path_rate=0.1))
    assert_saving_round_trip(model, random_images(model, seed=3), tmp_path)


def test_models_built_alike_name_their_variables_alike():
    """Two models built alike in one process have the same variable paths,
    the blocks' and masked patch prediction's random states included
    (`encoderblock_1/seed_generator/...`, not Keras' process-wide
    `seed_generator_7/...`): PyTorch's `state_dict` keys, layout maps and
    checkpoints see the same names. (Keras' own `Dropout` layers, used for
    `dropout_rate` > 0, still number theirs.)"""
    from keras_vit.pretraining import MaskedPatchPrediction

    def paths(model):
        return [v.path for v in model.variables]

    first, second = (tiny_model("registers", drop_path_rate=0.1) for _ in range(2))
    assert paths(first) == paths(second)
    assert [p for p in paths(first) if "seed_generator" in p] == [
        "encoderblock_0/seed_generator/seed_generator_state", "encoderblock_1/seed_generator/seed_generator_state"]
    first, second = (MaskedPatchPrediction(tiny_model("gap")) for _ in range(2))
    assert paths(first) == paths(second)
    assert "corruption/seed_generator/seed_generator_state" in paths(first)


def test_the_original_format_refuses_the_options_it_cannot_hold(tmp_path):
    """Issue 24: an .npz of the original layout would load into the original
    architecture and silently compute something else."""
    for kind, named in (("registers", "num_register_tokens=2.*layer_scale_init=0.1.*gelu='exact'"
                                      ".*no_embed_class=True"),
                        ("pre_norm_fc_norm", "pre_norm=True.*fc_norm=True.*patch_bias=False.*gelu='quick'"
                                             ".*layer_norm_epsilon=1e-05")):
        with pytest.raises(ValueError, match=named):
            keras_vit.export_npz(tiny_model(kind), str(tmp_path / f"{kind}.npz"))
        assert not list(tmp_path.iterdir())
    # A gap head over a class token: the file loaded as a token model,
    # which reads the class token (logits 0.8 off, silently).
    gap_over_cls = keras_vit.ViT(None, patch_size=8, input_shape=(16, 16, 3), num_classes=3, classifier="gap",
                                 class_token=True, **TINY_WIDTHS)
    with pytest.raises(ValueError, match=r"this model uses class_token=True with classifier='gap'"):
        keras_vit.export_npz(gap_over_cls, str(tmp_path / "gap.npz"))


def test_weights_h5_round_trip(tmp_path):
    model = randomize_weights(keras_vit.get_model("testing", input_shape=(32, 32, 3)))
    path = str(tmp_path / "vit.weights.h5")
    model.save_weights(path)
    restored = keras_vit.get_model("testing", input_shape=(32, 32, 3), weights=path)
    for a, b in zip(model.weights, restored.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
def test_every_model_kind_gets_a_gradient_to_every_weight(kind):
    model = randomize_weights(tiny_model(kind), scale=0.2)
    assert_every_weight_gets_a_gradient(model, random_images(model, seed=4))


def test_dropout_and_drop_path_only_in_training():
    model = keras_vit.ViT(None, dropout_rate=0.3, drop_path_rate=0.3, **TINY)
    randomize_weights(model)
    x = np.random.default_rng(5).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    run = lambda training: keras.ops.convert_to_numpy(model(x, training=training))  # noqa: E731
    a, b = run(False), run(False)
    np.testing.assert_array_equal(a, b)
    assert np.abs(run(True) - a).max() > 1e-3
    rates = [model.get_layer(f"encoderblock_{i}").drop_path_rate for i in range(2)]
    assert rates == [0.0, 0.3]  # Linear in depth.


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(input_shape=(30, 32, 3)), r"input_shape=\(30, 32, 3\)"),
        (dict(input_shape=(32, 32)), r"input_shape=\(32, 32\)"),
        (dict(pooling="max", include_top=False), "pooling='max'"),
        (dict(classifier="cls"), "classifier='cls'"),
        (dict(num_classes=0), "num_classes=0"),
        (dict(representation_size=-3), "representation_size=-3"),
        (dict(dropout_rate=1.5), "dropout_rate=1.5"),
        (dict(patch_size=(8, 0)), r"patch_size=\(8, 0\)"),
        (dict(classifier="gap", pooling="token", include_top=False), "pooling='token'"),
        (dict(include_top="yes"), "include_top='yes'"),
        (dict(num_layers=0), "num_layers=0"),
        (dict(num_layers=-1), "num_layers=-1"),
        (dict(num_layers=True), "num_layers=True"),
        (dict(num_classes=True), "num_classes=True"),
        (dict(pooling="gap"), "applies to include_top=False.*pooling=.gap."),
        (dict(pooling="token", include_top=True), "pooling='token' with include_top=True"),
        (dict(posemb_interpolation="nearest"), "posemb_interpolation='nearest'"),
        (dict(mlp_dim=True), "mlp_dim=True"),
        (dict(num_heads=True), "num_heads=True"),
        (dict(representation_size=True), "representation_size=True"),
        (dict(head_bias_init=float("nan")), "head_bias_init=nan"),
        (dict(input_shape=(3, 32, 32)), r"Images are \(height, width, channels\).*input_shape=\(3, 32, 32\)"),
        (dict(input_tensor=keras.Input((64, 64, 3))), r"input_shape=\(32, 32, 3\), input_tensor of shape \(64, 64, 3\)"),
        (dict(input_shape=(32, 32, 1), include_preprocessing=True, pixel_mean=(0.5,) * 3, pixel_std=(0.2,) * 3),
         r"3 per-channel values; the model's images have 1 channels. Received: input_shape=\(32, 32, 1\)"),
        (dict(include_preprocessing=True, pixel_mean=(123.7, 116.3, 103.5), pixel_std=(58.4, 57.1, 57.4)),
         r"divide values on the 0-255 scale by 255.*pixel_mean=\(123.7"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        keras_vit.ViT(None, **{**TINY, **kwargs})


def test_numpy_integer_sizes_are_accepted():
    """Sizes from numpy (a grid, an array of shapes), every one of them:
    `hidden_size=np.int64(16)` was refused as "Received: hidden_size=16"."""
    sizes = {k: np.int64(v) for k, v in TINY.items() if k in ("hidden_size", "mlp_dim", "num_heads", "num_layers")}
    model = keras_vit.ViT(None, **{**TINY, **sizes, "input_shape": np.array([32, 48, 3], np.int64)},
                          num_classes=np.int64(5), representation_size=np.int64(8))
    assert model.input_shape == (None, 32, 48, 3) and model.output.shape == (None, 5)
    assert all(type(s) is int for s in model.input_shape[1:])
    assert type(model.get_layer("embedding").get_config()["hidden_size"]) is int


def test_unknown_variant_and_keyword():
    with pytest.raises(ValueError, match="variant='ViT-X_16'"):
        keras_vit.get_model("ViT-X_16")
    with pytest.raises(ValueError, match=r"Did you mean 'ViT-B_16'\?.*variant='vit-b_16'"):
        keras_vit.get_model("vit-b_16")
    # Other spellings: lower-case big_vision names got no suggestion, and a
    # model's own Keras name (`model.name`) was offered 'Ti_16'.
    for spelling, meant in (("b/16", "B_16"), ("r+ti/16", "R_Ti_16"), ("vit_b_16", "ViT-B_16"),
                            ("vitb16", "ViT-B_16")):
        with pytest.raises(ValueError, match=rf"Did you mean '{meant}'\?.*variant='{re.escape(spelling)}'"):
            keras_vit.get_model(spelling)
    with pytest.raises(TypeError, match="hidden=3"):
        keras_vit.get_model("testing", hidden=3)


def test_num_heads_must_divide_width():
    with pytest.raises(ValueError, match="num_heads=3"):
        keras_vit.ViT(None, **{**TINY, "num_heads": 3})


def test_preprocess_input():
    pixels = np.array([[0, 51, 255]], "uint8")
    out = keras.ops.convert_to_numpy(keras_vit.preprocess_input(pixels))
    np.testing.assert_allclose(out, [[-1.0, -0.6, 1.0]], atol=1e-7)
    assert out.dtype == np.float32
    # A checkpoint's 3 per-channel values never broadcast over 1 channel.
    with pytest.raises(ValueError, match=r"the images have 1 channels. Received: images of shape \(1, 2, 2, 1\)"):
        keras_vit.preprocess_input(np.zeros((1, 2, 2, 1), "uint8"), (0.5,) * 3, (0.2,) * 3)
    # 16-bit pixels (up to 513 after scaling), booleans and int8 (uint8 data
    # viewed so: 200 became -1.44): refused, numpy and tensors alike.
    for images in (np.full((1, 2, 2, 3), 128 * 257, "uint16"), keras.ops.ones((1, 2, 2, 3), "bool"),
                   np.full((1, 2, 2, 3), 200, "uint8").view("int8")):
        with pytest.raises(ValueError, match=r"`images` must hold pixels in \[0, 255\].*dtype (uint16|bool|int8)"):
            keras_vit.preprocess_input(images)
    # A raw-image model casts its input to float32 first: 16-bit pixels
    # became 469.6 in [-1, 1] (PyTorch's `predict` converts uint16 to int32
    # before the model sees it: that one passes).
    model = keras_vit.ViT(None, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8, patch_size=4,
                          input_shape=(8, 8, 3), include_preprocessing=True)
    sixteen = np.full((1, 8, 8, 3), 60000, "uint16")
    calls = [lambda: model(sixteen), lambda: model({model.inputs[0].name: sixteen})]
    calls += [lambda: model.predict(sixteen, verbose=0)] * (keras.backend.backend() != "torch")
    for call in calls:
        with pytest.raises(ValueError, match=r"`images` must hold pixels in \[0, 255\].*dtype uint16"):
            call()
    assert model.predict(np.full((1, 8, 8, 3), 200, "uint8"), verbose=0).shape == (1, 1000)


def test_whole_number_floats_preprocess_as_uint8_bit_for_bit():
    """A model with `include_preprocessing` has a float32 input, which casts
    uint8 images: the layer computed the formula, which XLA rounds one ulp
    off the original on 126 of the 256 levels (JAX eager and compiled,
    TensorFlow's `predict`)."""
    levels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1).repeat(3, -1)
    expected = keras.ops.convert_to_numpy(keras_vit.preprocess_input(levels))
    np.testing.assert_array_equal(expected[0, :, :, 0].ravel(), (np.arange(256, dtype=np.float32) - 127.5) / 127.5)
    model = keras_vit.ViT(None, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8, patch_size=4,
                          input_shape=(16, 16, 3), include_preprocessing=True)
    layer = keras.Model(model.input, model.get_layer("preprocess_input").output)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(levels)), expected)
    np.testing.assert_array_equal(layer.predict(levels.astype("float32"), verbose=0), expected)
    # Other values: the formula.
    other = np.array([0.5, 127.25, -3.0, 300.0, np.nan], np.float32)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras_vit.preprocess_input(other)), (other - 127.5) / 127.5,
                               rtol=1e-6)


@pytest.mark.large
def test_full_size_b16_forward_pass_is_finite():
    model = keras_vit.ViTB16()
    x = np.random.default_rng(6).uniform(-1, 1, (1, 224, 224, 3)).astype("float32")
    out = model.predict(x, verbose=0)
    # Zero-initialised head: logits are exactly 0 until fine-tuned.
    np.testing.assert_array_equal(out, 0.0)
    features = keras.Model(model.input, model.get_layer("encoder_norm").output)(x)
    assert np.isfinite(keras.ops.convert_to_numpy(features)).all()
