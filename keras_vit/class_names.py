"""Class names of the released heads, and `decode_predictions`.

ImageNet-2012 (1,000 classes) ships with the package, in the label order of
tfds `imagenet2012` (sorted WordNet ids), which the original fine-tuned
checkpoints use; the name is the first WordNet lemma, as in the original's
demo (vit_jax.ipynb reads `ilsvrc2012_wordnet_lemmas.txt`). ImageNet-21k
(21,843 classes) names are downloaded from the BiT release, whose order the
original ImageNet-21k checkpoints share.
"""

import collections.abc
import functools
import importlib.resources
import os

import keras
import numpy as np

from keras_vit.layers.utils import is_int

IMAGENET2012_CLASSES = 1000
IMAGENET21K_CLASSES = 21843
IMAGENET21K_NAMES_URL = "https://storage.googleapis.com/bit_models/imagenet21k_wordnet_lemmas.txt"


@functools.cache
def imagenet2012_classes():
    """`(wordnet_ids, names)` of the 1,000 ImageNet-2012 classes, in head order."""
    text = (importlib.resources.files("keras_vit") / "resources" / "imagenet2012_classes.txt").read_text(
        encoding="utf-8"
    )
    ids, names = zip(*(line.split("\t") for line in text.splitlines()))
    return list(ids), list(names)


def _read_lines(path):
    """A names file: one class per line, the whole line (a name may hold a
    comma: "1,000 yen note"); blank lines are skipped."""
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f.read().splitlines() if line.strip()]


def _imagenet21k_names(path):
    """The names in BiT's lemma file `path` (one class per line, its
    comma-separated WordNet lemmas: "tench, Tinca tinca"; the first is the
    name); `ValueError` unless it is such a file (the validator of the
    download: an error page or a partial file is never cached)."""
    names = [line.split(",")[0].strip() for line in _read_lines(path)]
    if names and names[0].lstrip().lower().startswith(("<!doctype", "<html")):
        raise ValueError(f"{path!r} is an HTML page, not a names file. Received: path={path!r}")
    if len(names) != IMAGENET21K_CLASSES:
        raise ValueError(
            f"An ImageNet-21k names file has {IMAGENET21K_CLASSES} lines; "
            f"{path!r} has {len(names)}. Received: path={path!r}"
        )
    return names


def imagenet21k_class_names(path=None):
    """The 21,843 ImageNet-21k class names, in the order of the original heads.

    Args:
        path: a local copy of `imagenet21k_wordnet_lemmas.txt` (one class per
            line, comma-separated lemmas, the first is the name). None
            downloads it once from the BiT release into the weights cache,
            where only a file of 21,843 names is kept (a cached copy that is
            not is reported, deleted and downloaded again, once).

    Returns:
        A list of 21,843 names.
    """
    if path is not None:
        return _imagenet21k_names(path)
    from keras_vit.weights import cache

    read = []  # what the validator read, so the file is read once
    try:
        cache.fetch(
            "bit_models/imagenet21k_wordnet_lemmas.txt",
            validate=lambda p: read.append(_imagenet21k_names(p)),
            origin=IMAGENET21K_NAMES_URL,
        )
    except Exception as e:
        raise ValueError(
            "No ImageNet-21k class names: the download of "
            f"{IMAGENET21K_NAMES_URL} failed ({type(e).__name__}: {e}). Pass "
            "`class_names=keras_vit.class_names.imagenet21k_class_names(path)` with a local copy "
            "of imagenet21k_wordnet_lemmas.txt (or any list of 21,843 names). Received: class_names=None"
        ) from e
    return read[-1]


def _class_names(class_names, num_classes):
    if class_names is None:
        if num_classes == IMAGENET2012_CLASSES:
            return imagenet2012_classes()[1]
        if num_classes == IMAGENET21K_CLASSES:
            return imagenet21k_class_names()
        raise ValueError(
            f"No class names are known for a head of {num_classes} classes (only "
            f"ImageNet-2012, {IMAGENET2012_CLASSES}, and ImageNet-21k, "
            f"{IMAGENET21K_CLASSES}). Pass `class_names=`. Received: "
            f"predictions with {num_classes} classes"
        )
    if isinstance(class_names, (str, os.PathLike)):
        if not os.path.isfile(class_names):
            raise ValueError("`class_names` must be a list of names or the path of a names file (one per line); "
                             f"no such file. Received: class_names={class_names!r}")
        names = _read_lines(class_names)
    elif isinstance(class_names, collections.abc.Mapping):
        # Index -> name (Hugging Face's `id2label`): the keys were taken as the names.
        if not all(is_int(i) for i in class_names) or sorted(class_names) != list(range(num_classes)):
            raise ValueError(f"`class_names` as a mapping must map each class index 0..{num_classes - 1} to its "
                             f"name. Received: class_names with the keys {list(class_names)[:8]!r}")
        names = [class_names[i] for i in range(num_classes)]
    else:
        names = list(class_names)
    strange = [name for name in names if not isinstance(name, str)]
    if strange:
        # `None` or a number became the name 'None' or '3'.
        raise ValueError(f"`class_names` must hold strings. Received: class_names holding {strange[0]!r}")
    names = [str(name) for name in names]  # numpy's str_ as str
    if len(names) != num_classes:
        raise ValueError(
            f"`class_names` has {len(names)} names for predictions of "
            f"{num_classes} classes. Received: class_names of length {len(names)}"
        )
    return names


def decode_predictions(predictions, top=5, class_names=None):
    """The `top` classes of each prediction, with names.

    Args:
        predictions: `(batch, classes)` logits or probabilities (numpy or a
            backend tensor), e.g. the output of an ImageNet-2012 fine-tuned
            model.
        top: int. How many classes per example (at most all of them).
        class_names: None for the ImageNet-2012 (1,000 classes, shipped) or
            ImageNet-21k (21,843 classes, downloaded once) heads; otherwise a
            list of names, a mapping of class index to name (Hugging Face's
            `id2label`) or the path of a text file with one class per line
            (the whole line, commas included; for a local copy of BiT's
            ImageNet-21k lemma file, pass `imagenet21k_class_names(path)`).

    Returns:
        For each example, a list of `top` tuples `(class_index, name, score)`
        from the highest score down; the scores are the values given (apply a
        softmax first for probabilities). Unpacks like
        `keras.applications.imagenet_utils.decode_predictions`, whose first
        field is a WordNet id instead.
    """
    scores = np.asarray(keras.ops.convert_to_numpy(predictions))
    if scores.ndim != 2:
        raise ValueError(
            "`predictions` must have shape (batch, classes). "
            f"Received: predictions with shape {scores.shape}"
        )
    if scores.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):  # ml_dtypes' floats (mixed precision)
        scores = scores.astype(np.float32)
    if scores.dtype == bool or not np.issubdtype(scores.dtype, np.number):
        raise ValueError(
            "`predictions` must be numbers (logits, probabilities, or the "
            f"integer scores of a quantized head). Received: predictions of dtype {scores.dtype}"
        )
    num_classes = scores.shape[1]
    if not is_int(top) or top < 1:
        raise ValueError(f"`top` must be a positive int. Received: top={top!r}")
    names = _class_names(class_names, num_classes)
    # Highest first; stable: equal scores keep the class order. Integer
    # scores (a quantized LiteRT head's uint8/int8) are not negated, which
    # wraps around (0 or -128 would rank first): an ascending stable sort of
    # the reversed classes, read backwards, gives the same order.
    if np.issubdtype(scores.dtype, np.integer):
        order = num_classes - 1 - np.argsort(scores[:, ::-1], axis=1, kind="stable")[:, ::-1]
    else:
        order = np.argsort(-scores, axis=1, kind="stable")
    order = order[:, :top]
    return [
        [(int(i), names[i], float(row[i])) for i in indices]
        for row, indices in zip(scores, order)
    ]
