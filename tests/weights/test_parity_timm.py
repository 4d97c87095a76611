"""Numerical parity with timm, an independent implementation, on the same
weights: keras_vit exports an original-format `.npz`, timm reads it with its
own loader (its own key mapping), and logits, pooled features and tokens must
agree within 1e-4 of the largest reference value.

timm is configured with the original's conventions: tanh GELU and LayerNorm
epsilon 1e-6 (its default). Resolution changes are checked against the
original's algorithm, `scipy.ndimage.zoom(order=1)` on the grid rows, applied
to the reference checkpoint (timm's loader resamples differently).
"""

import functools

import keras
import numpy as np
import pytest
import scipy.ndimage

import keras_vit
from keras_vit.weights.npz import POSEMB_KEY
from tests.helpers import assert_close_rel, randomize_weights

# timm is the reference here; the lowest-versions run (requirements/lowest.txt)
# has no timm and deselects these with -m 'not timm'.
pytestmark = pytest.mark.timm

torch = pytest.importorskip("torch")
timm_vit = pytest.importorskip("timm.models.vision_transformer")

SIZE = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, patch_size=8)


def timm_model(npz_path, image_size, classifier="token", num_classes=5):
    model = timm_vit.VisionTransformer(
        img_size=image_size,
        patch_size=SIZE["patch_size"],
        embed_dim=SIZE["hidden_size"],
        depth=SIZE["num_layers"],
        num_heads=SIZE["num_heads"],
        mlp_ratio=SIZE["mlp_dim"] / SIZE["hidden_size"],
        num_classes=num_classes,
        class_token=classifier == "token",
        global_pool="token" if classifier == "token" else "avg",
        fc_norm=False,  # The original pools after encoder_norm.
        act_layer=functools.partial(torch.nn.GELU, approximate="tanh"),
    )
    timm_vit._load_weights(model, str(npz_path))
    return model.eval()


def timm_outputs(model, images):
    with torch.no_grad():
        x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
        tokens = model.forward_features(x)
        pooled = model.forward_head(tokens, pre_logits=True)
        logits = model.forward_head(tokens)
    return tokens.numpy(), pooled.numpy(), logits.numpy()


def keras_outputs(model_kwargs, images, weights):
    outputs = []
    for kwargs in (
        dict(include_top=False),
        dict(include_top=False, pooling=model_kwargs.get("classifier", "token")),
        dict(include_top=True),
    ):
        model = keras_vit.ViT(None, weights=weights, **SIZE, **model_kwargs, **kwargs)
        outputs.append(keras.ops.convert_to_numpy(model(images)))
    return outputs


def images_for(shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (2, *shape)).astype("float32")


def make_checkpoint(tmp_path, classifier="token", shape=(48, 48), **kwargs):
    model = keras_vit.ViT(
        None, input_shape=(*shape, 3), num_classes=5, classifier=classifier, **SIZE, **kwargs
    )
    randomize_weights(model, scale=0.3)
    path = tmp_path / f"{classifier}.npz"
    keras_vit.export_npz(model, path)
    return path


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_logits_features_and_tokens_match_timm(tmp_path, classifier):
    path = make_checkpoint(tmp_path, classifier)
    images = images_for((48, 48, 3))
    expected = timm_outputs(timm_model(path, 48, classifier), images)
    actual = keras_outputs(
        dict(classifier=classifier, num_classes=5, input_shape=(48, 48, 3)), images, str(path)
    )
    for what, a, e in zip(("tokens", "pooled", "logits"), actual, expected):
        assert_close_rel(a, e, what=what)


def test_representation_size_matches_timm_features_plus_tanh_layer(tmp_path):
    path = make_checkpoint(tmp_path, representation_size=24)
    arrays = dict(np.load(path))
    assert arrays["pre_logits/kernel"].shape == (32, 24)
    # timm has no representation layer: load the encoder and apply the
    # checkpoint's pre_logits (Dense + tanh) and head by hand.
    trimmed = {k: v for k, v in arrays.items() if not k.startswith(("pre_logits", "head"))}
    trimmed_path = tmp_path / "encoder_only.npz"
    np.savez(trimmed_path, **trimmed)
    reference = timm_model(trimmed_path, 48, num_classes=0)
    images = images_for((48, 48, 3), seed=1)
    _, features, _ = timm_outputs(reference, images)
    pre_logits = np.tanh(features @ arrays["pre_logits/kernel"] + arrays["pre_logits/bias"])
    logits = pre_logits @ arrays["head/kernel"] + arrays["head/bias"]

    kwargs = dict(representation_size=24, input_shape=(48, 48, 3), num_classes=5)
    _, pooled, actual_logits = keras_outputs(kwargs, images, str(path))
    assert_close_rel(pooled, pre_logits, what="pre_logits")
    assert_close_rel(actual_logits, logits, what="logits")


def original_interpolate_posembed(posemb, new_grid, has_class_token):
    """The original's resampling: scipy.ndimage.zoom(order=1) of the grid rows."""
    prefix = 1 if has_class_token else 0
    head, grid = posemb[:, :prefix], posemb[0, prefix:]
    side = int(np.sqrt(len(grid)))
    grid = grid.reshape(side, side, -1)
    zoom = (new_grid[0] / side, new_grid[1] / side, 1)
    grid = scipy.ndimage.zoom(grid, zoom, order=1)
    return np.concatenate([head, grid.reshape(1, -1, grid.shape[-1])], axis=1)


@pytest.mark.parametrize(
    "classifier, target", [("token", (80, 80)), ("token", (48, 80)), ("gap", (64, 40))]
)
def test_checkpoint_loaded_at_another_resolution(tmp_path, classifier, target):
    path = make_checkpoint(tmp_path, classifier)  # trained at 48x48: 6x6 grid.
    arrays = dict(np.load(path))
    grid = (target[0] // 8, target[1] // 8)
    arrays[POSEMB_KEY] = original_interpolate_posembed(
        arrays[POSEMB_KEY], grid, classifier == "token"
    )
    resampled_path = tmp_path / "resampled.npz"
    np.savez(resampled_path, **arrays)
    images = images_for((*target, 3), seed=2)
    expected = timm_outputs(timm_model(resampled_path, target, classifier), images)
    actual = keras_outputs(
        dict(classifier=classifier, num_classes=5, input_shape=(*target, 3)), images, str(path)
    )
    for what, a, e in zip(("tokens", "pooled", "logits"), actual, expected):
        assert_close_rel(a, e, what=what)
