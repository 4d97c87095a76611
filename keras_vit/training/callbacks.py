"""Fault-tolerant training: resume a killed `fit` at the step it reached."""

import json
import math
import os

import keras

_POINTER = "checkpoint.json"


class BackupAndResume(keras.callbacks.Callback):
    """Checkpoints the training state and resumes a restarted run mid-epoch.

    Every `save_freq` batches (and at the end of training) the weights, the
    optimizer state (its step counter included) and the position in the run
    (epoch, batch within the epoch) are written to `backup_dir`. When the
    same `fit` command starts again, e.g. after the job was preempted or
    killed, the state is loaded and training continues from the batch after
    the checkpoint: the already-trained batches of the interrupted epoch are
    read from the data and skipped without an update, so the run ends with
    the same number of optimizer steps (and, for data that is the same each
    epoch, the same batches) as an uninterrupted one.

    `keras.callbacks.BackupAndRestore` differs: it restarts the interrupted
    epoch from its first batch (extra steps), deletes its backup when `fit`
    ends, and may save a state whose loss is already NaN.

    Writes are atomic: a new weights file is written under a temporary name
    and renamed, then the small `checkpoint.json` pointer is replaced, then
    the previous file is deleted; a kill at any moment leaves a loadable
    checkpoint. When the loss becomes NaN or infinite, training stops with a
    `FloatingPointError` that names the step, and the last good checkpoint
    is kept (nothing is saved after a non-finite loss).

    Only local (or mounted) paths; one process writes (multi-host JAX runs
    are not supported).

    Args:
        backup_dir: directory for the checkpoint; not shared with anything
            else.
        save_freq: int (every this many batches) or `"epoch"`.
        stop_on_nan: bool. Stop on a non-finite loss. Defaults to True.
        delete_on_finish: bool. Delete the checkpoint when `fit` completes.
            Defaults to False: running the finished command again then does
            no more steps (and restores the final weights).
    """

    def __init__(
        self, backup_dir, save_freq="epoch", stop_on_nan=True, delete_on_finish=False
    ):
        super().__init__()
        if not backup_dir:
            raise ValueError(f"`backup_dir` must be a path. Received: backup_dir={backup_dir!r}")
        if save_freq != "epoch" and (
            not isinstance(save_freq, int) or isinstance(save_freq, bool) or save_freq <= 0
        ):
            raise ValueError(
                "`save_freq` must be 'epoch' or a positive int (batches). "
                f"Received: save_freq={save_freq!r}"
            )
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.stop_on_nan = bool(stop_on_nan)
        self.delete_on_finish = bool(delete_on_finish)
        self._reset_run_state()

    def _reset_run_state(self):
        self._epoch = 0
        self._batches_in_epoch = 0
        self._since_save = 0
        self._skip_until = 0  # batches of the resumed epoch to skip
        self._resume_epoch = None
        self._original_train_function = None
        self._last_saved = None
        self._failed = False
        self.resumed_from = None  # metadata of the checkpoint loaded, if any

    # --- Checkpoint files -------------------------------------------------

    @property
    def _pointer_path(self):
        return os.path.join(self.backup_dir, _POINTER)

    def read_checkpoint(self):
        """The metadata of the latest checkpoint in `backup_dir`, or None."""
        if not os.path.exists(self._pointer_path):
            return None
        with open(self._pointer_path) as f:
            return json.load(f)

    def _save(self):
        model = self.model  # on JAX this syncs the training state first
        step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        os.makedirs(self.backup_dir, exist_ok=True)
        weights = f"step-{step:012d}.weights.h5"
        path = os.path.join(self.backup_dir, weights)
        temporary = os.path.join(self.backup_dir, f".tmp-{weights}")
        model.save_weights(temporary, overwrite=True)
        os.replace(temporary, path)
        metadata = {
            "weights": weights,
            "step": step,
            "epoch": self._epoch,
            "batch": self._batches_in_epoch,
            "steps_per_epoch": self.params.get("steps"),
        }
        temporary = os.path.join(self.backup_dir, f".tmp-{_POINTER}")
        with open(temporary, "w") as f:
            json.dump(metadata, f)
        os.replace(temporary, self._pointer_path)
        for name in os.listdir(self.backup_dir):
            if name.endswith(".weights.h5") and name != weights:
                os.remove(os.path.join(self.backup_dir, name))
        self._since_save = 0
        self._last_saved = metadata

    # --- Restore and skip -------------------------------------------------

    def on_train_begin(self, logs=None):
        self._reset_run_state()
        metadata = self.read_checkpoint()
        if metadata is None:
            return
        model = self.model
        saved_steps = metadata.get("steps_per_epoch")
        steps = self.params.get("steps")
        if saved_steps is not None and steps is not None and saved_steps != steps:
            raise ValueError(
                f"The checkpoint in {self.backup_dir} was written by a run with "
                f"{saved_steps} steps per epoch, but this `fit` has {steps}: "
                "resume with the same command, or use another `backup_dir`. "
                f"Received: steps_per_epoch={steps}"
            )
        if not model.built:
            raise ValueError(
                "The model must be built before `fit` to restore a checkpoint "
                f"(call it on a batch first). Received: model {model.name!r} unbuilt"
            )
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(os.path.join(self.backup_dir, metadata["weights"]))
        self.resumed_from = metadata
        epoch, batch = metadata["epoch"], metadata["batch"]
        if steps is not None and batch >= steps:
            epoch, batch = epoch + 1, 0
        model._initial_epoch = epoch  # as keras.callbacks.BackupAndRestore
        if batch:
            self._resume_epoch, self._skip_until = epoch, batch
            self._wrap_train_function(model)

    def _wrap_train_function(self, model):
        """Makes the first `batch` calls of the resumed epoch consume their
        data without training (the model's train function is restored as
        soon as they are done)."""
        original = model.train_function
        self._original_train_function = original
        backend = keras.backend.backend()
        per_call = getattr(model, "steps_per_execution", 1) or 1

        def skip(*args):
            if not self._skipping():
                return original(*args)
            if backend == "torch":  # the batch was already drawn
                return {}
            iterator = args[-1]
            for _ in range(per_call):
                next(iterator)
            if backend == "jax":
                return {}, args[0]
            return {}

        model.train_function = skip

    def _skipping(self):
        return self._epoch == self._resume_epoch and self._batches_in_epoch < self._skip_until

    def _unwrap(self):
        if self._original_train_function is not None:
            self._model.train_function = self._original_train_function
            self._original_train_function = None

    # --- Progress ---------------------------------------------------------

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._batches_in_epoch = 0

    def on_train_batch_begin(self, batch, logs=None):
        if self._original_train_function is not None and not self._skipping():
            self._unwrap()

    def on_train_batch_end(self, batch, logs=None):
        # With steps_per_execution > 1 each call covers several batches.
        skipped = self._skipping()
        done = batch + 1
        new = done - self._batches_in_epoch if done > self._batches_in_epoch else done
        self._batches_in_epoch = done
        if skipped:
            return
        if self.stop_on_nan and logs and logs.get("loss") is not None:
            loss = float(keras.ops.convert_to_numpy(logs["loss"]))
            if not math.isfinite(loss):
                self._failed = True
                saved = self._last_saved or self.read_checkpoint()
                where = (
                    f"the last good checkpoint (step {saved['step']}) is kept in "
                    f"{self.backup_dir}"
                    if saved
                    else "no checkpoint had been saved yet"
                )
                raise FloatingPointError(
                    f"Training stopped: the loss became {loss} at epoch "
                    f"{self._epoch}, batch {batch}; {where}. Lower the learning "
                    "rate, check the data or clip gradients, then run the same "
                    "command again to resume from it."
                )
        self._since_save += new
        if isinstance(self.save_freq, int) and self._since_save >= self.save_freq:
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._save()

    def on_train_end(self, logs=None):
        self._unwrap()
        model = self.model
        model._initial_epoch = None
        if self._failed:
            return
        if self.delete_on_finish:
            if os.path.isdir(self.backup_dir):
                for name in os.listdir(self.backup_dir):
                    os.remove(os.path.join(self.backup_dir, name))
                os.rmdir(self.backup_dir)
        elif self._since_save:
            self._save()

    def get_config(self):
        return {
            "backup_dir": self.backup_dir,
            "save_freq": self.save_freq,
            "stop_on_nan": self.stop_on_nan,
            "delete_on_finish": self.delete_on_finish,
        }
