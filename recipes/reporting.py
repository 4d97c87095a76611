"""What the trainer attaches to `fit`: progress in updates, TensorBoard
when it is installed, the throughput timer.

Imports Keras at the top: `recipes.train` imports this module inside its
functions, after the flags are parsed, so that `--help` stays fast.
"""

import importlib.util
import time

import keras

# Metrics kept in the logs but not shown.
HIDDEN_METRICS = ("examples",)
_WARNED = []


def tensorboard(log_dir):
    """`[keras.callbacks.TensorBoard]`, or `[]` (said once) without the
    `tensorboard` package: history.csv has the same numbers."""
    if importlib.util.find_spec("tensorboard") is not None:
        return [keras.callbacks.TensorBoard(log_dir, write_graph=False)]
    if not _WARNED:
        _WARNED.append(True)
        print("Note: `tensorboard` is not installed, so no TensorBoard logs are written (history.csv has the "
              "same numbers). `pip install tensorboard` to get them.")
    return []


class Progress(keras.callbacks.Callback):
    """Training in updates (not micro-batches) and the evaluation under
    `eval_label`, in place of Keras' progress bars. `verbose`: 1 a bar per
    `log_every` updates, 2 one line each, 0 nothing."""

    def __init__(self, total_steps, log_every, accum, verbose, eval_label):
        super().__init__()
        self.total_steps, self.log_every, self.accum, self.verbose = total_steps, log_every, accum, verbose
        self.eval_label = eval_label
        self.bar = None

    def _shown(self, logs):
        return [(k, float(v)) for k, v in (logs or {}).items() if k.removeprefix("val_") not in HIDDEN_METRICS]

    def _update(self, bar, step, logs, finalize=None):
        shown = self._shown(logs)
        bar.stateful_metrics = {name for name, _ in shown}  # Keras' logs are running means already
        bar.update(step, values=shown, finalize=finalize)

    def _line(self, prefix, logs):
        print(prefix + ", ".join(f"{k} {v:.4f}" for k, v in self._shown(logs)), flush=True)

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
            self._line(f"update {(epoch + 1) * self.log_every}/{self.total_steps}: ", logs)

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
            self._line(f"evaluation on {self.eval_label}: ", logs)


class ThroughputTimer(keras.callbacks.Callback):
    """Times the training batches after the first `skip` (compilation,
    warm-up)."""

    def __init__(self, skip=2):
        super().__init__()
        self.skip, self.batches, self.start, self.timed_batches, self.elapsed = skip, 0, None, 0, 0.0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        now = time.perf_counter()
        if self.batches == self.skip:
            self.start = now
        elif self.start is not None:
            self.timed_batches, self.elapsed = self.batches - self.skip, now - self.start

    def images_per_second(self, batch_size):
        return self.timed_batches * batch_size / self.elapsed if self.elapsed > 0 else None
