"""Input scaling shared by every checkpoint of the original release."""

import numpy as np
from keras import backend
from keras import ops

# vit_jax `input_pipeline.py`: `(image - 127.5) / 127.5`.
PIXEL_CENTER = 127.5


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


def preprocess_input(images):
    """Maps uint8-range pixels [0, 255] to float32 [-1, 1]: (x - 127.5) / 127.5.

    The original input pipelines normalise this way
    (google-research/vision_transformer, `input_pipeline.py`); every
    released checkpoint expects it. Accepts numpy arrays or tensors, NHWC.
    uint8 input gives the original's float32 values bit for bit, eager or
    compiled, on every backend; float input is computed with the same
    formula (a compiler may round it one ulp differently).
    """
    dtype = getattr(images, "dtype", None)
    if dtype is not None and backend.standardize_dtype(dtype) == "uint8":
        return ops.take(_UINT8_TABLE, ops.cast(images, "int32"))
    return scale_pixels(ops.cast(images, "float32"))
