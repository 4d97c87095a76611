"""Convolution with weight standardisation, as in the hybrid ViT's ResNet."""

import keras
from keras import ops

from keras_vit.layers.utils import is_real, normalize_pair, positive_int

# The original adds 1e-5 to the standard deviation (not to the variance)
# (google-research/vision_transformer, `models_resnet.py`, weight_standardize).
STD_CONV_EPSILON = 1e-5


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Layer):
    """2-D convolution whose kernel is standardised on every call.

    Weight Standardization (Qiao et al., arXiv:1903.10520) as used by BiT
    (arXiv:1912.11370) and the hybrid ViT models: at every call the stored
    kernel `w` of shape `(kh, kw, C_in, filters)` is replaced by
    `(w - mean(w)) / (std(w) + epsilon)`, with the mean and the population
    standard deviation taken over `(kh, kw, C_in)` for each output channel.
    The variable holds the raw kernel, exactly as the original checkpoints
    store it, so `.npz` kernels copy in unchanged.

    Padding is TensorFlow's "SAME" (for even sizes and stride 2 the extra row
    and column go at the bottom and right), which is what the original uses
    and what Keras' `"same"` computes on every backend; symmetric padding
    would shift the output. There is no bias: every StdConv in the original is
    followed by a GroupNorm.

    Args:
        filters: int. Number of output channels.
        kernel_size: int or tuple of 2 ints.
        strides: int or tuple of 2 ints. Defaults to `1`.
        epsilon: float. Added to the standard deviation. Defaults to `1e-5`
            (the original's; timm uses `sqrt(var + eps)` instead).
        kernel_initializer: Initializer for the raw kernel. Defaults to
            `"lecun_normal"` (the Flax Conv default).

    Call arguments:
        inputs: `(B, H, W, C_in)` tensor.

    Returns:
        `(B, ceil(H / sh), ceil(W / sw), filters)` tensor.
    """

    def __init__(
        self,
        filters,
        kernel_size,
        strides=1,
        epsilon=STD_CONV_EPSILON,
        kernel_initializer="lecun_normal",
        **kwargs,
    ):
        super().__init__(**kwargs)
        filters = positive_int(filters, "filters")
        if not is_real(epsilon) or epsilon < 0:
            raise ValueError(
                f"`epsilon` must be a non-negative float. Received: epsilon={epsilon!r}"
            )
        self.filters = filters
        self.kernel_size = normalize_pair(kernel_size, "kernel_size")
        self.strides = normalize_pair(strides, "strides")
        self.epsilon = float(epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        # No autocast: under mixed precision Keras hands `call` the float32
        # variable already cast to bfloat16, and centring a kernel whose mean
        # is large next to its spread loses most of its bits there (0.04 to
        # 0.36 relative error in tiny hybrids' logits). `call` standardises
        # in float32, then casts.
        self.kernel = self.add_weight(
            name="kernel",
            shape=(*self.kernel_size, input_shape[-1], self.filters),
            initializer=self.kernel_initializer,
            autocast=False,
        )

    def standardized_kernel(self):
        """The kernel the convolution uses, in the variable's dtype."""
        w = ops.convert_to_tensor(self.kernel)
        w = w - ops.mean(w, axis=(0, 1, 2), keepdims=True)
        # Population std (ddof 0), like jnp.std in the original.
        std = ops.sqrt(ops.mean(ops.square(w), axis=(0, 1, 2), keepdims=True))
        return w / (std + self.epsilon)

    def call(self, inputs):
        # Standardise in the variable's precision, then cast, so mixed
        # precision only affects the convolution itself.
        kernel = ops.cast(self.standardized_kernel(), self.compute_dtype)
        return ops.conv(
            inputs, kernel, strides=self.strides, padding="same",
            data_format="channels_last",
        )

    def compute_output_shape(self, input_shape):
        def out(size, stride):
            return None if size is None else -(-size // stride)

        return (
            input_shape[0],
            out(input_shape[1], self.strides[0]),
            out(input_shape[2], self.strides[1]),
            self.filters,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "kernel_size": self.kernel_size,
                "strides": self.strides,
                "epsilon": self.epsilon,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
