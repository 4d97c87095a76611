"""timm's `VisionTransformer` weights in a keras_vit model, and its options.

timm (`timm/models/vision_transformer.py`) stores PyTorch layouts under its
own names; `timm_variables` maps each key to the keras_vit variable and the
transposition between the two layouts, so that a state dict (numpy arrays,
e.g. read from `model.safetensors`) loads with timm's numbers. `TIMM_OPTIONS`
says which keras_vit builder keyword expresses each timm constructor
argument: a checkpoint needing anything else is refused by name.
"""

import numpy as np

from keras_vit.anatomy import anatomy, get_layer

# timm `VisionTransformer` argument -> keras_vit `ViT` keyword. timm's
# `global_pool`, `act_layer` and `norm_layer` are translated by
# `builder_kwargs`.
TIMM_OPTIONS = {
    "patch_size": "patch_size", "embed_dim": "hidden_size", "depth": "num_layers", "num_heads": "num_heads",
    "class_token": "class_token", "reg_tokens": "num_register_tokens", "no_embed_class": "no_embed_class",
    "init_values": "layer_scale_init", "pre_norm": "pre_norm", "fc_norm": "fc_norm",
}
# timm's `act_layer` names -> keras_vit's `gelu`.
TIMM_GELUS = {"gelu": "exact", "gelu_tanh": "tanh", "quick_gelu": "quick"}


def _transpose(*axes):
    return lambda value: np.transpose(value, axes)


def _heads(num_heads, out=False):
    """A PyTorch Linear's (out, in) weight as a Keras attention kernel:
    `(in, heads, head_dim)`, or `(heads, head_dim, out)` for the output."""
    def convert(value):
        if value.ndim == 1:  # a bias: (heads, head_dim), or (D,) for the output
            return value if out else value.reshape(num_heads, -1)
        if out:
            return value.T.reshape(num_heads, -1, value.shape[0])
        return value.T.reshape(value.shape[1], num_heads, -1)
    return convert


def _same(value):
    return value


def _linear(prefix, layer):
    out = {f"{prefix}.weight": (layer.kernel, _transpose(1, 0))}
    if layer.bias is not None:
        out[f"{prefix}.bias"] = (layer.bias, _same)
    return out


def _norm(prefix, layer):
    return {f"{prefix}.weight": (layer.gamma, _same), f"{prefix}.bias": (layer.beta, _same)}


def timm_variables(model):
    """`{timm key: (variable, convert)}` for a keras_vit model: `convert`
    takes timm's array to the variable's layout. timm's fused `qkv` is listed
    as `....attn.qkv.weight/q` etc. (see `split_qkv`)."""
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
        mapping[f"{prefix}.attn.proj.weight"] = (attention.output_dense.kernel, _heads(heads, out=True))
        mapping[f"{prefix}.attn.proj.bias"] = (attention.output_dense.bias, _same)
        mapping.update(_linear(f"{prefix}.mlp.fc1", block.mlp.dense_0))
        mapping.update(_linear(f"{prefix}.mlp.fc2", block.mlp.dense_1))
        if block.layer_scale_init is not None:
            mapping[f"{prefix}.ls1.gamma"] = (block.layer_scales[0], _same)
            mapping[f"{prefix}.ls2.gamma"] = (block.layer_scales[1], _same)
    if "head" in names:
        mapping.update(_linear("head", model.get_layer("head")))
    return mapping


def split_qkv(state):
    """timm's fused `attn.qkv` (rows: q, then k, then v) as three entries
    `attn.qkv.weight/q`, ... (the keys `timm_variables` lists)."""
    out = {}
    for key, value in state.items():
        if key.endswith(".attn.qkv.weight") or key.endswith(".attn.qkv.bias"):
            for part, piece in zip("qkv", np.split(np.asarray(value), 3, axis=0)):
                out[f"{key}/{part}"] = piece
        else:
            out[key] = np.asarray(value)
    return out


def load_timm_state(model, state):
    """Loads a timm `VisionTransformer` state dict (`{key: numpy array}`)
    into `model`, all or nothing: every key must have its variable and
    shape, and every variable its key, else a ValueError lists the
    differences and nothing is assigned. Returns `model`."""
    arrays = split_qkv(state)
    mapping = timm_variables(model)
    missing = sorted(set(mapping) - set(arrays))
    unexpected = sorted(set(arrays) - set(mapping))
    converted, wrong = {}, []
    for key in sorted(set(mapping) & set(arrays)):
        variable, convert = mapping[key]
        value = convert(arrays[key])
        if tuple(value.shape) != tuple(variable.shape):
            wrong.append(f"{key}: {tuple(value.shape)} -> {tuple(variable.shape)} expected")
        converted[key] = value
    if missing or unexpected or wrong:
        lines = [f"missing: {', '.join(missing[:8])}" if missing else "",
                 f"not in the model: {', '.join(unexpected[:8])}" if unexpected else "",
                 *wrong[:8]]
        raise ValueError(
            "The timm state dict does not fit the model (a checkpoint of another architecture or "
            "options); nothing was loaded:\n" + "\n".join(line for line in lines if line)
        )
    for key, value in converted.items():
        variable = mapping[key][0]
        variable.assign(value.astype(variable.dtype))
    return model


# timm's defaults for the arguments `builder_kwargs` reads
# (`VisionTransformer.__init__`).
_TIMM_DEFAULTS = dict(
    img_size=224, patch_size=16, in_chans=3, num_classes=1000, global_pool="token", embed_dim=768, depth=12,
    num_heads=12, mlp_ratio=4.0, qkv_bias=True, qk_norm=False, proj_bias=True, init_values=None, class_token=True,
    no_embed_class=False, reg_tokens=0, pre_norm=False, final_norm=True, fc_norm=None, act_layer="gelu",
    layer_norm_eps=1e-6,
)
# The values keras_vit cannot express: the argument must keep timm's default.
_FIXED = ("qkv_bias", "qk_norm", "proj_bias", "final_norm", "in_chans")


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
    if a["global_pool"] not in ("token", "avg", ""):
        raise ValueError(f"keras_vit has no equivalent of timm's global_pool={a['global_pool']!r} "
                         "(token, avg or none). Received: global_pool=" + repr(a["global_pool"]))
    if a["act_layer"] not in TIMM_GELUS:
        raise ValueError(f"keras_vit has no equivalent of timm's act_layer={a['act_layer']!r} "
                         f"(one of {sorted(TIMM_GELUS)}). Received: act_layer={a['act_layer']!r}")
    size = a["img_size"]
    size = (size, size) if isinstance(size, int) else tuple(size)
    pooled = a["global_pool"] or "token"
    kwargs = dict(
        input_shape=(*size, 3), patch_size=a["patch_size"], hidden_size=a["embed_dim"], num_layers=a["depth"],
        num_heads=a["num_heads"], mlp_dim=int(a["embed_dim"] * a["mlp_ratio"]),
        classifier="token" if pooled == "token" else "gap", class_token=bool(a["class_token"]),
        num_register_tokens=a["reg_tokens"], no_embed_class=bool(a["no_embed_class"]),
        layer_scale_init=a["init_values"], pre_norm=bool(a["pre_norm"]),
        # timm: None means "after pooling for average pooling".
        fc_norm=pooled == "avg" if a["fc_norm"] is None else bool(a["fc_norm"]),
        # timm's patch embedding has no bias under a pre-norm (CLIP).
        patch_bias=not a["pre_norm"], gelu=TIMM_GELUS[a["act_layer"]], layer_norm_epsilon=a["layer_norm_eps"],
        representation_size=None, include_top=a["num_classes"] > 0,
    )
    if a["num_classes"] > 0:
        kwargs["num_classes"] = a["num_classes"]
    else:
        kwargs["pooling"] = None if not a["global_pool"] else {"token": "token", "avg": "gap"}[pooled]
    return kwargs
