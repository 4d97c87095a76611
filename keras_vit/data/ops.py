"""Image ops of the original input pipelines, as TensorFlow functions.

Every op works on one image, a `(height, width, channels)` tensor (uint8 or
float32), inside `tf.data.Dataset.map`, whatever `KERAS_BACKEND` is: the
pipelines run on the host in TensorFlow and hand numpy-convertible batches to
`model.fit`. RandAugment and mixup are in `keras_vit.data.augment`.

Sources of the numbers:
- vit_jax `input_pipeline.py` (fine-tuning): inception crop through
  `tf.image.sample_distorted_bounding_box` (area 5-100 %, TF's default aspect
  ratio range 0.75-1.33, 100 attempts, whole image if no box is found),
  bilinear resize without antialias, random flip, `(x - 127.5) / 127.5`.
- big_vision `pp/ops_image.py` (pre-training, AugReg): the same crop, but
  resize ops cast back to the input dtype (uint8 truncation), `resize_small`
  with area interpolation, `central_crop`.
"""

import math
import re

import numpy as np
import tensorflow as tf

from keras_vit.data import _checks
from keras_vit.preprocessing import scale_pixels

# vit_jax and big_vision: area 5 % - 100 %; the aspect ratio range is
# TensorFlow's default for `sample_distorted_bounding_box`, which both keep.
INCEPTION_AREA_RANGE = (0.05, 1.0)
INCEPTION_ASPECT_RATIO_RANGE = (0.75, 1.33)
INCEPTION_MAX_ATTEMPTS = 100


# ---------------------------------------------------------------------------
# Random seeds.
# ---------------------------------------------------------------------------


def random_seed(seed=None):
    """A seed of TensorFlow's stateless random ops: an int64 pair.

    Every random op here is stateless: its draw is a function of its seed,
    so that a pipeline's augmentation is the same on every run whatever
    order tf.data's parallel `map` runs the examples in (the pipelines key
    each example's seed by its position in the stream).

    Args:
        seed: an int, a pair of ints, or a shape-`(2,)` integer tensor; None
            draws one from TensorFlow's global random generator (repeatable
            after `keras.utils.set_random_seed` / `tf.random.set_seed`).

    Returns:
        int64 tensor of shape `(2,)`.
    """
    if seed is None:
        return tf.random.uniform([2], maxval=tf.int64.max, dtype=tf.int64)
    if tf.is_tensor(seed):
        integer, shape = seed.dtype.is_integer, tuple(seed.shape)
    else:
        # Bools, floats and ints beyond int64 (uint64 or object arrays) are refused.
        values = np.asarray(seed)
        integer = values.dtype.kind == "i" or (values.dtype.kind == "u" and values.dtype.itemsize < 8)
        shape = values.shape
    if not integer or shape not in ((), (2,)):
        raise ValueError(f"`seed` must be None, an int or a pair of ints. Received: seed={seed!r}")
    seed = tf.cast(seed, tf.int64)
    if seed.shape.rank == 0:
        seed = tf.stack([seed, tf.constant(0, tf.int64)])
    return seed


def split_seed(seed, num):
    """`num` independent seeds (a `(num, 2)` tensor) from one `seed`."""
    return tf.random.experimental.stateless_split(random_seed(seed), num)


def seeded_dataset(build):
    """`build()`, a `tf.data.Dataset` whose seeded ops (`shuffle`,
    `Dataset.random`, tfds' file order) follow their own seeds alone.

    tf.data pairs an op's seed with TensorFlow's global seed (the one
    `keras.utils.set_random_seed` sets): the same pipeline `seed` read
    another order after another global seed, and hosts seeded apart read
    apart. Built in a graph whose own seed is pinned, the pair is fixed.
    """
    if not tf.executing_eagerly():  # traced (a tf.data function): pin this graph's seed
        tf.random.set_seed(1)  # not 0: `Dataset.shuffle` refuses graph seed 0 with a tensor seed
        return build()
    # A tf.function's graph has a seed of its own; the dataset it returns
    # keeps its per-iteration reshuffles (`reshuffle_each_iteration`).
    # (Traced through a concrete function: `tf.config.run_functions_eagerly`
    # runs a tf.function's Python eagerly.)
    return tf.function(lambda: seeded_dataset(build), autograph=False).get_concrete_function()()


# ---------------------------------------------------------------------------
# Decoding, geometry, value range.
# ---------------------------------------------------------------------------


def decode_image(image, channels=3):
    """Decodes JPEG/PNG/BMP/GIF bytes into a uint8 `(H, W, channels)` image.

    A tensor that is already decoded (any dtype but string) is returned with
    grey-scale tiled to `channels` (3) where needed, so sources may hold
    either encoded bytes or pixels.
    """
    if image.dtype == tf.string:
        data = image
        image = tf.io.decode_image(data, channels=channels, expand_animations=False)
        image.set_shape([None, None, channels])
        return _bmp_palette_colours(data, image) if channels == 3 else image
    if channels == 3 and image.shape[-1] == 1:
        image = tf.tile(image, [1, 1, 3])
    elif channels == 3 and image.shape[-1] is None:
        # Pixels whose depth is known only per image (a generator's source):
        # RGBA passed through and grey stayed one channel.
        depth = tf.shape(image)[-1]
        image = checked(
            image,
            (depth == 1) | (depth == 3),
            "Decoded pixels must have 1 or 3 channels (give the DataSource a `decode` "
            "function for others, e.g. one dropping alpha); got an image of channels",
            depth,
        )
        image = tf.cond(depth == 1, lambda: tf.tile(image, [1, 1, 3]), lambda: image)
        image.set_shape([None, None, 3])
    return image


def _bmp_palette_colours(data, image):
    """An 8-bit BMP holds indices into its colour table, and TensorFlow's
    decoder returns the indices as grey levels (right only for a grey
    table): the colours are looked up here, as PIL reads them. Other
    images pass through."""

    def header(offset, size):  # a little-endian unsigned int of the file header
        raw = tf.cast(tf.io.decode_raw(tf.strings.substr(data, offset, size), tf.uint8), tf.int64)
        return tf.reduce_sum(raw * tf.constant([256**i for i in range(size)], tf.int64))

    def colours():
        # 4-byte BGRA entries after the info header (TensorFlow reads no
        # BMP with the older 12-byte header); 0 colours used means 256.
        info_size, used = header(14, 4), header(46, 4)
        count = tf.where(used == 0, tf.constant(256, tf.int64), used)
        table = tf.io.decode_raw(tf.strings.substr(data, 14 + info_size, 4 * count), tf.uint8)
        rgb = tf.reverse(tf.reshape(table, [-1, 4])[:, :3], axis=[1])
        return tf.gather(rgb, tf.cast(image[..., 0], tf.int32))

    def indexed():
        return tf.cond(header(28, 2) == 8, colours, lambda: image)

    return tf.cond(tf.strings.substr(data, 0, 2) == b"BM", indexed, lambda: image)


def inception_crop(
    image,
    size=None,
    area_range=INCEPTION_AREA_RANGE,
    aspect_ratio_range=INCEPTION_ASPECT_RATIO_RANGE,
    method="bilinear",
    antialias=False,
    seed=None,
):
    """Random crop of random area and aspect ratio, resized to `size`.

    The "Inception" crop of vit_jax's and big_vision's training pipelines:
    `tf.image.sample_distorted_bounding_box` with `min_object_covered=0`,
    100 attempts, and the whole image when no box fits.

    Args:
        image: `(H, W, C)` tensor.
        size: int or `(height, width)`; None returns the crop unresized.
        area_range: fraction of the image area the crop covers. Defaults to
            `(0.05, 1.0)`, the original's.
        aspect_ratio_range: width / height of the crop. Defaults to
            `(0.75, 1.33)`, TensorFlow's default that the original keeps.
        method: resize method of `tf.image.resize`. Defaults to
            `"bilinear"`.
        antialias: bool. Defaults to False (the original's).
        seed: the random seed (`random_seed`); None draws one.

    Returns:
        float32 `(height, width, C)` when `size` is given (as
        `tf.image.resize` returns), else the crop in the input dtype.
    """
    area_range = _checks.value_range(area_range, "area_range", 0.0, 1.0)
    aspect_ratio_range = _checks.value_range(aspect_ratio_range, "aspect_ratio_range", 0.0, math.inf)
    channels = image.shape[-1]
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.zeros([0, 0, 4], tf.float32),
        seed=random_seed(seed),
        min_object_covered=0.0,  # The original enforces no minimum area.
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=INCEPTION_MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    crop = tf.slice(image, begin, crop_size)
    crop.set_shape([None, None, channels])  # tf.slice loses the static depth.
    if size is None:
        return crop
    return resize(crop, size, method=method, antialias=antialias)


def resize(image, size, method="bilinear", antialias=False):
    """`tf.image.resize` to `size` (aspect ratio not kept); returns float32.

    vit_jax's fine-tuning eval resizes straight to the crop size this way.
    """
    height, width = _checks.size_pair(size)
    return tf.image.resize(image, (height, width), method=method, antialias=antialias)


def resize_small(image, smaller_size, method="area", antialias=False):
    """Resizes so that the smaller side is `smaller_size`, keeping the aspect.

    As big_vision's `resize_small`: the other side is
    `round(side * smaller_size / min(H, W))`, and the default interpolation is
    `"area"` without antialias. Returns float32.
    """
    _checks.integer(smaller_size, "smaller_size")
    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    factor = tf.cast(smaller_size, tf.float32) / tf.cast(tf.minimum(height, width), tf.float32)
    new_height = tf.cast(tf.round(tf.cast(height, tf.float32) * factor), tf.int32)
    new_width = tf.cast(tf.round(tf.cast(width, tf.float32) * factor), tf.int32)
    return tf.image.resize(image, (new_height, new_width), method=method, antialias=antialias)


def central_crop(image, size):
    """Crops the central `size` window; offsets are `(side - size) // 2`."""
    height, width = _checks.size_pair(size)
    shape = tf.shape(image)
    top = (shape[0] - height) // 2
    left = (shape[1] - width) // 2
    return tf.image.crop_to_bounding_box(image, top, left, height, width)


def random_crop(image, size, seed=None):
    """Crops a `size` window at a uniformly random position (`seed`: see
    `random_seed`)."""
    height, width = _checks.size_pair(size)
    return tf.image.stateless_random_crop(image, (height, width, image.shape[-1]), seed=random_seed(seed))


def random_flip(image, seed=None):
    """Flips left-right with probability 0.5 (`seed`: see `random_seed`)."""
    return tf.image.stateless_random_flip_left_right(image, seed=random_seed(seed))


def to_uint8(image):
    """Clips to [0, 255] and casts to uint8, truncating (not rounding).

    big_vision's resize ops cast their float result back to the input dtype
    this way, so its pre-training pipeline keeps uint8 pixels between ops.
    """
    return tf.cast(tf.clip_by_value(image, 0.0, 255.0), tf.uint8)


def normalize(image):
    """Maps [0, 255] pixels to float32 [-1, 1]: `(x - 127.5) / 127.5`.

    The formula of vit_jax's input pipeline; the models and every released
    checkpoint expect this range. One implementation with
    `keras_vit.preprocess_input`: `keras_vit.preprocessing.scale_pixels`.
    """
    return scale_pixels(tf.cast(image, tf.float32))


def one_hot(label, num_classes):
    """float32 one-hot vector of an integer label."""
    return tf.one_hot(tf.cast(label, tf.int32), num_classes, dtype=tf.float32)


def op_error_message(error):
    """The first line of a `tf.errors.OpError`'s message, without
    TensorFlow's "{{function_node ...}}" prefix and "[Op:...]" suffix."""
    reason = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:\w+\].*$", "", error.message.strip())
    return reason.splitlines()[0] if reason else type(error).__name__


def checked(value, condition, *message):
    """`value`, after an assertion that fails with `message` unless
    `condition`: a clear error from inside a `tf.data` map."""
    assertion = tf.debugging.Assert(condition, list(message), summarize=16)
    with tf.control_dependencies([assertion]):
        return tf.identity(value)


def checked_label(label, num_classes, name):
    """`label` (int64), which must lie in `[0, num_classes)`: `tf.one_hot`
    turns any other into a row of zeros, which scores as right (accuracy 1,
    loss 0 under a zero head) and trains on nothing."""
    label = tf.cast(label, tf.int64)
    return checked(
        label,
        (label >= 0) & (label < num_classes),
        f"{name}: labels must be in [0, {num_classes}) (tfds gives -1 to the examples of a split "
        "without labels, e.g. imagenet2012's test split: evaluate on its validation split); got",
        label,
    )
