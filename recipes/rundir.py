"""Run directories: where a recipe may write, and what it may delete.

A recipe writes only into a directory that is new, empty, or a run
directory of its own: one holding the marker file `.keras_vit_run` a recipe
wrote there. `--overwrite` deletes only the entries recipes write
(`RUN_ENTRIES`), and never while another process holds the run's lock.
Everything else is refused with an error that names the directory and the
safe choices. While a recipe runs, it holds an OS lock on the marker
(`keras_vit.training.locks`: released when the process ends, even by
SIGKILL), so that a second run of the same directory is refused. The
run's `history.csv` is read and trimmed (on resume) here too.
"""

import contextlib
import csv
import json
import os
import shutil
import tempfile
import time

from recipes.cli import RecipeError

MARKER = ".keras_vit_run"
# Every name a recipe writes at the top of a run directory, so the only
# ones `--overwrite` deletes (tests/recipes check that the recipes write
# nothing else).
RUN_ENTRIES = frozenset({
    MARKER, "config.json", "summary.json", "result.json", "history.csv", "history.csv.tmp", "logs", "checkpoints",
    "model.keras", "model.npz", "lora.npz",
    "sweep",  # finetune --sweep
    "tasks", "results.json", "results.csv", "report.md", "report.png",  # vtab
    "samples", "mpp.weights.h5", "encoder.npz", "backbone.keras",  # pretrain_mpp
    "data", "pretrain", "finetune", "inspect",  # demo
    # inspect_vit: keras_vit.inspect.write_figures' files, in any of its formats.
    "inspect.npz", *(f"{figure}.{ext}" for figure in ("rollout", "posemb_similarity", "embedding_filters",
                                                     "attention_distance") for ext in ("png", "svg", "pdf")),
})
# The lock of `keras_vit.training.BackupAndResume` in a run's checkpoints.
_BACKUP_LOCK = "backup.lock"


def json_default(value):
    """JSON for what `json` cannot write: arrays and numpy numbers as lists
    and numbers, sets sorted, anything else as its string."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def write_json(path, value):
    """Writes JSON atomically (a kill never leaves half a file)."""
    from keras_vit.weights.npz import file_mode

    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        handle, tmp = tempfile.mkstemp(suffix=".json", dir=directory)
        with os.fdopen(handle, "w") as f:
            json.dump(value, f, indent=2, sort_keys=True, default=json_default)
            f.write("\n")
        os.chmod(tmp, file_mode(path))  # mkstemp's 0600 would keep others from reading the run's records
        os.replace(tmp, path)
    except BaseException as error:  # a full disk or an interrupt leaves no temporary behind
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        if isinstance(error, OSError):
            raise RecipeError(
                f"cannot write {path}: {error.strerror or error}. What the run wrote before is kept; "
                "free space (or fix the permissions) and run the same command again to resume."
            ) from None
        raise
    return path


def read_json(path):
    """The JSON object a recipe wrote at `path`, or None if there is none.

    Recipes write these files atomically, so one that is not a JSON object
    was changed by something else: an error naming it, not a traceback."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        value = error
    if not isinstance(value, dict):
        what = f"cannot be read ({value})" if isinstance(value, Exception) else f"holds a {type(value).__name__}"
        raise RecipeError(
            f"{path} {what}; a recipe writes a JSON object there. Restore the file, pass --overwrite "
            f"to start the run again, or pass another --run_dir. Received: {path}"
        )
    return value


def _live_holders(run_dir):
    """Other live processes holding a run's lock or a `BackupAndResume`
    lock anywhere in `run_dir` (sub-runs and sweeps included)."""
    from keras_vit import locks

    found = []
    for directory, _, files in os.walk(run_dir):
        for name in files:
            if name in (MARKER, _BACKUP_LOCK):
                holder = locks.holder(os.path.join(directory, name))
                if holder is not None:
                    found.append(f"{holder}, {os.path.join(directory, name)}")
    return found


def _delete_run(run_dir):
    """Deletes what recipes wrote in `run_dir` (its marker kept: this
    process holds its lock); anything else stays."""
    for name in sorted(RUN_ENTRIES - {MARKER}):
        path = os.path.join(run_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


@contextlib.contextmanager
def claim(run_dir, overwrite=False):
    """Opens `run_dir` for one recipe run in this process (see the module's
    docstring); with `overwrite`, an earlier run there is deleted first.
    The lock is released when the block ends."""
    from keras_vit import locks

    if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
        raise RecipeError(
            f"the run directory {run_dir} is a file, not a directory. Pass another --run_dir "
            f"(a new or empty directory). Received: run_dir={run_dir!r}"
        )
    entries = sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []
    if entries and MARKER not in entries:
        shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
        raise RecipeError(
            f"the run directory {run_dir} is not empty ({shown}) and is not a recipe's run "
            f"directory (no {MARKER} marker): a recipe writes only into a new or empty directory "
            "or its own run, and --overwrite deletes only its own runs. Pass a new or empty "
            f"--run_dir. Received: run_dir={run_dir!r}"
        )
    marker = os.path.join(run_dir, MARKER)
    try:
        holder = locks.acquire(marker)
    except OSError as error:  # a read-only place, a full disk, no permission
        raise RecipeError(
            f"the run directory {run_dir} cannot be written ({error.strerror or error}). Pass a "
            f"--run_dir you can write to. Received: run_dir={run_dir!r}"
        ) from None
    live = [f"{holder}, {marker}"] if holder is not None else _live_holders(run_dir)
    if live:
        locks.release(marker)
        raise RecipeError(
            f"the run directory {run_dir} is in use by a live run ({live[0]}): nothing was "
            "changed. Wait for that run to end (the same command then resumes or reports it), "
            f"or pass another --run_dir. Received: run_dir={run_dir!r}"
        )
    try:
        if overwrite:
            _delete_run(run_dir)
        yield run_dir
    finally:
        locks.release(marker)


# Fields that may change between an interrupted run and its resumption.
RESUMABLE_CHANGES = frozenset((
    "run_dir", "overwrite", "distribution", "verbose", "data_dir", "download", "manual_dir", "tasks", "jit_compile",
    "steps_per_execution", "deterministic",
    "paper_model",  # vtab: the report's paper row, rewritten from the task results
))


def jsonable(config):
    """A config (dataclass) as plain JSON values."""
    return json.loads(json.dumps(config.to_dict(), default=json_default))


def record_config(config, recipe, config_name, run_dir):
    """Records the config in `run_dir/config.json`. Started again with the
    same config a run resumes; with another, it is an error naming the
    fields, unless nothing was written there but the config. The first
    start's time is kept (the summary's wall time)."""
    path = os.path.join(run_dir, "config.json")
    saved = read_json(path)
    current = jsonable(config)
    # Folders without files do not count: a sweep makes its trial's folder
    # before a bad --dataset is found (retyping it was then refused).
    started = saved is not None and any(
        name not in ("config.json", MARKER) and _holds_files(os.path.join(run_dir, name)) for name in os.listdir(run_dir))
    if started and saved.get("recipe", recipe) != recipe:
        raise RecipeError(
            f"the run directory {run_dir} holds a run of {saved['recipe']}, not of {recipe}: nothing was changed. "
            f"Pass another --run_dir. Received: run_dir={run_dir!r}")
    if started:
        before = saved.get("config", {})
        changed = sorted(k for k in set(before) | set(current)
                         if k not in RESUMABLE_CHANGES and before.get(k) != current.get(k))
        if changed:
            details = ", ".join(f"{k}: {before.get(k)!r} -> {current.get(k)!r}" for k in changed)
            raise RecipeError(
                f"the run directory {run_dir} holds a run with another config ({details}). Run the same command to "
                f"resume it, pass another --run_dir, or --overwrite to start over. Received: run_dir={run_dir!r}")
    first_start = saved.get("started") if started else None
    write_json(path, {"recipe": recipe, "config_name": config_name, "config": current,
                      "started": first_start if isinstance(first_start, (int, float)) else time.time()})


def _holds_files(path):
    """`path` is a file, or a folder with a file somewhere below it."""
    if not os.path.isdir(path):
        return True
    return any(files for _, _, files in os.walk(path))


@contextlib.contextmanager
def open_run(recipe, config, config_name):
    """The run directory (default runs/<recipe>/<config>) claimed and the
    config recorded; yields the directory, locked while the block runs."""
    config.run_dir = config.run_dir or os.path.join("runs", recipe, config_name or "custom")
    with claim(config.run_dir, config.overwrite) as run_dir:
        record_config(config, recipe, config_name, run_dir)
        yield run_dir


def trim_history(path, epochs):
    """Keeps the first `epochs` rows of `history.csv`: the epochs a resumed
    run trains again (after its last checkpoint) are logged again."""
    if not os.path.exists(path):
        return
    with open(path, newline="", encoding="utf-8") as f:
        lines = f.readlines()

    def kept(line):  # a whole row of an epoch before `epochs` (a kill can cut the last line)
        epoch = line.split(",", 1)[0]
        return line.endswith("\n") and epoch.isdigit() and int(epoch) < epochs

    rows = lines[:1] + [line for line in lines[1:] if kept(line)]
    if rows != lines:
        with open(f"{path}.tmp", "w", newline="", encoding="utf-8") as f:
            f.writelines(rows)
        os.replace(f"{path}.tmp", path)


def read_history(path):
    """The whole run's `{metric: [per epoch]}` from `history.csv` (Keras'
    `History` holds only this process's epochs)."""
    def number(text):  # CSVLogger writes "NA" for a metric an epoch lacks
        try:
            return float(text)
        except (TypeError, ValueError):
            return None

    if not os.path.exists(path):
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        rows = {int(row["epoch"]): row for row in csv.DictReader(f)}
    keys = sorted({key for row in rows.values() for key in row if key != "epoch"})
    return {key: [number(rows[epoch].get(key)) for epoch in sorted(rows)] for key in keys}
