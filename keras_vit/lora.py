"""LoRA fine-tuning (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large
Language Models") through Keras' own `Dense`/`EinsumDense.enable_lora`.

`enable_lora(model, rank)` adds a trainable low-rank update `W + (alpha /
rank) * A @ B` (B starts at zero: the adapted model starts as the base one)
to the attention projections of every encoder block, query and value by
default as keras-hub does, and freezes everything else but the head.
`save_lora`/`load_lora` write and read the adapters and the head alone (a
small `.npz`), to put on the base checkpoint again; `merge_lora` folds the
adapters into the kernels for export.
"""

import json
import os
import tempfile
import zipfile

import keras
import numpy as np

from keras_vit import distribute
from keras_vit import interrupts
from keras_vit.layers.encoder_block import TransformerEncoderBlock
from keras_vit.layers.utils import check_head_trains
from keras_vit.layers.utils import head_layer
from keras_vit.layers.utils import is_real
from keras_vit.layers.utils import positive_int
from keras_vit.layers.utils import track_torch_parameters
from keras_vit.weights.npz import write_npz

# The sub-layers LoRA can adapt in each encoder block: the attention's
# query, key, value and output projections (Keras' MultiHeadAttention
# EinsumDense layers) and the MLP's two Dense layers.
TARGETS = ("query", "key", "value", "output", "mlp")
DEFAULT_TARGETS = ("query", "value")
_FORMAT = 1
_LORA_NAMES = ("lora_kernel_a", "lora_kernel_b")


def _target_layers(block, target):
    attention = block.attention
    return {
        "query": [attention.query_dense], "key": [attention.key_dense], "value": [attention.value_dense],
        "output": [attention.output_dense], "mlp": [block.mlp.dense_0, block.mlp.dense_1],
    }[target]


def _largest_rank(block, targets):
    """The largest rank an update of the `targets` kernels of `block` can
    have (per head for query, key and value): beyond it, rank adds
    parameters, not capacity."""
    attention, hidden, mlp_dim = block.attention, block.mlp.dense_1.units, block.mlp.dense_0.units
    ranks = {"query": attention.key_dim, "key": attention.key_dim, "value": attention.value_dim,
             "output": hidden, "mlp": min(hidden, mlp_dim)}
    return max(ranks[target] for target in targets)


def _blocks(model):
    return [layer for layer in model.layers if isinstance(layer, TransformerEncoderBlock)]


def _is_adapter(variable):
    return variable.path.rsplit("/", 1)[-1] in _LORA_NAMES


def lora_layers(model):
    """The layers of `model` with LoRA enabled, in order."""
    return [layer for block in _blocks(model) for target in TARGETS for layer in _target_layers(block, target)
            if getattr(layer, "lora_enabled", False)]


def enable_lora(model, rank, targets=DEFAULT_TARGETS, alpha=None):
    """Adds LoRA adapters to `model`'s encoder blocks and freezes the rest
    but the head (`head`), in place.

    Args:
        model: a keras_vit ViT or hybrid (built).
        rank: int > 0, the rank of the update `A @ B` (for query, key and
            value, of each head's part: Keras factorises them per head). At
            most `head_dim` for those, the width for `"output"` and `"mlp"`:
            beyond, rank adds parameters, not capacity.
        targets: names from `TARGETS`: `"query"`, `"key"`, `"value"`,
            `"output"` (the attention projections) and `"mlp"` (both MLP
            layers). Defaults to query and value.
        alpha: a positive number; the update's scale is `alpha / rank`.
            Defaults to `rank` (a scale of 1, Keras' default).

    Returns:
        `model`, whose trainable weights are the adapters and the head.
    """
    rank = positive_int(rank, "rank")
    if alpha is not None and not (is_real(alpha) and alpha > 0):
        # 0 would train nothing (B's gradient is scaled by it), NaN everything to NaN.
        raise ValueError(f"`alpha` must be None or a positive finite number. Received: alpha={alpha!r}")
    # A Python float: a numpy one (a value from a grid) reached `save_lora`'s
    # JSON, which refuses it.
    alpha = None if alpha is None else float(alpha)
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise ValueError(f"`targets` must be names from {TARGETS}. Received: targets={targets!r}")
    blocks = _blocks(model)
    if not blocks:
        raise ValueError(
            f"`targets` {targets} match no layer of model {model.name!r}: it has no TransformerEncoderBlock. "
            f"Received: model={model.name!r}")
    largest = _largest_rank(blocks[0], targets)
    if rank > largest:
        raise ValueError(f"`rank` must be at most {largest}, the largest rank an update of {', '.join(targets)} can "
                         f"have in this model (per head for query, key and value). Received: rank={rank}")
    distribute.check_scope(model, "enable_lora")
    adapted = [layer for block in blocks for target in targets for layer in _target_layers(block, target)]
    enabled = lora_layers(model)
    if enabled and not _interrupted(enabled, adapted, rank, alpha):
        raise ValueError(f"LoRA is already enabled on model {model.name!r} (rank {enabled[0].lora_rank}, alpha "
                         f"{enabled[0].lora_alpha:g}, {len(enabled)} layers); enable it once. Received: rank={rank}")
    check_head_trains(model, "enable_lora")
    float8 = [layer.path for layer in adapted if layer.quantization_mode == "float8"]
    if float8:
        # Keras' float8 layers fail at their first call with adapters.
        raise ValueError(f"Keras' float8 layers take no LoRA adapters: quantize to int8 or int4 for LoRA on "
                         f"quantized weights. Received: {float8[0]} quantized to float8")
    # Frozen first, adapted after: a call stopped half-way (Ctrl-C in a
    # notebook: ViT-B/16's layers take seconds) leaves a frozen backbone
    # with some adapters, which the same call again completes. Every layer
    # trainable again (a frozen backbone's too), then every variable but
    # the head's and the adapters' frozen. False first: on TensorFlow,
    # assigning the value an attribute already holds does not run the
    # setter, which would leave the frozen sub-layers, and their adapters,
    # frozen.
    kept = {id(v) for v in _saved_variables(model)}
    model.trainable = False
    model.trainable = True
    for variable in model.weights:
        if id(variable) not in kept:
            variable.trainable = False
    for layer in adapted:
        if not getattr(layer, "lora_enabled", False):
            # Each layer whole (a Ctrl-C between its two adapters left a stray one).
            with interrupts.held_back("this layer's adapters are added"):
                layer.enable_lora(rank, lora_alpha=alpha)  # new trainable adapters; the kernel frozen
    # Functions Keras compiled before are traced without the adapters: on
    # TensorFlow `predict` (and `fit` without a new `compile`) ran the old
    # graph and ignored them (plain Keras does the same).
    for kind in ("train", "test", "predict"):
        if getattr(model, f"{kind}_function", None) is not None:
            getattr(model, f"make_{kind}_function")(force=True)
    # Without new lists, a torch optimizer over `model.parameters()` would
    # train the head alone.
    track_torch_parameters(model)
    return model


def _interrupted(enabled, adapted, rank, alpha):
    """Whether the LoRA layers `enabled` are what a stopped `enable_lora`
    with these arguments left: some of the layers it adapts, at its rank
    and scale."""
    wanted = {id(layer) for layer in adapted}
    return len(enabled) < len(adapted) and all(
        id(layer) in wanted and layer.lora_rank == rank and layer.lora_alpha == (rank if alpha is None else alpha)
        for layer in enabled)


def merge_lora(model):
    """A copy of `model` with each adapter folded into its kernel (`W +
    (alpha / rank) * A @ B`): the same logits, no adapter variables, every
    layer trainable again. `model` is left as it was."""
    if not lora_layers(model):
        raise ValueError(f"Model {model.name!r} has no LoRA adapters to merge (see `enable_lora`).")
    merged = type(model).from_config(model.get_config())
    merged.trainable = True
    for layer in merged.layers:
        layer.trainable = True
    # Keras writes an adapted layer's kernel merged (`save_own_variables`),
    # and the rebuilt model's layers have no adapters.
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "merged.weights.h5")
        model.save_weights(path)
        merged.load_weights(path)
    return merged


def _saved_variables(model):
    """What `save_lora` writes and `load_lora` reads: the adapters and the
    head, chosen by name, not by their trainable flags (a `freeze_backbone`
    or `model.trainable = False` after `enable_lora` left the adapters
    out of the file)."""
    head = head_layer(model)
    head_variables = {id(v) for v in head.weights} if head is not None else set()
    return [v for v in model.weights if _is_adapter(v) or id(v) in head_variables]


def _lora_config(model):
    layers = lora_layers(model)
    return {"format": _FORMAT, "rank": layers[0].lora_rank, "alpha": layers[0].lora_alpha,
            "adapted": [layer.path for layer in layers]}


def save_lora(model, path):
    """Writes the adapters and the head of `model` to `path` (`.npz`), with
    what they fit (rank, alpha, the adapted layers); returns `path`. Written
    as `export_npz` writes a checkpoint: atomically, and only over a regular
    file (`keras_vit.weights.npz.write_npz`)."""
    if not lora_layers(model):
        raise ValueError(f"Model {model.name!r} has no LoRA adapters to save (see `enable_lora`).")
    arrays = {v.path: keras.ops.convert_to_numpy(v) for v in _saved_variables(model)}
    arrays["lora_config"] = np.array(json.dumps(_lora_config(model)))
    return write_npz(path, arrays)


def load_lora(model, path):
    """Loads what `save_lora` wrote onto `model`: the base checkpoint's
    model with `enable_lora` of the same rank and targets. A file for other
    adapters, another head or a damaged file is refused, naming the
    difference; `model` is then unchanged."""
    path = os.path.expanduser(os.fspath(path))
    try:
        stored = np.load(path)  # never with pickles
        if not isinstance(stored, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive")
        with stored:
            arrays = {key: stored[key] for key in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"Cannot read the LoRA file {path}: {error}. Received: path={path!r}") from None
    if "lora_config" not in arrays:
        raise ValueError(f"{path} is not a file `save_lora` wrote (no lora_config). Received: path={path!r}")
    saved = json.loads(str(arrays.pop("lora_config")))
    if not lora_layers(model):
        raise ValueError(f"Enable LoRA on model {model.name!r} first (`enable_lora(model, rank={saved['rank']})`), "
                         f"then load {path}.")
    mine = _lora_config(model)
    for key in ("rank", "alpha", "adapted"):
        if saved.get(key) != mine[key]:
            raise ValueError(f"{path} holds adapters with {key}={saved.get(key)!r}; this model has "
                             f"{key}={mine[key]!r}. Received: path={path!r}")
    variables = {v.path: v for v in _saved_variables(model)}
    if set(arrays) != set(variables):
        missing, extra = sorted(set(variables) - set(arrays)), sorted(set(arrays) - set(variables))
        raise ValueError(f"{path} does not fit this model: missing {missing[:3]}, unexpected {extra[:3]}. "
                         f"Received: path={path!r}")
    for key, value in arrays.items():
        if tuple(value.shape) != tuple(variables[key].shape):
            raise ValueError(f"{path}: {key} has shape {tuple(value.shape)}, the model's "
                             f"{tuple(variables[key].shape)}. Received: path={path!r}")
    with interrupts.held_back("the adapters are assigned"):  # all or nothing, Ctrl-C too
        for key, value in arrays.items():
            variables[key].assign(value)
    return model
