"""Fault-tolerant training: resume a killed `fit` at the step it reached."""

import errno
import json
import math
import os
import re
import shutil
import tempfile
import warnings
import weakref

import keras
import numpy as np

from keras_vit import distribute
from keras_vit import locks
from keras_vit.layers.utils import SEED_STATE, check_bool, is_int

_POINTER = "checkpoint.json"
_LOCK = "backup.lock"
_FORMAT = 2
# The only names the callback writes (and so the only ones it deletes).
# `step-<update>[-<epoch>-<batch>].weights.h5`: the suffix when a save falls
# in the update of the previous one (see `_save`).
_WEIGHTS_NAME = re.compile(r"step-\d{12}(-\d+-\d+)?\.weights\.h5\Z")
# LoRA layers' own variables, beside the weights file: Keras writes an
# adapted layer's kernel merged with its adapters and leaves the adapters
# out, so resuming from the weights file alone would lose them.
_LORA_NAME = re.compile(r"step-\d{12}(-\d+-\d+)?\.lora\.npz\Z")
_FIELDS = {
    "format": int, "weights": str, "step": int, "epoch": int, "batch": int,
    "steps_per_epoch": (int, type(None)), "epochs": (int, type(None)),
    "variables": list, "model_config": (dict, type(None)),
    "optimizer": (dict, type(None)), "seed_states": list,
    "global_seed_state": (list, type(None)), "torch_rng_states": (list, type(None)),
}
# Fields a checkpoint of an older keras_vit may lack, added without a format
# change: `backend` (the Keras backend that wrote it), `steps_per_execution`
# (batches per compiled call; older ones counted such calls' batches short
# on Keras 3.10, see `on_train_batch_end`), `keras_version` (Keras
# versions write model and optimizer configs differently), `stopped` (a
# callback such as `EarlyStopping` ended the run: it is finished).
_OPTIONAL_FIELDS = {"backend": str, "lora": str, "steps_per_execution": int, "keras_version": str,
                    "stopped": bool}


# Optimizer -> its signature when a `BackupAndResume` first saw it.
_FIRST_SEEN_OPTIMIZERS = weakref.WeakKeyDictionary()


class CheckpointWriteError(OSError):
    """`BackupAndResume` could not write a checkpoint (e.g. the disk is
    full); the last good one is kept, and the message names it."""


class BackupAndResume(keras.callbacks.Callback):
    """Checkpoints the training state and resumes a restarted run mid-epoch.

    Every `save_freq` batches (and at the end of training) the weights, the
    optimizer state (its step counter included), the random state (every
    `keras.random.SeedGenerator` of the model, e.g. dropout and drop-path,
    and Keras' global one) and the position in the run (epoch, batch within
    the epoch) are written to `backup_dir`. When the same `fit` command
    starts again, e.g. after the job was preempted or killed, the state is
    loaded and training continues from the batch after the checkpoint: the
    already-trained batches of the interrupted epoch are read from the data
    and skipped without an update, so the run ends with the same optimizer
    steps, random draws and (for data that is the same each epoch) batches
    as an uninterrupted one.

    The checkpoint records what it belongs to (the model's config and
    variable shapes, the optimizer's class and config, steps per epoch and
    epochs, the Keras backend); a run that differs is refused with an error
    naming the difference (another backend: its random state would not carry
    over), and a `checkpoint.json` that is not one this callback wrote, or
    whose random states do not fit this model and process, is refused before
    anything is loaded. One run at a time may use
    `backup_dir`: a lock file (an OS lock, released when the process ends,
    even by SIGKILL) refuses a second one.

    Where checkpoints land on epoch ends, `restore(model, ...)` before
    `fit` loads the state and returns the epoch to pass as
    `fit(initial_epoch=...)`: the resume then uses public Keras alone.

    `keras.callbacks.BackupAndRestore` differs: it restarts the interrupted
    epoch from its first batch (extra steps), deletes its backup when `fit`
    ends, and may save a state whose loss is already NaN.

    Writes are atomic: a new weights file is written under a temporary name
    and renamed, then the small `checkpoint.json` pointer is replaced, then
    the previous file is deleted; a kill at any moment leaves a loadable
    checkpoint. When the loss becomes NaN or infinite, training stops with a
    `FloatingPointError` that names the step, and the last good checkpoint
    is kept (nothing is saved after a non-finite loss).

    Local or mounted paths. In a multi-process JAX run only process 0
    writes (the state is replicated); every process reads the checkpoint
    and resumes at the same step.

    Args:
        backup_dir: directory for the checkpoint. Other files in it are left
            alone.
        save_freq: int (every this many batches) or `"epoch"`.
        stop_on_nan: bool. Stop on a non-finite loss. Defaults to True.
        delete_on_finish: bool. Delete the checkpoint (only the files this
            callback wrote) when `fit` completes. Defaults to False: running
            the finished command again then does no more steps (and restores
            the final weights).
    """

    def __init__(
        self, backup_dir, save_freq="epoch", stop_on_nan=True, delete_on_finish=False
    ):
        super().__init__()
        if not backup_dir:
            raise ValueError(f"`backup_dir` must be a path. Received: backup_dir={backup_dir!r}")
        if save_freq != "epoch" and (
            not is_int(save_freq) or save_freq <= 0
        ):
            raise ValueError(
                "`save_freq` must be 'epoch' or a positive int (batches). "
                f"Received: save_freq={save_freq!r}"
            )
        self.backup_dir = os.path.expanduser(os.fspath(backup_dir))  # as every keras_vit path
        if os.path.exists(self.backup_dir) and not os.path.isdir(self.backup_dir):
            raise ValueError(f"`backup_dir` is a file, not a folder. Received: backup_dir={backup_dir!r}")
        self.save_freq = save_freq if save_freq == "epoch" else int(save_freq)
        self.stop_on_nan = check_bool(stop_on_nan, "stop_on_nan")
        self.delete_on_finish = check_bool(delete_on_finish, "delete_on_finish")
        self._batches_per_call = 1  # set by each `fit` (`on_train_begin`)
        self._reset_run_state()

    def _reset_run_state(self):
        self._epoch = 0
        self._batches_in_epoch = 0
        self._call_begins_at = 0
        self._since_save = 0
        self._skip_until = 0  # batches of the resumed epoch to skip
        self._resume_epoch = None
        self._original_train_function = None
        self._last_saved = None
        self._failed = False
        # A save due at the end of an epoch waits for the next batch: the
        # epoch change draws from PyTorch's generator (its DataLoader), and
        # the state saved must be the one the next step starts from.
        self._save_pending = False
        self._torch_rng_pending = None  # restored when the first real step starts
        self._stopped = False  # a callback stopped `fit` (`model.stop_training`)
        self.resumed_from = None  # metadata of the checkpoint loaded, if any
        self._restored_before_fit = False  # `restore` ran: `fit` starts at its epoch
        self._initial_epoch_set = False

    # --- Checkpoint files -------------------------------------------------

    @property
    def _pointer_path(self):
        return os.path.join(self.backup_dir, _POINTER)

    def read_checkpoint(self):
        """The metadata of the latest checkpoint in `backup_dir`, or None.

        Raises `ValueError` (one line, naming the file and the field) when
        `checkpoint.json` is not a checkpoint this callback wrote."""
        path = self._pointer_path
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"Cannot read the checkpoint {path}: {error}") from None
        try:
            metadata = json.loads(text)
        except ValueError as error:
            raise ValueError(f"The checkpoint {path} is not valid JSON ({error}).") from None
        _validate(metadata, path)
        weights = os.path.join(self.backup_dir, metadata["weights"])
        if not os.path.isfile(weights):
            raise ValueError(
                f"The checkpoint {path} names the weights file {metadata['weights']!r}, "
                "which is missing."
            )
        return metadata

    def _is_writer(self):
        # Only process 0 writes in a multi-process run: the training state
        # is replicated, and one writer keeps the files consistent.
        return distribute.process_index() == 0

    def _save(self):
        model = self.model  # on JAX this syncs the training state first
        step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        self._since_save = 0
        self._save_pending = False
        if not self._is_writer():
            # `save_weights` runs cross-process collectives on multi-process
            # JAX (Keras creates variables while saving), so every process
            # calls it; only process 0 keeps the file.
            with tempfile.TemporaryDirectory() as scratch:
                model.save_weights(os.path.join(scratch, "discarded.weights.h5"))
            if any(distribute.all_processes(False)):
                raise CheckpointWriteError(
                    f"Process 0 could not write the checkpoint of step {step} in {self.backup_dir} (its error says "
                    f"why); this process stops with it. Received: backup_dir={self.backup_dir!r}")
            self._last_saved = {"step": step}
            return
        weights = f"step-{step:012d}.weights.h5"
        if weights == (self._last_saved or {}).get("weights"):
            # Saves closer than the accumulated micro-batches of an update
            # share its step: never written over the file the pointer names
            # (a kill between the two renames paired it with the pointer of
            # another batch).
            weights = f"step-{step:012d}-{self._epoch}-{self._batches_in_epoch}.weights.h5"
        try:
            metadata = self._write(model, step, weights)
        except (OSError, RuntimeError) as error:  # h5py reports a full disk as either
            distribute.all_processes(True)
            for name in (f".tmp-{weights}", f".tmp-{_POINTER}", f".tmp-{_lora_file(weights)}"):
                _remove(os.path.join(self.backup_dir, name))
            kept = (self._last_saved or {}).get("weights")
            if kept != weights:  # written, but the pointer still names the old one
                _remove(os.path.join(self.backup_dir, weights))
                _remove(os.path.join(self.backup_dir, _lora_file(weights)))
            full = getattr(error, "errno", None) == errno.ENOSPC or "No space left" in str(error)
            reason = "the disk is full" if full else f"{type(error).__name__}: {str(error).splitlines()[0]}"
            if isinstance(error, _DiskFull):
                reason += f" ({error.strerror}; nothing was written)"
            # Not every RuntimeError is the disk's (e.g. a weight no process holds whole).
            fix = "free space" if full or isinstance(error, OSError) else "fix that"
            raise CheckpointWriteError(
                f"Writing the checkpoint of step {step} in {self.backup_dir} failed: {reason}. "
                f"The last good checkpoint is kept ({kept or 'none was written yet'}); {fix} and "
                f"run the same command again to resume from it. Received: backup_dir={self.backup_dir!r}"
            ) from None
        distribute.all_processes(False)
        for name in os.listdir(self.backup_dir):  # older ones, and orphans of a kill
            if (_WEIGHTS_NAME.match(name) or _LORA_NAME.match(name)) and name not in (weights, _lora_file(weights)):
                _remove(os.path.join(self.backup_dir, name))
        self._last_saved = metadata

    def _write(self, model, step, weights):
        """Writes the weights file, then replaces the pointer; returns the
        pointer's metadata."""
        os.makedirs(self.backup_dir, exist_ok=True)
        _check_free_space(model, self.backup_dir)
        path = os.path.join(self.backup_dir, weights)
        temporary = os.path.join(self.backup_dir, f".tmp-{weights}")
        model.save_weights(temporary, overwrite=True)
        os.replace(temporary, path)
        lora = _lora_variables(model)
        if lora:
            temporary = os.path.join(self.backup_dir, f".tmp-{_lora_file(weights)}")
            with open(temporary, "wb") as f:
                np.savez(f, **{v.path: keras.ops.convert_to_numpy(v) for v in lora})
            os.replace(temporary, os.path.join(self.backup_dir, _lora_file(weights)))
        metadata = {
            "format": _FORMAT,
            "weights": weights,
            "step": step,
            "epoch": self._epoch,
            "batch": self._batches_in_epoch,
            "steps_per_epoch": self.params.get("steps"),
            "epochs": self.params.get("epochs"),
            **_run_signature(model),
            "seed_states": [_state(v) for v in _seed_states(model)],
            "global_seed_state": _global_seed_state(),
            "torch_rng_states": distribute.backend_rng_state(),
            "backend": keras.backend.backend(),
            "keras_version": keras.__version__,
            "steps_per_execution": _per_call(model),
            **({"lora": _lora_file(weights)} if lora else {}),
            **({"stopped": True} if self._stopped else {}),
        }
        temporary = os.path.join(self.backup_dir, f".tmp-{_POINTER}")
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(metadata, f)
        os.replace(temporary, self._pointer_path)
        return metadata

    # --- Restore and skip -------------------------------------------------

    def restore(self, model, *, epochs=None, steps_per_epoch=None):
        """Loads the latest checkpoint into `model` before `fit`, and
        returns the epoch to start at: `fit(..., initial_epoch=...,
        callbacks=[this callback, ...])` then resumes through public Keras
        alone. For runs whose checkpoints land on epoch ends (`save_freq`
        a multiple of `steps_per_epoch`, or `"epoch"`); 0 without a
        checkpoint.

        Args:
            model: the compiled model of the run (built).
            epochs, steps_per_epoch: the `fit` arguments of the run, checked
                against the checkpoint's.

        Raises:
            ValueError: the checkpoint belongs to another run, or was
                written mid-epoch (pass the callback to `fit` without calling
                this: it then skips the batches already trained), or
                `model` is not compiled.
        """
        if getattr(model, "optimizer", None) is None:  # its state is restored too
            raise ValueError("`restore` needs the compiled model of the run: call model.compile(...) first. "
                             f"Received: model={getattr(model, 'name', model)!r}, not compiled")
        self.set_model(model)
        self.set_params({"epochs": epochs, "steps": steps_per_epoch})
        self._reset_run_state()
        epoch, batch = self._acquire_and_restore(set_initial_epoch=False)
        if batch:
            self._release()
            raise ValueError(
                f"The checkpoint in {self.backup_dir} was written mid-epoch (batch {batch} of epoch {epoch}): "
                "`restore` resumes at epoch ends only. Pass the callback to `fit` without calling `restore`: "
                f"it skips the trained batches. Received: batch={batch}")
        self._restored_before_fit = True
        return epoch

    def on_train_begin(self, logs=None):
        per_call, steps = _per_call(self.model), self.params.get("steps")
        # Read once: `self.model` syncs the whole training state on JAX, too
        # costly for every batch.
        self._batches_per_call = per_call
        if per_call > 1 and steps and steps % per_call:
            warnings.warn(
                f"steps_per_epoch={steps} is not a multiple of steps_per_execution={per_call}: Keras runs whole "
                f"executions ({-(-steps // per_call) * per_call} batches an epoch), so each epoch of a repeated "
                "dataset starts at another batch, and a resumed run trains on other batches than an "
                "uninterrupted one. Make steps_per_epoch a multiple of steps_per_execution for an exact resume.",
                stacklevel=2)
        if self._restored_before_fit:  # `restore` loaded the state and holds the lock
            self._restored_before_fit = False
            # `fit`'s own epochs and steps, against the checkpoint (`restore`
            # checked only what it was given; another `fit` trained on and
            # overwrote the record).
            metadata = self.read_checkpoint()
            if metadata is not None:
                try:
                    self._check_same_run(metadata, self.model)
                except ValueError:
                    self._release()
                    raise
            return
        self._reset_run_state()
        self._acquire_and_restore(set_initial_epoch=True)

    def _acquire_and_restore(self, set_initial_epoch):
        refused = None
        if self._is_writer():
            try:
                _acquire_lock(self.backup_dir)
            except (RuntimeError, CheckpointWriteError) as error:
                refused = error
        if any(distribute.all_processes(refused is not None)):
            raise refused or RuntimeError(
                f"Process 0 could not take the backup directory {self.backup_dir} (its error says why); this "
                f"process stops with it. Received: backup_dir={self.backup_dir!r}")
        try:
            return self._restore(set_initial_epoch)
        except BaseException:  # a refused checkpoint does not keep the lock
            self._release()
            raise

    def _release(self):
        if self._is_writer():
            _release_lock(self.backup_dir)

    def _restore(self, set_initial_epoch):
        """Loads the checkpoint, if any; returns `(epoch, batch)` to resume at."""
        _optimizer_signature(self.model.optimizer)  # before anything is loaded: the command's
        metadata = self.read_checkpoint()
        steps = distribute.all_processes(-1 if metadata is None else metadata["step"])
        if len(set(steps)) > 1:
            seen = ", ".join(f"process {i}: {'none' if s < 0 else f'step {s}'}" for i, s in enumerate(steps))
            raise ValueError(
                f"The processes see different checkpoints in {self.backup_dir} ({seen}): `backup_dir` must be on "
                f"a file system every process sees. Received: backup_dir={self.backup_dir!r}")
        if metadata is None:
            return 0, 0
        model = self.model
        self._check_same_run(metadata, model)
        epoch, batch = metadata["epoch"], metadata["batch"]
        if metadata["steps_per_epoch"] is not None and batch >= metadata["steps_per_epoch"]:
            epoch, batch = epoch + 1, 0
        if metadata.get("stopped") and metadata["epochs"] is not None:  # finished: nothing left to train
            epoch, batch = metadata["epochs"], 0
        per_call = _per_call(model)
        if set_initial_epoch and batch % per_call and "steps_per_execution" in metadata:
            # The skip consumes whole executions: past the saved batch it
            # would drop batches never trained on and end the run short.
            # (Older checkpoints counted executions differently on Keras
            # 3.10, and their skip lands right: not checked.)
            raise ValueError(
                f"The checkpoint in {self.backup_dir} was written after batch {batch} of epoch {epoch} (with "
                f"steps_per_execution={metadata['steps_per_execution']}), not a whole number of executions of "
                f"{per_call} batches: resumed, the run would skip batches it never trained on. Compile with "
                f"steps_per_execution={metadata['steps_per_execution']} (or one dividing {batch}) to resume. "
                f"Nothing was loaded. Received: steps_per_execution={per_call}")
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        _load_checked_step(model, os.path.join(self.backup_dir, metadata["weights"]), metadata["step"])
        if metadata.get("lora"):
            _load_lora_variables(model, os.path.join(self.backup_dir, metadata["lora"]))
        for variable, value in zip(_seed_states(model), metadata["seed_states"]):
            variable.assign(np.asarray(value, dtype=variable.dtype))
        if metadata["global_seed_state"] is not None:
            _set_global_seed_state(metadata["global_seed_state"])
        self._torch_rng_pending = metadata["torch_rng_states"]
        self.resumed_from = metadata
        self._last_saved = metadata
        if set_initial_epoch:
            _set_initial_epoch(model, epoch)
            self._initial_epoch_set = True
            if batch:
                self._resume_epoch, self._skip_until = epoch, batch
                self._wrap_train_function(model)
        return epoch, batch

    def _check_same_run(self, metadata, model):
        """Refuses a checkpoint of another run: with another model or
        optimizer the restored state would be wrong or fail to load."""
        _check_backend(metadata, self._pointer_path)
        where = f"The checkpoint in {self.backup_dir} was written by another run:"
        advice = "Resume with the same command, or use another `backup_dir`."
        for key, param, label in (
            ("steps_per_epoch", "steps", "steps per epoch"), ("epochs", "epochs", "epochs")
        ):
            saved, now = metadata[key], self.params.get(param)
            if saved is not None and now is not None and saved != now:
                raise ValueError(
                    f"{where} {saved} {label}, but this `fit` has {now}: {advice} "
                    f"Received: {key}={now}"
                )
        if not model.built:
            raise ValueError(
                "The model must be built before `fit` to restore a checkpoint "
                f"(call it on a batch first). Received: model {model.name!r} unbuilt"
            )
        signature = _run_signature(model)
        difference = _variables_difference(metadata["variables"], signature["variables"])
        if difference is None and metadata["model_config"] and signature["model_config"]:
            difference = _first_difference(
                metadata["model_config"], signature["model_config"], "model config"
            )
        if difference is None:
            difference = _first_difference(
                metadata["optimizer"], signature["optimizer"], "optimizer"
            )
        if difference is None and len(metadata["seed_states"]) != len(_seed_states(model)):
            difference = (
                f"random seed generators: {len(metadata['seed_states'])} in the "
                f"checkpoint, {len(_seed_states(model))} in this model"
            )
        if difference is not None:
            saved_version = metadata.get("keras_version")
            if saved_version is not None and saved_version != keras.__version__:
                # The same command on another Keras: its configs (and maybe
                # variables) are written differently, e.g. 3.10's
                # `input_layers` [name, 0, 0] against 3.15's [[name, 0, 0]].
                raise ValueError(
                    f"The checkpoint in {self.backup_dir} was written with Keras {saved_version}, and this run "
                    f"has Keras {keras.__version__}, which describes the run differently ({difference}). Resume "
                    f"with the Keras that wrote it (`pip install keras=={saved_version}`), or use another "
                    "`backup_dir`."
                )
            raise ValueError(f"{where} {difference}. {advice}")
        _check_state_sizes(metadata, model, self._pointer_path)

    def _wrap_train_function(self, model):
        """Makes the first `batch` calls of the resumed epoch consume their
        data without training (the model's train function is restored as
        soon as they are done). No callback hook can skip a batch, and
        training the batches again and then reloading would repeat up to
        `save_freq` steps of compute; this private seam is tested in
        tests/training/test_fault_tolerance.py (see docs/training.md)."""
        original = model.train_function
        if not callable(original):
            raise RuntimeError(
                "Keras changed: `model.train_function` is not set when callbacks "
                "start, so BackupAndResume cannot skip the trained batches. "
                f"Received: train_function={original!r}"
            )
        self._original_train_function = original
        backend = keras.backend.backend()
        per_call = _per_call(model)

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
        self._call_begins_at = batch  # the call's first batch, on every Keras version
        if self._skipping():
            return
        self._unwrap()
        if self._torch_rng_pending is not None:
            distribute.set_backend_rng_state(self._torch_rng_pending)
            self._torch_rng_pending = None
        if self._save_pending:
            self._save()

    def on_train_batch_end(self, batch, logs=None):
        # With steps_per_execution > 1 each call covers several batches, and
        # Keras says the call's last (newer versions) or first (3.10) here:
        # counted from the first, which `on_train_batch_begin` gets on both.
        skipped = self._skipping()
        # Keras runs whole executions: with 7 steps per epoch and 2 per
        # execution the last call ends at batch 7 (8 done). The epoch is then
        # complete; recording 8 made a checkpoint that resume refused.
        steps = self.params.get("steps")
        done = self._call_begins_at + self._batches_per_call
        done = min(done, steps) if steps else done
        new = done - self._batches_in_epoch if done > self._batches_in_epoch else done
        self._batches_in_epoch = done
        if skipped:
            return
        if self.stop_on_nan and logs and logs.get("loss") is not None:
            loss = float(keras.ops.convert_to_numpy(logs["loss"]))
            if not math.isfinite(loss):
                self._failed = True
                saved = self._last_saved
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
                    "command again to resume from it (the model in memory holds the "
                    "bad step's values: NaN weights or accumulated gradients)."
                )
        self._since_save += new
        if isinstance(self.save_freq, int) and self._since_save >= self.save_freq:
            if done == self.params.get("steps"):
                self._save_pending = True
            else:
                self._save()

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._save_pending = True

    def on_train_end(self, logs=None):
        self._unwrap()
        if self._initial_epoch_set:
            _set_initial_epoch(self.model, None)
        if not self._failed:
            # `EarlyStopping` (or another callback) ended the run: recorded,
            # so that the same command again trains no further (it went on
            # with the epochs left). Not `TerminateOnNaN`'s stop (with
            # stop_on_nan=False): NaN weights are no finished run.
            loss = (logs or {}).get("loss")
            finite = loss is None or math.isfinite(float(keras.ops.convert_to_numpy(loss)))
            self._stopped = bool(getattr(self.model, "stop_training", False)) and finite
            if self.delete_on_finish:
                self._delete_own_files()
            elif self._since_save or self._save_pending or self._stopped:
                self._save()
        self._release()

    def _delete_own_files(self):
        """Deletes what this callback wrote, and the directory if that
        leaves it empty; the user's files (and folders) stay."""
        if not self._is_writer() or not os.path.isdir(self.backup_dir):
            return
        for name in os.listdir(self.backup_dir):
            bare = name[5:] if name.startswith(".tmp-") else name
            own = _WEIGHTS_NAME.match(bare) or _LORA_NAME.match(bare)
            if own or name in (_POINTER, f".tmp-{_POINTER}"):
                _remove(os.path.join(self.backup_dir, name))
        # Removed while held, then released: a run starting now locks the
        # new file its `acquire` finds, never the removed one (which would
        # let a third run in beside it).
        _remove(os.path.join(self.backup_dir, _LOCK))
        _release_lock(self.backup_dir)
        try:
            os.rmdir(self.backup_dir)
        except OSError:  # not empty: the user's files stay
            pass

    def get_config(self):
        return {
            "backup_dir": self.backup_dir,
            "save_freq": self.save_freq,
            "stop_on_nan": self.stop_on_nan,
            "delete_on_finish": self.delete_on_finish,
        }


# --- What the checkpoint records -------------------------------------------


def _per_call(model):
    """Batches per compiled call (`compile(steps_per_execution=...)`)."""
    return getattr(model, "steps_per_execution", 1) or 1


def _run_signature(model):
    """What a checkpoint must match to be restored into `model`."""
    try:
        config = _without_names(json.loads(json.dumps(model.get_config(), default=str)))
    except NotImplementedError:  # a subclassed model without get_config
        config = None
    if config is not None:
        # `ViTModel`'s list of quantized layers: the variables (int8 kernels,
        # scales) already tell a quantized run apart, and checkpoints
        # written before the list existed resume.
        config.pop("quantized_layers", None)
    return {
        "variables": [[v.path, list(v.shape), str(v.dtype)] for v in model.weights],
        "model_config": config,
        "optimizer": _optimizer_signature(model.optimizer),
    }


def _optimizer_signature(optimizer):
    """The optimizer's class and config as this process first saw it:
    `ReduceLROnPlateau` or `LearningRateScheduler` change the learning rate
    as the run goes, and every checkpoint written after a change was refused
    as another run's (the restored optimizer variables carry the changed
    rate on). Kept per optimizer object, so a retried `fit`, a new callback
    or `restore` on the same model in the same process see the command's
    optimizer too."""
    if optimizer is None:
        return None
    if optimizer not in _FIRST_SEEN_OPTIMIZERS:
        _FIRST_SEEN_OPTIMIZERS[optimizer] = {
            "class": f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
            "config": _without_names(json.loads(json.dumps(optimizer.get_config(), default=str))),
        }
    return _FIRST_SEEN_OPTIMIZERS[optimizer]


def _variables_difference(saved, now):
    # Shapes and dtypes, in order: what `load_weights` needs (paths may
    # carry auto-numbered layer names that differ between processes).
    if len(saved) != len(now):
        return f"the model has {len(now)} weights, the checkpoint {len(saved)}"
    for (path, *was), (_, *new) in zip(saved, now):
        if was != new:
            return f"weight {path} is {was} in the checkpoint, {new} in this model"
    return None


def _without_names(config):
    # Auto-generated names ("dense_3", "adam_2") differ between processes
    # building the same model; they are not part of what must match.
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_without_names(v) for v in config]
    return config


def _first_difference(saved, now, where):
    """The first place where two JSON values differ, as text, or None."""
    if isinstance(saved, dict) and isinstance(now, dict):
        for key in sorted(set(saved) | set(now), key=str):
            if key not in saved or key not in now:
                side = "checkpoint" if key in saved else "this run"
                return f"{where}.{key} is only in {side}"
            difference = _first_difference(saved[key], now[key], f"{where}.{key}")
            if difference is not None:
                return difference
        return None
    if isinstance(saved, list) and isinstance(now, list):
        if len(saved) != len(now):
            return f"{where} has {len(saved)} entries in the checkpoint, {len(now)} in this run"
        for i, (a, b) in enumerate(zip(saved, now)):
            difference = _first_difference(a, b, f"{where}[{i}]")
            if difference is not None:
                return difference
        return None
    if saved != now:
        return f"{where} is {saved!r} in the checkpoint, {now!r} in this run"
    return None


def _seed_states(model):
    """The state variables of the model's `keras.random.SeedGenerator`s
    (dropout, drop-path), in a fixed order. `save_weights` leaves them out."""
    return [v for v in model.variables if v.name == SEED_STATE]


def _state(variable):
    return np.asarray(keras.ops.convert_to_numpy(variable)).astype("int64").tolist()


def _global_seed_state():
    # Keras' global SeedGenerator (unseeded `keras.random` calls) has no
    # public accessor: private seam, tested in tests/training/test_fault_tolerance.py.
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator

    # The attribute's name: a constant since Keras 3.11, a literal before.
    name = getattr(seed_generator, "GLOBAL_SEED_GENERATOR", "global_seed_generator")
    generator = global_state.get_global_attribute(name)
    return None if generator is None else _state(generator.state)


def _global_seed_shape():
    # Creates Keras' global SeedGenerator if needed, as the restore does.
    from keras.src.random import seed_generator

    return tuple(seed_generator.global_seed_generator().state.shape)


def _set_global_seed_state(value):
    from keras.src.random import seed_generator

    state = seed_generator.global_seed_generator().state
    state.assign(np.asarray(value, dtype=state.dtype))


def _set_initial_epoch(model, epoch):
    # `fit` starts at `model._initial_epoch` when set (Keras' own
    # BackupAndRestore uses it; no public hook moves the epoch counter).
    if not hasattr(model, "_initial_epoch"):
        raise RuntimeError(
            "Keras changed: `Model._initial_epoch` is gone, so BackupAndResume "
            "cannot start `fit` at the saved epoch. Received: keras "
            f"{keras.__version__}"
        )
    model._initial_epoch = epoch


def _lora_file(weights):
    return weights.replace(".weights.h5", ".lora.npz")


class _DiskFull(OSError):
    """The disk has no room for the next checkpoint (`_check_free_space`)."""


def _check_free_space(model, directory):
    """Refuses a checkpoint the disk cannot hold before its file is begun:
    when h5py's write fails half-way, the file Keras' `save_weights` leaves
    open crashes the interpreter as it exits (a segmentation fault after
    the error, in a script and in a notebook's kernel alike). The file holds
    the model's and the optimizer's variables, plus 1 to 2.3 KiB of HDF5
    records each (ViT-B/16: 343.7 MB for 343.2 MB of weights)."""
    variables = list(model.variables) + list(getattr(model.optimizer, "variables", []))
    # The values' dtype: JAX without x64 holds a float64 variable in float32.
    needed = sum(math.prod(v.shape) * _itemsize(v.value.dtype) + 2560 for v in variables) + 2**16
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise _DiskFull(errno.ENOSPC, f"the checkpoint needs about {needed / 2**20:.1f} MiB and "
                        f"{free / 2**20:.1f} MiB are free")


def _itemsize(dtype):
    """Bytes per element of a Keras dtype name (`bfloat16`, `float8_e4m3fn`: the first number's bits)."""
    bits = re.search(r"\d+", keras.backend.standardize_dtype(dtype))
    return int(bits.group()) // 8 if bits else 1


def _lora_variables(model):
    """The variables of the LoRA-adapted layers (kernel as stored, bias,
    adapters), found from the adapters' names (`keras_vit.enable_lora`)."""
    layers = {v.path.rsplit("/", 1)[0] for v in model.weights
              if v.path.rsplit("/", 1)[-1] in ("lora_kernel_a", "lora_kernel_b")}
    return [v for v in model.weights if v.path.rsplit("/", 1)[0] in layers]


def _load_lora_variables(model, path):
    """Puts the LoRA layers' own variables back after `load_weights` (which
    wrote the merged kernels into them)."""
    variables = {v.path: v for v in _lora_variables(model)}
    try:
        with np.load(path) as stored:
            arrays = {key: stored[key] for key in stored.files}
    except (OSError, ValueError, EOFError, KeyError) as error:
        raise ValueError(f"The checkpoint's LoRA file {path} cannot be read ({error}). Received: lora={path!r}") from None
    if set(arrays) != set(variables):
        raise ValueError(f"The checkpoint's LoRA file {path} holds other layers' variables than this model's "
                         f"adapted ones. Received: {sorted(arrays)[:3]}")
    for key, value in arrays.items():
        variables[key].assign(value)


# --- Validation of checkpoint.json -------------------------------------------


def _validate(metadata, path):
    def fail(message):
        raise ValueError(f"The checkpoint {path} is invalid: {message}.")

    if not isinstance(metadata, dict):
        fail(f"expected a JSON object, got {type(metadata).__name__}")
    missing = sorted(set(_FIELDS) - set(metadata))
    extra = sorted(set(metadata) - set(_FIELDS) - set(_OPTIONAL_FIELDS))
    if missing or extra:
        fail(f"missing fields {missing}, unknown fields {extra}")
    optional = {key: types for key, types in _OPTIONAL_FIELDS.items() if key in metadata}
    for key, types in {**_FIELDS, **optional}.items():
        value = metadata[key]
        if (isinstance(value, bool) and types is not bool) or not isinstance(value, types):
            fail(f"`{key}` has the wrong type. Received: {key}={_short(value)}")
    if metadata["format"] != _FORMAT:
        fail(f"format {metadata['format']} is not {_FORMAT}")
    if "lora" in metadata and not _LORA_NAME.match(metadata["lora"]):
        fail(f"`lora` must name a step-N.lora.npz file inside the directory. Received: lora={metadata['lora']!r}")
    if not _WEIGHTS_NAME.match(metadata["weights"]):
        fail(
            "`weights` must name a step-N.weights.h5 file inside the directory. "
            f"Received: weights={metadata['weights']!r}"
        )
    for key in ("step", "epoch", "batch"):
        if metadata[key] < 0:
            fail(f"`{key}` must be >= 0. Received: {key}={metadata[key]}")
    for key in ("steps_per_epoch", "epochs", "steps_per_execution"):
        if metadata.get(key) is not None and metadata[key] <= 0:
            fail(f"`{key}` must be positive. Received: {key}={metadata[key]}")
    steps = metadata["steps_per_epoch"]
    if steps is not None and metadata["batch"] > steps:
        fail(f"`batch` must be <= steps_per_epoch={steps}. Received: batch={metadata['batch']}")
    if metadata["epochs"] is not None and metadata["epoch"] >= metadata["epochs"]:
        fail(f"`epoch` must be < epochs={metadata['epochs']}. Received: epoch={metadata['epoch']}")
    for i, entry in enumerate(metadata["variables"]):
        if not (
            isinstance(entry, list) and len(entry) == 3
            and isinstance(entry[0], str) and isinstance(entry[2], str)
            and isinstance(entry[1], list) and all(_is_int(d, 0) for d in entry[1])
        ):
            fail(
                f"`variables[{i}]` must be [path, shape, dtype]. "
                f"Received: variables[{i}]={_short(entry)}"
            )
    torch_states = metadata["torch_rng_states"]
    if torch_states is not None and not torch_states:
        fail(
            "`torch_rng_states` must hold PyTorch's CPU generator state (then "
            "one per GPU). Received: torch_rng_states=[]"
        )
    for i, state in enumerate(torch_states or []):
        if not isinstance(state, list) or not state or not all(_is_int(x, 0, 256) for x in state):
            fail(
                "`torch_rng_states` must be lists of bytes. "
                f"Received: torch_rng_states[{i}]={_short(state)}"
            )
    states = metadata["seed_states"] + [metadata["global_seed_state"] or [0]]
    for state in states:
        if not isinstance(state, list) or not all(_is_int(x, 0, 2**32) for x in state):
            fail(f"a seed state is not a list of uint32. Received: {_short(state)}")
    backend = metadata.get("backend")
    if backend is not None and (backend == "torch") != (torch_states is not None):
        fail(
            f"`torch_rng_states` is {'null' if torch_states is None else 'set'} but the "
            f"checkpoint's backend is {backend!r} (only 'torch' records it, always). "
            f"Received: backend={backend!r}"
        )


def _is_int(value, low, high=None):
    return (
        is_int(value) and value >= low
        and (high is None or value < high)
    )


def _short(value, limit=100):
    """`repr(value)`, cut to `limit` characters (a state holds thousands)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _check_backend(metadata, path):
    """Refuses a checkpoint written on another Keras backend: the random
    state (seed generators, PyTorch's generators) does not carry over, so
    the resumed run would not be the one that was interrupted. A checkpoint
    of an older keras_vit, without `backend`, is told apart only as torch or
    not (torch always records `torch_rng_states`)."""
    now = keras.backend.backend()
    saved = metadata.get("backend")
    if saved is None:  # written before `backend` was recorded
        if (metadata["torch_rng_states"] is not None) == (now == "torch"):
            return
        if now != "torch":
            saved_text, advice = "the 'torch' backend", "with KERAS_BACKEND=torch"
        else:
            saved_text = "a backend other than 'torch' (it has no `torch_rng_states`)"
            advice = "with KERAS_BACKEND=jax or tensorflow, the one that wrote it"
    elif saved == now:
        return
    else:
        saved_text, advice = f"the {saved!r} backend", f"with KERAS_BACKEND={saved}"
    raise ValueError(
        f"The checkpoint {path} was written on {saved_text}, but this run "
        f"uses {now!r}: the random state does not carry over between backends, so "
        f"the resume would not be exact. Resume {advice}, or use another "
        f"`backup_dir`. Received: backend={now!r}"
    )


def _check_state_sizes(metadata, model, path):
    """Refuses random states that do not fit this model and process before
    anything is loaded (assigning them would fail mid-restore)."""

    def fail(message):
        raise ValueError(f"The checkpoint {path} is invalid: {message}.")

    for i, (variable, value) in enumerate(zip(_seed_states(model), metadata["seed_states"])):
        if (len(value),) != tuple(variable.shape):
            fail(
                f"`seed_states[{i}]` has {len(value)} value(s), the state of seed "
                f"generator {variable.path} has shape {tuple(variable.shape)}. "
                f"Received: seed_states[{i}]={_short(value)}"
            )
    value = metadata["global_seed_state"]
    if value is not None:
        shape = _global_seed_shape()
        if (len(value),) != shape:
            fail(
                f"`global_seed_state` has {len(value)} value(s), Keras' global seed "
                f"generator state has shape {shape}. Received: global_seed_state={_short(value)}"
            )
    saved = metadata["torch_rng_states"]
    if saved is None or keras.backend.backend() != "torch":
        return
    now = distribute.backend_rng_state()
    if len(saved) != len(now):
        fail(
            f"`torch_rng_states` holds {len(saved)} PyTorch generator state(s) (CPU, "
            f"then one per GPU), this process has {len(now)}: resuming with another "
            "number of GPUs would not be exact. Received: "
            f"{len(saved)} states"
        )
    for i, (was, new) in enumerate(zip(saved, now)):
        if len(was) != len(new):
            device = "CPU" if i == 0 else f"GPU {i - 1}"
            fail(
                f"`torch_rng_states[{i}]` has {len(was)} bytes, PyTorch's {device} "
                f"generator state has {len(new)}. Received: torch_rng_states[{i}] of "
                f"length {len(was)}"
            )


def _load_checked_step(model, path, step):
    """Loads the weights file of a checkpoint, checked first by
    `_check_stored_step`; a damaged file is an error naming it."""
    try:
        _check_stored_step(model, path, step)
        model.load_weights(path)
    except (OSError, KeyError) as error:  # h5py's errors for a damaged file
        raise ValueError(
            f"The checkpoint's weights file {path} cannot be read ({type(error).__name__}: "
            f"{error}): it is damaged or truncated. Nothing was deleted. Delete the backup "
            f"directory to start over, or restore the file. Received: weights={path!r}"
        ) from error


def _check_stored_step(model, path, step):
    """Refuses a weights file whose optimizer step differs from the one
    `checkpoint.json` records (a file replaced, e.g. by another run's, would
    resume at the wrong step and end the run early); the model is left as
    it was.

    Keras' weights file keeps the optimizer's variables in order under
    `optimizer/vars/<index>`; the stored counter is assigned for a moment so
    that the optimizer reports it as `iterations` (updates, not
    micro-batches, under gradient accumulation)."""
    optimizer = model.optimizer
    counter = [i for i, v in enumerate(optimizer.variables) if v.path.endswith("/iteration")] if optimizer else []
    if len(counter) == 1:
        import h5py

        with h5py.File(path, "r") as f:
            stored = f.get(f"optimizer/vars/{counter[0]}")
            stored = None if stored is None else stored[()]
        if stored is not None:
            variable = optimizer.variables[counter[0]]
            # `numpy()`: under tf.distribute the value is a mirrored variable,
            # which `convert_to_numpy` cannot read (every resume crashed there).
            current = variable.numpy()
            variable.assign(stored)
            restored = int(keras.ops.convert_to_numpy(optimizer.iterations))
            variable.assign(current)
            if restored != step:
                raise ValueError(
                    f"The checkpoint in {os.path.dirname(path)} does not hold together: "
                    f"{os.path.basename(path)} holds optimizer step {restored}, `checkpoint.json` "
                    f"records step {step} (the file was replaced, e.g. by another run's). Nothing "
                    "was restored. Use another `backup_dir`, or delete this one to start over. "
                    f"Received: step={restored}"
                )


# --- One run per directory ---------------------------------------------------


def _acquire_lock(directory):
    """An exclusive OS lock on `directory`/backup.lock, held while `fit`
    runs (`keras_vit.locks`)."""
    try:
        holder = locks.acquire(os.path.join(directory, _LOCK))
    except OSError as error:  # a read-only disk, a folder named backup.lock
        raise CheckpointWriteError(
            f"The backup directory {directory} cannot hold the run's lock file {_LOCK}: {error.strerror or error}. "
            f"Use a writable `backup_dir`. Received: backup_dir={directory!r}") from error
    if holder is not None:
        raise RuntimeError(
            f"Another run is using the backup directory {directory} ({holder}); "
            "two runs cannot share one. Wait for it to end or use another "
            f"`backup_dir`. Received: backup_dir={directory!r}"
        )


def _release_lock(directory):
    locks.release(os.path.join(directory, _LOCK))


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
