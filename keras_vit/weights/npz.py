"""Reading, loading and writing the original `.npz` checkpoints.

Key names are those of the published files (pre-Linen Flax numbering:
`MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3` inside each
block; google-research/vision_transformer, `checkpoint.py`). Files with Linen
numbering and an `opt/target/` prefix are accepted too. The mapping between
those keys and a model's variables is written once, in `checkpoint_variables`,
and serves loading and exporting alike.

Files are read member by member from the zip archive: every key, declared
shape, dtype and size is checked from the headers before any array is
decompressed, and only the arrays the model uses are read.
"""

import contextlib
import logging
import math
import os
import re
import stat
import tempfile
import zipfile
import zlib

import keras
import numpy as np

from keras_vit import interrupts
from keras_vit.anatomy import BLOCK_NAME, RESNET_LAYER_NAME, anatomy, wrapped_vit_hint
from keras_vit.layers.patch_embedding import resize_patch_embedding
from keras_vit.layers.utils import check_float_kernels
from keras_vit.layers.position_embedding import (
    infer_square_grid,
    resample_position_embedding,
)

try:  # POSIX: an export holds a lock on its temporary file while it writes.
    import fcntl
except ImportError:  # Windows: stale temporaries are not cleaned.
    fcntl = None

logger = logging.getLogger("keras_vit")

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
# Extra key written by `export_npz` for grids that cannot be inferred.
GRID_KEY = "keras_vit/posemb_grid"
_GROUP_NORM = re.compile(r"(^|/)gn(_root|_proj|\d+)/(scale|bias)$")
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


def original_format_problems(model):
    """The options of `model` that the original architecture lacks (the
    `.npz` format has no keys or switches for them), as `name=value` texts."""
    from keras_vit import layers as vit_layers
    from keras_vit.layers.encoder_block import LAYER_NORM_EPSILON

    problems = []
    names = {layer.name: layer for layer in model.layers}
    for name, option in (("registers", "num_register_tokens"), ("pre_norm", "pre_norm=True"),
                         ("fc_norm", "fc_norm=True"), ("map_head", "classifier='map'")):
        if name in names:
            problems.append(option if "=" in option else f"{option}={names[name].num_tokens}")
    embedding = names.get("embedding")
    if isinstance(embedding, vit_layers.PatchEmbedding) and not embedding.use_bias:
        problems.append("patch_bias=False")
    blocks = [layer for layer in model.layers if isinstance(layer, vit_layers.TransformerEncoderBlock)]
    if blocks:
        block = blocks[0]
        if block.qk_norm:
            problems.append("qk_norm=True")
        if block.layer_scale_init is not None:
            problems.append(f"layer_scale_init={block.layer_scale_init:g}")
        if block.gelu != "tanh":
            problems.append(f"gelu={block.gelu!r}")
        if block.layer_norm_epsilon != LAYER_NORM_EPSILON:
            problems.append(f"layer_norm_epsilon={block.layer_norm_epsilon:g}")
    if "cls" in names and getattr(names.get("pool"), "method", None) == "gap":
        # The file would load as a token model, which reads the class token.
        problems.append("class_token=True with classifier='gap'")
    posemb = names.get("posembed_input")
    if posemb is not None and "cls" in names and model.layers.index(posemb) < model.layers.index(names["cls"]):
        problems.append("no_embed_class=True")
    return problems


def checkpoint_variables(model):
    """Maps original checkpoint keys to the model's variables, by layer name.
    A model with options the original architecture lacks is refused."""
    from keras_vit import layers as vit_layers

    problems = original_format_problems(model)
    if problems:
        raise ValueError(
            "The original checkpoint format holds the original architecture only; this model uses "
            f"{', '.join(problems)}. Build the model without these options to load or write this format. "
            f"Received: model={model.name!r}"
        )
    mapping = {}
    for layer in model.layers:
        name = layer.name
        if isinstance(layer, vit_layers.PatchEmbedding) and name == "embedding":
            mapping.update(_dense("embedding", layer))
        elif isinstance(layer, vit_layers.ClassToken) and name == "cls":
            mapping["cls"] = layer.cls
        elif isinstance(layer, vit_layers.AddPositionEmbedding):
            mapping[POSEMB_KEY] = layer.pos_embedding
        elif isinstance(layer, vit_layers.TransformerEncoderBlock) and BLOCK_NAME.match(name):
            mapping.update(_encoder_block(f"Transformer/{name}", layer))
        elif name == "encoder_norm":
            mapping.update(_norm("Transformer/encoder_norm", layer))
        elif name in ("pre_logits", "head") and isinstance(layer, keras.layers.Dense):
            mapping.update(_dense(name, layer))
        elif isinstance(layer, vit_layers.StdConv2D) and (
            name == "conv_root" or RESNET_LAYER_NAME.match(name)
        ):
            mapping[f"{_resnet_key(name)}/kernel"] = layer.kernel
        elif isinstance(layer, keras.layers.GroupNormalization) and (
            name == "gn_root" or RESNET_LAYER_NAME.match(name)
        ):
            mapping.update(_norm(_resnet_key(name), layer))
    if "embedding/kernel" not in mapping or POSEMB_KEY not in mapping:
        raise ValueError(
            "The model has no `embedding` and `posembed_input` layers, so it "
            f"is not a keras_vit ViT{wrapped_vit_hint(model)}. Received: model={model.name!r}"
        )
    return mapping


def _resnet_key(layer_name):
    """`block1_unit1_conv1` -> `block1/unit1/conv1`; root names are unchanged."""
    match = RESNET_LAYER_NAME.match(layer_name)
    if not match:
        return layer_name
    stage, unit, part = match.groups()
    return f"block{stage}/unit{unit}/{part}"


class _Member:
    """One array of an `.npz` archive, known from its headers only."""

    def __init__(self, info, shape, dtype, fortran_order, offset):
        self.info, self.shape, self.dtype = info, shape, dtype
        self.fortran_order, self.offset = fortran_order, offset

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.dtype.itemsize


def _unreadable(path, reason, error=None):
    detail = f" ({type(error).__name__}: {error})" if error is not None else ""
    return ValueError(
        f"Cannot read the weights file {path!r}: {reason}{detail}. Received: weights={path!r}"
    )


def _not_an_archive(path, error):
    """Names what the file is when it is not a zip archive at all."""
    try:
        with open(path, "rb") as f:
            start = f.read(64).lstrip().lower()
    except OSError:
        start = b""
    if start.startswith(b"\x93numpy"):
        reason = "it holds a single `.npy` array, not an `.npz` archive of named arrays"
    elif start.startswith((b"<!doctype", b"<html", b"<?xml", b"{")):
        reason = "it is a text (HTML/XML/JSON) document, such as an error page, not an `.npz` archive"
    elif start.startswith(b"\x89hdf"):
        reason = ("it is an HDF5 file, not an `.npz` archive: Keras weights files load by their name "
                  "`*.weights.h5` (rename it), whole models with `keras.saving.load_model`")
    else:
        reason = "it is truncated, corrupt or not an `.npz` archive of arrays"
    return _unreadable(path, reason, error)


@contextlib.contextmanager
def _open_archive(path):
    """Opens `path` as a zip archive, turning every failure into a clear error."""
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"Weights file not found. Received: weights={path!r}") from None
    except PermissionError as e:
        raise PermissionError(
            f"The weights file {path!r} cannot be read: permission denied ({e}). "
            f"Received: weights={path!r}"
        ) from e
    except IsADirectoryError as e:
        raise _unreadable(path, "it is a directory", e) from e
    except (zipfile.BadZipFile, EOFError, ValueError) as e:
        raise _not_an_archive(path, e) from e
    except OSError as e:
        raise _unreadable(path, "the file cannot be read", e) from e
    with archive:
        yield archive


def _members(archive, path):
    """Every member's key, shape, dtype and size, from headers only."""
    names = set(archive.namelist())
    if {"config.json", "metadata.json"} <= names:
        raise _unreadable(path, "it is a `.keras` model, not an `.npz` checkpoint: load it with "
                                "`keras.saving.load_model`")
    if "lora_config.npy" in names:
        raise _unreadable(path, "it holds LoRA adapters (`keras_vit.save_lora`), not a checkpoint: load it with "
                                "`keras_vit.load_lora` into the model they were trained on")
    members = {}
    for info in archive.infolist():
        if info.is_dir():
            continue
        if not info.filename.endswith(".npy"):
            raise _unreadable(path, f"member {info.filename!r} is not an `.npy` array")
        key = info.filename[: -len(".npy")]
        if info.flag_bits & 0x1:  # zip's "encrypted" bit: zipfile would ask for a password
            raise _unreadable(path, f"{key!r} is encrypted (a password-protected archive)")
        try:
            with archive.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise ValueError(f"unsupported `.npy` format version {version}")
                offset = f.tell()
        except (OSError, ValueError, EOFError, NotImplementedError, zipfile.BadZipFile, zlib.error) as e:
            # NotImplementedError: a compression method zipfile does not know.
            raise _unreadable(path, f"{key!r} is truncated or corrupt", e) from e
        if dtype.hasobject:
            raise _unreadable(
                path, f"{key!r} holds Python objects, which would need unpickling (never done)"
            )
        member = _Member(info, tuple(shape), dtype, fortran_order, offset)
        # The zip's own header declares the member's size: a shape that does
        # not match it is a corrupt (or hostile) file, refused before reading.
        if member.offset + member.nbytes != info.file_size:
            raise _unreadable(
                path,
                f"{key!r} declares shape {member.shape} of {dtype} ({member.nbytes:,} bytes) "
                f"but the archive holds {info.file_size - member.offset:,} bytes for it",
            )
        members[key] = member
    return members


def _read_member(archive, path, key, member):
    try:
        data = bytearray(member.nbytes)
    except MemoryError as e:
        raise _unreadable(
            path, f"{key!r} of shape {member.shape} ({member.nbytes:,} bytes) does not fit in memory"
        ) from e
    try:
        with archive.open(member.info) as f:
            # Read past the header, not `seek`: since Python 3.12 a seek in a
            # stored member skips zipfile's CRC check of the whole member.
            f.read(member.offset)
            read = f.readinto(data)
            f.read(1)  # Reaching the end makes zipfile check the CRC.
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise _unreadable(path, f"{key!r} is truncated or corrupt", e) from e
    if read != member.nbytes:
        raise _unreadable(path, f"{key!r} is truncated")
    array = np.frombuffer(data, dtype=member.dtype)
    return array.reshape(member.shape, order="F" if member.fortran_order else "C")


def read_npz(path):
    """Reads every array of an `.npz` file (never unpickling) into a dict.

    Keys are canonical (see `canonical_keys`). Raises `ValueError` naming the
    file for anything that is not an archive of plain arrays.
    """
    path = os.fspath(path)
    with _open_archive(path) as archive:
        members = _members(archive, path)
        arrays = {key: _read_member(archive, path, key, m) for key, m in members.items()}
    return canonical_keys(arrays, path)


def check_archive(path, encoder_of=None):
    """Raises `ValueError` when the file itself is at fault: not an archive
    of plain arrays, a member truncated or corrupt (zip's CRC-32), a NaN or
    infinite value (every published checkpoint is finite) or, given a model
    (`encoder_of`), an encoder of another architecture: another key or shape
    outside the parts a loader adapts to the model (head, `pre_logits`,
    position embeddings, patch size). Reads one array at a time."""
    path = os.fspath(path)
    adapted = ("head/", "pre_logits/", POSEMB_KEY, PATCH_KERNEL_KEY, GRID_KEY)
    with _open_archive(path) as archive:
        members = _members(archive, path)
        if encoder_of is not None:
            def shapes(items):  # pre-Linen GroupNorm stored (1, 1, 1, C)
                return {key: tuple(d for d in shape if d != 1) if _GROUP_NORM.search(key) else tuple(shape)
                        for key, shape in items if not key.startswith(adapted)}

            expected = shapes((key, v.shape) for key, v in checkpoint_variables(encoder_of).items())
            found = shapes((key, m.shape) for key, m in canonical_keys(members, path).items())
            if found != expected:
                other = sorted(set(found.items()) ^ set(expected.items()))[:3]
                raise _unreadable(path, f"its encoder is not the model's architecture (e.g. {other})")
        for key, member in members.items():
            array = _read_member(archive, path, key, member)
            if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                raise _unreadable(path, f"{key!r} holds NaN or infinite values")


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
            if len(parts) > 2 and BLOCK_NAME.match(parts[1]):
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


def _numpy_dtype(variable):
    try:
        return np.dtype(variable.dtype)
    except TypeError:  # bfloat16 variables: any float casts to them.
        return np.dtype("float32")


def _as_stored(value, variable):
    """`value` as the variable will hold it: a float64 beyond float32's range
    is finite in the file but infinite once assigned, so finiteness is
    checked on this."""
    with np.errstate(over="ignore", invalid="ignore"):
        return value.astype(_numpy_dtype(variable))


def _dtype_problem(key, dtype, variable_dtype):
    # Checkpoints hold floats; an int, bool, complex, string or structured
    # array under a weight's key is a wrong file, not a value to cast.
    if dtype.kind != "f" or not np.can_cast(dtype, variable_dtype, casting="same_kind"):
        raw = dtype.kind == "V" and dtype.itemsize == 2 and not dtype.names
        why = (" (2-byte raw values: how np.savez stores bfloat16, whose type it does not record; save the "
               "arrays as float32)") if raw else ""
        return f"{key} has dtype {dtype}{why}; a floating-point array castable to {variable_dtype} is needed"
    return None


def _source_grid(path, archive, member):
    """The checkpoint's patch grid from the file's metadata."""
    grid = None
    if member.dtype.kind in "iu" and member.shape == (2,):
        grid = _read_member(archive, path, GRID_KEY, member)
    if grid is None or (grid <= 0).any():
        held = f"{member.dtype} of shape {member.shape}" if grid is None else f"{grid.tolist()}"
        raise ValueError(
            f"The weights file {path!r} has invalid `{GRID_KEY}` metadata: 2 positive "
            f"ints (rows, cols) are needed, the file holds {held}. Pass "
            f"`source_grid=(rows, cols)` or fix the file. Received: weights={path!r}"
        )
    return tuple(int(v) for v in grid)


class LoadPlan:
    """Values checked against a model, ready to assign (see `prepare_npz`)."""

    def __init__(self, path, values, notes):
        self.path, self.values, self.notes = path, values, notes

    def apply(self, model):
        targets = checkpoint_variables(model)
        with interrupts.held_back("the weights are assigned"):  # all or nothing, Ctrl-C too
            for key, value in self.values.items():
                targets[key].assign(np.asarray(value, dtype=targets[key].dtype))
        for note in self.notes:
            logger.info("%s: %s", os.path.basename(self.path), note)
        return list(self.notes)


def load_npz(model, path, interpolation="linear", source_grid=None, allow_nonfinite=False):
    """Loads an original-format `.npz` checkpoint into `model`, all or nothing.

    See `prepare_npz` for what is checked and how the checkpoint is fitted;
    nothing is assigned unless everything passes.

    Returns:
        The list of notes about what was adapted.
    """
    plan = prepare_npz(model, path, interpolation, source_grid, allow_nonfinite)
    return plan.apply(model)


def prepare_npz(model, path, interpolation="linear", source_grid=None, allow_nonfinite=False):
    """Reads and checks an original-format `.npz` checkpoint for `model`.

    Nothing is assigned: the returned `LoadPlan` does that. Every key, shape
    and dtype is checked from the archive's headers first, then only the
    arrays the model uses are read and checked for finite values; any problem
    raises one `ValueError` that lists them all.

    Rules (as the original `load_pretrained`, google-research/vision_transformer
    `checkpoint.py`):
    - Position embeddings of another grid are resampled (`interpolation`
      `"linear"` reproduces the original exactly; `"bicubic"` is PyTorch's,
      `"bicubic_antialias"` timm's). The source grid is `source_grid`, else
      the file's metadata (keras_vit records it), else square. Without
      either, an embedding of the model's shape is kept as it is, as the
      original's rule (resample when the shape differs) does.
    - The head is loaded when its shape matches the model's and both have
      `pre_logits` or neither; otherwise it is re-initialised for
      fine-tuning (zeros; the bias `head_bias_init`).
    - A checkpoint `pre_logits` layer is dropped when the model has none; a
      model `pre_logits` layer missing from the checkpoint keeps its fresh
      initialisation.

    Args:
        model: a keras_vit model.
        path: path of the `.npz` file.
        interpolation: `"linear"`, `"bicubic"` or `"bicubic_antialias"`.
        source_grid: `(rows, cols)` of the checkpoint's patch grid, needed only
            for files without keras_vit metadata whose grid is not square,
            or not the model's grid though of its size.
        allow_nonfinite: accept NaN and infinite values (refused by default).
    """
    path = os.fspath(path)
    targets = checkpoint_variables(model)
    parts = anatomy(model)
    with _open_archive(path) as archive:
        members = canonical_keys(_members(archive, path), path)
        problems, notes, reads = _check_headers(targets, members)
        if problems:
            raise _load_error(model, path, members, problems)
        grid = members.pop(GRID_KEY, None)
        if source_grid is None and grid is not None:
            source_grid = _source_grid(path, archive, grid)
        arrays = {key: _read_member(archive, path, key, members[key]) for key in reads}

    values = {}
    for key, variable in targets.items():
        shape = tuple(variable.shape)
        if key not in arrays:
            if key.startswith("head/"):
                values[key] = _initial_value(model.get_layer("head"), key, shape)
            continue
        value = arrays[key]
        finite = allow_nonfinite or np.isfinite(_as_stored(value, variable))
        if not np.all(finite):
            count = int(value.size - np.count_nonzero(finite))
            problems.append(
                f"{key} holds {count} NaN or infinite value(s) "
                "(pass allow_nonfinite=True to load them anyway)"
            )
            continue
        if key == POSEMB_KEY:
            try:
                value = _fit_posemb(value, shape, parts, source_grid, interpolation, notes)
            except ValueError as e:
                problems.append(f"{key}: {e}")
                continue
        if key == PATCH_KERNEL_KEY and value.shape != shape:
            if parts.hybrid:
                problems.append(f"{key}: patch {value.shape[:2]} in the checkpoint, {shape[:2]} in the model: a "
                                "hybrid's patch size on its ResNet feature map cannot change")
                continue
            value = resize_patch_embedding(value, shape[:2])
            notes.append(f"patch embedding PI-resized from {arrays[key].shape[0]}x{arrays[key].shape[1]} to "
                         f"{shape[0]}x{shape[1]} patches (FlexiViT).")
        values[key] = value.reshape(shape)  # Pre-Linen GroupNorm: (1, 1, 1, C).
    if problems:
        raise _load_error(model, path, members, problems)
    return LoadPlan(path, values, notes)


def _check_headers(targets, members):
    """Problems, notes and the keys to read, from shapes and dtypes alone."""
    problems, notes, reads = [], [], []
    has_head = "head/kernel" in targets
    # The head loads whole or not at all (the original `load_pretrained`
    # re-initialises it when its kernel's shape differs). A head trained on
    # `tanh(pre_logits(x))` does not fit raw features, nor the reverse, even
    # where the shapes agree (every imagenet21k file has pre_logits as wide
    # as the model).
    model_pre_logits, file_pre_logits = ("pre_logits/kernel" in keys for keys in (targets, members))
    head_fits = model_pre_logits == file_pre_logits and all(
        key in members and members[key].shape == tuple(variable.shape)
        for key, variable in targets.items() if key.startswith("head/"))
    for key, variable in targets.items():
        shape = tuple(variable.shape)
        if key.startswith("head/") and not head_fits and key in members and members[key].shape == shape:
            if model_pre_logits == file_pre_logits:
                why = "the rest of the head does not fit"
            elif file_pre_logits:
                why = ("the checkpoint's head reads its pre_logits layer, which the model lacks (give the model "
                       "representation_size to keep both)")
            else:
                why = "the model's head reads a pre_logits layer the checkpoint lacks"
            notes.append(f"`{key}` is re-initialised for fine-tuning ({_INITIAL_HEAD}): {why}.")
            continue
        if key not in members:
            if key.startswith("head/"):
                notes.append(f"`{key}` is not in the checkpoint: initialised for fine-tuning.")
            elif key.startswith("pre_logits/"):
                notes.append(f"`{key}` is not in the checkpoint: kept freshly initialised.")
            else:
                problems.append(f"missing from the checkpoint: {key} {shape}")
            continue
        member = members[key]
        problem = _dtype_problem(key, member.dtype, _numpy_dtype(variable))
        if problem:
            problems.append(problem)
        elif key == POSEMB_KEY:
            if len(member.shape) != 3 or member.shape[0] != 1 or member.shape[-1] != shape[-1]:
                problems.append(
                    f"{key}: shape {member.shape} cannot fit the model's {shape}"
                )
            else:
                reads.append(key)
        elif key == PATCH_KERNEL_KEY and member.shape != shape and len(member.shape) == 4 \
                and member.shape[2:] == shape[2:]:
            reads.append(key)  # another patch size: PI-resized (`_fit_patch_kernel`)
        elif key.startswith("head/") and member.shape != shape:
            notes.append(
                f"`{key}` has shape {member.shape} in the checkpoint and {shape} in "
                f"the model: re-initialised for fine-tuning ({_INITIAL_HEAD})."
            )
        elif member.shape == shape or (
            # Pre-Linen GroupNorm stored scale/bias as (1, 1, 1, C).
            _GROUP_NORM.search(key) and tuple(d for d in member.shape if d != 1) == shape
        ):
            reads.append(key)
        else:
            problems.append(
                f"shape mismatch: {key} is {member.shape} in the checkpoint, {shape} in the model"
            )
    ignorable = ("pre_logits/",) + (() if has_head else ("head/",))
    for key in sorted(set(members) - set(targets) - {GRID_KEY}):
        if key.startswith(ignorable):
            notes.append(f"`{key}` in the checkpoint is not used by this model: dropped.")
        else:
            problems.append(f"not in the model: {key} {members[key].shape}")
    return problems, notes, reads


def _load_error(model, path, members, problems):
    listed = "\n  ".join(problems)
    return ValueError(
        f"Cannot load the checkpoint {path!r} into model {model.name!r}; the model "
        f"is unchanged. Checkpoint: {_describe(members)}. {len(problems)} problem(s):"
        f"\n  {listed}\nReceived: weights={path!r}"
    )


# What `_initial_value` gives a ViT head (`keras_vit.models.vit`).
_INITIAL_HEAD = "zeros; the bias head_bias_init"


def _initial_value(layer, key, shape):
    initializer = layer.kernel_initializer if key.endswith("kernel") else layer.bias_initializer
    return keras.ops.convert_to_numpy(initializer(shape, dtype="float32"))


PATCH_KERNEL_KEY = "embedding/kernel"


def _fit_posemb(value, shape, parts, source_grid, interpolation, notes):
    prefix = parts.posemb_prefix_tokens
    target_grid = parts.grid
    if value.ndim != 3 or value.shape[-1] != shape[-1]:
        raise ValueError(f"shape {value.shape} cannot fit the model's {shape}")
    if source_grid is None:
        if value.shape == shape:  # The original's rule: an embedding of the model's shape is its grid.
            if target_grid[0] != target_grid[1]:
                notes.append(
                    f"position embeddings: the file records no grid; its {value.shape[1] - prefix} grid rows are "
                    f"taken as the model's {target_grid[0]}x{target_grid[1]} (pass source_grid=(rows, cols) if "
                    "they were another grid)."
                )
            return value
        source_grid = infer_square_grid(value.shape[1] - prefix)
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
    recorded under `keras_vit/posemb_grid`.

    The file is written atomically (a temporary file renamed over `path`); an
    existing file keeps its permission bits, a symbolic link is written
    through (its target is replaced, the link stays), and temporaries left by
    a killed export are removed by the next export to the same path. Only a
    regular file or a new path is written: a directory, FIFO or device node
    (also behind a link) is refused, untouched.
    """
    rows, cols = anatomy(model).grid  # first: it names what is not a keras_vit model
    check_float_kernels(model, "export_npz")
    arrays = {
        key: keras.ops.convert_to_numpy(variable).astype(np.float32)
        for key, variable in checkpoint_variables(model).items()
    }
    if rows != cols:
        arrays[GRID_KEY] = np.array([rows, cols], np.int32)
    return write_npz(path, arrays)


def file_mode(target):
    """The permission bits for a file about to be written at `target` through
    a temporary file: the existing file's, else what `open` would give
    (0666 less the umask; `tempfile.mkstemp` creates 0600 files, which other
    users could not read)."""
    with contextlib.suppress(FileNotFoundError):  # (another writer may remove it meanwhile)
        return os.stat(target).st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


# The suffix of the temporary files of writes (`write_atomically`): only
# these are taken for a killed write's.
_PARTIAL = ".keras_vit-partial"


def write_npz(path, arrays):
    """Writes `arrays` (name -> array) to the `.npz` file `path` as
    `export_npz` writes a checkpoint (see `write_atomically`). Returns
    the path written (`~` expanded)."""
    def write(f):
        np.savez(f, **arrays)

    return write_atomically(path, write)


def check_target(path, argument="path"):
    """The file `path` names (`~` expanded, through symbolic links), refused
    unless it is a regular file or a new one; returns `(path, target)`."""
    path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"`{argument}` must be the path of a file. Received: {argument}={path!r}")
    path = os.path.expanduser(path)  # as `load_weights` reads it
    if path.endswith(("/", os.sep)) or os.path.basename(path) in (".", ".."):
        # `realpath` drops the slash: a file named like the folder was written.
        raise ValueError(f"`{argument}` ends with a separator (or '.'), so it names a folder, not a file; nothing "
                         f"was written. Received: {argument}={path!r}")
    target = os.path.realpath(path)  # Through symbolic links.
    # Only regular files are replaced: renaming over a FIFO or a device node
    # (as root, `/dev/null`) would replace it with a regular file.
    if os.path.exists(target) and not stat.S_ISREG(os.stat(target).st_mode):
        kind = "a directory" if os.path.isdir(target) else "not a regular file (a FIFO, device or socket)"
        raise ValueError(
            f"`{argument}` must be a regular file or a new one: {target!r} is {kind}; nothing was "
            f"written. Received: {argument}={path!r}"
        )
    return path, target


def write_atomically(path, write, argument="path"):
    """Writes the file `path` with `write(binary_file)`: to a temporary file
    beside it, renamed over `path` only when whole (a reader never sees half
    a file, and a failed write leaves the old file), keeping an existing
    file's permission bits, through symbolic links, refusing anything but a
    regular file (`check_target`), removing the temporaries of writes that
    were killed. A failure names `argument` and `path`. Returns `path`,
    `~` expanded."""
    return write_files_atomically([(path, write)], argument)[0]


def write_files_atomically(files, argument="path"):
    """`write_atomically` for files that belong together (`[(path, write),
    ...]`, e.g. a checkpoint's weights and its config): every one is written
    whole before any is renamed, the renames are not cut by a Ctrl-C, and
    the old files of the later ones are removed before the first is
    replaced, so that a process killed between the renames leaves a file
    missing (refused when read), never files of two writes (two processes
    writing at once may still leave one's file beside the other's).
    Returns the paths."""
    pending = []  # (handle, temporary, target, path)
    try:
        for path, write in files:
            path, target = check_target(path, argument)
            directory, base = os.path.split(target)
            prefix = f".{base}.tmp-"
            try:
                os.makedirs(directory, exist_ok=True)
                mode = file_mode(target)
                _remove_stale_temporaries(directory, prefix)
                handle, tmp = _locked_temporary(directory, prefix)
            except OSError as error:  # a file where a folder should be, a read-only disk
                raise _naming(error, argument, path) from error
            pending.append((handle, tmp, target, path))
            try:
                with os.fdopen(handle, "wb", closefd=False) as f:
                    write(f)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, mode)
            except OSError as error:  # a full disk
                raise _naming(error, argument, path) from error
        with interrupts.held_back("the files are renamed"):
            try:
                for _, _, target, _ in pending[1:]:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(target)
                for _, tmp, target, path in pending:
                    os.replace(tmp, target)
            except OSError as error:
                raise _naming(error, argument, path) from error
    finally:
        for handle, tmp, _, _ in pending:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            os.close(handle)
    return [path for _, _, _, path in pending]


def _locked_temporary(directory, prefix):
    """A new temporary file `(fd, path)`, locked until closed: a concurrent
    write sees it is alive. Another write's clean-up may remove it between
    its creation and the lock; then a new one is made."""
    while True:
        handle, tmp = tempfile.mkstemp(prefix=prefix, suffix=_PARTIAL, dir=directory)
        if fcntl is None:
            return handle, tmp
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if os.path.samestat(os.fstat(handle), os.stat(tmp)):
                return handle, tmp
        except FileNotFoundError:
            pass
        os.close(handle)


def _naming(error, argument, path):
    """`error` (an OSError) saying what was being written."""
    message = f"{error.strerror or error}: writing {argument}={path!r} failed; an existing file there is unchanged"
    return type(error)(error.errno, message) if error.errno is not None else type(error)(message)


def _remove_stale_temporaries(directory, prefix):
    """Removes temporaries of exports that died (their lock is free)."""
    if fcntl is None:
        return
    for entry in os.scandir(directory):
        if not (entry.name.startswith(prefix) and entry.name.endswith(_PARTIAL)
                and entry.is_file(follow_symlinks=False)):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # Another export is writing it.
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(entry.path)
        finally:
            os.close(fd)
