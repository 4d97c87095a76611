"""VTAB-1k: fine-tune one pre-trained model on the 19 tasks and report them
in the layout of the paper's Table 9.

The paper's protocol is the default (App. B.1.1, Table 4): every task trains
on its 1,000 examples (`train800val200`) for 2,500 updates of 512 at 384 px,
SGD momentum 0.9, lr 0.01, cosine decay, clipping at 1, no weight decay, and
is evaluated on its test split. `--config=augreg` runs AugReg's sweep
instead (lr {0.001, 0.003, 0.01, 0.03} x {500, 2,500} updates on
`train800` -> `val200`, the best retrained on `train800val200`, evaluated on
`test`). The tasks, splits and label definitions are those of
`keras_vit.data.vtab` (docs/vtab.md); each task is the trainer's
`--dataset=vtab:<task>`.

    python -m recipes.vtab --model=ViT-L_16 --weights=imagenet21k      # all 19 tasks
    python -m recipes.vtab --tasks=clevr_count                          # one task
    python -m recipes.vtab --tasks=structured --config=augreg           # the sweep, a group
    python -m recipes.vtab --smoke                                      # generated data, ~2.5 min on 2 busy cores

Resumable per task: a finished task is skipped when the command runs again,
an interrupted one resumes from its last checkpoint, and a task that fails
(e.g. a dataset that needs a manual download) is recorded and the others go
on. The run directory (`--run_dir`, default runs/vtab/<config>) holds
`tasks/<task>/` (checkpoints, logs, result), `results.csv`, `results.json`,
`report.md` (the Table 9 layout: per-task accuracy, group means, mean) and
`report.png` (bar chart).
"""

import csv
import os
import sys
import time
import traceback

from recipes import checks
from recipes import cli
from recipes import inputs
from recipes import rundir
from recipes import train
from recipes.configs import SMOKE
from recipes.configs import VTAB_PREFIX
from recipes.configs import Named
from recipes.configs import Recipe
from recipes.configs import VtabConfig

TASK_RESULT = "task_result.json"
CSV_COLUMNS = ("task", "name", "group", "status", "accuracy", "learning_rate", "steps", "warmup_steps",
               "val_accuracy", "eval_examples", "wall_time_s", "paper", "error")
RECIPE = Recipe(
    "vtab", "VTAB-1k", VtabConfig,
    base=dict(dataset=None, train_split="train800val200", test_split="test", sweep_train_split="train800",
              sweep_val_split="val200", total_steps=2500, warmup_steps=200, learning_rate=0.01,
              augmentation="resize_crop", shuffle_buffer=1000, steps_grid=(500, 2500), warmup_grid=(100, 200)),
    smoke=dict(SMOKE, total_steps=2, steps_grid=(2,), warmup_grid=(1,)),
    fixed=("dataset", "train_split", "test_split", "sweep_train_split", "sweep_val_split", "epochs", "eval_every"),
    configs={
        "paper": Named(
            "the ViT paper's protocol (App. B.1.1, Table 4): every task 2,500 updates of 512 on train800val200 at "
            "384 px, lr 0.01; BiT's augmentation", {},
            "Table 9's mean over the 19 tasks: 72.7 % for ViT-L/16 pre-trained on ImageNet-21k (--model=ViT-L_16)",
            "--model=ViT-L_16 --weights=imagenet21k"),
        "augreg": Named(
            "AugReg's protocol (Steiner et al., App. C): lr {0.001, 0.003, 0.01, 0.03} x {500, 2,500} updates on "
            "train800 -> val200, the best retrained on train800val200", dict(sweep=True),
            "the per-task numbers of the AugReg paper's figures", "--model=B_16 --weights=augreg"),
    })


def select_tasks(spec):
    """The tasks named by `--tasks`, in the paper's order."""
    from keras_vit.data import vtab

    chosen = set()
    for item in (s.strip() for s in str(spec).split(",") if s.strip()):
        if item.lower() == "all":
            chosen.update(t.key for t in vtab.TASKS)
        elif item.lower() in vtab.GROUPS:
            chosen.update(t.key for t in vtab.tasks_in_group(item.lower()))
        else:
            try:
                chosen.add(vtab.get_task(item).key)
            except ValueError:
                raise cli.RecipeError(
                    f"unknown VTAB task or group {item!r}; use task keys ({', '.join(t.key for t in vtab.TASKS)}), "
                    f"paper names, {', '.join(vtab.GROUPS)} or all. Received: tasks={spec!r}") from None
    if not chosen:
        raise cli.RecipeError(f"--tasks selects no task. Received: tasks={spec!r}")
    return [t for t in vtab.TASKS if t.key in chosen]


def check_config(config):
    """Fails fast on settings that would make every task fail."""
    from keras_vit.data import vtab

    checks.check(config)
    checks.choice(config, "paper_model", vtab.PAPER_MODELS)
    return select_tasks(config.tasks)


def run_task(task, config, task_dir, setup, callbacks=()):
    """Fine-tunes and evaluates one task (resumable); returns its row."""
    start = time.perf_counter()
    result = train.sweep_and_train(config.replace(dataset=VTAB_PREFIX + task.key), task_dir,
                                   os.path.join(task_dir, "final"), setup, callbacks=callbacks,
                                   save=config.save_models)
    trials = result["sweep"]
    return {
        "task": task.key, "name": task.name, "group": task.group, "status": "done",
        "accuracy": 100.0 * result["accuracy"], "learning_rate": result["learning_rate"], "steps": result["steps"],
        "warmup_steps": result["warmup_steps"],
        "val_accuracy": 100.0 * max(t["val_accuracy"] for t in trials) if trials else None,
        "eval_examples": result["eval_examples"], "wall_time_s": time.perf_counter() - start,
        "sweep": [dict(learning_rate=t["learning_rate"], steps=t.get("total_steps"),
                       warmup_steps=t.get("warmup_steps"), val_accuracy=100.0 * t["val_accuracy"]) for t in trials],
        "error": None,
    }


def run(config, config_name=None, smoke=False, callbacks=()):
    """Runs the selected tasks; returns `{"rows": [...], "failed": [...],
    "report": markdown, "run_dir": ...}`."""
    tasks = check_config(config)
    with rundir.open_run("vtab", config, config_name) as run_dir:
        setup = checks.set_up(config)
        if config.verbose:
            # A sweep's final run takes the best of its lengths.
            length = (f"the best length of {config.steps_grid}" if config.sweep and config.steps_grid else
                      f"{config.total_steps:,}")
            print("\n".join(train.start_header("vtab", run_dir, setup, config, log_dir=run_dir) + [
                f"  tasks: {len(tasks)}, each {'a sweep, then ' if config.sweep else ''}{length} updates of "
                f"{config.batch_size} at {config.image_size} px"]), flush=True)
        failed = []
        with inputs.smoke_mode(config, smoke):
            for index, task in enumerate(tasks):
                task_dir = os.path.join(run_dir, "tasks", task.key)
                result_path = os.path.join(task_dir, TASK_RESULT)
                previous = rundir.read_json(result_path)
                if previous is not None and previous["status"] == "done":
                    print(f"[{index + 1}/{len(tasks)}] {task.name}: done earlier, {previous['accuracy']:.2f} %",
                          flush=True)
                    continue
                print(f"[{index + 1}/{len(tasks)}] {task.name} ({task.num_classes} classes)", flush=True)
                start = time.perf_counter()
                try:
                    row = run_task(task, config, task_dir, setup, callbacks)
                except Exception as error:  # A failing task must not stop the others.
                    message = f"{type(error).__name__}: {error}"
                    os.makedirs(task_dir, exist_ok=True)
                    with open(os.path.join(task_dir, "error.txt"), "w") as f:
                        f.write(traceback.format_exc())
                    row = dict({c: None for c in CSV_COLUMNS}, task=task.key, name=task.name, group=task.group,
                               status="failed", wall_time_s=time.perf_counter() - start, error=message)
                    failed.append(task.key)
                    print(f"  {task.name} failed ({cli.one_line(message)[:500]}); traceback in "
                          f"{task_dir}/error.txt. Continuing.", flush=True)
                else:
                    if os.path.exists(os.path.join(task_dir, "error.txt")):  # an earlier try's
                        os.remove(os.path.join(task_dir, "error.txt"))
                    print(f"  {task.name}: {row['accuracy']:.2f} % (lr {row['learning_rate']:g}, {row['steps']} "
                          f"steps, {row['wall_time_s']:.0f} s)", flush=True)
                rundir.write_json(result_path, row)
        rows, markdown = write_report(run_dir, config, f"{config.model or 'ViT'} ({config.weights or 'random init'})")
        print(markdown)
        print(f"Report: {os.path.join(run_dir, 'report.md')}, {os.path.join(run_dir, 'report.png')}")
        if failed:
            print(f"Failed tasks: {', '.join(failed)}. Run the same command again to retry them "
                  "(finished tasks are skipped).")
        return {"rows": rows, "failed": failed, "report": markdown, "run_dir": run_dir}


# ---------------------------------------------------------------------------
# The report.
# ---------------------------------------------------------------------------


def report_markdown(rows, model_label, config):
    """Our row and the paper's in the layout of Table 9
    (`keras_vit.data.vtab.table9_rows`), then a per-task table with the
    settings."""
    from keras_vit.data import vtab

    ours = {r["task"]: r["accuracy"] for r in rows if r["status"] == "done"}
    protocol = ("AugReg sweep (lr x steps on train800 -> val200, the best retrained on train800val200)"
                if config.sweep else
                f"the ViT paper's (train800val200, lr {config.learning_rate:g}, {config.total_steps} steps)")
    missing = [t.name for t in vtab.TASKS if t.key not in ours]
    lines = [
        f"# VTAB-1k: {model_label}", "",
        f"Protocol: {protocol}, {config.image_size} px, batch {config.batch_size}; test accuracy in %.", "",
        *vtab.table9_rows(ours, model_label), "",
        "Group means average the tasks of the group, Mean the 19 tasks (as the paper's Table 9). * marks a mean "
        "over the tasks finished so far" + (f" (missing: {', '.join(missing)})." if missing else "."), "",
        "| Task | Group | Accuracy | Paper | lr | Steps | Val. accuracy | Wall time (s) | Status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def shown(value, form="{}"):
        return "–" if value is None else form.format(value)

    for r in rows:
        status = r["status"]
        if status != "done" and r.get("error"):
            status += ": " + cli.one_line(r["error"])[:300].replace("|", "/")
        lines.append(f"| {r['name']} | {r['group']} | {shown(r.get('accuracy'), '{:.2f}')} | {shown(r.get('paper'))} "
                     f"| {shown(r.get('learning_rate'))} | {shown(r.get('steps'))} | "
                     f"{shown(r.get('val_accuracy'), '{:.2f}')} | {r['wall_time_s']:.0f} | {status} |")
    lines.append(f"\n(Paper column: {config.paper_model}.)")
    return "\n".join(lines) + "\n"


def write_report(run_dir, config, model_label):
    """Every task result in `run_dir` (earlier invocations' too) as
    results.csv/json, report.md and report.png."""
    from keras_vit.data import vtab

    rows = [dict(row, paper=t.paper.get(config.paper_model)) for t, row in (
        (t, rundir.read_json(os.path.join(run_dir, "tasks", t.key, TASK_RESULT))) for t in vtab.TASKS)
        if row is not None]
    rundir.write_json(os.path.join(run_dir, "results.json"), rows)
    with open(os.path.join(run_dir, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    markdown = report_markdown(rows, model_label, config)
    with open(os.path.join(run_dir, "report.md"), "w") as f:
        f.write(markdown)
    vtab.bar_chart({r["task"]: r["accuracy"] for r in rows if r["status"] == "done"},
                   os.path.join(run_dir, "report.png"), model_label, config.paper_model)
    return rows, markdown


parse, main = cli.entry_points(RECIPE, run, prog="python -m recipes.vtab", description=__doc__.split("\n\n")[0])

if __name__ == "__main__":
    outcome = cli.run_command(main)
    sys.exit(1 if outcome["failed"] else 0)
