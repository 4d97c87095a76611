"""Loading and exporting weights: original `.npz`, Keras `.weights.h5`, names."""

import os

import keras
import numpy as np

from keras_vit.weights import registry
from keras_vit.weights.npz import export_npz, load_npz, read_npz
from keras_vit.weights.registry import available_weights
from keras_vit.weights.augreg import AugRegIndex, augreg_index

__all__ = ["AugRegIndex", "augreg_index", "available_weights", "export_npz", "load_weights", "read_npz"]


def load_weights(model, weights, variant=None, interpolation="linear", source_grid=None):
    """Loads `weights` into a keras_vit model, all or nothing.

    Args:
        model: a keras_vit model.
        weights: a path to an original `.npz` checkpoint, a path to a Keras
            `.weights.h5` file, or a registered name (`"imagenet21k"`,
            `"imagenet21k+imagenet2012"`, `"augreg"`, `"augreg+imagenet2012"`,
            `"sam"`, or an AugReg file name such as
            `"B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"`).
            Named files are fetched from the public `vit_models` bucket with
            `keras.utils.get_file` and cached under `~/.keras/models/keras_vit`
            (or `$KERAS_VIT_CACHE_DIR/models/keras_vit`).
        variant: the model's original config name; needed for registered names.
        interpolation: `"linear"` (the original's) or `"bicubic"` resampling of
            position embeddings from another resolution.
        source_grid: `(rows, cols)` of a non-square checkpoint grid that the
            file does not record.

    Returns:
        The list of notes about what was adapted (also logged to the
        `keras_vit` logger at INFO level).
    """
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(
            "`weights` must be None, a file path or a registered name. "
            f"Received: weights={weights!r}"
        )
    path = os.fspath(weights)
    if path.endswith(".weights.h5"):
        return _load_keras_weights(model, path)
    if not os.path.exists(path) and registry.is_registered(path):
        bucket_path = registry.resolve(path, variant, model.input_shape[1])
        cache_dir = os.environ.get("KERAS_VIT_CACHE_DIR")
        if cache_dir:
            # get_file silently falls back to /tmp/.keras for a missing dir.
            os.makedirs(cache_dir, exist_ok=True)
        path = keras.utils.get_file(
            fname=bucket_path.replace("/", "__"),
            origin=registry.url(bucket_path),
            cache_subdir=os.path.join("models", "keras_vit"),
            cache_dir=cache_dir,  # None: the Keras home (~/.keras).
        )
    elif not os.path.exists(path):
        names = ", ".join(registry.NAMES)
        raise ValueError(
            "`weights` is neither an existing file nor a registered name "
            f"({names}, or an AugReg file name). Received: weights={weights!r}"
        )
    return load_npz(model, path, interpolation=interpolation, source_grid=source_grid)


def _load_keras_weights(model, path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"Weights file not found. Received: weights={path!r}")
    before = [np.array(v.numpy()) for v in model.weights]
    try:
        model.load_weights(path)
    except Exception as e:
        for variable, value in zip(model.weights, before):
            variable.assign(value)
        raise ValueError(
            f"Cannot load {path!r} into model {model.name!r}; the model is "
            f"unchanged. ({type(e).__name__}: {e}) Received: weights={path!r}"
        ) from e
    return []
