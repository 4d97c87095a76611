"""What the recipes share: flags, run directories, data sources, the
training/evaluation loop, smoke-mode data.

Everything here is glue over keras_vit's library code (`keras_vit.data`,
`keras_vit.training`, `keras_vit.distribute`, the models and weights).
"""

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time

from recipes import configs as configs_lib

# ---------------------------------------------------------------------------
# Flags: every config field is a `--field=value` flag.
# ---------------------------------------------------------------------------

_NONE = ("none", "null", "")


def _parse_bool(text):
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _optional(parse):
    def parse_optional(text):
        if text is None or str(text).strip().lower() in _NONE:
            return None
        return parse(text)

    return parse_optional


def _parse_list(parse):
    def parse_list(text):
        if isinstance(text, (list, tuple)):
            return tuple(parse(t) for t in text)
        parts = [p for p in str(text).replace(" ", "").split(",") if p]
        if not parts:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return tuple(parse(p) for p in parts)

    return parse_list


def _parse_json(text):
    if isinstance(text, dict):
        return dict(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({e})")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


PARSERS = {
    "int": int,
    "float": float,
    "str": str,
    "bool": _parse_bool,
    "int?": _optional(int),
    "float?": _optional(float),
    "str?": _optional(str),
    "ints": _parse_list(int),
    "floats": _parse_list(float),
    "json": _parse_json,
}


def _show(value):
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return "none" if value is None else str(value)


def parse_flags(argv, *, fields, named_configs, default_config, smoke, description, prog):
    """Parses `argv` into `(config_name, config dict, smoke)`.

    The value of a field is, by increasing priority: the field's default, the
    named config (`--config=NAME`), the smoke settings (`--smoke`), the flag
    given on the command line (`--field=value`, also `--field value`).

    Args:
        argv: command-line arguments (without the program name), or None for
            `sys.argv[1:]`.
        fields: the recipe's list of `configs.Field`.
        named_configs: `{name: function returning the fields it sets}`.
        default_config: the config used without `--config` (or None).
        smoke: the fields `--smoke` sets.
        description: text of `--help`.
        prog: program name in `--help`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    names = sorted(named_configs)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=default_config)
    pre.add_argument("--smoke", nargs="?", const=True, default=False, type=_parse_bool)
    known, _ = pre.parse_known_args(argv)
    values = configs_lib.defaults(fields)
    if known.config is not None:
        if known.config not in named_configs:
            raise SystemExit(
                f"{prog}: error: unknown config; expected one of {names}. "
                f"Received: config={known.config!r}"
            )
        values.update(configs_lib.named(named_configs, known.config))
    if known.smoke:
        values.update(smoke)
    epilog = None
    if names:
        epilog = "Named configs (--config=NAME):\n" + "\n".join(
            f"  {name}: {(named_configs[name].__doc__ or '').strip().splitlines()[0]}" for name in names
        )
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if names:
        parser.add_argument(
            "--config", default=default_config, choices=names,
            help=f"named config (default: {default_config})",
        )
    if smoke:
        parser.add_argument(
            "--smoke", nargs="?", const=True, default=False, type=_parse_bool,
            help="a tiny model for a few steps on generated data: runs in seconds, checks the set-up",
        )
    for field in fields:
        parse = PARSERS[field.kind]
        kwargs = dict(type=parse, default=values[field.name], metavar=field.kind.upper().rstrip("?"))
        if field.kind == "bool":
            kwargs.update(nargs="?", const=True, metavar="BOOL")
        flags = [f"--{field.name}"]
        if "_" in field.name:
            flags.append(f"--{field.name.replace('_', '-')}")
        parser.add_argument(
            *flags, dest=field.name,
            # argparse %-formats help strings.
            help=f"{field.help} (default: {_show(values[field.name])})".replace("%", "%%"),
            **kwargs,
        )
    args = parser.parse_args(argv)
    config = {field.name: getattr(args, field.name) for field in fields}
    return getattr(args, "config", None), config, bool(getattr(args, "smoke", False))


# ---------------------------------------------------------------------------
# Run directories.
# ---------------------------------------------------------------------------

# Fields that may change between an interrupted run and its resumption.
RESUMABLE_CHANGES = frozenset(
    ("run_dir", "overwrite", "distribution", "verbose", "data_dir", "download", "manual_dir", "tasks",
     "jit_compile", "steps_per_execution")
)


def write_json(path, value):
    """Writes JSON atomically (a kill never leaves half a file)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, tmp = tempfile.mkstemp(suffix=".json", dir=directory)
    with os.fdopen(handle, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)
    return path


def _json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def read_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def jsonable(config):
    return json.loads(json.dumps(config, default=_json_default))


def prepare_run_dir(config, recipe, config_name):
    """Creates (or reopens) the run directory and records the config.

    A run directory holds one run: started again with the same config it
    resumes; with a different config it is an error (naming the fields),
    unless `overwrite` is set.
    """
    run_dir = config["run_dir"] or os.path.join("runs", recipe, config_name or "custom")
    config["run_dir"] = run_dir
    path = os.path.join(run_dir, "config.json")
    saved = read_json(path)
    if saved is not None and config.get("overwrite"):
        shutil.rmtree(run_dir)
        saved = None
    current = jsonable(config)
    if saved is not None:
        before = saved.get("config", {})
        changed = sorted(
            k for k in set(before) | set(current)
            if k not in RESUMABLE_CHANGES and before.get(k) != current.get(k)
        )
        if changed:
            details = ", ".join(f"{k}: {before.get(k)!r} -> {current.get(k)!r}" for k in changed)
            raise ValueError(
                f"The run directory {run_dir!r} holds a run with another config ({details}). "
                "Run the same command to resume it, pass another --run_dir, or "
                f"--overwrite to start over. Received: run_dir={run_dir!r}"
            )
    os.makedirs(run_dir, exist_ok=True)
    write_json(path, {"recipe": recipe, "config_name": config_name, "config": current})
    return run_dir


# ---------------------------------------------------------------------------
# Data.
# ---------------------------------------------------------------------------


def is_folder_dataset(dataset):
    return dataset.startswith("gs://") or os.path.isdir(dataset)


def load_source(config, split):
    """A `keras_vit.data.DataSource` for one split of `config["dataset"]`:
    a tfds dataset (any split string) or `<folder>/<split>/<class>/<image>`."""
    from keras_vit import data

    dataset = config["dataset"]
    if not dataset:
        raise ValueError(
            "This config needs a dataset: a tfds name or a folder with one sub-folder per "
            "split (e.g. train/ and val/), each holding one sub-folder of images per class. "
            f"Pass --dataset=... Received: dataset={dataset!r}"
        )
    if is_folder_dataset(dataset):
        return data.from_directory(os.path.join(dataset, split))
    return data.from_tfds(
        dataset,
        split,
        data_dir=config.get("data_dir"),
        download=config.get("download", True),
        manual_dir=config.get("manual_dir"),
    )


def cache_setting(config):
    value = str(config.get("cache", "auto")).lower()
    if value == "auto":
        return "auto"
    return _parse_bool(value)


def pad_eval_batches(dataset, batch_size):
    """(images, labels) batches -> (images, labels, weights) of exactly
    `batch_size` rows: the last batch is padded with weight-0 rows.

    One static shape for every evaluation step (one compiled function, XLA
    and TPU friendly), batches that split evenly over replicas, and an exact
    accuracy through weighted metrics.
    """
    import tensorflow as tf

    def pad(images, labels):
        n = tf.shape(images)[0]
        missing = batch_size - n
        images = tf.pad(images, [[0, missing], [0, 0], [0, 0], [0, 0]])
        labels = tf.pad(labels, [[0, missing], [0, 0]])
        weights = tf.concat([tf.ones([n]), tf.zeros([missing])], 0)
        images.set_shape([batch_size] + images.shape[1:].as_list())
        labels.set_shape([batch_size] + labels.shape[1:].as_list())
        weights.set_shape([batch_size])
        return images, labels, weights

    return dataset.map(tf.autograph.experimental.do_not_convert(pad))


# Image keys of each mocked builder: grey-scale ones get one channel; dSprites
# pixels are 0/1.
_GREY = ("dsprites", "smallnorb")


@contextlib.contextmanager
def smoke_data(num_examples=16):
    """Replaces every tensorflow-datasets dataset by generated examples.

    Used by `--smoke`: no download, a few examples per split, with the
    features the recipes read (`image` as PNG bytes, `label`, and for the
    VTAB tasks CLEVR/KITTI `objects` and the dSprites / sNORB attributes)
    in their valid ranges. Yields a manual-download directory (with a
    placeholder file) for datasets such as ImageNet.
    """
    import tensorflow as tf
    import tensorflow_datasets as tfds

    def as_dataset(builder, split, decoders=None, read_config=None, shuffle_files=False, **kwargs):
        name = builder.name
        features = builder.info.features
        label = features["label"] if "label" in features else None
        num_classes = getattr(label, "num_classes", None) or 10
        channels = 1 if name in _GREY else 3

        def example(i):
            pixels = tf.random.stateless_uniform(
                [8, 8, channels], seed=tf.stack([i, tf.constant(7, tf.int64)]), maxval=256,
                dtype=tf.int32,
            )
            if name == "dsprites":
                pixels = pixels % 2
            out = {
                "image": tf.io.encode_png(tf.cast(pixels, tf.uint8)),
                "label": i % num_classes,
            }
            if name == "clevr":
                count = 3 + i % 8
                depth = 7.0 + tf.cast(i % 7, tf.float32) * 0.6
                out["objects"] = {
                    "size": tf.zeros([count], tf.int64),
                    "pixel_coords": tf.fill(tf.stack([count, tf.constant(3, tf.int64)]), depth),
                }
            elif name == "kitti":
                out["objects"] = {
                    "type": tf.constant([0, 3], tf.int64),
                    "location": tf.reshape(
                        tf.stack([0.0, 0.0, 5.0 + 10.0 * tf.cast(i % 3, tf.float32), 0.0, 0.0, 1.0]),
                        [2, 3],
                    ),
                }
            elif name == "dsprites":
                out["label_x_position"] = i % 32
                out["label_orientation"] = i % 40
            elif name == "smallnorb":
                out["label_azimuth"] = i % 18
                out["label_elevation"] = i % 9
            return out

        return tf.data.Dataset.range(num_examples).map(example)

    manual_dir = tempfile.mkdtemp(prefix="keras_vit_smoke_manual_")
    with open(os.path.join(manual_dir, "placeholder"), "w") as f:
        f.write("smoke mode: tensorflow-datasets is mocked\n")
    try:
        with tfds.testing.mock_data(num_examples=num_examples, as_dataset_fn=as_dataset):
            yield manual_dir
    finally:
        shutil.rmtree(manual_dir, ignore_errors=True)


@contextlib.contextmanager
def maybe_smoke_data(config, smoke):
    """`smoke_data()` for a tfds dataset in smoke mode, else nothing."""
    dataset = config.get("dataset")
    if not smoke or (dataset and is_folder_dataset(dataset)):
        yield
        return
    with smoke_data() as manual_dir:
        previous = config.get("manual_dir")
        config["manual_dir"] = previous or manual_dir
        try:
            yield
        finally:
            config["manual_dir"] = previous


@contextlib.contextmanager
def exit_on_missing_data():
    """Command-line runs: a dataset that is not available ends the program
    with its message (what to download, where to put it), not a traceback."""
    from keras_vit.data import DatasetNotAvailableError

    try:
        yield
    except DatasetNotAvailableError as error:
        raise SystemExit(f"error: {error}") from None


# ---------------------------------------------------------------------------
# Models.
# ---------------------------------------------------------------------------


def model_fields(config):
    """`(variant, keyword arguments)` for `keras_vit.ViT` from the config."""
    kwargs = dict(config.get("model_overrides") or {})
    if config.get("dropout_rate") is not None:
        kwargs["dropout_rate"] = config["dropout_rate"]
    return config.get("model"), kwargs


def hidden_size(variant, overrides):
    from keras_vit.models import variants

    if "hidden_size" in overrides:
        return int(overrides["hidden_size"])
    if variant is None:
        return int(variants.DEFAULTS["hidden_size"])
    return int(variants.resolve_variant(variant)[1]["hidden_size"])


def zero_head(model, bias=0.0):
    """Zero head kernel, constant bias: the fresh head of paper Sec. 3.2."""
    import numpy as np

    head = model.get_layer("head")
    head.kernel.assign(np.zeros(tuple(head.kernel.shape), "float32"))
    head.bias.assign(np.full(tuple(head.bias.shape), bias, "float32"))


# ---------------------------------------------------------------------------
# Training and evaluation.
# ---------------------------------------------------------------------------


def _keras():
    import keras

    return keras


def example_count_metric():
    """A Keras metric counting the evaluated examples (weights summed)."""
    keras = _keras()

    class ExampleCount(keras.metrics.Metric):
        def __init__(self, name="examples", **kwargs):
            super().__init__(name=name, **kwargs)
            self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")

        def update_state(self, y_true, y_pred, sample_weight=None):
            ops = keras.ops
            if sample_weight is None:
                count = ops.cast(ops.shape(y_true)[0], "float32")
            else:
                count = ops.sum(ops.cast(sample_weight, "float32"))
            self.total.assign_add(count)

        def result(self):
            return keras.ops.cast(self.total, "float32")

        def reset_state(self):
            self.total.assign(0.0)

    return ExampleCount()


def jit_compile_setting(config):
    value = str(config.get("jit_compile", "auto")).lower()
    return "auto" if value == "auto" else _parse_bool(value)


def compile_model(model, optimizer, loss, config):
    keras = _keras()
    model.compile(
        optimizer=optimizer,
        loss=loss,
        jit_compile=jit_compile_setting(config),
        steps_per_execution=config.get("steps_per_execution", 1),
        # Weighted: evaluation batches are padded with weight-0 rows.
        weighted_metrics=[keras.metrics.CategoricalAccuracy(name="accuracy"), example_count_metric()],
    )


def throughput_timer(skip=2):
    """A Keras callback timing the training batches after the first `skip`
    (compilation, warm-up), for the throughput in the summary."""
    keras = _keras()

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches = 0
            self.start = None
            self.timed_batches = 0
            self.elapsed = 0.0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1
            now = time.perf_counter()
            if self.batches == skip:
                self.start = now
            elif self.start is not None:
                self.timed_batches = self.batches - skip
                self.elapsed = now - self.start

    return Timer()


def tensorboard_available():
    """TensorBoard logs need the `tensorboard` package (`pip install
    tensorboard`); without it the run logs to history.csv only."""
    import importlib.util

    available = importlib.util.find_spec("tensorboard") is not None
    if not available and not _WARNED["tensorboard"]:
        _WARNED["tensorboard"] = True
        print("Note: `tensorboard` is not installed, so no TensorBoard logs are written "
              "(history.csv has the same numbers). `pip install tensorboard` to get them.")
    return available


_WARNED = {"tensorboard": False}


def check_schedule(config):
    """Validates the step settings; returns `(log_every, checkpoint_every)`
    with log_every dividing total_steps (Keras epochs have a fixed size)."""
    total = config["total_steps"]
    for name in ("total_steps", "batch_size", "accum_steps", "eval_batch_size", "log_every"):
        value = config[name]
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
    if config["batch_size"] % config["accum_steps"]:
        raise ValueError(
            "`batch_size` must be a multiple of `accum_steps` (micro-batch = batch_size / "
            f"accum_steps). Received: batch_size={config['batch_size']}, "
            f"accum_steps={config['accum_steps']}"
        )
    if config["warmup_steps"] < 0 or config["warmup_steps"] >= total:
        raise ValueError(
            f"`warmup_steps` must be in [0, total_steps={total}). "
            f"Received: warmup_steps={config['warmup_steps']}"
        )
    log_every = min(config["log_every"], total)
    while total % log_every:
        log_every -= 1
    checkpoint_every = config["checkpoint_every"]
    if not isinstance(checkpoint_every, int) or checkpoint_every <= 0:
        raise ValueError(
            f"`checkpoint_every` must be a positive int. Received: checkpoint_every={checkpoint_every!r}"
        )
    eval_every = config.get("eval_every", 0) or 0
    if eval_every and eval_every % log_every:
        raise ValueError(
            f"`eval_every` must be a multiple of log_every={log_every}. Received: eval_every={eval_every}"
        )
    return log_every, checkpoint_every


def train_and_evaluate(
    config,
    *,
    run_dir,
    setup,
    build,
    train_data,
    eval_data=None,
    callbacks=(),
    save_model=True,
):
    """Trains one model for `config["total_steps"]` updates and evaluates it.

    Resumable: a `result.json` in `run_dir` means the run is finished (its
    result is returned as is); otherwise training starts, or resumes from
    the checkpoint in `run_dir/checkpoints` after an interruption
    (`keras_vit.training.BackupAndResume`), and ends with the same number
    of updates.

    Args:
        config: the recipe's config (steps, batch sizes, logging).
        run_dir: directory of this run.
        setup: a `keras_vit.distribute.DistributionSetup`.
        build: function `() -> (compiled model, dict of notes)`, called in
            the distribution scope.
        train_data: function `(micro_batch_size) -> tf.data.Dataset` of
            training batches (repeating).
        eval_data: function `(batch_size) -> tf.data.Dataset` of evaluation
            batches (one pass), or None.
        callbacks: extra Keras callbacks.
        save_model: write `model.keras` and `model.npz`.

    Returns:
        The result dict (also in `run_dir/result.json`).
    """
    keras = _keras()
    from keras_vit import training

    result_path = os.path.join(run_dir, "result.json")
    finished = read_json(result_path)
    if finished is not None:
        return finished
    log_every, checkpoint_every = check_schedule(config)
    accum = config["accum_steps"]
    micro_batch = config["batch_size"] // accum
    setup.per_replica_batch_size(micro_batch)
    setup.per_replica_batch_size(config["eval_batch_size"])
    total = config["total_steps"]
    epochs = total // log_every
    os.makedirs(run_dir, exist_ok=True)
    start = time.perf_counter()

    with setup.scope():
        model, notes = build()
        backup = training.BackupAndResume(
            os.path.join(run_dir, "checkpoints"), save_freq=checkpoint_every * accum
        )
        timer = throughput_timer()
        fit_callbacks = [
            backup,
            keras.callbacks.CSVLogger(os.path.join(run_dir, "history.csv"), append=True),
            timer,
            *callbacks,
        ]
        if tensorboard_available():
            fit_callbacks.insert(2, keras.callbacks.TensorBoard(os.path.join(run_dir, "logs"), write_graph=False))
        validation = {}
        eval_every = config.get("eval_every", 0) or 0
        if eval_every and eval_data is not None:
            validation = dict(
                validation_data=pad_eval_batches(eval_data(config["eval_batch_size"]), config["eval_batch_size"]),
                validation_freq=eval_every // log_every,
            )
        history = model.fit(
            train_data(micro_batch),
            steps_per_epoch=log_every * accum,
            epochs=epochs,
            shuffle=False,
            verbose=config.get("verbose", 1),
            callbacks=fit_callbacks,
            **validation,
        )
        # Keras counts real updates (micro-batches // accum_steps) in `iterations`.
        steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        train_time = time.perf_counter() - start
        evaluation = {}
        if eval_data is not None:
            logs = model.evaluate(
                pad_eval_batches(eval_data(config["eval_batch_size"]), config["eval_batch_size"]),
                verbose=config.get("verbose", 1),
                return_dict=True,
            )
            evaluation = {"accuracy": float(logs["accuracy"]), "eval_examples": int(round(logs["examples"]))}

    losses = history.history.get("loss") or []
    result = {
        "steps": steps,
        "batch_size": config["batch_size"],
        "accum_steps": accum,
        "examples_seen": steps * config["batch_size"],
        "final_loss": float(losses[-1]) if losses else None,
        "images_per_second": (
            timer.timed_batches * micro_batch / timer.elapsed if timer.elapsed > 0 else None
        ),
        "train_wall_time_s": train_time,
        "wall_time_s": time.perf_counter() - start,
        "resumed_from_step": backup.resumed_from["step"] if backup.resumed_from else None,
        "notes": notes,
        **evaluation,
    }
    if save_model:
        result.update(save_final_model(model, run_dir))
    write_json(result_path, result)
    return result


def save_final_model(model, run_dir):
    """`model.keras` (weights and architecture, no optimizer state) and the
    original-format `model.npz`."""
    keras = _keras()
    import keras_vit

    npz = keras_vit.export_npz(model, os.path.join(run_dir, "model.npz"))
    # A copy without the optimizer: the final model is for inference and
    # fine-tuning; resumable state lives in checkpoints/.
    final = keras.Model.from_config(model.get_config())
    final.set_weights(model.get_weights())
    path = os.path.join(run_dir, "model.keras")
    final.save(path)
    return {"model_keras": path, "model_npz": npz}


def environment(setup):
    keras = _keras()
    return {
        "backend": keras.backend.backend(),
        "keras_version": keras.__version__,
        "distribution": setup.mode,
        "replicas": setup.num_replicas,
        "dtype_policy": keras.config.dtype_policy().name,
    }


def set_up(config):
    """Seeds, dtype policy and the distribution; returns the
    `DistributionSetup`."""
    keras = _keras()
    from keras_vit import distribute

    keras.utils.set_random_seed(config["seed"])
    keras.config.set_dtype_policy(config["dtype_policy"])
    return distribute.get_distribution(config["distribution"])


def print_summary(title, summary, keys):
    lines = [title]
    for key in keys:
        if summary.get(key) is not None:
            value = summary[key]
            if isinstance(value, float):
                value = f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
            lines.append(f"  {key}: {value}")
    print("\n".join(lines), flush=True)


def steps_from_epochs(epochs, num_examples, batch_size):
    """round(epochs * examples / batch), at least 1."""
    return max(1, int(round(epochs * num_examples / batch_size)))
