"""Weights: the original .npz format, resampling, head rules, bad files,
registered names and downloads (from a local HTTP server)."""

import ast
import errno
import hashlib
import http.server
import io
import logging
import os
import pathlib
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import zipfile

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

import h5py
import keras
import numpy as np
import pytest
import scipy.ndimage

import keras_vit
from keras_vit.layers.patch_embedding import resize_patch_embedding
from keras_vit.layers.position_embedding import resample_grid, resample_position_embedding
from keras_vit.weights import cache, read_npz, registry
from keras_vit.weights.h5 import _datasets as _h5_datasets
from keras_vit.weights.npz import GRID_KEY, POSEMB_KEY, checkpoint_variables, prepare_npz
from tests.helpers import ROOT, assert_close_rel, randomize_weights

GOLDEN = pathlib.Path(__file__).parent / "golden"
TINY = dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, patch_size=8)


def tiny(shape=(32, 32), **kwargs):
    return keras_vit.ViT(None, input_shape=(*shape, 3), **{**TINY, **kwargs})


def weights_of(model):
    return [v.numpy().copy() for v in model.weights]


def assert_unchanged(model, before):
    """The all-or-nothing rule: a refused file left every weight as it was."""
    for a, b in zip(before, weights_of(model)):
        np.testing.assert_array_equal(a, b)


def export(tmp_path, model, name="ckpt.npz"):
    return str(keras_vit.export_npz(model, tmp_path / name))


# --- Patch size (FlexiViT PI-resize, issue 25) ---------------------------------


@pytest.mark.parametrize("patch", [8, 32])
def test_a_patch_16_checkpoint_serves_patch_8_and_32(tmp_path, patch, caplog):
    """The kernel PI-resized (16 -> 8 up, 16 -> 32 down), the position
    embeddings resampled to the new grid, the rest as stored; the notes say
    what was resized."""
    from keras_vit.layers.patch_embedding import resize_patch_embedding
    from keras_vit.layers.position_embedding import resample_position_embedding

    source = randomize_weights(tiny((64, 64), patch_size=16, num_classes=5))
    path = export(tmp_path, source)
    with caplog.at_level("INFO", logger="keras_vit"):
        model = tiny((64, 64), patch_size=patch, num_classes=5, weights=path)
    assert f"PI-resized from 16x16 to {patch}x{patch}" in caplog.text
    kernel = source.get_layer("embedding").kernel.numpy()
    np.testing.assert_allclose(model.get_layer("embedding").kernel.numpy(),
                               resize_patch_embedding(kernel, (patch, patch)), rtol=1e-6, atol=1e-6)
    grid = 64 // patch
    np.testing.assert_allclose(
        model.get_layer("posembed_input").pos_embedding.numpy(),
        resample_position_embedding(source.get_layer("posembed_input").pos_embedding.numpy(), (grid, grid)),
        rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(model.get_layer("head").kernel.numpy(), source.get_layer("head").kernel.numpy())
    assert np.all(np.isfinite(model.predict(np.zeros((1, 64, 64, 3), "float32"), verbose=0)))


def test_a_hybrid_patch_size_does_not_change(tmp_path):
    hybrid = dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, resnet=(), resnet_width_factor=0.5,
                  input_shape=(64, 64, 3), num_classes=3)
    path = export(tmp_path, keras_vit.ViT(None, patch_size=2, **hybrid))
    model = keras_vit.ViT(None, patch_size=4, **hybrid)
    before = weights_of(model)
    with pytest.raises(ValueError, match="hybrid's patch size"):
        keras_vit.load_weights(model, path)
    assert_unchanged(model, before)


# --- Position-embedding resampling -------------------------------------------


@pytest.mark.one_backend
@pytest.mark.parametrize("source, target", [((14, 14), (24, 24)), ((7, 7), (3, 5)), ((4, 6), (9, 2))])
def test_linear_resampling_equals_scipy_zoom(source, target):
    grid = np.random.default_rng(0).normal(size=(*source, 5)).astype("float32")
    zoom = (target[0] / source[0], target[1] / source[1], 1)
    expected = scipy.ndimage.zoom(grid, zoom, order=1)
    actual = resample_grid(grid, target, "linear")
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, atol=1e-6)
    np.testing.assert_array_equal(actual[0, 0], grid[0, 0])  # Corners aligned.


@pytest.mark.one_backend
def test_bicubic_resampling_equals_torch():
    torch = pytest.importorskip("torch")
    grid = np.random.default_rng(1).normal(size=(6, 6, 4)).astype("float32")
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(grid).permute(2, 0, 1)[None], size=(10, 7), mode="bicubic",
        align_corners=False,
    )[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(resample_grid(grid, (10, 7), "bicubic"), expected, atol=1e-5)


@pytest.mark.one_backend
def test_class_token_row_is_kept_apart():
    posemb = np.random.default_rng(2).normal(size=(1, 1 + 16, 3)).astype("float32")
    out = resample_position_embedding(posemb, (8, 8))
    assert out.shape == (1, 65, 3)
    np.testing.assert_array_equal(out[0, 0], posemb[0, 0])
    np.testing.assert_array_equal(
        resample_position_embedding(posemb, (4, 4)), posemb
    )


@pytest.mark.one_backend
def test_resampling_errors_name_the_value():
    posemb = np.zeros((1, 1 + 12, 3), "float32")
    with pytest.raises(ValueError, match="num_tokens=12"):
        resample_position_embedding(posemb, (4, 4))
    with pytest.raises(ValueError, match=r"source_grid=\(5, 5\)"):
        resample_position_embedding(posemb, (4, 4), source_grid=(5, 5))
    with pytest.raises(ValueError, match="interpolation='nearest'"):
        resample_grid(np.zeros((2, 2, 1)), (3, 3), "nearest")
    # A side of 0 returned an empty grid, and 2.5 a grid of 3 rows.
    for new_shape in [(0, 3), (2.5, 3)]:
        with pytest.raises(ValueError, match=rf"new_shape={re.escape(repr(new_shape))}"):
            resample_grid(np.zeros((2, 2, 1)), new_shape)
    with pytest.raises(ValueError, match=r"Received: grid of shape \(4, 1\)"):
        resample_grid(np.zeros((4, 1)), (3, 3))
    # -1 took the last grid row as a prefix: a (1, 32, D) result.
    with pytest.raises(ValueError, match="num_prefix_tokens=-1"):
        resample_position_embedding(np.zeros((1, 17, 3)), (4, 4), num_prefix_tokens=-1)
    with pytest.raises(ValueError, match=r"Received: posemb of shape \(17, 3\)"):
        resample_position_embedding(np.zeros((17, 3)), (4, 4))


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


@pytest.mark.parametrize("kind", ["npz", "keras_weights"])
def test_a_ctrl_c_while_weights_are_assigned_loads_all_of_them(kind, tmp_path, monkeypatch):
    """A real SIGINT (a notebook's interrupt) between two variables' writes
    left the model part old, part new (5 of 30 interrupted loads of
    ViT-S/16 on JAX)."""
    model = randomize_weights(tiny(num_classes=3))
    if kind == "npz":
        path = export(tmp_path, model)
    else:
        path = str(tmp_path / "model.weights.h5")
        model.save_weights(path)
    restored = tiny(num_classes=3)
    variable_type = type(restored.weights[0])
    assign, calls = variable_type.assign, []

    def interrupted(variable, value):
        calls.append(variable.path)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGINT)
        return assign(variable, value)

    monkeypatch.setattr(variable_type, "assign", interrupted)
    with pytest.raises(KeyboardInterrupt):
        keras_vit.load_weights(restored, path)
    monkeypatch.undo()
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
    assert_unchanged(model, before)


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


def test_encrypted_member_is_named(tmp_path):
    # Issue 21: zipfile's "password required" RuntimeError was a traceback.
    data = bytearray(open(export(tmp_path, tiny()), "rb").read())
    central = data.index(b"PK\x01\x02")  # the first member's central directory record
    data[central + 8] |= 0x1  # general purpose flags: encrypted
    (tmp_path / "encrypted.npz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="is encrypted \\(a password-protected archive\\)"):
        tiny(weights=str(tmp_path / "encrypted.npz"))


def test_pickled_arrays_are_never_loaded(tmp_path):
    np.savez(tmp_path / "pickle.npz", cls=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(ValueError, match="'cls' holds Python objects"):
        tiny(weights=str(tmp_path / "pickle.npz"))


def test_missing_file_and_unknown_name(tmp_path, monkeypatch):
    for missing in ("nope.npz", "missing.weights.h5", "checkpoints/nope", "nope.safetensors"):
        with pytest.raises(FileNotFoundError, match=missing):
            tiny(weights=missing)
    with pytest.raises(ValueError, match="neither an existing file nor a registered name.*weights='imagenet22k'"):
        tiny(weights="imagenet22k")
    # The same checks without a model, for scripts that check before reading data.
    for missing in ("nope.npz", "model.h5", "checkpoints/nope", "nope.safetensors"):
        with pytest.raises(FileNotFoundError, match=missing):
            keras_vit.weights.check_source(missing)
    with pytest.raises(ValueError, match="No 'imagenet21k' checkpoint is published for ViT-Ti_16"):
        keras_vit.weights.check_source("imagenet21k", "Ti/16")
    with pytest.raises(ValueError, match="need a named variant"):
        keras_vit.weights.check_source("augreg")
    assert keras_vit.weights.check_source("augreg", "B/16") == "augreg"
    # An empty directory was blamed on the model's options ("this model uses gelu='exact'").
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"`weights` is a directory without a timm checkpoint .*Received: weights="):
        tiny(gelu="exact", weights=str(tmp_path / "empty"))
    assert keras_vit.weights.check_source("hf-hub:timm/vit_tiny_patch16_224") == "hf-hub:timm/vit_tiny_patch16_224"
    # `~` is the user's home, as in a shell.
    monkeypatch.setenv("HOME", str(tmp_path))
    keras_vit.export_npz(randomize_weights(tiny()), tmp_path / "home.npz")
    tiny(weights="~/home.npz")
    assert keras_vit.weights.check_source("~/home.npz") == str(tmp_path / "home.npz")
    # A directory of timm's pickled weights is named as such.
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="only PyTorch pickle weights"):
        tiny(weights=str(tmp_path / "pickled"))


def test_h5_of_another_variant_leaves_the_model_unchanged(tmp_path):
    other = tiny(hidden_size=24)
    other.save_weights(tmp_path / "other.weights.h5")
    model = tiny()
    before = weights_of(model)
    with pytest.raises(ValueError, match="model is unchanged"):
        keras_vit.load_weights(model, str(tmp_path / "other.weights.h5"))
    assert_unchanged(model, before)


@pytest.mark.parametrize("bad", [
    np.full((16, 1000), "x"), np.ones((16, 1000), "int32"), np.ones((16, 1000), bool),
    np.ones((16, 1000), "complex64"), np.zeros((16, 1000), "datetime64[s]"),
    np.zeros((16, 1000), "V2"),  # bfloat16 as np.savez writes it: its type is not recorded
])
def test_non_float_arrays_are_refused_before_any_assignment(tmp_path, bad):
    arrays = dict(np.load(export(tmp_path, randomize_weights(tiny()))))
    arrays["head/kernel"] = bad  # Sorted last: the others would load first.
    np.savez(tmp_path / "bad.npz", **arrays)
    model = tiny()
    before = weights_of(model)
    with pytest.raises(ValueError, match=re.escape(f"head/kernel has dtype {bad.dtype}") + ".*; a floating") as info:
        keras_vit.load_weights(model, str(tmp_path / "bad.npz"))
    assert ("how np.savez stores bfloat16" in str(info.value)) == (bad.dtype == "V2")
    assert_unchanged(model, before)


def test_float16_and_float64_arrays_load(tmp_path):
    source = randomize_weights(tiny())
    arrays = dict(np.load(export(tmp_path, source)))
    arrays = {k: v.astype("float64" if i % 2 else "float16") for i, (k, v) in enumerate(arrays.items())}
    np.savez(tmp_path / "mixed.npz", **arrays)
    model = tiny(weights=str(tmp_path / "mixed.npz"))
    for a, b in zip(weights_of(source), weights_of(model)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("value", [np.nan, np.inf, 1e39])
def test_non_finite_values_are_refused_unless_allowed(tmp_path, value):
    # 1e39: finite in a float64 file, infinite as the float32 weight it
    # becomes (issue 21: it loaded as inf).
    arrays = dict(np.load(export(tmp_path, randomize_weights(tiny()))))
    key = "Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"
    arrays[key] = arrays[key].astype("float64")
    arrays[key][3, 4] = value
    np.savez(tmp_path / "nan.npz", **arrays)
    model = tiny()
    before = weights_of(model)
    with pytest.raises(ValueError, match="Dense_0/kernel holds 1 NaN or infinite value"):
        keras_vit.load_weights(model, str(tmp_path / "nan.npz"))
    assert_unchanged(model, before)
    # "no" counted as True and loaded the NaN; a model of None was an AttributeError.
    with pytest.raises(ValueError, match="`allow_nonfinite` must be a bool. Received: allow_nonfinite='no'"):
        keras_vit.load_weights(model, str(tmp_path / "nan.npz"), allow_nonfinite="no")
    with pytest.raises(ValueError, match="`model` must be a keras_vit model. Received: model=None"):
        keras_vit.load_weights(None, str(tmp_path / "nan.npz"))
    # Ignored where nothing was resampled, and listed as a problem of the file where something was.
    for other in (model, tiny(shape=(48, 48))):
        with pytest.raises(ValueError, match=r"^`interpolation` must be one of .*Received: interpolation='bogus'$"):
            keras_vit.load_weights(other, str(tmp_path / "nan.npz"), interpolation="bogus")
    assert_unchanged(model, before)
    keras_vit.load_weights(model, str(tmp_path / "nan.npz"), allow_nonfinite=True)
    kernel = keras.ops.convert_to_numpy(model.get_layer("encoderblock_1").mlp.dense_0.kernel)
    np.testing.assert_array_equal(kernel[3, 4], np.float32(value) if np.isfinite(value) else value)


@pytest.mark.parametrize("builder", ["ViT", "ViTTi16", "get_model"])
def test_builders_pass_allow_nonfinite_to_the_loader(tmp_path, builder):
    arrays = dict(np.load(export(tmp_path, randomize_weights(tiny()))))
    arrays["Transformer/encoderblock_0/MlpBlock_3/Dense_1/bias"][5] = np.nan
    path = str(tmp_path / "nan.npz")
    np.savez(path, **arrays)
    build = {
        "ViT": lambda **kw: keras_vit.ViT(None, **kw),
        "ViTTi16": keras_vit.ViTTi16,
        "get_model": lambda **kw: keras_vit.get_model("ViT-Ti_16", **kw),
    }[builder]
    keywords = dict(input_shape=(32, 32, 3), weights=path, **TINY)
    with pytest.raises(ValueError, match="Dense_1/bias holds 1 NaN"):
        build(**keywords)
    with pytest.raises(ValueError, match="allow_nonfinite=1"):
        build(allow_nonfinite=1, **keywords)
    model = build(allow_nonfinite=True, **keywords)
    bias = model.get_layer("encoderblock_0").mlp.dense_1.bias.numpy()
    assert np.isnan(bias[5]) and np.isfinite(np.delete(bias, 5)).all()
    np.testing.assert_array_equal(
        np.delete(bias, 5), np.delete(arrays["Transformer/encoderblock_0/MlpBlock_3/Dense_1/bias"], 5)
    )


def test_weights_h5_of_a_deeper_model_is_refused_listing_the_extra_weights(tmp_path):
    deeper = randomize_weights(tiny(num_layers=2))
    deeper.save_weights(tmp_path / "deep.weights.h5")
    model = tiny(num_layers=1)
    before = weights_of(model)
    with pytest.raises(ValueError) as error:
        keras_vit.load_weights(model, str(tmp_path / "deep.weights.h5"))
    message = str(error.value)
    assert "model is unchanged" in message and "16 problem(s)" in message
    assert "not in the model: layers/transformer_encoder_block_1/mlp/dense_0/vars/0 (16, 32)" in message
    assert_unchanged(model, before)


def test_weights_h5_saved_after_fit_loads_into_a_fresh_model(tmp_path):
    """A model saved after `fit` carries its optimizer's state in the file
    (`optimizer/vars/...`), which was counted as weights the model lacks (26
    "not in the model"): docs/export.md's `save_weights`, then
    `ViT(weights=...)`, failed. The weights load, and a compiled model gets
    the optimizer's state too, as from Keras' `load_weights`."""
    x = np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    y = np.arange(4)

    def fitted(model):
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
        return model

    model = fitted(tiny())
    path = str(tmp_path / "fitted.weights.h5")
    model.save_weights(path)
    with h5py.File(path, "r") as f:
        assert any(name.startswith("optimizer/") for name in _h5_datasets(f))
    loaded = tiny()
    keras_vit.load_weights(loaded, path)
    for fresh in (tiny(weights=path), loaded):
        for a, b in zip(weights_of(model), weights_of(fresh)):
            np.testing.assert_array_equal(a, b)
    again = fitted(tiny())
    keras_vit.load_weights(again, path)
    for a, b in zip(model.optimizer.variables, again.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=a.path)


def test_weights_h5_non_finite_values_are_refused(tmp_path):
    source = tiny()
    source.get_layer("encoder_norm").gamma.assign(np.full(16, np.nan, "float32"))
    source.save_weights(tmp_path / "nan.weights.h5")
    with pytest.raises(ValueError, match="vars/0 holds NaN or infinite values"):
        keras_vit.load_weights(tiny(), str(tmp_path / "nan.weights.h5"))
    # A float64 dataset beyond float32's range: infinite once loaded
    # (issue 21: it loaded as inf).
    tiny().save_weights(tmp_path / "big.weights.h5")
    with h5py.File(tmp_path / "big.weights.h5", "r+") as f:
        name = next(n for n in _h5_datasets(f) if n.endswith("vars/0"))
        values = f[name][()].astype("float64")
        values.flat[0] = 1e39
        del f[name]
        f[name] = values
    with pytest.raises(ValueError, match="holds NaN or infinite values"):
        keras_vit.load_weights(tiny(), str(tmp_path / "big.weights.h5"))


def test_npy_renamed_to_npz_is_named(tmp_path):
    np.save(tmp_path / "array.npy", np.zeros(3, "float32"))
    os.replace(tmp_path / "array.npy", tmp_path / "array.npz")
    with pytest.raises(ValueError, match=r"array.npz'.*single `\.npy` array"):
        tiny(weights=str(tmp_path / "array.npz"))


def test_files_of_other_kinds_are_named(tmp_path):
    """Weights saved by Keras under another name, a whole `.keras` model, a
    LoRA file, and a bit flipped in an array's data: each named for what it
    is (they were "truncated, corrupt", "member 'metadata.json' is not an
    `.npy` array", 55 missing variables, and a "corrupt header")."""
    model = randomize_weights(tiny())
    model.save_weights(str(tmp_path / "model.weights.h5"))
    shutil.copy(tmp_path / "model.weights.h5", tmp_path / "model.h5")
    model.save(str(tmp_path / "model.keras"))
    adapted = tiny()
    keras_vit.enable_lora(adapted, 2)
    keras_vit.save_lora(adapted, str(tmp_path / "lora.npz"))
    path = export(tmp_path, model)
    with zipfile.ZipFile(path) as archive:
        member = archive.getinfo("head/kernel.npy")
    data = bytearray(pathlib.Path(path).read_bytes())
    # The member's last byte (stored): past the local header, its name and extra field.
    name_length, extra_length = struct.unpack("<HH", data[member.header_offset + 26:member.header_offset + 30])
    data[member.header_offset + 30 + name_length + extra_length + member.compress_size - 1] ^= 1
    pathlib.Path(tmp_path / "flipped.npz").write_bytes(bytes(data))
    before = weights_of(model)
    for name, match in (("model.h5", r"an HDF5 file.*`\*\.weights\.h5` \(rename it\)"),
                        ("model.keras", r"a `\.keras` model.*keras\.saving\.load_model"),
                        ("lora.npz", r"LoRA adapters.*keras_vit\.load_lora"),
                        ("flipped.npz", r"'head/kernel' is truncated or corrupt")):
        with pytest.raises(ValueError, match=match):
            keras_vit.load_weights(model, str(tmp_path / name))
    assert_unchanged(model, before)


def npz_member(name, header_shape, data, dtype="<f4"):
    """A raw `.npy` member whose header claims `header_shape`, holding `data`."""
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        stream, {"descr": dtype, "fortran_order": False, "shape": header_shape}
    )
    return f"{name}.npy", stream.getvalue() + data


def test_member_claiming_a_huge_shape_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(*npz_member("cls", (10**12,), b"\0" * 64))  # 4 TB claimed.
    with pytest.raises(ValueError, match=r"'cls' declares shape \(1000000000000,\)"):
        read_npz(str(path))
    with pytest.raises(ValueError, match="huge.npz"):
        tiny(weights=str(path))


def test_unused_keys_are_never_decompressed(tmp_path):
    path = export(tmp_path, randomize_weights(tiny()))
    # A member that decompresses to 64 MiB from 64 KB, its stream corrupted
    # after the header: reading it would fail (and cost the memory).
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(*npz_member("bomb", (2**24,), bytes(2**26)))
    data = bytearray(pathlib.Path(path).read_bytes())
    start = data.index(b"bomb.npy") + len("bomb.npy") + 20_000
    data[start : start + 1000] = os.urandom(1000)
    pathlib.Path(path).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"not in the model: bomb \(16777216,\)"):
        tiny(weights=path)


@pytest.mark.parametrize("grid", [np.array(4), np.array("4x6"), np.array([4.0, 6.0]), np.array([4, 0])])
def test_invalid_posemb_grid_metadata_is_named(tmp_path, grid):
    arrays = dict(np.load(export(tmp_path, tiny(shape=(32, 48)))))
    arrays[GRID_KEY] = grid
    np.savez(tmp_path / "grid.npz", **arrays)
    with pytest.raises(ValueError, match="invalid `keras_vit/posemb_grid` metadata"):
        tiny(shape=(48, 48), weights=str(tmp_path / "grid.npz"))


def test_unreadable_file_is_a_permission_error(tmp_path, monkeypatch):
    path = export(tmp_path, tiny())
    os.chmod(path, 0)
    if os.access(path, os.R_OK):  # root reads anything: make the open fail.
        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied", path)

        monkeypatch.setattr(zipfile, "ZipFile", refuse)
    with pytest.raises(PermissionError, match="cannot be read: permission denied") as error:
        tiny(weights=path)
    assert "corrupt" not in str(error.value)


KILLED_EXPORT = """
import os, signal, sys
import numpy as np
import keras_vit

def savez_then_die(file, **arrays):
    file.write(b"partial" * 1000)
    file.flush()
    os.kill(os.getpid(), signal.SIGKILL)

np.savez = savez_then_die
model = keras_vit.ViT(None, input_shape=(32, 32, 3), hidden_size=16, mlp_dim=32,
                      num_heads=2, num_layers=2, patch_size=8)
keras_vit.export_npz(model, sys.argv[1])
"""


@pytest.mark.one_backend
@pytest.mark.skipif(os.name != "posix", reason="SIGKILL and file locks")
def test_export_cleans_temporaries_of_a_killed_export(tmp_path):
    path = tmp_path / "model.npz"
    # File handling does not depend on the backend: the lightest to import.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERAS_BACKEND": "numpy"}
    killed = subprocess.run([sys.executable, "-c", KILLED_EXPORT, str(path)], env=env)
    assert killed.returncode == -signal.SIGKILL
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == 1 and not path.exists()  # The killed export's temporary.
    # A temporary that a live export holds locked is left alone.
    busy = tmp_path / ".model.npz.tmp-busy.keras_vit-partial"
    busy.write_bytes(b"writing")
    # Files of the user's that share the prefix are not temporaries.
    (tmp_path / ".model.npz.tmp-notes").write_text("mine")
    (tmp_path / ".model.npz.tmp-dir.keras_vit-partial").mkdir()
    with open(busy, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        export(tmp_path, randomize_weights(tiny()), "model.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        busy.name, ".model.npz.tmp-dir.keras_vit-partial", ".model.npz.tmp-notes", "model.npz"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes and symbolic links")
def test_export_keeps_the_mode_and_writes_through_a_symbolic_link(tmp_path):
    target = tmp_path / "store" / "model.npz"
    target.parent.mkdir()
    target.write_bytes(b"old")
    target.chmod(0o600)
    link = tmp_path / "latest.npz"
    link.symlink_to(target)
    model = randomize_weights(tiny())
    assert keras_vit.export_npz(model, link) == str(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    restored = tiny(weights=str(link))
    for a, b in zip(weights_of(model), weights_of(restored)):
        np.testing.assert_array_equal(a, b)
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.npz"]


@pytest.mark.one_backend
@pytest.mark.skipif(os.name != "posix", reason="FIFOs and symbolic links")
def test_export_writes_only_regular_files(tmp_path):
    # Issue 21: a FIFO, or a link to one, was replaced by a regular file (as
    # root, `export_npz(m, "/dev/null")` would replace /dev/null); "" named
    # the working directory.
    model = tiny()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link.npz"
    link.symlink_to(fifo)
    fifo_kind = r"not a regular file \(a FIFO, device or socket\)"
    cases = [(fifo, fifo_kind), (link, fifo_kind), (tmp_path, "is a directory")]
    for path, what in cases:
        with pytest.raises(ValueError, match=rf"{what}; nothing was written. Received: path="):
            keras_vit.export_npz(model, path)
    with pytest.raises(ValueError, match=r"Received: path=''"):
        keras_vit.export_npz(model, "")
    assert stat.S_ISFIFO(fifo.stat().st_mode) and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.npz"]


@pytest.mark.one_backend
def test_export_paths_that_name_a_folder_or_fail_say_so(tmp_path, monkeypatch):
    """A trailing separator wrote a file named like the folder, which the
    same path could not read back; a failed write (a full disk, a file where
    a folder should be) raised the system's bare error, naming no argument."""
    model = randomize_weights(tiny())
    adapted = keras_vit.enable_lora(tiny(), rank=2)
    for save, argument in ((keras_vit.export_npz, model), (keras_vit.save_lora, adapted)):
        for suffix in (os.sep, f"{os.sep}."):
            with pytest.raises(ValueError, match=r"ends with a separator \(or '\.'\), so it names a folder, not a file; "
                                                 rf"nothing was written. Received: path='.*/out{re.escape(suffix)}'"):
                save(argument, f"{tmp_path / 'out'}{suffix}")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "afile").write_bytes(b"")
    with pytest.raises(FileExistsError, match=r"writing path='.*afile/model.npz' failed; an existing file there is "
                                              r"unchanged"):
        keras_vit.export_npz(model, tmp_path / "afile" / "model.npz")
    kept = keras_vit.export_npz(model, tmp_path / "model.npz")
    before = (tmp_path / "model.npz").read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    with pytest.raises(OSError, match=rf"No space left on device: writing path='{kept}' failed; an existing file "
                                      r"there is unchanged") as error:
        keras_vit.export_npz(randomize_weights(tiny()), kept)
    assert error.value.errno == errno.ENOSPC
    assert (tmp_path / "model.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "model.npz"]


# --- Head, pre_logits and resolution rules -----------------------------------


def test_head_loaded_when_classes_match_else_zeros(tmp_path, caplog):
    source = randomize_weights(tiny(num_classes=5))
    path = export(tmp_path, source)
    same = tiny(num_classes=5, weights=path)
    np.testing.assert_array_equal(same.get_layer("head").kernel.numpy(), source.get_layer("head").kernel.numpy())
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        other = tiny(num_classes=3, weights=path)
    assert "re-initialised for fine-tuning (zeros; the bias head_bias_init)" in caplog.text
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
    # The head (8 -> 5 vs 16 -> 5) does not fit after a representation layer:
    # re-initialised whole, its bias too (the bias alone was loaded before).
    assert any("head/kernel" in n for n in notes) and any("head/bias" in n and "re-initialised" in n for n in notes)
    np.testing.assert_array_equal(model.get_layer("head").bias.numpy(), 0.0)


def test_head_of_pre_logits_on_one_side_is_not_loaded_even_where_shapes_agree(tmp_path):
    """Every imagenet21k file has pre_logits as wide as the model: its head
    (trained on tanh(pre_logits(x))) loaded onto raw features, and a model's
    head after a fresh pre_logits loaded a head trained without; logits off
    by 1.7 and no word."""
    with_rep = export(tmp_path, randomize_weights(tiny(representation_size=16, num_classes=5)), "rep.npz")
    without = export(tmp_path, randomize_weights(tiny(num_classes=5)), "norep.npz")
    for model, path, why in ((tiny(num_classes=5, head_bias_init=-2.0), with_rep, "which the model lacks"),
                             (tiny(representation_size=16, num_classes=5, head_bias_init=-2.0), without,
                              "reads a pre_logits layer the checkpoint lacks")):
        notes = keras_vit.load_weights(model, path)
        for key in ("head/kernel", "head/bias"):
            assert any(n.startswith(f"`{key}` is re-initialised for fine-tuning") and why in n for n in notes), notes
        np.testing.assert_array_equal(model.get_layer("head").kernel.numpy(), 0.0)
        np.testing.assert_array_equal(model.get_layer("head").bias.numpy(), -2.0)
    # Both sides alike: the head loads.
    source = randomize_weights(tiny(representation_size=16, num_classes=5))
    model = tiny(representation_size=16, num_classes=5, weights=export(tmp_path, source, "rep2.npz"))
    np.testing.assert_array_equal(model.get_layer("head").kernel.numpy(), source.get_layer("head").kernel.numpy())


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


def test_an_embedding_of_the_models_shape_without_metadata_is_kept(tmp_path):
    """A file without grid metadata whose embedding has the model's shape
    is the model's grid (the original's rule: resample when the shape
    differs); its square token count was taken for an 8x8 grid and
    resampled to the model's 4x16 (errors up to 1.1). With the grid given,
    it is resampled from that grid."""
    source = randomize_weights(tiny(shape=(32, 128)))  # 4x16 grid: 64 tokens
    arrays = dict(np.load(export(tmp_path, source)))
    del arrays[GRID_KEY]
    np.savez(tmp_path / "bare.npz", **arrays)
    stored = source.get_layer("posembed_input").pos_embedding.numpy()
    model = tiny(shape=(32, 128))
    assert keras_vit.load_weights(model, str(tmp_path / "bare.npz")) == [
        "position embeddings: the file records no grid; its 64 grid rows are taken as the model's 4x16 (pass "
        "source_grid=(rows, cols) if they were another grid)."]
    np.testing.assert_array_equal(model.get_layer("posembed_input").pos_embedding.numpy(), stored)
    keras_vit.load_weights(model, str(tmp_path / "bare.npz"), source_grid=(8, 8))
    np.testing.assert_allclose(model.get_layer("posembed_input").pos_embedding.numpy(),
                               resample_position_embedding(stored, (4, 16), (8, 8)), rtol=1e-6)


def test_resampling_arguments_are_checked():
    posemb = np.zeros((1, 17, 4), "float32")
    for grid in ((0, 4), (-2, 4), (2.5, 4), (2, 2, 2)):
        with pytest.raises(ValueError, match=r"`target_grid` must be a positive int or a tuple of 2"):
            resample_position_embedding(posemb, grid)
    assert resample_position_embedding(posemb, 3).shape == (1, 10, 4)  # an int is a square grid
    assert resize_patch_embedding(np.ones((4, 4, 3, 2), "float32"), 8).shape == (8, 8, 3, 2)


def test_gap_checkpoint_resampling_has_no_class_row(tmp_path):
    source = randomize_weights(tiny(classifier="gap"))
    model = tiny(shape=(48, 48), classifier="gap", weights=export(tmp_path, source))
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 36, 16)


def test_checkpoint_variables_cover_every_weight():
    model = tiny(representation_size=8)
    mapped = {id(v) for v in checkpoint_variables(model).values()}
    assert mapped == {id(v) for v in model.weights}


# --- Registered names and downloads ------------------------------------------


@pytest.mark.one_backend
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
    assert "augreg" in registry.registered_names("ViT-Ti_16")


def _keras_vit_imports(path):
    """The `keras_vit` modules a source file imports (absolute imports only)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            found.add(node.module)
            # `from keras_vit import models` names a module too.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "keras_vit" or name.startswith("keras_vit.")}


@pytest.mark.one_backend
def test_weights_never_import_models_even_indirectly():
    # models/ import weights/ (a builder loads its checkpoint); the reverse
    # would be a cycle (issue 16). Followed through every keras_vit module that
    # weights/ imports, such as the shared anatomy and variant table.
    package = pathlib.Path(keras_vit.__file__).parent
    to_visit = [f"keras_vit.weights.{p.stem}" for p in (package / "weights").glob("*.py")]
    seen, importers = set(), {}
    while to_visit:
        module = to_visit.pop()
        # The package root runs before any submodule; what it imports is not
        # weights/'s doing.
        if module in seen or module == "keras_vit":
            continue
        seen.add(module)
        relative = pathlib.Path(*module.split(".")[1:])
        for path in (package / relative.with_suffix(".py"), package / relative / "__init__.py"):
            if path.is_file():
                for name in _keras_vit_imports(path):
                    importers.setdefault(name, module)
                    to_visit.append(name)
    assert "keras_vit.weights.npz" in seen and "keras_vit.anatomy" in seen
    offending = sorted(
        f"{importers[m]} imports {m}" for m in seen if m.startswith("keras_vit.models")
    )
    assert not offending, offending


def test_registry_refuses_mismatches_before_download():
    with pytest.raises(ValueError, match="model is ViT-B_16"):
        keras_vit.ViTB16(
            num_layers=1, weights="S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0"
        )
    with pytest.raises(ValueError, match="No 'imagenet21k' checkpoint is published for ViT-Ti_16"):
        keras_vit.ViTTi16(num_layers=1, weights="imagenet21k")
    with pytest.raises(ValueError, match="named variant"):
        tiny(weights="augreg")


def test_load_weights_takes_every_alias_of_the_variant(bucket, tmp_path):
    """`variant="Ti/16"` (what `available_weights` accepts) was "not
    published"; a variant of another model says `variant` is at fault."""
    upstream, _ = registry.AUGREG_RECOMMENDED["ViT-Ti_16"]
    bucket.files[f"augreg/{upstream}.npz"] = npz_bytes(tmp_path, keras_vit.ViTTi16(input_shape=(32, 32, 3)))
    model = keras_vit.ViTTi16(input_shape=(32, 32, 3))
    (tmp_path / "augreg").mkdir()  # a folder of the name, here: not what the name means
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        for alias in ("Ti/16", "Ti_16", "ViT-Ti_16", "ViTTi16"):
            keras_vit.load_weights(model, "augreg", variant=alias)
    with pytest.raises(ValueError, match=r"Unknown ViT variant. Did you mean 'ViT-Ti_16'\?.*"
                                         r"Received: variant='vit-ti_16'"):
        keras_vit.load_weights(model, "augreg", variant="vit-ti_16")
    with pytest.raises(ValueError, match=r"`variant` must name this model's architecture. Received: "
                                         r"weights='augreg', variant='ViT-S_16'"):
        keras_vit.load_weights(model, "augreg", variant="S/16")
    assert len(bucket.requests) == 1


class Bucket:
    """Files served over HTTP on the loopback interface, with a server's
    faults: a connection closed early without `Content-Length` (half-way, or
    at a line boundary, with or without the length on HEAD), an HTML error
    page with status 200, a slow transfer. Records every GET request."""

    def __init__(self):
        self.files, self.faults, self.requests = {}, {}, []
        self.chunk_delay = 0.0

    def handler(self):
        bucket = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = urllib.parse.unquote(self.path.lstrip("/"))
                bucket.requests.append(path)
                data, fault = bucket.files.get(path), bucket.faults.get(path)
                if data is None:
                    self.send_error(404)
                    return
                if fault == "html":
                    data = b"<!DOCTYPE html><html><body>Quota exceeded</body></html>"
                if fault == "silent":  # no answer for a while
                    time.sleep(2)
                self.send_response(200)
                if fault == "truncated":  # No length, closed half-way (HTTP/1.0).
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    return
                if fault in ("lines", "lines_no_length"):  # No length, closed after a whole line.
                    self.end_headers()
                    self.wfile.write(data[: data.index(b"\n", len(data) // 2) + 1])
                    return
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == "short":  # half the stated length, then the connection closes
                    self.wfile.write(data[: len(data) // 2])
                    self.close_connection = True
                    return
                if fault == "stall":  # half the file, then nothing for a while
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    time.sleep(2)
                    self.wfile.write(data[len(data) // 2 :])
                    return
                for i in range(0, len(data), 4096):
                    self.wfile.write(data[i : i + 4096])
                    time.sleep(bucket.chunk_delay)

            def do_HEAD(self):
                data = bucket.files.get(urllib.parse.unquote(self.path.lstrip("/")))
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                if bucket.faults.get(urllib.parse.unquote(self.path.lstrip("/"))) != "lines_no_length":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()

            def log_message(self, *args):
                pass

        return Handler


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A `Bucket` served as KERAS_VIT_WEIGHTS_URL, cache in tmp_path/cache."""
    served = Bucket()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), served.handler())
    # shutdown() waits for the loop's next poll: 0.5 s by default, per test.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    served.url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", served.url)
    monkeypatch.setenv("KERAS_VIT_CACHE_DIR", str(tmp_path / "cache"))
    yield served
    server.shutdown()


def npz_bytes(tmp_path, model, name="served.npz"):
    return pathlib.Path(export(tmp_path, model, name)).read_bytes()


def test_registered_name_is_downloaded_verified_cached_and_loaded(bucket, tmp_path):
    source = randomize_weights(keras_vit.ViTTi16(input_shape=(32, 32, 3)))
    upstream, _ = registry.AUGREG_RECOMMENDED["ViT-Ti_16"]
    bucket.files[f"augreg/{upstream}.npz"] = data = npz_bytes(tmp_path, source)
    # The partial file of a killed download is in the cache: replaced.
    cached = tmp_path / "cache" / "models" / "keras_vit" / f"augreg__{upstream}.npz"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(data[:1000])
    model = keras_vit.ViTTi16(input_shape=(32, 32, 3), weights="augreg")
    for a, b in zip(weights_of(source), weights_of(model)):
        np.testing.assert_array_equal(a, b)
    assert cached.read_bytes() == data
    record = pathlib.Path(f"{cached}.sha256").read_text().split()
    assert record == [hashlib.sha256(data).hexdigest(), cached.name]
    # Cached: a second load needs no server.
    bucket.files.clear()
    keras_vit.ViTTi16(input_shape=(32, 32, 3), weights="augreg")
    assert bucket.requests == [f"augreg/{upstream}.npz"]


def test_a_registered_checkpoint_serves_another_patch_size(bucket, tmp_path):
    """Issue 25: `get_model("ViT-Ti_16", patch_size=8, weights="augreg")`
    serves as Ti/8 (the registry's architecture check lets a plain ViT's
    patch size differ; the loader PI-resizes)."""
    source = randomize_weights(keras_vit.ViTTi16(input_shape=(32, 32, 3)))
    upstream, _ = registry.AUGREG_RECOMMENDED["ViT-Ti_16"]
    bucket.files[f"augreg/{upstream}.npz"] = npz_bytes(tmp_path, source)
    model = keras_vit.get_model("ViT-Ti_16", patch_size=8, input_shape=(32, 32, 3), weights="augreg")
    assert model.get_layer("embedding").kernel.shape == (8, 8, 3, 192)
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 17, 192)


def test_a_registered_checkpoint_loads_into_a_dynamic_size_model(bucket, tmp_path):
    """Issue 25: `ViTTi16(input_shape=(None, None, 3), image_size=32,
    weights="augreg")` keeps the checkpoint's embeddings as stored (the
    registry resolves the resolution from `image_size`), and at another size
    equals the model built for it."""
    source = randomize_weights(keras_vit.ViTTi16(input_shape=(32, 32, 3)))
    upstream, _ = registry.AUGREG_RECOMMENDED["ViT-Ti_16"]
    bucket.files[f"augreg/{upstream}.npz"] = npz_bytes(tmp_path, source)
    model = keras_vit.ViTTi16(input_shape=(None, None, 3), image_size=32, weights="augreg")
    for a, b in zip(weights_of(source), weights_of(model)):
        np.testing.assert_array_equal(a, b)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 48, 32, 3)).astype("float32")
    static = keras_vit.ViTTi16(input_shape=(48, 32, 3), weights="augreg")
    assert_close_rel(keras.ops.convert_to_numpy(model(images)), keras.ops.convert_to_numpy(static(images)), 1e-5)


def test_failed_download_is_a_clear_error(bucket):
    with pytest.raises(Exception, match="URL fetch failure|404"):
        keras_vit.ViTTi16(input_shape=(32, 32, 3), weights="augreg")


def test_architecture_overrides_are_refused_before_download(bucket):
    with pytest.raises(ValueError, match=r"num_layers 2 \(the checkpoint's: 12\)"):
        keras_vit.ViTB16(input_shape=(32, 32, 3), num_layers=2, weights="sam")
    with pytest.raises(ValueError, match="class token False"):
        keras_vit.ViTTi16(input_shape=(32, 32, 3), classifier="gap", weights="augreg")
    model = keras_vit.ViTTi16(input_shape=(32, 32, 3), mlp_dim=64)
    with pytest.raises(ValueError, match=r"mlp_dim 64 .*\(nothing was downloaded\)"):
        keras_vit.load_weights(model, "augreg", variant="ViT-Ti_16")
    # Options the original format has no keys for (a GB download refused after the fact before).
    with pytest.raises(ValueError, match=r"this model has qk_norm=True, gelu='exact': .*nothing was downloaded"):
        keras_vit.ViTTi16(input_shape=(32, 32, 3), gelu="exact", qk_norm=True, weights="augreg")
    # Every published file is for RGB (a grey-scale model downloaded 2.5 GB to be refused).
    with pytest.raises(ValueError, match=r"channels 1 \(the checkpoint's: 3\).*nothing was downloaded"):
        keras_vit.ViTTi16(input_shape=(32, 32, 1), weights="augreg")
    assert bucket.requests == []


def test_an_argument_that_refuses_a_good_checkpoint_keeps_it_cached(bucket, tmp_path):
    """A wrong `source_grid` is the caller's error: the downloaded file is
    cached all the same, and a cached one is not deleted (it was, and
    downloaded again, which fails offline)."""
    upstream, _ = registry.AUGREG_RECOMMENDED["ViT-Ti_16"]
    bucket.files[f"augreg/{upstream}.npz"] = npz_bytes(tmp_path, randomize_weights(keras_vit.ViTTi16(
        input_shape=(32, 32, 3))))
    model = keras_vit.ViTTi16(input_shape=(48, 48, 3))
    for _ in range(2):  # downloaded, then cached
        with pytest.raises(ValueError, match=r"source_grid"):
            keras_vit.load_weights(model, "augreg", variant="ViT-Ti_16", source_grid=(2, 8))
    assert len(bucket.requests) == 1
    keras_vit.load_weights(model, "augreg", variant="ViT-Ti_16")  # from the cache
    assert len(bucket.requests) == 1


def test_a_model_that_refuses_a_sound_checkpoint_keeps_it_cached(bucket, tmp_path):
    """Only a file at fault (corrupt, truncated, not finite) is deleted and
    downloaded again: a `pre_logits` width the file does not have was taken
    for a bad file, so a valid cached checkpoint was deleted and the same
    file downloaded again, then refused with an error about the download."""
    upstream, _ = registry.AUGREG_RECOMMENDED["ViT-Ti_16"]
    bucket.files[f"augreg/{upstream}.npz"] = npz_bytes(tmp_path, randomize_weights(keras_vit.ViTTi16(
        input_shape=(32, 32, 3), representation_size=192)))
    keras_vit.ViTTi16(input_shape=(32, 32, 3), weights="augreg")  # downloaded and cached (pre_logits dropped)
    model = keras_vit.ViTTi16(input_shape=(32, 32, 3), representation_size=64)
    with pytest.raises(ValueError, match=r"shape mismatch: pre_logits/kernel is \(192, 192\) in the checkpoint, "
                                         r"\(192, 64\) in the model") as refusal:
        keras_vit.load_weights(model, "augreg", variant="ViT-Ti_16")
    assert "invalid" not in str(refusal.value)
    assert len(bucket.requests) == 1
    # A file at fault still is: a NaN is not in any published checkpoint.
    cached = tmp_path / "cache" / "models" / "keras_vit" / f"augreg__{upstream}.npz"
    arrays = read_npz(cached)
    arrays["embedding/bias"][0] = np.nan
    np.savez(cached, **arrays)
    os.remove(f"{cached}.sha256")
    keras_vit.load_weights(keras_vit.ViTTi16(input_shape=(32, 32, 3)), "augreg", variant="ViT-Ti_16")
    assert len(bucket.requests) == 2


@pytest.mark.one_backend
def test_imagenet21k_pre_logits_of_another_width_are_refused_before_download(bucket):
    """The original ImageNet-21k files carry pre_logits of the model's width
    (R = D): another `representation_size` is refused before the GB
    download, naming it; none (dropped) or the width load."""
    model = keras_vit.ViTB16(input_shape=(16, 16, 3), representation_size=64, num_classes=2)
    with pytest.raises(ValueError, match=r"representation_size 64 \(the checkpoint's: 768\).*nothing was downloaded"):
        keras_vit.load_weights(model, "imagenet21k", variant="ViT-B_16")
    registry.check_architecture(keras_vit.ViTB16(input_shape=(16, 16, 3), num_classes=2), "ViT-B_16",
                                "imagenet21k")
    assert bucket.requests == []


# The cache itself, through `cache.fetch` with the loader as validator.
BUCKET_PATH = "augreg/tiny.npz"


def cached_path(tmp_path):
    return tmp_path / "cache" / "models" / "keras_vit" / "augreg__tiny.npz"


def fetch_into(model):
    return cache.fetch(BUCKET_PATH, validate=lambda path: prepare_npz(model, path))


@pytest.mark.one_backend
@pytest.mark.parametrize("fault, match", [
    ("truncated", "truncated, corrupt"),
    ("html", "text .*error page"),
])
def test_broken_download_is_never_cached(bucket, tmp_path, fault, match):
    model = tiny()
    bucket.files[BUCKET_PATH] = npz_bytes(tmp_path, randomize_weights(tiny()))
    bucket.faults[BUCKET_PATH] = fault
    with pytest.raises(ValueError, match=f"downloaded from {bucket.url}.* is invalid.*{match}"):
        fetch_into(model)
    assert sorted(p.name for p in cached_path(tmp_path).parent.iterdir()) == ["augreg__tiny.npz.lock"]
    del bucket.faults[BUCKET_PATH]
    assert fetch_into(model) == str(cached_path(tmp_path))
    assert cached_path(tmp_path).read_bytes() == bucket.files[BUCKET_PATH]


@pytest.mark.one_backend
@pytest.mark.parametrize("fault", ["short", "missing"])
def test_a_failed_download_is_an_os_error_naming_the_url(bucket, tmp_path, fault):
    """Keras' `get_file` raises a bare `Exception` ("URL fetch failure"):
    neither `except OSError` nor `except ValueError` caught a transfer cut
    short or a 404."""
    model = tiny()
    bucket.files[BUCKET_PATH] = npz_bytes(tmp_path, randomize_weights(tiny()))
    bucket.faults[BUCKET_PATH] = fault
    if fault == "missing":
        del bucket.files[BUCKET_PATH]
    told = "retrieval incomplete" if fault == "short" else "404"
    with pytest.raises(OSError, match=rf"^The download of {bucket.url}/{BUCKET_PATH} failed \(.*{told}.*\)\. "
                                      "Nothing was cached; call again to retry.$"):
        fetch_into(model)
    assert sorted(p.name for p in cached_path(tmp_path).parent.iterdir()) == ["augreg__tiny.npz.lock"]


@pytest.mark.one_backend
@pytest.mark.parametrize("fault", ["silent", "stall"])
def test_a_stalled_download_times_out_and_is_never_cached(bucket, tmp_path, monkeypatch, fault):
    """`keras.utils.get_file` has no timeout: a server that did not answer,
    or stopped sending half-way, held the process forever."""
    monkeypatch.setattr(cache, "STALL_TIMEOUT_S", 0.5, raising=False)
    model = tiny()
    bucket.files[BUCKET_PATH] = npz_bytes(tmp_path, randomize_weights(tiny()))
    bucket.faults[BUCKET_PATH] = fault
    with pytest.raises(OSError, match=rf"^The download of {bucket.url}/{BUCKET_PATH} stalled: no data for 0.5 s. "
                                      "Nothing was cached; call again to retry.$"):
        fetch_into(model)
    assert socket.getdefaulttimeout() is None  # the process' default is put back
    assert sorted(p.name for p in cached_path(tmp_path).parent.iterdir()) == ["augreg__tiny.npz.lock"]
    del bucket.faults[BUCKET_PATH]
    assert fetch_into(model) == str(cached_path(tmp_path))


@pytest.mark.one_backend
@pytest.mark.parametrize("cached", ["partial", "html", "other model"])
def test_invalid_cached_file_is_reported_deleted_and_downloaded_once(
    bucket, tmp_path, caplog, cached
):
    good = npz_bytes(tmp_path, randomize_weights(tiny()))
    bad = {
        "partial": good[: len(good) // 3],
        "html": b"<html><body>404</body></html>",
        "other model": npz_bytes(tmp_path, tiny(hidden_size=24), "other.npz"),
    }[cached]
    cached_path(tmp_path).parent.mkdir(parents=True)
    cached_path(tmp_path).write_bytes(bad)
    bucket.files[BUCKET_PATH] = good
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        fetch_into(tiny())
    assert "is invalid" in caplog.text and "downloading it again" in caplog.text
    assert cached_path(tmp_path).read_bytes() == good
    # A server that serves the bad file too: one more download, then an error.
    cached_path(tmp_path).write_bytes(bad)
    pathlib.Path(f"{cached_path(tmp_path)}.sha256").unlink()
    bucket.files[BUCKET_PATH] = bad
    with pytest.raises(ValueError, match="(?s)downloaded from .* is invalid.* Nothing was cached"):
        fetch_into(tiny())
    assert len(bucket.requests) == 2 and not cached_path(tmp_path).exists()


@pytest.mark.one_backend
def test_cached_file_changed_after_first_download_is_detected(bucket, tmp_path, caplog):
    model = tiny()
    bucket.files[BUCKET_PATH] = npz_bytes(tmp_path, randomize_weights(tiny(), seed=1))
    fetch_into(model)
    # Another checkpoint of the same architecture: it would load fine.
    cached_path(tmp_path).write_bytes(npz_bytes(tmp_path, randomize_weights(tiny(), seed=2), "x.npz"))
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        fetch_into(model)
    assert "changed since its first verified download" in caplog.text
    assert cached_path(tmp_path).read_bytes() == bucket.files[BUCKET_PATH]
    assert len(bucket.requests) == 2


@pytest.mark.one_backend
def test_unusable_cache_directory_is_an_error_not_a_fallback(bucket, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("KERAS_VIT_CACHE_DIR", str(blocker))
    bucket.files[BUCKET_PATH] = b"anything"
    with pytest.raises(PermissionError, match=f"{blocker}/models/keras_vit.*It comes from KERAS_VIT_CACHE_DIR="
                                              f"'{blocker}': point KERAS_VIT_CACHE_DIR at a directory of yours"):
        fetch_into(tiny())
    # KERAS_HOME, when it chose the folder, is the one named (the advice was always KERAS_VIT_CACHE_DIR).
    monkeypatch.delenv("KERAS_VIT_CACHE_DIR")
    monkeypatch.setenv("KERAS_HOME", str(blocker))
    with pytest.raises(PermissionError, match=f"It comes from KERAS_HOME='{blocker}': point KERAS_HOME at"):
        fetch_into(tiny())
    assert bucket.requests == []


@pytest.mark.one_backend
@pytest.mark.skipif(os.name != "posix", reason="POSIX owners and modes")
def test_cache_refuses_files_others_own_or_can_write(bucket, tmp_path):
    model = tiny()
    bucket.files[BUCKET_PATH] = npz_bytes(tmp_path, randomize_weights(tiny()))
    path = cached_path(tmp_path)
    fetch_into(model)
    path.chmod(0o666)
    with pytest.raises(PermissionError, match="writable by every user"):
        fetch_into(model)
    # Group-writable too (before: accepted): whether the group has other
    # members cannot be checked portably. The error names the fix.
    record = pathlib.Path(f"{path}.sha256")
    for target in (path, record):
        path.chmod(0o644)
        record.chmod(0o644)
        target.chmod(0o664)
        with pytest.raises(PermissionError) as error:
            fetch_into(model)
        assert str(error.value) == (
            f"The keras_vit {'cached file' if target == path else 'hash record'} "
            f"{str(target)!r} is writable by its group (mode -rw-rw-r--), so it is "
            f"not trusted. Run `chmod g-w,o-w {target}`, or delete it."
        )
    record.chmod(0o600)
    path.chmod(0o644)
    path.parent.chmod(0o777)
    with pytest.raises(PermissionError, match="cache directory .* writable by every user"):
        fetch_into(model)
    path.parent.chmod(0o755)
    if os.getuid() == 0:
        os.chown(path, 4242, -1)
        with pytest.raises(PermissionError, match=r"owned by another user \(uid 4242\)"):
            fetch_into(model)
    assert path.exists() and len(bucket.requests) == 1  # Refused, not deleted.


@pytest.mark.one_backend
@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_files_the_cache_writes_are_writable_by_their_owner_only(bucket, tmp_path):
    model = tiny()
    bucket.files[BUCKET_PATH] = npz_bytes(tmp_path, randomize_weights(tiny()))
    umask = os.umask(0)  # The loosest: files would be created 0o666.
    try:
        fetch_into(model)
        # Refreshed (replaced) and re-recorded: the same modes.
        cache.fetch(BUCKET_PATH, validate=lambda p: prepare_npz(model, p), refresh=True)
    finally:
        os.umask(umask)
    path = cached_path(tmp_path)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()}
    assert modes == {path.name: 0o644, f"{path.name}.sha256": 0o600, f"{path.name}.lock": 0o600}
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755  # Before: 0o777, then refused.
    assert fetch_into(model) == str(path) and len(bucket.requests) == 2  # Accepted, cached.


@pytest.mark.one_backend
def test_a_refresh_on_a_full_disk_names_the_download(bucket, tmp_path, monkeypatch):
    # The system's words alone ("No space left on device") named no file.
    model = tiny()
    good = npz_bytes(tmp_path, randomize_weights(tiny(), seed=1))
    bucket.files[BUCKET_PATH] = good
    fetch_into(model)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(keras.utils, "get_file", full_disk)
    with pytest.raises(OSError, match=r"No space left on device: caching http://127\.0\.0\.1:\d+/.* in .* failed\. "
                                      r"Nothing was cached \(a file cached before is unchanged\)\."):
        cache.fetch(BUCKET_PATH, validate=lambda p: prepare_npz(model, p), refresh=True)
    assert cached_path(tmp_path).read_bytes() == good


@pytest.mark.one_backend
@pytest.mark.parametrize("fault", ["html", "truncated", "missing"])
def test_failed_refresh_keeps_the_cached_file(bucket, tmp_path, fault):
    # Before: `refresh=True` deleted the cached file first, so a failed
    # download left nothing.
    model = tiny()
    good = npz_bytes(tmp_path, randomize_weights(tiny(), seed=1))
    bucket.files[BUCKET_PATH] = good
    fetch_into(model)
    record = pathlib.Path(f"{cached_path(tmp_path)}.sha256")
    recorded = record.read_text()
    newer = npz_bytes(tmp_path, randomize_weights(tiny(), seed=2), "newer.npz")
    if fault == "missing":
        del bucket.files[BUCKET_PATH]
    else:
        bucket.files[BUCKET_PATH] = newer
        bucket.faults[BUCKET_PATH] = fault
    with pytest.raises(Exception, match="404|is invalid.* Nothing was cached") as refused:
        cache.fetch(BUCKET_PATH, validate=lambda p: prepare_npz(model, p), refresh=True)
    assert ".partial-" not in str(refused.value)  # the download's temporary file, deleted: its URL instead
    assert cached_path(tmp_path).read_bytes() == good and record.read_text() == recorded
    assert len(bucket.requests) == 2
    assert fetch_into(model) == str(cached_path(tmp_path))  # Still valid: no request.
    assert len(bucket.requests) == 2
    assert not [p for p in cached_path(tmp_path).parent.iterdir() if ".partial-" in p.name]
    # A refresh that succeeds replaces the file and its record.
    bucket.files[BUCKET_PATH] = newer
    bucket.faults.clear()
    cache.fetch(BUCKET_PATH, validate=lambda p: prepare_npz(model, p), refresh=True)
    assert cached_path(tmp_path).read_bytes() == newer
    assert record.read_text().split()[0] == hashlib.sha256(newer).hexdigest()


FETCH_IN_A_PROCESS = """
import pathlib, sys, time
ready, other = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
import logging
logging.basicConfig(level=logging.INFO)
from keras_vit.weights import cache, read_npz
ready.touch()
while not other.exists():  # Both processes call fetch at the same time.
    time.sleep(0.01)
path = cache.fetch("augreg/tiny.npz", validate=read_npz)
print("ARRAYS", len(read_npz(path)))
"""


@pytest.mark.one_backend
def test_two_processes_share_one_download(bucket, tmp_path):
    source = randomize_weights(tiny())
    bucket.files[BUCKET_PATH] = npz_bytes(tmp_path, source)
    bucket.chunk_delay = 0.05  # A slow server: the download takes about a second.
    # The cache does not depend on the backend: the lightest to import.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERAS_BACKEND": "numpy"}
    flags = [tmp_path / "ready0", tmp_path / "ready1"]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FETCH_IN_A_PROCESS, str(flags[i]), str(flags[1 - i])],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    expected = f"ARRAYS {len(checkpoint_variables(source))}"
    assert all(expected in out for out in outputs), outputs
    assert sum("Waiting for another process" in out for out in outputs) == 1, outputs
    assert bucket.requests == [BUCKET_PATH]
    assert cached_path(tmp_path).read_bytes() == bucket.files[BUCKET_PATH]


FETCH_AND_BE_KILLED = """
from keras_vit.weights import cache, read_npz
cache.fetch("augreg/tiny.npz", validate=read_npz)
print("FINISHED")
"""


@pytest.mark.one_backend
def test_download_killed_midway_leaves_nothing_behind(bucket, tmp_path):
    # A fetch SIGKILLed mid-download leaves its `.NAME.partial-*` directory;
    # the next fetch deletes it and downloads a valid file.
    source = randomize_weights(tiny())
    data = bucket.files[BUCKET_PATH] = npz_bytes(tmp_path, source)
    bucket.chunk_delay = 0.2  # 4 KiB every 0.2 s: several seconds in all.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERAS_BACKEND": "numpy"}
    process = subprocess.Popen(
        [sys.executable, "-c", FETCH_AND_BE_KILLED], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    directory = cached_path(tmp_path).parent
    deadline = time.monotonic() + 120  # Importing keras on a busy machine.
    try:
        while True:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the download did not start"
            received = [
                f.stat().st_size
                for d in (directory.glob(".augreg__tiny.npz.partial-*") if directory.exists() else [])
                for f in d.iterdir()
            ]
            if received and 0 < received[0] < len(data):
                break
            time.sleep(0.02)
    finally:
        process.send_signal(signal.SIGKILL)
        output = process.communicate()[0]
    assert process.returncode == -signal.SIGKILL and "FINISHED" not in output
    left = sorted(p.name for p in directory.iterdir())
    assert len(left) == 2 and left[0].startswith(".augreg__tiny.npz.partial-"), left
    assert left[1] == "augreg__tiny.npz.lock"  # Nothing entered the cache.
    bucket.chunk_delay = 0.0
    path = cache.fetch(BUCKET_PATH, validate=read_npz)
    assert pathlib.Path(path).read_bytes() == data
    assert len(read_npz(path)) == len(checkpoint_variables(source))
    assert sorted(p.name for p in directory.iterdir()) == [
        "augreg__tiny.npz", "augreg__tiny.npz.lock", "augreg__tiny.npz.sha256"
    ]
    assert bucket.requests == [BUCKET_PATH, BUCKET_PATH]


# --- Same numbers on every backend -------------------------------------------


def test_golden_logits_from_timm():
    """tests/weights/golden/: random weights for the "testing" config, an input batch
    and timm's logits for them (made by tests/weights/golden/make_golden.py); every
    backend must reproduce them."""
    golden = np.load(GOLDEN / "testing_io.npz")
    model = keras_vit.get_model(
        "testing", input_shape=golden["images"].shape[1:], num_classes=10
    )
    keras_vit.load_weights(model, str(GOLDEN / "testing.npz"))
    logits = keras.ops.convert_to_numpy(model(golden["images"]))
    expected = golden["logits"]
    np.testing.assert_allclose(logits, expected, atol=2e-5 * np.abs(expected).max())
