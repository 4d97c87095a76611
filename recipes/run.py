"""The run skeleton every training recipe uses.

One run directory per run (`config.json` checked on reuse, `--overwrite`
to start over), the distribution and batch checks before any work, a start
header, `model.fit` with resumable checkpoints, progress counted in
updates, a labelled evaluation, the learning-rate sweep, and the summary
(`summary.json`; a finished re-run prints its main lines again).

Glue over keras_vit's library code (`keras_vit.data`, `keras_vit.training`,
`keras_vit.distribute`, the models and weights); Keras and TensorFlow are
imported inside the functions, after the flags are parsed.
"""

import contextlib
import csv
import dataclasses
import importlib
import inspect
import json
import os
import time

from recipes import rundir
from recipes.cli import RecipeError
from recipes.cli import check_auto_bool
from recipes.cli import check_choice
from recipes.configs import MOMENT_DTYPES
from recipes.rundir import json_default
from recipes.rundir import read_json
from recipes.rundir import write_json

# Fields that may change between an interrupted run and its resumption.
RESUMABLE_CHANGES = frozenset(
    ("run_dir", "overwrite", "distribution", "verbose", "data_dir", "download", "manual_dir", "tasks",
     "jit_compile", "steps_per_execution", "deterministic")
)

# ---------------------------------------------------------------------------
# Files.
# ---------------------------------------------------------------------------


def jsonable(config):
    """A config (dataclass) as plain JSON values."""
    return json.loads(json.dumps(config.to_dict(), default=json_default))


def record_config(config, recipe, config_name, run_dir):
    """Records the config in `run_dir/config.json` (a directory `claim`ed).

    A run directory holds one run: started again with the same config it
    resumes; with a different config it is an error naming the fields,
    unless nothing was written there but the config. The time the run first
    started is kept across resumptions (the summary's wall time).
    """
    path = os.path.join(run_dir, "config.json")
    saved = read_json(path)
    current = jsonable(config)
    # A directory where nothing ran yet (a start that failed its checks)
    # takes the new config.
    started = saved is not None and any(
        name not in ("config.json", rundir.MARKER) for name in os.listdir(run_dir))
    if started:
        before = saved.get("config", {})
        changed = sorted(
            k for k in set(before) | set(current)
            if k not in RESUMABLE_CHANGES and before.get(k) != current.get(k)
        )
        if changed:
            details = ", ".join(f"{k}: {before.get(k)!r} -> {current.get(k)!r}" for k in changed)
            raise RecipeError(
                f"the run directory {run_dir} holds a run with another config ({details}). "
                "Run the same command to resume it, pass another --run_dir, or --overwrite "
                f"to start over. Received: run_dir={run_dir!r}"
            )
    first_start = saved.get("started") if started else None
    write_json(path, {"recipe": recipe, "config_name": config_name, "config": current,
                      "started": first_start if isinstance(first_start, (int, float)) else time.time()})


# ---------------------------------------------------------------------------
# Checks before any work.
# ---------------------------------------------------------------------------


def check_fields(config):
    """Every number within its field's interval (`Config.check`), and the
    fields with a fixed set of values that `config` has (`--decay_type` and
    `--augmentation` from the library's lists, `--accumulator_dtype`,
    `--first_moment_dtype`, `--cache`, `--jit_compile`): a bad value is an
    expected failure naming the flag and the value, before any work."""
    from keras_vit.data.pipelines import FINETUNE_AUGMENTATIONS
    from keras_vit.training.schedules import DECAY_TYPES

    fill_library_defaults(config)
    try:
        config.check()
    except ValueError as error:
        raise RecipeError(str(error)) from None
    choices = {
        "decay_type": DECAY_TYPES,
        "augmentation": FINETUNE_AUGMENTATIONS,
        "accumulator_dtype": MOMENT_DTYPES,
        "first_moment_dtype": MOMENT_DTYPES,
    }
    for field, values in choices.items():
        if hasattr(config, field):
            check_choice(config, field, values)
    for field in ("cache", "jit_compile"):
        if hasattr(config, field):
            check_auto_bool(config, field)


def fill_library_defaults(config):
    """Sets each field declared `arg(None, ..., library=PATH)` and left None
    to the default of the library function at PATH for the keyword of the
    same name: the recipes write no default the library has, and
    `config.json` records the values the run used."""
    for field in dataclasses.fields(config):
        path = field.metadata.get("library")
        if path and getattr(config, field.name) is None:
            module, name = path.rsplit(".", 1)
            function = getattr(importlib.import_module(module), name)
            setattr(config, field.name, inspect.signature(function).parameters[field.name].default)


def log_interval(log_every, total_steps):
    """The updates per Keras epoch: `--log_every`, lowered until it divides
    `total_steps` (Keras epochs have a fixed size)."""
    interval = min(log_every, total_steps)
    while total_steps % interval:
        interval -= 1
    return interval


def check_schedule(config, total_steps=None, warmup_steps=None):
    """Validates the step settings (once per run, before any work; a sweep
    or VTAB task checks its own steps)."""
    total = config.total_steps if total_steps is None else total_steps
    warmup = config.warmup_steps if warmup_steps is None else warmup_steps
    values = dict(total_steps=total, batch_size=config.batch_size, accum_steps=config.accum_steps,
                  log_every=config.log_every, checkpoint_every=config.checkpoint_every)
    if hasattr(config, "eval_batch_size"):
        values["eval_batch_size"] = config.eval_batch_size
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise RecipeError(f"--{name} must be a positive int. Received: --{name}={value!r}")
    if config.batch_size % config.accum_steps:
        raise RecipeError(
            "--batch_size must be a multiple of --accum_steps (micro-batch = batch_size / "
            f"accum_steps). Received: --batch_size={config.batch_size}, --accum_steps={config.accum_steps}"
        )
    if not 0 <= warmup < total:
        raise RecipeError(f"--warmup_steps must be in [0, total_steps={total}). Received: --warmup_steps={warmup}")
    log_every = log_interval(config.log_every, total)
    eval_every = getattr(config, "eval_every", 0) or 0
    if eval_every and eval_every % log_every:
        raise RecipeError(f"--eval_every must be a multiple of log_every={log_every}. Received: --eval_every={eval_every}")


def check_batches(config, setup):
    """Every batch must split evenly over the replicas: said before any work,
    naming the flag to change."""
    replicas = setup.num_replicas
    accum = config.accum_steps
    micro = config.batch_size // accum
    if micro % replicas:
        step = accum * replicas
        fix = max(step, (config.batch_size + step - 1) // step * step)
        raise RecipeError(
            f"--batch_size={config.batch_size} with --accum_steps={accum} gives micro-batches of {micro}, "
            f"which do not split over the {replicas} replicas of distribution {setup.mode!r}: use "
            f"--batch_size={fix} (a multiple of accum_steps x replicas = {step})."
        )
    eval_batch = getattr(config, "eval_batch_size", None)
    if eval_batch is not None and eval_batch % replicas:
        fix = (eval_batch + replicas - 1) // replicas * replicas
        raise RecipeError(
            f"--eval_batch_size={eval_batch} does not split over the {replicas} replicas of "
            f"distribution {setup.mode!r}: use --eval_batch_size={fix}."
        )


def check_model(config):
    """An unknown `--model` is refused before any work."""
    from keras_vit import variants

    if config.model is None:
        return None
    try:
        return variants.resolve_variant(config.model)[0]
    except ValueError as error:
        raise RecipeError(f"--model={config.model}: {error}") from None


def set_up(config):
    """Seeds, dtype policy and the distribution; returns the
    `keras_vit.distribute.DistributionSetup`."""
    import keras

    from keras_vit import distribute

    if config.deterministic:
        enable_determinism()
    keras.utils.set_random_seed(config.seed)
    try:
        keras.config.set_dtype_policy(config.dtype_policy)
    except ValueError as error:
        raise RecipeError(f"--dtype_policy={config.dtype_policy}: {error}") from None
    try:
        return distribute.get_distribution(config.distribution)
    except (ValueError, RuntimeError) as error:
        raise RecipeError(f"--distribution={config.distribution}: {error}") from None


def enable_determinism():
    """`--deterministic`: runs of the same command on the same machine and
    versions give the same weights, bit for bit, also where the defaults
    do not (docs/recipes.md).

    The pipelines' own draws are stateless (the same on every run); Keras
    layers given as `--batch_augmentation` draw from stateful seed
    generators, which TensorFlow's op determinism makes tf.data call one
    batch at a time, in order. It also makes TensorFlow's ops (the model's,
    on the tensorflow backend) pick deterministic GPU kernels; PyTorch's
    switch does the same for its ops. XLA on CPU and TPU (JAX) is
    deterministic as it is. A process-wide switch: it stays on.
    """
    import keras
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    if keras.backend.backend() == "torch":
        import torch

        # cuBLAS is deterministic only with a fixed workspace (PyTorch's
        # "Reproducibility" notes); read when the first CUDA matmul runs.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def environment(setup):
    import keras

    return {
        "backend": keras.backend.backend(),
        "keras_version": keras.__version__,
        "distribution": setup.mode,
        "replicas": setup.num_replicas,
        "dtype_policy": keras.config.dtype_policy().name,
    }


# ---------------------------------------------------------------------------
# Data.
# ---------------------------------------------------------------------------


def _looks_like_path(dataset):
    return os.sep in dataset or dataset.startswith((".", "~")) or dataset.startswith("gs://")


def load_source(config, split, class_names=None):
    """A `keras_vit.data.DataSource` for one split of `config.dataset`: a
    tfds dataset (any split string) or `<folder>/<split>/<class>/<image>`.
    `class_names`: the training split's, for an evaluation folder (its class
    folders must be the same, in the same label order)."""
    from keras_vit import data

    dataset = config.dataset
    if not dataset:
        raise RecipeError(
            "this config needs a dataset: a tfds name or a folder with one sub-folder per "
            "split (e.g. train/ and val/), each holding one sub-folder of images per class. "
            f"Pass --dataset=... Received: --dataset={dataset}"
        )
    if _looks_like_path(dataset) or os.path.isdir(dataset):
        folder = os.path.join(os.path.expanduser(dataset), split)
        if not dataset.startswith("gs://") and not os.path.isdir(folder):
            raise RecipeError(f"no folder {folder} (--dataset={dataset}, split {split!r}).")
        try:
            return data.from_directory(
                folder, class_names=class_names, skip_bad_images=config.skip_bad_images
            )
        except ValueError as error:
            raise RecipeError(f"--dataset={dataset}: {error}") from None
    try:
        return data.from_tfds(
            dataset, split, data_dir=config.data_dir, download=config.download, manual_dir=config.manual_dir
        )
    except data.DatasetNotAvailableError as error:
        raise RecipeError(str(error)) from None


def cache_setting(config):
    """`--cache` as the pipelines take it: "auto", True or False."""
    return check_auto_bool(config, "cache")


@contextlib.contextmanager
def _fast_jax_compiles():
    """On JAX, XLA's optimisation passes cost more than they save on the
    tiny smoke models (seconds per compilation, one per task and head size)."""
    import keras

    if keras.backend.backend() != "jax":
        yield
        return
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


@contextlib.contextmanager
def smoke_mode(config, smoke):
    """`--smoke`: fast compilations and, for a tfds dataset, every tfds
    dataset replaced by generated examples (`keras_vit.data.testing`)."""
    if not smoke:
        yield
        return
    dataset = getattr(config, "dataset", None)
    with _fast_jax_compiles():
        if dataset and (_looks_like_path(dataset) or os.path.isdir(dataset)):
            yield
            return
        from keras_vit.data import testing

        with testing.mock_tfds() as manual_dir:
            previous = config.manual_dir
            config.manual_dir = previous or manual_dir
            try:
                yield
            finally:
                config.manual_dir = previous


def steps_from_epochs(epochs, num_examples, batch_size):
    """round(epochs * examples / batch), at least 1."""
    return max(1, int(round(epochs * num_examples / batch_size)))


def data_line(train_split, train_source, eval_split=None, eval_source=None):
    """The header's line about the data: splits, sizes, classes."""

    def describe(label, split, source):
        size = f"{source.num_examples:,} examples" if source.num_examples else "size unknown"
        skipped = f", {len(source.skipped)} unreadable files skipped" if source.skipped else ""
        return f"{label} {split!r} ({size}, {source.num_classes} classes{skipped})"

    parts = [describe("train", train_split, train_source)]
    if eval_source is not None:
        parts.append(describe("evaluation", eval_split, eval_source))
    return "  data: " + ", ".join(parts)


# ---------------------------------------------------------------------------
# Models.
# ---------------------------------------------------------------------------


def model_kwargs(config):
    """Keyword arguments of `keras_vit.ViT` from the config: `--dropout_rate`
    (the named config's or the flag) unless `--model_overrides` gives a
    `dropout_rate` of its own, which wins."""
    kwargs = dict(config.model_overrides)
    if config.dropout_rate is not None:
        kwargs.setdefault("dropout_rate", config.dropout_rate)
    return kwargs


def inherited_dropout_warning(config):
    """The dropout a run trains with where it may surprise: a
    custom model that takes a named config's dropout, or a `dropout_rate` in
    `--model_overrides` that wins over another `--dropout_rate`."""
    override = config.model_overrides.get("dropout_rate")
    if override is not None:
        if config.dropout_rate is not None and override != config.dropout_rate:
            return (
                f"warning: --model_overrides sets dropout_rate={override}, which wins over "
                f"--dropout_rate={config.dropout_rate:g} (the config's or the flag's)."
            )
        return None
    if config.model is None and config.dropout_rate:
        return (
            f"warning: the custom model (--model=none) trains with this config's dropout_rate="
            f"{config.dropout_rate:g}; pass --dropout_rate=0 to train without dropout."
        )
    return None


def build_vit(config, **kwargs):
    """`keras_vit.ViT(config.model, ...)`; a bad override is an expected
    failure."""
    import keras_vit

    try:
        return keras_vit.ViT(config.model, **{**model_kwargs(config), **kwargs})
    except (ValueError, TypeError) as error:
        raise RecipeError(f"the model (--model={config.model}, --model_overrides): {error}") from None


def hidden_size(config):
    """The width of the configured model, without building it."""
    from keras_vit import variants

    if "hidden_size" in config.model_overrides:
        return int(config.model_overrides["hidden_size"])
    if config.model is None:
        return int(variants.DEFAULTS["hidden_size"])
    return int(variants.resolve_variant(config.model)[1]["hidden_size"])


# ---------------------------------------------------------------------------
# Compilation, metrics, progress.
# ---------------------------------------------------------------------------


def compile_options(config):
    """`jit_compile` and `steps_per_execution` of `model.compile`, from
    `--jit_compile` (auto, true or false) and `--steps_per_execution`."""
    return dict(jit_compile=check_auto_bool(config, "jit_compile"), steps_per_execution=config.steps_per_execution)


def compile_model(model, optimizer, loss, config):
    import keras

    from recipes import reporting

    model.compile(
        optimizer=optimizer,
        loss=loss,
        **compile_options(config),
        # Weighted: evaluation batches are padded with weight-0 rows.
        weighted_metrics=[
            keras.metrics.CategoricalAccuracy(name="accuracy"), reporting.ExampleCount(),
            reporting.weighted_loss_metric(loss),
        ],
    )


_WARNED = {"tensorboard": False}


def tensorboard_available():
    """TensorBoard logs need the `tensorboard` package; without it the run
    logs to history.csv only."""
    import importlib.util

    available = importlib.util.find_spec("tensorboard") is not None
    if not available and not _WARNED["tensorboard"]:
        _WARNED["tensorboard"] = True
        print("Note: `tensorboard` is not installed, so no TensorBoard logs are written "
              "(history.csv has the same numbers). `pip install tensorboard` to get them.")
    return available


# ---------------------------------------------------------------------------
# Training and evaluation.
# ---------------------------------------------------------------------------


def print_header(lines):
    print("\n".join(line for line in lines if line), flush=True)


def train_and_evaluate(
    config,
    *,
    run_dir,
    setup,
    build,
    train_data,
    eval_data=None,
    eval_label="the test split",
    header=(),
    callbacks=(),
    save=None,
):
    """Trains one model for `config.total_steps` updates and evaluates it.

    Resumable: a `result.json` in `run_dir` means the run is finished (its
    result is returned as is); otherwise training starts, or resumes from
    the checkpoint in `run_dir/checkpoints` after an interruption
    (`keras_vit.training.BackupAndResume`), and ends with the same number
    of updates.

    Args:
        config: the recipe's config (steps, batch sizes, logging).
        run_dir: directory of this run.
        setup: a `keras_vit.distribute.DistributionSetup`.
        build: function `() -> (compiled model, list of notes)`, called in
            the distribution scope.
        train_data: function `(micro_batch_size) -> tf.data.Dataset` of
            training batches (repeating).
        eval_data: function `(batch_size) -> tf.data.Dataset` of evaluation
            batches (one pass, padded to full weighted batches: a pipeline's
            `pad_to_batch=True`), or None.
        eval_label: what the evaluation runs on, for the progress output.
        header: lines printed at the start (before the model's).
        callbacks: extra Keras callbacks.
        save: function `(model, run_dir) -> dict of written files`, or None.

    Returns:
        The result dict (also in `run_dir/result.json`).
    """
    import keras

    from keras_vit import training
    from recipes import reporting

    result_path = os.path.join(run_dir, "result.json")
    finished = read_json(result_path)
    if finished is not None:
        return finished
    log_every, checkpoint_every = log_interval(config.log_every, config.total_steps), config.checkpoint_every
    accum = config.accum_steps
    micro_batch = config.batch_size // accum
    total = config.total_steps
    verbose = config.verbose
    os.makedirs(run_dir, exist_ok=True)
    start = time.perf_counter()
    eval_batch = getattr(config, "eval_batch_size", None)

    with setup.scope():
        model, notes = build()
        if verbose:
            print_header([
                *header,
                f"  model: {model.name}, {model.count_params():,} parameters",
                *(f"    {note}" for note in notes),
                f"  updates: {total:,} of {config.batch_size}"
                + (f" ({accum} x {micro_batch})" if accum > 1 else "")
                + f", warmup {config.warmup_steps}, lr {config.learning_rate:g}; "
                f"log every {log_every}, checkpoint every {checkpoint_every}",
            ])
        backup = training.BackupAndResume(os.path.join(run_dir, "checkpoints"), save_freq=checkpoint_every * accum)
        timer = reporting.ThroughputTimer()
        shown = reporting.Progress(total, log_every, accum, verbose)
        shown.eval_label = eval_label
        fit_callbacks = [
            backup,
            reporting.ResumedMessage(backup, total),
            keras.callbacks.CSVLogger(os.path.join(run_dir, "history.csv"), append=True),
            timer,
            shown,
            *callbacks,
        ]
        if tensorboard_available():
            fit_callbacks.insert(3, keras.callbacks.TensorBoard(os.path.join(run_dir, "logs"), write_graph=False))
        validation = {}
        eval_every = getattr(config, "eval_every", 0) or 0
        if eval_every and eval_data is not None:
            validation = dict(validation_data=eval_data(eval_batch), validation_freq=eval_every // log_every)
        try:
            model.fit(
                train_data(micro_batch),
                steps_per_epoch=log_every * accum,
                epochs=total // log_every,
                shuffle=False,
                verbose=0,
                callbacks=fit_callbacks,
                **validation,
            )
        except training.CheckpointWriteError as error:  # e.g. a full disk: the message says what was kept
            raise RecipeError(str(error)) from None
        # Keras counts real updates (micro-batches // accum_steps) in `iterations`.
        steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        train_time = time.perf_counter() - start
        evaluation = {}
        if eval_data is not None:
            logs = model.evaluate(eval_data(eval_batch), verbose=0, return_dict=True, callbacks=[shown])
            evaluation = {
                "accuracy": float(logs["accuracy"]),
                "eval_loss": float(logs["loss"]),
                "eval_examples": int(round(logs["examples"])),
            }

    history = read_history(os.path.join(run_dir, "history.csv"))
    losses = history.get("loss") or []
    result = {
        "steps": steps,
        "batch_size": config.batch_size,
        "accum_steps": accum,
        "examples_seen": steps * config.batch_size,
        "final_loss": float(losses[-1]) if losses else None,
        "images_per_second": timer.timed_batches * micro_batch / timer.elapsed if timer.elapsed > 0 else None,
        "train_wall_time_s": train_time,
        "wall_time_s": time.perf_counter() - start,
        "resumed_from_step": backup.resumed_from["step"] if backup.resumed_from else None,
        "history": history,
        "notes": notes,
        **evaluation,
    }
    if save is not None:
        result.update(save(model, run_dir))
    write_json(result_path, result)
    return result


def read_history(path):
    """The whole run's history from `history.csv`: `{metric: [per epoch]}`.

    Keras' `History` holds only this process's epochs, and a resumed run
    logs the epoch it was killed in once more (the later row wins: it
    continues bit for bit)."""
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


def save_classifier(model, run_dir):
    """`model.keras` (weights and architecture, no optimizer state) and the
    original-format `model.npz`."""
    import keras

    import keras_vit

    npz = keras_vit.export_npz(model, os.path.join(run_dir, "model.npz"))
    # A copy without the optimizer: the final model is for inference and
    # fine-tuning; resumable state lives in checkpoints/.
    final = keras.Model.from_config(model.get_config())
    final.set_weights(model.get_weights())
    path = os.path.join(run_dir, "model.keras")
    final.save(path)
    return {"model_keras": path, "model_npz": npz}


def sweep(grid, fit, label):
    """Runs `fit(changes, name)` (returning a validation accuracy) for each
    `(name, changes)` of `grid`; returns `(best changes, rows)`.

    The first of the best wins ties (the grids are in increasing order:
    smaller learning rates, shorter runs first), as the paper's protocol.
    """
    rows = []
    for name, changes in grid:
        accuracy = fit(changes, name)
        rows.append(dict(changes, val_accuracy=accuracy))
        print(f"sweep {name}: accuracy on {label} {accuracy:.4f}", flush=True)
    best = max(rows, key=lambda row: row["val_accuracy"])
    return {k: v for k, v in best.items() if k != "val_accuracy"}, rows


# ---------------------------------------------------------------------------
# The skeleton.
# ---------------------------------------------------------------------------


def start_header(recipe, run_dir, setup, config):
    """The first lines of a run: where it writes, how it runs."""
    import keras

    lines = [
        f"== {recipe}: {run_dir}",
        f"  tensorboard --logdir {os.path.join(run_dir, 'logs')}",
        f"  backend {keras.backend.backend()}, distribution {setup.mode} ({setup.num_replicas} "
        f"replica{'s' if setup.num_replicas != 1 else ''}), dtype policy {config.dtype_policy}",
    ]
    if getattr(config, "model", "absent") != "absent":
        weights = getattr(config, "weights", None)
        lines.append(f"  model {config.model or 'custom'}" + (f", weights {weights}" if weights else ", random init"))
        warning = inherited_dropout_warning(config)
        if warning:
            lines.append(warning)
    return lines


def print_summary(title, summary, keys):
    lines = [title]
    for key in keys:
        if summary.get(key) is not None:
            value = summary[key]
            if isinstance(value, float):
                value = f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
            lines.append(f"  {key}: {value}")
    print("\n".join(lines), flush=True)


@contextlib.contextmanager
def open_run(recipe, config, config_name):
    """The start of every run, before the distribution: an unknown
    `--model` refused, the run directory claimed (`rundir.claim`: new,
    empty or this recipe's own, locked while the block runs) and the config
    recorded (`record_config`). Yields the run directory."""
    check_model(config)
    config.run_dir = config.run_dir or os.path.join("runs", recipe, config_name or "custom")
    with rundir.claim(config.run_dir, config.overwrite) as run_dir:
        record_config(config, recipe, config_name, run_dir)
        yield run_dir


def start_run(recipe, config, run_dir):
    """The seeds, dtype policy and distribution set up (`set_up`), the
    batches checked against its replicas (`check_batches`); returns
    `(setup, start header lines)`."""
    setup = set_up(config)
    check_batches(config, setup)
    return setup, start_header(recipe, run_dir, setup, config)


def run_recipe(recipe, config, config_name, *, smoke, body, title, summary_keys):
    """Opens the run directory, sets up the distribution, runs `body` and
    writes the summary.

    `body(run_dir, setup, header)` returns the recipe's result dict; `header`
    are the start lines to print with the model's. A finished run (its
    `summary.json` exists) prints the summary's `summary_keys` again and
    trains no more.
    """
    with open_run(recipe, config, config_name) as run_dir:
        summary_path = os.path.join(run_dir, "summary.json")
        done = read_json(summary_path)
        if done is not None:
            print_summary(f"{title} finished earlier: {run_dir}", done, summary_keys)
            return done
        setup, header = start_run(recipe, config, run_dir)
        with smoke_mode(config, smoke):
            result = body(run_dir, setup, header)
        summary = {
            "recipe": recipe,
            "config_name": config_name,
            "config": jsonable(config),
            **result,
            **environment(setup),
            # From the run's first start, interruptions included.
            "total_wall_time_s": time.time() - read_json(os.path.join(run_dir, "config.json"))["started"],
        }
        write_json(summary_path, summary)
    print_summary(f"{title} finished: {run_dir}", summary, summary_keys)
    return summary
