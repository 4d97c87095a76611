"""Metrics for evaluation batches padded with weight-0 rows.

The pipelines' `pad_to_batch=True` pads the last evaluation batch to a
static shape (one compiled function, batches that split over replicas) and
yields weights, 1 for real rows. Keras' loss tracker averages batch losses
weighted by the padded batch size, so padding shrinks the `loss` that
`evaluate` reports; these metrics count the real examples only.
"""

import keras


class ExampleCount(keras.metrics.Metric):
    """The number of examples evaluated: the weights summed (every row
    counts 1 without weights)."""

    def __init__(self, name="examples", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        ops = keras.ops
        count = ops.shape(y_true)[0] if sample_weight is None else ops.sum(ops.cast(sample_weight, "float32"))
        self.total.assign_add(ops.cast(count, "float32"))

    def result(self):
        return keras.ops.cast(self.total, "float32")

    def reset_state(self):
        self.total.assign(0.0)


def padded_batch_metrics(loss):
    """The `weighted_metrics` of a classifier evaluated on padded batches:
    accuracy, the example count (`examples`), and `loss` (a Keras loss,
    e.g. `SoftmaxCrossEntropy()`) as a metric named `loss`, averaged over the
    real examples. Keras reports compiled metrics after its own loss
    tracker, so this is the `loss` of the logs; training batches carry no
    weights, so there it is the tracker's number.

        model.compile(optimizer, loss=loss, weighted_metrics=padded_batch_metrics(loss))
    """
    # Class-index labels (`sparse=True`) need the sparse accuracy: the one-hot
    # one compared an index with a row's argmax and gave nonsense.
    sparse = getattr(loss, "sparse", False)
    accuracy = (keras.metrics.SparseCategoricalAccuracy if sparse else keras.metrics.CategoricalAccuracy)
    return [accuracy(name="accuracy"), ExampleCount(),
            keras.metrics.MeanMetricWrapper(lambda y_true, y_pred: loss.call(y_true, y_pred), name="loss")]
