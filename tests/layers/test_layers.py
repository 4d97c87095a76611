"""Layers: config round trips, numerics against numpy, attention scores,
mixed precision."""


import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import layers
from tests.helpers import assert_layer_round_trip, randomize_weights

RNG = np.random.default_rng(0)


def tokens(shape=(2, 5, 8)):
    return RNG.normal(size=shape).astype("float32")


LAYER_CASES = [
    (layers.PatchEmbedding, dict(hidden_size=8, patch_size=(4, 2)), (2, 8, 8, 3)),
    (layers.ImageSizeCheck, dict(stride=(4, 2)), (2, 8, 8, 3)),
    (layers.ImageSizeCheck, dict(stride=(4, 4), image_size=(8, 12)), (2, 8, 12, 3)),
    (layers.ClassToken, dict(), (2, 5, 8)),
    (layers.AddPositionEmbedding, dict(), (2, 5, 8)),
    (layers.SequencePooling, dict(method="gap"), (2, 5, 8)),
    (layers.AttentionPooling, dict(num_heads=2, mlp_dim=16, num_prefix_tokens=1), (2, 5, 8)),
    (layers.MlpBlock, dict(mlp_dim=16, dropout_rate=0.1), (2, 5, 8)),
    (
        layers.TransformerEncoderBlock,
        dict(num_heads=2, mlp_dim=16, dropout_rate=0.1, attention_dropout_rate=0.2,
             drop_path_rate=0.1, layer_norm_epsilon=1e-5, seed=3),
        (2, 5, 8),
    ),
]


@pytest.mark.parametrize("cls, kwargs, shape", LAYER_CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_config_round_trip_and_same_outputs(cls, kwargs, shape):
    assert_layer_round_trip(cls, kwargs, RNG.normal(size=shape).astype("float32"))


def test_patch_embedding_equals_flattened_patches_times_kernel():
    layer = layers.PatchEmbedding(hidden_size=6, patch_size=(2, 3))
    images = RNG.normal(size=(2, 4, 9, 3)).astype("float32")
    layer.build(images.shape)
    randomize = RNG.normal(size=layer.kernel.shape).astype("float32")
    layer.kernel.assign(randomize)
    layer.bias.assign(np.arange(6, dtype="float32"))
    out = keras.ops.convert_to_numpy(layer(images))
    kernel = randomize.reshape(-1, 6)
    expected = []
    for r in range(2):  # Row-major token order: token = row * cols + col.
        for c in range(3):
            patch = images[:, 2 * r: 2 * r + 2, 3 * c: 3 * c + 3, :].reshape(2, -1)
            expected.append(patch @ kernel + np.arange(6))
    np.testing.assert_allclose(out, np.stack(expected, axis=1), rtol=1e-5, atol=1e-5)


def test_class_token_is_prepended_and_position_embedding_added():
    x = tokens()
    cls_layer = layers.ClassToken()
    cls_layer.build(x.shape)
    cls_layer.cls.assign(np.full((1, 1, 8), 7.0, "float32"))
    out = keras.ops.convert_to_numpy(cls_layer(x))
    np.testing.assert_array_equal(out[:, 0], 7.0)
    np.testing.assert_array_equal(out[:, 1:], x)
    posemb = layers.AddPositionEmbedding()
    added = keras.ops.convert_to_numpy(posemb(out))
    np.testing.assert_allclose(added - out, np.broadcast_to(posemb.pos_embedding.numpy(), out.shape), atol=1e-6)


def numpy_layer_norm(x, gamma, beta, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = (x * x).mean(-1, keepdims=True) - mean**2  # Flax's formula.
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def numpy_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def numpy_block(x, block):
    """Encoder1DBlock of the original, written with numpy from the weights."""
    w = lambda v: v.numpy().astype(np.float64)  # noqa: E731
    att = block.attention
    y = numpy_layer_norm(x, w(block.layer_norm_0.gamma), w(block.layer_norm_0.beta))
    q = np.einsum("btd,dhk->bthk", y, w(att.query_dense.kernel)) + w(att.query_dense.bias)
    k = np.einsum("btd,dhk->bthk", y, w(att.key_dense.kernel)) + w(att.key_dense.bias)
    v = np.einsum("btd,dhk->bthk", y, w(att.value_dense.kernel)) + w(att.value_dense.bias)
    logits = np.einsum("bqhk,bshk->bhqs", q / np.sqrt(q.shape[-1]), k)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    heads = np.einsum("bhqs,bshk->bqhk", probs, v)
    y = np.einsum("bqhk,hkd->bqd", heads, w(att.output_dense.kernel)) + w(att.output_dense.bias)
    x = x + y
    y = numpy_layer_norm(x, w(block.layer_norm_2.gamma), w(block.layer_norm_2.beta))
    y = numpy_gelu_tanh(y @ w(block.mlp.dense_0.kernel) + w(block.mlp.dense_0.bias))
    y = y @ w(block.mlp.dense_1.kernel) + w(block.mlp.dense_1.bias)
    return x + y, probs


def test_encoder_block_and_attention_scores_equal_numpy():
    block = layers.TransformerEncoderBlock(num_heads=2, mlp_dim=16)
    x = tokens()
    block(x)
    for variable in block.weights:
        variable.assign(RNG.normal(0, 0.5, variable.shape).astype("float32"))
    expected, expected_probs = numpy_block(x.astype(np.float64), block)
    fused = keras.ops.convert_to_numpy(block(x))
    out, scores = block(x, return_attention_scores=True)
    np.testing.assert_allclose(fused, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), fused, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(scores), expected_probs, atol=1e-5)
    assert scores.shape == (2, 2, 5, 5)


def test_attention_scores_with_flash_attention_switched_on():
    # `keras.config.enable_flash_attention()` makes Keras refuse scores; the
    # block serves the scores call on the explicit path and leaves the flag on.
    block = layers.TransformerEncoderBlock(num_heads=2, mlp_dim=16)
    x = tokens()
    reference, reference_scores = block(x, return_attention_scores=True)
    block.attention._flash_attention = True
    out, scores = block(x, return_attention_scores=True)
    assert block.attention._flash_attention is True
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), keras.ops.convert_to_numpy(reference), atol=1e-6)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(scores), keras.ops.convert_to_numpy(reference_scores), atol=1e-6
    )


def test_attention_kernels_use_the_flax_fans():
    block = layers.TransformerEncoderBlock(num_heads=4, mlp_dim=8)
    block.build((1, 3, 64))
    kernel = block.attention.query_dense.kernel.numpy()
    limit = np.sqrt(6 / (64 + 64))  # xavier on the flattened (64, 64) kernel
    assert kernel.shape == (64, 4, 16)
    assert limit * 0.9 < np.abs(kernel).max() <= limit


def test_layer_norms_use_epsilon_1e_6():
    model = keras_vit.get_model("testing", input_shape=(32, 32, 3))
    assert model.get_layer("encoder_norm").epsilon == 1e-6
    assert model.get_layer("encoderblock_0").layer_norm_0.epsilon == 1e-6


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision(policy):
    keras.config.set_dtype_policy(policy)
    try:
        model = keras_vit.ViT(
            None, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=8,
            input_shape=(16, 16, 3), num_classes=3, representation_size=8,
        )
    finally:
        keras.config.set_dtype_policy("float32")
    randomize_weights(model)
    assert all(v.dtype == "float32" for v in model.weights)
    x = RNG.uniform(-1, 1, (2, 16, 16, 3)).astype("float32")
    features = keras.Model(model.input, model.get_layer("encoderblock_0").output)(x)
    assert keras.backend.standardize_dtype(features.dtype) == policy.split("_")[1]
    logits = model(x)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    reference = keras_vit.ViT(
        None, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=8,
        input_shape=(16, 16, 3), num_classes=3, representation_size=8,
    )
    reference.set_weights(model.get_weights())
    expected = keras.ops.convert_to_numpy(reference(x))
    # bfloat16 keeps 8 bits of mantissa: a few per cent of the logit scale.
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(logits), expected, atol=0.05 * np.abs(expected).max()
    )


@pytest.mark.one_backend  # numpy only
@pytest.mark.parametrize("old, new", [((16, 16), (32, 32)), ((16, 16), (8, 8)), ((4, 6), (7, 3))])
def test_pi_resize_meets_its_definition(old, new):
    """Issue 25, FlexiViT's PI-resize: with B the bilinear resize of patches
    (jax.image.resize's, checked where JAX is installed), a patch resized up
    embeds exactly as before, <B x, w'> = <x, w>; resized down, w' is the
    least-squares best, so the equality holds on the patches B can reach
    (x = B^T z) and the residual is orthogonal to B's rows."""
    from keras_vit.layers.patch_embedding import resize_matrix, resize_patch_embedding

    rng = np.random.default_rng(0)
    kernel = rng.normal(size=(*old, 3, 5)).astype("float32")
    resized = resize_patch_embedding(kernel, new)
    assert resized.shape == (*new, 3, 5) and resized.dtype == np.float32
    matrix = resize_matrix(old, new)  # (new pixels, old pixels)
    try:
        import jax

        basis = np.eye(old[0] * old[1]).reshape(-1, *old)
        reference = np.stack([np.asarray(jax.image.resize(b, new, "bilinear", antialias=False)).reshape(-1)
                              for b in basis], axis=1)
        np.testing.assert_allclose(matrix, reference, atol=1e-6)
    except ImportError:
        pass
    w, w_new = kernel.reshape(-1, 15), resized.reshape(-1, 15).astype(np.float64)
    if new[0] * new[1] >= old[0] * old[1]:
        patches = rng.normal(size=(6, old[0] * old[1]))
    else:
        patches = rng.normal(size=(6, new[0] * new[1])) @ matrix  # in the row space of B
        np.testing.assert_allclose(matrix @ (matrix.T @ w_new - w), 0.0, atol=1e-4)
    embedded = patches @ w
    resized_embedded = (patches @ matrix.T) @ w_new
    np.testing.assert_allclose(resized_embedded, embedded, atol=1e-4 * np.abs(embedded).max())
    with pytest.raises(ValueError, match="new_size"):
        resize_patch_embedding(kernel, (0, 8))


def test_qk_norm_attention_normalises_queries_and_keys_on_both_paths():
    """Issue 24: `QKNormAttention` overrides `MultiHeadAttention._compute_attention`
    (a protected hook Keras documents for custom attention; docs/training.md,
    "Private Keras seams"): the fused call and the attention-scores call both
    equal a numpy transcription with each head's queries and keys
    layer-normalised."""
    rng = np.random.default_rng(0)
    attention = layers.QKNormAttention(num_heads=2, key_dim=4, qk_norm_epsilon=1e-6)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    attention.build(x.shape, x.shape)
    randomize_weights(attention)
    weights = {v.path.split("/", 1)[1]: v.numpy() for v in attention.weights}

    def project(name):
        return np.einsum("btd,dhk->bthk", x, weights[f"{name}/kernel"]) + weights[f"{name}/bias"]

    def norm(name, value):
        mean, var = value.mean(-1, keepdims=True), value.var(-1, keepdims=True)
        return (value - mean) / np.sqrt(var + 1e-6) * weights[f"{name}/gamma"] + weights[f"{name}/beta"]

    q, k, v = norm("query_norm", project("query")), norm("key_norm", project("key")), project("value")
    logits = np.einsum("bqhk,bshk->bhqs", q, k) / 2.0
    scores = np.exp(logits - logits.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    mixed = np.einsum("bhqs,bshk->bqhk", scores, v)
    expected = np.einsum("bqhk,hkd->bqd", mixed, weights["attention_output/kernel"]) + weights["attention_output/bias"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(attention(x, x)), expected, rtol=1e-4, atol=1e-5)
    out, got_scores = attention(x, x, return_attention_scores=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got_scores), scores, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile")
def test_torch_compile_traces_an_encoder_block_once():
    # The block's sub-layers record their name scopes when built
    # (`keras_vit.layers.utils.call_symbolically`). Left to the first call,
    # that change of state failed a guard, and a model's predict step under
    # `jit_compile=True` compiled twice (inductor built every kernel twice).
    import torch
    from torch._dynamo.utils import counters

    tokens = keras.Input((5, 16))
    model = keras.Model(tokens, layers.TransformerEncoderBlock(num_heads=2, mlp_dim=32)(tokens))
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=(2, 5, 16)).astype("float32"))
    forward = torch.compile(lambda inputs: model(inputs, training=False), backend="eager")
    first = keras.ops.convert_to_numpy(forward(x))
    graphs = counters["stats"]["unique_graphs"]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(forward(x)), first)
    assert counters["stats"]["unique_graphs"] == graphs  # the second call compiled nothing


def test_dropout_applies_in_calls_without_keras_call_context():
    """`stateless_call(..., training=True)` and `call(x, training=True)` of
    a block ran its dropout as at inference (the sub-layers read `training`
    from Keras' call context, which only `__call__` sets): a custom JAX
    loop trained without dropout, and remat disagreed with no remat."""
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32"))
    for layer in (layers.TransformerEncoderBlock(2, 16, dropout_rate=0.5, attention_dropout_rate=0.5, seed=1),
                  layers.MlpBlock(16, dropout_rate=0.5)):
        inference = keras.ops.convert_to_numpy(layer(x))
        trained = keras.ops.convert_to_numpy(layer.call(x, training=True))
        stateless, _ = layer.stateless_call(layer.trainable_variables, layer.non_trainable_variables, x,
                                            training=True)
        assert np.abs(trained - inference).max() > 1e-2, layer.name
        assert np.abs(keras.ops.convert_to_numpy(stateless) - inference).max() > 1e-2, layer.name
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.call(x, training=False)), inference)


def test_a_functional_block_returns_its_scores():
    """`block(x, return_attention_scores=True)` on a Keras tensor gave one
    output (unpacking it failed; used whole, the scores were dropped)."""
    inputs = keras.Input((5, 8))
    outputs, scores = layers.TransformerEncoderBlock(2, 16)(inputs, return_attention_scores=True)
    model = keras.Model(inputs, [outputs, scores])
    got = model.predict(np.ones((3, 5, 8), "float32"), verbose=0)
    assert [tuple(g.shape) for g in got] == [(3, 5, 8), (3, 2, 5, 5)]
    np.testing.assert_allclose(got[1].sum(-1), 1.0, rtol=1e-5)


def test_drop_path_rate_is_exact_under_bfloat16():
    """The draw was in bfloat16 (multiples of 1/128 on JAX, `keep`
    rounded): a rate of 0.003 dropped 0.008 of the paths."""
    block = layers.TransformerEncoderBlock(2, 16, drop_path_rate=0.003, seed=0, dtype="mixed_bfloat16")
    branch = keras.ops.ones((40_000, 1, 1), dtype="bfloat16")
    dropped = float(keras.ops.mean(keras.ops.cast(block._drop_path(branch, True) == 0, "float32")))
    assert 0.002 < dropped < 0.004, dropped  # 120 of 40,000 expected, sd 11


def test_pixels_are_scaled_before_any_rounding_under_mixed_precision():
    """`ImageSizeCheck` autocast float pixels to bfloat16 before the float32
    `PreprocessInput`: 200.3 became 200.0."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = keras_vit.ViT(None, hidden_size=8, mlp_dim=8, num_heads=2, num_layers=1, patch_size=8,
                              input_shape=(8, 8, 3), include_preprocessing=True, pixel_mean=(0.5,) * 3,
                              pixel_std=(0.5,) * 3)
    finally:
        keras.config.set_dtype_policy("float32")
    scaled = keras.Model(model.inputs[0], model.get_layer("preprocess_input").output)
    got = keras.ops.convert_to_numpy(scaled(np.full((1, 8, 8, 3), 200.3, "float32")))
    np.testing.assert_allclose(got, (np.float32(200.3) / 255 - 0.5) / 0.5, rtol=1e-6)


def _built(layer, shape):
    layer.build(shape)
    return layer


@pytest.mark.parametrize("build, match", [
    # A mean of no tokens was NaN; a negative count pooled the last token alone.
    (lambda: layers.SequencePooling("gap", num_prefix_tokens=5)(np.ones((1, 5, 4), "float32")),
     r"below the 5 tokens.*num_prefix_tokens=5"),
    (lambda: layers.SequencePooling("gap", num_prefix_tokens=-1), "num_prefix_tokens=-1"),
    (lambda: layers.AttentionPooling(2, 8, num_prefix_tokens=5)(np.ones((1, 5, 4), "float32")),
     r"below the 5 tokens"),
    (lambda: layers.AttentionPooling(0, 8), "num_heads=0"),  # a ZeroDivisionError before
    (lambda: layers.AddPositionEmbedding(grid=(2.5, 2), stride=4), r"grid=\(2.5, 2\)"),  # became (2, 2)
    (lambda: layers.AddPositionEmbedding(grid=(2, 2), stride=(0, 4)), r"stride=\(0, 4\)"),
    # A negative epsilon gave NaN outputs.
    (lambda: layers.QKNormAttention(num_heads=2, key_dim=4, qk_norm_epsilon=-1.0), "qk_norm_epsilon=-1.0"),
    (lambda: layers.TransformerEncoderBlock(num_heads=2, mlp_dim=8, layer_norm_epsilon=0), "layer_norm_epsilon=0"),
    # 6 channels passed as a grouped convolution on JAX.
    (lambda: _built(layers.ImageSizeCheck(4), (1, 8, 8, 3))(np.ones((1, 8, 8, 6), "float32")), r"must have 3 channel"),
    # Channels-first images were told about grey-scale and RGBA.
    (lambda: _built(layers.ImageSizeCheck(4), (1, 8, 8, 3))(np.ones((1, 3, 8, 8), "float32")),
     r"must have 3 channel\(s\), as the model's input. These look channels-first: keras_vit models take \(batch, "
     r"height, width, channels\)"),
])
def test_layer_arguments_are_checked(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_the_channel_error_gives_the_fix_that_fits():
    """Only images that look channels-first are told so (3x3 grey images and
    3-pixel-high RGBA ones were), and the grey/RGBA advice only to 3-channel models."""
    def message(channels, images):
        with pytest.raises(ValueError) as error:
            _built(layers.ImageSizeCheck(1), (1, 8, 8, channels))(np.ones(images, "float32"))
        return str(error.value)

    assert "channels-first" in message(3, (1, 3, 8, 8))
    for images in ((1, 3, 3, 1), (1, 3, 8, 4)):
        assert "channels-first" not in message(3, images) and "Grey-scale" in message(3, images)
    assert "Grey-scale" not in message(1, (1, 8, 8, 3)) and "channels-first" not in message(4, (1, 8, 8, 3))


def test_layer_sizes_from_numpy_are_ints():
    assert layers.ClassToken(num_tokens=np.int64(2)).num_tokens == 2
    assert layers.StdConv2D(np.int64(4), 3).filters == 4
    assert layers.AddPositionEmbedding(grid=2, stride=np.int64(4)).stride == (4, 4)


def test_a_frozen_qk_norm_attention_trains_nothing():
    """Used on its own, a frozen `QKNormAttention` trained all its 12
    weights (Keras builds the projections trainable; the block passed its
    state on, the exported layer did not)."""
    inputs = keras.Input((5, 8))
    attention = layers.QKNormAttention(num_heads=2, key_dim=4, trainable=False)
    model = keras.Model(inputs, attention(inputs, inputs))
    assert model.trainable_weights == [] and len(model.weights) == 12
