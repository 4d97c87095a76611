"""Sources: the examples of one split, before preprocessing.

`from_tfds` reads any tensorflow-datasets image classification dataset,
`from_directory` a folder with one sub-folder of images per class
(`keras_vit.data.vtab.load_task` builds the VTAB tasks on `tfds_builder` and
`tfds_reader`). Each returns a `DataSource`, which the pipelines of
`keras_vit.data.pipelines` turn into batches.
"""

import contextlib
import dataclasses
import logging
import os
import random
import warnings
from typing import Callable, Optional, Tuple

import numpy as np
import tensorflow as tf

from keras_vit import locks
from keras_vit.data import _checks
from keras_vit.data import ops
from keras_vit.preprocessing import IMAGE_EXTENSIONS


class DatasetNotAvailableError(FileNotFoundError):
    """A dataset is not prepared locally and cannot be fetched.

    The message says what to download and where to put it.
    """


@dataclasses.dataclass(frozen=True)
class DataSource:
    """The examples of one split, before preprocessing.

    Args:
        dataset: `tf.data.Dataset` of dicts `{"image": ..., "label": ...}`:
            the image as encoded bytes (tf.string) or uint8 pixels
            `(H, W, C)`, the label an int64 scalar in `[0, num_classes)`.
        num_classes: int.
        num_examples: int, or None when unknown (then `cache="auto"` does
            not cache).
        class_names: tuple of str (index = label), or None.
        decode: function from `image` to a uint8 `(H, W, 3)` tensor.
        name: str used in messages.
        shuffled: optional function `seed -> tf.data.Dataset`: one pass
            over the same examples with the files read in a random order
            that `seed` (an int64 scalar tensor) determines (image folders:
            a full shuffle of the file names; tfds: `shuffle_files` with a
            seeded `ReadConfig`). Training pipelines read each epoch
            through it, with a seed of its own. None: files in `dataset`
            order.
        skipped: files left out as unreadable
            (`from_directory(..., skip_bad_images=True)`).
    """

    dataset: tf.data.Dataset
    num_classes: int
    num_examples: Optional[int] = None
    class_names: Optional[Tuple[str, ...]] = None
    decode: Callable = ops.decode_image
    name: str = "dataset"
    shuffled: Optional[Callable] = None
    skipped: Tuple[str, ...] = ()


# ---------------------------------------------------------------------------
# tensorflow-datasets.
# ---------------------------------------------------------------------------


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:  # pragma: no cover - depends on the install.
        raise ImportError(
            "tfds sources need tensorflow-datasets: `pip install tensorflow-datasets` "
            "(the `recipes` extra has it)."
        ) from e
    return tfds


def _data_dir_root(builder, data_dir):
    if data_dir:
        return os.fspath(data_dir)
    root = getattr(builder, "_data_dir_root", None)
    if root:
        return os.fspath(root)
    return os.environ.get("TFDS_DATA_DIR", os.path.expanduser("~/tensorflow_datasets"))


def _has_files(directory):
    return tf.io.gfile.isdir(directory) and bool(tf.io.gfile.listdir(directory))


def _without_catalogue(error):
    """tfds' error for an unknown name lists all its ~1,300 datasets, about
    9,000 characters, before its "Did you mean"; the list is left out."""
    lines, listing = [], False
    for line in str(error).splitlines():
        listing = line == "Available datasets:" or (listing and line.startswith("\t- "))
        if not listing:
            lines.append(line)
    return "\n".join(lines).strip()


def tfds_builder(name, *, data_dir=None, download=True, manual_dir=None, instructions=None):
    """Returns a prepared tfds builder, or raises `DatasetNotAvailableError`.

    Args:
        name: tfds name, optionally with config and version
            (`"eurosat/rgb:2.*.*"`).
        data_dir: tfds data directory. Defaults to tfds' (`~/tensorflow_datasets`
            or `$TFDS_DATA_DIR`).
        download: bool. Whether to download and prepare the dataset when it
            is not prepared in `data_dir`. With False, a missing dataset
            fails at once, without any network access.
        manual_dir: where the files of a manual-download dataset are.
            Defaults to `<data_dir>/downloads/manual`.
        instructions: optional text on how to get manual-download files,
            added to tfds' own in the error message.
    """
    tfds = _import_tfds()
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # tfds raises several types for unknown names/versions.
        raise ValueError(
            f"tensorflow-datasets cannot build dataset {name!r}: {_without_catalogue(e)}. Received: name={name!r}"
        ) from e
    if builder.is_prepared():
        return builder
    root = _data_dir_root(builder, data_dir)
    manual_instructions = getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
    if manual_instructions or instructions:
        manual_dir = os.fspath(manual_dir) if manual_dir else os.path.join(root, "downloads", "manual")
        how = "\n".join(t.strip() for t in (instructions, manual_instructions) if t)
        # What to do first: a one-line report that keeps its first lines
        # (the recipes') keeps it.
        message = (
            f"Dataset {name!r} is not prepared in {builder.data_dir} and needs a "
            f"manual download: put the files in manual_dir={manual_dir!r}, then "
            "call again with download=True (tensorflow-datasets then prepares "
            f"the dataset in data_dir). The files:\n{how}"
        )
        if not _has_files(manual_dir):
            raise DatasetNotAvailableError(message)
        if not download:
            raise DatasetNotAvailableError(
                f"Dataset {name!r} is not prepared in {builder.data_dir}; manual_dir="
                f"{manual_dir!r} holds files, and download=False: call again with "
                "download=True to prepare the dataset from them."
            )
    else:
        message = (
            f"Dataset {name!r} is not prepared in {builder.data_dir}. On a "
            "machine with network access run "
            f"`tfds.builder({name!r}, data_dir=...).download_and_prepare()` and "
            f"copy the directory to data_dir={root!r}"
        )
        if not download:
            raise DatasetNotAvailableError(f"{message}, or call with download=True here.")
        message += "."  # download=True was this call's: no advice to call with it
    with _one_preparation(builder):
        if builder.is_prepared():  # by another process while this one waited
            return tfds.builder(name, data_dir=data_dir)
        try:
            builder.download_and_prepare(
                download_config=tfds.download.DownloadConfig(manual_dir=manual_dir)
            )
        except Exception as e:  # Network errors, missing manual files, ...
            # The cause first: a missing package or a full disk is not fixed by
            # the network advice that follows.
            raise DatasetNotAvailableError(
                f"Preparing dataset {name!r} in {builder.data_dir} failed: "
                f"{type(e).__name__}: {e}\n{message}"
            ) from e
        return builder


@contextlib.contextmanager
def _one_preparation(builder):
    """tfds has no lock: processes that prepared one dataset at once (two
    recipe runs on first use) raced to rename their folders, and tfds names
    its temporary folder with Python's `random`, which
    `keras.utils.set_random_seed` seeds alike in every run of a command, so
    they wrote into one folder. Here one process prepares (a lock next to a
    local dataset folder) while the others wait, and that name is drawn from
    a fresh state (the run's own is put back: the run draws the same after
    a preparation as without)."""
    data_dir = os.fspath(builder.data_dir)

    def say_wait(holder):
        logging.getLogger("keras_vit").warning(
            f"Waiting for {holder}, which prepares {builder.name!r} in {data_dir} ...")

    lock = (contextlib.nullcontext() if "://" in data_dir else
            locks.waiting(data_dir + ".lock", say_wait, record_holder=True))
    state = random.getstate()
    random.seed()
    try:
        with lock:
            yield
    finally:
        random.setstate(state)


def tfds_reader(builder, split, decoders):
    """`read(seed=None, shuffle=False)` -> `builder.as_dataset(split)`.

    With `shuffle`, tfds reads the shard files in the random order `seed`
    gives, as vit_jax and big_vision read training data
    (`shuffle_files=True`; the pipelines give each epoch its own seed).
    tfds' own cache is off for it: a cache would replay the first order (the
    pipelines cache themselves).
    """
    tfds = _import_tfds()
    _check_split_files(builder, split)

    def read(seed=None, shuffle=False):
        read_config = None
        if shuffle:
            # An ordered dataset (`disable_shuffling=True`: class by class,
            # say) refuses shuffled reads unless its ordering guard is off;
            # training wants exactly that shuffle.
            read_config = tfds.ReadConfig(shuffle_seed=seed, shuffle_reshuffle_each_iteration=False,
                                          try_autocache=False, enable_ordering_guard=False)
        def dataset():
            return builder.as_dataset(split=split, decoders=decoders, shuffle_files=shuffle, read_config=read_config)

        return ops.seeded_dataset(dataset) if shuffle else dataset()

    return read


def _check_split_files(builder, split):
    """A data_dir copied in part (`is_prepared()` reads only its info
    files) fails here, naming the missing shard files, not in the middle of
    `fit`. One listing of the folder (`gs://` included), not one call per
    file."""
    try:
        wanted = {os.path.basename(os.fspath(f.filename)) for f in builder.info.splits[split].file_instructions}
    except Exception:  # a split string tfds cannot resolve: `as_dataset` names it
        return
    missing = sorted(wanted - set(tf.io.gfile.listdir(os.fspath(builder.data_dir))))
    if missing:
        raise DatasetNotAvailableError(
            f"Dataset {builder.name!r} in {builder.data_dir} lacks {len(missing)} of the {len(wanted)} files of "
            f"split {split!r} ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): a copy in part? "
            "Copy the missing files, or delete the folder and prepare the dataset again (download=True). "
            f"Received: split={split!r}"
        )


def split_size(builder, split):
    """The number of examples of `split` in a tfds builder's info, or None
    where the info does not say (not prepared, mocked, or a split string
    tfds cannot size)."""
    try:
        size = builder.info.splits[split].num_examples
    except Exception:  # Not prepared (e.g. mocked) or an unusual split spec.
        return None
    return int(size) if size else None


def from_tfds(
    name,
    split="train",
    *,
    data_dir=None,
    download=True,
    manual_dir=None,
    image_key="image",
    label_key="label",
    shuffle_files=False,
):
    """A split of any tensorflow-datasets image classification dataset.

    Args:
        name: tfds name, optionally with config and version
            (`"cifar10"`, `"eurosat/rgb:2.*.*"`).
        split: tfds split string, slicing included (`"train[:98%]"`,
            `"train[:800]+validation[:200]"`). Defaults to `"train"`.
        data_dir: tfds data directory. Defaults to tfds' own.
        download: bool. Download and prepare the dataset when it is not in
            `data_dir`. Defaults to True. With False a missing dataset raises
            `DatasetNotAvailableError` at once.
        manual_dir: files of manual-download datasets. Defaults to
            `<data_dir>/downloads/manual`.
        image_key: the image feature. Defaults to `"image"`.
        label_key: the `ClassLabel` feature. Defaults to `"label"`.
        shuffle_files: bool. Read the files of `DataSource.dataset` in
            random order. Defaults to False (reproducible order). Training
            pipelines shuffle the files anyway, seeded (`DataSource.shuffled`).

    Returns:
        A `DataSource`. Images stay encoded until the pipeline decodes them
        (3 channels; grey-scale is replicated), so caching holds bytes.
    """
    tfds = _import_tfds()
    builder = tfds_builder(name, data_dir=data_dir, download=download, manual_dir=manual_dir)
    features = builder.info.features
    for key, arg in ((image_key, "image_key"), (label_key, "label_key")):
        if key not in features:
            raise ValueError(
                f"Dataset {name!r} has no feature {key!r}; its features are "
                f"{sorted(features)}. Received: {arg}={key!r}"
            )
    if not isinstance(features[image_key], tfds.features.Image):
        raise ValueError(
            f"Feature {image_key!r} of {name!r} is not an image ({type(features[image_key]).__name__}); "
            f"its image features are {sorted(k for k in features if isinstance(features[k], tfds.features.Image))}. "
            f"Received: image_key={image_key!r}"
        )
    num_classes = getattr(features[label_key], "num_classes", None)
    if not num_classes:
        raise ValueError(
            f"Feature {label_key!r} of {name!r} is not a class label. Received: label_key={label_key!r}"
        )
    read = tfds_reader(builder, split, {image_key: tfds.decode.SkipDecoding()})
    try:
        dataset = read(shuffle=shuffle_files)
    except (ValueError, KeyError, AssertionError) as e:
        raise ValueError(f"Bad split for {name!r}: {e}. Received: split={split!r}") from e

    @tf.autograph.experimental.do_not_convert
    def select(example):
        return {"image": example[image_key], "label": tf.cast(example[label_key], tf.int64)}

    return DataSource(
        dataset=dataset.map(select, num_parallel_calls=tf.data.AUTOTUNE),
        num_classes=int(num_classes),
        num_examples=split_size(builder, split),
        class_names=tuple(features[label_key].names),
        decode=ops.decode_image,
        name=name,
        shuffled=lambda seed: read(seed, shuffle=True).map(select, num_parallel_calls=tf.data.AUTOTUNE),
    )


# ---------------------------------------------------------------------------
# Image folders.
# ---------------------------------------------------------------------------


def _decode_error(path):
    """TensorFlow's one-line reason why `path` does not read as an image."""
    try:
        ops.decode_image(tf.io.read_file(os.fsencode(path)))
    except tf.errors.OpError as e:
        return ops.op_error_message(e)
    return "no error when read again"  # Changed between the two reads.


def _file_names(paths):
    """Paths as TensorFlow strings: their bytes on disk. A name that is not
    UTF-8 (Latin-1 from an old archive) reaches Python with surrogates,
    which a tensor of str refused without naming the file."""
    return [os.fsencode(path) for path in paths]


def _unreadable(paths):
    """Indices of the files that TensorFlow cannot read and decode.

    One parallel pass decodes every file as the pipelines will
    (`ops.decode_image`); the files that fail are dropped by
    `ignore_errors`, so the missing indices are the bad files.
    """
    files = tf.data.Dataset.from_tensor_slices((tf.range(len(paths), dtype=tf.int64), _file_names(paths)))

    @tf.autograph.experimental.do_not_convert
    def probe(index, path):
        # Returning the decoded shape keeps the decode in the graph.
        return index, tf.shape(ops.decode_image(tf.io.read_file(path)))

    good = np.zeros(len(paths), bool)
    probed = files.map(probe, num_parallel_calls=tf.data.AUTOTUNE).ignore_errors()
    for indices, _ in probed.batch(4096).as_numpy_iterator():
        good[indices] = True
    return np.flatnonzero(~good)


def _walk(folder):
    """`tf.io.gfile.walk`, but on a local disk linked sub-folders are not
    followed, as in `keras.utils.image_dataset_from_directory`: a link to
    a parent folder gave every image again, under this class's label, until
    the path grew too long. (A class folder may itself be a link.)"""
    if "://" in folder:  # gs:// and other file systems have no links
        return tf.io.gfile.walk(folder)
    return os.walk(folder, followlinks=False)


def from_directory(
    directory,
    *,
    extensions=IMAGE_EXTENSIONS,
    class_names=None,
    check_images=True,
    skip_bad_images=False,
):
    """Images in one sub-folder per class: `directory/<class>/<image>`
    (`<image>` may lie in sub-folders of the class folder; linked
    sub-folders are not followed, as in Keras' `image_dataset_from_directory`).

    Class indices follow the sorted sub-folder names, or `class_names`;
    `DataSource.dataset` lists the files in sorted order and training
    pipelines read them in a new seeded random order every epoch
    (`DataSource.shuffled`). Works on any path `tf.io.gfile` reads, `gs://`
    included.

    Args:
        directory: the folder holding one sub-folder per class.
        extensions: file name endings that count as images (case does not
            matter). Defaults to JPEG, PNG, BMP and GIF.
        class_names: optional sequence of the expected class folder names,
            in label order, e.g. the training source's `class_names` when
            loading its test folder. The folders must be exactly these;
            otherwise a `ValueError` names both sets. Defaults to the
            sorted sub-folders.
        check_images: bool. Decode every file once, now, so that a corrupt,
            empty or non-image file fails here with its name rather than
            mid-training. Defaults to True; False saves that pass on very
            large folders (a bad file then stops training with
            TensorFlow's error).
        skip_bad_images: bool. With `check_images`, leave unreadable files
            out (with a warning; they are in `DataSource.skipped`) instead
            of raising. Defaults to False.

    Returns:
        A `DataSource` with `class_names`.
    """
    directory = os.fspath(directory)
    if isinstance(directory, str) and directory.startswith("file://"):  # the local disk: its links as any path's
        directory = directory[len("file://"):]
    if not isinstance(directory, str) or not tf.io.gfile.isdir(directory):
        _checks.fail("directory", directory, "an existing folder")
    _checks.boolean(check_images, "check_images")
    _checks.boolean(skip_bad_images, "skip_bad_images")
    if skip_bad_images and not check_images:
        raise ValueError(
            "`skip_bad_images=True` needs `check_images=True` (bad images are "
            "found by the check). Received: check_images=False"
        )
    # A str is a sequence of its characters: ".png" matched every name ending in "g".
    given = extensions
    try:
        extensions = () if isinstance(given, (str, bytes)) else tuple(given)
    except TypeError:
        extensions = ()
    if not extensions or not all(isinstance(e, str) and e for e in extensions):
        _checks.fail("extensions", given, "a sequence of file name endings such as ('.jpg', '.png')")
    extensions = tuple(e.lower() for e in extensions)
    found = sorted(
        entry.rstrip("/")
        for entry in tf.io.gfile.listdir(directory)
        if not entry.startswith(".") and tf.io.gfile.isdir(os.path.join(directory, entry))
    )
    if not found:
        raise ValueError(
            "`directory` must hold one sub-folder of images per class; it has "
            f"no sub-folder. Received: directory={directory!r}"
        )
    if class_names is None:
        class_names = tuple(found)
    else:
        if isinstance(class_names, str) or not all(isinstance(c, str) for c in class_names):
            _checks.fail("class_names", class_names, "a sequence of str")
        class_names = tuple(class_names)
        repeated = sorted({c for c in class_names if class_names.count(c) > 1})
        if repeated:
            _checks.fail("class_names", list(class_names), f"distinct names; {repeated} repeat")
        if set(class_names) != set(found):
            missing = sorted(set(class_names) - set(found))
            extra = sorted(set(found) - set(class_names))
            raise ValueError(
                f"The class folders of directory={directory!r} are {found}, "
                f"but class_names={list(class_names)} (missing folders: {missing}; "
                f"folders not in class_names: {extra}). Train and test folders "
                "must hold the same classes, or labels would not match."
            )
    paths, labels = [], []
    for index, class_name in enumerate(class_names):
        # Sub-folders of a class folder count too, as in
        # `keras.utils.image_dataset_from_directory` (they were left out without a word).
        files = sorted(
            os.path.join(root, f)
            for root, _, names in _walk(os.path.join(directory, class_name))
            if not any(part.startswith(".") for part in os.path.relpath(root, directory).split(os.sep))
            for f in names
            if not f.startswith(".") and f.lower().endswith(extensions)
        )
        paths += files
        labels += [index] * len(files)
    skipped = ()
    if check_images and paths:
        bad = _unreadable(paths)
        if len(bad):
            listing = "\n".join(f"  {paths[i]}: {_decode_error(paths[i])}" for i in bad[:10])
            more = f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else ""
            if not skip_bad_images:
                raise ValueError(
                    f"{len(bad)} file(s) in directory={directory!r} cannot be read "
                    f"as images:\n{listing}{more}\nFix or remove them, or pass "
                    "skip_bad_images=True to leave them out."
                )
            warnings.warn(
                f"Skipped {len(bad)} unreadable image file(s) in {directory!r}:\n{listing}{more}",
                stacklevel=2,
            )
            skipped = tuple(paths[i] for i in bad)
            keep = np.ones(len(paths), bool)
            keep[bad] = False
            paths = [p for p, k in zip(paths, keep) if k]
            labels = [label for label, k in zip(labels, keep) if k]
    counts = np.bincount(labels, minlength=len(class_names))
    empty = [os.path.join(directory, class_names[i]) for i in np.flatnonzero(counts == 0)]
    if empty:
        raise ValueError(
            f"Class folder(s) {empty} hold no {'readable ' if skipped else ''}image files "
            f"({', '.join(extensions)}); an empty folder would add a class that "
            f"never occurs. Received: directory={directory!r}"
        )
    files = tf.data.Dataset.from_tensor_slices({"path": _file_names(paths), "label": tf.constant(labels, tf.int64)})

    @tf.autograph.experimental.do_not_convert
    def read(example):
        return {"image": tf.io.read_file(example["path"]), "label": example["label"]}

    def shuffled(seed):
        # A full shuffle of the file names (cheap: strings), before any
        # file is read; sorted folders would otherwise give batches of one
        # class from a shuffle buffer smaller than the folder.
        order = ops.seeded_dataset(lambda: files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=False))
        return order.map(read, num_parallel_calls=tf.data.AUTOTUNE)

    return DataSource(
        dataset=files.map(read, num_parallel_calls=tf.data.AUTOTUNE),
        num_classes=len(class_names),
        num_examples=len(paths),
        class_names=class_names,
        decode=ops.decode_image,
        name=directory,
        shuffled=shuffled,
        skipped=skipped,
    )
