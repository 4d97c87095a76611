"""Input scaling: the original release's, and a checkpoint's own mean and std."""

import numpy as np
from keras import backend
from keras import ops

# vit_jax `input_pipeline.py`: `(image - 127.5) / 127.5`.
PIXEL_CENTER = 127.5

# The image files keras_vit reads (`keras_vit.data.from_directory`,
# `keras_vit.inspect.load_image_folder`): what `tf.io.decode_image` decodes.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def scale_pixels(x):
    """`(x - 127.5) / 127.5` on float32 pixels in [0, 255]: the one formula.

    Written with Python operators so the same expression serves numpy, every
    Keras backend's tensors and tf.data (`keras_vit.data.ops.normalize`).
    The original's order of operations matters: `x / 127.5 - 1` differs by
    one ulp on half of the uint8 values.
    """
    return (x - PIXEL_CENTER) / PIXEL_CENTER


# The 256 uint8 results, correctly rounded by numpy. XLA (JAX, TF
# `jit_compile`) turns a division by a constant into a multiplication by its
# reciprocal, one ulp off on half of the values; a table lookup is exact
# under every compiler.
_UINT8_TABLE = scale_pixels(np.arange(256, dtype=np.float32))


def check_pixel_stats(pixel_mean, pixel_std):
    """`(mean, std)` as tuples of 3 floats (std > 0), or `(None, None)`."""
    if pixel_mean is None and pixel_std is None:
        return None, None
    stats = []
    for name, value in (("pixel_mean", pixel_mean), ("pixel_std", pixel_std)):
        try:
            values = tuple(float(v) for v in value)
        except (TypeError, ValueError):
            values = ()
        # Statistics of pixels in [0, 1] lie in [0, 1]: a mean above 1 is on
        # the 0-255 scale (torchvision's and keras.applications' habit).
        low, high = (0.0, 1.0) if name == "pixel_mean" else (np.nextafter(0.0, 1.0), 1.0)
        if len(values) != 3 or not all(np.isfinite(values)) or not low <= min(values) <= max(values) <= high:
            raise ValueError(
                f"`pixel_mean` and `pixel_std` go together, each 3 per-channel values for pixels scaled to "
                f"[0, 1] (0 <= mean <= 1, 0 < std <= 1; divide values on the 0-255 scale by 255). "
                f"Received: {name}={value!r}"
            )
        stats.append(values)
    return tuple(stats)


def check_image_dtype(images):
    """Refuses images of a dtype no keras_vit input takes (16-bit and wider
    unsigned pixels, booleans, int8, which holds no [0, 255] pixel above 127:
    uint8 data viewed as int8), which would scale to nonsense without an
    error (uint16: up to 513; int8: 200 read as -56, -1.44); returns the
    standardized dtype, or None.
    PyTorch tensors have no uint16 (Keras converts it to int32): those pass."""
    dtype = getattr(images, "dtype", None)
    dtype = None if dtype is None else backend.standardize_dtype(dtype)
    if dtype in ("uint16", "uint32", "uint64", "bool", "int8"):
        raise ValueError(
            "`images` must hold pixels in [0, 255] (uint8, or ints or floats of that range), or [-1, 1] "
            "floats for a model without include_preprocessing. For 16-bit images, take the high byte "
            f"(`images >> 8`, as TensorFlow's PNG decoder does). Received: images of dtype {dtype}"
        )
    return dtype


def preprocess_input(images, pixel_mean=None, pixel_std=None):
    """Maps uint8-range pixels [0, 255] to float32 [-1, 1]: (x - 127.5) / 127.5.

    With `pixel_mean` and `pixel_std` (3 values each, for pixels scaled to
    [0, 1], as timm's `pretrained_cfg` gives them: ImageNet's for DeiT and
    DINOv2, OpenAI CLIP's, ...), computes `(x / 255 - mean) / std` instead,
    in float32, as timm's `ToTensor` and `Normalize` do.

    The original input pipelines normalise this way
    (google-research/vision_transformer, `input_pipeline.py`); every
    released checkpoint expects it. Accepts numpy arrays or tensors, NHWC.
    uint8 input, and float input holding whole numbers in [0, 255] (a
    uint8 image cast to float, as a functional model's float input casts
    it), give the original's float32 values bit for bit, eager or compiled,
    on every backend; other float values are computed with the same
    formula (a compiler may round it one ulp differently). Floats already
    scaled to [0, 1] or [-1, 1] cannot be told apart from dark pixels: they
    map to about -1, without an error.
    """
    pixel_mean, pixel_std = check_pixel_stats(pixel_mean, pixel_std)
    dtype = check_image_dtype(images)
    if pixel_mean is not None:
        shape = tuple(images.shape) if hasattr(images, "shape") else np.shape(images)
        if shape[-1] is not None and shape[-1] != 3:
            raise ValueError(
                "`pixel_mean` and `pixel_std` hold 3 per-channel values; the images have "
                f"{shape[-1]} channels. Received: images of shape {shape}"
            )
        mean = np.asarray(pixel_mean, np.float32)
        std = np.asarray(pixel_std, np.float32)
        return (ops.cast(images, "float32") / np.float32(255.0) - mean) / std
    if dtype == "uint8":
        return _lookup(ops.cast(images, "int32"))
    images = ops.cast(images, "float32")
    # Clipped again as ints: NaN casts to any int (a gather out of range).
    levels = ops.clip(ops.cast(ops.clip(images, 0.0, 255.0), "int32"), 0, 255)
    whole = ops.equal(images, ops.cast(levels, "float32"))
    return ops.where(whole, _lookup(levels), scale_pixels(images))


def _lookup(levels):
    """`_UINT8_TABLE[levels]`, as an embedding lookup: Keras' PyTorch `take`
    of a 1-D table flattens the indices with `ravel`, which PyTorch's ONNX
    export lacks."""
    return ops.take(_UINT8_TABLE[:, None], levels, axis=0)[..., 0]
