"""timm's ViT families in keras_vit: for each family's options (tiny sizes,
random weights), the timm model's state dict loads into the keras_vit model
that `keras_vit.weights.timm.builder_kwargs` describes, and the logits and
the pre-logit features equal timm's within 1e-4 of their largest magnitude,
on every backend."""

import functools

import numpy as np
import pytest

import keras_vit
from keras_vit.weights import timm as timm_weights
from tests.helpers import assert_close_rel

pytestmark = pytest.mark.timm
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
# Each family's VisionTransformer arguments, as timm's model definitions give
# them (timm/models/vision_transformer.py), at tiny sizes.
FAMILIES = {
    "augreg": dict(),  # also DeiT and DINO: the original architecture, exact GELU
    "deit3": dict(init_values=1e-6, no_embed_class=True),
    "dinov2": dict(init_values=1e-5, patch_size=7, img_size=28),
    "dinov2_registers": dict(init_values=1e-5, reg_tokens=4, no_embed_class=True, patch_size=7, img_size=28),
    "clip_openai": dict(pre_norm=True, act_layer="quick_gelu", layer_norm_eps=1e-5),
    "clip_laion": dict(pre_norm=True, layer_norm_eps=1e-5),
    "gap_fc_norm": dict(global_pool="avg", class_token=False),
    "siglip": dict(class_token=False, global_pool="map"),
    "qk_norm": dict(qk_norm=True, init_values=1e-5),
    "siglip2_tanh": dict(class_token=False, global_pool="map", act_layer="gelu_tanh"),
    "features_only": dict(num_classes=0),
    # Attention pooling with prefix tokens: timm leaves them out by default.
    "map_class_token": dict(global_pool="map"),
    "map_registers_included": dict(class_token=False, reg_tokens=1, global_pool="map", pool_include_prefix=True),
    "gap_class_token_included": dict(global_pool="avg", pool_include_prefix=True),
}


def _timm_model(args):
    args = dict(args)
    eps = args.pop("layer_norm_eps", 1e-6)
    torch.manual_seed(0)
    model = timm.models.vision_transformer.VisionTransformer(
        **args, norm_layer=functools.partial(torch.nn.LayerNorm, eps=eps))
    with torch.no_grad():  # every weight random, LayerScale's too (not ~1e-6)
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_loads_with_timms_logits_and_features(family):
    args = {**TINY, **FAMILIES[family]}
    reference = _timm_model(args)
    state = {key: value.detach().numpy() for key, value in reference.state_dict().items()}
    model = keras_vit.ViT(None, **timm_weights.builder_kwargs(args))
    timm_weights.load_timm_state(model, state)
    size = args["img_size"]
    images = np.random.default_rng(1).uniform(-1, 1, (2, 3, size, size)).astype("float32")
    with torch.no_grad():
        expected = reference(torch.from_numpy(images)).numpy()
        features = reference.forward_head(reference.forward_features(torch.from_numpy(images)),
                                          pre_logits=True).numpy()
    got = model.predict(images.transpose(0, 2, 3, 1), verbose=0)
    assert_close_rel(got, expected, tol=1e-4)
    if args["num_classes"]:  # the pooled, normalised features before the head
        backbone = keras_vit.ViT(None, **{**timm_weights.builder_kwargs({**args, "num_classes": 0})})
        backbone.set_weights([w for w in model.get_weights()][:len(backbone.weights)])
        assert_close_rel(backbone.predict(images.transpose(0, 2, 3, 1), verbose=0), features, tol=1e-4)


@pytest.mark.parametrize("family", ["siglip", "gap_fc_norm"])
def test_the_token_sequence_is_timms_forward_features(family):
    """`include_top=False, pooling=None` of a checkpoint whose head pools by
    attention (SigLIP) or normalises after averaging (`fc_norm`): those
    keys were refused as another architecture, so the dense features of
    such a checkpoint could not be had."""
    args = {**TINY, **FAMILIES[family]}
    reference = _timm_model(args)
    state = {key: value.detach().numpy() for key, value in reference.state_dict().items()}
    model = keras_vit.ViT(None, **{**timm_weights.builder_kwargs(args), "include_top": False, "pooling": None,
                                   "num_classes": None})
    notes = timm_weights.load_timm_state(model, state)
    assert [note for note in notes if "left out (the model returns the token sequence)" in note]
    images = np.random.default_rng(1).uniform(-1, 1, (2, 3, 32, 32)).astype("float32")
    with torch.no_grad():
        expected = reference.forward_features(torch.from_numpy(images)).numpy()
    assert_close_rel(model.predict(images.transpose(0, 2, 3, 1), verbose=0), expected, tol=1e-4)
    # A model that pools still refuses them: a missing fc_norm would change its numbers.
    pooled = keras_vit.ViT(None, **{**timm_weights.builder_kwargs(args), "fc_norm": False, "classifier": "gap"})
    with pytest.raises(ValueError, match="fc_norm|attn_pool"):
        timm_weights.load_timm_state(pooled, state)


def test_a_state_dict_of_other_options_is_refused_and_nothing_changes():
    args = {**TINY, **FAMILIES["deit3"]}
    state = {k: v.detach().numpy() for k, v in _timm_model(args).state_dict().items()}
    model = keras_vit.ViT(None, **timm_weights.builder_kwargs({**TINY}))
    before = model.get_weights()
    with pytest.raises(ValueError, match="ls1.gamma"):
        timm_weights.load_timm_state(model, state)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    # Another width whose heads cannot split timm's matrices: the same
    # report, each key with its shapes, not numpy's reshape error.
    wider = keras_vit.ViT(None, **timm_weights.builder_kwargs({**TINY, "embed_dim": 48, "num_heads": 3}))
    before = wider.get_weights()
    with pytest.raises(ValueError, match=r"does not fit the model(.|\n)*blocks.0.attn.proj.weight: \(32, 32\) "
                                         r"\(timm's layout\) -> \(3, 16, 48\) expected"):
        timm_weights.load_timm_state(wider, {k: v for k, v in state.items() if ".ls" not in k})
    assert all(np.array_equal(a, b) for a, b in zip(before, wider.get_weights()))


@pytest.mark.one_backend  # numpy only
@pytest.mark.parametrize("arg, value", [("qkv_bias", False), ("global_pool", "max"), ("act_layer", "silu"),
                                        ("proj_bias", False), ("dynamic_img_pad", True),
                                        ("global_pool", "")])  # a head on every token
def test_options_keras_vit_cannot_express_are_named(arg, value):
    with pytest.raises(ValueError, match=arg):
        timm_weights.builder_kwargs({arg: value})


@pytest.mark.one_backend  # numpy only
@pytest.mark.parametrize("new", [(6, 6), (3, 2), (8, 13), (4, 5)])
def test_bicubic_antialias_is_pytorchs(new):
    """timm resamples position embeddings with PyTorch's antialiased bicubic
    (Keys' kernel with a = -0.5, widened when shrinking)."""
    from keras_vit.layers.position_embedding import resample_grid

    grid = np.random.default_rng(0).normal(size=(4, 5, 3)).astype("float32")
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(grid).permute(2, 0, 1)[None], size=new, mode="bicubic", antialias=True,
        align_corners=False)[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(resample_grid(grid, new, "bicubic_antialias"), expected, atol=2e-6)


@pytest.mark.parametrize("family", ["augreg", "dinov2_registers"])
def test_a_dynamic_size_model_matches_timms_dynamic_img_size(family):
    """`input_shape=(None, None, 3)` with timm's resampling against timm's
    `dynamic_img_size=True` at sizes other than the stored one (issue 25)."""
    args = {**TINY, **FAMILIES[family]}
    reference = _timm_model({**args, "dynamic_img_size": True})
    state = {key: value.detach().numpy() for key, value in reference.state_dict().items()}
    stored = args["img_size"]
    model = keras_vit.ViT(None, **{**timm_weights.builder_kwargs(args), "input_shape": (None, None, 3)},
                          image_size=stored, posemb_interpolation="bicubic_antialias")
    timm_weights.load_timm_state(model, state)
    patch = args["patch_size"]
    for rows, cols in [(stored // patch + 2, stored // patch), (2, 3)]:
        images = np.random.default_rng(2).uniform(-1, 1, (2, 3, rows * patch, cols * patch)).astype("float32")
        with torch.no_grad():
            expected = reference(torch.from_numpy(images)).numpy()
        assert_close_rel(model.predict_on_batch(images.transpose(0, 2, 3, 1)), expected, 1e-4, f"{family} {rows}x{cols}")
