"""recipes/vtab.py: the report's means and Table 9 layout on hand-made
numbers, all 19 tasks in smoke mode (mocked tfds) with one task interrupted
and resumed by the same command, and the AugReg sweep's choices."""

import csv
import os
import re

import keras
import numpy as np
import pytest

from keras_vit.data import vtab
from recipes import checks
from recipes import finetune
from recipes import inputs
from recipes import rundir
from recipes import train
from recipes import vtab as runner
from recipes.configs import VtabConfig
from tests.helpers import ROOT, fast_jax_compiles

SMOKE = ["--smoke", "--total_steps=4", "--log_every=2", "--checkpoint_every=2", "--verbose=0"]
# Training each of the 19 tasks for real costs seconds per task on CPU (a
# new head size: a new compilation with XLA); the runner's own work is the
# same either way, so a stub stands in for the training of all but DTD (the
# task that is interrupted and resumed): it still reads a training batch and
# the whole test split of every task through the runner's pipelines.
REAL_TASKS = {"dtd"}


_fast_compiles = pytest.fixture(scope="module", autouse=True, name="_fast_compiles")(fast_jax_compiles)


def _hand_made():
    """natural 10..70 (mean 40), specialized 1..4 (2.5), structured 50..57 (53.5)."""
    values = {}
    for group, start, step in (("natural", 10.0, 10.0), ("specialized", 1.0, 1.0), ("structured", 50.0, 1.0)):
        for i, task in enumerate(vtab.tasks_in_group(group)):
            values[task.key] = start + step * i
    return values


@pytest.mark.one_backend
def test_group_means_on_hand_made_numbers():
    values = _hand_made()
    means = vtab.group_means(values)
    assert means["natural"] == (40.0, 7, 7)
    assert means["specialized"] == (2.5, 4, 4)
    assert means["structured"] == (53.5, 8, 8)
    # The mean is over the 19 tasks, not over the three group means.
    assert means["mean"][1:] == (19, 19)
    assert means["mean"][0] == pytest.approx((280.0 + 10.0 + 428.0) / 19)
    # Paper names work too; missing tasks are left out and counted.
    partial = {vtab.get_task(k).name: v for k, v in values.items() if k not in ("dtd", "pets", "kitti_distance")}
    means = vtab.group_means(partial)
    assert means["natural"] == (pytest.approx((280.0 - 30.0 - 50.0) / 5), 5, 7)
    assert means["structured"] == (pytest.approx((428.0 - 55.0) / 7), 7, 8)  # KITTI-Dist is 55
    assert means["mean"][1] == 16
    # A task given twice (key and name) is refused, not one value kept.
    with pytest.raises(ValueError, match=r"gives task 'dtd' twice. Received: 'dtd' and 'DTD'"):
        vtab.group_means({"dtd": 50.0, "DTD": 60.0})
    # The paper's own Table 9 means.
    for model in vtab.PAPER_MODELS:
        paper = vtab.group_means(vtab.paper_results(model))
        assert abs(paper["mean"][0] - vtab.PAPER_MEANS[model]) < 0.05


def _ours_row(markdown):
    line = next(l for l in markdown.splitlines() if l.startswith("| ") and "paper" not in l and "Model" not in l)
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.mark.one_backend
def test_report_layout_of_table_9():
    values = _hand_made()
    rows = []
    for task in vtab.TASKS:
        done = task.key != "svhn"
        rows.append({
            "task": task.key, "name": task.name, "group": task.group,
            "status": "done" if done else "failed", "accuracy": values[task.key] if done else None,
            "learning_rate": 0.01 if done else None, "steps": 2500 if done else None,
            "val_accuracy": None, "wall_time_s": 12.0, "paper": task.paper["ViT-L/16 (I21k)"],
            "error": None if done else "DatasetNotAvailableError: put the files in /x | y",
        })
    config = VtabConfig(sweep=False, learning_rate=0.01, total_steps=2500, image_size=384, batch_size=512,
                        paper_model="ViT-L/16 (I21k)")
    markdown = runner.report_markdown(rows, "ViT-B_16 (imagenet21k)", config)
    header = next(l for l in markdown.splitlines() if l.startswith("| Model |"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells == ["Model"] + [t.name for t in vtab.TASKS] + ["Natural", "Specialized", "Structured", "Mean"]
    ours = _ours_row(markdown)
    assert ours[0] == "ViT-B_16 (imagenet21k)"
    assert ours[1:8] == ["10.0", "20.0", "30.0", "40.0", "50.0", "60.0", "–"]  # SVHN failed
    # Natural: mean of the 6 finished (10..60 = 35.0), marked as partial.
    assert ours[20:] == ["35.0*", "2.5", "53.5", f"{(210.0 + 10.0 + 428.0) / 18:.1f}*"]
    assert "| ViT-L/16 (I21k), paper | 90.8 | 84.1 |" in markdown and "| 72.7 |" in markdown
    assert "missing: SVHN" in markdown
    assert "| SVHN | natural | – | 80.9 |" in markdown and "failed: DatasetNotAvailableError" in markdown
    assert "/x / y" in markdown  # a `|` in a message cannot break the table


@pytest.mark.one_backend
def test_task_selection_and_config_checks():
    assert [t.key for t in runner.select_tasks("Clevr-Dist,dtd")] == ["dtd", "clevr_distance"]
    assert len(runner.select_tasks("structured")) == 8 and len(runner.select_tasks("all")) == 19
    with pytest.raises(ValueError, match="Received: tasks='dtd,imagenet'"):
        runner.select_tasks("dtd,imagenet")
    _, config, _ = runner.parse(["--config=augreg", "--steps_grid=500,2500", "--warmup_grid=100"])
    with pytest.raises(ValueError, match="warmup_grid"):
        runner.check_config(config)
    _, config, _ = runner.parse(["--paper_model=ViT-B/16"])
    with pytest.raises(ValueError, match="paper_model"):
        runner.check_config(config)
    # The tasks train through the fine-tuning pipeline: the pretrain
    # pipeline's AugReg presets were ignored without a word.
    for argv in (["--pipeline=pretrain", "--augreg=medium2"], ["--pipeline=pretrain", "--augmentation=resize"]):
        with pytest.raises(ValueError, match="VTAB tasks train through the fine-tuning pipeline.*--pipeline=pretrain"):
            runner.check_config(runner.parse(argv)[1])
    with pytest.raises(ValueError, match="Received: --pipeline=pretrain"):
        checks.check(finetune.parse(["--smoke", "--dataset=vtab:dtd", "--pipeline=pretrain"])[1])
    _, config, _ = runner.parse([])
    assert (config.learning_rate, config.total_steps, config.batch_size, config.image_size) == (0.01, 2500, 512, 384)
    assert config.sweep is False and runner.parse(["--config=augreg"])[1].sweep is True


class _CrashDtd(keras.callbacks.Callback):
    """Raises in DTD (the only 47-class task) after 3 updates (6
    micro-batches; the checkpoint of update 2 is written), once."""

    crashed = False

    def on_train_begin(self, logs=None):
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.model.output_shape[-1] == 47 and self.batches == 6 and not _CrashDtd.crashed:
            _CrashDtd.crashed = True
            raise RuntimeError("simulated crash in DTD")


class _CountFits(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.classes = []

    def on_train_begin(self, logs=None):
        self.classes.append(self.model.output_shape[-1])


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("vtab")
    real_train = train.train
    stubbed = {}

    def fake_train(config, run_dir, setup, **kwargs):
        key = os.path.basename(os.path.dirname(run_dir))
        assert config.dataset == f"vtab:{key}" and (config.train_split, config.test_split) == ("train800val200", "test")
        if key in REAL_TASKS:
            return real_train(config, run_dir, setup, **kwargs)
        data = inputs.load_data(config, run_dir)
        images, labels = next(iter(data.train(4)))
        assert images.shape == (4, 16, 16, 3) and labels.shape == (4, data.num_classes)
        # Evaluation batches come padded to 8 with weight-0 rows.
        batches = [(np.asarray(y), np.asarray(w)) for _, y, w in data.eval(8)]
        assert all(len(w) == 8 for _, w in batches)
        labels = np.concatenate([y[w > 0] for y, w in batches])
        accuracy = float(np.mean(labels.argmax(-1) == 0))  # "always class 0"
        stubbed[key] = 100.0 * accuracy
        return {"accuracy": accuracy, "eval_examples": len(labels), "steps": config.total_steps}

    runner_fit = pytest.MonkeyPatch()
    runner_fit.setattr(train, "train", fake_train)
    _CrashDtd.crashed = False
    try:
        first = runner.main(SMOKE + [f"--run_dir={run_dir}"], callbacks=[_CrashDtd()])
        first["error_txt"] = (run_dir / "tasks" / "dtd" / "error.txt").exists()
        first_rows = {r["task"]: dict(r) for r in first["rows"]}
        stubbed_first = dict(stubbed)
        stubbed.clear()
        counter = _CountFits()
        second = runner.main(SMOKE + [f"--run_dir={run_dir}"], callbacks=[counter])
    finally:
        runner_fit.undo()
    return run_dir, first, first_rows, stubbed_first, second, stubbed, counter


def test_all_19_tasks_in_smoke_mode_with_a_crash(smoke_runs):
    run_dir, first, rows, stubbed, *_ = smoke_runs
    assert first["failed"] == ["dtd"]
    assert list(rows) == [t.key for t in vtab.TASKS]
    assert rows["dtd"]["status"] == "failed" and "simulated crash in DTD" in rows["dtd"]["error"]
    assert first["error_txt"]
    assert set(os.listdir(run_dir)) <= rundir.RUN_ENTRIES, os.listdir(run_dir)  # what --overwrite deletes
    for key, row in rows.items():
        if key == "dtd":
            continue
        assert row["status"] == "done" and row["steps"] == 4, key
        assert row["eval_examples"] == 16 and 0.0 <= row["accuracy"] <= 100.0, key
        assert row["paper"] == vtab.get_task(key).paper["ViT-L/16 (I21k)"]
        if key in stubbed:
            assert row["accuracy"] == stubbed[key]
    assert set(stubbed) | REAL_TASKS == set(rows)


def test_interrupted_task_resumes_and_finished_ones_are_skipped(smoke_runs):
    run_dir, _, first_rows, _, second, stubbed_again, counter = smoke_runs
    assert second["failed"] == [] and not stubbed_again
    assert counter.classes == [47]  # only DTD trained again
    rows = {r["task"]: r for r in second["rows"]}
    assert rows["dtd"]["status"] == "done" and rows["dtd"]["steps"] == 4
    assert not (run_dir / "tasks" / "dtd" / "error.txt").exists()  # the failed try's, removed
    result = rundir.read_json(str(run_dir / "tasks" / "dtd" / "final" / "result.json"))
    assert result["resumed_from_step"] == 2 and result["steps"] == 4
    for key, row in rows.items():
        if key != "dtd":
            assert row == first_rows[key], key


def test_outputs_csv_json_markdown_and_chart(smoke_runs):
    run_dir, *_, second, _, _ = smoke_runs
    with open(run_dir / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["name"] for r in table] == [t.name for t in vtab.TASKS]
    assert {"accuracy", "learning_rate", "steps", "wall_time_s"} <= set(table[0])
    assert all(float(r["learning_rate"]) == 0.01 and int(r["steps"]) == 4 for r in table)
    markdown = (run_dir / "report.md").read_text()
    assert markdown == second["report"]
    ours = _ours_row(markdown)
    accuracies = {r["task"]: r["accuracy"] for r in second["rows"]}
    assert ours[1:20] == [f"{accuracies[t.key]:.1f}" for t in vtab.TASKS]
    means = vtab.group_means(accuracies)
    assert ours[20:] == [f"{means[g][0]:.1f}" for g in ("natural", "specialized", "structured", "mean")]
    png = (run_dir / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert re.search(r"ViT \(random init\)", markdown)


def test_another_paper_row_rewrites_the_report(smoke_runs, capsys):
    """`--paper_model` chooses the report's paper row only: the same run
    directory takes another (it was refused as another config, with advice
    to --overwrite every finished task), and the report shows its numbers."""
    run_dir, *_ = smoke_runs
    again = runner.main(SMOKE + [f"--run_dir={run_dir}", "--paper_model=ViT-H/14 (JFT)", "--verbose=1"])
    assert again["failed"] == [] and "(Paper column: ViT-H/14 (JFT).)" in again["report"]
    assert {r["task"]: r["paper"] for r in again["rows"]} == {t.key: t.paper["ViT-H/14 (JFT)"] for t in vtab.TASKS}
    assert f"tensorboard --logdir {run_dir}\n" in capsys.readouterr().out  # the tasks' logs are below it
    runner.main(SMOKE + [f"--run_dir={run_dir}"])  # the module's other tests read the default row


def test_augreg_sweep_choices(tmp_path, monkeypatch, capsys):
    """lr x steps on train800 -> val200, the best retrained on
    train800val200 and evaluated on test (training stubbed)."""
    splits, fits = [], []

    def fake_train(config, run_dir, setup, **kwargs):
        splits.append((config.dataset, config.train_split, config.test_split))
        fits.append((config.learning_rate, config.total_steps, config.warmup_steps))
        score = 0.9 if (config.learning_rate, config.total_steps) == (0.003, 2500) else 0.5
        return {"accuracy": score, "eval_examples": 200, "steps": config.total_steps}

    monkeypatch.setattr(train, "train", fake_train)
    outcome = runner.main([
        "--smoke", "--config=augreg", "--tasks=kitti_distance", f"--run_dir={tmp_path}",
        "--lr_grid=0.001,0.003,0.01,0.03", "--steps_grid=500,2500", "--warmup_grid=100,200",
    ])
    task = "vtab:kitti_distance"
    assert splits == [(task, "train800", "val200")] * 8 + [(task, "train800val200", "test")]
    assert fits[:8] == [(lr, s, w) for s, w in ((500, 100), (2500, 200)) for lr in (0.001, 0.003, 0.01, 0.03)]
    assert fits[8] == (0.003, 2500, 200)
    row = outcome["rows"][0]
    assert (row["learning_rate"], row["steps"], row["val_accuracy"], row["accuracy"]) == (0.003, 2500, 90.0, 90.0)
    assert len(row["sweep"]) == 8 and "AugReg sweep" in outcome["report"]
    # The header names the sweep's lengths (it said "then 2 updates", the
    # smoke run's --total_steps, which the sweep's best length replaces).
    assert "tasks: 1, each a sweep, then the best length of (500, 2500) updates" in capsys.readouterr().out


@pytest.mark.one_backend
def test_docs_paper_group_means_match_the_table():
    path = os.path.join(ROOT, "docs", "vtab.md")
    with open(path, encoding="utf-8") as f:
        rows = [l for l in f if l.startswith("| ViT-") and ", paper |" in l and l.count("|") == 6]
    assert len(rows) == 3
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        means = vtab.group_means(vtab.paper_results(cells[0].removesuffix(", paper")))
        assert cells[1:] == [f"{means[g][0]:.1f}" for g in ("natural", "specialized", "structured", "mean")]
