"""Input pipelines for pre-training and fine-tuning, on tfds or image folders.

A pipeline is built in two steps: a *source* (`from_tfds`, `from_directory`,
or `keras_vit.data.vtab.load_task`) gives the examples of one split, and a
*pipeline* (`pretrain_pipeline`, `finetune_pipeline`) turns them into batches
`(images, labels)`: float32 images in [-1, 1], NHWC, and float32 one-hot
labels, ready for `model.fit` / `model.evaluate` on any Keras backend.

```python
train = keras_vit.data.from_tfds("cifar10", "train[:98%]")
test = keras_vit.data.from_tfds("cifar10", "test")
model.fit(
    keras_vit.data.finetune_pipeline(train, training=True, batch_size=512),
    steps_per_epoch=100, epochs=100,
    validation_data=keras_vit.data.finetune_pipeline(test, training=False, batch_size=512),
)
```

Training pipelines repeat forever (the original trains for a number of
steps), so give `fit` a `steps_per_epoch`.
"""

import dataclasses
import numbers
import os
from typing import Callable, Optional, Tuple

import tensorflow as tf

from keras_vit.data import ops

# Training data up to this many examples is cached in memory (as encoded
# bytes), as task_adaptation does (`base.py`, 150k).
CACHE_MAX_EXAMPLES = 150_000
# vit_jax `configs/common.py`: shuffle_buffer = 50_000.
SHUFFLE_BUFFER = 50_000
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
FINETUNE_AUGMENTATIONS = ("inception_crop", "resize_crop", "resize")


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
    """

    dataset: tf.data.Dataset
    num_classes: int
    num_examples: Optional[int] = None
    class_names: Optional[Tuple[str, ...]] = None
    decode: Callable = ops.decode_image
    name: str = "dataset"


# ---------------------------------------------------------------------------
# Sources.
# ---------------------------------------------------------------------------


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:  # pragma: no cover - depends on the install.
        raise ImportError(
            "tfds sources need tensorflow-datasets: `pip install tensorflow-datasets` "
            "(or `pip install keras-vit[recipes]`)."
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
            f"tensorflow-datasets cannot build dataset {name!r}: {e}. Received: name={name!r}"
        ) from e
    if builder.is_prepared():
        return builder
    root = _data_dir_root(builder, data_dir)
    manual_instructions = getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
    if manual_instructions or instructions:
        manual_dir = os.fspath(manual_dir) if manual_dir else os.path.join(root, "downloads", "manual")
        how = "\n".join(t.strip() for t in (instructions, manual_instructions) if t)
        message = (
            f"Dataset {name!r} is not prepared in {builder.data_dir} and needs a "
            f"manual download:\n{how}\nPut the files in manual_dir={manual_dir!r}, "
            "then call again with download=True (tensorflow-datasets then "
            "prepares the dataset in data_dir)."
        )
        if not download or not _has_files(manual_dir):
            raise DatasetNotAvailableError(message)
    else:
        message = (
            f"Dataset {name!r} is not prepared in {builder.data_dir}. On a "
            "machine with network access run "
            f"`tfds.builder({name!r}, data_dir=...).download_and_prepare()` and "
            f"copy the directory to data_dir={root!r}, or call with "
            "download=True here."
        )
        if not download:
            raise DatasetNotAvailableError(message)
    try:
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=manual_dir)
        )
    except Exception as e:  # Network errors, missing manual files, ...
        raise DatasetNotAvailableError(f"{message}\nPreparing it failed with: {e!r}") from e
    return builder


def _split_size(builder, split):
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
        shuffle_files: bool. Read the files in random order. Defaults to
            False (reproducible order; the pipelines shuffle examples).

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
    num_classes = getattr(features[label_key], "num_classes", None)
    if not num_classes:
        raise ValueError(
            f"Feature {label_key!r} of {name!r} is not a class label. Received: label_key={label_key!r}"
        )
    try:
        dataset = builder.as_dataset(
            split=split,
            decoders={image_key: tfds.decode.SkipDecoding()},
            shuffle_files=shuffle_files,
        )
    except (ValueError, KeyError, AssertionError) as e:
        raise ValueError(f"Bad split for {name!r}: {e}. Received: split={split!r}") from e

    @tf.autograph.experimental.do_not_convert
    def select(example):
        return {"image": example[image_key], "label": tf.cast(example[label_key], tf.int64)}

    return DataSource(
        dataset=dataset.map(select, num_parallel_calls=tf.data.AUTOTUNE),
        num_classes=int(num_classes),
        num_examples=_split_size(builder, split),
        class_names=tuple(features[label_key].names),
        decode=ops.decode_image,
        name=name,
    )


def from_directory(directory, *, extensions=IMAGE_EXTENSIONS):
    """Images in one sub-folder per class: `directory/<class>/<image>`.

    Class indices follow the sorted sub-folder names; files are listed in
    sorted order (the training pipeline shuffles them). Works on any path
    `tf.io.gfile` reads, `gs://` included.

    Args:
        directory: the folder holding one sub-folder per class.
        extensions: file name endings that count as images (case does not
            matter). Defaults to JPEG, PNG, BMP and GIF.

    Returns:
        A `DataSource` with `class_names`.
    """
    directory = os.fspath(directory)
    if not tf.io.gfile.isdir(directory):
        raise ValueError(f"`directory` is not a folder. Received: directory={directory!r}")
    extensions = tuple(e.lower() for e in extensions)
    class_names = sorted(
        entry.rstrip("/")
        for entry in tf.io.gfile.listdir(directory)
        if not entry.startswith(".") and tf.io.gfile.isdir(os.path.join(directory, entry))
    )
    if not class_names:
        raise ValueError(
            "`directory` must hold one sub-folder of images per class; it has "
            f"no sub-folder. Received: directory={directory!r}"
        )
    paths, labels = [], []
    for index, class_name in enumerate(class_names):
        folder = os.path.join(directory, class_name)
        files = sorted(
            f for f in tf.io.gfile.listdir(folder)
            if not f.startswith(".") and f.lower().endswith(extensions)
        )
        paths += [os.path.join(folder, f) for f in files]
        labels += [index] * len(files)
    if not paths:
        raise ValueError(
            f"No image files ({', '.join(extensions)}) in the class folders "
            f"{class_names}. Received: directory={directory!r}"
        )
    dataset = tf.data.Dataset.from_tensor_slices(
        {"path": paths, "label": tf.constant(labels, tf.int64)}
    )

    @tf.autograph.experimental.do_not_convert
    def read(example):
        return {"image": tf.io.read_file(example["path"]), "label": example["label"]}

    dataset = dataset.map(read, num_parallel_calls=tf.data.AUTOTUNE)
    return DataSource(
        dataset=dataset,
        num_classes=len(class_names),
        num_examples=len(paths),
        class_names=tuple(class_names),
        decode=ops.decode_image,
        name=directory,
    )


# ---------------------------------------------------------------------------
# Pipelines.
# ---------------------------------------------------------------------------


def _check_positive_int(value, name):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
    return int(value)


def _check_common(source, training, batch_size, image_size, cache):
    if not isinstance(source, DataSource):
        raise TypeError(
            "`source` must be a keras_vit.data.DataSource (from `from_tfds`, "
            f"`from_directory` or `vtab.load_task`). Received: source={source!r}"
        )
    if not isinstance(training, bool):
        raise ValueError(f"`training` must be a bool. Received: training={training!r}")
    _check_positive_int(batch_size, "batch_size")
    _check_positive_int(image_size, "image_size")
    if cache not in ("auto", True, False):
        raise ValueError(f"`cache` must be 'auto', True or False. Received: cache={cache!r}")


def _batched(
    source,
    preprocess,
    *,
    training,
    batch_size,
    shuffle_buffer,
    repeat,
    cache,
    seed,
    batch_fn=None,
):
    """cache -> repeat -> shuffle -> map -> batch -> [batch_fn] -> prefetch.

    The order of vit_jax's `get_data` (repeat, shuffle, map, batch), with the
    cache of task_adaptation in front.
    """
    n = source.num_examples
    dataset = source.dataset
    if cache is True or (cache == "auto" and n is not None and n <= CACHE_MAX_EXAMPLES):
        dataset = dataset.cache()
    if repeat is None:
        repeat = training
    if repeat:
        dataset = dataset.repeat()
    if training:
        _check_positive_int(shuffle_buffer, "shuffle_buffer")
        buffer = min(shuffle_buffer, n) if n else shuffle_buffer
        if buffer > 1:
            dataset = dataset.shuffle(buffer, seed=seed)
    num_classes = source.num_classes

    # The map functions hold no Python control flow on tensors: no AutoGraph.
    @tf.autograph.experimental.do_not_convert
    def prepare(example):
        image = preprocess(source.decode(example["image"]))
        return image, ops.one_hot(example["label"], num_classes)

    dataset = dataset.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    # Training batches keep a static size (one compiled step on every backend).
    dataset = dataset.batch(batch_size, drop_remainder=training)
    if batch_fn is not None:
        batch_fn = tf.autograph.experimental.do_not_convert(batch_fn)
        dataset = dataset.map(batch_fn, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def pretrain_pipeline(
    source,
    *,
    training,
    batch_size,
    image_size=224,
    resize_size=None,
    augreg=None,
    randaugment=None,
    mixup_alpha=0.0,
    shuffle_buffer=SHUFFLE_BUFFER,
    repeat=None,
    cache="auto",
    seed=None,
):
    """Pre-training batches, as big_vision's AugReg configs.

    Training: inception crop (area 5-100 %) resized to `image_size` (cast
    back to uint8 as big_vision does) -> random flip -> optional RandAugment
    -> [-1, 1] -> one-hot -> batch -> optional mixup. Evaluation:
    `resize_small(resize_size)` (area) -> `central_crop(image_size)` -> [-1, 1].

    Args:
        source: a `DataSource`.
        training: bool. Training (augmented, shuffled, repeated) or
            evaluation (deterministic) batches.
        batch_size: int. Training batches all have this size; the last
            evaluation batch may be smaller.
        image_size: int. Side of the square images. Defaults to 224.
        resize_size: int. Evaluation only: the smaller side before the
            central crop. Defaults to `image_size * 8 / 7` rounded (256 for
            224).
        augreg: optional AugReg preset name (`"none"`, `"light1"`,
            `"light2"`, `"medium1"`, `"medium2"`, `"strong1"`, `"strong2"`;
            see `keras_vit.data.ops.AUGREG_PRESETS`). Sets RandAugment and
            mixup; do not pass `randaugment`/`mixup_alpha` with it.
        randaugment: optional `(num_layers, magnitude)`.
        mixup_alpha: float >= 0; 0 turns mixup off. Defaults to 0.
        shuffle_buffer: int. Training shuffle buffer (capped at the number of
            examples). Defaults to 50,000.
        repeat: bool. Repeat forever. Defaults to `training`.
        cache: `"auto"` (cache encoded examples when at most 150,000), True
            or False.
        seed: optional int for the shuffle order.

    Returns:
        A `tf.data.Dataset` of `(images, labels)`: float32
        `(B, image_size, image_size, 3)` in [-1, 1] and float32
        `(B, num_classes)`.
    """
    _check_common(source, training, batch_size, image_size, cache)
    if augreg is not None:
        if randaugment is not None or mixup_alpha:
            raise ValueError(
                "Pass either `augreg` or `randaugment`/`mixup_alpha`, not both. "
                f"Received: augreg={augreg!r}, randaugment={randaugment!r}, mixup_alpha={mixup_alpha!r}"
            )
        preset = ops.augreg_preset(augreg)
        randaugment = (preset.randaugment_layers, preset.randaugment_magnitude)
        mixup_alpha = preset.mixup_alpha
    if randaugment is not None:
        try:
            layers, magnitude = randaugment
        except (TypeError, ValueError):
            raise ValueError(
                f"`randaugment` must be None or (num_layers, magnitude). Received: randaugment={randaugment!r}"
            ) from None
        if layers == 0:
            randaugment = None
    if (
        not isinstance(mixup_alpha, numbers.Real)
        or isinstance(mixup_alpha, bool)
        or mixup_alpha < 0
    ):
        raise ValueError(f"`mixup_alpha` must be a number >= 0. Received: mixup_alpha={mixup_alpha!r}")
    if resize_size is None:
        resize_size = int(round(image_size * 256 / 224))
    _check_positive_int(resize_size, "resize_size")
    if resize_size < image_size:
        raise ValueError(
            f"`resize_size` must be at least image_size={image_size}. Received: resize_size={resize_size!r}"
        )

    if training:

        def preprocess(image):
            image = ops.to_uint8(ops.inception_crop(image, image_size))
            image = ops.random_flip(image)
            if randaugment is not None:
                image = ops.randaugment(image, *randaugment)
            return ops.normalize(image)

    else:

        def preprocess(image):
            image = ops.to_uint8(ops.resize_small(image, resize_size))
            return ops.normalize(ops.central_crop(image, image_size))

    batch_fn = None
    if training and mixup_alpha > 0:

        def batch_fn(images, labels):
            return ops.mixup(images, labels, float(mixup_alpha))
    return _batched(
        source,
        preprocess,
        training=training,
        batch_size=batch_size,
        shuffle_buffer=shuffle_buffer,
        repeat=repeat,
        cache=cache,
        seed=seed,
        batch_fn=batch_fn,
    )


def finetune_pipeline(
    source,
    *,
    training,
    batch_size,
    image_size=384,
    augmentation="inception_crop",
    flip=True,
    resize_size=None,
    shuffle_buffer=SHUFFLE_BUFFER,
    repeat=None,
    cache="auto",
    seed=None,
):
    """Fine-tuning batches at the target resolution.

    Training, by `augmentation`:
    - `"inception_crop"` (vit_jax's default): inception crop (area
      5-100 %) resized to `image_size`, then random flip.
    - `"resize_crop"` (the paper's, after BiT): resize to `resize_size`
      (448 for 384), random `image_size` crop, random flip.
    - `"resize"`: resize to `image_size`, random flip (no crop; VTAB tasks
      whose label a crop would change).
    Evaluation: resize to `image_size` (aspect ratio not kept), as vit_jax.
    Pixels stay float after the resize (no uint8 rounding), then
    `(x - 127.5) / 127.5`.

    Args:
        source: a `DataSource`.
        training: bool. Augmented, shuffled, repeated batches, or
            deterministic evaluation batches.
        batch_size: int. Training batches all have this size; the last
            evaluation batch may be smaller.
        image_size: int. Target side. Defaults to 384.
        augmentation: one of `"inception_crop"`, `"resize_crop"`,
            `"resize"`. Defaults to `"inception_crop"`.
        flip: bool. Random horizontal flip at training. Defaults to True.
        resize_size: int. `"resize_crop"` only: the side before the crop.
            Defaults to `image_size * 448 / 384` rounded.
        shuffle_buffer: int. Defaults to 50,000 (capped at the dataset size).
        repeat: bool. Defaults to `training`.
        cache: `"auto"`, True or False. Defaults to `"auto"`.
        seed: optional int for the shuffle order.

    Returns:
        A `tf.data.Dataset` of `(images, labels)`: float32
        `(B, image_size, image_size, 3)` in [-1, 1] and float32 one-hot
        `(B, num_classes)`.
    """
    _check_common(source, training, batch_size, image_size, cache)
    if augmentation not in FINETUNE_AUGMENTATIONS:
        raise ValueError(
            f"`augmentation` must be one of {FINETUNE_AUGMENTATIONS}. Received: augmentation={augmentation!r}"
        )
    if not isinstance(flip, bool):
        raise ValueError(f"`flip` must be a bool. Received: flip={flip!r}")
    if resize_size is None:
        resize_size = int(round(image_size * 448 / 384))
    _check_positive_int(resize_size, "resize_size")
    if augmentation == "resize_crop" and resize_size < image_size:
        raise ValueError(
            f"`resize_size` must be at least image_size={image_size}. Received: resize_size={resize_size!r}"
        )

    if training:

        def preprocess(image):
            if augmentation == "inception_crop":
                image = ops.inception_crop(image, image_size)
            elif augmentation == "resize_crop":
                image = ops.random_crop(ops.resize(image, resize_size), image_size)
            else:
                image = ops.resize(image, image_size)
            if flip:
                image = ops.random_flip(image)
            return ops.normalize(image)

    else:

        def preprocess(image):
            return ops.normalize(ops.resize(image, image_size))

    return _batched(
        source,
        preprocess,
        training=training,
        batch_size=batch_size,
        shuffle_buffer=shuffle_buffer,
        repeat=repeat,
        cache=cache,
        seed=seed,
    )
