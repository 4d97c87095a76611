"""Attention probabilities of a keras_vit model, without touching the model.

`attention_model(model)` builds a second functional model that reuses the
model's own layer objects (so it shares every weight, now and after later
training) and returns the attention probabilities of the chosen encoder
blocks. The model itself keeps calling its blocks without
`return_attention_scores`, i.e. on the fused `keras.ops.dot_product_attention`
path, for inference and training.
"""

import weakref

import keras
import numpy as np

from keras_vit.layers import ImageSizeCheck, TransformerEncoderBlock
from keras_vit.layers.utils import is_int
from keras_vit.anatomy import anatomy
from keras_vit.models.vit_model import ViTModel


def block_names(model):
    """Names of the model's encoder blocks, in order (`encoderblock_0`, ...)."""
    return list(anatomy(model).block_names)


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionProbe(keras.layers.Layer):
    """Calls a `TransformerEncoderBlock` and also returns its attention.

    Wraps an existing block (the same object, so the same weights) and calls
    it with `return_attention_scores=True`, which makes Keras'
    `MultiHeadAttention` compute the softmax explicitly instead of the fused
    kernel. The wrapper only exists so that a functional model can hold the
    two outputs of such a call.

    Args:
        block: the `TransformerEncoderBlock` to call.

    Returns:
        A tuple: the block's output `(B, T, D)` and the attention
        probabilities `(B, heads, T, T)` (query axis before key axis),
        before attention dropout.
    """

    def __init__(self, block, **kwargs):
        super().__init__(**kwargs)
        if isinstance(block, dict):
            block = keras.saving.deserialize_keras_object(block)
        if not isinstance(block, TransformerEncoderBlock):
            raise ValueError(
                "`block` must be a keras_vit TransformerEncoderBlock. "
                f"Received: block={block!r}"
            )
        self.block = block

    def build(self, input_shape):
        if not self.block.built:
            self.block.build(input_shape)

    def call(self, inputs, training=None):
        return self.block(inputs, training=training, return_attention_scores=True)

    def compute_output_spec(self, inputs, training=None):
        batch, tokens = inputs.shape[0], inputs.shape[1]
        scores = keras.KerasTensor(
            (batch, self.block.num_heads, tokens, tokens), dtype=self.compute_dtype
        )
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype), scores

    def get_config(self):
        config = super().get_config()
        config["block"] = keras.saving.serialize_keras_object(self.block)
        return config


def _check_blocks(blocks, num_layers):
    if blocks is None:
        return list(range(num_layers))
    given = [blocks] if is_int(blocks) else blocks
    ok = isinstance(given, (list, tuple, range, np.ndarray)) and all(is_int(b) for b in given)
    chosen = [int(b) for b in given] if ok else []
    # Negative indices count from the last block, as in Python.
    chosen = [b + num_layers if b < 0 else b for b in chosen]
    if not ok or not chosen or not all(0 <= b < num_layers for b in chosen):
        raise ValueError(
            f"`blocks` must be None (all), or block indices in [-{num_layers}, "
            f"{num_layers}) for this {num_layers}-block model. Received: blocks={blocks!r}"
        )
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"`blocks` has repeated indices. Received: blocks={blocks!r}")
    return chosen


def attention_model(model, blocks=None):
    """A model that returns the attention probabilities of `blocks`.

    The returned functional model takes the same images as `model` and reuses
    its layer objects: it shares every weight with `model` (assigning or
    training one changes the other), and `model` itself is unchanged (its
    blocks keep the fused attention path). Works for plain and hybrid models
    and for any weights.

    Args:
        model: a keras_vit model (functional, as built by `keras_vit.ViT`).
        blocks: None for every block, an int, or a list of block indices
            (negative ones count from the last block).

    Returns:
        A `keras.Model` whose output is a dict from block name
        (`"encoderblock_3"`) to its `(B, heads, T, T)` attention
        probabilities (read them by name: JAX returns the keys sorted):
        `scores[b, h, i, j]` is how much query token `i` attends to key
        token `j` (rows sum to 1). Token 0 is the class token when the model
        has one, then the patches in row-major order.
    """
    names = block_names(model)
    chosen = _check_blocks(blocks, len(names))
    # The first block's input is the embedded sequence (patches, class
    # token, position embedding, dropout) of the model's own graph.
    x = model.get_layer(names[0]).input
    scores = {}
    for i in range(max(chosen) + 1):
        block = model.get_layer(names[i])
        if i in chosen:
            # The block's own dtype policy, not the global one: a float32
            # model inspected under a global `mixed_bfloat16` stays float32.
            x, scores[i] = AttentionProbe(block, dtype=block.dtype_policy, name=f"attention_probe_{i}")(x)
        else:
            x = block(x)
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
    outputs = {names[i]: scores[i] for i in chosen}
    return ViTModel(inputs, outputs, name=f"{model.name}_attention")


# model -> {blocks: (its variable count, its attention model)}: the analyses
# reuse one, and its compiled `predict` with it (a new one compiled again
# at every call: 1.4 s per call of a tiny model on JAX, for a notebook
# looping over images). One made before variables were added (LoRA
# adapters, quantization) is made again: TensorFlow's traced graph would
# ignore them. The attention model holds the model's layers, not the
# model: an entry goes with its model.
_PROBES = weakref.WeakKeyDictionary()


def _probe(model, chosen):
    probes = _PROBES.setdefault(model, {})
    count, probe = probes.get(tuple(chosen), (None, None))
    if count != len(model.weights):
        probe = attention_model(model, chosen)
        probes[tuple(chosen)] = (len(model.weights), probe)
    return probe


def check_images(model, images):
    """`images` as a numpy array, checked against the model's input shape
    before any step runs, so that the error names `images` (a model the
    user wrapped in a plain `keras.Model` would also lose its weights on
    JAX to a failed `predict`; see `keras_vit.models.ViTModel`)."""
    images = keras.ops.convert_to_numpy(images)
    expected = tuple(model.inputs[0].shape[1:])  # None: any size (a dynamic-size model)
    if images.ndim != 4 or not len(images) or any(
            e is not None and e != s for e, s in zip(expected, images.shape[1:])):
        raise ValueError(
            f"`images` must have shape (batch, {', '.join(map(str, expected))}) with a batch of at least one "
            f"for this model. Received: images.shape={images.shape}"
        )
    for layer in model.layers:  # the patch grid of a dynamic-size model reading the images as given
        if isinstance(layer, ImageSizeCheck) and layer.input is model.inputs[0]:
            layer.check_shape(images.shape)
    return images


def _check_batch_size(batch_size):
    if not is_int(batch_size) or batch_size <= 0:
        raise ValueError(f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}")
    return int(batch_size)  # PyTorch's data loader takes Python ints only


def attention_batches(model, images, batch_size=32):
    """Yields the attention of every block, one batch of `images` at a time.

    For analyses that reduce over images (rollout, attention distance): the
    attention of many images at once is large. Each item is a float64 array
    `(layers, b, heads, T, T)` for the next `b <= batch_size` images.
    """
    images = check_images(model, images)
    batch_size = _check_batch_size(batch_size)
    names = block_names(model)
    probe = _probe(model, range(len(names)))
    for start in range(0, len(images), batch_size):
        out = probe.predict_on_batch(images[start:start + batch_size])
        yield np.stack([np.asarray(out[name], dtype=np.float64) for name in names])


def attention_weights(model, images, blocks=None, batch_size=32):
    """Attention probabilities of `model` on `images`, as numpy.

    Args:
        model: a keras_vit model.
        images: `(B, H, W, 3)` array in the model's input range ([-1, 1] for
            keras_vit models; see `keras_vit.preprocess_input`).
        blocks: None (all blocks), an int or a list of block indices.
        batch_size: images per forward pass.

    Returns:
        float32 numpy array `(len(blocks), B, heads, T, T)`. Mind the size:
        ViT-B/16 at 224 px holds 12 x 12 x 197 x 197 floats (22 MB) per
        image; `rollout_maps` and `model_attention_distance` go batch by
        batch instead.
    """
    images = check_images(model, images)
    batch_size = _check_batch_size(batch_size)
    names = block_names(model)
    chosen = _check_blocks(blocks, len(names))
    probe = _probe(model, chosen)
    # `predict` compiles the whole forward pass (jit on JAX, tf.function on
    # TensorFlow) instead of running it op by op.
    out = probe.predict(images, batch_size=batch_size, verbose=0)
    return np.stack([np.asarray(out[names[i]], dtype=np.float32) for i in chosen])
