"""Patch embedding: the linear projection of flattened patches (paper Eq. 1)."""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.position_embedding import linear_matrix
from keras_vit.layers.utils import is_int, normalize_pair, positive_int


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """Splits an image into patches and projects each one to `hidden_size`.

    A convolution whose kernel and stride both equal the patch size, with
    VALID padding and a bias, exactly as the original `embedding` Conv
    (google-research/vision_transformer, `models_vit.py`). The feature map is
    flattened row-major, so token `r * grid_width + c` is the patch at row `r`,
    column `c`.

    Args:
        hidden_size: int. Width D of the token embeddings.
        patch_size: int or tuple of 2 ints. Patch height and width.
        kernel_initializer: Initializer for the kernel. Defaults to
            `"lecun_normal"` (the Flax Conv default).
        bias_initializer: Initializer for the bias. Defaults to `"zeros"`.
        use_bias: bool. Defaults to True (the original's); OpenAI CLIP's
            patch projection has none.

    Call arguments:
        images: `(B, H, W, C)` tensor (an image or, in a hybrid, a feature map).

    Returns:
        `(B, (H // ph) * (W // pw), hidden_size)` tensor.
    """

    def __init__(
        self,
        hidden_size,
        patch_size,
        kernel_initializer="lecun_normal",
        bias_initializer="zeros",
        use_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = positive_int(hidden_size, "hidden_size")
        self.patch_size = normalize_pair(patch_size, "patch_size")
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.use_bias = bool(use_bias)

    def build(self, input_shape):
        channels = input_shape[-1]
        # Kernel layout (ph, pw, C_in, D) equals the checkpoints' HWIO layout.
        self.kernel = self.add_weight(
            name="kernel",
            shape=(*self.patch_size, channels, self.hidden_size),
            initializer=self.kernel_initializer,
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias",
                shape=(self.hidden_size,),
                initializer=self.bias_initializer,
            )

    def grid_size(self, input_shape):
        """(rows, cols) of the patch grid for an input of `input_shape`
        (None for an unknown side)."""
        return tuple(None if side is None else side // patch
                     for side, patch in zip(input_shape[1:3], self.patch_size))

    def call(self, images):
        kernel = ops.cast(self.kernel, self.compute_dtype)
        x = ops.conv(
            images, kernel, strides=self.patch_size, padding="valid",
            data_format="channels_last",
        )
        if self.bias is not None:
            x = x + ops.cast(self.bias, self.compute_dtype)
        rows, cols = x.shape[1], x.shape[2]
        if rows is None or cols is None:
            rows, cols = ops.shape(x)[1], ops.shape(x)[2]
        return ops.reshape(x, (-1, rows * cols, self.hidden_size))

    def compute_output_shape(self, input_shape):
        rows, cols = self.grid_size(input_shape)
        tokens = None if rows is None or cols is None else rows * cols
        return (input_shape[0], tokens, self.hidden_size)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_size": self.hidden_size,
                "patch_size": self.patch_size,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "use_bias": self.use_bias,
            }
        )
        return config


def _bilinear_weights(in_size, out_size):
    """Interpolation matrix (out, in) of bilinear resizing with half-pixel
    centres, without antialiasing: `jax.image.resize(method="bilinear",
    antialias=False)`, which FlexiViT's PI-resize is defined with."""
    coords = np.clip((np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5, 0, in_size - 1)
    return linear_matrix(coords, in_size)


def resize_matrix(old_size, new_size):
    """`B`, `(new_h * new_w, old_h * old_w)`: the bilinear resize of a
    flattened (row-major) patch from `old_size` to `new_size`."""
    rows = _bilinear_weights(old_size[0], new_size[0])
    cols = _bilinear_weights(old_size[1], new_size[1])
    return np.kron(rows, cols)


def resize_patch_embedding(kernel, new_size):
    """PI-resizes a `(ph, pw, C, D)` patch-embedding kernel to
    `(*new_size, C, D)` (FlexiViT, Beyer et al., CVPR 2023, Sec. 3.4;
    big_vision `resample_patchemb`).

    With `B` the bilinear resize of patches, the new kernel is
    `pinv(B^T) w` for each channel and output: a patch resized up embeds
    exactly as the original patch did (`<B x, w'> = <x, w>`), and resized down
    it is the least-squares best (`w'` minimises `E|<x, w> - <B x, w'>|^2`
    for white-noise patches). Computed in float64, returned in the kernel's
    dtype.
    """
    kernel = np.asarray(kernel)
    new_size = normalize_pair(new_size, "new_size")
    old_size = kernel.shape[:2]
    if kernel.ndim != 4:
        raise ValueError(f"`kernel` must be (patch_h, patch_w, channels, width). Received: shape {kernel.shape}")
    if old_size == new_size:
        return kernel
    pinv = np.linalg.pinv(resize_matrix(old_size, new_size).T)  # (new, old)
    flat = kernel.reshape(old_size[0] * old_size[1], -1).astype(np.float64)
    return (pinv @ flat).reshape(*new_size, *kernel.shape[2:]).astype(kernel.dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class ImageSizeCheck(keras.layers.Layer):
    """Passes images through, refusing a size the model cannot take.

    The first layer of every model. A dynamic-size model (`image_size`
    None) takes sides that are multiples of `stride`: its patch convolution
    would otherwise drop the last partial row or column of patches without
    a word. A fixed-size model takes its `image_size` only: Keras checks a
    model's input shape in `model(x)`, but its JAX trainer calls the layers
    directly in `fit`, `evaluate` and `predict`, where a larger image lost
    its border rows and columns without a word, and another size failed
    deep inside the model.

    Sizes known when the layer runs (eager, `jax.jit`, PyTorch, TensorFlow
    graphs traced at a size) get a `ValueError` naming the shape. In a
    TensorFlow graph of unknown size (Keras retraces `fit`, `evaluate` and
    `predict` at relaxed shapes when the size changes), where `keras.ops`
    has no assertion, a reshape of a `(side,)` vector of zeros fails at run
    time unless the side fits: "Input to reshape is a tensor with <side>
    values, but the requested shape requires a multiple of <stride>", or,
    for a side of 0, "... with 0 values, but the requested shape has
    <stride>" (their sum is added to the images), or "... has <size>" (it
    is added to the images along that side: a sum would let TensorFlow's
    graph optimizer drop the reshape). Unknown channels likewise: "... has
    <channels>".

    Args:
        stride: `(height, width)` in pixels of one patch (for a hybrid: the
            ResNet stem's stride times the patch size).
        image_size: `(height, width)` of a fixed-size model, None for a side
            of any size (None: a dynamic-size model).

    The channels are those of the input the layer is built on (the model's):
    JAX's and TensorFlow's convolutions would take a multiple of them as a
    grouped convolution, without a word. They are not in the config, so
    files and checkpoints of earlier versions load and resume as they were.
    """

    def __init__(self, stride, image_size=None, **kwargs):
        # It passes the images on as they are: no rounding to a mixed
        # policy's compute dtype before `PreprocessInput`'s float32 scaling.
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        self.stride = normalize_pair(stride, "stride")
        sides = (None, None) if image_size is None else tuple(image_size) if isinstance(
            image_size, (tuple, list)) else (image_size, image_size)
        if len(sides) != 2 or not all(s is None or (is_int(s) and s > 0) for s in sides):
            raise ValueError("`image_size` must be None or (height, width), each a positive int or None. "
                             f"Received: image_size={image_size!r}")
        self.image_size = None if sides == (None, None) else tuple(None if s is None else int(s) for s in sides)
        self.channels = None

    def build(self, input_shape):
        channels = input_shape[-1]
        self.channels = channels if is_int(channels) else None

    def check_shape(self, shape):
        """Raises the `ValueError` of a call on images of `shape`, for the
        sides it knows (e.g. before Keras' `predict`, which a failed first
        step leaves the model's variables empty after on JAX)."""
        if self.channels is not None and isinstance(shape[-1], int) and shape[-1] != self.channels:
            if len(shape) == 4 and shape[1] == self.channels and shape[-1] > 4:  # too many for channels
                fix = ("These look channels-first: keras_vit models take (batch, height, width, channels), "
                       "whatever keras.config.image_data_format() says (`np.transpose(images, (0, 2, 3, 1))`). ")
            elif self.channels == 3 and shape[-1] in (1, 4):
                fix = ("Grey-scale images take their channel repeated (`np.repeat(images, 3, axis=-1)`); RGBA "
                       "images drop alpha. ")
            else:
                fix = ""
            raise ValueError(
                f"The images must have {self.channels} channel(s), as the model's input. {fix}"
                f"Received: images of shape {tuple(shape)}"
            )
        expected = self.image_size or (None, None)
        for what, side, stride, size in zip(("height", "width"), shape[1:3], self.stride, expected):
            if not isinstance(side, int):
                continue
            if size is not None and side != size:
                taken = "x".join("any" if s is None else str(s) for s in self.image_size)
                raise ValueError(
                    f"The image {what} must be {size}: this model takes images of {taken} pixels. Resize "
                    "the images, or build the model with input_shape=(None, None, 3) to take any multiple "
                    f"of the patch size. Received: images of shape {tuple(shape)}"
                )
            if side % stride or side == 0:
                raise ValueError(
                    f"The image {what} must be a positive multiple of {stride}, the pixels of one patch "
                    "of this model (for a hybrid: the ResNet stem's stride times the patch size). "
                    f"Received: images of shape {tuple(shape)}"
                )

    def call(self, images):
        shape = ops.shape(images)
        self.check_shape(tuple(images.shape))
        checks = []
        expected = self.image_size or (None, None)
        for what, side, stride, size in zip(("height", "width"), shape[1:3], self.stride, expected):
            if isinstance(side, int):  # checked above
                continue
            if size is None:
                # 0 is a multiple too: the second reshape needs one patch.
                rows = ops.reshape(ops.zeros((side,), images.dtype), (-1, stride))
                first = ops.reshape(ops.zeros((ops.minimum(side, stride),), images.dtype), (1, stride))
                checks.append(ops.sum(ops.concatenate([rows, first])))
            else:
                along = (1, size, 1, 1) if what == "height" else (1, 1, size, 1)
                checks.append(ops.reshape(ops.zeros((side,), images.dtype), along))
        if self.channels is not None and not isinstance(shape[-1], int):
            # TensorFlow's convolution takes a multiple of the channels too.
            checks.append(ops.reshape(ops.zeros((shape[-1],), images.dtype), (1, 1, 1, self.channels)))
        return images + sum(checks) if checks else images

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(stride=self.stride, image_size=self.image_size)
        return config
