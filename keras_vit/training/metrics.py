"""Metrics for evaluation batches padded with weight-0 rows.

The pipelines' `pad_to_batch=True` pads the last evaluation batch to a
static shape (one compiled function, batches that split over replicas) and
yields weights, 1 for real rows. Keras' loss tracker averages batch losses
weighted by the padded batch size, so padding shrinks the `loss` that
`evaluate` reports; these metrics count the real examples only. Every
one is registered, so a model compiled with them saves to `.keras` and
loads back.
"""

import keras
from keras import ops

from keras_vit.training.losses import SigmoidCrossEntropy


@keras.saving.register_keras_serializable(package="keras_vit")
class ExampleCount(keras.metrics.Metric):
    """The number of examples evaluated: the rows whose weight is not 0
    (padding rows have 0; every row counts without weights). Rows, not the
    weights' sum: under `class_weight` or a weighted evaluation the sum was
    reported as the count."""

    def __init__(self, name="examples", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is None:
            count = ops.shape(y_true)[0]
        else:
            weight = ops.cast(sample_weight, "float32")
            if len(weight.shape) > 1:  # a weight per output: a row counts if any is not 0
                weight = ops.max(ops.abs(weight), axis=tuple(range(1, len(weight.shape))), initial=0.0)
            # A scalar or (1,) weight stands for every row.
            rows = ops.broadcast_to(ops.cast(ops.not_equal(weight, 0), "float32"), (ops.shape(y_true)[0],))
            count = ops.sum(rows)
        self.total.assign_add(ops.cast(count, "float32"))

    def result(self):
        # A copy: on PyTorch the variable's own tensor changed under the
        # result with the next reset (training logs showed the validation count).
        return ops.copy(self.total.value)

    def reset_state(self):
        self.total.assign(0.0)


def _get_loss(loss):
    """`keras.losses.get(loss)`, refusing None (which Keras passes through:
    the first evaluation then failed with "'NoneType' object is not callable")."""
    if loss is None:
        raise ValueError("`loss` must be a Keras loss, its name or a function. Received: loss=None")
    return keras.losses.get(loss)


@keras.saving.register_keras_serializable(package="keras_vit")
class LossMean(keras.metrics.Mean):
    """`loss` (a Keras loss) per example, averaged with the sample weights."""

    def __init__(self, loss, name="loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.loss = _get_loss(loss)

    def update_state(self, y_true, y_pred, sample_weight=None):
        values = self.loss.call(y_true, y_pred) if isinstance(self.loss, keras.losses.Loss) else self.loss(
            y_true, y_pred)
        return super().update_state(values, sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "loss": keras.losses.serialize(self.loss)}

    @classmethod
    def from_config(cls, config):
        return cls(**{**config, "loss": keras.losses.deserialize(config["loss"])})


@keras.saving.register_keras_serializable(package="keras_vit")
def precision_at_1(y_true, y_pred):
    """The label of the top prediction (big_vision's `prec@1` of sigmoid
    models): 1 where it is a true class of a multi-hot row, the accuracy on
    one-hot rows."""
    top = ops.expand_dims(ops.argmax(y_pred, axis=-1), -1)
    return ops.take_along_axis(ops.cast(y_true, "float32"), top, axis=-1)[..., 0]


def padded_batch_metrics(loss):
    """The `weighted_metrics` of a classifier evaluated on padded batches:
    accuracy (for a sigmoid loss, big_vision's precision at 1, right for
    multi-hot labels), the example count (`examples`), and `loss` (a Keras
    loss, e.g. `SoftmaxCrossEntropy()`, or its name) as a metric named
    `loss`, averaged over the real examples. Keras reports compiled metrics
    after its own loss tracker, so this is the `loss` of the logs, in
    training too: the data loss per example, without the model's
    regularisation losses (a keras_vit model has none: weight decay is the
    optimizer's), and averaged with `fit`'s `class_weight` as weights.

        model.compile(optimizer, loss=loss, weighted_metrics=padded_batch_metrics(loss))
    """
    loss = _get_loss(loss)
    # Class-index labels need the sparse accuracy: the one-hot one compared
    # an index with a row's argmax and gave nonsense.
    sparse = getattr(loss, "sparse", False) or isinstance(loss, keras.losses.SparseCategoricalCrossentropy) or (
        getattr(loss, "__name__", None) == "sparse_categorical_crossentropy")
    if sparse:
        accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    elif isinstance(loss, SigmoidCrossEntropy):
        accuracy = keras.metrics.MeanMetricWrapper(precision_at_1, name="accuracy")
    else:
        accuracy = keras.metrics.CategoricalAccuracy(name="accuracy")
    return [accuracy, ExampleCount(), LossMean(loss)]
