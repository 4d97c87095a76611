"""Multihead attention pooling (the "MAP" head of SigLIP and big_vision)."""

import keras
from keras import ops

from keras_vit.layers.encoder_block import LAYER_NORM_EPSILON, MlpBlock, check_gelu
from keras_vit.layers.pooling import check_prefix_tokens
from keras_vit.layers.utils import freeze_sublayers_if_frozen, non_negative_int, positive_int


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPooling(keras.layers.Layer):
    """Pools `(B, T, D)` tokens to `(B, D)` with a learned query.

    A learned `(1, 1, D)` probe attends over the tokens (multi-head
    attention, no residual), then `x + MLP(LayerNorm(x))`, as big_vision's
    `MAPHead` (Lee et al., "Set Transformer", 2019; SigLIP) and timm's
    `AttentionPoolLatent`.

    Args:
        num_heads: int. Attention heads; must divide the width.
        mlp_dim: int. Hidden width of the MLP.
        gelu: the MLP's GELU (see `MlpBlock`). Defaults to `"tanh"`.
        layer_norm_epsilon: float. Defaults to 1e-6.
        num_prefix_tokens: int. Tokens before the patches (class, registers)
            that the probe does not attend to, as timm's `pool` leaves them
            out (`pool_include_prefix=False`). Defaults to 0: every token.
    """

    def __init__(self, num_heads, mlp_dim, gelu="tanh", layer_norm_epsilon=LAYER_NORM_EPSILON, num_prefix_tokens=0,
                 **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = non_negative_int(num_prefix_tokens, "num_prefix_tokens")
        self.num_heads = positive_int(num_heads, "num_heads")
        self.mlp_dim = positive_int(mlp_dim, "mlp_dim")
        self.gelu = check_gelu(gelu)
        self.layer_norm_epsilon = layer_norm_epsilon

    def build(self, input_shape):
        check_prefix_tokens(self, input_shape)
        hidden_size = input_shape[-1]
        if hidden_size % self.num_heads:
            raise ValueError(
                f"The width ({hidden_size}) must be divisible by `num_heads`. Received: num_heads={self.num_heads}"
            )
        self.probe = self.add_weight(
            name="probe", shape=(1, 1, hidden_size), initializer=keras.initializers.GlorotUniform()
        )
        self.attention = keras.layers.MultiHeadAttention(
            num_heads=self.num_heads, key_dim=hidden_size // self.num_heads, name="MultiHeadDotProductAttention_0",
            dtype=self.dtype_policy,
        )
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="LayerNorm_0", dtype=self.dtype_policy
        )
        self.mlp = MlpBlock(self.mlp_dim, gelu=self.gelu, name="MlpBlock_0", dtype=self.dtype_policy)
        probe_shape = (input_shape[0], 1, hidden_size)
        self.attention.build(probe_shape, input_shape)
        self.layer_norm.build(probe_shape)
        self.mlp.build(probe_shape)
        freeze_sublayers_if_frozen(self, (self.attention, self.layer_norm, self.mlp))

    def call(self, tokens):
        tokens = tokens[:, self.num_prefix_tokens:]
        probe = ops.cast(self.probe, self.compute_dtype)
        probe = ops.broadcast_to(probe, (ops.shape(tokens)[0], 1, ops.shape(probe)[-1]))
        x = self.attention(probe, tokens)
        x = x + self.mlp(self.layer_norm(x))
        return x[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, mlp_dim=self.mlp_dim, gelu=self.gelu,
                      layer_norm_epsilon=self.layer_norm_epsilon, num_prefix_tokens=self.num_prefix_tokens)
        return config
