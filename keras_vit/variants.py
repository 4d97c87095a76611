"""The only place where model sizes are written.

Sizes: paper Table 1 (Base, Large, Huge); Ti and S come from DeiT, as used by
the AugReg paper (arXiv:2106.10270, Table 1). Configurations and their names:
google-research/vision_transformer, `vit_jax/configs/models.py`.
"""

import difflib
import re

# Transformer widths: hidden size D, MLP width, heads, blocks.
SIZES = {
    "Ti": dict(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12),
    "S": dict(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12),
    "B": dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12),
    "L": dict(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24),
    "H": dict(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32),
}

# Hybrids' ResNet root width before the width factor (`width = int(64 *
# width_factor)`, vit_jax `models_vit.py`); 64 in every published model.
ROOT_WIDTH = 64

# Every field a variant sets; any of them can be overridden by a keyword.
DEFAULTS = dict(
    patch_size=16,
    hidden_size=768,
    mlp_dim=3072,
    num_heads=12,
    num_layers=12,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    classifier="token",
    representation_size=None,
    # Hybrids: residual units per stage of the ResNet stem; `()` is the root
    # alone, None a plain ViT (patches of raw pixels).
    resnet=None,
)


def _vit(size, patch, **fields):
    return {**DEFAULTS, **SIZES[size], "patch_size": patch, **fields}


# Original config name -> fields. Dropout rates are vit_jax's fine-tuning
# values (0.1 for L/16 and H/14, chosen there by fine-tuning results).
VARIANTS = {
    "testing": {
        **DEFAULTS,
        "hidden_size": 10, "mlp_dim": 10, "num_heads": 2, "num_layers": 1,
        "dropout_rate": 0.1,
    },
    "testing-unpooled": {
        **DEFAULTS,
        "hidden_size": 10, "mlp_dim": 10, "num_heads": 2, "num_layers": 1,
        "dropout_rate": 0.1, "classifier": "unpooled",
    },
    "ViT-Ti_16": _vit("Ti", 16),
    "ViT-S_16": _vit("S", 16),
    "ViT-S_32": _vit("S", 32),
    "ViT-B_8": _vit("B", 8),
    "ViT-B_16": _vit("B", 16),
    "ViT-B_32": _vit("B", 32),
    "ViT-L_16": _vit("L", 16, dropout_rate=0.1),
    "ViT-L_32": _vit("L", 32),
    "ViT-H_14": _vit("H", 14, dropout_rate=0.1),
    # Global-average-pooled models without a representation layer, added
    # upstream for the GSAM checkpoints.
    "ViT-S_16-gap-norep": _vit("S", 16, classifier="gap"),
    "ViT-B_16-gap-norep": _vit("B", 16, classifier="gap"),
    "ViT-S_32-gap-norep": _vit("S", 32, classifier="gap"),
    "ViT-B_32-gap-norep": _vit("B", 32, classifier="gap"),
    # Hybrids (paper Sec. 3.1, 4.1): the patches are taken from a ResNet
    # feature map; "patch" is then the patch size on that map.
    # R+Ti/16 (AugReg): the root alone, then 8x8 patches. The original's
    # comment says stride 16, but its code (root conv /2, max-pool /2, patch 8)
    # gives 32: (1, 50, 192) position embeddings at 224 px; we follow the code.
    "R+ViT-Ti_16": _vit("Ti", 8, resnet=()),
    # R50 for B/16 moves stage 4's units into stage 3 (3, 4, 9), keeping
    # stride 16 (vit_jax README, 2020-12-01).
    "R50+ViT-B_16": _vit("B", 1, resnet=(3, 4, 9), dropout_rate=0.1),
    "R26+ViT-B_32": _vit("B", 1, resnet=(2, 2, 2, 2)),
    "R26+ViT-S_32": _vit("S", 1, resnet=(2, 2, 2, 2)),
    "R50+ViT-L_32": _vit("L", 1, resnet=(3, 4, 6, 3), dropout_rate=0.1),
}

# "map": attention pooling with a learned probe (SigLIP, big_vision's MAPHead).
CLASSIFIERS = ("token", "gap", "map", "unpooled", "token_unpooled")


def augreg_name(config_name):
    """AugReg name of a config ("ViT-B_16" -> "B_16", "R50+ViT-L_32" -> "R50_L_32")."""
    return config_name.replace("ViT-", "").replace("+", "_")


def _paper_architecture(config_name):
    """The architectures of the paper's and AugReg's checkpoints: every
    variant but the test configs and the GSAM heads (`-gap-norep`)."""
    return not config_name.startswith("testing") and "gap" not in config_name


def constructor_name(config_name):
    """The keras.applications-style function of a config ("ViT-B_16" ->
    "ViTB16", "R50+ViT-B_16" -> "R50ViTB16", "R+ViT-Ti_16" -> "RViTTi16")."""
    return re.sub(r"[-_+]", "", config_name)


# vit_jax's AUGREG_CONFIGS: the same architectures under short names,
# fine-tuned with dropout 0 (vit_jax `configs/augreg.py`).
AUGREG_NAMES = {augreg_name(name): name for name in VARIANTS if _paper_architecture(name)}

# Constructor name -> config name: `keras_vit.ViTB16`, ... (one per paper
# architecture; `keras_vit.models.vit` makes them).
CONSTRUCTORS = {constructor_name(name): name for name in VARIANTS if _paper_architecture(name)}


def short_name(name):
    """An AugReg name from its big_vision spelling ("R26+S/32" -> "R26_S_32");
    other names unchanged."""
    return name.replace("/", "_").replace("+", "_")


def _spelling(name):
    return re.sub(r"[^a-z0-9]", "", name.lower())


def resolve_variant(name):
    """Returns `(config_name, fields)` for an original, constructor or AugReg name.

    Accepts "ViT-B_16", "ViT-B_16-gap-norep", "testing", constructor names
    such as "ViTB16", AugReg names such as "B_16" and big_vision-style
    "B/16". The short (AugReg, big_vision) names fine-tune with dropout 0, as
    vit_jax's `configs/augreg.py` does.
    """
    if not isinstance(name, str):
        raise ValueError(f"`variant` must be a string. Received: variant={name!r}")
    if name in VARIANTS or name in CONSTRUCTORS:
        config_name = CONSTRUCTORS.get(name, name)
        return config_name, dict(VARIANTS[config_name])
    short = short_name(name)
    if short in AUGREG_NAMES:
        config_name = AUGREG_NAMES[short]
        return config_name, {**VARIANTS[config_name], "dropout_rate": 0.0}
    # Suggestions compare names spelling aside (case and "-", "_", "/",
    # "+"): "b/16" is "B_16", a model's own name "vit_b_16" is "ViT-B_16".
    spelled = {}
    for known_name in (*VARIANTS, *CONSTRUCTORS, *AUGREG_NAMES):
        spelled.setdefault(_spelling(known_name), known_name)
    key = _spelling(name)
    close = [spelled[key]] if key in spelled else [spelled[k] for k in difflib.get_close_matches(key, spelled, 3)]
    raise ValueError(
        "Unknown ViT variant." + (f" Did you mean {' or '.join(map(repr, close))}?" if close else "")
        + f" Known names: {sorted(VARIANTS)}, the constructors' {sorted(CONSTRUCTORS)} and the AugReg "
        f"names {sorted(AUGREG_NAMES)}. Received: variant={name!r}"
    )


def model_name(config_name):
    """A Keras model name valid on every backend ("ViT-B_16" -> "vit_b_16")."""
    return re.sub(r"[^a-z0-9]+", "_", config_name.lower()).strip("_")
