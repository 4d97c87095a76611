"""Small helpers shared by the layers and model builders."""

import math
import numbers

import keras
import numpy as np
from keras import ops


def patch_grid(images, stride):
    """`(rows, cols)` of the patches of `(B, H, W, C)` images whose tokens
    cover `stride` pixels: ints where the size is known when the layer runs,
    tensors in a TensorFlow graph of unknown size."""
    shape = ops.shape(images)
    return shape[1] // stride[0], shape[2] // stride[1]


def is_int(value):
    """An integer: Python's or numpy's (sizes often come from arrays); not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(value, name):
    """`value` as a Python int (a config serialises it), refused unless a positive integer."""
    if not is_int(value) or value <= 0:
        raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
    return int(value)


def non_negative_int(value, name):
    """`value` as a Python int, refused unless an integer >= 0."""
    if not is_int(value) or value < 0:
        raise ValueError(f"`{name}` must be an int >= 0. Received: {name}={value!r}")
    return int(value)


def check_bool(value, name):
    """`value` as a Python bool, refused unless True or False (a string
    such as "no" would otherwise count as True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be a bool. Received: {name}={value!r}")
    return bool(value)


def normalize_pair(value, name):
    """Returns `value` as a tuple of two positive ints (an int is repeated)."""
    if is_int(value):
        value = (value, value)
    try:
        pair = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        pair = ()
    if len(pair) != 2 or min(pair) <= 0 or pair != tuple(value):
        raise ValueError(
            f"`{name}` must be a positive int or a tuple of 2 positive ints. "
            f"Received: {name}={value!r}"
        )
    return pair


def is_real(value):
    """A finite real number: Python's or numpy's (a rate from a numpy grid);
    not a bool, NaN or infinity."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_rate(value, name):
    """Validates a rate in [0, 1) (dropout, momentum, Adam's betas, label
    smoothing); returns it as a float."""
    if not is_real(value) or not 0.0 <= value < 1.0:
        raise ValueError(
            f"`{name}` must be a float in [0, 1). Received: {name}={value!r}"
        )
    return float(value)


def freeze_sublayers_if_frozen(layer, sublayers):
    """Passes a frozen layer's `trainable=False` on to the `sublayers` its
    `build` created.

    A layer restored from a config (`.keras` loading, `from_config`) is
    frozen before `build` creates its sub-layers, and Keras creates them,
    and their variables, trainable (MultiHeadAttention's own projections
    too): without this a frozen encoder trains again after a save and load.
    Each sub-layer is set (its setter reaches its own sub-layers and
    variables): `layer.trainable = False` on the already frozen layer would
    do nothing on TensorFlow, whose attribute tracking skips assigning a
    value an attribute already holds.
    """
    if not layer.trainable:
        for sublayer in sublayers:
            sublayer.trainable = False


# The name Keras gives a `keras.random.SeedGenerator`'s state variable: no
# public accessor lists a layer's generators (remat restarts them from their
# states, resume saves them; a private seam, docs/training.md).
SEED_STATE = "seed_generator_state"


def named_seed_generator(layer, seed):
    """`keras.random.SeedGenerator(seed)` for `layer`, its state at
    `<layer>/seed_generator/seed_generator_state`: the same path in every
    model built alike. Keras' own default numbers generators in the order a
    process makes them (`seed_generator_7/...`), so two equal models in one
    process would differ, e.g. in PyTorch's `state_dict` keys."""
    with keras.name_scope(layer.name):
        return keras.random.SeedGenerator(seed, name="seed_generator")


def head_dtype(compute_dtype):
    """The dtype of a head (logits, MPP's predictions) on features computed
    in `compute_dtype`: float32 for 16-bit ones (mixed precision or not),
    so that the logits and the loss keep float32's range; else the
    features' own (a float64 model's logits are float64)."""
    compute_dtype = keras.backend.standardize_dtype(compute_dtype)
    return "float32" if compute_dtype in ("float16", "bfloat16") else compute_dtype


def head_layer(model):
    """`model`'s classification head (the layer named `head`), or None."""
    try:
        return model.get_layer("head")
    except ValueError:
        return None


def check_head_trains(model, function):
    """Refuses a head that `model.quantize(...)` made an integer or float8
    layer: its kernel cannot train, and `function` (`freeze_backbone`,
    `enable_lora`) promises a trainable head."""
    head = head_layer(model)
    mode = None if head is None else head.quantization_mode
    if mode:
        raise ValueError(
            f"The head of model {model.name!r} is quantized ({mode}): its kernel does not train, and `{function}` "
            "trains the head. Quantize the rest alone (`model.quantize(mode, filters=lambda layer: layer.name != "
            "'head')`, in Keras versions with `filters=`) or give the quantized model a new head "
            f"(`keras_vit.reset_head`). Received: head quantization_mode={mode!r}")


def check_float_kernels(model, function):
    """Refuses a model whose `quantize(...)` made integer kernels (int8,
    int4): `function` writes float checkpoints, and the integer codes,
    without their scales, were written as the weights (a reloaded int8 model
    160 times off). float8 keeps float kernels and passes."""
    layers = sorted({v.path.rsplit("/", 1)[0] for v in model.weights
                     if v.path.endswith("/kernel") and "int" in str(v.dtype)})
    if layers:
        shown = ", ".join(layers[:3]) + (f", ... ({len(layers)} in all)" if len(layers) > 3 else "")
        raise ValueError(
            f"Model {model.name!r} has integer-quantized kernels, which `{function}` cannot write as float weights: "
            "export the model before `quantize` (adapters trained on the quantized model: `save_lora`, then "
            f"`enable_lora` and `load_lora` on the float model, `merge_lora`, export). Received: layers {shown}")


def track_torch_parameters(model):
    """On PyTorch, the lists behind `parameters()` and `state_dict()` made
    again after variables came or went (quantized kernels, LoRA adapters):
    a Keras layer makes them once, when built. As Keras' own
    `Model.quantize` does in newer versions (private, as there)."""
    if keras.backend.backend() == "torch":
        for layer in model._flatten_layers():
            layer._track_variables()


def call_symbolically(layer, shape):
    """Builds a sub-layer by calling it on a symbolic input of `shape`
    (`keras.KerasTensor`; attention gets it as query and value); returns the
    output's shape.

    Unlike `layer.build(shape)`, a call also records the sub-layer's name
    scope, which Keras does once, at its first call. Left to the first real
    call, that change of state fails a guard of `torch.compile`
    (`jit_compile=True` on PyTorch), which then compiles the model's predict
    step a second time. No computation: these layers give their output shape.
    """
    inputs = keras.KerasTensor(shape)
    if isinstance(layer, keras.layers.MultiHeadAttention):
        return layer(inputs, inputs).shape
    return layer(inputs).shape
