"""The Keras metrics and callbacks the recipes attach to `fit`: examples
counted, the loss over real examples, progress in updates, the resumed
message and the throughput timer.

Imports Keras at the top: `recipes.run` imports this module inside its
functions, after the flags are parsed, so that `--help` stays fast.
"""

import time

import keras

# Metrics kept in the logs but not shown.
HIDDEN_METRICS = ("examples",)


def weighted_loss_metric(loss):
    """The loss as a weighted metric named `loss`.

    Evaluation batches are padded with weight-0 rows (`pad_to_batch`); Keras'
    own loss tracker averages batch losses weighted by the padded batch
    size, so padding would shrink `val_loss`. This metric averages the
    per-example loss over the real examples; Keras reports compiled metrics
    after its loss tracker, so it is the `loss` of the logs (pinned by
    tests/recipes/test_recipes.py). Training batches are unweighted: the same
    number as the tracker's.
    """
    return keras.metrics.MeanMetricWrapper(lambda y_true, y_pred: loss.call(y_true, y_pred), name="loss")


class ExampleCount(keras.metrics.Metric):
    """Counts the evaluated examples (weights summed)."""

    def __init__(self, name="examples", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        ops = keras.ops
        if sample_weight is None:
            count = ops.cast(ops.shape(y_true)[0], "float32")
        else:
            count = ops.sum(ops.cast(sample_weight, "float32"))
        self.total.assign_add(count)

    def result(self):
        return keras.ops.cast(self.total, "float32")

    def reset_state(self):
        self.total.assign(0.0)


class Progress(keras.callbacks.Callback):
    """Shows training in updates (not micro-batches) and the evaluation
    under `eval_label`; replaces Keras' own progress bars. `verbose`: 1 a
    bar per `log_every` updates, 2 one line each, 0 nothing."""

    def __init__(self, total_steps, log_every, accum, verbose):
        super().__init__()
        self.total_steps, self.log_every, self.accum, self.verbose = total_steps, log_every, accum, verbose
        self.bar = None
        self.eval_label = "evaluation"

    def _shown(self, logs):
        return [(k, float(v)) for k, v in (logs or {}).items() if k.removeprefix("val_") not in HIDDEN_METRICS]

    def _update(self, bar, step, logs, finalize=None):
        shown = self._shown(logs)
        # Keras' logs are running means already: show them as they are.
        bar.stateful_metrics = set(name for name, _ in shown)
        bar.update(step, values=shown, finalize=finalize)

    def on_epoch_begin(self, epoch, logs=None):
        if self.verbose == 1:
            first = epoch * self.log_every
            print(f"Updates {first + 1}-{first + self.log_every} of {self.total_steps}", flush=True)
            self.bar = keras.utils.Progbar(self.log_every, unit_name="update")

    def on_train_batch_end(self, batch, logs=None):
        if self.bar is not None and (batch + 1) % self.accum == 0:
            self._update(self.bar, (batch + 1) // self.accum, logs)

    def on_epoch_end(self, epoch, logs=None):
        self.bar = None
        if self.verbose == 2:
            text = ", ".join(f"{k} {v:.4f}" for k, v in self._shown(logs))
            print(f"update {(epoch + 1) * self.log_every}/{self.total_steps}: {text}", flush=True)

    def on_test_begin(self, logs=None):
        self.test_batches = 0
        if self.verbose == 1:
            print(f"Evaluating on {self.eval_label}", flush=True)
            self.test_bar = keras.utils.Progbar(None, unit_name="batch")

    def on_test_batch_end(self, batch, logs=None):
        self.test_batches = batch + 1
        if self.verbose == 1:
            self._update(self.test_bar, self.test_batches, logs)

    def on_test_end(self, logs=None):
        if self.verbose == 1:
            self._update(self.test_bar, self.test_batches, logs, finalize=True)
        elif self.verbose == 2:
            text = ", ".join(f"{k} {v:.4f}" for k, v in self._shown(logs))
            print(f"evaluation on {self.eval_label}: {text}", flush=True)


class ResumedMessage(keras.callbacks.Callback):
    """Prints `Resumed from update N of M` once `backup` (a
    `keras_vit.training.BackupAndResume` before it in the list) has loaded."""

    def __init__(self, backup, total_steps):
        super().__init__()
        self.backup, self.total_steps = backup, total_steps

    def on_train_begin(self, logs=None):
        if self.backup.resumed_from:
            print(f"Resumed from update {self.backup.resumed_from['step']} of {self.total_steps}", flush=True)


class ThroughputTimer(keras.callbacks.Callback):
    """Times the training batches after the first `skip` (compilation,
    warm-up), for the throughput in the summary."""

    def __init__(self, skip=2):
        super().__init__()
        self.skip = skip
        self.batches = 0
        self.start = None
        self.timed_batches = 0
        self.elapsed = 0.0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        now = time.perf_counter()
        if self.batches == self.skip:
            self.start = now
        elif self.start is not None:
            self.timed_batches = self.batches - self.skip
            self.elapsed = now - self.start
