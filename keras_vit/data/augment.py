"""RandAugment and mixup as the AugReg pre-training ran them (big_vision).

Hand-written TensorFlow, not Keras' `RandAugment` / `MixUp` layers: the
AugReg numbers depend on big_vision's policies (`pp/autoaugment.py`, forked
from the EfficientNet code, and `utils.py`), which those layers do not
reproduce. Like `keras_vit.data.ops`, every op but `mixup` works on one image
inside `tf.data.Dataset.map`; `mixup` works on a batch.
"""

import math

import tensorflow as tf

from keras_vit.data import _checks
from keras_vit.data.ops import random_seed
from keras_vit.data.ops import split_seed
from keras_vit.data.ops import to_uint8


# ---------------------------------------------------------------------------
# RandAugment, as used for AugReg pre-training.
#
# The op set, magnitude scale and fill value follow the RandAugment that
# big_vision runs (`pp/autoaugment.py`, forked from the EfficientNet code):
# 16 ops on uint8 images, one op drawn uniformly per layer, magnitude m mapped
# through m / 10, random sign for the geometric ops, empty pixels set to 128.
# Keras' `keras.layers.RandAugment` is a different policy (11 ops, random
# magnitudes up to a factor), so it would not reproduce the AugReg settings.
# ---------------------------------------------------------------------------

_MAX_LEVEL = 10.0
_FILL_VALUE = 128  # Grey for pixels uncovered by rotate/shear/translate/cutout.
_CUTOUT_CONST = 40  # Cutout half-size at level 10 (RandAugment's setting).
_TRANSLATE_CONST = 100  # Translation in pixels at level 10.


def _blend(image1, image2, factor):
    """`image1 + factor * (image2 - image1)`, clipped and truncated to uint8.

    Factors above 1 extrapolate away from `image1` (the original clips there;
    between 0 and 1 clipping changes nothing, so one formula covers both).
    """
    image1 = tf.cast(image1, tf.float32)
    image2 = tf.cast(image2, tf.float32)
    return to_uint8(image1 + factor * (image2 - image1))


def _projective(image, transform):
    """Nearest-neighbour projective warp with constant grey fill.

    `transform` maps output (x, y) to input coordinates as
    `[a0, a1, a2, b0, b1, b2, c0, c1]`. Nearest sampling means each output
    pixel is either an input pixel or fill, which is what the original gets
    with its extra all-ones channel that marks uncovered pixels.
    """
    shape = tf.shape(image)
    out = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[tf.newaxis],
        transforms=tf.cast(tf.reshape(transform, [1, 8]), tf.float32),
        output_shape=shape[:2],
        fill_value=tf.constant(_FILL_VALUE, tf.float32),
        interpolation="NEAREST",
        fill_mode="CONSTANT",
    )
    return out[0]


def autocontrast(image):
    """Stretches each channel so its min maps to 0 and its max to 255.

    Flat channels stay as they are; values are truncated to uint8 (PIL
    rounds, the original truncates).
    """
    x = tf.cast(image, tf.float32)
    low = tf.reduce_min(x, axis=[0, 1])
    high = tf.reduce_max(x, axis=[0, 1])
    scale = 255.0 / tf.maximum(high - low, 1.0)
    return tf.where(high > low, to_uint8(x * scale - low * scale), image)


def equalize(image):
    """Histogram equalization per channel, as PIL's `ImageOps.equalize`."""
    pixels = tf.reshape(tf.cast(image, tf.int32), [-1, 3])
    # One 256-bin histogram per channel, from a single bincount.
    shifted = pixels + tf.range(3) * 256
    histogram = tf.reshape(
        tf.math.bincount(tf.reshape(shifted, [-1]), minlength=768, maxlength=768), [3, 256]
    )
    # PIL leaves out the count of the highest occupied level.
    highest = 255 - tf.argmax(tf.cast(tf.reverse(histogram, [1]) > 0, tf.int32), axis=1, output_type=tf.int32)
    last = tf.gather(histogram, highest, batch_dims=1)
    step = (tf.reduce_sum(histogram, 1) - last) // 255
    safe_step = tf.maximum(step, 1)[:, tf.newaxis]
    lut = (tf.cumsum(histogram, axis=1) + safe_step // 2) // safe_step
    lut = tf.clip_by_value(tf.concat([tf.zeros([3, 1], lut.dtype), lut[:, :-1]], 1), 0, 255)
    equalized = tf.gather(tf.reshape(lut, [-1]), shifted)
    out = tf.where(step > 0, equalized, pixels)  # A one-level channel stays.
    return tf.reshape(tf.cast(out, tf.uint8), tf.shape(image))


def invert(image):
    return 255 - image


def posterize(image, bits):
    """Keeps the `bits` most significant bits of each pixel."""
    shift = max(8 - int(bits), 0)  # 8 or more bits keep the image as it is.
    return tf.bitwise.left_shift(tf.bitwise.right_shift(image, shift), shift)


def solarize(image, threshold=128):
    """Inverts the pixels at or above `threshold`."""
    return tf.where(image < threshold, image, 255 - image)


def solarize_add(image, addition=0, threshold=128):
    """Adds `addition` (clipped to [0, 255]) to the pixels below `threshold`."""
    added = tf.cast(tf.clip_by_value(tf.cast(image, tf.int32) + addition, 0, 255), tf.uint8)
    return tf.where(image < threshold, added, image)


def color(image, factor):
    """Saturation: blends the grey-scale version (factor 0) with the image."""
    # Tiled by hand: `grayscale_to_rgb` holds an Assert, a stateful op that
    # would make tf.data run RandAugment one image at a time under op
    # determinism.
    grey = tf.tile(tf.image.rgb_to_grayscale(image), [1, 1, 3])
    return _blend(grey, image, factor)


def contrast(image, factor):
    """Blends a constant grey image with the image.

    The grey level reproduces the original op exactly: it is the sum of the
    256-bin histogram divided by 256, i.e. the pixel count / 256 clipped to
    255, not the mean intensity. AugReg models were trained with this
    behaviour, so it is kept.
    """
    grey = tf.cast(tf.image.rgb_to_grayscale(image), tf.int32)
    histogram = tf.histogram_fixed_width(grey, [0, 255], nbins=256)
    level = tf.reduce_sum(tf.cast(histogram, tf.float32)) / 256.0
    degenerate = tf.fill(tf.shape(image), tf.cast(tf.clip_by_value(level, 0.0, 255.0), tf.uint8))
    return _blend(degenerate, image, factor)


def brightness(image, factor):
    """Blends black (factor 0) with the image."""
    return _blend(tf.zeros_like(image), image, factor)


def sharpness(image, factor):
    """Blends a smoothed image (PIL's SMOOTH kernel) with the image.

    The one-pixel border keeps the original pixels, as in PIL.
    """
    kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
    kernel = tf.tile(kernel[:, :, tf.newaxis, tf.newaxis], [1, 1, 3, 1])
    smooth = tf.nn.depthwise_conv2d(
        tf.cast(image, tf.float32)[tf.newaxis], kernel, [1, 1, 1, 1], padding="VALID"
    )[0]
    smooth = to_uint8(smooth)
    inner = tf.pad(tf.ones_like(smooth, tf.bool), [[1, 1], [1, 1], [0, 0]])
    degenerate = tf.where(inner, tf.pad(smooth, [[1, 1], [1, 1], [0, 0]]), image)
    return _blend(degenerate, image, factor)


def rotate(image, degrees):
    """Rotates counter-clockwise by `degrees` about the image centre."""
    radians = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
    shape = tf.cast(tf.shape(image), tf.float32)
    height, width = shape[0] - 1.0, shape[1] - 1.0
    cos, sin = tf.cos(radians), tf.sin(radians)
    # Input point = R (output point - centre) + centre.
    x_offset = (width - (cos * width - sin * height)) / 2.0
    y_offset = (height - (sin * width + cos * height)) / 2.0
    return _projective(image, tf.stack([cos, -sin, x_offset, sin, cos, y_offset, 0.0, 0.0]))


def shear_x(image, level):
    return _projective(image, tf.stack([1.0, level, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]))


def shear_y(image, level):
    return _projective(image, tf.stack([1.0, 0.0, 0.0, level, 1.0, 0.0, 0.0, 0.0]))


def translate_x(image, pixels):
    """Moves the content left by `pixels` (right when negative)."""
    return _projective(image, tf.stack([1.0, 0.0, pixels, 0.0, 1.0, 0.0, 0.0, 0.0]))


def translate_y(image, pixels):
    """Moves the content up by `pixels` (down when negative)."""
    return _projective(image, tf.stack([1.0, 0.0, 0.0, 0.0, 1.0, pixels, 0.0, 0.0]))


def cutout(image, half_size, seed=None):
    """Greys out a `2 * half_size` square centred at a uniformly random pixel.

    The square is cut at the image border. `seed`: see
    `keras_vit.data.ops.random_seed`.
    """
    shape = tf.shape(image)
    y_seed, x_seed = tf.unstack(split_seed(seed, 2))
    center_y = tf.random.stateless_uniform([], y_seed, 0, shape[0], tf.int32)
    center_x = tf.random.stateless_uniform([], x_seed, 0, shape[1], tf.int32)
    rows = tf.range(shape[0])[:, tf.newaxis]
    cols = tf.range(shape[1])[tf.newaxis, :]
    inside = (
        (rows >= center_y - half_size)
        & (rows < center_y + half_size)
        & (cols >= center_x - half_size)
        & (cols < center_x + half_size)
    )
    return tf.where(inside[..., tf.newaxis], tf.constant(_FILL_VALUE, image.dtype), image)


def _random_sign(value, seed):
    """`value` or `-value` with probability 1/2 each."""
    return tf.where(tf.random.stateless_uniform([], seed) < 0.5, -value, value)


def _randaugment_ops(magnitude):
    """The 16 RandAugment ops at `magnitude`, in the original's order, as
    functions of `(image, seed)` (the seed of their random sign or
    position)."""
    level = magnitude / _MAX_LEVEL
    enhance = level * 1.8 + 0.1
    return [
        lambda x, s: autocontrast(x),
        lambda x, s: equalize(x),
        lambda x, s: invert(x),
        lambda x, s: rotate(x, _random_sign(tf.constant(level * 30.0), s)),
        lambda x, s: posterize(x, int(level * 4)),
        lambda x, s: solarize(x, int(level * 256)),
        lambda x, s: color(x, enhance),
        lambda x, s: contrast(x, enhance),
        lambda x, s: brightness(x, enhance),
        lambda x, s: sharpness(x, enhance),
        lambda x, s: shear_x(x, _random_sign(tf.constant(level * 0.3), s)),
        lambda x, s: shear_y(x, _random_sign(tf.constant(level * 0.3), s)),
        lambda x, s: translate_x(x, _random_sign(tf.constant(level * _TRANSLATE_CONST), s)),
        lambda x, s: translate_y(x, _random_sign(tf.constant(level * _TRANSLATE_CONST), s)),
        lambda x, s: cutout(x, int(level * _CUTOUT_CONST), s),
        lambda x, s: solarize_add(x, int(level * 110)),
    ]


RANDAUGMENT_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
    "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
    "TranslateX", "TranslateY", "Cutout", "SolarizeAdd",
)


# One traced RandAugment layer per magnitude, shared by the layers of a
# pipeline (tracing the 16 branches dominates building a pipeline).
_RANDAUGMENT_LAYERS = {}


def _randaugment_layer(magnitude):
    layer = _RANDAUGMENT_LAYERS.get(magnitude)
    if layer is None:
        ops = _randaugment_ops(magnitude)

        @tf.function(
            input_signature=[tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([2], tf.int64)],
            autograph=False,
        )
        def layer(image, seed):
            choice_seed, op_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
            index = tf.random.stateless_uniform([], choice_seed, 0, len(ops), tf.int32)
            return tf.switch_case(index, [lambda op=op: op(image, op_seed) for op in ops])

        _RANDAUGMENT_LAYERS[magnitude] = layer
    return layer


def randaugment(image, num_layers=2, magnitude=10, seed=None):
    """RandAugment (Cubuk et al. 2020) as in the AugReg pre-training.

    `num_layers` times, one of the 16 ops of `RANDAUGMENT_OPS` is drawn
    uniformly and applied at the fixed `magnitude` (0-30 scale, 10 is the
    reference level: rotations up to 30 degrees, translations of 100 pixels
    ...). Note that `magnitude=0` is not the identity (AutoContrast, Equalize,
    Invert... ignore the magnitude); `num_layers=0` is.

    Args:
        image: uint8 `(H, W, 3)` tensor.
        num_layers: int >= 0, the ops applied in sequence.
        magnitude: number >= 0, shared by all ops.
        seed: the random seed (`keras_vit.data.ops.random_seed`); None
            draws one.

    Returns:
        The augmented uint8 image.
    """
    _checks.integer(num_layers, "num_layers", minimum=0)
    _checks.number(magnitude, "magnitude")
    if image.dtype != tf.uint8:
        raise ValueError(
            f"RandAugment works on uint8 images (as the original). Received: image.dtype={image.dtype.name}"
        )
    if image.shape.rank != 3 or image.shape[-1] != 3:
        raise ValueError(
            f"RandAugment works on RGB images (H, W, 3). Received: image.shape={image.shape}"
        )
    if num_layers == 0:
        return image
    layer = _randaugment_layer(float(magnitude))
    shape = image.shape
    for layer_seed in tf.unstack(split_seed(seed, num_layers)):
        image = layer(image, layer_seed)
        image.set_shape(shape)
    return image


# ---------------------------------------------------------------------------
# Mixup, on a batch.
# ---------------------------------------------------------------------------


def mixup(images, labels, alpha, seed=None):
    """Mixup (Zhang et al. 2018) of a batch with itself shifted by one.

    As big_vision's default (`fold_in=None`): one mixing weight for the whole
    batch, drawn from Beta(alpha, alpha) (a two-class Dirichlet) and sorted so
    that each example keeps the larger share; example i is mixed with
    example i - 1 (`roll` by one). Images and labels get the same weight.
    Keras' `keras.layers.MixUp` draws one weight per example and pairs
    examples by a random permutation instead.

    Args:
        images: float `(B, H, W, C)` batch.
        labels: float `(B, num_classes)` one-hot (or soft) labels.
        alpha: float > 0, the Beta concentration.
        seed: the random seed (`keras_vit.data.ops.random_seed`); None
            draws one.

    Returns:
        `(images, labels)` mixed.
    """
    _checks.number(alpha, "alpha", strict=True)
    # g1 / (g1 + g2) for g ~ Gamma(alpha), in log space: Gamma(alpha) is
    # Gamma(alpha + 1) * U^(1 / alpha) (as jax.random.beta draws, which
    # big_vision uses). Drawn directly, both gammas of a small alpha clamp to
    # the smallest float and the weight came out 0.5: a tiny alpha mixed 50/50
    # instead of hardly at all.
    gamma_seed, uniform_seed = tf.unstack(tf.random.experimental.stateless_split(random_seed(seed), 2))
    boosted = tf.random.stateless_gamma([2], gamma_seed, alpha + 1.0)
    uniform = tf.random.stateless_uniform([2], uniform_seed, minval=1e-30, maxval=1.0)
    log_gamma = tf.math.log(boosted) + tf.math.log(uniform) / alpha
    weight = tf.sigmoid(log_gamma[0] - log_gamma[1])
    weight = tf.maximum(weight, 1.0 - weight)

    def mix(x):
        w = tf.cast(weight, x.dtype)
        return w * x + (1 - w) * tf.roll(x, shift=1, axis=0)

    return mix(images), mix(labels)
