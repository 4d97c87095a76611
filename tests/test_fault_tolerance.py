"""BackupAndResume: a run killed with SIGKILL mid-epoch and started again with
the same command resumes at its last checkpoint and ends like an
uninterrupted run; a NaN loss stops training and keeps the last good
checkpoint."""

import json
import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from tests.test_distribute import ROOT, child_env

BACKEND = keras.backend.backend()
TINY = dict(
    hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=8,
    input_shape=(16, 16, 3), num_classes=5,
)
EPOCHS, BATCHES, BATCH_SIZE = 3, 5, 4  # 15 optimizer steps
SAVE_FREQ, KILL_AFTER = 2, 7  # checkpoints at steps 2, 4, 6; killed after 7


def _job_data():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (BATCHES * BATCH_SIZE, 16, 16, 3)).astype("float32")
    y = np.eye(5, dtype="float32")[rng.integers(0, 5, BATCHES * BATCH_SIZE)]
    return x, y


def _job_model():
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
    whose loss turns NaN and a run with a changed command, so that the
    parent builds no model (a fresh process costs seconds per compile)."""
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

    # A checkpoint written by a run with another number of steps per epoch.
    changed = os.path.join(workdir, "changed")
    os.makedirs(changed)
    with open(os.path.join(changed, "checkpoint.json"), "w") as f:
        json.dump(
            {"weights": "x.weights.h5", "step": 3, "epoch": 0, "batch": 3, "steps_per_epoch": 9},
            f,
        )
    try:
        fresh.fit(
            x, y, batch_size=BATCH_SIZE, verbose=0,
            callbacks=[training.BackupAndResume(changed)],
        )
        report["changed_error"] = None
    except ValueError as error:
        report["changed_error"] = str(error)
    print(json.dumps(report))


def _run(workdir):
    env = child_env(KERAS_BACKEND=BACKEND, KERAS_VIT_TEST_WORKDIR=str(workdir))
    code = "from tests.test_fault_tolerance import _child; _child()"
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
    assert files == ["checkpoint.json", "step-000000000006.weights.h5"]

    assert report["resumed_from"]["step"] == 6
    assert report["steps"] == EPOCHS * BATCHES  # Keras' BackupAndRestore: 16
    assert report["epochs_run"] == EPOCHS - 1  # epochs 1 and 2
    assert report["reference_steps"] == EPOCHS * BATCHES
    # Same batches, same updates: the resumed run ends where the
    # uninterrupted one does.
    assert report["max_weight_difference"] < 1e-5
    # The finished run's checkpoint is kept: the same command again trains
    # no more.
    assert report["final_checkpoint"]["step"] == EPOCHS * BATCHES
    assert report["files"] == ["checkpoint.json", f"step-{EPOCHS * BATCHES:012d}.weights.h5"]


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(runs):
    report = runs[3]
    start = report["nan_start"]
    assert "loss became nan at epoch 0, batch 3" in report["nan_error"]
    assert f"last good checkpoint (step {start + 3})" in report["nan_error"]
    assert report["nan_checkpoint"]["step"] == start + 3
    assert report["nan_checkpoint"]["batch"] == 3
    assert report["nan_restored_finite"] and report["nan_restored_steps"] == start + 3


def test_changed_command_is_a_clear_error(runs):
    assert "9 steps per epoch, but this `fit` has 5" in runs[3]["changed_error"]


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="save_freq=0"):
        training.BackupAndResume("backup", save_freq=0)
    with pytest.raises(ValueError, match="backup_dir"):
        training.BackupAndResume("")
