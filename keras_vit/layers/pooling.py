"""Pooling of the encoder's token sequence into one representation."""

import keras
from keras import ops

from keras_vit.layers.utils import non_negative_int

POOLING_METHODS = ("token", "gap")


def check_prefix_tokens(layer, input_shape):
    """`num_prefix_tokens` must leave tokens to pool (all of them: a mean of
    none was NaN)."""
    tokens = input_shape[1]
    if tokens is not None and layer.num_prefix_tokens >= tokens:
        raise ValueError(f"`num_prefix_tokens` must be below the {tokens} tokens of the input. "
                         f"Received: num_prefix_tokens={layer.num_prefix_tokens}")


def pooled_prefix_tokens(method, include_prefix, num_prefix_tokens):
    """The prefix tokens (class token, registers) a pooling leaves out: none
    for `"token"` (it reads index 0) or with `include_prefix` (timm's
    `pool_include_prefix`), else all of them (timm's `global_pool`)."""
    return 0 if include_prefix or method == "token" else num_prefix_tokens


@keras.saving.register_keras_serializable(package="keras_vit")
class SequencePooling(keras.layers.Layer):
    """Pools `(B, T, D)` tokens to `(B, D)`.

    `"token"` takes the class token at index 0; `"gap"` averages the tokens
    after the first `num_prefix_tokens` (google-research/vision_transformer,
    `models_vit.py`, `classifier` field, where there are none; timm leaves a
    class token and registers out of the average).

    Args:
        method: `"token"` or `"gap"`.
        num_prefix_tokens: int. Tokens before the patches that `"gap"`
            leaves out. Defaults to 0.
    """

    def __init__(self, method="token", num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        if method not in POOLING_METHODS:
            raise ValueError(
                f"`method` must be one of {POOLING_METHODS}. Received: method={method!r}"
            )
        self.method = method
        self.num_prefix_tokens = non_negative_int(num_prefix_tokens, "num_prefix_tokens")

    def build(self, input_shape):
        if self.method == "gap":
            check_prefix_tokens(self, input_shape)

    def call(self, tokens):
        if self.method == "token":
            return tokens[:, 0]
        return ops.mean(tokens[:, self.num_prefix_tokens:], axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])

    def get_config(self):
        config = super().get_config()
        config["method"] = self.method
        config["num_prefix_tokens"] = self.num_prefix_tokens
        return config
