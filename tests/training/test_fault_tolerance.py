"""BackupAndResume: a run killed with SIGKILL mid-epoch and started again with
the same command resumes at its last checkpoint and ends bit for bit like an
uninterrupted run (dropout and drop-path on); a NaN loss stops training and
keeps the last good checkpoint; another run's or a tampered checkpoint, and
a second run on the same directory, are refused; only the callback's own
files are deleted."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import distribute, training
from tests.helpers import CopyCheckpointAfterEpoch0
from tests.test_distribute import ROOT, child_env

BACKEND = keras.backend.backend()
TINY = dict(
    hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=8,
    input_shape=(16, 16, 3), num_classes=5,
    dropout_rate=0.1, attention_dropout_rate=0.1, drop_path_rate=0.1,
)
EPOCHS, BATCHES, BATCH_SIZE = 3, 5, 4  # 15 optimizer steps
SAVE_FREQ, KILL_AFTER = 2, 7  # checkpoints at steps 2, 4, 6; killed after 7


def _job_data():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (BATCHES * BATCH_SIZE, 16, 16, 3)).astype("float32")
    y = np.eye(5, dtype="float32")[rng.integers(0, 5, BATCHES * BATCH_SIZE)]
    return x, y


def _job_model():
    keras.utils.set_random_seed(2)  # the dropout layers' initial seeds
    rng = np.random.default_rng(1)
    model = keras_vit.ViT(None, **TINY)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.3, tuple(variable.shape)).astype("float32"))
    model.compile(
        optimizer=training.finetuning_optimizer(0.05, total_steps=EPOCHS * BATCHES, warmup_steps=3),
        loss=training.SoftmaxCrossEntropy(),
    )
    return model


class _KillOnce(keras.callbacks.Callback):
    """SIGKILLs its own process after step KILL_AFTER, the first time only
    (a marker file records that it happened), so that running the same
    command again is the restart."""

    def __init__(self, marker):
        super().__init__()
        self.marker = marker
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == KILL_AFTER and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def _job(workdir, kill=True):
    """The training command: the same code runs killed, resumed and
    uninterrupted."""
    x, y = _job_data()
    model = _job_model()
    backup = training.BackupAndResume(os.path.join(workdir, "backup"), save_freq=SAVE_FREQ)
    callbacks = [backup]
    if kill:
        callbacks.append(_KillOnce(os.path.join(workdir, "killed")))
    history = model.fit(
        x, y, batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0,
        callbacks=callbacks,
    )
    return model, backup, history


def _child():
    """Child A is killed after step 7. Child B (the same command again)
    resumes and finishes; it then also runs the job uninterrupted, a run
    whose loss turns NaN, so that the parent builds no ViT (a fresh process
    costs seconds per compile)."""
    workdir = os.environ["KERAS_VIT_TEST_WORKDIR"]
    model, backup, history = _job(workdir)  # child A dies in here
    report = {
        "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        "resumed_from": backup.resumed_from,
        "epochs_run": len(history.history["loss"]),
        "files": sorted(os.listdir(os.path.join(workdir, "backup"))),
        "final_checkpoint": backup.read_checkpoint(),
    }
    resumed = model.get_weights()

    # The same job without interruption.
    reference, _, _ = _job(os.path.join(workdir, "uninterrupted"), kill=False)
    report["reference_steps"] = int(keras.ops.convert_to_numpy(reference.optimizer.iterations))
    report["max_weight_difference"] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(resumed, reference.get_weights())
    )

    # NaN from the 4th batch on (reusing the compiled model).
    x, y = _job_data()
    x[3 * BATCH_SIZE] = np.nan
    start = report["reference_steps"]
    nan_dir = os.path.join(workdir, "nan")
    backup = training.BackupAndResume(nan_dir, save_freq=1)
    try:
        reference.fit(
            x, y, batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0,
            callbacks=[backup],
        )
        report["nan_error"] = None
    except FloatingPointError as error:
        report["nan_error"] = str(error)
    checkpoint = backup.read_checkpoint()
    report["nan_checkpoint"] = checkpoint
    fresh = _job_model()
    fresh.optimizer.build(fresh.trainable_variables)
    fresh.load_weights(os.path.join(nan_dir, checkpoint["weights"]))
    report["nan_restored_finite"] = all(bool(np.all(np.isfinite(w))) for w in fresh.get_weights())
    report["nan_restored_steps"] = int(keras.ops.convert_to_numpy(fresh.optimizer.iterations))
    report["nan_start"] = start

    print(json.dumps(report))


def _run(workdir):
    env = child_env(KERAS_BACKEND=BACKEND, KERAS_VIT_TEST_WORKDIR=str(workdir))
    code = "from tests.training.test_fault_tolerance import _child; _child()"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Child A (killed), its checkpoint, then child B (same command)."""
    workdir = tmp_path_factory.mktemp("job")
    killed = _run(workdir)
    with open(workdir / "backup" / "checkpoint.json") as f:
        checkpoint = json.load(f)
    files = sorted(os.listdir(workdir / "backup"))
    resumed = _run(workdir)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-5000:]
    report = json.loads(resumed.stdout.strip().splitlines()[-1])
    return killed, checkpoint, files, report


def test_sigkill_mid_epoch_then_same_command_resumes(runs):
    killed, checkpoint, files, report = runs
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # Step 7 was the 2nd batch of epoch 1; the last checkpoint is step 6.
    assert checkpoint["step"] == 6 and checkpoint["epoch"] == 1 and checkpoint["batch"] == 1
    assert files == ["backup.lock", "checkpoint.json", "step-000000000006.weights.h5"]

    assert report["resumed_from"]["step"] == 6
    assert report["steps"] == EPOCHS * BATCHES  # Keras' BackupAndRestore: 16
    assert report["epochs_run"] == EPOCHS - 1  # epochs 1 and 2
    assert report["reference_steps"] == EPOCHS * BATCHES
    # Same batches, same random draws, same updates: the resumed run ends
    # exactly where the uninterrupted one does (dropout and drop-path on;
    # without the random state restored they differ by ~1e-2).
    assert report["max_weight_difference"] == 0.0
    # The finished run's checkpoint is kept: the same command again trains
    # no more.
    assert report["final_checkpoint"]["step"] == EPOCHS * BATCHES
    assert report["files"] == [
        "backup.lock", "checkpoint.json", f"step-{EPOCHS * BATCHES:012d}.weights.h5"
    ]


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(runs):
    report = runs[3]
    start = report["nan_start"]
    assert "loss became nan at epoch 0, batch 3" in report["nan_error"]
    assert f"last good checkpoint (step {start + 3})" in report["nan_error"]
    assert report["nan_checkpoint"]["step"] == start + 3
    assert report["nan_checkpoint"]["batch"] == 3
    assert report["nan_restored_finite"] and report["nan_restored_steps"] == start + 3


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="save_freq=0"):
        training.BackupAndResume("backup", save_freq=0)
    with pytest.raises(ValueError, match="backup_dir"):
        training.BackupAndResume("")
    # A string flag counted as True; a file as the folder failed only in `fit`.
    with pytest.raises(ValueError, match=r"`stop_on_nan` must be a bool. Received: stop_on_nan='no'"):
        training.BackupAndResume("backup", stop_on_nan="no")
    with pytest.raises(ValueError, match=r"`delete_on_finish` must be a bool. Received: delete_on_finish=1"):
        training.BackupAndResume("backup", delete_on_finish=1)
    with pytest.raises(ValueError, match=r"`backup_dir` is a file, not a folder. Received: backup_dir='.*py'"):
        training.BackupAndResume(__file__)


# --- Refusals, validation, deletion: a small dense model in this process ---

SMALL_X = np.random.default_rng(3).normal(size=(8, 4)).astype("float32")
SMALL_Y = np.eye(2, dtype="float32")[[0, 1] * 4]


def _small_model(units=3, optimizer="adam"):
    keras.utils.set_random_seed(4)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(units), keras.layers.Dropout(0.5),
         keras.layers.Dense(2)]
    )
    model.compile(optimizer=optimizer, loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    return model


def _small_fit(model, backup_dir, epochs=2, **kwargs):
    backup = training.BackupAndResume(backup_dir, save_freq=1, **kwargs)
    model.fit(
        SMALL_X, SMALL_Y, batch_size=4, epochs=epochs, shuffle=False, verbose=0,
        callbacks=[backup],
    )
    return backup


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    """A finished 2-epoch run of the small model (4 steps)."""
    directory = tmp_path_factory.mktemp("small") / "backup"
    _small_fit(_small_model(), directory)
    return directory


def _copy(checkpoint, tmp_path, **changes):
    directory = tmp_path / "copy"
    shutil.copytree(checkpoint, directory)
    if changes:
        with open(directory / "checkpoint.json") as f:
            metadata = json.load(f)
        metadata.update(changes)
        with open(directory / "checkpoint.json", "w") as f:
            json.dump(metadata, f)
    return directory


def _lock_is_free(directory):
    """Whether no run holds `directory`'s lock, this process included:
    `flock` locks belong to an open file description, so a fresh `open`
    conflicts with a lock this process holds through another one (as a
    second process would, without the seconds its imports take)."""
    import fcntl

    with open(os.path.join(directory, "backup.lock"), "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


_HOLD_LOCK = """
import sys, time
from keras_vit.training.callbacks import _acquire_lock
_acquire_lock(sys.argv[1])
print("locked", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize(
    "model, match",
    [
        (lambda: _small_model(optimizer="sgd"),
         r"optimizer.class is 'keras.src.[\w.]*Adam' in the checkpoint, "
         r"'keras.src.[\w.]*SGD' in this run"),
        (lambda: _small_model(optimizer=keras.optimizers.Adam(0.01)),
         r"optimizer.config.learning_rate is 0.00100\d* in the checkpoint, 0.0099\d* in this run"),
        (lambda: _small_model(units=5),
         r"weight .*kernel is \[\[4, 3\], 'float32'\] in the checkpoint, "
         r"\[\[4, 5\], 'float32'\] in this model"),
    ],
    ids=["adam_to_sgd", "learning_rate", "model"],
)
def test_another_run_is_refused_naming_the_difference(small_checkpoint, tmp_path, model, match):
    # Before: Adam -> SGD resumed (and ended at the wrong step); a changed
    # model gave Keras' raw "objects could not be loaded".
    directory = _copy(small_checkpoint, tmp_path)
    before = sorted(os.listdir(directory))
    with pytest.raises(ValueError, match="written by another run: " + match) as error:
        _small_fit(model(), directory)
    assert "\n" not in str(error.value)
    assert sorted(os.listdir(directory)) == before  # nothing lost
    # The refused run keeps no lock: another process may use the directory.
    assert _lock_is_free(directory)


def test_changed_fit_arguments_are_refused(small_checkpoint, tmp_path):
    directory = _copy(small_checkpoint, tmp_path)
    with pytest.raises(ValueError, match="2 epochs, but this `fit` has 3"):
        _small_fit(_small_model(), directory, epochs=3)
    directory = _copy(small_checkpoint, tmp_path / "b", steps_per_epoch=9, batch=1)
    with pytest.raises(ValueError, match="9 steps per epoch, but this `fit` has 2"):
        _small_fit(_small_model(), directory)


# A torch checkpoint's CPU generator state has this many bytes.
_TORCH_CPU_STATE = [0] * 5056


@pytest.mark.parametrize(
    "tamper, match, found_by",
    [
        ("{not json", r"is not valid JSON", "read"),
        ("[1, 2]", r"expected a JSON object, got list", "read"),
        (dict(batch=-3), r"`batch` must be >= 0. Received: batch=-3", "read"),
        (dict(batch=7), r"`batch` must be <= steps_per_epoch=2. Received: batch=7", "read"),
        (dict(step="4"), r"`step` has the wrong type. Received: step='4'", "read"),
        (dict(epoch=True), r"`epoch` has the wrong type", "read"),
        (dict(weights="../outside/step-000000000004.weights.h5"),
         r"`weights` must name a step-N.weights.h5 file inside the directory", "read"),
        (dict(weights="/etc/passwd"), r"`weights` must name a step-N.weights.h5 file", "read"),
        (dict(weights="step-000000000009.weights.h5"), r"which is missing", "read"),
        (dict(seed_states=[[1, -2]]), r"a seed state is not a list of uint32", "read"),
        (dict(extra=1), r"unknown fields \['extra'\]", "read"),
        (dict(backend=3), r"`backend` has the wrong type. Received: backend=3", "read"),
        (dict(stopped=1), r"`stopped` has the wrong type. Received: stopped=1", "read"),
        # Before: a raw TypeError from the comparison with the model.
        (dict(variables=[1]),
         r"`variables\[0\]` must be \[path, shape, dtype\]. Received: variables\[0\]=1", "read"),
        (dict(variables=[["w", [4, -3], "float32"]]), r"Received: variables\[0\]=\['w', \[4, -3\]", "read"),
        # Before: the weights were loaded, then assigning the state failed.
        (dict(seed_states=[[1]]),
         r"is invalid: `seed_states\[0\]` has 1 value\(s\), the state of seed generator "
         r"\S+ has shape \(2,\). Received: seed_states\[0\]=\[1\]", "fit"),
        (dict(global_seed_state=[1, 2, 3]),
         r"is invalid: `global_seed_state` has 3 value\(s\), Keras' global seed generator "
         r"state has shape \(2,\)", "fit"),
        # Before: PyTorch's errors at the first step, after the weights loaded.
        (dict(torch_rng_states=[]),
         r"`torch_rng_states` must hold PyTorch's CPU generator state .*"
         r"Received: torch_rng_states=\[\]", "read"),
        (dict(torch_rng_states=[[1, 2, 3]], backend="torch"),
         r"is invalid: `torch_rng_states\[0\]` has 3 bytes, PyTorch's CPU generator state "
         r"has 5056", "fit"),
        (dict(torch_rng_states=[[1, 256]]),
         r"`torch_rng_states` must be lists of bytes. Received: torch_rng_states\[0\]=\[1, 256\]",
         "read"),
        (lambda m: dict(torch_rng_states=m["torch_rng_states"] + [[0] * 16], backend="torch"),
         r"is invalid: `torch_rng_states` holds (\d+) PyTorch generator state\(s\) .* "
         r"this process has (?!\1)\d+", "fit"),
        (dict(torch_rng_states=None, backend="torch"),
         r"`torch_rng_states` is null but the checkpoint's backend is 'torch'", "read"),
        (dict(torch_rng_states=[_TORCH_CPU_STATE], backend="jax"),
         r"`torch_rng_states` is set but the checkpoint's backend is 'jax'", "read"),
    ],
    ids=["json", "list", "negative_batch", "batch_too_large", "string_step", "bool_epoch",
         "dotdot", "absolute", "missing_weights", "seed", "unknown_field", "backend_type", "stopped_type",
         "variables_entry", "variables_shape", "seed_length", "global_seed_length",
         "torch_states_empty", "torch_state_length", "torch_state_bytes", "torch_state_count",
         "torch_states_missing",
         "torch_states_not_torch"],
)
def test_tampered_checkpoint_is_refused_with_one_line(
    small_checkpoint, tmp_path, tamper, match, found_by
):
    # Before: raw JSONDecodeError/AttributeError/h5py errors; `../` paths
    # followed; batch=-3 trained extra steps.
    if BACKEND != "torch" and "torch_rng_states" in match and found_by == "fit":
        pytest.skip("PyTorch's generator states are checked on the torch backend")
    if isinstance(tamper, str):
        directory = _copy(small_checkpoint, tmp_path)
        (directory / "checkpoint.json").write_text(tamper)
    else:
        if callable(tamper):
            tamper = tamper(json.loads((small_checkpoint / "checkpoint.json").read_text()))
        directory = _copy(small_checkpoint, tmp_path, **tamper)
    backup = training.BackupAndResume(directory)
    if found_by == "read":
        with pytest.raises(ValueError, match=match):
            backup.read_checkpoint()
    else:  # a well-formed file: only this model and process can tell
        assert backup.read_checkpoint()["step"] == 4
    # `fit` refuses it before anything is loaded, in one line naming the file.
    model = _small_model()
    before = [keras.ops.convert_to_numpy(v) for v in model.variables]
    with pytest.raises(ValueError, match=match) as error:
        _small_fit(model, directory)
    message = str(error.value)
    assert "\n" not in message and str(directory / "checkpoint.json") in message
    for a, b in zip(before, [keras.ops.convert_to_numpy(v) for v in model.variables]):
        np.testing.assert_array_equal(a, b)


def test_weights_file_of_another_step_or_damaged_is_refused(small_checkpoint, tmp_path):
    """Issue 21: a step file replaced by another run's (another optimizer
    step) was loaded, and the run ended early; a damaged one gave h5py's
    traceback. Both are refused before the model changes; nothing is
    deleted."""
    other = tmp_path / "other"
    _small_fit(_small_model(), other, epochs=1)  # 2 steps
    weights = "step-000000000004.weights.h5"
    for name, damage, match in (
        ("replaced", lambda path: shutil.copy(other / "step-000000000002.weights.h5", path),
         f"{weights} holds optimizer step 2, `checkpoint.json` records step 4"),
        ("truncated", lambda path: path.write_bytes(path.read_bytes()[:3000]),
         f"weights file {tmp_path / 'truncated' / 'copy' / weights} cannot be read .*damaged or truncated"),
    ):
        directory = _copy(small_checkpoint, tmp_path / name)
        damage(directory / weights)
        files = {p.name: p.read_bytes() for p in directory.iterdir() if p.name != "backup.lock"}
        model = _small_model()
        before = [keras.ops.convert_to_numpy(v) for v in model.variables]
        with pytest.raises(ValueError, match=match) as error:
            _small_fit(model, directory)
        assert "\n" not in str(error.value)
        for a, b in zip(before, [keras.ops.convert_to_numpy(v) for v in model.variables]):
            np.testing.assert_array_equal(a, b)
        assert {p.name: p.read_bytes() for p in directory.iterdir() if p.name != "backup.lock"} == files
        assert _lock_is_free(directory)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full (every write: ENOSPC)")
def test_a_full_disk_stops_with_one_message_and_keeps_the_last_checkpoint(tmp_path):
    """Issue 21: a full disk gave 85 h5py tracebacks, then a segfault. The
    step-3 file is written to /dev/full (a disk that is always full)."""
    directory = tmp_path / "backup"
    directory.mkdir()
    (directory / ".tmp-step-000000000003.weights.h5").symlink_to("/dev/full")
    with pytest.raises(training.CheckpointWriteError) as error:
        _small_fit(_small_model(), directory)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"Writing the checkpoint of step 3 in {directory} failed: the disk is full. "
                               "The last good checkpoint is kept (step-000000000002.weights.h5); free space and ")
    assert sorted(os.listdir(directory)) == ["backup.lock", "checkpoint.json", "step-000000000002.weights.h5"]
    # Space again: the same command resumes from step 2 and ends at step 4.
    model = _small_model()
    backup = _small_fit(model, directory)
    assert backup.resumed_from["step"] == 2
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4


def test_a_disk_too_full_for_the_next_checkpoint_is_refused_before_writing(tmp_path, monkeypatch):
    """On a real full disk (a tmpfs) the error came, then the process died
    of a segmentation fault as it exited: h5py's half-written file, which
    Keras' `save_weights` leaves open, fails its flush at the exit. The
    checkpoint is now refused before its file is begun. Here the disk
    reports 1,000 bytes free from the third save on."""
    from keras_vit.training import callbacks

    real, calls = shutil.disk_usage, []

    def disk_usage(path):
        calls.append(path)
        usage = real(path)
        return usage._replace(free=1000) if len(calls) >= 3 else usage

    monkeypatch.setattr(callbacks.shutil, "disk_usage", disk_usage)
    saves = []
    model = _small_model()
    model.save_weights = lambda *args, **kwargs: (saves.append(args[0]), keras.Model.save_weights(model, *args,
                                                                                                 **kwargs))
    directory = tmp_path / "backup"
    with pytest.raises(training.CheckpointWriteError, match=(
            rf"^Writing the checkpoint of step 3 in {directory} failed: the disk is full \(the checkpoint needs "
            r"about 0.\d MiB and 0.0 MiB are free; nothing was written\). The last good checkpoint is kept "
            r"\(step-000000000002.weights.h5\); free space and run the same command again")):
        _small_fit(model, directory)
    assert len(saves) == 2  # the third was never begun
    assert sorted(os.listdir(directory)) == ["backup.lock", "checkpoint.json", "step-000000000002.weights.h5"]
    monkeypatch.undo()
    model = _small_model()
    assert _small_fit(model, directory).resumed_from["step"] == 2
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4


def test_a_backup_dir_that_cannot_hold_the_lock_is_named(tmp_path):
    # A folder named backup.lock (or a read-only disk) gave the system's bare IsADirectoryError.
    (tmp_path / "backup.lock").mkdir(parents=True)
    with pytest.raises(training.CheckpointWriteError, match=rf"The backup directory {tmp_path} cannot hold the run's "
                                                            rf"lock file backup.lock: Is a directory\. .* Received: "
                                                            rf"backup_dir='{tmp_path}'"):
        _small_fit(_small_model(), tmp_path)


def test_backup_dir_expands_the_home_folder(tmp_path, monkeypatch):
    # "~/ckpt" made a folder named "~" in the working directory; every other
    # keras_vit path expands it.
    monkeypatch.setenv("HOME", str(tmp_path))
    assert training.BackupAndResume("~/ckpt").backup_dir == str(tmp_path / "ckpt")


def test_a_checkpoint_failure_not_of_the_disk_says_so(tmp_path):
    """A RuntimeError that is not the disk's (JAX's "Fetching value for
    jax.Array that spans non-addressable devices": weights sharded over
    hosts) advised freeing space, forever."""
    model = _small_model()

    def save_weights(*args, **kwargs):
        raise RuntimeError("Fetching value for jax.Array that spans non-addressable devices is not possible")

    model.save_weights = save_weights
    with pytest.raises(training.CheckpointWriteError, match=r"failed: RuntimeError: Fetching value .* \(none was "
                                                            r"written yet\); fix that and run the same command"):
        _small_fit(model, tmp_path / "backup")


def test_a_failure_on_process_0_stops_every_process(tmp_path, monkeypatch):
    """In a multi-process run only process 0 takes the lock and writes: its
    refusal or failed write left the others in JAX's collectives until they
    timed out (5 minutes, then a fatal error), and a backup directory that
    only process 0 saw failed in device_put. Here as process 1, with what
    `distribute.all_processes` gathers scripted (a real allgather with 2
    processes is tests/test_distribute.py's)."""
    def gathered(*answers):  # what each call returns, [process 0, process 1]
        script = list(answers)
        return lambda value: script.pop(0)

    monkeypatch.setattr(distribute, "process_index", lambda: 1)
    monkeypatch.setattr(distribute, "all_processes", gathered([1, 0]))
    with pytest.raises(RuntimeError, match=r"^Process 0 could not take the backup directory .*stops with it"):
        _small_fit(_small_model(), tmp_path / "lock")
    monkeypatch.setattr(distribute, "all_processes", gathered([0, 0], [-1, -1], [1, 0]))
    with pytest.raises(training.CheckpointWriteError, match=r"^Process 0 could not write the checkpoint of step 1"):
        _small_fit(_small_model(), tmp_path / "write")
    monkeypatch.setattr(distribute, "all_processes", gathered([0, 0], [3, -1]))
    with pytest.raises(ValueError, match=r"different checkpoints in .* \(process 0: step 3, process 1: none\): "
                                         r"`backup_dir` must be on a file system every process sees"):
        _small_fit(_small_model(), tmp_path / "unshared")
    assert not os.path.exists(tmp_path / "unshared") or "checkpoint.json" not in os.listdir(tmp_path / "unshared")


def _other_backend_checkpoint(small_checkpoint, tmp_path, backend):
    """The small checkpoint as the `backend` backend writes it (None: as a
    keras_vit that did not record the backend wrote it on this one)."""
    directory = _copy(small_checkpoint, tmp_path)
    metadata = json.loads((directory / "checkpoint.json").read_text())
    if backend is None:
        del metadata["backend"]
    else:
        metadata["backend"] = backend
        metadata["torch_rng_states"] = [_TORCH_CPU_STATE] if backend == "torch" else None
    (directory / "checkpoint.json").write_text(json.dumps(metadata))
    return directory


@pytest.mark.parametrize("other", sorted({"jax", "tensorflow", "torch"} - {BACKEND}))
def test_checkpoint_of_another_backend_is_refused(small_checkpoint, tmp_path, other):
    # Before: resumed with the random state of another backend's generators
    # (not the run that was interrupted), or PyTorch's RuntimeError mid-fit.
    assert json.loads((small_checkpoint / "checkpoint.json").read_text())["backend"] == BACKEND
    directory = _other_backend_checkpoint(small_checkpoint, tmp_path, other)
    assert training.BackupAndResume(directory).read_checkpoint()["backend"] == other
    model = _small_model()
    before = [keras.ops.convert_to_numpy(v) for v in model.variables]
    with pytest.raises(ValueError) as error:
        _small_fit(model, directory)
    assert str(error.value) == (
        f"The checkpoint {directory / 'checkpoint.json'} was written on the {other!r} "
        f"backend, but this run uses {BACKEND!r}: the random state does not carry over "
        "between backends, so the resume would not be exact. Resume with "
        f"KERAS_BACKEND={other}, or use another `backup_dir`. Received: backend={BACKEND!r}"
    )
    for a, b in zip(before, [keras.ops.convert_to_numpy(v) for v in model.variables]):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_of_another_keras_version_is_refused_naming_both_or_resumes(small_checkpoint, tmp_path):
    """Keras 3.10 and 3.15 write a model's config differently (e.g.
    `input_layers`): the same command was refused as "another run", with
    "resume with the same command" as the advice."""
    assert json.loads((small_checkpoint / "checkpoint.json").read_text())["keras_version"] == keras.__version__
    metadata = json.loads((small_checkpoint / "checkpoint.json").read_text())
    config = dict(metadata["model_config"], added_in_another_keras=None)
    directory = _copy(small_checkpoint, tmp_path / "config", keras_version="3.9.0", model_config=config)
    before = sorted(os.listdir(directory))
    with pytest.raises(ValueError) as error:
        _small_fit(_small_model(), directory)
    assert re.fullmatch(
        rf"The checkpoint in {re.escape(str(directory))} was written with Keras 3\.9\.0, and this run has Keras "
        rf"{re.escape(keras.__version__)}, which describes the run differently \(model config[^)]*"
        r"added_in_another_keras.*\)\. Resume with the Keras that wrote it \(`pip install keras==3\.9\.0`\), "
        r"or use another `backup_dir`\.", str(error.value)), str(error.value)
    assert sorted(os.listdir(directory)) == before  # nothing lost
    # Another Keras that describes the run alike resumes.
    directory = _copy(small_checkpoint, tmp_path / "same", keras_version="3.9.0")
    assert _small_fit(_small_model(), directory).resumed_from["step"] == 4


def test_a_learning_rate_changed_by_a_callback_resumes(tmp_path):
    """`LearningRateScheduler` (or `ReduceLROnPlateau`) changes the rate as
    the run goes: every checkpoint after a change was refused as "another
    run" ("learning_rate is 0.025 in the checkpoint, 0.05 in this run"),
    so the run could not be resumed at all. The run is the command's, and
    the restored optimizer carries the changed rate on."""

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == 5:
                raise KeyboardInterrupt("simulated kill")

    def run(backup_dir, *extra, model=None):
        model = model or _small_model(optimizer=keras.optimizers.SGD(0.05))
        halve = keras.callbacks.LearningRateScheduler(lambda epoch: 0.05 / 2 ** epoch)
        model.fit(SMALL_X, SMALL_Y, batch_size=2, epochs=3, shuffle=False, verbose=0,
                  callbacks=[halve, training.BackupAndResume(backup_dir, save_freq=1), *extra])
        return model

    reference = run(tmp_path / "reference")
    for retry in (False, True):  # a new process's model, or the same model retried in this one
        directory = tmp_path / f"resumed_{retry}"
        model = _small_model(optimizer=keras.optimizers.SGD(0.05))
        with pytest.raises(KeyboardInterrupt):
            run(directory, Crash(), model=model)
        resumed = run(directory, model=model if retry else None)
        assert float(keras.ops.convert_to_numpy(resumed.optimizer.learning_rate)) == pytest.approx(0.0125)
        for a, b in zip(reference.get_weights(), resumed.get_weights()):
            np.testing.assert_array_equal(a, b)
    # Another rate in the command is still another run.
    model = _small_model(optimizer=keras.optimizers.SGD(0.01))
    with pytest.raises(ValueError, match=r"optimizer.config.learning_rate is 0.05\d* in the checkpoint, 0.0099\d* in"):
        model.fit(SMALL_X, SMALL_Y, batch_size=2, epochs=3, verbose=0,
                  callbacks=[training.BackupAndResume(tmp_path / "resumed_False")])


def test_a_run_a_callback_stopped_is_finished(tmp_path):
    """`EarlyStopping` ended the run at epoch 2 of 6: the same command again
    trained the 4 epochs left (the checkpoint said "epoch 2 done")."""
    def run():
        model = _small_model(optimizer=keras.optimizers.SGD(0.05))
        stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)  # stops after epoch 2
        backup = training.BackupAndResume(tmp_path / "backup", save_freq=1)
        history = model.fit(SMALL_X, SMALL_Y, batch_size=4, epochs=6, shuffle=False, verbose=0,
                            callbacks=[stop, backup])
        return model, backup, history

    first, backup, history = run()
    assert len(history.epoch) == 2 and backup.read_checkpoint()["stopped"] is True
    again, backup, history = run()
    assert history.epoch == [] and int(keras.ops.convert_to_numpy(again.optimizer.iterations)) == 4
    for a, b in zip(first.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)
    # `TerminateOnNaN`'s stop (stop_on_nan=False) is no finished run: NaN weights.
    model = _small_model(optimizer=keras.optimizers.SGD(0.05))
    backup = training.BackupAndResume(tmp_path / "nan", save_freq=1, stop_on_nan=False)
    model.fit(np.full_like(SMALL_X, np.nan), SMALL_Y, batch_size=4, epochs=6, verbose=0,
              callbacks=[keras.callbacks.TerminateOnNaN(), backup])
    assert "stopped" not in backup.read_checkpoint()


def test_checkpoint_without_backend_field_resumes_or_is_refused(small_checkpoint, tmp_path):
    # Written before `backend` was recorded: still resumed on its backend...
    directory = _other_backend_checkpoint(small_checkpoint, tmp_path / "same", None)
    backup = _small_fit(_small_model(), directory)
    assert backup.resumed_from["step"] == 4 and "backend" not in backup.resumed_from
    assert backup.read_checkpoint()["step"] == 4  # nothing more to train
    # ... and refused where torch and not-torch differ (what it can tell).
    directory = _other_backend_checkpoint(small_checkpoint, tmp_path / "other", None)
    metadata = json.loads((directory / "checkpoint.json").read_text())
    metadata["torch_rng_states"] = None if BACKEND == "torch" else [_TORCH_CPU_STATE]
    (directory / "checkpoint.json").write_text(json.dumps(metadata))
    written_on = (
        r"a backend other than 'torch' \(it has no `torch_rng_states`\)" if BACKEND == "torch"
        else r"the 'torch' backend"
    )
    with pytest.raises(ValueError, match=rf"was written on {written_on}, but this run uses "
                       rf"'{BACKEND}'.* Received: backend='{BACKEND}'$"):
        _small_fit(_small_model(), directory)


def test_delete_on_finish_deletes_only_the_callbacks_files(tmp_path):
    # Before: every file in the directory was deleted, and a subfolder made
    # `fit` raise after the checkpoint was gone.
    directory = tmp_path / "backup"
    (directory / "mine").mkdir(parents=True)
    (directory / "mine" / "data.txt").write_text("user")
    (directory / "notes.weights.h5").write_text("user")
    (directory / "notes.txt").write_text("user")
    _small_fit(_small_model(), directory, delete_on_finish=True)
    assert sorted(os.listdir(directory)) == ["mine", "notes.txt", "notes.weights.h5"]
    assert (directory / "mine" / "data.txt").read_text() == "user"
    # Alone in its directory, the directory goes too.
    alone = tmp_path / "alone"
    _small_fit(_small_model(), alone, delete_on_finish=True)
    assert not alone.exists()


@pytest.mark.one_backend  # the backup directory's OS lock: the same on every backend
def test_a_second_run_on_the_directory_is_refused_until_the_first_dies(tmp_path):
    # Before: two runs wrote into one directory and one of them crashed with
    # FileNotFoundError. A lock held by a SIGKILLed process does not block.
    directory = tmp_path / "backup"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(directory)], cwd=ROOT,
        env=child_env(KERAS_BACKEND=BACKEND), stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert not _lock_is_free(directory)
        with pytest.raises(RuntimeError, match=rf"Another run is using the backup directory .*"
                           rf"\(pid {holder.pid} on "):
            _small_fit(_small_model(), directory)
    finally:
        holder.kill()
        holder.wait()
    assert _lock_is_free(directory)
    # `_lock_is_free` sees a lock this process holds too.
    training.callbacks._acquire_lock(directory)
    assert not _lock_is_free(directory)
    backup = _small_fit(_small_model(), directory)  # the stale lock is gone
    assert backup.read_checkpoint()["step"] == 4
    # A run in this process that raised does not block the next one.
    with pytest.raises(ValueError, match="2 epochs, but this `fit` has 3"):
        _small_fit(_small_model(), directory, epochs=3)
    _small_fit(_small_model(), directory)


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_a_lock_file_removed_while_it_is_taken_is_taken_again(tmp_path, monkeypatch):
    """A run finishing with `delete_on_finish=True` released its lock, then
    removed backup.lock: a run that had opened the file just before locked
    a removed file, and a third run locked a new one beside it (two runs
    on one directory, each deleting the other's checkpoints). The finishing
    run now removes the file first, and `acquire` locks the file that is at
    the path."""
    import fcntl

    from keras_vit import locks

    path = tmp_path / "backup.lock"
    path.write_text("pid 1 on a finishing run\n")
    real, calls = fcntl.flock, []

    def flock(handle, operation):
        calls.append(operation)
        if len(calls) == 1:
            path.unlink()  # between this process's open and its lock
        return real(handle, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    assert locks.acquire(str(path)) is None and len(calls) == 2
    monkeypatch.undo()
    try:
        other = "import fcntl, sys; fcntl.flock(open(sys.argv[1]), fcntl.LOCK_EX | fcntl.LOCK_NB)"
        done = subprocess.run([sys.executable, "-c", other, str(path)], capture_output=True, text=True)
        assert done.returncode != 0 and "BlockingIOError" in done.stderr  # held: another run is refused
        assert path.read_text().startswith(f"pid {os.getpid()} on ")
    finally:
        locks.release(str(path))


def test_locks_on_a_file_system_without_flock(tmp_path, monkeypatch):
    """Some network and FUSE mounts answer `flock` with ENOLCK: no lock
    there (as on Windows), not "another run holds it" for every run."""
    import errno
    import fcntl

    from keras_vit import locks

    def no_flock(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    path = str(tmp_path / "run.lock")
    assert locks.acquire(path) is None and locks.holder(path) is None
    _small_fit(_small_model(), tmp_path / "backup")  # BackupAndResume trains there


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras' PyTorch trainer has no steps_per_execution")
def test_an_execution_past_the_epoch_end_still_resumes(tmp_path):
    """3 steps per epoch, 2 per execution: Keras runs 4 and says batch 3.
    The checkpoint recorded 4 batches of a 3-batch epoch, and running the
    same command again was refused ("batch must be <= steps_per_epoch=3")."""
    import tensorflow as tf

    batches = tf.data.Dataset.from_tensor_slices((SMALL_X, SMALL_Y)).batch(2).repeat()

    def run():
        model = _small_model()
        model.compile(optimizer="sgd", loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                      steps_per_execution=2)
        model.fit(batches, steps_per_epoch=3, epochs=2, verbose=0, shuffle=False,
                  callbacks=[training.BackupAndResume(tmp_path, save_freq="epoch")])
        return model.get_weights()

    with pytest.warns(UserWarning, match=r"steps_per_epoch=3 is not a multiple of steps_per_execution=2: Keras "
                                         r"runs whole executions \(4 batches an epoch\)"):
        first = run()
    for a, b in zip(first, run()):  # the second trains no further
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras' PyTorch trainer has no steps_per_execution")
def test_a_mid_epoch_checkpoint_resumes_only_with_whole_executions(tmp_path):
    """Saved after batch 3 with one batch per call and resumed with two, the
    skip read batches 0-3 (one never trained on) and the run ended an update
    short without a word. Keras 3.10 names a call's first batch where newer
    versions name its last: two batches per call counted as one fewer there."""
    import tensorflow as tf

    batches = tf.data.Dataset.from_tensor_slices((SMALL_X, SMALL_Y)).batch(2).repeat()

    class Crash(keras.callbacks.Callback):
        def __init__(self, at):
            super().__init__()
            self.at = at

        def on_train_batch_begin(self, batch, logs=None):
            if batch == self.at:
                raise RuntimeError("crash")

    def run(directory, per_call, *callbacks):
        model = _small_model(optimizer="sgd")
        model.compile(optimizer="sgd", loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                      steps_per_execution=per_call)
        model.fit(batches, steps_per_epoch=6, epochs=1, verbose=0, shuffle=False,
                  callbacks=[training.BackupAndResume(directory, save_freq=per_call), *callbacks])
        return model

    uninterrupted = run(tmp_path / "whole", 1)
    directory = tmp_path / "backup"
    with pytest.raises(RuntimeError, match="crash"):
        run(directory, 1, Crash(at=3))
    pointer = json.loads((directory / "checkpoint.json").read_text())
    assert (pointer["batch"], pointer["step"], pointer["steps_per_execution"]) == (3, 3, 1)
    files = {name: (directory / name).read_bytes() for name in os.listdir(directory) if name != "backup.lock"}
    with pytest.raises(ValueError, match=r"written after batch 3 of epoch 0 \(with steps_per_execution=1\), not a "
                                         r"whole number of executions of 2 batches: .* Compile with "
                                         r"steps_per_execution=1 \(or one dividing 3\).* Received: "
                                         r"steps_per_execution=2"):
        run(directory, 2)
    assert {name: (directory / name).read_bytes() for name in files} == files
    resumed = run(directory, 3)  # one whole call of 3 skipped
    assert int(keras.ops.convert_to_numpy(resumed.optimizer.iterations)) == 6
    for a, b in zip(resumed.get_weights(), uninterrupted.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    # Two batches per call, stopped at the third call: 4 batches trained and recorded.
    pairs = tmp_path / "pairs"
    with pytest.raises(RuntimeError, match="crash"):
        run(pairs, 2, Crash(at=4))
    pointer = json.loads((pairs / "checkpoint.json").read_text())
    assert (pointer["batch"], pointer["step"], pointer["steps_per_execution"]) == (4, 4, 2)


def test_saves_within_one_accumulated_update_never_overwrite_the_pointers_file(tmp_path):
    """With 2 micro-batches per update and a save after each batch, two saves
    share an update's step: the second overwrote the weights file the
    pointer named, and a kill before the pointer moved paired the batch-2
    record with the batch-3 weights (resumed 0.016 off, without a word)."""
    directory, copy = tmp_path / "backup", tmp_path / "after_batch_3"

    class Record(keras.callbacks.Callback):
        names = []

        def on_train_batch_begin(self, batch, logs=None):
            pointer = directory / "checkpoint.json"
            if pointer.exists():
                self.names.append(json.loads(pointer.read_text())["weights"])
                if len(self.names) == 3 and not copy.exists():  # the checkpoint of micro-batch 3 (update 1)
                    shutil.copytree(directory, copy, ignore=shutil.ignore_patterns("backup.lock"))

    def run(backup_dir, callbacks=()):
        model = _small_model(optimizer=training.MomentumSGD(0.1, gradient_accumulation_steps=2))
        model.fit(np.concatenate([SMALL_X] * 2), np.concatenate([SMALL_Y] * 2), batch_size=2, epochs=1,
                  shuffle=False, verbose=0, callbacks=[training.BackupAndResume(backup_dir, save_freq=1), *callbacks])
        return model

    reference = run(directory, [Record()])
    assert Record.names[:4] == ["step-000000000000.weights.h5", "step-000000000001.weights.h5",
                                "step-000000000001-0-3.weights.h5", "step-000000000002.weights.h5"]
    resumed = run(copy)
    for a, b in zip(reference.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_resume_restores_the_random_state(tmp_path):
    """In process: a run resumed from the checkpoint its uninterrupted twin
    wrote after epoch 0 (an epoch boundary, unlike the SIGKILL test) draws
    the same dropout masks (the SeedGenerator states, the global one and
    PyTorch's generators are in the checkpoint) and ends identical."""
    directory, copy = tmp_path / "backup", tmp_path / "after_epoch_0"

    reference = _small_model()
    keras.random.uniform((1,))  # creates Keras' global seed generator
    reference.fit(
        SMALL_X, SMALL_Y, batch_size=4, epochs=2, shuffle=False, verbose=0,
        callbacks=[training.BackupAndResume(directory, save_freq=1), CopyCheckpointAfterEpoch0(directory, copy)],
    )
    resumed = _small_model()
    keras.random.uniform((1,))  # another global state
    backup = _small_fit(resumed, copy, epochs=2)  # resumes after step 2
    assert backup.resumed_from["step"] == 2
    for a, b in zip(resumed.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(a, b)
    saved = backup.resumed_from["global_seed_state"]
    assert saved is not None and training.callbacks._global_seed_state() == saved


def test_restore_then_fit_initial_epoch_resumes_through_public_keras(tmp_path, monkeypatch):
    """Issue 22: `restore` loads an epoch-end checkpoint before `fit` and
    returns the epoch; `fit(initial_epoch=...)` resumes from it with no
    private seam (the train function is never swapped, `_initial_epoch`
    never written) and ends identical to the uninterrupted run, random
    state included. A mid-epoch checkpoint is refused, lock released."""
    directory, copy = tmp_path / "backup", tmp_path / "after_epoch_0"

    reference = _small_model()
    reference.fit(SMALL_X, SMALL_Y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                  callbacks=[training.BackupAndResume(directory, save_freq="epoch"), CopyCheckpointAfterEpoch0(directory, copy)])
    resumed = _small_model()
    backup = training.BackupAndResume(copy, save_freq="epoch")
    monkeypatch.setattr(training.callbacks, "_set_initial_epoch", None)  # any call fails
    monkeypatch.setattr(backup, "_wrap_train_function", None)
    steps_per_epoch = len(SMALL_X) // 4
    initial_epoch = backup.restore(resumed, epochs=2, steps_per_epoch=steps_per_epoch)
    assert initial_epoch == 1 and backup.resumed_from["step"] == 2
    assert not _lock_is_free(copy)  # held from `restore` until `fit` ends
    history = resumed.fit(SMALL_X, SMALL_Y, batch_size=4, epochs=2, initial_epoch=initial_epoch, shuffle=False,
                          verbose=0, callbacks=[backup])
    assert history.epoch == [1] and _lock_is_free(copy)
    assert int(keras.ops.convert_to_numpy(resumed.optimizer.iterations)) == 4
    for a, b in zip(resumed.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert training.BackupAndResume(tmp_path / "empty").restore(
        _small_model(), epochs=2, steps_per_epoch=steps_per_epoch) == 0
    # Not compiled: named, no lock left (an AttributeError on `optimizer`, the lock kept).
    bare = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="bare")
    with pytest.raises(ValueError, match="needs the compiled model of the run.*Received: model='bare', not compiled"):
        training.BackupAndResume(tmp_path / "uncompiled").restore(bare)
    assert not (tmp_path / "uncompiled" / "backup.lock").exists()
    # `fit` with other epochs than the checkpoint's, after a `restore` told
    # nothing of them: refused like any other run's (it trained on and
    # overwrote the record), the lock released.
    other = training.BackupAndResume(copy, save_freq="epoch")
    model = _small_model()
    start = other.restore(model)
    with pytest.raises(ValueError, match=r"2 epochs, but this `fit` has 5"):
        model.fit(SMALL_X, SMALL_Y, batch_size=4, epochs=5, initial_epoch=start, verbose=0, callbacks=[other])
    assert _lock_is_free(copy)
    # A checkpoint of step 1, mid-epoch (batch 1 of 2; the run then
    # crashed): refused by `restore`, its lock released.
    mid = tmp_path / "mid"

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        _small_model().fit(SMALL_X, SMALL_Y, batch_size=4, epochs=1, shuffle=False, verbose=0,
                           callbacks=[training.BackupAndResume(mid, save_freq=1), Crash()])
    with pytest.raises(ValueError, match=r"written mid-epoch \(batch 1 of epoch 0\)"):
        training.BackupAndResume(mid).restore(_small_model(), epochs=1, steps_per_epoch=steps_per_epoch)
    assert _lock_is_free(mid)


# --- Private Keras seams: fail loudly when Keras changes them ----------------


def test_keras_seams_used_by_resume_still_hold():
    """BackupAndResume relies on four things Keras does not document (see
    docs/training.md, "Private Keras seams"): this test breaks when one of
    them changes."""
    model = _small_model()
    # 1. `fit` starts at `model._initial_epoch` when set.
    model._initial_epoch = 2
    history = model.fit(SMALL_X, SMALL_Y, batch_size=4, epochs=3, verbose=0)
    model._initial_epoch = None
    assert history.epoch == [2]
    # 2. `model.train_function` is set before `on_train_begin` and called
    # with the backend's arguments: (state, iterator) -> (logs, state) on
    # JAX, (iterator) on TensorFlow, (batch) on PyTorch.
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            original = self.model.train_function
            assert callable(original)

            def spy(*args):
                seen.append(args)
                return original(*args)

            self.model.train_function = spy

    model.fit(SMALL_X, SMALL_Y, batch_size=4, epochs=1, verbose=0, callbacks=[Spy()])
    assert len(seen) == 2
    if BACKEND == "jax":
        state, iterator = seen[0]
        assert isinstance(state, tuple) and hasattr(iterator, "__next__")
    elif BACKEND == "tensorflow":
        assert len(seen[0]) == 1 and hasattr(seen[0][0], "__next__")
    else:
        assert len(seen[0]) == 1 and not hasattr(seen[0][0], "__next__")
    # 3. SeedGenerator states are variables named "seed_generator_state",
    # listed in `model.variables` and left out of `save_weights`.
    states = training.callbacks._seed_states(model)
    assert len(states) == 1 and id(states[0]) not in {id(w) for w in model.weights}
    # 4. The global seed generator is reachable.
    keras.random.uniform((1,))
    assert len(training.callbacks._global_seed_state()) == 2
    from keras_vit import distribute

    assert distribute.process_index() == 0


# --- Multi-process JAX: one writer, every process resumes at the same step --

MP_STEPS, MP_KILL_AFTER = 4, 3  # 2 epochs of 4 steps; killed after step 3


def _mp_worker():
    """One of 2 JAX processes x 2 CPU devices, data parallel over the 4;
    both pass the global batches of 8 as a `tf.data.Dataset` and Keras
    shards them, each process reading its own half."""
    keras.distribution.initialize()
    index = int(os.environ["KERAS_DISTRIBUTION_PROCESS_ID"])
    distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    keras.distribution.set_distribution(distribution)
    workdir = os.environ["KERAS_VIT_TEST_WORKDIR"]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(MP_STEPS * 8, 4)).astype("float32")
    y = np.eye(2, dtype="float32")[rng.integers(0, 2, MP_STEPS * 8)]
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model = _small_model()
    writes = []
    save_weights = model.save_weights
    model.save_weights = lambda *a, **k: (writes.append(a[0]), save_weights(*a, **k))[1]
    backup = training.BackupAndResume(os.path.join(workdir, "backup"), save_freq=1)

    class KillAll(keras.callbacks.Callback):  # every worker dies at the same step
        def on_train_batch_end(self, batch, logs=None):
            marker = os.path.join(workdir, f"killed-{index}")
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            if step == MP_KILL_AFTER and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

    model.fit(dataset, epochs=2, verbose=0, callbacks=[backup, KillAll()])
    print(json.dumps({
        "index": index,
        "resumed_from": backup.resumed_from["step"] if backup.resumed_from else None,
        "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        "writes": sum(path.startswith(workdir) for path in writes),
        "weights": [w.tolist() for w in model.get_weights()],
    }))


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


_MP_WORKER = "from tests.training.test_fault_tolerance import _mp_worker; _mp_worker()"


def _mp_run(workdir):
    xla_flags = os.environ.get("XLA_FLAGS", "")
    port = _free_port()
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _MP_WORKER],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=child_env(
                KERAS_BACKEND="jax", KERAS_VIT_TEST_WORKDIR=str(workdir),
                XLA_FLAGS=f"{xla_flags} --xla_force_host_platform_device_count=2",
                KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
                KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID=str(i),
            ),
        )
        for i in range(2)
    ]
    try:
        return [(w.wait(timeout=120), *w.communicate()) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()


@pytest.mark.skipif(BACKEND != "jax", reason="multi-process JAX")
def test_multi_process_run_writes_once_and_resumes_everywhere(tmp_path):
    killed = _mp_run(tmp_path)
    assert [rc for rc, _, _ in killed] == [-signal.SIGKILL] * 2, killed[0][2][-3000:]
    checkpoint = json.loads((tmp_path / "backup" / "checkpoint.json").read_text())
    assert checkpoint["step"] == MP_KILL_AFTER
    resumed = _mp_run(tmp_path)
    assert [rc for rc, _, _ in resumed] == [0, 0], resumed[0][2][-3000:] + resumed[1][2][-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in resumed]
    assert [r["resumed_from"] for r in reports] == [MP_KILL_AFTER] * 2
    assert [r["steps"] for r in reports] == [2 * MP_STEPS] * 2
    # Only process 0 wrote (5 saves: steps 4..8); both hold the same weights.
    assert [r["writes"] for r in reports] == [2 * MP_STEPS - MP_KILL_AFTER, 0]
    assert reports[0]["weights"] == reports[1]["weights"]
