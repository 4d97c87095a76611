"""The original ViT losses, computed in float32 on the head's logits."""

import keras
from keras import ops

from keras_vit.layers.utils import check_bool, check_rate

# Head bias initialisation of AugReg-style sigmoid pre-training
# (big_vision configs `vit_i21k.py` / `vit_i1k.py`: `head_bias_init`), about
# -log(num_classes) so that the initial sigmoid outputs match the label prior.
# Use with the model: `keras_vit.ViTB16(num_classes=21843,
#     head_bias_init=SIGMOID_HEAD_BIAS_INIT["imagenet21k"])`.
SIGMOID_HEAD_BIAS_INIT = {"imagenet21k": -10.0, "imagenet2012": -6.9}


def _check_labels(loss, y_true, logits, sparse):
    """Labels that would broadcast against the logits are refused (static
    shapes, what a traced step knows): `(B, 1)` class indices against
    `(B, C)` logits trained on `-y * sum(log_softmax)`, silently."""
    labels, shape = tuple(y_true.shape), tuple(logits.shape)
    if sparse:
        fits = len(labels) == len(shape) - 1 or (len(labels) == len(shape) and labels[-1] in (1, None))
        hint = "class indices (B,) or (B, 1); one-hot labels need sparse=False"
    else:
        fits = len(labels) == len(shape) and (None in (labels[-1], shape[-1]) or labels[-1] == shape[-1])
        hint = "one-hot or multi-hot labels (B, classes)" + (
            "; class indices need sparse=True" if isinstance(loss, SoftmaxCrossEntropy) else "")
    if not fits:
        raise ValueError(f"{type(loss).__name__}: labels of shape {labels} do not fit logits of shape {shape} "
                         f"({hint}). Received: labels of shape {labels}")


@keras.saving.register_keras_serializable(package="keras_vit")
class SoftmaxCrossEntropy(keras.losses.Loss):
    """Softmax cross-entropy on logits: the fine-tuning loss of the paper.

    `-sum(labels * log_softmax(logits), axis=-1)`, averaged over the batch,
    as in google-research/vision_transformer (`vit_jax/train.py`) and
    big_vision (`softmax_xent`). Computed in float32 whatever the model's
    dtype policy.

    Args:
        label_smoothing: float in [0, 1). Labels become
            `labels * (1 - s) + s / num_classes`. Defaults to 0 (the
            original fine-tunes without it).
        sparse: bool. Labels are class indices `(B,)` instead of one-hot
            `(B, num_classes)`; an index >= num_classes gives a NaN loss, a
            negative one (an "ignore" mark) a loss of 0. Defaults to False.
        reduction: Keras loss reduction. Defaults to `"sum_over_batch_size"`
            (the batch mean).
        name: loss name.
    """

    def __init__(
        self,
        label_smoothing=0.0,
        sparse=False,
        reduction="sum_over_batch_size",
        name="softmax_cross_entropy",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype or "float32")
        self.label_smoothing = check_rate(label_smoothing, "label_smoothing")
        self.sparse = check_bool(sparse, "sparse")

    def call(self, y_true, y_pred):
        logits = ops.cast(y_pred, "float32")
        num_classes = logits.shape[-1]
        _check_labels(self, y_true, logits, self.sparse)
        valid = None
        if self.sparse:
            labels = ops.cast(ops.reshape(y_true, ops.shape(logits)[:-1]), "int32")
            # An index past the classes had an all-zero one-hot (JAX, TF): a
            # loss of 0 and no gradient, so 1-based labels trained without a
            # word. It gives NaN instead, on every backend (PyTorch's one-hot
            # raised): `BackupAndResume` stops there, naming the data. A
            # negative index stays the usual "ignore" mark: a loss of 0.
            valid = labels < num_classes
            labels = ops.one_hot(ops.where(valid, labels, -1), num_classes, dtype="float32")
        else:
            labels = ops.cast(y_true, "float32")
        if self.label_smoothing:
            labels = labels * (1.0 - self.label_smoothing) + (
                self.label_smoothing / num_classes
            )
        loss = -ops.sum(labels * ops.log_softmax(logits, axis=-1), axis=-1)
        return loss if valid is None else ops.where(valid, loss, float("nan"))

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "sparse": self.sparse})
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class SigmoidCrossEntropy(keras.losses.Loss):
    """Per-class sigmoid cross-entropy, summed over classes: AugReg pre-training.

    `-sum(labels * log_sigmoid(logits) + (1 - labels) * log_sigmoid(-logits),
    axis=-1)`, averaged over the batch: big_vision's `sigmoid_xent`, used for
    the AugReg ImageNet-21k / ImageNet-1k pre-training with the head bias
    initialised to -10 / -6.9 (`SIGMOID_HEAD_BIAS_INIT`, passed to the model
    as `head_bias_init`). Unlike `keras.losses.BinaryCrossentropy`, which
    averages over classes, the sum keeps the gradient scale of the original
    (this matters for gradient clipping). Computed in float32.

    Args:
        label_smoothing: float in [0, 1). Labels become
            `labels * (1 - s) + s / 2`. Defaults to 0.
        reduction: Keras loss reduction. Defaults to `"sum_over_batch_size"`.
        name: loss name.
    """

    def __init__(
        self,
        label_smoothing=0.0,
        reduction="sum_over_batch_size",
        name="sigmoid_cross_entropy",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype or "float32")
        self.label_smoothing = check_rate(label_smoothing, "label_smoothing")

    def call(self, y_true, y_pred):
        logits = ops.cast(y_pred, "float32")
        _check_labels(self, y_true, logits, sparse=False)
        labels = ops.cast(y_true, "float32")
        if self.label_smoothing:
            labels = labels * (1.0 - self.label_smoothing) + 0.5 * self.label_smoothing
        log_p = ops.log_sigmoid(logits)
        log_not_p = ops.log_sigmoid(-logits)
        return -ops.sum(labels * log_p + (1.0 - labels) * log_not_p, axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing})
        return config
