"""Loading and exporting weights: original `.npz`, Keras `.weights.h5`, names."""

import os

import keras

from keras_vit.anatomy import anatomy
from keras_vit.layers.position_embedding import check_interpolation
from keras_vit.layers.utils import check_bool
from keras_vit.variants import resolve_variant
from keras_vit.weights import cache, hub, registry
from keras_vit.weights.hub import export_timm
from keras_vit.weights.h5 import load_keras_weights
from keras_vit.weights.npz import check_archive, export_npz, load_npz, prepare_npz, read_npz
from keras_vit.weights.augreg import AugRegIndex, augreg_index

__all__ = ["AugRegIndex", "augreg_index", "check_source", "export_npz", "export_timm", "load_weights", "read_npz"]


def load_weights(
    model, weights, variant=None, interpolation=None, source_grid=None,
    allow_nonfinite=False,
):
    """Loads `weights` into a keras_vit model, all or nothing.

    Every array is checked (key, shape, floating dtype, finite values) before
    any variable is assigned; any problem raises one `ValueError` naming the
    file and leaves the model unchanged.

    Args:
        model: a keras_vit model.
        weights: a path to an original `.npz` checkpoint, a path to a Keras
            `.weights.h5` file, a timm checkpoint (`"hf-hub:timm/NAME"`
            through `huggingface_hub`, a directory with `model.safetensors`
            or a `.safetensors` file; see `keras_vit.from_timm`, which also
            builds the matching model), or a registered name (`"imagenet21k"`,
            `"imagenet21k+imagenet2012"`, `"augreg"`, `"augreg+imagenet2012"`,
            `"sam"`, or an AugReg file name such as
            `"B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"`).
            Named files are fetched from the public `vit_models` bucket into
            the cache of `keras_vit.weights.cache` (`~/.keras/models/keras_vit`
            or `$KERAS_VIT_CACHE_DIR/models/keras_vit`).
        variant: the model's original config name or an alias (`"ViT-Ti_16"`,
            `"Ti_16"`, `"Ti/16"`); needed for registered names.
        interpolation: how position embeddings from another resolution are
            resampled: `"linear"`, `"bicubic"` or `"bicubic_antialias"`.
            None (default): each format's own, `"linear"` for the original
            checkpoints (their `interpolate_posembed`), `"bicubic_antialias"`
            for timm's (their `resample_abs_pos_embed`).
        source_grid: `(rows, cols)` of a non-square checkpoint grid that the
            file does not record.
        allow_nonfinite: load NaN or infinite values instead of refusing them.

    Returns:
        The list of notes about what was adapted (also logged to the
        `keras_vit` logger at INFO level).
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a keras_vit model. Received: model={model!r}")
    allow_nonfinite = check_bool(allow_nonfinite, "allow_nonfinite")
    if interpolation is not None:  # also when nothing needs resampling, and not blamed on the file
        check_interpolation(interpolation)
    path = check_source(weights, variant)
    if not path.endswith(".weights.h5"):
        _refuse_adapted(model, weights)
    if path.startswith(hub.HUB_PREFIX) or path.endswith(".safetensors") or _is_timm_directory(path):
        return hub.load_timm(model, path, interpolation or "bicubic_antialias", source_grid=source_grid,
                             allow_nonfinite=allow_nonfinite)
    interpolation = interpolation or "linear"
    if path.endswith(".weights.h5"):
        return load_keras_weights(model, path, allow_nonfinite=allow_nonfinite)
    if _is_name(path):
        if variant is not None:  # any alias of the model ("Ti/16", "Ti_16"), as `available_weights`
            variant = resolve_variant(variant)[0]
        bucket_path = registry.resolve(path, variant, anatomy(model).image_size[0])
        registry.check_architecture(model, variant, path)
        plans, refusals = [], []

        def validate(file):
            # Loading is the check. When the model or the user's arguments
            # refuse a sound file, the file is kept and the error raised: a
            # download again would bring the same file (or none, offline).
            try:
                plans.append(prepare_npz(model, file, interpolation, source_grid, allow_nonfinite))
            except ValueError as refusal:
                check_archive(file, encoder_of=model)  # raises when the file itself is at fault
                refusals.append(refusal)

        cache.fetch(bucket_path, validate=validate)
        if refusals:
            raise refusals[-1]
        return plans[-1].apply(model)
    return load_npz(
        model, path, interpolation=interpolation, source_grid=source_grid,
        allow_nonfinite=allow_nonfinite,
    )


def check_source(weights, variant=None):
    """Checks what can be checked of `weights` without a model or a download
    (a missing file, an unknown name, a name with no checkpoint for
    `variant`), so that a training script can refuse it before reading any
    data; returns the path `load_weights` reads (`~` expanded).

    Args:
        weights: what `load_weights` takes.
        variant: the model's variant name or alias (None for a custom model).
    """
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(
            "`weights` must be None, a file path or a registered name. "
            f"Received: weights={weights!r}"
        )
    path = os.fspath(weights)
    if path.startswith(hub.HUB_PREFIX):
        return path  # the Hub answers when fetched
    path = os.path.expanduser(path)
    if _is_name(path):
        registry.resolve(path, None if variant is None else resolve_variant(variant)[0])
    elif os.path.isdir(path) and not _is_timm_directory(path):
        raise ValueError(f"`weights` is a directory without a timm checkpoint ({hub.CONFIG_NAME}, "
                         f"{hub.WEIGHTS_NAME}) in it. Received: weights={weights!r}")
    elif not os.path.exists(path):
        if path.endswith((".npz", ".h5", ".safetensors")) or os.sep in path:
            raise FileNotFoundError(f"Weights file not found. Received: weights={weights!r}")
        names = ", ".join(registry.NAMES)
        raise ValueError(
            "`weights` is neither an existing file nor a registered name "
            f"({names}, or an AugReg file name). Received: weights={weights!r}"
        )
    return path


def _is_timm_directory(path):
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, name)) for name in (hub.WEIGHTS_NAME, hub.CONFIG_NAME, *hub.PICKLE_NAMES))


def _is_name(path):
    # A registered name, unless a file of that name is here (a directory
    # named `augreg` that holds no timm files does not hide the name).
    return not os.path.isfile(path) and registry.is_registered(path)


def _refuse_adapted(model, weights):
    """An original or timm checkpoint holds plain kernels; with LoRA on, an
    adapted layer's kernel is computed (`W + (alpha / rank) * A @ B`) and
    cannot take one."""
    from keras_vit.lora import lora_layers  # keras_vit.lora imports this package

    if lora_layers(model):
        raise ValueError(
            f"Model {model.name!r} has LoRA adapters: load the checkpoint before `enable_lora` (adapters saved "
            f"with `save_lora` load with `load_lora`). The model is unchanged. Received: weights={weights!r}"
        )
