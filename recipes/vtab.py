"""VTAB-1k: fine-tune one pre-trained model on the 19 tasks and report them
in the layout of the paper's Table 9.

The paper's protocol is the default (App. B.1.1, Table 4): every task trains
on its 1,000 examples (`train800val200`) for 2,500 updates of 512 at 384 px,
SGD momentum 0.9, lr 0.01, cosine decay, clipping at 1, no weight decay, and
is evaluated on its test split. `--config=augreg` runs AugReg's sweep
instead (lr {0.001, 0.003, 0.01, 0.03} x {500, 2,500} updates on
`train800` -> `val200`, the best retrained on `train800val200`, evaluated on
`test`). The tasks, splits and label definitions are those of
`keras_vit.data.vtab` (docs/vtab.md).

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

from recipes import classifier
from recipes import cli
from recipes import run as skeleton
from recipes.configs import vtab as configs

PROG = "python -m recipes.vtab"
DESCRIPTION = __doc__.split("\n\n")[0]
TASK_RESULT = "task_result.json"
CSV_COLUMNS = (
    "task", "name", "group", "status", "accuracy", "learning_rate", "steps", "warmup_steps",
    "val_accuracy", "eval_examples", "wall_time_s", "paper", "error",
)


def select_tasks(spec):
    """The tasks named by `--tasks`, in the paper's order."""
    from keras_vit.data import vtab

    chosen = set()
    for item in (s.strip() for s in str(spec).split(",")):
        if not item:
            continue
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
                    f"paper names, {', '.join(vtab.GROUPS)} or all. Received: tasks={spec!r}"
                ) from None
    if not chosen:
        raise cli.RecipeError(f"--tasks selects no task. Received: tasks={spec!r}")
    return [t for t in vtab.TASKS if t.key in chosen]


# ---------------------------------------------------------------------------
# One task.
# ---------------------------------------------------------------------------


def task_data(config, task, train_split, eval_split):
    """`(train_data, eval_data)`: functions of the batch size returning the
    task's `keras_vit.data.vtab.vtab_pipeline` batches (BiT's per-task crop
    and flip switches included)."""
    from keras_vit.data import vtab

    common_args = dict(
        image_size=config.image_size, data_dir=config.data_dir, download=config.download,
        manual_dir=config.manual_dir, cache=skeleton.cache_setting(config),
    )

    def train_data(batch_size):
        return vtab.vtab_pipeline(
            task, train_split, batch_size=batch_size, training=True, augmentation=config.augmentation,
            shuffle_buffer=config.shuffle_buffer, seed=config.seed, **common_args,
        )

    def eval_data(batch_size):
        return vtab.vtab_pipeline(
            task, eval_split, batch_size=batch_size, training=False, pad_to_batch=True, **common_args)

    return train_data, eval_data


def _fit(config, task, train_split, eval_split, run_dir, setup, callbacks, save_model):
    train_data, eval_data = task_data(config, task, train_split, eval_split)
    return classifier.fit_one(
        config, run_dir=run_dir, setup=setup, train_data=train_data, eval_data=eval_data,
        num_classes=task.num_classes, eval_label=f"{task.name} {eval_split}", callbacks=callbacks,
        save_model=save_model,
    )


def check_config(config):
    """Fails fast on settings that would make every task fail."""
    from keras_vit.data import vtab

    skeleton.check_fields(config)
    cli.check_choice(config, "paper_model", vtab.PAPER_MODELS)
    if config.sweep:
        if len(config.steps_grid) != len(config.warmup_grid):
            raise cli.RecipeError(
                "--warmup_grid needs one warmup per entry of steps_grid. Received: "
                f"--steps_grid={config.steps_grid}, --warmup_grid={config.warmup_grid}"
            )
        for steps, warmup in zip(config.steps_grid, config.warmup_grid):
            skeleton.check_schedule(config, total_steps=steps, warmup_steps=warmup)
    else:
        skeleton.check_schedule(config)
    select_tasks(config.tasks)


def run_task(task, config, task_dir, setup, callbacks=()):
    """Fine-tunes and evaluates one task (resumable); returns its row."""
    start = time.perf_counter()
    final, trials = {}, []
    if config.sweep:
        def fit(changes, name):
            return _fit(config.replace(**changes), task, "train800", "val200",
                        os.path.join(task_dir, "sweep", name), setup, callbacks, save_model=False)["accuracy"]

        grid = [
            (f"lr_{lr:g}-steps_{steps}", dict(learning_rate=lr, total_steps=steps, warmup_steps=warmup))
            for steps, warmup in zip(config.steps_grid, config.warmup_grid)
            for lr in config.lr_grid
        ]
        final, trials = skeleton.sweep(grid, fit, "val200")
    final = config.replace(**final)
    result = _fit(final, task, "train800val200", "test", os.path.join(task_dir, "final"), setup, callbacks,
                  save_model=config.save_models)
    return {
        "task": task.key,
        "name": task.name,
        "group": task.group,
        "status": "done",
        "accuracy": 100.0 * result["accuracy"],
        "learning_rate": final.learning_rate,
        "steps": result["steps"],
        "warmup_steps": final.warmup_steps,
        "val_accuracy": 100.0 * max(t["val_accuracy"] for t in trials) if trials else None,
        "eval_examples": result["eval_examples"],
        "wall_time_s": time.perf_counter() - start,
        "sweep": [
            dict(learning_rate=t["learning_rate"], steps=t["total_steps"], warmup_steps=t["warmup_steps"],
                 val_accuracy=100.0 * t["val_accuracy"])
            for t in trials
        ],
        "paper": task.paper.get(config.paper_model),
        "error": None,
    }


# ---------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------


def group_means(accuracies):
    """Means of a `{task key or name: accuracy}` mapping, as Table 9 reports.

    Returns `{"natural": (mean, n, size), "specialized": ..., "structured":
    ..., "mean": ...}`: the mean over the tasks present (None if none), how
    many were present and how many the group has. The overall mean is over
    the tasks (the paper's "Mean" column averages the 19 tasks), not over
    the group means.
    """
    from keras_vit.data import vtab

    by_key = {}
    for name, value in accuracies.items():
        if value is not None:
            by_key[vtab.get_task(name).key] = float(value)
    out = {}
    for group in vtab.GROUPS:
        values = [by_key[t.key] for t in vtab.tasks_in_group(group) if t.key in by_key]
        out[group] = (sum(values) / len(values) if values else None, len(values),
                      len(vtab.tasks_in_group(group)))
    values = [by_key[t.key] for t in vtab.TASKS if t.key in by_key]
    out["mean"] = (sum(values) / len(values) if values else None, len(values), len(vtab.TASKS))
    return out


def _cell(mean, n, size):
    if mean is None:
        return "–"
    return f"{mean:.1f}" if n == size else f"{mean:.1f}*"


def report_markdown(rows, model_label, config):
    """The Markdown report: our row and the paper's rows in the layout of
    Table 9 (a column per task, then the group means and the mean), then a
    per-task table with the settings."""
    from keras_vit.data import vtab

    names = [t.name for t in vtab.TASKS]
    header = "| Model | " + " | ".join(names) + " | Natural | Specialized | Structured | Mean |"
    rule = "|---" * (len(names) + 5) + "|"
    ours = {r["task"]: r["accuracy"] for r in rows if r["status"] == "done"}

    def line(label, values):
        means = group_means(values)
        cells = [f"{values[t.key]:.1f}" if values.get(t.key) is not None else "–" for t in vtab.TASKS]
        cells += [_cell(*means[g]) for g in (*vtab.GROUPS, "mean")]
        return f"| {label} | " + " | ".join(cells) + " |"

    if config.sweep:
        protocol = "AugReg sweep (lr x steps on train800 -> val200, the best retrained on train800val200)"
    else:
        protocol = (
            f"the ViT paper's (train800val200, lr {config.learning_rate:g}, "
            f"{config.total_steps} steps)"
        )
    lines = [
        f"# VTAB-1k: {model_label}",
        "",
        f"Protocol: {protocol}, {config.image_size} px, batch {config.batch_size}; "
        "test accuracy in %.",
        "",
        header,
        rule,
        line(model_label, ours),
    ]
    for paper_model in vtab.PAPER_MODELS:
        lines.append(line(f"{paper_model}, paper", {t.key: t.paper[paper_model] for t in vtab.TASKS}))
    missing = [t.name for t in vtab.TASKS if t.key not in ours]
    lines += [
        "",
        "Group means average the tasks of the group, Mean the 19 tasks (as the paper's "
        "Table 9). * marks a mean over the tasks finished so far"
        + (f" (missing: {', '.join(missing)})." if missing else "."),
        "",
        "| Task | Group | Accuracy | Paper | lr | Steps | Val. accuracy | Wall time (s) | Status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        accuracy = f"{r['accuracy']:.2f}" if r.get("accuracy") is not None else "–"
        val = f"{r['val_accuracy']:.2f}" if r.get("val_accuracy") is not None else "–"
        status = r["status"]
        if status != "done" and r.get("error"):
            status += ": " + r["error"].splitlines()[0][:120].replace("|", "/")
        lines.append(
            f"| {r['name']} | {r['group']} | {accuracy} | {r.get('paper', '–')} | "
            f"{r.get('learning_rate') if r.get('learning_rate') is not None else '–'} | "
            f"{r.get('steps') if r.get('steps') is not None else '–'} | {val} | "
            f"{r['wall_time_s']:.0f} | {status} |"
        )
    lines.append(f"\n(Paper column: {config.paper_model}.)")
    return "\n".join(lines) + "\n"


def bar_chart(rows, path, model_label, paper_model):
    """Per-task accuracy beside the paper's, coloured by group (PNG).

    Drawn on a bare `matplotlib.figure.Figure` (Agg canvas): no pyplot
    state, no display needed, the caller's matplotlib backend untouched.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from keras_vit.data import vtab

    ours = {r["task"]: r["accuracy"] for r in rows if r["status"] == "done"}
    colours = {"natural": "#4c72b0", "specialized": "#dd8452", "structured": "#55a868"}
    means = group_means(ours)
    paper_means = group_means({t.key: t.paper[paper_model] for t in vtab.TASKS})
    labels = [t.name for t in vtab.TASKS] + ["Natural", "Specialized", "Structured", "Mean"]
    mine = [ours.get(t.key) for t in vtab.TASKS] + [means[g][0] for g in (*vtab.GROUPS, "mean")]
    theirs = [t.paper[paper_model] for t in vtab.TASKS] + [
        paper_means[g][0] for g in (*vtab.GROUPS, "mean")
    ]
    groups = [t.group for t in vtab.TASKS] + list(vtab.GROUPS) + ["mean"]
    x = range(len(labels))
    fig = Figure(figsize=(14, 4.8))
    ax = fig.subplots()
    width = 0.4
    edge = [colours.get(g, "#444444") for g in groups]
    ax.bar([i - width / 2 for i in x], [v or 0.0 for v in mine], width, color=edge)
    ax.bar([i + width / 2 for i in x], theirs, width, color="none", edgecolor=edge, hatch="//")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=60, ha="right")
    ax.set_ylabel("Top-1 accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("VTAB-1k", loc="left")
    handles = [
        Patch(facecolor="#777777", label=model_label),
        Patch(facecolor="none", edgecolor="#777777", hatch="//", label=f"{paper_model}, paper"),
    ] + [Patch(facecolor=c, label=g) for g, c in colours.items()]
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=5, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def write_report(run_dir, config, model_label):
    """Collects every task result in `run_dir` (also those of earlier
    invocations) and writes results.csv/json, report.md and report.png."""
    from keras_vit.data import vtab

    rows = []
    for task in vtab.TASKS:
        row = skeleton.read_json(os.path.join(run_dir, "tasks", task.key, TASK_RESULT))
        if row is not None:
            rows.append(row)
    skeleton.write_json(os.path.join(run_dir, "results.json"), rows)
    with open(os.path.join(run_dir, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
    markdown = report_markdown(rows, model_label, config)
    with open(os.path.join(run_dir, "report.md"), "w") as f:
        f.write(markdown)
    bar_chart(rows, os.path.join(run_dir, "report.png"), model_label, config.paper_model)
    return rows, markdown


# ---------------------------------------------------------------------------
# The runner.
# ---------------------------------------------------------------------------


def run(config, config_name=None, smoke=False, callbacks=()):
    """Runs the selected tasks; returns `{"rows": [...], "failed": [...],
    "report": markdown, "run_dir": ...}`."""
    check_config(config)
    tasks = select_tasks(config.tasks)
    with skeleton.open_run("vtab", config, config_name) as run_dir:
        setup, header = skeleton.start_run("vtab", config, run_dir)
        if config.verbose:
            skeleton.print_header(header + [
                f"  tasks: {len(tasks)}, each {'a sweep, then ' if config.sweep else ''}{config.total_steps:,} "
                f"updates of {config.batch_size} at {config.image_size} px"
            ])
        model_label = f"{config.model or 'ViT'} ({config.weights or 'random init'})"
        failed = []
        with skeleton.smoke_mode(config, smoke):
            for index, task in enumerate(tasks):
                task_dir = os.path.join(run_dir, "tasks", task.key)
                result_path = os.path.join(task_dir, TASK_RESULT)
                previous = skeleton.read_json(result_path)
                if previous is not None and previous["status"] == "done":
                    print(f"[{index + 1}/{len(tasks)}] {task.name}: done earlier, "
                          f"{previous['accuracy']:.2f} %", flush=True)
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
                    row = {
                        "task": task.key, "name": task.name, "group": task.group, "status": "failed",
                        "accuracy": None, "learning_rate": None, "steps": None, "warmup_steps": None,
                        "val_accuracy": None, "eval_examples": None,
                        "wall_time_s": time.perf_counter() - start,
                        "paper": task.paper.get(config.paper_model), "error": message,
                    }
                    failed.append(task.key)
                    print(f"  {task.name} failed ({message.splitlines()[0][:300]}); "
                          f"traceback in {task_dir}/error.txt. Continuing.", flush=True)
                else:
                    print(f"  {task.name}: {row['accuracy']:.2f} % (lr {row['learning_rate']:g}, "
                          f"{row['steps']} steps, {row['wall_time_s']:.0f} s)", flush=True)
                skeleton.write_json(result_path, row)
        rows, markdown = write_report(run_dir, config, model_label)
        print(markdown)
        print(f"Report: {os.path.join(run_dir, 'report.md')}, {os.path.join(run_dir, 'report.png')}")
        if failed:
            print(f"Failed tasks: {', '.join(failed)}. Run the same command again to retry them "
                  "(finished tasks are skipped).")
        return {"rows": rows, "failed": failed, "report": markdown, "run_dir": run_dir}


parse, main = cli.entry_points(configs, run, prog=PROG, description=DESCRIPTION)


if __name__ == "__main__":
    outcome = cli.run_command(main)
    sys.exit(1 if outcome["failed"] else 0)
