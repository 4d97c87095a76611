"""The one trainer behind every training recipe.

`run` is a recipe's whole run: the checks, the run directory, the
distribution, then `train` (through `sweep_and_train`), then the summary.
`train` is one training run, top to bottom: data, model and weights,
optimizer and schedule, compile, fit, evaluate, save. What differs between
the recipes is data in their configs (`recipes/configs.py`). Resumable: a
checkpoint at the end of every `checkpoint_every` updates (whole Keras
epochs), restored before `fit`, which starts at its epoch
(`fit(initial_epoch=...)`); a finished run is not trained again.

Keras and TensorFlow are imported inside the functions, after the flags are
parsed (`--help` stays fast).
"""

import math
import os
import time

from recipes import checks
from recipes import inputs
from recipes import rundir
from recipes.cli import RecipeError
from recipes.configs import MppConfig
from recipes.rundir import read_json
from recipes.rundir import write_json


def run(recipe, config, config_name=None, *, smoke=False, callbacks=()):
    """Runs `config` (a `TrainConfig` or `MppConfig`) as `recipe` (a
    `recipes.configs.Recipe`): the checks, the run directory, the
    distribution, the sweep when asked, the training, `summary.json`. A
    finished run prints its summary again and trains no more."""
    checks.check(config)
    with rundir.open_run(recipe.name, config, config_name) as run_dir:
        summary_path = os.path.join(run_dir, "summary.json")
        done = read_json(summary_path)
        if done is not None:
            print_summary(f"{recipe.title} finished earlier: {run_dir}", done, recipe.summary_keys)
            return done
        setup = checks.set_up(config)
        header = start_header(recipe.name, run_dir, setup, config)
        with inputs.smoke_mode(config, smoke):
            if isinstance(config, MppConfig):  # no labels: nothing to sweep over
                result = train(config, run_dir, setup, header=header, callbacks=callbacks)
            else:
                result = sweep_and_train(config, run_dir, run_dir, setup, header=header, callbacks=callbacks)
        summary = {
            "recipe": recipe.name, "config_name": config_name, "config": rundir.jsonable(config), **result,
            **environment(setup),
            # From the run's first start, interruptions included.
            "total_wall_time_s": time.time() - read_json(os.path.join(run_dir, "config.json"))["started"],
        }
        write_json(summary_path, summary)
    print_summary(f"{recipe.title} finished: {run_dir}", summary, recipe.summary_keys)
    return summary


def sweep_and_train(config, sweep_dir, final_dir, setup, *, header=(), callbacks=(), save=True):
    """With `--sweep`, the paper's protocol: every learning rate of
    `lr_grid` (times every length of `steps_grid`) trained on
    `sweep_train_split` and scored on `sweep_val_split`; the first of the
    best (the grids go from small to large) is trained on `train_split` and
    reported on `test_split`. Without, that last run alone."""
    best, rows = {}, []
    if config.sweep:
        lengths = list(zip(config.steps_grid, config.warmup_grid)) or [(None, None)]
        for steps, warmup in lengths:
            for lr in config.lr_grid:
                changes = dict(learning_rate=lr)
                name = f"lr_{lr:g}"
                if steps is not None:
                    changes.update(total_steps=steps, warmup_steps=warmup)
                    name += f"-steps_{steps}"
                trial = train(
                    config.replace(**changes, train_split=config.sweep_train_split,
                                   test_split=config.sweep_val_split),
                    os.path.join(sweep_dir, "sweep", name), setup, callbacks=callbacks, save=False)
                rows.append(dict(changes, val_accuracy=trial["accuracy"]))
                print(f"sweep {name}: accuracy on {config.sweep_val_split!r} {trial['accuracy']:.4f}", flush=True)
        best = max(rows, key=lambda row: row["val_accuracy"])
        best = {k: v for k, v in best.items() if k != "val_accuracy"}
    final = config.replace(**best)
    result = train(final, final_dir, setup, header=header, callbacks=callbacks, save=save)
    return {"learning_rate": final.learning_rate, "warmup_steps": final.warmup_steps, "sweep": rows, **result}


def train(config, run_dir, setup, *, header=(), callbacks=(), save=True):
    """One training run in `run_dir`; returns its result (also
    `result.json`: a finished run returns it as is)."""
    import keras

    from keras_vit import training

    finished = read_json(os.path.join(run_dir, "result.json"))
    if finished is not None:
        return finished
    start = time.perf_counter()
    os.makedirs(run_dir, exist_ok=True)
    # Every run from the config's seed: a sweep's trials and final run (and
    # a resumed sweep's) do not depend on what trained before them.
    keras.utils.set_random_seed(config.seed)
    # Data: training batches repeat; evaluation batches are padded to full
    # weighted batches (weight-0 rows), one static shape.
    data = inputs.load_data(config, run_dir)
    if data.eval is not None:
        inputs.read_first_batch(data.eval, "test_split", config.test_split)
    if not config.total_steps:  # from --epochs
        if not data.train_examples:
            raise RecipeError(f"the size of {config.train_split!r} is unknown, so --epochs cannot give the number "
                              "of steps: pass --total_steps. Received: --total_steps=0")
        config = config.replace(
            total_steps=checks.steps_from_epochs(config.epochs, data.train_examples, config.batch_size))
        try:
            checks.check_schedule(config)
        except RecipeError as error:  # the flag given, and the steps it came to
            raise RecipeError(f"--epochs={config.epochs:g} of {data.train_examples:,} examples at --batch_size="
                              f"{config.batch_size} is {config.total_steps:,} updates: {error}") from None
    accum, total = config.accum_steps, config.total_steps
    log_every = checks.log_interval(config.log_every, total)
    # Checkpoints land at epoch ends, where `fit(initial_epoch=...)` resumes.
    checkpoint_epochs = math.ceil(config.checkpoint_every / log_every)
    with setup.scope():
        # Model and weights.
        model, notes = build_model(config, data.num_classes, data.input_shape)
        # Optimizer and schedule.
        optimizer = make_optimizer(config, model)
        # Compile.
        compile_options = dict(jit_compile=checks.auto_bool(config, "jit_compile"),
                               steps_per_execution=config.steps_per_execution)
        if isinstance(config, MppConfig):  # the model computes its loss
            model.compile(optimizer=optimizer, **compile_options)
        else:
            loss = (training.SigmoidCrossEntropy if config.loss == "sigmoid" else training.SoftmaxCrossEntropy)(
                label_smoothing=config.label_smoothing)
            model.compile(optimizer=optimizer, loss=loss, weighted_metrics=training.padded_batch_metrics(loss),
                          **compile_options)
        if config.verbose:
            print("\n".join([
                *header, data.line, f"  model: {model.name}, {model.count_params():,} parameters",
                *(f"    {note}" for note in notes),
                f"  updates: {total:,} of {config.batch_size}"
                + (f" ({accum} x {config.batch_size // accum})" if accum > 1 else "")
                + f", warmup {config.warmup_steps}, lr {config.learning_rate:g}; log every {log_every}, "
                f"checkpoint every {checkpoint_epochs * log_every}",
            ]), flush=True)
        # Fit, from the last checkpoint.
        backup = training.BackupAndResume(os.path.join(run_dir, "checkpoints"),
                                          save_freq=checkpoint_epochs * log_every * accum)
        epochs = total // log_every
        try:
            initial_epoch = backup.restore(model, epochs=epochs, steps_per_epoch=log_every * accum)
        except ValueError as error:  # a checkpoint of another run
            raise RecipeError(str(error)) from None
        if backup.resumed_from:
            print(f"Resumed from update {backup.resumed_from['step']} of {total}", flush=True)
        rundir.trim_history(os.path.join(run_dir, "history.csv"), initial_epoch)
        timer = training.ThroughputTimer()
        progress = training.UpdateProgress(total, log_every, accum, config.verbose, data.eval_label)
        fit_callbacks = [backup, keras.callbacks.CSVLogger(os.path.join(run_dir, "history.csv"), append=True),
                         *tensorboard(os.path.join(run_dir, "logs")), timer, progress, *callbacks]
        validation = {}
        if data.eval is not None and config.eval_every:
            validation = dict(validation_data=data.eval(config.eval_batch_size),
                              validation_freq=config.eval_every // log_every)
        try:
            model.fit(data.train(config.batch_size // accum), steps_per_epoch=log_every * accum, epochs=epochs,
                      initial_epoch=initial_epoch, shuffle=False, verbose=0, callbacks=fit_callbacks, **validation)
        except training.CheckpointWriteError as error:  # e.g. a full disk: the message says what was kept
            raise RecipeError(str(error)) from None
        # Keras counts updates (micro-batches // accum_steps) in `iterations`.
        steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        train_time = time.perf_counter() - start
        # Evaluate.
        evaluation = {}
        if data.eval is not None:
            logs = model.evaluate(data.eval(config.eval_batch_size), verbose=0, return_dict=True,
                                  callbacks=[progress])
            evaluation = {"accuracy": float(logs["accuracy"]), "eval_loss": float(logs["loss"]),
                          "eval_examples": int(round(logs["examples"]))}
    # Save.
    files = save_model(model, run_dir) if save else {}
    history = rundir.read_history(os.path.join(run_dir, "history.csv"))
    losses = [value for value in history.get("loss", []) if value is not None]
    result = {
        "steps": steps, "total_steps": total, "batch_size": config.batch_size, "accum_steps": accum,
        "examples_seen": steps * config.batch_size, "final_loss": losses[-1] if losses else None,
        "images_per_second": timer.images_per_second(config.batch_size // accum),
        "train_wall_time_s": train_time, "wall_time_s": time.perf_counter() - start,
        "resumed_from_step": backup.resumed_from["step"] if backup.resumed_from else None,
        "history": history, "notes": notes, **data.description, **evaluation, **files,
    }
    write_json(os.path.join(run_dir, "result.json"), result)
    return result


# ---------------------------------------------------------------------------
# Model, optimizer, saving.
# ---------------------------------------------------------------------------


def model_kwargs(config):
    """`keras_vit.ViT`'s keyword arguments: `--dropout_rate` and
    `--drop_path_rate` (the named config's or the flag) unless
    `--model_overrides` gives its own, which wins."""
    kwargs = {name: getattr(config, name) for name in ("dropout_rate", "drop_path_rate")
              if getattr(config, name) is not None}
    return {**kwargs, **config.model_overrides}


def build_model(config, num_classes, input_shape):
    """`(model, notes)`: for classification, a `keras_vit.ViT` with the
    weights loaded (position embeddings resampled to the new grid), a zero
    head (paper Sec. 3.2: "we remove the pre-trained prediction head and
    attach a zero-initialized D x K feedforward layer") and, for a linear
    probe, a frozen backbone; for masked patch prediction, the
    `MaskedPatchPrediction` model around a headless ViT."""
    import keras_vit
    from keras_vit import pretraining

    kwargs = dict(model_kwargs(config), remat=config.remat)
    if isinstance(config, MppConfig):
        backbone = _vit(config, include_top=False, input_shape=input_shape, **kwargs)
        try:
            return pretraining.MaskedPatchPrediction(
                backbone, target=config.target, bits=config.bits, quantization=config.quantization,
                corruption_rate=config.corruption_rate, head_hidden_size=config.head_hidden_size, seed=config.seed,
            ), npz_notes(backbone, "encoder.npz", "backbone.keras")
        except ValueError as error:
            raise RecipeError(f"masked patch prediction: {error}") from None
    bias = kwargs.setdefault("head_bias_init", head_bias(config, num_classes))
    if config.pre_logits is not None and "representation_size" not in kwargs:
        kwargs["representation_size"] = checks.hidden_size(config) if config.pre_logits else None
    model = _vit(config, num_classes=num_classes, input_shape=input_shape, **kwargs)
    notes = []
    if config.weights:
        try:
            notes = list(keras_vit.load_weights(model, config.weights, variant=checks.check_model(config)))
        except (ValueError, OSError) as error:
            raise RecipeError(f"--weights={config.weights}: {error}") from None
    if config.reset_head:  # the builder's layers are kept (pre_logits too, when configured)
        model = keras_vit.reset_head(model, num_classes, keep_pre_logits=True, bias=bias)
        notes.append("head: zero-initialised for fine-tuning.")
    if config.linear_probe:
        keras_vit.freeze_backbone(model)
        notes.append("backbone frozen: only the head trains (linear probe).")
    if config.lora_rank:
        try:  # a rank past what the model's kernels can take
            keras_vit.enable_lora(model, config.lora_rank, targets=config.lora_targets)
        except ValueError as error:
            raise RecipeError(f"--lora_rank={config.lora_rank}: {error}") from None
        notes.append(f"LoRA rank {config.lora_rank} on {', '.join(config.lora_targets)}: "
                     f"{sum(int(math.prod(v.shape)) for v in model.trainable_weights):,} trainable parameters.")
    if config.remat:
        notes.append("remat: each encoder block's activations are recomputed in the backward pass.")
    if kwargs.get("representation_size") is not None or bias:
        notes.append(f"representation_size={kwargs.get('representation_size')}, head_bias_init={bias:g}")
    return model, notes + npz_notes(model, "model.npz", "model.keras")


def npz_notes(model, npz, keras_file):
    """Said before training: the original `.npz` has no keys for some
    options (`qk_norm`, registers, ...), so that file is not written."""
    from keras_vit.weights.npz import original_format_problems

    problems = original_format_problems(model)
    return [f"{npz}: not written, the original format has no keys for {', '.join(problems)} ({keras_file} holds "
            "the model)."] if problems else []


def _vit(config, **kwargs):
    import keras_vit

    try:
        return keras_vit.ViT(config.model, **kwargs)
    except (ValueError, TypeError) as error:
        raise RecipeError(f"the model (--model={config.model or 'none'}, --model_overrides): {error}") from None


def head_bias(config, num_classes):
    """0 for softmax; for sigmoid big_vision's -10 (ImageNet-21k) / -6.9
    (ImageNet-1k), about -log(num_classes) elsewhere."""
    from keras_vit import training

    if config.head_bias_init is not None:
        return float(config.head_bias_init)
    if config.loss != "sigmoid":
        return 0.0
    known = {21843: training.SIGMOID_HEAD_BIAS_INIT["imagenet21k"],
             1000: training.SIGMOID_HEAD_BIAS_INIT["imagenet2012"]}
    return known.get(num_classes, -math.log(num_classes))


def make_optimizer(config, model):
    """`--optimizer=sgd`: `keras_vit.training.finetuning_optimizer`; `adam`:
    `pretraining_optimizer`; each given only the fields it takes."""
    from keras_vit import training

    common = dict(warmup_steps=config.warmup_steps, decay_type=config.decay_type, global_clipnorm=config.grad_clip,
                  gradient_accumulation_steps=config.accum_steps if config.accum_steps > 1 else None)
    if config.optimizer == "sgd":
        return training.finetuning_optimizer(config.learning_rate, config.total_steps, momentum=config.momentum,
                                             accumulator_dtype=config.accumulator_dtype, **common)
    return training.pretraining_optimizer(
        model, config.learning_rate, config.total_steps, weight_decay=config.weight_decay,
        linear_end=config.linear_end, first_moment_dtype=config.first_moment_dtype, **common)


def save_model(model, run_dir):
    """A classifier: `model.keras` (no optimizer state: resumable state
    lives in checkpoints/) and the original-format `model.npz` (with LoRA:
    of the merged model, and the adapters and head alone in `lora.npz`). Masked
    patch prediction: `mpp.weights.h5`, the encoder as `encoder.npz` and as
    `backbone.keras`. No `.npz` for options that format lacks (`npz_notes`)."""
    import keras

    import keras_vit
    from keras_vit import pretraining
    from keras_vit.weights.npz import original_format_problems

    if isinstance(model, pretraining.MaskedPatchPrediction):
        model.save_weights(os.path.join(run_dir, "mpp.weights.h5"))
        backbone = os.path.join(run_dir, "backbone.keras")
        model.backbone.save(backbone)
        if original_format_problems(model.backbone):  # said at the start (`npz_notes`)
            return {"backbone_keras": backbone}
        return {"encoder_npz": model.export_encoder(os.path.join(run_dir, "encoder.npz")), "backbone_keras": backbone}
    files = {}
    if keras_vit.lora.lora_layers(model):  # the adapters and head alone, then the merged model
        files["lora_npz"] = keras_vit.save_lora(model, os.path.join(run_dir, "lora.npz"))
        model = keras_vit.merge_lora(model)
    if not original_format_problems(model):
        files["model_npz"] = keras_vit.export_npz(model, os.path.join(run_dir, "model.npz"))
    final = keras.Model.from_config(model.get_config())
    final.set_weights(model.get_weights())
    path = os.path.join(run_dir, "model.keras")
    final.save(path)
    return {**files, "model_keras": path}


# ---------------------------------------------------------------------------
# What a run prints and records.
# ---------------------------------------------------------------------------


def tensorboard(log_dir):
    """`[keras.callbacks.TensorBoard]`, or `[]` (said once per process)
    without the `tensorboard` package: history.csv has the same numbers."""
    import importlib.util

    import keras

    if importlib.util.find_spec("tensorboard") is not None:
        return [keras.callbacks.TensorBoard(log_dir, write_graph=False)]
    if not _NO_TENSORBOARD_SAID:
        _NO_TENSORBOARD_SAID.append(True)
        print("Note: `tensorboard` is not installed, so no TensorBoard logs are written (history.csv has the "
              "same numbers). `pip install tensorboard` to get them.")
    return []


_NO_TENSORBOARD_SAID = []


def start_header(recipe, run_dir, setup, config, log_dir=None):
    """The lines a run starts with; `log_dir`: TensorBoard's (default
    `run_dir/logs`; VTAB's tasks log in their own directories)."""
    import keras

    replicas = setup.num_replicas
    weights = None if isinstance(config, MppConfig) else config.weights
    lines = [
        f"== {recipe}: {run_dir}",
        f"  tensorboard --logdir {log_dir or os.path.join(run_dir, 'logs')}",
        f"  backend {keras.backend.backend()}, distribution {setup.mode} ({replicas} "
        f"replica{'s' if replicas != 1 else ''}), dtype policy {config.dtype_policy}",
        f"  model {config.model or 'custom'}, " + (f"weights {weights}" if weights else "random init"),
    ]
    warning = checks.inherited_dropout_warning(config)
    return lines + ([warning] if warning else [])


def environment(setup):
    import keras

    return {"backend": keras.backend.backend(), "keras_version": keras.__version__, "distribution": setup.mode,
            "replicas": setup.num_replicas, "dtype_policy": keras.config.dtype_policy().name}


def print_summary(title, summary, keys):
    lines = [title]
    for key in keys:
        value = summary.get(key)
        if value is not None:
            lines.append(f"  {key}: {value:.4f}" if isinstance(value, float) and abs(value) < 10 else
                         f"  {key}: {value:.1f}" if isinstance(value, float) else f"  {key}: {value}")
    print("\n".join(lines), flush=True)
