"""The learned [class] token prepended to the patch sequence (paper Eq. 1)."""

import keras
from keras import ops

from keras_vit.layers.utils import positive_int


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepends learned `(1, K, D)` tokens to a `(B, N, D)` sequence.

    The class token (K = 1) is zero-initialised, as in the original `cls`
    parameter (google-research/vision_transformer, `models_vit.py`), and sits
    at index 0. The same layer holds register tokens (Darcet et al., "Vision
    Transformers Need Registers", ICLR 2024; DINOv2 with registers: K = 4),
    prepended before the class token is, so that the order is
    `[class, registers, patches]` as in timm.

    Args:
        initializer: Initializer for the tokens. Defaults to `"zeros"`.
        num_tokens: int. K, the tokens prepended. Defaults to 1.

    Returns:
        `(B, N + K, D)` tensor.
    """

    def __init__(self, initializer="zeros", num_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)
        self.num_tokens = positive_int(num_tokens, "num_tokens")

    def build(self, input_shape):
        self.cls = self.add_weight(
            name="cls",
            shape=(1, self.num_tokens, input_shape[-1]),
            initializer=self.initializer,
        )

    def call(self, tokens):
        cls = ops.cast(self.cls, self.compute_dtype)
        batch = ops.shape(tokens)[0]
        cls = ops.broadcast_to(cls, (batch, self.num_tokens, ops.shape(cls)[-1]))
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + self.num_tokens
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        config["num_tokens"] = self.num_tokens
        return config
