"""`keras_vit.training.UpdateProgress` and `ThroughputTimer` on `fit` with
gradient accumulation: what they print and measure, in updates."""

import keras
import numpy as np
import pytest

from keras_vit import training
from keras_vit.training import progress as progress_module

ACCUM, UPDATES_PER_EPOCH, EPOCHS = 2, 3, 2


def fit(callbacks, initial_epoch=0):
    """2 epochs of 3 updates, each of 2 accumulated micro-batches of 4,
    then an evaluation of 2 batches of which the second is padding."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    loss = training.SoftmaxCrossEntropy()
    model.compile(optimizer=training.finetuning_optimizer(0.1, 6, warmup_steps=1, gradient_accumulation_steps=ACCUM),
                  loss=loss, weighted_metrics=training.padded_batch_metrics(loss))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * ACCUM * UPDATES_PER_EPOCH, 3)).astype("float32")
    y = np.eye(2, dtype="float32")[rng.integers(0, 2, len(x))]
    model.fit(x, y, batch_size=4, epochs=EPOCHS, initial_epoch=initial_epoch, shuffle=False, verbose=0,
              callbacks=callbacks)
    weights = np.array([1, 1, 1, 1, 0, 0, 0, 0], "float32")
    return model.evaluate(x[:8], y[:8], sample_weight=weights, batch_size=4, verbose=0, callbacks=callbacks,
                          return_dict=True)


def test_lines_count_updates_and_hide_the_example_count(capsys):
    logs = fit([training.UpdateProgress(EPOCHS * UPDATES_PER_EPOCH, UPDATES_PER_EPOCH, ACCUM, verbose=2,
                                        eval_label="'test'")])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["update 3/6", "update 6/6", "evaluation on 'test'"]
    assert all("examples" not in line for line in lines)
    # The evaluation line shows what `evaluate` returned (4 real examples).
    assert logs["examples"] == 4.0
    assert lines[-1] == f"evaluation on 'test': accuracy {logs['accuracy']:.4f}, loss {logs['loss']:.4f}"


def test_bars_count_updates_from_the_initial_epoch(capsys):
    fit([training.UpdateProgress(EPOCHS * UPDATES_PER_EPOCH, UPDATES_PER_EPOCH, ACCUM, verbose=1)], initial_epoch=1)
    out = capsys.readouterr().out
    # A resumed run (initial_epoch=1) counts on from update 4; the bar
    # ends at 3 updates of its epoch, not 6 micro-batches.
    assert "Updates 4-6 of 6" in out and "Updates 1-3" not in out
    assert "3/3" in out and "6/3" not in out
    assert "Evaluating on evaluation" in out


def test_silent(capsys):
    fit([training.UpdateProgress(6, 3, ACCUM, verbose=0)])
    assert capsys.readouterr().out == ""


def test_throughput_times_the_batches_after_the_first_ones(monkeypatch):
    clock = iter(np.arange(100.0) * 0.5)  # every reading half a second after the last
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: next(clock))
    timer = training.ThroughputTimer(skip=2)
    assert timer.images_per_second(4) is None
    fit([timer])
    # 12 micro-batches: the clock starts at the 2nd; 10 timed in 5 s.
    assert (timer.batches, timer.timed_batches, timer.elapsed) == (12, 10, 5.0)
    assert timer.images_per_second(4) == 8.0
    # The next fit (a cell run again) is timed afresh, its first batches
    # (a new compilation) left out: they were timed, 10-60x too slow.
    fit([timer])
    assert (timer.batches, timer.timed_batches, timer.elapsed) == (12, 10, 5.0)
    with pytest.raises(ValueError, match="skip=0"):
        training.ThroughputTimer(skip=0)
    # steps_per_execution=2: each call ends 2 batches (counting calls gave half the rate).
    clock = iter(np.arange(100.0) * 0.5)
    timer = training.ThroughputTimer(skip=2)
    for epoch in range(2):
        timer.on_epoch_begin(epoch)
        for batch in (1, 3, 5):
            timer.on_train_batch_end(batch)
    assert (timer.batches, timer.timed_batches, timer.elapsed) == (12, 10, 2.5)


def test_throughput_leaves_out_validation_and_phantom_batches(monkeypatch):
    """An epoch of 5 batches at 2 per call: Keras reports batch 5 for the
    last, partial call (6 counted: a rate a fifth too high, two thirds at
    5 per call); the time between an epoch's last batch and the next epoch
    (validation, checkpoints at epoch ends) was counted too (the recipes'
    images per second fell with `eval_every`)."""
    readings = np.arange(100.0) * 0.5
    clock = iter(readings)
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: next(clock))
    timer = training.ThroughputTimer(skip=2)
    timer.set_params({"steps": 5, "epochs": 2})
    for epoch in range(2):
        timer.on_epoch_begin(epoch)
        for batch in (1, 3, 5):
            timer.on_train_batch_end(batch)
        for _ in range(10):  # 5 s of validation
            next(clock)
    assert (timer.batches, timer.timed_batches, timer.elapsed) == (10, 8, 2.5)


def test_the_bar_never_passes_the_epochs_updates(capsys):
    """With steps_per_execution, Keras reports the last, partial call as a
    whole one: the bar showed 4/3 updates."""
    progress = training.UpdateProgress(6, 3, accumulation_steps=2, verbose=1)
    progress.set_params({"steps": 6, "epochs": 2})
    progress.on_epoch_begin(0)
    for batch in (3, 7):  # 4 micro-batches per call
        progress.on_train_batch_end(batch, {"loss": 1.0})
    out = capsys.readouterr().out
    assert "3/3" in out and "4/3" not in out


@pytest.mark.parametrize("kwargs, match", [
    (dict(total_updates=0, updates_per_epoch=1), "total_updates=0"),
    (dict(total_updates=4, updates_per_epoch=2.0), "updates_per_epoch=2.0"),
    (dict(total_updates=4, updates_per_epoch=2, accumulation_steps=True), "accumulation_steps=True"),
    (dict(total_updates=4, updates_per_epoch=2, verbose=3), "verbose=3"),
])
def test_arguments_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        training.UpdateProgress(**kwargs)
