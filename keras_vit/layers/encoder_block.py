"""The pre-norm Transformer encoder block of ViT (paper Eq. 2-3)."""

import contextlib
import math

import keras
from keras import ops

from keras_vit.layers.utils import SEED_STATE
from keras_vit.layers.utils import call_symbolically
from keras_vit.layers.utils import check_bool
from keras_vit.layers.utils import check_rate
from keras_vit.layers.utils import is_real
from keras_vit.layers.utils import named_seed_generator
from keras_vit.layers.utils import positive_int
from keras_vit.layers.utils import freeze_sublayers_if_frozen

# Flax LayerNorm's default; Keras' default (1e-3) gives visibly different
# logits with the original checkpoints.
LAYER_NORM_EPSILON = 1e-6

# The MLP's GELU: "tanh" is the original's (`flax.linen.gelu`, the tanh
# approximation; also SigLIP's), "exact" the erf form (PyTorch's default:
# timm, DeiT, DINO), "quick" OpenAI CLIP's x * sigmoid(1.702 x).
GELUS = ("tanh", "exact", "quick")


def gelu(x, kind):
    if kind == "quick":
        return x * ops.sigmoid(1.702 * x)
    return ops.gelu(x, approximate=kind == "tanh")


def check_gelu(kind):
    if kind not in GELUS:
        raise ValueError(f"`gelu` must be one of {GELUS}. Received: gelu={kind!r}")
    return kind


def attention_kernel_initializer(hidden_size):
    """Xavier-uniform on the flattened (D, D) kernel, as Flax DenseGeneral.

    Flax initialises the (D, heads, head_dim) kernels on their 2-D shape, so
    the limit is sqrt(6 / (D + D)); Keras' GlorotUniform on the 3-D shape
    would use other fans.
    """
    limit = math.sqrt(3.0 / hidden_size)
    return keras.initializers.RandomUniform(-limit, limit)


def _epsilon(value, name):
    """A layer normalisation's epsilon: a positive float (a negative one
    gave NaN outputs)."""
    if not is_real(value) or value <= 0:
        raise ValueError(f"`{name}` must be a positive float. Received: {name}={value!r}")
    return float(value)


@keras.saving.register_keras_serializable(package="keras_vit")
class MlpBlock(keras.layers.Layer):
    """Dense -> GELU -> Dropout -> Dense -> Dropout.

    The original uses `flax.linen.gelu`, i.e. `jax.nn.gelu(approximate=True)`,
    xavier-uniform kernels and normal(1e-6) biases
    (google-research/vision_transformer, `models_vit.py`, `MlpBlock`).

    Args:
        mlp_dim: int. Width of the hidden layer.
        dropout_rate: float. Dropout after the GELU and after the output.
        gelu: `"tanh"` (the original's, default), `"exact"` (erf) or
            `"quick"` (OpenAI CLIP's `x * sigmoid(1.702 x)`).
    """

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu="tanh", **kwargs):
        super().__init__(**kwargs)
        self.mlp_dim = mlp_dim
        self.dropout_rate = check_rate(dropout_rate, "dropout_rate")
        self.gelu = check_gelu(gelu)
        self.supports_masking = True

    def build(self, input_shape):
        hidden_size = input_shape[-1]
        dense_kwargs = dict(
            kernel_initializer="glorot_uniform",
            bias_initializer=keras.initializers.RandomNormal(stddev=1e-6),
            dtype=self.dtype_policy,
        )
        self.dense_0 = keras.layers.Dense(self.mlp_dim, name="Dense_0", **dense_kwargs)
        self.dense_1 = keras.layers.Dense(hidden_size, name="Dense_1", **dense_kwargs)
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)
        # Called on symbolic inputs rather than built: see `call_symbolically`.
        call_symbolically(self.dense_1, call_symbolically(self.dense_0, input_shape))
        call_symbolically(self.dropout, input_shape)
        freeze_sublayers_if_frozen(self, (self.dense_0, self.dense_1, self.dropout))

    def call(self, inputs, training=None):
        # `training` reaches the dropout through Keras' call context; passing
        # it on explicitly sends every sub-layer call down Keras' slower
        # argument-conversion path (measurable in eager PyTorch), so only
        # where it matters: a call without that context (`stateless_call`,
        # `call`) otherwise ran the dropout as at inference.
        given = {"training": training} if training is not None and self.dropout_rate else {}
        x = self.dense_0(inputs)
        x = gelu(x, self.gelu)
        x = self.dropout(x, **given)
        x = self.dense_1(x)
        return self.dropout(x, **given)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"mlp_dim": self.mlp_dim, "dropout_rate": self.dropout_rate, "gelu": self.gelu})
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class QKNormAttention(keras.layers.MultiHeadAttention):
    """`keras.layers.MultiHeadAttention` with qk-norm: a LayerNorm over each
    head's query and key vectors (head_dim) before their dot product
    (Dehghani et al., "Scaling Vision Transformers to 22 Billion
    Parameters", 2023; timm's `qk_norm`: one scale and bias of head_dim
    shared by the heads). Overrides `_compute_attention`, the hook Keras
    documents for custom attention, so the fused and the explicit
    (attention scores) paths both normalise.

    Args:
        qk_norm_epsilon: float. Defaults to 1e-6.
        **kwargs: `keras.layers.MultiHeadAttention`'s.
    """

    def __init__(self, *args, qk_norm_epsilon=LAYER_NORM_EPSILON, **kwargs):
        super().__init__(*args, **kwargs)
        self.qk_norm_epsilon = _epsilon(qk_norm_epsilon, "qk_norm_epsilon")

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        head_shape = (*query_shape[:-1], self.num_heads, self.key_dim)
        self.query_norm = keras.layers.LayerNormalization(
            epsilon=self.qk_norm_epsilon, name="query_norm", dtype=self.dtype_policy)
        self.key_norm = keras.layers.LayerNormalization(
            epsilon=self.qk_norm_epsilon, name="key_norm", dtype=self.dtype_policy)
        self.query_norm.build(head_shape)
        self.key_norm.build(head_shape)
        # Keras builds MultiHeadAttention's projections trainable even in a
        # frozen layer (a frozen block passes its state on itself).
        freeze_sublayers_if_frozen(self, (self.query_dense, self.key_dense, self.value_dense, self.output_dense,
                                          self.query_norm, self.key_norm))

    def _compute_attention(self, query, key, value, *args, **kwargs):
        return super()._compute_attention(self.query_norm(query), self.key_norm(key), value, *args, **kwargs)

    def get_config(self):
        config = super().get_config()
        config["qk_norm_epsilon"] = self.qk_norm_epsilon
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerEncoderBlock(keras.layers.Layer):
    """One ViT encoder block: pre-LayerNorm attention and MLP, with residuals.

    x = x + Dropout(MHA(LN(x)));  x = x + MLP(LN(x))   (paper Eq. 2-3;
    google-research/vision_transformer, `Encoder1DBlock`). Sub-layers carry the
    checkpoint names (`LayerNorm_0`, `MultiHeadDotProductAttention_1`,
    `LayerNorm_2`, `MlpBlock_3`). Attention is `keras.layers.MultiHeadAttention`,
    whose kernels have the checkpoints' layouts ((D, heads, head_dim) for
    query/key/value, (heads, head_dim, D) for the output) and which takes the
    fused `keras.ops.dot_product_attention` path unless attention scores or
    attention dropout are asked for.

    Args:
        num_heads: int. Number of attention heads; must divide the width.
        mlp_dim: int. Hidden width of the MLP.
        dropout_rate: float. Dropout after attention and in the MLP.
            Defaults to 0.
        attention_dropout_rate: float. Dropout on the attention probabilities
            (disables the fused attention path while training). Defaults to 0.
        drop_path_rate: float. Stochastic depth: probability of dropping each
            residual branch per example (Huang et al., 2016). Defaults to 0.
        layer_norm_epsilon: float. Defaults to 1e-6 (Flax's default).
        gelu: the MLP's GELU, `"tanh"` (default), `"exact"` or `"quick"`
            (see `MlpBlock`).
        layer_scale_init: None (default: no LayerScale, as the original) or
            the initial value of LayerScale's per-channel factors on each
            residual branch (Touvron et al., CaiT; DeiT III and DINOv2 use
            1e-5 to 1e-6): `x + gamma * branch`.
        qk_norm: bool. LayerNorm on each head's queries and keys
            (`QKNormAttention`). Defaults to False.
        seed: optional int for the stochastic-depth noise and the attention
            probabilities' dropout (the other dropouts draw from Keras'
            global seed: `keras.utils.set_random_seed`).
        remat: bool. Gradient checkpointing (`keras.remat`): the block's
            activations are recomputed in the backward pass instead of kept,
            so training memory grows with one block's activations instead of
            all of them, for about a third more compute, in training calls.
            Results are the same (the recomputation redraws the forward's
            random numbers). Defaults to False.

    Call arguments:
        inputs: `(B, T, D)` tensor.
        training: bool.
        return_attention_scores: bool. Also return the attention
            probabilities `(B, heads, T, T)`. Off by default, so the fused
            attention path is used.

    Returns:
        `(B, T, D)` tensor, or a tuple `(outputs, scores)`.
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        gelu="tanh",
        layer_scale_init=None,
        qk_norm=False,
        seed=None,
        remat=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = positive_int(num_heads, "num_heads")
        self.mlp_dim = positive_int(mlp_dim, "mlp_dim")
        self.dropout_rate = check_rate(dropout_rate, "dropout_rate")
        self.attention_dropout_rate = check_rate(
            attention_dropout_rate, "attention_dropout_rate"
        )
        self.drop_path_rate = check_rate(drop_path_rate, "drop_path_rate")
        self.layer_norm_epsilon = _epsilon(layer_norm_epsilon, "layer_norm_epsilon")
        self.gelu = check_gelu(gelu)
        if layer_scale_init is not None and not is_real(layer_scale_init):
            raise ValueError(
                "`layer_scale_init` must be None or a float. "
                f"Received: layer_scale_init={layer_scale_init!r}"
            )
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)
        self.qk_norm = check_bool(qk_norm, "qk_norm")
        self.seed = seed
        self.remat = check_bool(remat, "remat")
        self.seed_generator = named_seed_generator(self, seed)
        self.supports_masking = True

    def build(self, input_shape):
        hidden_size = input_shape[-1]
        if hidden_size % self.num_heads:
            raise ValueError(
                f"The width ({hidden_size}) must be divisible by `num_heads`. "
                f"Received: num_heads={self.num_heads}"
            )
        norm_kwargs = dict(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy)
        self.layer_norm_0 = keras.layers.LayerNormalization(name="LayerNorm_0", **norm_kwargs)
        attention_kwargs = dict(qk_norm_epsilon=self.layer_norm_epsilon) if self.qk_norm else {}
        self.attention = (QKNormAttention if self.qk_norm else keras.layers.MultiHeadAttention)(
            **attention_kwargs,
            num_heads=self.num_heads,
            key_dim=hidden_size // self.num_heads,
            dropout=self.attention_dropout_rate,
            kernel_initializer=attention_kernel_initializer(hidden_size),
            bias_initializer="zeros",
            seed=self.seed,
            name="MultiHeadDotProductAttention_1",
            dtype=self.dtype_policy,
        )
        self.attention_dropout = keras.layers.Dropout(
            self.dropout_rate, dtype=self.dtype_policy
        )
        self.layer_norm_2 = keras.layers.LayerNormalization(name="LayerNorm_2", **norm_kwargs)
        self.mlp = MlpBlock(
            self.mlp_dim, self.dropout_rate, gelu=self.gelu, name="MlpBlock_3", dtype=self.dtype_policy
        )
        if self.layer_scale_init is not None:
            self.layer_scales = [
                self.add_weight(
                    name=f"layer_scale_{i}", shape=(hidden_size,),
                    initializer=keras.initializers.Constant(self.layer_scale_init),
                )
                for i in (1, 3)  # after the attention (1) and the MLP (3)
            ]
        # Called on symbolic inputs rather than built: see `call_symbolically`.
        for layer in (self.layer_norm_0, self.attention, self.attention_dropout, self.layer_norm_2, self.mlp):
            call_symbolically(layer, input_shape)
        freeze_sublayers_if_frozen(self, (
            self.layer_norm_0, self.attention, self.attention_dropout, self.layer_norm_2, self.mlp))

    def _scale(self, branch, index):
        if self.layer_scale_init is None:
            return branch
        return branch * ops.cast(self.layer_scales[index], branch.dtype)

    def _drop_path(self, branch, training):
        if not training or self.drop_path_rate == 0.0:
            return branch
        keep = 1.0 - self.drop_path_rate
        shape = (ops.shape(branch)[0],) + (1,) * (len(branch.shape) - 1)
        # The draw in float32: in bfloat16 (multiples of 1/128, `keep`
        # rounded) a rate of 0.003 dropped 0.008 of the paths.
        from keras_vit.distribute import draw_for_global_batch  # imports keras_vit.layers

        # One draw for the global batch under tf.distribute: every replica
        # drew the same paths.
        noise = draw_for_global_batch(keras.random.uniform, shape, seed=self.seed_generator, dtype="float32")
        return branch * ops.cast(ops.floor(keep + noise) / keep, branch.dtype)

    def _attend(self, y, return_attention_scores, given=None):
        # Sub-layers get `training` from Keras' call context (see MlpBlock).
        if not return_attention_scores:
            return self.attention(y, y, **(given or {}))
        # With flash attention switched on (`keras.config.enable_flash_attention()`),
        # Keras refuses to return scores; this one call takes the explicit
        # softmax path instead, normal calls stay on the flash kernel.
        with self._flash_attention_off():
            return self.attention(y, y, return_attention_scores=True)

    @contextlib.contextmanager
    def _flash_attention_off(self):
        # Keras has no public per-layer switch (docs/training.md lists this seam).
        flash = self.attention._flash_attention
        self.attention._flash_attention = False
        try:
            yield
        finally:
            self.attention._flash_attention = flash

    def call(self, inputs, training=None, return_attention_scores=False):
        # Only a training call keeps activations for a backward pass.
        if not (self.remat and training) or return_attention_scores:
            return self._forward(inputs, training, return_attention_scores)
        # The recomputation must draw the forward's dropout and drop-path
        # masks: the seed generators' states go in as arguments, the block
        # runs in a StatelessScope that starts from them, and the states it
        # ends with come out and are assigned outside the recomputed region
        # (inside it, TensorFlow and PyTorch would recompute from the states
        # the forward left, and JAX would leak tracers).
        states = [v for v in self.variables if v.name == SEED_STATE]
        others = [v for v in self.variables if v.name != SEED_STATE]

        def forward(x, *started):
            # The values the surrounding scope gives the weights (JAX's
            # stateless training step), which a nested scope does not see.
            mapping = [(v, v.value) for v in others] + list(zip(states, started))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                y = self._forward(x, training, False, explicit_training=True)
            ended = [scope.get_current_value(v) for v in states]
            return (y, *[s if e is None else e for s, e in zip(started, ended)])

        started = [ops.copy(v.value) for v in states]
        try:
            y, *ended = keras.remat(forward)(inputs, *started)
        except NotImplementedError:
            # JAX on a GPU: Keras takes cuDNN's flash kernel when it accepts
            # the shapes for inference, and falls back to XLA's attention when
            # the training kernel refuses them (e.g. 197 or 577 tokens with
            # JAX 0.11). Under remat that refusal comes when the recomputed
            # region is differentiated, after Keras' fallback: it is made here.
            if keras.backend.backend() != "jax" or self.attention._flash_attention is False:
                raise
            with self._flash_attention_off():
                # A new function object: JAX reuses the trace it keeps for `forward`.
                y, *ended = keras.remat(lambda *args: forward(*args))(inputs, *started)
        for state, value in zip(states, ended):
            state.assign(value)
        return y

    def _forward(self, inputs, training, return_attention_scores, explicit_training=False):
        # A recomputation, like `stateless_call` or `call`, runs outside the
        # call that set Keras' call context: the sub-layers with dropout then
        # need `training` given explicitly (see MlpBlock.call for the price).
        dropout = self.dropout_rate or self.attention_dropout_rate
        given = {"training": training} if explicit_training or (training is not None and dropout) else {}
        y = self.layer_norm_0(inputs)
        attended = self._attend(y, return_attention_scores, given)
        if return_attention_scores:
            y, scores = attended
        else:
            y = attended
        y = self._scale(self.attention_dropout(y, **given), 0)
        x = inputs + self._drop_path(y, training)
        y = self._scale(self.mlp(self.layer_norm_2(x), **given), 1)
        x = x + self._drop_path(y, training)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        # With scores, two outputs: a functional model unpacks them.
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return outputs
        batch, tokens = inputs.shape[0], inputs.shape[1]
        return outputs, keras.KerasTensor((batch, self.num_heads, tokens, tokens), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "dropout_rate": self.dropout_rate,
                "attention_dropout_rate": self.attention_dropout_rate,
                "drop_path_rate": self.drop_path_rate,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "gelu": self.gelu,
                "layer_scale_init": self.layer_scale_init,
                "qk_norm": self.qk_norm,
                "seed": self.seed,
                "remat": self.remat,
            }
        )
        return config
