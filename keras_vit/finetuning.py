"""Fine-tuning helpers: a fresh head, a frozen backbone (linear probe)."""

import math
import numbers

import keras

from keras_vit import distribute
from keras_vit.layers.utils import check_bool
from keras_vit.layers.utils import check_head_trains
from keras_vit.layers.utils import head_dtype
from keras_vit.layers.utils import head_layer
from keras_vit.layers.utils import positive_int
from keras_vit.models.vit_model import ViTModel


def reset_head(model, num_classes, keep_pre_logits=False, activation=None, bias=0.0):
    """Replaces the classification head with a zero-initialised one.

    Paper Sec. 3.2: "we remove the pre-trained prediction head and attach a
    zero-initialized D x K feedforward layer". As in the original's
    fine-tuning (vit_jax `checkpoint.load_pretrained`), the `pre_logits`
    layer of a pre-training head is dropped unless `keep_pre_logits=True`.

    Args:
        model: a keras_vit model with a head (`include_top=True`) or with a
            pooled output (`include_top=False, pooling="token"` or `"gap"`).
        num_classes: int. Classes of the new head.
        keep_pre_logits: bool. Keep the `pre_logits` (Dense + tanh) layer of
            an ImageNet-21k checkpoint between the pooled token and the head.
        activation: None (logits) or an activation for the head.
        bias: the head's initial bias (e.g. -10 for sigmoid losses).

    Returns:
        A new functional model that shares every other layer (and its
        weights) with `model`; its head is zero kernel, constant bias.
    """
    num_classes = positive_int(num_classes, "num_classes")
    keep_pre_logits = check_bool(keep_pre_logits, "keep_pre_logits")
    if not isinstance(bias, numbers.Real) or isinstance(bias, bool) or not math.isfinite(bias):
        raise ValueError(f"`bias` must be a finite number. Received: bias={bias!r}")
    if not isinstance(model, keras.Model) or not hasattr(model, "inputs"):
        raise ValueError(
            f"`model` must be a functional keras_vit model. Received: model={model!r}"
        )
    distribute.check_scope(model, "reset_head")
    head = head_layer(model)
    features = model.outputs[0] if head is None else head.input
    if head is None and len(features.shape) != 2:
        raise ValueError(
            "`model` needs a classification head or a pooled output (build it "
            "with include_top=True, or include_top=False and pooling='token' "
            f"or 'gap'). Received: model {model.name!r} with output shape "
            f"{tuple(model.outputs[0].shape)}"
        )
    names = [layer.name for layer in model.layers]
    if "pre_logits" in names and not keep_pre_logits:
        features = model.get_layer("pre_logits").input
    outputs = keras.layers.Dense(
        num_classes,
        activation=activation,
        kernel_initializer="zeros",
        bias_initializer=keras.initializers.Constant(bias),
        dtype=head_dtype(features.dtype),  # the model's, not the global policy's; float32 under mixed precision
        name="head",
    )(features)
    # One input stays one tensor (not a list of one), as `ViT` builds it, so
    # calling the model with an array gives no structure warning.
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
    return ViTModel(inputs, outputs, name=model.name)


def freeze_backbone(model):
    """Freezes every layer but the head: a linear probe.

    Sets `trainable=False` on all layers except the one named `head`
    (compile the model afterwards; Keras reads `trainable` at compile time).

    Args:
        model: a keras_vit model with a float head (e.g. from `reset_head`;
            a head that `model.quantize` made int8 cannot train, and is
            refused).

    Returns:
        `model`, for chaining.
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a Keras model. Received: model={model!r}")
    if head_layer(model) is None:
        raise ValueError(
            "`model` has no layer named 'head' to keep trainable (build it with "
            f"include_top=True or call `reset_head` first). Received: model={model.name!r}"
        )
    check_head_trains(model, "freeze_backbone")
    for layer in model.layers:
        layer.trainable = layer.name == "head"
    return model
