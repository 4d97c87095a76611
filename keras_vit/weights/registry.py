"""Registered names of the published checkpoints and their public URLs.

All files live in the public `vit_models` bucket of
google-research/vision_transformer (README, "Available ViT models" and the
AugReg table). No checksums are published for them: a download is checked
by loading it (its keys, shapes, dtypes and values must fit the model) and its
sha256 is recorded on first use (see `keras_vit.weights.cache`).
"""

import os
import re
import urllib.parse

from keras_vit.anatomy import anatomy
from keras_vit.variants import ROOT_WIDTH, VARIANTS, augreg_name
from keras_vit.weights.npz import original_format_problems

# Override with a mirror (e.g. a local copy of the bucket) through the
# environment: KERAS_VIT_WEIGHTS_URL=https://my.mirror/vit_models
DEFAULT_BASE_URL = "https://storage.googleapis.com/vit_models"

# Paper models pre-trained on ImageNet-21k: 224 px, 21,843-class head and a
# `pre_logits` layer of width D.
IMAGENET21K = {
    name: f"imagenet21k/{name}.npz"
    for name in (
        "ViT-B_8", "ViT-B_16", "ViT-B_32", "ViT-L_16", "ViT-L_32", "ViT-H_14",
        "R50+ViT-B_16", "R26+ViT-B_32", "R50+ViT-L_32",
    )
}

# The same, fine-tuned on ImageNet-2012 (1000 classes, no pre_logits), keyed
# by fine-tuning resolution.
IMAGENET21K_IMAGENET2012 = {
    "ViT-B_8": {224: "ViT-B_8.npz"},
    "ViT-B_16": {384: "ViT-B_16.npz", 224: "ViT-B_16-224.npz"},
    "ViT-B_32": {384: "ViT-B_32.npz"},
    "ViT-L_16": {384: "ViT-L_16.npz", 224: "ViT-L_16-224.npz"},
    "ViT-L_32": {384: "ViT-L_32.npz"},
    "R50+ViT-B_16": {384: "R50+ViT-B_16.npz"},
}

# The recommended AugReg checkpoint per model: best upstream validation among
# the ImageNet-21k runs (vision_transformer README, AugReg table), and its
# ImageNet-2012 fine-tuning at 384 px.
AUGREG_RECOMMENDED = {
    "ViT-Ti_16": ("Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "lr_0.03-res_384"),
    "ViT-S_16": ("S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0", "lr_0.03-res_384"),
    "ViT-S_32": ("S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0", "lr_0.01-res_384"),
    "ViT-B_8": ("B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0", "lr_0.01-res_224"),
    "ViT-B_16": ("B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0", "lr_0.03-res_384"),
    "ViT-B_32": ("B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "lr_0.01-res_384"),
    "ViT-L_16": ("L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0", "lr_0.01-res_384"),
    "R+ViT-Ti_16": ("R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "lr_0.03-res_384"),
    "R26+ViT-S_32": ("R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "lr_0.01-res_384"),
    "R50+ViT-L_32": ("R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1", "lr_0.01-res_384"),
}

# Trained on ImageNet-2012 from scratch with SAM (224 px, 1000 classes).
SAM = {name: f"sam/{name}.npz" for name in ("ViT-S_16", "ViT-B_16", "ViT-B_32", "ViT-L_16", "ViT-L_32")}

# AugReg file names (vit_jax `checkpoint.py`): upstream
# `{model}-{ds}-{epochs}ep-lr_..-aug_..-wd_..-do_..-sd_..`, optionally followed
# by `--{dataset}-steps_{n}k-lr_{lr}-res_{res}` for a fine-tuned file.
# The models are AugReg's, those of `AUGREG_RECOMMENDED` (longest first:
# "R_Ti_16" before "Ti_16").
_AUGREG_MODELS = "|".join(sorted(map(augreg_name, AUGREG_RECOMMENDED), key=len, reverse=True))
AUGREG_FILE = re.compile(
    rf"^(?P<model>{_AUGREG_MODELS})"
    r"-(i1k|i21k|i21k_30)-\d+ep-lr_[\d.]+-aug_\w+-wd_[\d.]+-do_[\d.]+-sd_[\d.]+"
    r"(--\w+-steps_\d+k-lr_[\d.]+-res_\d+)?$"
)

NAMES = ("imagenet21k", "imagenet21k+imagenet2012", "augreg", "augreg+imagenet2012", "sam")


def base_url():
    return os.environ.get("KERAS_VIT_WEIGHTS_URL", DEFAULT_BASE_URL).rstrip("/")


def registered_names(variant):
    """The registered weight names that exist for an original config name
    (`keras_vit.available_weights` accepts every alias of a model)."""
    names = []
    for name, table in (
        ("imagenet21k", IMAGENET21K),
        ("imagenet21k+imagenet2012", IMAGENET21K_IMAGENET2012),
        ("augreg", AUGREG_RECOMMENDED),
        ("augreg+imagenet2012", AUGREG_RECOMMENDED),
        ("sam", SAM),
    ):
        if variant in table:
            names.append(name)
    return names


def is_registered(weights):
    return weights in NAMES or bool(AUGREG_FILE.match(str(weights).removesuffix(".npz")))


def resolve(weights, variant, resolution=None):
    """Returns the bucket path (e.g. `augreg/B_16-....npz`) of a named checkpoint.

    Checks that the checkpoint fits the model's architecture before anything
    is downloaded.

    Args:
        weights: a name from `NAMES` or an AugReg file name.
        variant: the model's original config name (e.g. `"ViT-B_16"`).
        resolution: the model's input height, to pick among fine-tuned files.
    """
    if variant is None:
        raise ValueError(
            "Registered weights need a named variant (e.g. `ViT('ViT-B_16', "
            "weights=...)`, or `load_weights(model, weights, variant='ViT-B_16')`); "
            f"a custom-size model can load a file path. Received: weights={weights!r}, variant=None"
        )
    name = str(weights).removesuffix(".npz")
    match = AUGREG_FILE.match(name)
    if match:
        if match.group("model") != augreg_name(variant):
            raise ValueError(
                f"The AugReg checkpoint is for model {match.group('model')}, but "
                f"the model is {variant} ({augreg_name(variant)}). "
                f"Received: weights={weights!r}"
            )
        return f"augreg/{name}.npz"
    available = registered_names(variant)
    if weights not in available:
        raise ValueError(
            f"No {weights!r} checkpoint is published for {variant}. Available "
            f"names for it: {available or 'none'} (or pass a file path). "
            f"Received: weights={weights!r}, variant={variant!r}"
        )
    if weights == "imagenet21k":
        return IMAGENET21K[variant]
    if weights == "sam":
        return SAM[variant]
    if weights == "imagenet21k+imagenet2012":
        files = IMAGENET21K_IMAGENET2012[variant]
        file = files.get(resolution) or files[max(files)]
        return f"imagenet21k+imagenet2012/{file}"
    upstream, finetune = AUGREG_RECOMMENDED[variant]
    if weights == "augreg":
        return f"augreg/{upstream}.npz"
    return f"augreg/{upstream}--imagenet2012-steps_20k-{finetune}.npz"


def url(bucket_path):
    return f"{base_url()}/{urllib.parse.quote(bucket_path)}"


def check_architecture(model, variant, weights):
    """Refuses, before any download, a model whose architecture is not the
    published `variant`'s (e.g. `ViT-B_16` with `num_layers=2`)."""
    fields = VARIANTS[variant]
    parts = anatomy(model)
    hybrid = fields["resnet"] is not None
    expected = {
        "patch_size": (fields["patch_size"],) * 2,
        "hidden_size": fields["hidden_size"],
        "num_layers": fields["num_layers"],
        "mlp_dim": fields["mlp_dim"],
        "num_heads": fields["num_heads"],
        "class token": fields["classifier"] in ("token", "token_unpooled"),
        "resnet": tuple(fields["resnet"]) if hybrid else None,
        "ResNet root width": ROOT_WIDTH if hybrid else None,
        "channels": 3,  # every published file is for RGB images
    }
    actual = {
        "patch_size": parts.embedding_patch_size,
        "hidden_size": parts.hidden_size,
        "num_layers": parts.num_layers,
        "mlp_dim": parts.mlp_dim,
        "num_heads": parts.num_heads,
        "class token": parts.has_class_token,
        "resnet": parts.resnet,
        "ResNet root width": parts.resnet_width,
        "channels": parts.channels,
    }
    if not hybrid:  # a plain ViT's patch size may change: the loader PI-resizes (FlexiViT)
        del expected["patch_size"], actual["patch_size"]
    if weights == "imagenet21k" and parts.has_pre_logits:
        # These files carry the pre-training head's pre_logits of the width
        # (R = D); a model without pre_logits drops it.
        expected["representation_size"] = fields["hidden_size"]
        actual["representation_size"] = model.get_layer("pre_logits").units
    differences = [
        f"{key} {actual[key]!r} (the checkpoint's: {expected[key]!r})"
        for key in expected
        if actual[key] != expected[key]
    ] + original_format_problems(model)
    if differences:
        raise ValueError(
            f"The {weights!r} checkpoint is for the published {variant} architecture, "
            f"but this model has {', '.join(differences)}: keyword overrides (or input_shape) changed "
            "the architecture, so the checkpoint cannot load (nothing was "
            "downloaded). Build the model without them, or load a file of this "
            f"architecture by path; `variant` must name this model's architecture. "
            f"Received: weights={weights!r}, variant={variant!r}"
        )
