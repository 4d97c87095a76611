"""Reading, loading and writing the original `.npz` checkpoints.

Key names are those of the published files (pre-Linen Flax numbering:
`MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3` inside each
block; google-research/vision_transformer, `checkpoint.py`). Files with Linen
numbering and an `opt/target/` prefix are accepted too. The mapping between
those keys and a model's variables is written once, in `checkpoint_variables`,
and serves loading and exporting alike.
"""

import logging
import math
import os
import re
import tempfile
import zipfile
import zlib

import keras
import numpy as np

from keras_vit.layers.position_embedding import (
    infer_square_grid,
    resample_position_embedding,
)

logger = logging.getLogger("keras_vit")

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
# Extra key written by `export_npz` for grids that cannot be inferred.
GRID_KEY = "keras_vit/posemb_grid"
_BLOCK = re.compile(r"^encoderblock_(\d+)$")
# Hybrid ResNet layers: Keras names cannot hold "/", so the checkpoint's
# `block1/unit1/conv1` is the layer `block1_unit1_conv1`.
_RESNET_LAYER = re.compile(r"^(block\d+)_(unit\d+)_(conv[123]|conv_proj|gn[123]|gn_proj)$")
# Flax Linen renumbers a block's sub-modules per class; the files number them
# with one counter per block (flax `convert_pre_linen`).
_LINEN_TO_FILE = {
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


def _dense(prefix, layer):
    return {f"{prefix}/kernel": layer.kernel, f"{prefix}/bias": layer.bias}


def _norm(prefix, layer):
    return {f"{prefix}/scale": layer.gamma, f"{prefix}/bias": layer.beta}


def _encoder_block(prefix, block):
    attention = block.attention
    out = {
        **_norm(f"{prefix}/LayerNorm_0", block.layer_norm_0),
        **_norm(f"{prefix}/LayerNorm_2", block.layer_norm_2),
        **_dense(f"{prefix}/MlpBlock_3/Dense_0", block.mlp.dense_0),
        **_dense(f"{prefix}/MlpBlock_3/Dense_1", block.mlp.dense_1),
    }
    for name, dense in (
        ("query", attention.query_dense),
        ("key", attention.key_dense),
        ("value", attention.value_dense),
        ("out", attention.output_dense),
    ):
        out.update(_dense(f"{prefix}/MultiHeadDotProductAttention_1/{name}", dense))
    return out


def checkpoint_variables(model):
    """Maps original checkpoint keys to the model's variables, by layer name."""
    from keras_vit import layers as vit_layers

    mapping = {}
    for layer in model.layers:
        name = layer.name
        if isinstance(layer, vit_layers.PatchEmbedding) and name == "embedding":
            mapping.update(_dense("embedding", layer))
        elif isinstance(layer, vit_layers.ClassToken) and name == "cls":
            mapping["cls"] = layer.cls
        elif isinstance(layer, vit_layers.AddPositionEmbedding):
            mapping[POSEMB_KEY] = layer.pos_embedding
        elif isinstance(layer, vit_layers.TransformerEncoderBlock) and _BLOCK.match(name):
            mapping.update(_encoder_block(f"Transformer/{name}", layer))
        elif name == "encoder_norm":
            mapping.update(_norm("Transformer/encoder_norm", layer))
        elif name in ("pre_logits", "head") and isinstance(layer, keras.layers.Dense):
            mapping.update(_dense(name, layer))
        elif isinstance(layer, vit_layers.StdConv2D) and (
            name == "conv_root" or _RESNET_LAYER.match(name)
        ):
            mapping[f"{_resnet_key(name)}/kernel"] = layer.kernel
        elif isinstance(layer, keras.layers.GroupNormalization) and (
            name == "gn_root" or _RESNET_LAYER.match(name)
        ):
            mapping.update(_norm(_resnet_key(name), layer))
    if "embedding/kernel" not in mapping or POSEMB_KEY not in mapping:
        raise ValueError(
            "The model has no `embedding` and `posembed_input` layers, so it "
            f"is not a keras_vit ViT. Received: model={model.name!r}"
        )
    return mapping


def _resnet_key(layer_name):
    """`block1_unit1_conv1` -> `block1/unit1/conv1`; root names are unchanged."""
    match = _RESNET_LAYER.match(layer_name)
    return "/".join(match.groups()) if match else layer_name


def model_grid(model):
    """(rows, cols) of the model's patch grid."""
    embedding = model.get_layer("embedding")
    return embedding.grid_size(embedding.input.shape)


def read_npz(path):
    """Reads every array of an `.npz` file (never unpickling) into a dict."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            if not hasattr(archive, "files"):
                raise ValueError("it holds a single array, not named arrays")
            arrays = {key: archive[key] for key in archive.files}
    except FileNotFoundError:
        raise FileNotFoundError(f"Weights file not found. Received: weights={path!r}")
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError(
            "Cannot read the weights file: it is truncated, corrupt or not an "
            f"`.npz` archive of arrays ({type(e).__name__}: {e}). "
            f"Received: weights={path!r}"
        ) from e
    return canonical_keys(arrays, path)


def canonical_keys(arrays, path="<arrays>"):
    """Strips `opt/target/` and renames Linen-numbered block modules."""
    arrays = {key.removeprefix("opt/target/"): value for key, value in arrays.items()}
    if any(key.startswith("params/") for key in arrays):
        raise ValueError(
            "This looks like a big_vision checkpoint (keys start with "
            "`params/`), which keras_vit does not read yet; use the "
            "vision_transformer (`gs://vit_models`) files. "
            f"Received: weights={path!r}"
        )
    if any("MultiHeadDotProductAttention_0" in key for key in arrays):
        renamed = {}
        for key, value in arrays.items():
            parts = key.split("/")
            if len(parts) > 2 and _BLOCK.match(parts[1]):
                parts[2] = _LINEN_TO_FILE.get(parts[2], parts[2])
            renamed["/".join(parts)] = value
        arrays = renamed
    return arrays


def _describe(arrays):
    """A short architecture summary of a checkpoint, for error messages."""
    width = arrays.get("embedding/bias")
    blocks = {k.split("/")[1] for k in arrays if k.startswith("Transformer/encoderblock_")}
    stages = {k.split("/")[0] for k in arrays if re.match(r"^block\d+/unit\d+/", k)}
    stem = (
        f"hybrid with a ResNet stem of {len(stages)} stage(s)"
        if "conv_root/kernel" in arrays else "no ResNet stem (plain ViT)"
    )
    return (
        f"width {None if width is None else width.shape[-1]}, {len(blocks)} blocks, "
        f"patch {None if 'embedding/kernel' not in arrays else arrays['embedding/kernel'].shape[:2]}, "
        f"{stem}"
    )


def load_npz(model, path, interpolation="linear", source_grid=None, arrays=None):
    """Loads an original-format `.npz` checkpoint into `model`.

    All or nothing: every key is checked before any variable is assigned, and
    any missing, unexpected or mis-shaped key raises one `ValueError` that
    lists them all, leaving the model unchanged.

    Rules (as the original `load_pretrained`, google-research/vision_transformer
    `checkpoint.py`):
    - Position embeddings of another grid are resampled (`interpolation`
      `"linear"` reproduces the original exactly; `"bicubic"` as timm).
      The source grid is inferred when square, else read from the file's
      metadata or `source_grid`.
    - The head is loaded when its shape matches the model's; otherwise it is
      re-initialised (zeros) for fine-tuning.
    - A checkpoint `pre_logits` layer is dropped when the model has none; a
      model `pre_logits` layer missing from the checkpoint keeps its fresh
      initialisation.

    Args:
        model: a keras_vit model.
        path: path of the `.npz` file.
        interpolation: `"linear"` or `"bicubic"`.
        source_grid: `(rows, cols)` of the checkpoint's patch grid, needed only
            for non-square grids in files without keras_vit metadata.
        arrays: already-read arrays (keys canonical), instead of reading `path`.
    """
    if arrays is None:
        arrays = read_npz(path)
    arrays = dict(arrays)
    saved_grid = arrays.pop(GRID_KEY, None)
    if source_grid is None and saved_grid is not None:
        source_grid = tuple(int(v) for v in saved_grid)
    targets = checkpoint_variables(model)
    has_cls = "cls" in targets
    has_head = "head/kernel" in targets

    values, problems, notes = {}, [], []
    for key, variable in targets.items():
        shape = tuple(variable.shape)
        if key not in arrays:
            if key.startswith("head/"):
                notes.append(f"`{key}` is not in the checkpoint: initialised for fine-tuning.")
                values[key] = _initial_value(model.get_layer("head"), key, shape)
            elif key.startswith("pre_logits/"):
                notes.append(f"`{key}` is not in the checkpoint: kept freshly initialised.")
            else:
                problems.append(f"missing from the checkpoint: {key} {shape}")
            continue
        value = arrays[key]
        if key == POSEMB_KEY:
            try:
                value = _fit_posemb(value, shape, model, has_cls, source_grid, interpolation, notes)
            except ValueError as e:
                problems.append(f"{key}: {e}")
                continue
        elif key.startswith("head/") and value.shape != shape:
            notes.append(
                f"`{key}` has shape {value.shape} in the checkpoint and {shape} in "
                "the model: re-initialised (zeros) for fine-tuning."
            )
            value = _initial_value(model.get_layer("head"), key, shape)
        elif value.shape != shape and np.squeeze(value).shape == shape and re.search(
            r"(^|/)gn(_root|_proj|\d+)/(scale|bias)$", key
        ):
            # Pre-Linen GroupNorm stored scale/bias as (1, 1, 1, C).
            value = value.reshape(shape)
        if value.shape != shape:
            problems.append(
                f"shape mismatch: {key} is {value.shape} in the checkpoint, {shape} in the model"
            )
            continue
        values[key] = value

    ignorable = ("pre_logits/",) + (() if has_head else ("head/",))
    for key in sorted(set(arrays) - set(targets)):
        if key.startswith(ignorable):
            notes.append(f"`{key}` in the checkpoint is not used by this model: dropped.")
        else:
            problems.append(f"not in the model: {key} {arrays[key].shape}")

    if problems:
        listed = "\n  ".join(problems)
        raise ValueError(
            f"Cannot load the checkpoint into model {model.name!r}; the model is "
            f"unchanged. Checkpoint: {_describe(arrays)}. {len(problems)} problem(s):"
            f"\n  {listed}\nReceived: weights={path!r}"
        )
    for key, value in values.items():
        targets[key].assign(np.asarray(value, dtype=targets[key].dtype))
    for note in notes:
        logger.info("%s: %s", os.path.basename(str(path)), note)
    return notes


def _initial_value(layer, key, shape):
    initializer = layer.kernel_initializer if key.endswith("kernel") else layer.bias_initializer
    return keras.ops.convert_to_numpy(initializer(shape, dtype="float32"))


def _fit_posemb(value, shape, model, has_cls, source_grid, interpolation, notes):
    prefix = 1 if has_cls else 0
    target_grid = model_grid(model)
    if value.ndim != 3 or value.shape[-1] != shape[-1]:
        raise ValueError(f"shape {value.shape} cannot fit the model's {shape}")
    grid_tokens = value.shape[1] - prefix
    if source_grid is None:
        side = math.isqrt(grid_tokens)
        if side * side == grid_tokens:
            source_grid = (side, side)
        elif value.shape == shape:
            return value  # A non-square grid of the model's size: the same grid.
        else:
            source_grid = infer_square_grid(grid_tokens)
    source_grid = tuple(source_grid)
    if source_grid == tuple(target_grid) and value.shape == shape:
        return value
    resampled = resample_position_embedding(
        value, target_grid, source_grid, num_prefix_tokens=prefix,
        interpolation=interpolation,
    )
    notes.append(
        f"position embeddings resampled from a {source_grid[0]}x{source_grid[1]} "
        f"to a {target_grid[0]}x{target_grid[1]} grid ({interpolation})."
    )
    return resampled


def export_npz(model, path):
    """Writes the model's weights to an original-format `.npz` file.

    Keys are those of the published checkpoints, so the file loads in the
    original code, in timm and back into keras_vit. A non-square patch grid is
    recorded under `keras_vit/posemb_grid`. The file is written atomically.
    """
    arrays = {
        key: keras.ops.convert_to_numpy(variable.value).astype(np.float32)
        for key, variable in checkpoint_variables(model).items()
    }
    rows, cols = model_grid(model)
    if rows != cols:
        arrays[GRID_KEY] = np.array([rows, cols], np.int32)
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, tmp = tempfile.mkstemp(suffix=".npz", dir=directory)
    try:
        with os.fdopen(handle, "wb") as f:
            np.savez(f, **arrays)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600 files.
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path
