"""Issue 24: timm checkpoints by Hub name through `huggingface_hub`, and back.

Each family's model is built by timm itself from its real name and tag
(tiny widths, random weights), saved with timm's own `save_for_hf`
(`config.json` + `model.safetensors`) into a Hugging Face cache laid out as
the Hub client writes it, and loaded by name with the client offline:
`keras_vit.from_timm` must give timm's logits and pre-logit features within
1e-4 of their largest magnitude, on every backend. One test runs a real
process with `HF_HUB_OFFLINE=1`, as users do."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers.position_embedding import resample_position_embedding
from tests.helpers import ROOT, assert_close_rel, randomize_weights

pytestmark = pytest.mark.timm
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
pytest.importorskip("huggingface_hub")
pytest.importorskip("safetensors")
from timm.models._hub import save_for_hf  # noqa: E402

TINY = dict(embed_dim=32, depth=2, num_heads=2, patch_size=8, img_size=32)
# One real timm name per family of the issue (architecture.tag).
FAMILIES = {
    "original": "vit_base_patch16_224.augreg2_in21k_ft_in1k",
    "deit": "deit_base_patch16_224.fb_in1k",
    "deit3": "deit3_base_patch16_224.fb_in1k",
    "dino": "vit_small_patch16_224.dino",
    "dinov2": "vit_small_patch14_dinov2.lvd142m",
    "dinov2_registers": "vit_small_patch14_reg4_dinov2.lvd142m",
    # timm's QuickGELU architecture for OpenAI's weights (the Hub repository,
    # timm/vit_base_patch16_clip_224.openai, names the exact-GELU one).
    "clip_openai": "vit_base_patch16_clip_quickgelu_224.openai",
    "clip_laion": "vit_base_patch16_clip_224.laion2b",
    "siglip": "vit_base_patch16_siglip_224.webli",
}
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def timm_model(name, **args):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **{**TINY, **args})
    with torch.no_grad():  # every weight random (LayerScale's too)
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


def publish(cache, name, model=None, files=None):
    """A Hub repository `timm/<name>` in the cache `cache`, as the client
    lays it out: `refs/main` names the snapshot holding the files. With
    `model`, timm's own `save_for_hf` writes them."""
    snapshot = cache / f"models--timm--{name}" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(COMMIT)
    if model is not None:
        save_for_hf(model, str(snapshot), model_args=dict(TINY), safe_serialization=True)
    for filename, content in (files or {}).items():
        (snapshot / filename).write_bytes(content)
    return snapshot


def reference(model, images):
    """timm's logits (or None without a head) and pre-logit features."""
    with torch.no_grad():
        x = torch.from_numpy(images.transpose(0, 3, 1, 2))
        features = model.forward_head(model.forward_features(x), pre_logits=True).numpy()
        logits = model(x).numpy() if model.num_classes else None
    return logits, features


def images(size=32, batch=2):
    return np.random.default_rng(1).uniform(-1, 1, (batch, size, size, 3)).astype("float32")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_by_hub_name_gives_timms_logits_and_features(family, tmp_path):
    name = FAMILIES[family]
    model = timm_model(name)
    publish(tmp_path, name, model)
    x = images()
    logits, features = reference(model, x)
    hub = dict(cache_dir=tmp_path, local_files_only=True)
    if logits is not None:
        ours = keras_vit.from_timm(f"timm/{name}", **hub)
        assert ours.output.shape[-1] == model.num_classes
        assert_close_rel(ours.predict(x, verbose=0), logits, tol=1e-4)
    backbone = keras_vit.from_timm(name, include_top=False, **hub)  # the bare name: timm/<name>
    assert_close_rel(backbone.predict(x, verbose=0), features, tol=1e-4)


def test_raw_pixels_are_normalised_with_the_checkpoints_mean_and_std(tmp_path):
    name = FAMILIES["deit"]  # ImageNet's mean and std, not the original's 0.5
    model = timm_model(name)
    publish(tmp_path, name, model)
    pixels = np.random.default_rng(2).integers(0, 256, (2, 32, 32, 3), dtype="uint8")
    mean, std = np.array(model.pretrained_cfg["mean"]), np.array(model.pretrained_cfg["std"])
    logits, _ = reference(model, ((pixels / 255.0 - mean) / std).astype("float32"))
    ours = keras_vit.from_timm(f"hf-hub:timm/{name}", include_preprocessing=True, cache_dir=tmp_path,
                               local_files_only=True)
    assert_close_rel(ours.predict(pixels, verbose=0), logits, tol=1e-4)


def test_another_resolution_resamples_the_position_embeddings_as_timm(tmp_path):
    name = FAMILIES["original"]
    publish(tmp_path, name, timm_model(name))
    snapshot = tmp_path / f"models--timm--{name}" / "snapshots" / COMMIT
    bigger = timm.create_model(f"local-dir:{snapshot}", pretrained=True, img_size=48).eval()
    logits, _ = reference(bigger, images(48))
    ours = keras_vit.from_timm(name, input_shape=(48, 48, 3), cache_dir=tmp_path, local_files_only=True)
    assert_close_rel(ours.predict(images(48), verbose=0), logits, tol=1e-4)


def test_pixels_past_the_last_whole_patch_are_dropped_as_timm_does(tmp_path):
    """SigLIP so400m/14 at 384 px: timm's patch convolution covers 378 px and
    drops the rest; here 36 px with 8 px patches (4 px left over)."""
    name = "vit_so400m_patch14_siglip_384.webli"
    model = timm_model(name, img_size=36, num_classes=5)
    snapshot = publish(tmp_path, name)
    save_for_hf(model, str(snapshot), model_args={**TINY, "img_size": 36, "num_classes": 5}, safe_serialization=True)
    x = images(36)
    logits, features = reference(model, x)
    hub = dict(cache_dir=tmp_path, local_files_only=True)
    ours = keras_vit.from_timm(name, **hub)
    assert tuple(ours.input_shape) == (None, 36, 36, 3)
    assert_close_rel(ours.predict(x, verbose=0), logits, tol=1e-4)
    backbone = keras_vit.from_timm(name, include_top=False, input_shape=(36, 36, 3), **hub)
    assert_close_rel(backbone.predict(x, verbose=0), features, tol=1e-4)
    # The size the model takes is named, not the crop's (as a fixed-size
    # model's: tests/models/test_models.py; a TensorFlow graph's reshape).
    errors = (ValueError,)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        errors += (tf.errors.InvalidArgumentError,)
    with pytest.raises(errors, match=r"must be 36: this model takes images of 36x36 pixels|expected shape=\(None, "
                                     r"36, 36, 3\)|Input to reshape is a tensor with 32 values, but the requested "
                                     r"shape has 36"):
        ours.predict(images(32), verbose=0)
    # Any size: the embeddings of the 32 px the checkpoint's patches cover
    # (`image_size=(36, 36)` was refused, a keyword the user never gave).
    dynamic = keras_vit.from_timm(name, input_shape=(None, None, 3), **hub)
    assert_close_rel(dynamic.predict(x[:, :32, :32], verbose=0), logits, tol=1e-4)


def test_another_patch_size_is_pi_resized(tmp_path, caplog):
    """Issue 25 with a timm checkpoint: `from_timm(name, patch_size=4)` at
    the same resolution (an 8x8 grid instead of 4x4)."""
    from keras_vit.layers.patch_embedding import resize_patch_embedding

    name = FAMILIES["original"]
    model = timm_model(name)
    publish(tmp_path, name, model)
    with caplog.at_level("INFO", logger="keras_vit"):
        ours = keras_vit.from_timm(name, patch_size=4, cache_dir=tmp_path, local_files_only=True)
    assert "PI-resized from 8x8 to 4x4" in caplog.text and "resampled from a 4x4 to a 8x8 grid" in caplog.text
    kernel = model.patch_embed.proj.weight.detach().numpy().transpose(2, 3, 1, 0)
    np.testing.assert_allclose(ours.get_layer("embedding").kernel.numpy(), resize_patch_embedding(kernel, (4, 4)),
                               rtol=1e-6, atol=1e-6)
    assert np.all(np.isfinite(ours.predict(images(), verbose=0)))


def test_a_keyword_wins_over_the_config(tmp_path):
    """OpenAI's CLIP weights sit in a repository whose config names timm's
    exact GELU; `gelu="quick"` restores OpenAI's, and timm's QuickGELU model
    of the same weights gives the same features."""
    exact = timm_model("vit_base_patch16_clip_224.openai")
    publish(tmp_path, "vit_base_patch16_clip_224.openai", exact)
    quick = timm_model("vit_base_patch16_clip_quickgelu_224.openai")
    quick.load_state_dict(exact.state_dict())
    logits, _ = reference(quick, images())
    ours = keras_vit.from_timm("vit_base_patch16_clip_224.openai", gelu="quick", cache_dir=tmp_path,
                               local_files_only=True)
    assert ours.get_layer("encoderblock_0").gelu == "quick"
    assert_close_rel(ours.predict(images(), verbose=0), logits, tol=1e-4)


def test_another_number_of_classes_gets_a_zero_head(tmp_path):
    name = FAMILIES["dinov2"]  # no head in the checkpoint
    publish(tmp_path, name, timm_model(name))
    hub = dict(cache_dir=tmp_path, local_files_only=True)
    with pytest.raises(ValueError, match="num_classes"):
        keras_vit.from_timm(name, **hub)
    # 0 was reported as "Received: num_classes=None"; "no" counted as True.
    with pytest.raises(ValueError, match="`num_classes` must be a positive int. Received: num_classes=0"):
        keras_vit.from_timm(name, num_classes=0, **hub)
    for flag in ("include_top", "include_preprocessing", "local_files_only"):
        with pytest.raises(ValueError, match=f"`{flag}` must be a bool. Received: {flag}='no'"):
            keras_vit.from_timm(name, **{**hub, flag: "no"})
    # Taken where nothing is resampled; at another size blamed on the checkpoint.
    for size in (None, (42, 42, 3)):
        with pytest.raises(ValueError, match="`posemb_interpolation` must be one of .*posemb_interpolation='nearest'"):
            keras_vit.from_timm(name, num_classes=3, input_shape=size, posemb_interpolation="nearest", **hub)
    model = keras_vit.from_timm(name, num_classes=3, **hub)
    assert np.all(model.predict(images(), verbose=0) == 0.0)


def test_a_model_with_pre_logits_keeps_its_own_head(tmp_path):
    """timm has no pre_logits layer: its head reads the features. Loaded
    onto a model whose head reads a fresh pre_logits, logits changed
    without a note (the .npz rule: the head loads only with pre_logits on
    both sides or neither)."""
    tiny = dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=8, input_shape=(32, 32, 3),
                num_classes=4)
    keras_vit.export_timm(randomize_weights(keras_vit.ViT(None, **tiny)), tmp_path / "export")
    built = keras_vit.from_timm(str(tmp_path / "export"), representation_size=16)
    existing = keras_vit.ViT(None, representation_size=16, head_bias_init=-1.0, **tiny)
    notes = keras_vit.load_weights(existing, str(tmp_path / "export"))
    assert "head: the checkpoint's reads the features, the model's its pre_logits layer; the model's is kept." in notes
    assert "pre_logits: not in timm checkpoints; the model's is kept as built." in notes
    for model, bias in ((built, 0.0), (existing, -1.0)):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.get_layer("head").kernel), 0.0)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.get_layer("head").bias), bias)


def test_load_weights_by_hub_name_into_an_existing_model(tmp_path):
    name = FAMILIES["deit3"]
    publish(tmp_path, name, timm_model(name))
    built = keras_vit.from_timm(name, cache_dir=tmp_path, local_files_only=True)
    other = keras_vit.ViT(None, hidden_size=32, mlp_dim=128, num_heads=2, num_layers=2, patch_size=8,
                          input_shape=(32, 32, 3), num_classes=1000)  # no LayerScale: refused, unchanged
    before = other.get_weights()
    snapshot = tmp_path / f"models--timm--{name}" / "snapshots" / COMMIT
    with pytest.raises(ValueError, match="ls1.gamma"):
        keras_vit.load_weights(other, str(snapshot / "model.safetensors"))
    assert all(np.array_equal(a, b) for a, b in zip(before, other.get_weights()))
    same = keras_vit.ViT(None, hidden_size=32, mlp_dim=128, num_heads=2, num_layers=2, patch_size=8,
                         input_shape=(32, 32, 3), num_classes=1000, gelu="exact", layer_scale_init=1e-6,
                         no_embed_class=True)
    keras_vit.load_weights(same, str(snapshot))
    assert_close_rel(same.predict(images(), verbose=0), built.predict(images(), verbose=0), tol=1e-6)
    # The same keys and shapes, another GELU (the original's tanh): the
    # checkpoint's config tells, and nothing is loaded.
    tanh = keras_vit.ViT(None, hidden_size=32, mlp_dim=128, num_heads=2, num_layers=2, patch_size=8,
                         input_shape=(32, 32, 3), num_classes=1000, layer_scale_init=1e-6, no_embed_class=True)
    before = tanh.get_weights()
    with pytest.raises(ValueError, match="gelu: the model's 'tanh', the checkpoint's 'exact'"):
        keras_vit.load_weights(tanh, str(snapshot))
    assert all(np.array_equal(a, b) for a, b in zip(before, tanh.get_weights()))
    # Other heads: timm fuses them in one qkv matrix, so only the config tells.
    heads = keras_vit.ViT(None, hidden_size=32, mlp_dim=128, num_heads=4, num_layers=2, patch_size=8,
                          input_shape=(32, 32, 3), num_classes=1000, gelu="exact", layer_scale_init=1e-6,
                          no_embed_class=True)
    before = heads.get_weights()
    with pytest.raises(ValueError, match="num_heads: the model's 4, the checkpoint's 2"):
        keras_vit.load_weights(heads, str(snapshot))
    assert all(np.array_equal(a, b) for a, b in zip(before, heads.get_weights()))


def test_a_checkpoint_pooling_otherwise_is_refused(tmp_path):
    """Pooling leaves no trace in the weights: a `global_pool="avg"`
    checkpoint loaded into a class-token model ran, 39 % off timm's logits,
    with no note."""
    args = dict(global_pool="avg", fc_norm=False, reg_tokens=1)
    model = timm_model(FAMILIES["original"], **args)
    save_for_hf(model, str(tmp_path / "avg"), model_args={**TINY, **args}, safe_serialization=True)
    common = dict(hidden_size=32, mlp_dim=128, num_heads=2, num_layers=2, patch_size=8, input_shape=(32, 32, 3),
                  gelu="exact", num_register_tokens=1, class_token=True)
    for kwargs, told in (
            (dict(num_classes=1000), "the model's 'token' leaving out 0 prefix token(s), the checkpoint's 'gap' "
                                     "leaving out 2"),
            (dict(num_classes=1000, classifier="gap", pool_include_prefix=True), "the model's 'gap' leaving out 0"),
            (dict(include_top=False, pooling="token"), "the model's 'token'")):
        other = keras_vit.ViT(None, **common, **kwargs)
        before = other.get_weights()
        with pytest.raises(ValueError, match=f"pooling: {re.escape(told)}.*Nothing was loaded"):
            keras_vit.load_weights(other, str(tmp_path / "avg"))
        assert all(np.array_equal(a, b) for a, b in zip(before, other.get_weights()))
    same = keras_vit.ViT(None, **common, num_classes=1000, classifier="gap")
    keras_vit.load_weights(same, str(tmp_path / "avg"))
    logits, features = reference(model, images())
    assert_close_rel(same.predict(images(), verbose=0), logits, tol=1e-4)
    # A model of tokens pools as its user wants.
    tokens = keras_vit.ViT(None, **common, include_top=False)
    keras_vit.load_weights(tokens, str(tmp_path / "avg"))
    assert_close_rel(np.mean(tokens.predict(images(), verbose=0)[:, 2:], axis=1), features, tol=1e-4)


EXPORTED = {
    "original": {}, "deit3": dict(gelu="exact", layer_scale_init=0.1, no_embed_class=True, qk_norm=True),
    "siglip": dict(classifier="map", gelu="exact"),
    # Pooling with prefix tokens: timm leaves them out unless `pool_include_prefix`
    # (attention pooling over the class token differed from timm's by 0.7 % before).
    "map_class_token": dict(classifier="map", class_token=True),
    "map_registers_included": dict(classifier="map", num_register_tokens=1, pool_include_prefix=True),
    "gap_features_with_class_token": dict(include_top=False, pooling="gap"),
}


@pytest.mark.parametrize("kind", sorted(EXPORTED))
def test_export_timm_round_trips_through_timms_own_loader(kind, tmp_path):
    """A keras_vit model (the original architecture: timm's tanh GELU) goes
    to timm with equal logits (or pooled features), and comes back with
    `from_timm`."""
    model = keras_vit.ViT(None, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, patch_size=8,
                          input_shape=(32, 32, 3), num_classes=5, **EXPORTED[kind])
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.3, tuple(variable.shape)).astype("float32"))
    directory = keras_vit.export_timm(model, tmp_path / "export")
    assert sorted(os.listdir(directory)) == ["config.json", "model.safetensors"]
    umask = os.umask(0)
    os.umask(umask)
    for name in ("config.json", "model.safetensors"):  # as `open` creates them (mkstemp's 0600 before)
        assert os.stat(os.path.join(directory, name)).st_mode & 0o777 == 0o666 & ~umask
    theirs = timm.create_model(f"local-dir:{directory}", pretrained=True).eval()
    logits, features = reference(theirs, images())
    ours = model.predict(images(), verbose=0)
    assert_close_rel(ours, features if logits is None else logits, tol=1e-4)
    again = keras_vit.from_timm(directory, include_top=model.output_shape[-1] == 5)
    assert_close_rel(again.predict(images(), verbose=0), ours, tol=1e-6)


@pytest.mark.one_backend  # file handling; the round trips above run on every backend
@pytest.mark.skipif(os.name != "posix", reason="file locks and symbolic links")
def test_export_timm_writes_its_files_as_export_npz_does(tmp_path):
    """A killed export's temporaries stayed forever in the folder meant for
    the Hub (each a copy of the weights); a symbolic link was replaced by a
    file; a `config.json` that could not be written failed after the new
    weights had replaced the old ones."""
    model = keras_vit.ViT(None, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, patch_size=8,
                          input_shape=(32, 32, 3), num_classes=5)
    directory = tmp_path / "export"
    directory.mkdir()
    (directory / ".model.safetensors.tmp-killed.keras_vit-partial").write_bytes(b"half a file")  # no live export
    elsewhere = tmp_path / "kept" / "config.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text("{}")
    (directory / "config.json").symlink_to(elsewhere)
    keras_vit.export_timm(model, directory)
    assert sorted(os.listdir(directory)) == ["config.json", "model.safetensors"]
    assert (directory / "config.json").is_symlink() and json.loads(elsewhere.read_text())["num_classes"] == 5
    weights = (directory / "model.safetensors").read_bytes()
    (directory / "config.json").unlink()
    (directory / "config.json").mkdir()
    randomize = np.random.default_rng(1)
    for variable in model.weights:
        variable.assign(randomize.normal(size=tuple(variable.shape)).astype("float32"))
    with pytest.raises(ValueError, match=r"`directory` must be a regular file or a new one: .*config.json' is a "
                                         r"directory; nothing was written"):
        keras_vit.export_timm(model, directory)
    assert (directory / "model.safetensors").read_bytes() == weights
    with pytest.raises(ValueError, match=r"`directory` must be the path of a folder. Received: directory=''"):
        keras_vit.export_timm(model, "")  # wrote into the working directory
    # Stopped while the config is written (Ctrl-C; a full disk): the new
    # weights stood beside the old config, and `from_timm` built another
    # model without a word. Now the old export stays whole.
    (directory / "config.json").rmdir()
    keras_vit.export_timm(model, directory)
    old = {name: (directory / name).read_bytes() for name in ("config.json", "model.safetensors")}
    gap = keras_vit.ViT(None, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, patch_size=8,
                        input_shape=(32, 32, 3), num_classes=5, classifier="gap")
    fsync, calls = os.fsync, []

    def stopped(handle):
        calls.append(handle)
        if len(calls) == 2:
            raise KeyboardInterrupt
        fsync(handle)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", stopped)
        with pytest.raises(KeyboardInterrupt):
            keras_vit.export_timm(gap, directory)
    assert {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))} == old
    # Two processes exporting to one folder at once: the config one removed
    # between the other's look at it and its read of the permission bits
    # failed with FileNotFoundError ("an existing file there is unchanged").
    from keras_vit.weights import npz

    stat = os.stat

    def removed_meanwhile(path, *args, **kwargs):
        if str(path).endswith("config.json"):
            raise FileNotFoundError(path)
        return stat(path, *args, **kwargs)

    exists = os.path.exists
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os.path, "exists", lambda path: str(path).endswith("config.json") or exists(path))
        patch.setattr(os, "stat", removed_meanwhile)
        assert npz.file_mode(str(directory / "config.json")) == 0o666 & ~_umask()


def _umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_a_non_square_patch_exports_as_timms_pair(tmp_path):
    """`patch_size=(8, 4)` was written as 8: timm refused the position
    embedding's size and `from_timm` could not infer the grid."""
    model = keras_vit.ViT(None, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=(8, 4),
                          input_shape=(32, 32, 3), num_classes=3)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.3, tuple(variable.shape)).astype("float32"))
    directory = keras_vit.export_timm(model, tmp_path / "export")
    assert json.loads((tmp_path / "export" / "config.json").read_text())["model_args"]["patch_size"] == [8, 4]
    logits, _ = reference(timm.create_model(f"local-dir:{directory}", pretrained=True).eval(), images())
    ours = model.predict(images(), verbose=0)
    assert_close_rel(ours, logits, tol=1e-4)
    assert_close_rel(keras_vit.from_timm(directory).predict(images(), verbose=0), ours, tol=1e-6)


@pytest.mark.one_backend
def test_what_timm_cannot_express_is_not_exported(tmp_path):
    hybrid = keras_vit.ViT(None, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, patch_size=2,
                           resnet=(), resnet_width_factor=0.5, input_shape=(32, 32, 3), num_classes=3)
    with pytest.raises(ValueError, match="hybrid"):
        keras_vit.export_timm(hybrid, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # timm's models give logits: a softmax head's probabilities were exported as them.
    softmax = keras_vit.ViT(None, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, patch_size=8,
                            input_shape=(32, 32, 3), num_classes=3, classifier_activation="softmax")
    with pytest.raises(ValueError, match=r"a head activation \(classifier_activation='softmax'"):
        keras_vit.export_timm(softmax, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # Refused before writing (they wrote a checkpoint from_timm then refused,
    # or failed on a file, or on None, without naming the argument).
    plain = keras_vit.ViT(None, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, patch_size=8,
                          input_shape=(32, 32, 3), num_classes=3)
    for stats in (dict(pixel_mean=[2, 2, 2], pixel_std=[0, 1, 1]), dict(pixel_mean=[0.5, 0.5])):
        with pytest.raises(ValueError, match="`pixel_mean` and `pixel_std` go together"):
            keras_vit.export_timm(plain, tmp_path / "out", **stats)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"`directory` is a file, not a folder. Received: directory='.*file'"):
        keras_vit.export_timm(plain, tmp_path / "file")
    for export in (keras_vit.export_timm, keras_vit.export_npz):
        with pytest.raises(ValueError, match="not a keras_vit ViT. Received: model='None'"):
            export(None, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- Errors: each before anything is loaded (files and configs: one backend) ---

@pytest.mark.one_backend
def test_a_pickle_only_repository_is_refused(tmp_path):
    config = json.dumps({"architecture": "vit_base_patch16_224", "model_args": TINY}).encode()
    publish(tmp_path, "pickled", files={"config.json": config, "pytorch_model.bin": b"\x80\x04not loaded"})
    with pytest.raises(ValueError, match="pytorch_model.bin.*safetensors only"):
        keras_vit.from_timm("timm/pickled", cache_dir=tmp_path, local_files_only=True)


@pytest.mark.one_backend
@pytest.mark.parametrize("config, named", [
    ({"architecture": "deit_base_distilled_patch16_224"}, "deit_base_distilled_patch16_224"),
    ({"architecture": "vit_base_patch16_224", "model_args": {"qkv_bias": False}}, "qkv_bias"),
    ({"architecture": "resnet50"}, "resnet50"),
])
def test_an_unsupported_checkpoint_is_refused_before_its_weights_are_fetched(config, named, tmp_path):
    # Only config.json is cached: fetching the weights would fail otherwise.
    publish(tmp_path, "unsupported", files={"config.json": json.dumps(config).encode()})
    with pytest.raises(ValueError, match=named):
        keras_vit.from_timm("timm/unsupported", cache_dir=tmp_path, local_files_only=True)


@pytest.mark.one_backend
def test_missing_and_damaged_files_are_named(tmp_path):
    name = FAMILIES["original"]
    snapshot = publish(tmp_path, name, timm_model(name))
    local = tmp_path / "local"
    local.mkdir()
    (local / "config.json").write_bytes((snapshot / "config.json").read_bytes())
    with pytest.raises(ValueError, match="has no model.safetensors"):
        keras_vit.from_timm(str(local))
    weights = (snapshot / "model.safetensors").read_bytes()
    (local / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # a cut-short download
    with pytest.raises(ValueError, match="not a readable safetensors file.*delete .*local/model.safetensors and"):
        keras_vit.from_timm(str(local))
    # In the Hub's cache the snapshot's file links to a blob, which the
    # client links again as it is: the advice names the blob.
    blob = tmp_path / "blob"
    blob.write_bytes(weights[: len(weights) // 2])
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(blob)
    with pytest.raises(ValueError, match=f"delete {blob} \\(the file .*model.safetensors links to\\) and load"):
        keras_vit.from_timm(f"timm/{name}", cache_dir=tmp_path, local_files_only=True)
    # Neither a directory nor a repository name: one error naming `source`.
    with pytest.raises(ValueError, match=r"neither a local directory nor a Hub repository name.*source='a/b c'"):
        keras_vit.from_timm("a/b c", cache_dir=tmp_path, local_files_only=True)


@pytest.mark.one_backend
def test_paths_in_the_home_directory(tmp_path, monkeypatch):
    """`~` is expanded by the exports as by the loaders: `export_npz(m,
    "~/x.npz")` wrote `./~/x.npz`, which `load_weights(m, "~/x.npz")` then
    did not find; `from_timm("~/dir")` was taken for a Hub repository."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    model = keras_vit.ViT(None, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=8,
                          input_shape=(16, 16, 3), num_classes=3)
    assert keras_vit.export_npz(model, "~/x.npz") == str(tmp_path / "x.npz")
    keras_vit.load_weights(model, "~/x.npz")
    assert keras_vit.export_timm(model, "~/exported") == str(tmp_path / "exported")
    keras_vit.from_timm("~/exported")
    assert sorted(os.listdir(tmp_path)) == ["exported", "x.npz"]


@pytest.mark.one_backend
def test_bfloat16_non_square_and_non_finite_files(tmp_path):
    """bfloat16 safetensors (the Hub's usual half precision) load, exactly
    as float32 (they were refused as "not finite floats"); a non-square
    checkpoint loads at another size from its config's grid; `source_grid`
    and `allow_nonfinite` reach timm files as they reach `.npz` ones."""
    from safetensors.numpy import load_file
    from safetensors.torch import save_file

    model = keras_vit.ViT(None, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, patch_size=8,
                          input_shape=(32, 48, 3), num_classes=5)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.3, tuple(variable.shape)).astype("float32"))
    directory = Path(keras_vit.export_timm(model, tmp_path / "export"))
    state = {key: torch.from_numpy(value) for key, value in load_file(str(directory / "model.safetensors")).items()}
    save_file({key: value.bfloat16() for key, value in state.items()}, str(tmp_path / "bf16.safetensors"))
    rounded = {key: value.bfloat16().float().numpy() for key, value in state.items()}
    half = keras_vit.ViT(None, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, patch_size=8,
                         input_shape=(32, 48, 3), num_classes=5)
    keras_vit.load_weights(half, str(tmp_path / "bf16.safetensors"))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(half.get_layer("head").kernel),
                                  rounded["head.weight"].T)
    bigger = keras_vit.from_timm(str(directory), input_shape=(64, 64, 3))  # the 4 x 6 grid, from config.json
    assert bigger.get_layer("posembed_input").pos_embedding.shape == (1, 65, 32)
    square = keras_vit.ViT(None, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, patch_size=8,
                           input_shape=(64, 64, 3), num_classes=5)
    with pytest.raises(ValueError, match=r"source_grid=\(5, 5\) does not hold the checkpoint's 24 grid tokens"):
        keras_vit.load_weights(square, str(directory / "model.safetensors"), source_grid=(5, 5))
    notes = keras_vit.load_weights(square, str(directory / "model.safetensors"), source_grid=(4, 6))
    assert notes == ["position embeddings resampled from a 4x6 to a 8x8 grid (bicubic_antialias)."]
    # A grid of the same token count but another shape (4 x 6 -> 3 x 8) is
    # resampled, as timm's `checkpoint_filter_fn` does when the checkpoint's
    # grid is known (it was copied as it was, silently).
    wide = keras_vit.from_timm(str(directory), input_shape=(24, 64, 3))
    stored = state["pos_embed"].numpy()
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(wide.get_layer("posembed_input").pos_embedding),
        resample_position_embedding(stored, (3, 8), (4, 6), 1, "bicubic_antialias"), rtol=1e-5, atol=1e-7)
    state["norm.weight"][0] = float("nan")
    save_file(state, str(tmp_path / "nan.safetensors"))
    with pytest.raises(ValueError, match="norm.weight: NaN or infinite values"):
        keras_vit.load_weights(half, str(tmp_path / "nan.safetensors"))
    keras_vit.load_weights(half, str(tmp_path / "nan.safetensors"), allow_nonfinite=True)
    assert np.isnan(keras.ops.convert_to_numpy(half.get_layer("encoder_norm").gamma)[0])


@pytest.mark.one_backend
def test_offline_with_nothing_cached_says_so(tmp_path):
    with pytest.raises(ValueError, match="not in the local Hugging Face cache"):
        keras_vit.from_timm("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", cache_dir=tmp_path / "empty",
                            local_files_only=True)


def test_a_user_process_offline_loads_by_name_from_the_hub_cache(tmp_path):
    """As users run it: HF_HUB_OFFLINE=1 and the cache in HF_HUB_CACHE, no
    keyword but the name."""
    name = FAMILIES["clip_laion"]
    model = timm_model(name)
    publish(tmp_path, name, model)
    np.save(tmp_path / "x.npy", images())
    code = ("import sys, numpy as np, keras_vit; m = keras_vit.from_timm(sys.argv[1]); "
            "np.save(sys.argv[2], m.predict(np.load(sys.argv[3]), verbose=0))")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path), KERAS_BACKEND=keras.backend.backend(),
               PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", code, name, str(tmp_path / "y.npy"), str(tmp_path / "x.npy")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    logits, _ = reference(model, images())
    assert_close_rel(np.load(tmp_path / "y.npy"), logits, tol=1e-4)


# Full size: the subject is size, not the backend (the tiny families run on
# every backend), so PyTorch alone, the cheapest backend at full size.
def full_size(test):
    test = pytest.mark.skipif(keras.backend.backend() != "torch", reason="full size: on PyTorch only")(test)
    return pytest.mark.large(test)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@full_size
def test_every_family_at_full_size_gives_timms_features(family):
    """Each family's real architecture at its real size and resolution
    (timm's model of the name, random weights): the keras_vit model built
    from the same name has timm's parameter count and, with timm's weights,
    its pre-logit features (and logits, where the checkpoint has a head)."""
    from keras_vit.weights import timm as timm_format

    name = FAMILIES[family]
    torch.manual_seed(0)
    theirs = timm.create_model(name, pretrained=False).eval()
    args = {**timm_format.architecture_args(name.split(".")[0]), "num_classes": theirs.num_classes,
            "img_size": tuple(theirs.pretrained_cfg["input_size"][-2:])}
    ours = keras_vit.ViT(None, **timm_format.builder_kwargs(args))
    assert ours.count_params() == sum(value.numel() for value in theirs.parameters())
    state = {key: value.detach().numpy() for key, value in theirs.state_dict().items()}
    assert timm_format.load_timm_state(ours, state) == []
    x = images(args["img_size"][0], batch=1)
    logits, features = reference(theirs, x)
    expected = logits if logits is not None else features
    assert_close_rel(ours.predict(x, verbose=0), expected, tol=1e-4)

@full_size
def test_a_full_size_checkpoint_gives_timms_logits(tmp_path):
    name = FAMILIES["original"]  # ViT-B/16 at 224 px, 1,000 classes
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    snapshot = publish(tmp_path, name)
    save_for_hf(model, str(snapshot), safe_serialization=True)
    x = images(224, batch=1)
    logits, _ = reference(model, x)
    ours = keras_vit.from_timm(name, cache_dir=tmp_path, local_files_only=True)
    assert_close_rel(ours.predict(x, verbose=0), logits, tol=1e-4)


def test_from_timm_builds_a_dynamic_size_model_storing_the_checkpoints_embeddings(tmp_path):
    """`from_timm(..., input_shape=(None, None, 3))`: the embeddings stay at
    the checkpoint's grid and are resampled as timm does (antialiased
    bicubic), giving the static `from_timm` model's logits at another size
    (issue 25)."""
    from tests.helpers import TINY_WIDTHS, randomize_weights

    source = randomize_weights(keras_vit.ViT(None, input_shape=(32, 32, 3), patch_size=8, num_classes=5, **TINY_WIDTHS))
    keras_vit.export_timm(source, str(tmp_path))
    dynamic = keras_vit.from_timm(str(tmp_path), input_shape=(None, None, 3))
    posemb = dynamic.get_layer("posembed_input")
    assert (posemb.grid, posemb.interpolation) == ((4, 4), "bicubic_antialias")
    images = np.random.default_rng(0).uniform(-1, 1, (2, 48, 40, 3)).astype("float32")
    static = keras_vit.from_timm(str(tmp_path), input_shape=(48, 40, 3))
    assert_close_rel(keras.ops.convert_to_numpy(dynamic(images)), keras.ops.convert_to_numpy(static(images)), 1e-5)
    # One side fixed (it was refused, naming an `image_size` never passed):
    # the embeddings resampled once along it.
    half = keras_vit.from_timm(str(tmp_path), input_shape=(None, 40, 3))
    assert half.get_layer("posembed_input").grid == (4, 5)
    assert_close_rel(keras.ops.convert_to_numpy(half(images)), keras.ops.convert_to_numpy(static(images)), 1e-5)


def publish_blobs(cache, name, model, commit, branch="main", **args):
    """`publish`, with the files as the client stores them: the snapshot's
    files link to blobs named by their SHA-256 (the Hub's ETag of a large
    file). `args`: the model's own beyond `TINY`."""
    import hashlib
    import tempfile

    repo = cache / f"models--timm--{name}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as saved:
        save_for_hf(model, saved, model_args={**TINY, **args}, safe_serialization=True)
        for filename in ("config.json", "model.safetensors"):
            content = Path(saved, filename).read_bytes()
            blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
            blob.write_bytes(content)
            (snapshot / filename).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def publish_two_commits(cache, name):
    """`(first, second)`: timm models published as the `main` branch's
    commit `COMMIT` and the `next` branch's `"f" * 40`, the second with
    other heads and other weights of the same shapes."""
    first, second = timm_model(name), timm_model(name, num_heads=4)
    with torch.no_grad():
        for parameter in second.parameters():
            parameter.normal_(0.0, 0.3)
    publish_blobs(cache, name, first, COMMIT)
    publish_blobs(cache, name, second, "f" * 40, branch="next", num_heads=4)
    return first, second


def test_the_weights_come_from_the_configs_commit(tmp_path, monkeypatch):
    """The branch moved between the config's download and the weights' (a
    new commit with other heads and weights of the same shapes): the model
    was built from one commit and loaded from the other, silently."""
    import huggingface_hub

    name = FAMILIES["original"]
    first, second = publish_two_commits(tmp_path, name)
    refs = tmp_path / f"models--timm--{name}" / "refs"
    download = huggingface_hub.hf_hub_download

    def moving_branch(*args, **kwargs):
        path = download(*args, **kwargs)
        (refs / "main").write_text("f" * 40)  # pushed right after this file
        return path

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", moving_branch)
    ours = keras_vit.from_timm(name, cache_dir=tmp_path, local_files_only=True)
    assert ours.get_layer("encoderblock_0").num_heads == 2
    assert_close_rel(ours.predict(images(), verbose=0), reference(first, images())[0], tol=1e-4)


def test_a_download_damaged_in_transit_is_fetched_again_or_refused(tmp_path, monkeypatch):
    """huggingface_hub does not check a file against its SHA-256: bytes
    changed in transit loaded as weights (finite, another model)."""
    import huggingface_hub

    name = FAMILIES["original"]
    model = timm_model(name)
    snapshot = publish_blobs(tmp_path, name, model, COMMIT)
    blob = Path(os.path.realpath(snapshot / "model.safetensors"))
    good = blob.read_bytes()
    blob.write_bytes(good[:-8] + bytes(8))  # the last weights' bytes zeroed: still a readable file
    hub = dict(cache_dir=tmp_path, local_files_only=True)
    with pytest.raises(ValueError, match=f"{blob} .*does not have the SHA-256 it is named by.*Delete it"):
        keras_vit.from_timm(name, **hub)
    # Online, the client downloads it once more (`force_download`), here the good bytes.
    download, forced = huggingface_hub.hf_hub_download, []

    def client(*args, **kwargs):
        if kwargs.pop("force_download", False):
            forced.append(args[1])
            blob.write_bytes(good)
        return download(*args, **{**kwargs, "local_files_only": True})

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", client)
    ours = keras_vit.from_timm(name, cache_dir=tmp_path)
    assert forced == ["model.safetensors"]
    assert_close_rel(ours.predict(images(), verbose=0), reference(model, images())[0], tol=1e-4)


@pytest.mark.parametrize("failure", ["size", "cut", "timeout"])
def test_a_failed_transfer_names_the_file_and_what_to_do(failure, tmp_path, monkeypatch):
    """What the client raises: its size check's OSError, and httpx's errors
    (no OSError) for a connection closed mid-body or a stalled one, which
    escaped as they were."""
    import httpx2
    import huggingface_hub

    name = FAMILIES["original"]
    publish_blobs(tmp_path, name, timm_model(name), COMMIT)
    download = huggingface_hub.hf_hub_download
    error = {"size": OSError("Consistency check failed: file should be of size 900 but has size 450"),
             "cut": httpx2.RemoteProtocolError("peer closed connection without sending complete message body"),
             "timeout": httpx2.ReadTimeout("timed out")}[failure]

    def cut_short(repo, filename, **kwargs):
        if filename == "model.safetensors":
            raise error
        return download(repo, filename, **{**kwargs, "local_files_only": True})

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cut_short)
    with pytest.raises(OSError, match=rf"hf-hub:timm/{name}: downloading model.safetensors failed "
                                      rf"\({type(error).__name__}: {re.escape(str(error))}\).*call again"):
        keras_vit.from_timm(name, cache_dir=tmp_path)


def test_gated_and_failing_hubs_are_told_apart_from_offline(tmp_path, monkeypatch):
    """A gated repository asked for a token it was given; a Hub answering
    500 (or a mistyped HF_ENDPOINT) was reported as being offline."""
    import httpx2
    import huggingface_hub
    from huggingface_hub import errors

    name = FAMILIES["original"]
    response = httpx2.Response(403, request=httpx2.Request("GET", "http://127.0.0.1/config.json"))

    def gated(*args, **kwargs):
        raise errors.GatedRepoError("Access to model timm/x is restricted", response=response)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", gated)
    with pytest.raises(ValueError, match=rf"hf-hub:timm/{name} is gated: accept its terms on the Hub, then pass a "
                                         "token of that account"):
        keras_vit.from_timm(name, cache_dir=tmp_path, token="hf_test")

    def failing(*args, **kwargs):
        try:
            raise errors.HfHubHTTPError("500 Server Error", response=response)
        except errors.HfHubHTTPError as cause:
            raise errors.LocalEntryNotFoundError("cannot find the requested files in the disk cache") from cause

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", failing)
    with pytest.raises(ValueError, match=r"cannot be downloaded now \(500 Server Error; HF_ENDPOINT=.*\)"):
        keras_vit.from_timm(name, cache_dir=tmp_path)


def test_a_revision_in_the_name_as_timm_writes_it(tmp_path):
    """timm's `hf-hub:timm/NAME@REVISION` was refused as "neither a local
    directory nor a Hub repository name"."""
    name = FAMILIES["original"]
    first, second = publish_two_commits(tmp_path, name)
    hub = dict(cache_dir=tmp_path, local_files_only=True)
    for source in (f"hf-hub:timm/{name}@next", f"timm/{name}@next", f"{name}@{'f' * 40}"):
        ours = keras_vit.from_timm(source, **hub)
        assert ours.get_layer("encoderblock_0").num_heads == 4, source
        assert_close_rel(ours.predict(images(), verbose=0), reference(second, images())[0], tol=1e-4)
    with pytest.raises(ValueError, match="`source` names revision 'next' and `revision` another: give one"):
        keras_vit.from_timm(f"timm/{name}@next", revision="main", **hub)


def test_offline_a_file_the_cache_knows_is_missing_is_named(tmp_path):
    """The client records files a repository does not have (`.no_exist`):
    offline, a repository without safetensors weights was told to connect
    once to download them."""
    name = FAMILIES["original"]
    config = json.dumps({"architecture": "vit_base_patch16_224", "model_args": TINY}).encode()
    snapshot = publish(tmp_path, name, files={"config.json": config})
    missing = snapshot.parent.parent / ".no_exist" / COMMIT
    missing.mkdir(parents=True)
    (missing / "model.safetensors").touch()
    with pytest.raises(ValueError, match="has no model.safetensors; keras_vit reads safetensors only"):
        keras_vit.from_timm(name, cache_dir=tmp_path, local_files_only=True)
