"""Loading Keras `.weights.h5` files, all or nothing.

Keras' own `load_weights` ignores weights of the file that the model lacks
(a deeper model's blocks load silently into a shallower one). Here the file's
datasets are compared first with those Keras writes for this very model:
any extra, missing or mis-shaped weight, non-floating dtype or non-finite
value is refused with the full list, before anything is assigned.
"""

import os
import tempfile

import h5py
import ml_dtypes
import numpy as np

from keras_vit import interrupts


def _datasets(path):
    """`{dataset path: h5py dataset info}` of every array in an open file."""
    found = {}
    path.visititems(
        lambda name, item: found.__setitem__(name, item) if isinstance(item, h5py.Dataset) else None
    )
    return found


def _model_datasets(path):
    """`_datasets` less the optimizer's state (`optimizer/...`), which a
    model saved after `fit` carries: the weights are compared, and Keras'
    `load_weights` restores an optimizer's state where the model has one."""
    return {name: item for name, item in _datasets(path).items() if not name.startswith("optimizer/")}


def _is_bfloat16(dataset):
    # Keras stores bfloat16 variables with a `dtype` attribute (saving_lib).
    return dataset.attrs.get("dtype") == "bfloat16"


def _values(dataset):
    if _is_bfloat16(dataset):
        return np.array(dataset, dtype=ml_dtypes.bfloat16).astype(np.float32)
    return dataset[()]


def _dtype(dataset):
    return np.dtype(ml_dtypes.bfloat16) if _is_bfloat16(dataset) else dataset.dtype


def _finite_as_stored(dataset, dtype):
    """Whether the values are finite as the model will hold them (`dtype`):
    a float64 beyond float32's range is finite in the file, infinite once
    assigned."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(_values(dataset).astype(dtype).astype(np.float32)).all())


def _expected_layout(model):
    """Dataset paths, shapes and dtypes of the model's own `.weights.h5`
    file, as Keras names them (written to a private temporary file, then
    deleted)."""
    with tempfile.TemporaryDirectory() as directory:
        own = os.path.join(directory, "model.weights.h5")
        model.save_weights(own)
        with h5py.File(own, "r") as f:
            return {name: (item.shape, _dtype(item)) for name, item in _model_datasets(f).items()}


def load_keras_weights(model, path, allow_nonfinite=False):
    """Loads a Keras `.weights.h5` file into `model`; returns `[]` (no notes)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Weights file not found. Received: weights={path!r}")
    expected = _expected_layout(model)
    problems = []
    try:
        with h5py.File(path, "r") as f:
            stored = _model_datasets(f)
            for name in sorted(set(stored) - set(expected)):
                problems.append(f"not in the model: {name} {stored[name].shape}")
            for name in sorted(set(expected) - set(stored)):
                problems.append(f"missing from the file: {name} {expected[name][0]}")
            for name in sorted(set(expected) & set(stored)):
                dataset = stored[name]
                shape, dtype = expected[name]
                if dataset.shape != shape:
                    problems.append(
                        f"shape mismatch: {name} is {dataset.shape} in the file, "
                        f"{shape} in the model"
                    )
                elif dataset.dtype.kind != "f" and not _is_bfloat16(dataset):
                    problems.append(f"{name} has dtype {dataset.dtype}; floats are needed")
                elif not allow_nonfinite and not _finite_as_stored(dataset, dtype):
                    problems.append(
                        f"{name} holds NaN or infinite values "
                        "(pass allow_nonfinite=True to load them anyway)"
                    )
    except PermissionError as e:
        raise PermissionError(
            f"The weights file {path!r} cannot be read: permission denied ({e}). "
            f"Received: weights={path!r}"
        ) from e
    except OSError as e:
        raise ValueError(
            f"Cannot read the weights file {path!r}: it is truncated, corrupt or not "
            f"an HDF5 file ({type(e).__name__}: {e}). Received: weights={path!r}"
        ) from e
    if problems:
        listed = "\n  ".join(problems)
        raise ValueError(
            f"Cannot load {path!r} into model {model.name!r}; the model is unchanged. "
            f"{len(problems)} problem(s):\n  {listed}\nReceived: weights={path!r}"
        )
    before = [np.array(v.numpy()) for v in model.weights]
    try:
        with interrupts.held_back("the weights are loaded"):  # all or nothing, Ctrl-C too
            model.load_weights(path)
    except Exception as e:
        for variable, value in zip(model.weights, before):
            variable.assign(value)
        raise ValueError(
            f"Cannot load {path!r} into model {model.name!r}; the model is "
            f"unchanged. ({type(e).__name__}: {e}) Received: weights={path!r}"
        ) from e
    return []
