"""The learned [class] token prepended to the patch sequence (paper Eq. 1)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepends a learned `(1, 1, D)` token to a `(B, N, D)` sequence.

    The token is zero-initialised, as in the original `cls` parameter
    (google-research/vision_transformer, `models_vit.py`), and sits at index 0.

    Args:
        initializer: Initializer for the token. Defaults to `"zeros"`.

    Returns:
        `(B, N + 1, D)` tensor.
    """

    def __init__(self, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        self.cls = self.add_weight(
            name="cls",
            shape=(1, 1, input_shape[-1]),
            initializer=self.initializer,
        )

    def call(self, tokens):
        cls = ops.cast(self.cls, self.compute_dtype)
        batch = ops.shape(tokens)[0]
        cls = ops.broadcast_to(cls, (batch, 1, ops.shape(cls)[-1]))
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        return config
