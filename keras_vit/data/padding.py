"""Evaluation batches of one static size, padded with weight-0 rows.

The pipelines apply it with `pad_to_batch=True`; `pad_batches` pads any
dataset of `(images, labels)` batches.
"""

import tensorflow as tf

from keras_vit.data import _checks


def pad_batches(dataset, batch_size):
    """`(images, labels)` batches -> `(images, labels, weights)` batches of
    exactly `batch_size` rows: the last batch is padded with weight-0 rows.

    One static shape for every evaluation step (one compiled function, XLA
    and TPU friendly) and batches that split evenly over replicas. Weighted
    metrics (and a weighted loss metric) then count the real examples only.

    Args:
        dataset: a `tf.data.Dataset` of `(images, labels)` batches of at most
            `batch_size` rows, e.g. an evaluation pipeline of
            `keras_vit.data`.
        batch_size: int, the size of every output batch.

    Returns:
        A `tf.data.Dataset` of `(images, labels, weights)`; `weights` is
        float32 `(batch_size,)`, 1 for real rows and 0 for padding.
    """
    batch_size = _checks.integer(batch_size, "batch_size")
    known = dataset.element_spec[0].shape[0]
    if known is not None and known > batch_size:
        _checks.fail("batch_size", batch_size, f"at least the dataset's batches ({known} rows)")

    def pad(images, labels):
        n = tf.shape(images)[0]
        # Before the pads: their own error ("Paddings must be non-negative")
        # came first in some runs (ops without a dependency run in any order).
        check = tf.debugging.assert_less_equal(n, batch_size,
                                               message=f"`batch_size`={batch_size} is smaller than a batch")
        with tf.control_dependencies([check]):
            missing = batch_size - n
        images = tf.pad(images, [[0, missing]] + [[0, 0]] * (len(images.shape) - 1))
        labels = tf.pad(labels, [[0, missing]] + [[0, 0]] * (len(labels.shape) - 1))
        weights = tf.concat([tf.ones([n]), tf.zeros([missing])], 0)
        images.set_shape([batch_size] + images.shape[1:].as_list())
        labels.set_shape([batch_size] + labels.shape[1:].as_list())
        weights.set_shape([batch_size])
        return images, labels, weights

    return dataset.map(tf.autograph.experimental.do_not_convert(pad))
