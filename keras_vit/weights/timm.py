"""timm's `VisionTransformer` weights in a keras_vit model, and its options.

timm (`timm/models/vision_transformer.py`) stores PyTorch layouts under its
own names; `timm_variables` maps each key to the keras_vit variable and the
layout change between the two (both ways), so that a state dict (numpy
arrays, e.g. read from `model.safetensors`) loads with timm's numbers and a
keras_vit model exports to timm. `builder_kwargs` says which keras_vit
builder keywords express timm's constructor arguments: a checkpoint needing
anything else is refused by name. `architecture_args` reads timm's model
names, `config_args` its Hub `config.json`.
"""

import re

import numpy as np

from keras_vit import interrupts
from keras_vit.anatomy import anatomy, get_layer
from keras_vit.layers.patch_embedding import resize_patch_embedding

# timm's `act_layer` names -> keras_vit's `gelu`.
TIMM_GELUS = {"gelu": "exact", "gelu_tanh": "tanh", "quick_gelu": "quick"}


class Layout:
    """A layout change: `layout(timm_array)` is the Keras array,
    `layout.back(keras_array)` timm's."""

    def __init__(self, to_keras, to_timm):
        self.to_keras, self.back = to_keras, to_timm

    def __call__(self, value):
        return self.to_keras(value)


def _transpose(*axes):
    return Layout(lambda value: np.transpose(value, axes), lambda value: np.transpose(value, np.argsort(axes)))


def _heads(num_heads, out=False):
    """A PyTorch Linear's (out, in) weight as a Keras attention kernel:
    `(in, heads, head_dim)`, or `(heads, head_dim, out)` for the output;
    biases `(heads, head_dim)`, the output's `(D,)` as it is."""
    def to_keras(value):
        if value.ndim == 1:
            return value if out else value.reshape(num_heads, -1)
        if out:
            return value.T.reshape(num_heads, -1, value.shape[0])
        return value.T.reshape(value.shape[1], num_heads, -1)

    def to_timm(value):
        if out:
            return value if value.ndim == 1 else value.reshape(-1, value.shape[-1]).T
        return value.reshape(-1) if value.ndim == 2 else value.reshape(value.shape[0], -1).T
    return Layout(to_keras, to_timm)


_same = Layout(lambda value: value, lambda value: value)


def _linear(prefix, layer):
    out = {f"{prefix}.weight": (layer.kernel, _transpose(1, 0))}
    if layer.bias is not None:
        out[f"{prefix}.bias"] = (layer.bias, _same)
    return out


def _norm(prefix, layer):
    return {f"{prefix}.weight": (layer.gamma, _same), f"{prefix}.bias": (layer.beta, _same)}


def timm_variables(model):
    """`{timm key: (variable, layout)}` for a keras_vit model: `layout`
    takes timm's array to the variable's (`Layout`). timm's fused `qkv` and
    `kv` are listed per part, `....attn.qkv.weight/q` etc. (`split_qkv`)."""
    parts = anatomy(model)
    embedding = get_layer(model, "embedding")
    mapping = {"patch_embed.proj.weight": (embedding.kernel, _transpose(2, 3, 1, 0))}
    if embedding.bias is not None:
        mapping["patch_embed.proj.bias"] = (embedding.bias, _same)
    names = {layer.name for layer in model.layers}
    if parts.has_class_token:
        mapping["cls_token"] = (get_layer(model, "cls").cls, _same)
    if "registers" in names:
        mapping["reg_token"] = (model.get_layer("registers").cls, _same)
    mapping["pos_embed"] = (get_layer(model, "posembed_input").pos_embedding, _same)
    for name, key in (("pre_norm", "norm_pre"), ("encoder_norm", "norm"), ("fc_norm", "fc_norm")):
        if name in names:
            mapping.update(_norm(key, model.get_layer(name)))
    for i, block_name in enumerate(parts.block_names):
        block, prefix = model.get_layer(block_name), f"blocks.{i}"
        attention, heads = block.attention, block.num_heads
        mapping.update(_norm(f"{prefix}.norm1", block.layer_norm_0))
        mapping.update(_norm(f"{prefix}.norm2", block.layer_norm_2))
        for part, dense in zip("qkv", (attention.query_dense, attention.key_dense, attention.value_dense)):
            mapping[f"{prefix}.attn.qkv.weight/{part}"] = (dense.kernel, _heads(heads))
            mapping[f"{prefix}.attn.qkv.bias/{part}"] = (dense.bias, _heads(heads))
        if block.qk_norm:
            mapping.update(_norm(f"{prefix}.attn.q_norm", attention.query_norm))
            mapping.update(_norm(f"{prefix}.attn.k_norm", attention.key_norm))
        mapping[f"{prefix}.attn.proj.weight"] = (attention.output_dense.kernel, _heads(heads, out=True))
        mapping[f"{prefix}.attn.proj.bias"] = (attention.output_dense.bias, _same)
        mapping.update(_linear(f"{prefix}.mlp.fc1", block.mlp.dense_0))
        mapping.update(_linear(f"{prefix}.mlp.fc2", block.mlp.dense_1))
        if block.layer_scale_init is not None:
            mapping[f"{prefix}.ls1.gamma"] = (block.layer_scales[0], _same)
            mapping[f"{prefix}.ls2.gamma"] = (block.layer_scales[1], _same)
    if "map_head" in names:
        pool = model.get_layer("map_head")
        attention, heads = pool.attention, pool.attention.num_heads
        mapping["attn_pool.latent"] = (pool.probe, _same)
        for key, dense in (("q.weight", attention.query_dense), ("kv.weight/k", attention.key_dense),
                           ("kv.weight/v", attention.value_dense)):
            mapping[f"attn_pool.{key}"] = (dense.kernel, _heads(heads))
            mapping[f"attn_pool.{key.replace('weight', 'bias')}"] = (dense.bias, _heads(heads))
        mapping["attn_pool.proj.weight"] = (attention.output_dense.kernel, _heads(heads, out=True))
        mapping["attn_pool.proj.bias"] = (attention.output_dense.bias, _same)
        mapping.update(_norm("attn_pool.norm", pool.layer_norm))
        mapping.update(_linear("attn_pool.mlp.fc1", pool.mlp.dense_0))
        mapping.update(_linear("attn_pool.mlp.fc2", pool.mlp.dense_1))
    if "head" in names:
        mapping.update(_linear("head", model.get_layer("head")))
    return mapping


# timm's fused projections: rows q, k, v (or k, v), each head after head.
FUSED = {".attn.qkv.weight": "qkv", ".attn.qkv.bias": "qkv", "attn_pool.kv.weight": "kv", "attn_pool.kv.bias": "kv"}


def _fused_parts(key):
    return next((parts for suffix, parts in FUSED.items() if key.endswith(suffix)), None)


def split_qkv(state):
    """timm's fused `attn.qkv` and `attn_pool.kv` as one entry per part
    (`....attn.qkv.weight/q`, ...: the keys `timm_variables` lists)."""
    out = {}
    for key, value in state.items():
        parts = _fused_parts(key)
        if parts:
            for part, piece in zip(parts, np.split(np.asarray(value), len(parts), axis=0)):
                out[f"{key}/{part}"] = piece
        else:
            out[key] = np.asarray(value)
    return out


def _fit_posemb(value, variable, prefix, grid, interpolation, notes, source_grid=None, recorded_grid=None):
    """timm's position embedding resampled to the model's `grid` (the
    `prefix` rows kept), as timm's `checkpoint_filter_fn` does (antialiased
    bicubic by default): when the token count differs, or when the
    checkpoint's grid is known and is not the model's. That grid is
    `source_grid`, else `recorded_grid` (its config's) where that holds its
    tokens, else square."""
    from keras_vit.layers.position_embedding import infer_square_grid, resample_position_embedding

    if value.ndim != 3 or value.shape[2] != variable.shape[2]:
        return value  # the shape check reports it
    tokens = value.shape[1] - prefix
    if source_grid is None and recorded_grid is not None and recorded_grid[0] * recorded_grid[1] == tokens:
        source_grid = recorded_grid
    if source_grid is None:
        if value.shape == tuple(variable.shape):
            return value
        source_grid = infer_square_grid(tokens)
    elif source_grid[0] * source_grid[1] != tokens:
        raise ValueError(f"source_grid={tuple(source_grid)} does not hold the checkpoint's {tokens} grid tokens. "
                         f"Received: source_grid={tuple(source_grid)}")
    if tuple(source_grid) == tuple(grid) and value.shape == tuple(variable.shape):
        return value
    notes.append(f"position embeddings resampled from a {source_grid[0]}x{source_grid[1]} to a "
                 f"{grid[0]}x{grid[1]} grid ({interpolation}).")
    return resample_position_embedding(value, grid, source_grid, num_prefix_tokens=prefix,
                                       interpolation=interpolation)


def load_timm_state(model, state, interpolation="bicubic_antialias", source_grid=None, allow_nonfinite=False,
                    recorded_grid=None):
    """Loads a timm `VisionTransformer` state dict (`{key: numpy array}`)
    into `model`, all or nothing, and returns the notes on what was adapted.

    Every key but the head's must have its variable and shape, and every
    variable its key; else a ValueError lists the differences and nothing is
    assigned. The position embedding is resampled to the model's grid
    (`interpolation`: `"bicubic_antialias"`, timm's, `"bicubic"` or
    `"linear"`). A checkpoint head of another size than the model's, or
    none, or a model with a `pre_logits` layer (which timm's have not),
    leaves the model's head as it is (zero when built: the paper's
    fine-tuning start); a model without a head ignores the checkpoint's.
    `source_grid`: `(rows, cols)` of a non-square checkpoint's patch grid;
    when None, `recorded_grid` (its config's) if it holds the grid's
    tokens, else square. `allow_nonfinite`: load NaN or infinite values
    instead of refusing them.
    """
    parts = anatomy(model)
    arrays = split_qkv(state)
    mapping = timm_variables(model)
    notes = []
    head_keys = {key for key in set(arrays) | set(mapping) if key.startswith("head.")}
    head_fits = all(key in arrays and key in mapping and _fits(mapping[key], arrays[key]) for key in head_keys)
    if parts.has_pre_logits:  # timm has no pre_logits layer: a head fed by it is another head
        notes.append("pre_logits: not in timm checkpoints; the model's is kept as built.")
    if head_keys and (parts.has_pre_logits or not head_fits):
        if parts.has_pre_logits and any(key in arrays for key in head_keys):
            notes.append("head: the checkpoint's reads the features, the model's its pre_logits layer; the "
                         "model's is kept.")
        elif not any(key in arrays for key in head_keys):
            notes.append("head: the checkpoint has none; the model's is kept.")
        elif any(key in mapping for key in head_keys):
            notes.append("head: the checkpoint's has other classes; the model's is kept.")
        else:
            notes.append("head: the checkpoint's is left out (the model has none).")
        arrays = {k: v for k, v in arrays.items() if k not in head_keys}
        mapping = {k: v for k, v in mapping.items() if k not in head_keys}
    names = {layer.name for layer in model.layers}
    if not names & {"head", "pool", "map_head"}:
        # The token sequence (`include_top=False, pooling=None`): timm's
        # `forward_features`, before the head's fc_norm and attention pooling.
        for prefix in ("fc_norm.", "attn_pool."):
            if any(key.startswith(prefix) for key in arrays):
                notes.append(f"{prefix[:-1]}: the checkpoint's is left out (the model returns the token sequence).")
                arrays = {k: v for k, v in arrays.items() if not k.startswith(prefix)}
    missing = sorted(set(mapping) - set(arrays))
    unexpected = sorted(set(arrays) - set(mapping))
    converted, wrong = {}, []
    if "pos_embed" in arrays and "pos_embed" in mapping and not (missing or unexpected):
        try:
            arrays["pos_embed"] = _fit_posemb(arrays["pos_embed"], mapping["pos_embed"][0],
                                              parts.posemb_prefix_tokens, parts.grid, interpolation, notes,
                                              source_grid, recorded_grid)
        except ValueError as error:
            wrong.append(f"pos_embed: {error}")
    kernel = arrays.get("patch_embed.proj.weight")
    target = parts.embedding_patch_size
    if kernel is not None and kernel.ndim == 4 and tuple(kernel.shape[2:]) != target and not parts.hybrid:
        # Another patch size: PI-resized (FlexiViT), in timm's (D, C, ph, pw) layout.
        resized = resize_patch_embedding(np.transpose(kernel, (2, 3, 1, 0)), target)
        arrays["patch_embed.proj.weight"] = np.transpose(resized, (3, 2, 0, 1))
        notes.append(f"patch embedding PI-resized from {kernel.shape[2]}x{kernel.shape[3]} to "
                     f"{target[0]}x{target[1]} patches (FlexiViT).")
    for key in sorted(set(mapping) & set(arrays)):
        variable, layout = mapping[key]
        try:
            value = layout(arrays[key])
        except ValueError:  # a head split that cannot be done: another width or number of heads
            wrong.append(f"{key}: {tuple(np.shape(arrays[key]))} (timm's layout) -> {tuple(variable.shape)} expected")
            continue
        if tuple(value.shape) != tuple(variable.shape):
            wrong.append(f"{key}: {tuple(value.shape)} -> {tuple(variable.shape)} expected")
        elif not np.issubdtype(value.dtype, np.floating):
            wrong.append(f"{key}: not floats ({value.dtype})")
        elif not allow_nonfinite and not np.all(np.isfinite(value)):
            wrong.append(f"{key}: NaN or infinite values (pass allow_nonfinite=True to load them anyway)")
        converted[key] = value
    if missing or unexpected or wrong:
        lines = [f"missing: {', '.join(missing[:8])}" if missing else "",
                 f"not in the model: {', '.join(unexpected[:8])}" if unexpected else "",
                 *wrong[:8]]
        raise ValueError(
            "The timm state dict does not fit the model (a checkpoint of another architecture or "
            "options); nothing was loaded:\n" + "\n".join(line for line in lines if line)
        )
    with interrupts.held_back("the weights are assigned"):  # all or nothing, Ctrl-C too
        for key, value in converted.items():
            variable = mapping[key][0]
            variable.assign(value.astype(variable.dtype))
    return notes


def _fits(entry, value):
    """Whether timm's `value` fits the `(variable, layout)` entry's shape."""
    variable, layout = entry
    try:
        return tuple(layout(value).shape) == tuple(variable.shape)
    except ValueError:  # a reshape that cannot be done
        return False


# timm's defaults for the arguments `builder_kwargs` reads
# (`VisionTransformer.__init__`).
_TIMM_DEFAULTS = dict(
    img_size=224, patch_size=16, in_chans=3, num_classes=1000, global_pool="token", embed_dim=768, depth=12,
    num_heads=12, mlp_ratio=4.0, qkv_bias=True, qk_norm=False, proj_bias=True, init_values=None, class_token=True,
    no_embed_class=False, reg_tokens=0, pre_norm=False, final_norm=True, fc_norm=None, act_layer="gelu",
    layer_norm_eps=1e-6, pool_include_prefix=False,
)
# timm's `global_pool` -> keras_vit's classifier (and pooling).
TIMM_POOLS = {"token": "token", "avg": "gap", "map": "map"}
# The values keras_vit cannot express: the argument must keep timm's default.
_FIXED = ("qkv_bias", "proj_bias", "final_norm", "in_chans")


def builder_kwargs(args):
    """keras_vit `ViT` keywords for timm `VisionTransformer` arguments
    (`args`: timm's names; `act_layer` as a name, `layer_norm_eps` the
    epsilon of timm's `norm_layer`). An argument keras_vit cannot express is
    a ValueError naming it."""
    known = set(_TIMM_DEFAULTS) | {"dynamic_img_size", "drop_rate", "pos_drop_rate", "attn_drop_rate",
                                   "proj_drop_rate", "drop_path_rate", "weight_init"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"keras_vit has no equivalent of timm's {', '.join(unknown)}. "
                         f"Received: {', '.join(f'{k}={args[k]!r}' for k in unknown)}")
    a = {**_TIMM_DEFAULTS, **args}
    for name in _FIXED:
        if a[name] != _TIMM_DEFAULTS[name]:
            raise ValueError(f"keras_vit has no equivalent of timm's {name}={a[name]!r} "
                             f"(only {_TIMM_DEFAULTS[name]!r}). Received: {name}={a[name]!r}")
    if a["global_pool"] not in (*TIMM_POOLS, ""):
        raise ValueError(f"keras_vit has no equivalent of timm's global_pool={a['global_pool']!r} "
                         "(token, avg, map or none). Received: global_pool=" + repr(a["global_pool"]))
    if a["act_layer"] not in TIMM_GELUS:
        raise ValueError(f"keras_vit has no equivalent of timm's act_layer={a['act_layer']!r} "
                         f"(one of {sorted(TIMM_GELUS)}). Received: act_layer={a['act_layer']!r}")
    if a["num_classes"] > 0 and not a["global_pool"]:
        raise ValueError("keras_vit has no equivalent of timm's unpooled classifier (a head on every token). "
                         f"Received: global_pool='', num_classes={a['num_classes']}")
    size = a["img_size"]
    size = (size, size) if isinstance(size, int) else tuple(size)
    pooled = a["global_pool"] or "token"
    kwargs = dict(
        input_shape=(*size, 3), patch_size=a["patch_size"], hidden_size=a["embed_dim"], num_layers=a["depth"],
        num_heads=a["num_heads"], mlp_dim=int(a["embed_dim"] * a["mlp_ratio"]),
        classifier=TIMM_POOLS[pooled], class_token=bool(a["class_token"]),
        num_register_tokens=a["reg_tokens"], no_embed_class=bool(a["no_embed_class"]),
        layer_scale_init=a["init_values"], pre_norm=bool(a["pre_norm"]),
        # timm: None means "after pooling for average pooling".
        fc_norm=pooled == "avg" if a["fc_norm"] is None else bool(a["fc_norm"]),
        # timm's patch embedding has no bias under a pre-norm (CLIP).
        patch_bias=not a["pre_norm"], gelu=TIMM_GELUS[a["act_layer"]], layer_norm_epsilon=a["layer_norm_eps"],
        qk_norm=bool(a["qk_norm"]), pool_include_prefix=bool(a["pool_include_prefix"]),
        representation_size=None, include_top=a["num_classes"] > 0,
    )
    if a["num_classes"] > 0:
        kwargs["num_classes"] = a["num_classes"]
    else:
        kwargs["pooling"] = TIMM_POOLS[pooled] if a["global_pool"] else None
    return kwargs


# ---------------------------------------------------------------------------
# timm's architecture names: the entry points' arguments, by family
# (timm/models/vision_transformer.py and deit.py).
# ---------------------------------------------------------------------------

# name -> (embed_dim, depth, num_heads, mlp_ratio)
TIMM_SIZES = {
    "tiny": (192, 12, 3, 4.0), "small": (384, 12, 6, 4.0), "medium": (512, 12, 8, 4.0), "base": (768, 12, 12, 4.0),
    "large": (1024, 24, 16, 4.0), "huge": (1280, 32, 16, 4.0), "so400m": (1152, 27, 16, 3.7362),
}
_ARCHITECTURE = re.compile(
    r"^(?P<kind>vit|deit3|deit)_(?P<size>[a-z0-9]+)_patch(?P<patch>\d+)"
    r"(?:_reg(?P<registers>\d+))?(?P<family>(?:_[a-z][a-z0-9]*)*?)(?:_(?P<res>\d+))?$")
# Each family's arguments beyond the size (timm's entry points).
TIMM_FAMILIES = {
    "": {},  # the original architecture (AugReg, DeiT, DINO weights), exact GELU in timm
    "deit3": dict(no_embed_class=True, init_values=1e-6),
    "dinov2": dict(init_values=1e-5, img_size=518),
    "clip": dict(pre_norm=True, layer_norm_eps=1e-5),
    "clip_quickgelu": dict(pre_norm=True, layer_norm_eps=1e-5, act_layer="quick_gelu"),
    "siglip": dict(class_token=False, global_pool="map"),
    "siglip_gap": dict(class_token=False, global_pool="avg", fc_norm=False),
}
# SigLIP 2's own architectures use the tanh GELU (the SigLIP 1 names keep
# the exact one, also for SigLIP 2 weights).
_SIGLIP2_TANH = {("base", 32, 256), ("large", 16, 512), ("so400m", 16, 256), ("so400m", 16, 384),
                 ("so400m", 16, 512)}


def architecture_args(architecture):
    """timm `VisionTransformer` arguments of an architecture name
    (`vit_base_patch16_224`, `deit3_small_patch16_224`,
    `vit_small_patch14_reg4_dinov2`, `vit_base_patch16_clip_224`,
    `vit_base_patch16_siglip_224`, ...). Another name (a distilled DeiT, a
    giant with SwiGLU, another model) is a ValueError naming it."""
    match = _ARCHITECTURE.match(str(architecture))
    family = match.group("family").lstrip("_") if match else None
    if match and match.group("kind") == "deit3":
        family = "deit3" if not family else None
    if not match or match.group("size") not in TIMM_SIZES or family not in TIMM_FAMILIES \
            or "distilled" in str(architecture):
        raise ValueError(
            "keras_vit reads timm's VisionTransformer architectures vit_*, deit_* and deit3_* of sizes "
            f"{', '.join(TIMM_SIZES)} in the families original, DeiT III, DINOv2 (with registers), CLIP and "
            f"SigLIP; not distilled DeiT (a second token and head) nor other models. "
            f"Received: architecture={architecture!r}"
        )
    size, patch = match.group("size"), int(match.group("patch"))
    embed_dim, depth, num_heads, mlp_ratio = TIMM_SIZES[size]
    args = dict(patch_size=patch, embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
                **TIMM_FAMILIES[family])
    if match.group("res"):
        args["img_size"] = int(match.group("res"))
    if match.group("registers"):
        args.update(reg_tokens=int(match.group("registers")), no_embed_class=True)
    if family.startswith("siglip") and (size, patch, args.get("img_size")) in _SIGLIP2_TANH:
        args["act_layer"] = "gelu_tanh"
    return args


def config_args(config):
    """timm `VisionTransformer` arguments and the preprocessing of a Hub
    `config.json` (timm's format: `architecture`, `num_classes`,
    `global_pool`, `model_args`, `pretrained_cfg`): `(args, pretrained_cfg)`."""
    if not isinstance(config, dict) or not isinstance(config.get("architecture"), str):
        raise ValueError("A timm config.json names its `architecture` (e.g. vit_base_patch16_224). "
                         f"Received: {str(config)[:200]}")
    pretrained = dict(config.get("pretrained_cfg") or {})
    if "pretrained_cfg" not in config:  # timm's older single-dict form
        pretrained = {k: v for k, v in config.items() if k not in ("architecture", "model_args")}
    args = architecture_args(config["architecture"])
    if pretrained.get("input_size"):
        args["img_size"] = tuple(pretrained["input_size"][-2:])
    if "num_classes" in pretrained:
        args["num_classes"] = pretrained["num_classes"]
    for key in ("num_classes", "global_pool"):
        if key in config:
            args[key] = config[key]
    model_args = dict(config.get("model_args") or {})
    if "act_layer" in model_args and not isinstance(model_args["act_layer"], str):
        raise ValueError(f"model_args.act_layer must be a name. Received: {model_args['act_layer']!r}")
    args.update(model_args)
    for key in ("img_size", "patch_size"):  # JSON lists: (height, width)
        if isinstance(args.get(key), (list, tuple)):
            args[key] = tuple(args[key])
    return args, pretrained


# ---------------------------------------------------------------------------
# Back to timm.
# ---------------------------------------------------------------------------

# The layer of a `from_timm` model that drops the pixels past the last whole
# patch, as timm's patch convolution does.
CROP_LAYER = "timm_crop"
# The timm architecture an export names, by LayerNorm epsilon: `model_args`
# gives every other argument, but timm's `norm_layer` is not JSON, so the
# entry point must set it (CLIP's sets 1e-5; pre_norm is overridden).
_EXPORT_ARCHITECTURES = {1e-6: "vit_base_patch16_224", 1e-5: "vit_base_patch16_clip_224"}


def model_pooling(model):
    """`(method, prefix tokens left out)` of a keras_vit model's pooling
    (`"token"`, `"gap"` or `"map"`), None for a model that outputs tokens."""
    names = {layer.name: layer for layer in model.layers}
    pool = names.get("map_head") or names.get("pool")
    if pool is None:
        return None
    return ("map" if pool is names.get("map_head") else pool.method), pool.num_prefix_tokens


def timm_args(model):
    """`(architecture, arguments)`: the timm entry point and the
    `VisionTransformer` arguments (`model_args`) of a keras_vit model; what
    timm cannot express is a ValueError naming it."""
    parts = anatomy(model)
    names = {layer.name: layer for layer in model.layers}
    block = model.get_layer(parts.block_names[0])
    problems = []
    if parts.hybrid:
        problems.append("a hybrid's ResNet stem")
    if parts.has_pre_logits:
        problems.append("a pre_logits layer (representation_size)")
    if block.layer_norm_epsilon not in _EXPORT_ARCHITECTURES:
        problems.append(f"layer_norm_epsilon={block.layer_norm_epsilon:g} (timm's entry points: 1e-6, 1e-5)")
    pre_norm = "pre_norm" in names
    if names["embedding"].use_bias == pre_norm:
        problems.append(f"patch_bias={names['embedding'].use_bias} with pre_norm={pre_norm} (timm: a bias "
                        "exactly without pre_norm)")
    pooling = model_pooling(model)
    if "head" in names and pooling is None:
        problems.append("an unpooled classifier")
    activation = getattr(names.get("head"), "activation", None)
    if activation is not None and getattr(activation, "__name__", None) != "linear":  # timm's heads give logits
        problems.append(f"a head activation (classifier_activation={getattr(activation, '__name__', activation)!r}; "
                        "rebuild with None and set_weights)")
    if problems:
        raise ValueError(f"timm's VisionTransformer cannot express {', '.join(problems)}. "
                         f"Received: model={model.name!r}")
    method, left_out = pooling or ("", 0)
    global_pool = {"gap": "avg"}.get(method, method)
    gelus = {keras_name: timm_name for timm_name, keras_name in TIMM_GELUS.items()}
    # timm's average and attention pooling leave the class and register
    # tokens out unless `pool_include_prefix`, an argument since timm 1.0.x:
    # written only when needed.
    include_prefix = global_pool in ("avg", "map") and parts.num_prefix_tokens > 0 and left_out == 0
    patch = parts.embedding_patch_size
    # A model that crops the pixels past its last whole patch (`from_timm`)
    # takes the larger size, which timm's patch convolution crops likewise.
    size = model.input_shape[1:3] if CROP_LAYER in names else parts.image_size
    return _EXPORT_ARCHITECTURES[block.layer_norm_epsilon], dict(
        img_size=list(size), embed_dim=parts.hidden_size,
        # timm takes (height, width); one int for the usual square patch.
        patch_size=patch[0] if patch[0] == patch[1] else list(patch),
        depth=parts.num_layers, num_heads=parts.num_heads, mlp_ratio=parts.mlp_dim / parts.hidden_size,
        class_token=parts.has_class_token, reg_tokens=parts.num_prefix_tokens - int(parts.has_class_token),
        no_embed_class=parts.posemb_prefix_tokens == 0 and parts.num_prefix_tokens > 0,
        init_values=block.layer_scale_init, pre_norm=pre_norm, fc_norm="fc_norm" in names, qk_norm=block.qk_norm,
        global_pool=global_pool, num_classes=parts.num_classes or 0, act_layer=gelus[block.gelu],
        **({"pool_include_prefix": True} if include_prefix else {}),
    )


def timm_state(model):
    """The model's weights as timm's state dict (`{key: float32 array}`)."""
    import keras

    state, fused = {}, {}
    for key, (variable, layout) in timm_variables(model).items():
        value = layout.back(np.asarray(keras.ops.convert_to_numpy(variable), np.float32))
        if "/" in key:
            fused.setdefault(key.split("/")[0], {})[key.split("/")[1]] = value
        else:
            state[key] = value
    for key, pieces in fused.items():
        state[key] = np.concatenate([pieces[part] for part in _fused_parts(key)], axis=0)
    # Row-major copies: safetensors writes an array's buffer as it lies, and
    # a transposed view's buffer is in the other order.
    return {key: np.ascontiguousarray(value) for key, value in state.items()}
