"""Weights: the original .npz format, resampling, head rules, bad files,
registered names and downloads (from a local HTTP server)."""

import functools
import http.server
import logging
import pathlib
import threading

import keras
import numpy as np
import pytest
import scipy.ndimage

import keras_vit
from keras_vit.layers.position_embedding import resample_grid, resample_position_embedding
from keras_vit.weights import registry
from keras_vit.weights.npz import GRID_KEY, POSEMB_KEY, checkpoint_variables
from tests.helpers import randomize_weights

GOLDEN = pathlib.Path(__file__).parent / "golden"
TINY = dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, patch_size=8)


def tiny(shape=(32, 32), **kwargs):
    return keras_vit.ViT(None, input_shape=(*shape, 3), **{**TINY, **kwargs})


def weights_of(model):
    return [v.numpy().copy() for v in model.weights]


def export(tmp_path, model, name="ckpt.npz"):
    return str(keras_vit.export_npz(model, tmp_path / name))


# --- Position-embedding resampling -------------------------------------------


@pytest.mark.parametrize("source, target", [((14, 14), (24, 24)), ((7, 7), (3, 5)), ((4, 6), (9, 2))])
def test_linear_resampling_equals_scipy_zoom(source, target):
    grid = np.random.default_rng(0).normal(size=(*source, 5)).astype("float32")
    zoom = (target[0] / source[0], target[1] / source[1], 1)
    expected = scipy.ndimage.zoom(grid, zoom, order=1)
    actual = resample_grid(grid, target, "linear")
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, atol=1e-6)
    np.testing.assert_array_equal(actual[0, 0], grid[0, 0])  # Corners aligned.


def test_bicubic_resampling_equals_torch():
    torch = pytest.importorskip("torch")
    grid = np.random.default_rng(1).normal(size=(6, 6, 4)).astype("float32")
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(grid).permute(2, 0, 1)[None], size=(10, 7), mode="bicubic",
        align_corners=False,
    )[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(resample_grid(grid, (10, 7), "bicubic"), expected, atol=1e-5)


def test_class_token_row_is_kept_apart():
    posemb = np.random.default_rng(2).normal(size=(1, 1 + 16, 3)).astype("float32")
    out = resample_position_embedding(posemb, (8, 8))
    assert out.shape == (1, 65, 3)
    np.testing.assert_array_equal(out[0, 0], posemb[0, 0])
    np.testing.assert_array_equal(
        resample_position_embedding(posemb, (4, 4)), posemb
    )


def test_resampling_errors_name_the_value():
    posemb = np.zeros((1, 1 + 12, 3), "float32")
    with pytest.raises(ValueError, match="num_tokens=12"):
        resample_position_embedding(posemb, (4, 4))
    with pytest.raises(ValueError, match=r"source_grid=\(5, 5\)"):
        resample_position_embedding(posemb, (4, 4), source_grid=(5, 5))
    with pytest.raises(ValueError, match="interpolation='nearest'"):
        resample_grid(np.zeros((2, 2, 1)), (3, 3), "nearest")


# --- The original .npz format ------------------------------------------------


def test_exported_keys_are_the_original_names(tmp_path):
    model = keras_vit.get_model("testing", input_shape=(32, 32, 3))
    arrays = np.load(export(tmp_path, model))
    block = "Transformer/encoderblock_0"
    expected = {
        "cls": (1, 1, 10), "embedding/kernel": (16, 16, 3, 10), "embedding/bias": (10,),
        POSEMB_KEY: (1, 5, 10),
        "Transformer/encoder_norm/scale": (10,), "Transformer/encoder_norm/bias": (10,),
        "head/kernel": (10, 1000), "head/bias": (1000,),
        f"{block}/LayerNorm_0/scale": (10,), f"{block}/LayerNorm_0/bias": (10,),
        f"{block}/LayerNorm_2/scale": (10,), f"{block}/LayerNorm_2/bias": (10,),
        f"{block}/MlpBlock_3/Dense_0/kernel": (10, 10), f"{block}/MlpBlock_3/Dense_0/bias": (10,),
        f"{block}/MlpBlock_3/Dense_1/kernel": (10, 10), f"{block}/MlpBlock_3/Dense_1/bias": (10,),
    }
    for name in ("query", "key", "value"):
        expected[f"{block}/MultiHeadDotProductAttention_1/{name}/kernel"] = (10, 2, 5)
        expected[f"{block}/MultiHeadDotProductAttention_1/{name}/bias"] = (2, 5)
    expected[f"{block}/MultiHeadDotProductAttention_1/out/kernel"] = (2, 5, 10)
    expected[f"{block}/MultiHeadDotProductAttention_1/out/bias"] = (10,)
    assert {k: arrays[k].shape for k in arrays.files} == expected
    assert sum(int(np.prod(s)) for s in expected.values()) == 21_390 - (197 - 5) * 10  # models_test.py count, posemb for 32 px


def test_npz_round_trip(tmp_path):
    model = randomize_weights(tiny(representation_size=8, num_classes=3))
    path = export(tmp_path, model)
    restored = tiny(representation_size=8, num_classes=3)
    notes = keras_vit.load_weights(restored, path)
    assert notes == []
    for a, b in zip(weights_of(model), weights_of(restored)):
        np.testing.assert_array_equal(a, b)


def test_linen_names_and_opt_target_prefix(tmp_path):
    model = randomize_weights(tiny())
    arrays = dict(np.load(export(tmp_path, model)))
    renames = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
               "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}
    linen = {}
    for key, value in arrays.items():
        for old, new in renames.items():
            key = key.replace(old, new)
        linen[f"opt/target/{key}"] = value
    np.savez(tmp_path / "linen.npz", **linen)
    restored = tiny(weights=str(tmp_path / "linen.npz"))
    for a, b in zip(weights_of(model), weights_of(restored)):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_of_another_variant_is_refused_and_model_unchanged(tmp_path):
    path = export(tmp_path, randomize_weights(tiny(hidden_size=24)))
    model = tiny()
    before = weights_of(model)
    with pytest.raises(ValueError) as error:
        keras_vit.load_weights(model, path)
    message = str(error.value)
    assert "model is unchanged" in message and "width 24" in message
    assert "shape mismatch: embedding/kernel is (8, 8, 3, 24)" in message
    assert "Transformer/encoderblock_1/MlpBlock_3/Dense_1/kernel" in message
    for a, b in zip(before, weights_of(model)):
        np.testing.assert_array_equal(a, b)


def test_missing_and_unexpected_keys_are_all_listed(tmp_path):
    arrays = dict(np.load(export(tmp_path, tiny())))
    del arrays["Transformer/encoderblock_1/LayerNorm_0/scale"]
    arrays["Transformer/encoderblock_7/LayerNorm_0/scale"] = np.ones(16, "float32")
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError) as error:
        tiny(weights=str(tmp_path / "bad.npz"))
    message = str(error.value)
    assert "missing from the checkpoint: Transformer/encoderblock_1/LayerNorm_0/scale" in message
    assert "not in the model: Transformer/encoderblock_7/LayerNorm_0/scale" in message
    assert "2 problem(s)" in message


def test_truncated_and_corrupt_files(tmp_path):
    path = export(tmp_path, tiny())
    data = open(path, "rb").read()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.npz").write_bytes(b"not a zip file at all")
    for name in ("truncated.npz", "garbage.npz"):
        with pytest.raises(ValueError, match="truncated, corrupt"):
            tiny(weights=str(tmp_path / name))


def test_pickled_arrays_are_never_loaded(tmp_path):
    np.savez(tmp_path / "pickle.npz", cls=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(ValueError, match="truncated, corrupt"):
        tiny(weights=str(tmp_path / "pickle.npz"))


def test_missing_file_and_unknown_name():
    with pytest.raises(ValueError, match="weights='nope.npz'"):
        tiny(weights="nope.npz")
    with pytest.raises(FileNotFoundError, match="weights='missing.weights.h5'"):
        tiny(weights="missing.weights.h5")


def test_h5_of_another_variant_leaves_the_model_unchanged(tmp_path):
    other = tiny(hidden_size=24)
    other.save_weights(tmp_path / "other.weights.h5")
    model = tiny()
    before = weights_of(model)
    with pytest.raises(ValueError, match="model is unchanged"):
        keras_vit.load_weights(model, str(tmp_path / "other.weights.h5"))
    for a, b in zip(before, weights_of(model)):
        np.testing.assert_array_equal(a, b)


# --- Head, pre_logits and resolution rules -----------------------------------


def test_head_loaded_when_classes_match_else_zeros(tmp_path, caplog):
    source = randomize_weights(tiny(num_classes=5))
    path = export(tmp_path, source)
    same = tiny(num_classes=5, weights=path)
    np.testing.assert_array_equal(same.get_layer("head").kernel.numpy(), source.get_layer("head").kernel.numpy())
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        other = tiny(num_classes=3, weights=path)
    assert "re-initialised (zeros)" in caplog.text
    np.testing.assert_array_equal(other.get_layer("head").kernel.numpy(), 0.0)
    np.testing.assert_array_equal(other.get_layer("head").bias.numpy(), 0.0)
    np.testing.assert_array_equal(
        other.get_layer("encoder_norm").gamma.numpy(), source.get_layer("encoder_norm").gamma.numpy()
    )
    headless = tiny(include_top=False, pooling="token", weights=path)
    assert headless.output.shape == (None, 16)


def test_pre_logits_rules(tmp_path):
    with_rep = export(tmp_path, randomize_weights(tiny(representation_size=16, num_classes=5)), "rep.npz")
    # Dropped when the model has no representation layer (as the original).
    notes = keras_vit.load_weights(tiny(num_classes=7), with_rep)
    assert any("pre_logits/kernel" in n and "dropped" in n for n in notes)
    # Kept fresh when the checkpoint has none.
    without = export(tmp_path, randomize_weights(tiny(num_classes=5)), "norep.npz")
    model = tiny(representation_size=8, num_classes=5)
    fresh = model.get_layer("pre_logits").kernel.numpy().copy()
    notes = keras_vit.load_weights(model, without)
    assert any("pre_logits/kernel" in n and "freshly" in n for n in notes)
    np.testing.assert_array_equal(model.get_layer("pre_logits").kernel.numpy(), fresh)
    # The head (8 -> 5 vs 16 -> 5) does not fit after a representation layer.
    assert any("head/kernel" in n for n in notes)


def test_resolution_change_is_logged_and_resamples(tmp_path, caplog):
    source = randomize_weights(tiny())
    path = export(tmp_path, source)
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        model = tiny(shape=(64, 48), weights=path)
    assert "resampled from a 4x4 to a 8x6 grid (linear)" in caplog.text
    expected = resample_position_embedding(
        source.get_layer("posembed_input").pos_embedding.numpy(), (8, 6)
    )
    np.testing.assert_allclose(model.get_layer("posembed_input").pos_embedding.numpy(), expected)
    bicubic = keras_vit.ViT(
        None, input_shape=(64, 48, 3), weights=path, posemb_interpolation="bicubic", **TINY
    )
    assert not np.allclose(bicubic.get_layer("posembed_input").pos_embedding.numpy(), expected)


def test_non_square_grid_needs_metadata_or_argument(tmp_path):
    source = randomize_weights(tiny(shape=(32, 48)))  # 4x6 grid
    path = export(tmp_path, source)
    assert list(np.load(path)[GRID_KEY]) == [4, 6]
    # Exported metadata: loads at another size.
    model = tiny(shape=(48, 48), weights=path)
    expected = resample_position_embedding(
        source.get_layer("posembed_input").pos_embedding.numpy(), (6, 6), (4, 6)
    )
    np.testing.assert_allclose(model.get_layer("posembed_input").pos_embedding.numpy(), expected)
    # Without metadata: refused unless the grid is given.
    arrays = dict(np.load(path))
    del arrays[GRID_KEY]
    np.savez(tmp_path / "bare.npz", **arrays)
    with pytest.raises(ValueError, match="source_grid"):
        tiny(shape=(48, 48), weights=str(tmp_path / "bare.npz"))
    model = tiny(shape=(48, 48))
    keras_vit.load_weights(model, str(tmp_path / "bare.npz"), source_grid=(4, 6))
    np.testing.assert_allclose(model.get_layer("posembed_input").pos_embedding.numpy(), expected)


def test_gap_checkpoint_resampling_has_no_class_row(tmp_path):
    source = randomize_weights(tiny(classifier="gap"))
    model = tiny(shape=(48, 48), classifier="gap", weights=export(tmp_path, source))
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 36, 16)


def test_checkpoint_variables_cover_every_weight():
    model = tiny(representation_size=8)
    mapped = {id(v) for v in checkpoint_variables(model).values()}
    assert mapped == {id(v) for v in model.weights}


# --- Registered names and downloads ------------------------------------------


def test_registry_resolves_names():
    assert registry.resolve("imagenet21k", "ViT-B_16") == "imagenet21k/ViT-B_16.npz"
    assert registry.resolve("imagenet21k+imagenet2012", "ViT-B_16", 224) == (
        "imagenet21k+imagenet2012/ViT-B_16-224.npz"
    )
    assert registry.resolve("imagenet21k+imagenet2012", "ViT-B_16", 384) == (
        "imagenet21k+imagenet2012/ViT-B_16.npz"
    )
    assert registry.resolve("augreg", "ViT-B_16") == (
        "augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz"
    )
    assert registry.resolve("augreg+imagenet2012", "ViT-S_32").endswith(
        "--imagenet2012-steps_20k-lr_0.01-res_384.npz"
    )
    name = "S_16-i1k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0"
    assert registry.resolve(name, "ViT-S_16") == f"augreg/{name}.npz"
    assert registry.url("imagenet21k+imagenet2012/ViT-B_16.npz").endswith(
        "vit_models/imagenet21k%2Bimagenet2012/ViT-B_16.npz"
    )
    assert "augreg" in registry.available_weights("ViT-Ti_16")


def test_registry_refuses_mismatches_before_download():
    with pytest.raises(ValueError, match="model is ViT-B_16"):
        keras_vit.ViTB16(
            num_layers=1, weights="S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0"
        )
    with pytest.raises(ValueError, match="No 'imagenet21k' checkpoint is published for ViT-Ti_16"):
        keras_vit.ViTTi16(num_layers=1, weights="imagenet21k")
    with pytest.raises(ValueError, match="named variant"):
        tiny(weights="augreg")


@pytest.fixture
def local_bucket(tmp_path, monkeypatch):
    """Serves `tmp_path/bucket` over HTTP on the loopback interface."""
    root = tmp_path / "bucket"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("KERAS_VIT_CACHE_DIR", str(tmp_path / "cache"))
    yield root
    server.shutdown()


def test_registered_name_is_downloaded_cached_and_loaded(local_bucket):
    source = randomize_weights(keras_vit.ViTTi16(num_layers=1))
    upstream, _ = registry.AUGREG_RECOMMENDED["ViT-Ti_16"]
    (local_bucket / "augreg").mkdir()
    keras_vit.export_npz(source, local_bucket / "augreg" / f"{upstream}.npz")
    model = keras_vit.ViTTi16(num_layers=1, weights="augreg")
    for a, b in zip(weights_of(source), weights_of(model)):
        np.testing.assert_array_equal(a, b)
    # Cached: a second load works with the server's file gone.
    (local_bucket / "augreg" / f"{upstream}.npz").unlink()
    keras_vit.ViTTi16(num_layers=1, weights="augreg")


def test_failed_download_is_a_clear_error(local_bucket):
    with pytest.raises(Exception, match="URL fetch failure|404"):
        keras_vit.ViTTi16(num_layers=1, weights="augreg")


# --- Same numbers on every backend -------------------------------------------


def test_golden_logits_from_timm():
    """tests/golden/: random weights for the "testing" config, an input batch
    and timm's logits for them (made by tests/golden/make_golden.py); every
    backend must reproduce them."""
    golden = np.load(GOLDEN / "testing_io.npz")
    model = keras_vit.get_model(
        "testing", input_shape=golden["images"].shape[1:], num_classes=10
    )
    keras_vit.load_weights(model, str(GOLDEN / "testing.npz"))
    logits = keras.ops.convert_to_numpy(model(golden["images"]))
    expected = golden["logits"]
    np.testing.assert_allclose(logits, expected, atol=2e-5 * np.abs(expected).max())
