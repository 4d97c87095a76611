"""keras_vit.inspect: attention probabilities from a weight-sharing model,
attention rollout, mean attention distance, position-embedding similarity,
embedding-filter PCA and the figures (paper Fig. 6 and 7), plain and hybrid."""

import os
import sys
import runpy

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import inspect as vi
from tests.helpers import ROOT, randomize_weights, tiny_model

RECIPE = os.path.join(ROOT, "recipes", "inspect_vit.py")
TINY = dict(hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32)


@pytest.fixture(scope="module")
def plain():
    # Non-square 2x3 grid of 8x8 patches, class token.
    model = keras_vit.ViT(None, patch_size=8, input_shape=(16, 24, 3), num_classes=3, **TINY)
    return randomize_weights(model, seed=1, scale=0.3)


@pytest.fixture(scope="module")
def hybrid():
    # Root-only ResNet stem (stride 4), then 2x2 patches: 8x8-pixel patches.
    model = keras_vit.ViT(
        None, resnet=(), resnet_width_factor=0.5, patch_size=2, input_shape=(32, 32, 3),
        include_top=False, classifier="gap", **TINY,
    )
    return randomize_weights(model, seed=2, scale=0.3)


def _images(shape, count=3, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (count, *shape)).astype("float32")


def _manual_attention(block, x):
    """Softmax(q k^T / sqrt(head_dim)) from the block's weights, in numpy."""
    ln = block.layer_norm_0
    gamma, beta = (keras.ops.convert_to_numpy(v) for v in (ln.gamma, ln.beta))
    x = x.astype(np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6) * gamma + beta
    att = block.attention
    dense = {
        name: (keras.ops.convert_to_numpy(d.kernel), keras.ops.convert_to_numpy(d.bias))
        for name, d in (("q", att.query_dense), ("k", att.key_dense))
    }
    q = np.einsum("btd,dhk->bthk", y, dense["q"][0]) + dense["q"][1]
    k = np.einsum("btd,dhk->bthk", y, dense["k"][0]) + dense["k"][1]
    logits = np.einsum("bqhk,bthk->bhqt", q / np.sqrt(q.shape[-1]), k)
    logits -= logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    return probs / probs.sum(-1, keepdims=True)


def _block_inputs(model, images):
    names = vi.block_names(model)
    probe = keras.Model(model.inputs[0], [model.get_layer(n).input for n in names])
    return probe.predict_on_batch(images)


# --- attention from the model ------------------------------------------------


def test_attention_equals_manual_computation(plain):
    images = _images((16, 24, 3))
    attentions = vi.attention_weights(plain, images)
    assert attentions.shape == (2, 3, 2, 7, 7)
    for i, x in enumerate(_block_inputs(plain, images)):
        expected = _manual_attention(plain.get_layer(f"encoderblock_{i}"), x)
        np.testing.assert_allclose(attentions[i], expected, atol=2e-5)
    # The batch-by-batch helpers agree with the whole array (3 images in
    # batches of 2 + 1 for the distance).
    geo = vi.geometry(plain)
    np.testing.assert_allclose(
        vi.model_attention_distance(plain, images, batch_size=2),
        vi.mean_attention_distance(attentions, geo.grid, geo.patch_size, 1), rtol=1e-5)
    grid_maps, image_maps = vi.rollout_maps(plain, images)
    np.testing.assert_allclose(
        grid_maps, vi.rollout_to_grid(vi.attention_rollout(attentions), (2, 3)), rtol=1e-5)
    assert image_maps.shape == (3, 16, 24) and 0.85 < image_maps.max() <= 1.0
    # A chosen subset comes in the order given.
    assert list(vi.attention_model(plain, blocks=[-1, 0]).output) == [
        "encoderblock_1", "encoderblock_0"]


def test_attention_model_shares_weights(plain):
    images = _images((16, 24, 3))
    layer_names = [layer.name for layer in plain.layers]
    before_out = plain.predict_on_batch(images)
    probe = vi.attention_model(plain, blocks=0)
    # The probe holds the model's own variables, and nothing else.
    model_ids = {id(v) for v in plain.weights}
    assert probe.weights and {id(v) for v in probe.weights} <= model_ids
    # The model is untouched: same layers (no probes inside), same output.
    assert [layer.name for layer in plain.layers] == layer_names
    np.testing.assert_array_equal(plain.predict_on_batch(images), before_out)

    block = plain.get_layer("encoderblock_0")
    kernel = block.attention.query_dense.kernel
    old = keras.ops.convert_to_numpy(kernel)
    first = probe.predict_on_batch(images)["encoderblock_0"]
    try:
        kernel.assign(old * -2.0 + 0.1)
        second = probe.predict_on_batch(images)["encoderblock_0"]
        x = _block_inputs(plain, images)[0]
        np.testing.assert_allclose(second, _manual_attention(block, x), atol=2e-5)
        assert np.abs(second - first).max() > 1e-2
        # And the other way round: the model's output moved too.
        assert np.abs(plain.predict_on_batch(images) - before_out).max() > 0
    finally:
        kernel.assign(old)


def test_the_analyses_reuse_one_attention_model_per_model():
    """A notebook looping over images compiled a new attention model at every
    call (1.4 s each for a tiny model on JAX). The reused one follows the
    model's weights and LoRA adapters, and goes with the model."""
    import gc
    import weakref

    from keras_vit.inspect import attention

    model = randomize_weights(keras_vit.ViT(None, patch_size=8, input_shape=(16, 24, 3), num_classes=3, **TINY),
                              seed=3, scale=0.3)
    images = _images((16, 24, 3))
    first = vi.attention_weights(model, images)
    assert len(attention._PROBES[model]) == 1
    probe = attention._PROBES[model][(0, 1)]
    list(attention.attention_batches(model, images, batch_size=2))
    np.testing.assert_array_equal(vi.attention_weights(model, images, blocks=[0, 1]), first)
    assert list(attention._PROBES[model].values()) == [probe]
    probe = probe[1]
    keras_vit.enable_lora(model, rank=2)
    for layer in keras_vit.lora.lora_layers(model):
        layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.5, "float32"))
    fresh = vi.attention_model(model).predict(images, verbose=0)
    adapted = vi.attention_weights(model, images)
    assert np.abs(adapted - first).max() > 1e-3
    np.testing.assert_array_equal(adapted, np.stack([fresh["encoderblock_0"], fresh["encoderblock_1"]]))
    alive = weakref.ref(model)
    del model, probe
    gc.collect()
    assert alive() is None


def test_geometry_plain_and_hybrid(plain, hybrid):
    geo = vi.geometry(plain)
    assert (geo.image_size, geo.grid, geo.patch_size) == ((16, 24), (2, 3), (8, 8))
    assert (geo.num_prefix_tokens, geo.num_layers, geo.num_heads, geo.hybrid) == (1, 2, 2, False)
    geo = vi.geometry(hybrid)
    # Stem stride 4 x patch 2 = 8 pixels per token; gap model: no class token.
    assert (geo.grid, geo.patch_size, geo.num_prefix_tokens, geo.hybrid) == ((4, 4), (8, 8), 0, True)
    assert vi.attention_weights(hybrid, _images((32, 32, 3))).shape == (2, 3, 2, 16, 16)


def test_bad_arguments(plain):
    with pytest.raises(ValueError, match="blocks=5"):
        vi.attention_model(plain, blocks=5)
    # NumPy integers are integers (refused before); a dict is no list of blocks (taken before).
    assert list(vi.attention_model(plain, blocks=np.arange(2)).output) == list(vi.attention_model(plain).output)
    assert vi.attention_weights(plain, _images((16, 24, 3)), blocks=np.int64(1), batch_size=np.int64(2)).shape[0] == 1
    with pytest.raises(ValueError, match=r"blocks=\{0: 1\}"):
        vi.attention_model(plain, blocks={0: 1})
    with pytest.raises(ValueError, match=r"images.shape=\(3, 16, 16, 3\)"):
        vi.attention_weights(plain, _images((16, 16, 3)))
    with pytest.raises(ValueError, match="not a keras_vit ViT"):
        vi.geometry(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))


def test_bad_images_are_refused_before_any_step_and_the_model_still_works():
    """On JAX, a `predict` that failed in its first step (30 px for patches
    of 8, an empty batch) left the variables the probe shares with the
    user's model empty: every later call of the model failed."""
    model = randomize_weights(tiny_model("plain", input_shape=(None, None, 3), image_size=32))
    images = _images((32, 32, 3))
    expected = keras.ops.convert_to_numpy(model(images))
    with pytest.raises(ValueError, match=r"multiple of 8.*\(3, 30, 32, 3\)"):
        vi.attention_weights(model, images[:, :30])
    with pytest.raises(ValueError, match=r"a batch of at least one.*\(0, 32, 32, 3\)"):
        vi.attention_weights(model, images[:0])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images)), expected)


def test_a_float32_model_under_a_global_mixed_policy_is_inspected_in_float32(plain):
    """The probe layers take the blocks' policy: under a global
    `mixed_bfloat16` (set at the top of a training script) they computed in
    bfloat16 (errors of 1e-2 against 1e-6)."""
    images = _images((16, 24, 3))
    expected = _manual_attention(plain.get_layer("encoderblock_0"), _block_inputs(plain, images)[0])
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        got = vi.attention_weights(plain, images)[0]
    finally:
        keras.config.set_dtype_policy(previous)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_a_model_behind_a_crop_is_inspected_on_the_images_it_takes():
    """`input_tensor` after a crop: the images are those of the model's
    input and the grid the ViT's (every size was refused)."""
    inputs = keras.Input((20, 28, 3))
    model = randomize_weights(keras_vit.ViT(
        None, patch_size=8, input_tensor=keras.layers.CenterCrop(16, 24)(inputs), num_classes=3, **TINY))
    images = _images((20, 28, 3))
    cropped = images[:, 2:18, 2:26]
    attention = vi.attention_weights(model, images)
    np.testing.assert_allclose(
        attention[0], _manual_attention(model.get_layer("encoderblock_0"), _block_inputs(model, images)[0]),
        atol=1e-5)
    grid_maps, _ = vi.rollout_maps(model, images)
    assert grid_maps.shape == (3, 2, 3)
    assert vi.model_attention_distance(model, images).shape == (2, 2)
    with pytest.raises(ValueError, match=r"\(batch, 20, 28, 3\)"):
        vi.attention_weights(model, cropped)


def test_rollout_reads_what_the_head_reads():
    """A gap head over a model with a class token (MAE's, timm's
    `global_pool="avg"`): the default map is the mean over tokens, not the
    class token's row, which that head never reads."""
    model = randomize_weights(keras_vit.ViT(
        None, patch_size=8, input_shape=(16, 24, 3), num_classes=3, classifier="gap", class_token=True,
        fc_norm=True, **TINY), seed=3, scale=0.3)
    images = _images((16, 24, 3))
    default, _ = vi.rollout_maps(model, images)
    np.testing.assert_array_equal(default, vi.rollout_maps(model, images, source="mean")[0])
    assert not np.allclose(default, vi.rollout_maps(model, images, source="token")[0])


# --- rollout -------------------------------------------------------------------


def test_rollout_uniform_attention_closed_form():
    # Uniform attention J/T: A = (J/T + I)/2 is P/2 + I/2 with P = J/T a
    # projection, so A^L = P + (I - P) / 2^L.
    layers, tokens = 3, 5
    attentions = np.full((layers, 1, 4, tokens, tokens), 1.0 / tokens)
    rollout = vi.attention_rollout(attentions)[0]
    p = np.full((tokens, tokens), 1.0 / tokens)
    np.testing.assert_allclose(rollout, p + (np.eye(tokens) - p) / 2**layers, atol=1e-12)


def test_rollout_order_and_head_average():
    # 3 tokens; every query of block 1 attends to token 2, of block 2 to
    # token 1 (two identical heads each).
    to = lambda j: np.tile(np.eye(3)[j], (3, 1))  # noqa: E731
    block1 = np.stack([to(2), to(2)])
    block2 = np.stack([to(1), to(1)])
    rollout = vi.attention_rollout(np.stack([block1, block2]))
    # A1 = (to2 + I)/2, A2 = (to1 + I)/2, rollout = A2 @ A1; row 0 by hand:
    # 0.5 * [.5, 0, .5] + 0.5 * [0, .5, .5].
    np.testing.assert_allclose(rollout[0], [0.25, 0.25, 0.5], atol=1e-12)
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-12)
    # Mixed heads are averaged before the product.
    mixed = np.stack([np.stack([to(0), to(2)]), np.stack([to(1), to(1)])])
    a1 = (0.5 * (to(0) + to(2)) + np.eye(3)) / 2
    a2 = (to(1) + np.eye(3)) / 2
    np.testing.assert_allclose(vi.attention_rollout(mixed), a2 @ a1, atol=1e-12)
    # Without the residual, the raw product.
    np.testing.assert_allclose(vi.attention_rollout(mixed, add_residual=False),
                               to(1) @ (0.5 * (to(0) + to(2))), atol=1e-12)


def test_rollout_to_grid_token_and_mean():
    # 1 class token + a 1x3 grid.
    rollout = np.array([[[0.1, 0.2, 0.3, 0.4],
                         [0.0, 1.0, 0.0, 0.0],
                         [0.0, 0.0, 1.0, 0.0],
                         [0.0, 0.0, 0.0, 1.0]]])
    maps = vi.rollout_to_grid(rollout, (1, 3), num_prefix_tokens=1)
    np.testing.assert_allclose(maps, [[[0.5, 0.75, 1.0]]])
    raw = vi.rollout_to_grid(rollout, (1, 3), num_prefix_tokens=1, normalize=False)
    np.testing.assert_allclose(raw, [[[0.2, 0.3, 0.4]]])
    # Gap models: the mean over all output tokens (no class token).
    gap = np.array([[[1.0, 0.0], [0.5, 0.5]]])
    np.testing.assert_allclose(vi.rollout_to_grid(gap, (1, 2), 0, normalize=False), [[[0.75, 0.25]]])
    with pytest.raises(ValueError, match="source='token'"):
        vi.rollout_to_grid(gap, (1, 2), 0, source="token")
    # Registers without a class token (a gap model): the patches' rows, not
    # register 0's row (taken before).
    registers = np.array([[[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    np.testing.assert_allclose(vi.rollout_to_grid(registers, (1, 2), 1, normalize=False, class_token=False),
                               [[[0.5, 0.5]]])
    with pytest.raises(ValueError, match="source='token'"):
        vi.rollout_to_grid(registers, (1, 2), 1, source="token", class_token=False)
    # Upsampling a constant map keeps it; a 1x2 map ramps between the centres.
    np.testing.assert_allclose(vi.upsample_maps(np.ones((1, 2, 3)), (8, 12)), 1.0)
    ramp = vi.upsample_maps(np.array([[[0.0, 1.0]]]), (1, 4))
    np.testing.assert_allclose(ramp, [[[0.0, 0.25, 0.75, 1.0]]])


# --- mean attention distance -----------------------------------------------------


def test_patch_distances_and_mean_attention_distance():
    p = 16.0
    d = vi.patch_distances((2, 2), (p, p))
    np.testing.assert_allclose(d[0], [0, p, p, p * np.sqrt(2)])
    # Uniform attention over the 4 patches, plus a class token getting half
    # of each query's weight. Layer 0: that; layer 1: identity (distance 0).
    uniform = np.full((5, 5), 0.125)
    uniform[:, 0] = 0.5
    attentions = np.stack([
        np.broadcast_to(uniform, (2, 1, 5, 5)),
        np.broadcast_to(np.eye(5), (2, 1, 5, 5)),
    ])
    expected = (2 * p + p * np.sqrt(2)) / 4
    distances = vi.mean_attention_distance(attentions, (2, 2), (p, p), num_prefix_tokens=1)
    np.testing.assert_allclose(distances, [[expected], [0.0]])
    # NaN attention (e.g. from NaN inputs) gives NaN, not a distance of 0.
    broken = np.array(attentions)
    broken[1, 0] = np.nan
    assert np.isnan(vi.mean_attention_distance(broken, (2, 2), (p, p), num_prefix_tokens=1)[1, 0])
    raw = vi.mean_attention_distance(attentions, (2, 2), (p, p), 1, renormalize=False)
    np.testing.assert_allclose(raw, [[expected / 2], [0.0]])
    # Non-square patches on a 1x2 grid: one head looks at the other patch
    # (8 px wide patches -> 8 px apart), one at itself.
    swap = np.array([[0.0, 1.0], [1.0, 0.0]])
    attentions = np.stack([np.stack([swap, np.eye(2)])])[:, None]
    np.testing.assert_allclose(vi.mean_attention_distance(attentions, (1, 2), (16, 8)), [[8.0, 0.0]])
    # An int is a square patch, as in the model API (a TypeError before);
    # sizes of 0 or below and 3-item grids are refused by name (0 px and
    # positive distances came back).
    np.testing.assert_allclose(vi.mean_attention_distance(attentions, (1, 2), 8), [[8.0, 0.0]])
    for grid, patch, named in (((1, 2), (0, 0), "patch_size"), ((1, 2), (-4, -4), "patch_size"),
                               ((1, 2, 1), 8, "grid")):
        with pytest.raises(ValueError, match=f"`{named}` must be a positive int or a tuple of 2"):
            vi.mean_attention_distance(attentions, grid, patch)


# --- position embeddings and filters ---------------------------------------------


def test_posemb_similarity_known_embeddings():
    # Identical rows: everything similar.
    same = np.tile(np.array([[1.0, -2.0, 3.0]]), (7, 1))
    np.testing.assert_allclose(vi.posemb_similarity(same, (2, 3), num_prefix_tokens=1), 1.0)
    # One-hot rows on a non-square 2x3 grid: 1 at the cell itself, 0 elsewhere.
    onehot = np.concatenate([np.full((1, 6), 9.0), np.eye(6)])[None]
    sim = vi.posemb_similarity(onehot, (2, 3), num_prefix_tokens=1)
    assert sim.shape == (2, 3, 2, 3)
    for r in range(2):
        for c in range(3):
            expected = np.zeros((2, 3))
            expected[r, c] = 1.0
            np.testing.assert_allclose(sim[r, c], expected, atol=1e-12)
    # Opposite vectors: -1.
    opposite = np.array([[1.0, 2.0], [-1.0, -2.0]])
    np.testing.assert_allclose(vi.posemb_similarity(opposite, (1, 2))[0, 0], [[1.0, -1.0]])
    with pytest.raises(ValueError, match="posemb.shape"):
        vi.posemb_similarity(np.zeros((5, 3)), (2, 3), num_prefix_tokens=1)


def test_filter_components_recover_known_basis():
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.normal(size=(2 * 2 * 3, 2)))[0].T  # 2 orthonormal filters
    # Zero-mean, uncorrelated coefficients with variances 25 : 1.
    centred = rng.normal(size=(64, 2))
    centred -= centred.mean(axis=0)
    coefficients = np.linalg.qr(centred)[0] * np.array([5.0, 1.0])
    kernel = (coefficients @ basis).T.reshape(2, 2, 3, 64)
    components, explained = vi.filter_components(kernel, num_components=2)
    assert components.shape == (2, 2, 2, 3)
    for i in range(2):
        assert abs(abs(components[i].ravel() @ basis[i]) - 1.0) < 1e-9
        # Sign convention: the largest-magnitude entry is positive.
        flat = components[i].ravel()
        assert flat[np.argmax(np.abs(flat))] > 0
    np.testing.assert_allclose(explained, [25 / 26, 1 / 26], rtol=1e-9)
    # 12 pixels per filter: at most 12 components.
    assert vi.filter_components(kernel, num_components=12)[0].shape == (12, 2, 2, 3)
    with pytest.raises(ValueError, match="num_components=13"):
        vi.filter_components(kernel, num_components=13)


def test_model_posemb_and_filters(plain, hybrid):
    posemb = keras.ops.convert_to_numpy(plain.get_layer("posembed_input").pos_embedding)[0, 1:]
    sim = vi.model_posemb_similarity(plain)
    unit = posemb / np.linalg.norm(posemb, axis=-1, keepdims=True)
    np.testing.assert_allclose(sim[1, 2, 0, 1], unit[5] @ unit[1], atol=1e-6)
    components, _ = vi.embedding_filter_components(plain, num_components=4)
    assert components.shape == (4, 8, 8, 3)
    with pytest.raises(ValueError, match="hybrid"):
        vi.embedding_filter_components(hybrid)


# --- figures -------------------------------------------------------------------


def _check_file(path, magic):
    assert os.path.getsize(path) > 1000, path
    with open(path, "rb") as f:
        assert magic in f.read(400), path


def test_write_figures_plain_png(plain, tmp_path):
    images = _images((16, 24, 3), count=3)
    written = vi.write_figures(plain, images, tmp_path, rollout_images=2)
    for name in ("rollout", "posemb_similarity", "embedding_filters", "attention_distance"):
        _check_file(written[name], b"PNG")
    with np.load(written["arrays"]) as arrays:
        assert arrays["rollout_grid_maps"].shape == (2, 2, 3)
        assert arrays["posemb_similarity"].shape == (2, 3, 2, 3)
        assert arrays["mean_attention_distance"].shape == (2, 2)
        # At most D - 1 = 15 components of the centred 16 filters.
        assert arrays["filter_components"].shape == (15, 8, 8, 3)
        assert np.nanmax(arrays["rollout_grid_maps"]) == pytest.approx(1.0)


def test_write_figures_with_register_tokens_and_patch_only_position_embeddings(tmp_path):
    """Issue 24: a DINOv2-with-registers-like model (class + 2 register
    tokens, position embeddings for the patches only): the maps cover the
    patch grid, the class token is the rollout's source."""
    model = randomize_weights(tiny_model("registers"))
    written = vi.write_figures(model, _images((16, 24, 3), count=3), tmp_path, rollout_images=2)
    with np.load(written["arrays"]) as arrays:
        assert arrays["rollout_grid_maps"].shape == (2, 2, 3)
        assert arrays["posemb_similarity"].shape == (2, 3, 2, 3)
        assert np.nanmax(arrays["rollout_grid_maps"]) == pytest.approx(1.0)


def test_write_figures_of_a_grey_image_model(tmp_path):
    """One channel: the rollout shows grey images and the filter figure is
    skipped (write_figures failed; the filter error called it a hybrid)."""
    grey = randomize_weights(keras_vit.ViT(None, patch_size=8, input_shape=(16, 16, 1), num_classes=3, **TINY))
    written = vi.write_figures(grey, _images((16, 16, 1)), tmp_path)
    assert "embedding_filters" not in written
    _check_file(written["rollout"], b"PNG")
    with pytest.raises(ValueError, match=r"`titles` must name each of the 3 images. Received: 1 titles"):
        vi.write_figures(grey, _images((16, 16, 1)), tmp_path / "titles", titles=["a"])  # an IndexError before
    with pytest.raises(ValueError, match=r"reads images of 1 channel\(s\), not RGB"):
        vi.embedding_filter_components(grey)


def test_write_figures_hybrid_svg(hybrid, tmp_path):
    written = vi.write_figures(hybrid, _images((32, 32, 3)), tmp_path, image_format="svg")
    assert "embedding_filters" not in written
    for name in ("rollout", "posemb_similarity", "attention_distance"):
        _check_file(written[name], b"<svg")
    # Each plot function alone, to a file of its own.
    figure = vi.plot_filters(np.random.default_rng(0).normal(size=(3, 4, 4, 3)),
                             tmp_path / "filters.png", columns=2)
    assert figure is not None
    _check_file(tmp_path / "filters.png", b"PNG")
    # A path without a figure suffix, or a folder: matplotlib wrote `<path>.png` beside it.
    for path in (tmp_path / "no_suffix", tmp_path):
        with pytest.raises(ValueError, match="must name a file ending in one of"):
            vi.plot_filters(np.random.default_rng(0).normal(size=(3, 4, 4, 3)), path)
    assert not (tmp_path / "no_suffix.png").exists() and not (tmp_path.parent / f"{tmp_path.name}.png").exists()


@pytest.mark.one_backend  # the readers are numpy, PIL and tf.data, whatever the backend
def test_load_image_folder_reads_images_as_the_evaluation_pipeline(tmp_path):
    """The inspection loader gives the model the numbers fine-tuning's
    evaluation gave it: stretched (not cropped) bilinear without antialias,
    RGB from grey, alpha, palette and 16-bit files (which PIL's own RGB
    conversion turns white), float32 pixels (not rounded to uint8)."""
    from PIL import Image

    from keras_vit import data

    folder = tmp_path / "images" / "class"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (30, 50, 4), dtype=np.uint8)
    Image.fromarray(rgba[..., :3]).save(folder / "a_wide.png")
    Image.fromarray(rgba[:, :20, :3]).save(folder / "b_tall.bmp")
    Image.fromarray(rgba, "RGBA").save(folder / "c_alpha.png")
    Image.fromarray(rgba[..., 0], "L").save(folder / "d_grey.png")
    Image.fromarray(rgba[..., :3]).convert("P").save(folder / "e_palette.gif")
    Image.fromarray(rng.integers(0, 65536, (30, 50), dtype=np.uint16)).save(folder / "f_grey16.png")
    Image.fromarray(rgba[..., :3]).save(folder / "g_photo.jpg")
    assert Image.open(folder / "f_grey16.png").mode.startswith("I")
    pixels, names = vi.load_image_folder(folder, 16)
    assert pixels.dtype == np.float32 and pixels.shape == (7, 16, 16, 3)
    batch = next(iter(data.finetune_pipeline(data.from_directory(tmp_path / "images"), training=False,
                                             batch_size=7, image_size=16)))
    expected = np.asarray(batch[0])
    loaded = np.asarray(keras_vit.preprocess_input(pixels))
    assert [name.split("_")[0] for name in names] == list("abcdefg")
    np.testing.assert_allclose(loaded[:6], expected[:6], rtol=0, atol=1e-6)
    # PIL's and TensorFlow's JPEG decoders: about one level of 255 apart.
    assert np.abs(loaded[6] - expected[6]).mean() < 2 / 127.5
    # docs/export.md's server, with the pipeline's own ops: bit for bit.
    import tensorflow as tf

    served = [data.ops.normalize(data.ops.resize(data.ops.decode_image(tf.io.read_file(str(folder / name))), 16))
              for name in names]
    np.testing.assert_array_equal(np.stack(served), expected)
    # An image of exactly the input's size is taken as it is.
    Image.fromarray(rgba[:16, :24, :3]).save(tmp_path / "exact.png")
    np.testing.assert_array_equal(vi.load_image_folder(tmp_path, (16, 24), extensions=".png")[0][0],
                                  rgba[:16, :24, :3])


def test_recipe_writes_figures(plain, tmp_path):
    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, size in (("a.png", (40, 30)), ("b.jpg", (20, 50)), ("c/d.png", (24, 16))):
        (folder / name).parent.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(folder / name)
    # A saved (e.g. fine-tuned) model, as the README demo passes it.
    saved = str(tmp_path / "model.keras")
    plain.save(saved)
    recipe = runpy.run_path(RECIPE, run_name="recipe")
    written = recipe["main"]([f"--model={saved}", f"--images={folder}", f"--run_dir={tmp_path / 'run'}"])
    assert set(written) == {"rollout", "posemb_similarity", "embedding_filters",
                            "attention_distance", "arrays", "summary"}
    _check_file(written["rollout"], b"PNG")
    with np.load(written["arrays"]) as arrays:
        np.testing.assert_allclose(arrays["posemb_similarity"], vi.model_posemb_similarity(plain),
                                   atol=1e-6)
        expected = dict(arrays)
    # The same model taking pixels (`include_preprocessing=True`): the same
    # figures (its images were preprocessed twice before).
    pixels = keras_vit.ViT(None, patch_size=8, input_shape=(16, 24, 3), num_classes=3, include_preprocessing=True,
                           **TINY)
    pixels.set_weights(plain.get_weights())
    assert vi.takes_pixels(pixels) and not vi.takes_pixels(plain)
    pixels.save(str(tmp_path / "pixels.keras"))
    again = recipe["main"]([f"--model={tmp_path / 'pixels.keras'}", f"--images={folder}",
                            f"--run_dir={tmp_path / 'pixels'}"])
    with np.load(again["arrays"]) as arrays:
        assert sorted(arrays) == sorted(expected)
        for key in expected:
            np.testing.assert_allclose(arrays[key], expected[key], rtol=1e-5, atol=1e-5, err_msg=key)
    # A model behind a crop reads images of its input's size (the recipe
    # loaded them at the crop's and failed with a traceback); a grey model
    # and overrides of what the recipe sets are one `error:` line.
    inputs = keras.Input((20, 28, 3))
    cropped = keras_vit.ViT(None, patch_size=8, input_tensor=keras.layers.CenterCrop(16, 24)(inputs), num_classes=3,
                            **TINY)
    cropped.save(str(tmp_path / "cropped.keras"))
    crop_run = recipe["main"]([f"--model={tmp_path / 'cropped.keras'}", f"--images={folder}",
                               f"--run_dir={tmp_path / 'cropped'}"])
    with np.load(crop_run["arrays"]) as arrays:
        assert arrays["rollout_grid_maps"].shape == (3, 2, 3)
    grey = keras_vit.ViT(None, patch_size=8, input_shape=(16, 16, 1), num_classes=3, **TINY)
    grey.save(str(tmp_path / "grey.keras"))
    from recipes.cli import RecipeError

    with pytest.raises(RecipeError, match=r"reads RGB images; --model=.*grey.keras takes 1 channel"):
        recipe["main"]([f"--model={tmp_path / 'grey.keras'}", f"--images={folder}", f"--run_dir={tmp_path / 'g'}"])
    with pytest.raises(RecipeError, match="--model_overrides cannot set include_top, input_shape"):
        recipe["main"](["--smoke", f"--run_dir={tmp_path / 'o'}",
                        '--model_overrides={"input_shape": [16, 16, 1], "include_top": true}'])
    images, names = vi.load_image_folder(folder, (16, 24))
    assert images.shape == (3, 16, 24, 3) and images.dtype == np.float32
    assert names == ["a.png", "b.jpg", os.path.join("c", "d.png")]
    np.testing.assert_array_equal(images[2], np.asarray(Image.open(folder / "c" / "d.png")))
    assert vi.load_image_folder(folder, (16, 24), max_images=1)[0].shape == (1, 16, 24, 3)
    assert vi.load_image_folder(folder, 16, extensions=".png")[0].shape == (2, 16, 16, 3)
    for bad, match in ((dict(max_images=-1), "max_images=-1"), (dict(size=(0, 16)), r"size=\(0, 16\)")):
        with pytest.raises(ValueError, match=match):
            vi.load_image_folder(folder, **{"size": (16, 24), **bad})
    # Without pillow (only the recipes extra brings it): what to install,
    # not a bare "No module named 'PIL'".
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "PIL", None)
        with pytest.raises(ImportError, match="Reading image files needs pillow: `pip install pillow`"):
            vi.load_image_folder(folder, (16, 24))
