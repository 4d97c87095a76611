"""`fit`'s progress and throughput counted in optimizer updates.

With gradient accumulation (`gradient_accumulation_steps=k`, as the
original's batch of 512 is 8 x 64), Keras counts micro-batches: its progress
bar, `steps_per_epoch` and the batch callbacks advance k times per update.
`UpdateProgress` shows updates instead, and `ThroughputTimer` measures
images per second after the compilation.
"""

import time

import keras

from keras_vit.layers.utils import positive_int


class UpdateProgress(keras.callbacks.Callback):
    """Training progress in optimizer updates, in place of `fit(verbose=1)`.

    Use with `fit(..., verbose=0)`. Each Keras epoch of `updates_per_epoch`
    updates (`steps_per_epoch = updates_per_epoch * accumulation_steps`
    micro-batches) is one bar (`verbose=1`) or one line (`verbose=2`);
    `fit(initial_epoch=...)` (a resumed run) counts from there. Evaluation
    (`evaluate`, or `fit`'s validation) is shown as well, under
    `eval_label`.

    Args:
        total_updates: int, the run's optimizer updates.
        updates_per_epoch: int, optimizer updates per Keras epoch.
        accumulation_steps: int, micro-batches per update (1: none).
        verbose: 1 (a progress bar per epoch), 2 (one line per epoch) or 0
            (nothing).
        eval_label: str, what is evaluated (a split's name), for the
            evaluation's line.
        hidden_metrics: metric names left out of the display (their
            `val_` twins too); by default the example count of
            `keras_vit.training.padded_batch_metrics`.
    """

    def __init__(self, total_updates, updates_per_epoch, accumulation_steps=1, verbose=1, eval_label="evaluation",
                 hidden_metrics=("examples",)):
        super().__init__()
        for name, value in (("total_updates", total_updates), ("updates_per_epoch", updates_per_epoch),
                            ("accumulation_steps", accumulation_steps)):
            positive_int(value, name)
        if verbose not in (0, 1, 2) or isinstance(verbose, bool):
            raise ValueError(f"`verbose` must be 0, 1 or 2. Received: verbose={verbose!r}")
        self.total_updates, self.updates_per_epoch = total_updates, updates_per_epoch
        self.accumulation_steps, self.verbose = accumulation_steps, verbose
        self.eval_label, self.hidden_metrics = eval_label, tuple(hidden_metrics)
        self._bar = self._eval_bar = None
        self._eval_batches = self._updates_shown = 0

    def _shown(self, logs):
        return [(k, float(v)) for k, v in (logs or {}).items() if k.removeprefix("val_") not in self.hidden_metrics]

    def _update(self, bar, step, logs, finalize=None):
        shown = self._shown(logs)
        bar.stateful_metrics = {name for name, _ in shown}  # Keras' logs are running means already
        bar.update(step, values=shown, finalize=finalize)

    def _line(self, prefix, logs):
        print(prefix + ", ".join(f"{k} {v:.4f}" for k, v in self._shown(logs)), flush=True)

    def on_epoch_begin(self, epoch, logs=None):
        self._updates_shown = 0
        if self.verbose == 1:
            first = epoch * self.updates_per_epoch
            print(f"Updates {first + 1}-{first + self.updates_per_epoch} of {self.total_updates}", flush=True)
            self._bar = keras.utils.Progbar(self.updates_per_epoch, unit_name="update")

    def on_train_batch_end(self, batch, logs=None):
        updates = _batches_done(self, batch) // self.accumulation_steps
        if self._bar is not None and updates != self._updates_shown:
            self._updates_shown = updates
            self._update(self._bar, updates, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._bar = None
        if self.verbose == 2:
            self._line(f"update {(epoch + 1) * self.updates_per_epoch}/{self.total_updates}: ", logs)

    def on_test_begin(self, logs=None):
        self._eval_batches = 0
        if self.verbose == 1:
            print(f"Evaluating on {self.eval_label}", flush=True)
            self._eval_bar = keras.utils.Progbar(None, unit_name="batch")

    def on_test_batch_end(self, batch, logs=None):
        self._eval_batches = batch + 1
        if self.verbose == 1:
            self._update(self._eval_bar, self._eval_batches, logs)

    def on_test_end(self, logs=None):
        if self.verbose == 1:
            self._update(self._eval_bar, self._eval_batches, logs, finalize=True)
        elif self.verbose == 2:
            self._line(f"evaluation on {self.eval_label}: ", logs)


def _batches_done(callback, batch):
    """The epoch's batches done at the end of batch `batch`. Counted by
    `batch`, the index of the call's last batch: with steps_per_execution > 1
    one call covers several. Keras reports a whole execution for the last,
    partial one (batch 7 of an epoch of 6 at 4 per call): capped at the
    epoch's steps."""
    steps = callback.params.get("steps") if callback.params else None
    return min(batch + 1, steps) if steps else batch + 1


class ThroughputTimer(keras.callbacks.Callback):
    """Times `fit`'s training batches after the first `skip` (compilation
    and warm-up), across epochs: the time from each epoch's start to its
    last training batch, so validation and what runs at epoch ends
    (checkpoints) do not count.

    Args:
        skip: int, batches (micro-batches under accumulation) left untimed
            at the start. Defaults to 2.

    `images_per_second(batch_size)` is then the rate over the timed batches
    (None before a batch after `skip` has ended). Each `fit` is timed
    afresh: a timer passed to the next `fit` too (a notebook cell run
    again) counted that fit's compilation, 10-60x too slow.
    """

    def __init__(self, skip=2):
        super().__init__()
        positive_int(skip, "skip")
        self.skip = skip
        self.on_train_begin()

    def on_train_begin(self, logs=None):
        self.batches, self.timed_batches, self.elapsed = 0, 0, 0.0
        self._in_epoch, self._last = 0, None

    def on_epoch_begin(self, epoch, logs=None):
        self._in_epoch, self._last = 0, time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        done = _batches_done(self, batch)
        new, self._in_epoch = done - self._in_epoch, done
        if self.batches >= self.skip:
            self.timed_batches += new
            self.elapsed += now - self._last
        self.batches += new
        self._last = now

    def images_per_second(self, batch_size):
        """Images per second over the timed batches, `batch_size` images
        each (the micro-batch under accumulation)."""
        return self.timed_batches * batch_size / self.elapsed if self.elapsed > 0 else None
