"""Everything a run checks before any work, and its set-up.

A bad value is an expected failure (`RecipeError`: one `error:` line naming
the flag and the value) raised before any data is read or model built; the
library's own checks are used where they exist. Also here: the library's
defaults filled in (`library=` fields), the determinism switch, dtype policy and
distribution (`set_up`).
"""

import argparse
import dataclasses
import importlib
import inspect
import math

from recipes.cli import RecipeError
from recipes.cli import parse_bool
from recipes.cli import show
from recipes.configs import AUGREG
from recipes.configs import FIGURE_FORMATS
from recipes.configs import LOSSES
from recipes.configs import MOMENT_DTYPES
from recipes.configs import MPP_QUANTIZATIONS
from recipes.configs import MPP_TARGETS
from recipes.configs import OPTIMIZERS
from recipes.configs import PIPELINES
from recipes.configs import VTAB_PREFIX
from recipes.configs import MppConfig
from recipes.configs import VtabConfig


def choice(config, field, choices):
    """`config.<field>` must be one of `choices`."""
    value = getattr(config, field)
    if value not in choices:
        raise RecipeError(f"--{field} must be one of {list(choices)}. Received: --{field}={value}")
    return value


def auto_bool(config, field):
    """`config.<field>` (`--cache`, `--jit_compile`) as "auto", True or False."""
    text = str(getattr(config, field)).strip().lower()
    if text == "auto":
        return "auto"
    try:
        return parse_bool(text)
    except argparse.ArgumentTypeError:
        return choice(config, field, ("auto", "true", "false"))  # Raises.


def _choices():
    """The fields with a fixed set of values: the library's lists where the
    library has one (a decay shape added there is valid at once)."""
    from keras_vit.data.pipelines import FINETUNE_AUGMENTATIONS
    from keras_vit.training.schedules import DECAY_TYPES

    return {
        "decay_type": DECAY_TYPES, "augmentation": FINETUNE_AUGMENTATIONS, "optimizer": tuple(OPTIMIZERS),
        "accumulator_dtype": MOMENT_DTYPES, "first_moment_dtype": MOMENT_DTYPES, "loss": LOSSES,
        "pipeline": PIPELINES, "augreg": tuple(AUGREG), "target": MPP_TARGETS, "quantization": MPP_QUANTIZATIONS,
        "format": FIGURE_FORMATS,
    }


def check(config):
    """Every check of a training config that needs no data."""
    fill_library_defaults(config)
    check_fields(config)
    variant = check_model(config)
    if config.total_steps:
        check_schedule(config)
    if isinstance(config, MppConfig):
        if not config.dataset:
            raise RecipeError("give --dataset: a tfds name, a folder of images, or synthetic (or --smoke).")
        if len(config.image_size) not in (1, 2):
            raise RecipeError(f"--image_size takes one or two ints. Received: --image_size={show(config.image_size)}")
        if config.image_size[0] != config.image_size[-1] and config.dataset != "synthetic":
            raise RecipeError(f"--image_size must be square for --dataset={config.dataset}. "
                              f"Received: --image_size={show(config.image_size)}")
        return
    if config.weights:  # a missing file or a name without a checkpoint, before any data is read
        from keras_vit import weights

        try:
            weights.check_source(config.weights, variant)
        except (ValueError, OSError) as error:
            raise RecipeError(f"--weights={config.weights}: {error}") from None
    if config.pipeline != "finetune" and (
            isinstance(config, VtabConfig) or str(config.dataset or "").startswith(VTAB_PREFIX)):
        raise RecipeError("VTAB tasks train through the fine-tuning pipeline (the protocol's crops and flips, per "
                          f"task; --augmentation, --flip, --batch_augmentation). Received: --pipeline={config.pipeline}")
    big_vision = config.pipeline == "pretrain" and config.augmentation == "inception_crop"
    if config.augreg != "none" and not big_vision:
        raise RecipeError("AugReg presets (RandAugment, mixup) come with the pretrain pipeline's inception crop. "
                          f"Received: --augreg={config.augreg}, --pipeline={config.pipeline}, "
                          f"--augmentation={config.augmentation}")
    if config.batch_augmentation and big_vision:
        raise RecipeError("--batch_augmentation runs in the finetune pipeline (or with another --augmentation); "
                          "the pretrain pipeline's augmentation is --augreg. Received: --pipeline=pretrain, "
                          f"--batch_augmentation={config.batch_augmentation}")
    if config.sweep:
        if len(config.steps_grid) != len(config.warmup_grid):
            raise RecipeError("--warmup_grid needs one warmup per entry of steps_grid. Received: "
                              f"--steps_grid={show(config.steps_grid)}, --warmup_grid={show(config.warmup_grid)}")
        for steps, warmup in zip(config.steps_grid, config.warmup_grid):
            check_schedule(config.replace(total_steps=steps, warmup_steps=warmup))
    if config.lora_rank is not None:
        from keras_vit.lora import TARGETS

        if config.linear_probe:
            raise RecipeError("--lora_rank trains adapters in the backbone, --linear_probe freezes all of it: "
                              f"choose one. Received: --lora_rank={config.lora_rank}, --linear_probe=true")
        unknown = [t for t in config.lora_targets if t not in TARGETS]
        if unknown or not config.lora_targets:
            raise RecipeError(f"--lora_targets must be names from {list(TARGETS)}. "
                              f"Received: --lora_targets={show(config.lora_targets)}")
    if config.batch_augmentation:  # a bad name fails before any data is read
        from keras_vit import data

        try:
            data.augmentation_layers(config.batch_augmentation)
        except ValueError as error:
            raise RecipeError(f"--batch_augmentation={config.batch_augmentation}: {error}") from None


def check_fields(config):
    """Every number within its field's interval (`Config.check`), and the
    fields with a fixed set of values."""
    try:
        config.check()
    except ValueError as error:
        raise RecipeError(str(error)) from None
    choices = _choices()
    for field in dataclasses.fields(config):
        if field.name in choices and getattr(config, field.name) is not None:
            choice(config, field.name, choices[field.name])
        elif field.name in ("cache", "jit_compile"):
            auto_bool(config, field.name)


def fill_library_defaults(config):
    """Sets each `library=` field left None to the default of the optimizer
    function of `--optimizer`, where that optimizer takes it; a value given
    for a field the chosen optimizer does not take is refused."""
    if not any(field.metadata.get("library") for field in dataclasses.fields(config)):
        return
    path = OPTIMIZERS[choice(config, "optimizer", OPTIMIZERS)]
    module, name = path.rsplit(".", 1)
    parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    for field in dataclasses.fields(config):
        takes = field.metadata.get("library")
        value = getattr(config, field.name)
        if not takes:
            continue
        if config.optimizer in takes and value is None:
            setattr(config, field.name, parameters[field.name].default)
        elif config.optimizer not in takes and value is not None:
            raise RecipeError(f"--{field.name} is not an option of {path} (--optimizer={config.optimizer}; it "
                              f"applies to --optimizer={' or '.join(takes)}; pass --{field.name}=none, the config "
                              f"may set it). Received: --{field.name}={value}")


def log_interval(log_every, total_steps):
    """The updates per Keras epoch: `--log_every`, lowered until it divides
    `total_steps` (Keras epochs have a fixed size)."""
    interval = min(log_every, total_steps)
    while total_steps % interval:
        interval -= 1
    return interval


def check_schedule(config):
    """The step settings of one training run."""
    from keras_vit import training

    total, warmup = config.total_steps, config.warmup_steps
    for name in ("total_steps", "batch_size", "accum_steps", "log_every", "checkpoint_every"):
        value = getattr(config, name)
        if not isinstance(value, int) or value <= 0:
            raise RecipeError(f"--{name} must be a positive int. Received: --{name}={value!r}")
    if config.batch_size % config.accum_steps:
        raise RecipeError(
            "--batch_size must be a multiple of --accum_steps (micro-batch = batch_size / accum_steps). "
            f"Received: --batch_size={config.batch_size}, --accum_steps={config.accum_steps}")
    try:  # the schedule's own checks: a warmup shorter than the run
        training.WarmupDecay(config.learning_rate, total, warmup, config.decay_type)
    except ValueError as error:
        raise RecipeError(f"--total_steps={total}, --warmup_steps={warmup}: {error}") from None
    log_every = log_interval(config.log_every, total)
    micro_batches = log_every * config.accum_steps  # of one Keras epoch
    if micro_batches % config.steps_per_execution:  # Keras would run whole executions past the epoch's end
        fits = max(d for d in range(1, config.steps_per_execution) if micro_batches % d == 0)
        raise RecipeError(
            f"--steps_per_execution must divide the micro-batches of a Keras epoch (log_every={log_every} x "
            f"accum_steps={config.accum_steps} = {micro_batches}), or more updates run than --total_steps: use "
            f"--steps_per_execution={fits}. Received: --steps_per_execution={config.steps_per_execution}")
    eval_every = 0 if isinstance(config, MppConfig) else config.eval_every
    if eval_every and eval_every % log_every:
        raise RecipeError(f"--eval_every must be a multiple of log_every={log_every}. Received: --eval_every={eval_every}")


def steps_from_epochs(epochs, num_examples, batch_size):
    """round(epochs * examples / batch), at least 1."""
    return max(1, int(round(epochs * num_examples / batch_size)))


def check_batches(config, setup):
    """Every batch must split evenly over the replicas, said before any work
    with a value that works."""
    replicas, accum = setup.num_replicas, config.accum_steps
    micro = config.batch_size // accum
    if micro % replicas:
        step = accum * replicas
        fix = max(step, math.ceil(config.batch_size / step) * step)
        raise RecipeError(
            f"--batch_size={config.batch_size} with --accum_steps={accum} gives micro-batches of {micro}, which do "
            f"not split over the {replicas} replicas of distribution {setup.mode!r}: use --batch_size={fix} (a "
            f"multiple of accum_steps x replicas = {step}).")
    eval_batch = None if isinstance(config, MppConfig) else config.eval_batch_size
    if eval_batch is not None and eval_batch % replicas:
        raise RecipeError(
            f"--eval_batch_size={eval_batch} does not split over the {replicas} replicas of distribution "
            f"{setup.mode!r}: use --eval_batch_size={math.ceil(eval_batch / replicas) * replicas}.")


def check_steps_per_execution(config, setup):
    """More than one batch per compiled call where Keras' `fit` runs it."""
    steps = config.steps_per_execution
    if steps > 1 and setup.backend == "torch":
        raise RecipeError("--steps_per_execution must be 1 on PyTorch (Keras runs one batch per call there). "
                          f"Received: --steps_per_execution={steps}")
    if steps > 1 and setup.mode == "mirrored" and setup.num_replicas > 1:
        raise RecipeError(
            f"--steps_per_execution must be 1 under MirroredStrategy over {setup.num_replicas} replicas: Keras' fit "
            f"fails there with more (its loop of steps feeds no value to a placeholder). Received: "
            f"--steps_per_execution={steps}")


def check_model(config):
    """The variant name of `--model` (None for a custom model); an unknown
    one is refused."""
    from keras_vit import variants

    if config.model is None:
        return None
    try:
        return variants.resolve_variant(config.model)[0]
    except ValueError as error:
        raise RecipeError(f"--model={config.model}: {error}") from None


def hidden_size(config):
    """The width of the configured model, without building it."""
    from keras_vit import variants

    if "hidden_size" in config.model_overrides:
        return int(config.model_overrides["hidden_size"])
    if config.model is None:
        return int(variants.DEFAULTS["hidden_size"])
    return int(variants.resolve_variant(config.model)[1]["hidden_size"])


def inherited_dropout_warning(config):
    """The dropout a run trains with where it may surprise: a custom model
    that takes a named config's dropout, or a `dropout_rate` in
    `--model_overrides` that wins over another `--dropout_rate`."""
    override = config.model_overrides.get("dropout_rate")
    if override is not None:
        if config.dropout_rate is not None and override != config.dropout_rate:
            return (f"warning: --model_overrides sets dropout_rate={override}, which wins over "
                    f"--dropout_rate={config.dropout_rate:g} (the config's or the flag's).")
        return None
    if config.model is None and config.dropout_rate:
        return (f"warning: the custom model (--model=none) trains with this config's dropout_rate="
                f"{config.dropout_rate:g}; pass --dropout_rate=0 to train without dropout.")
    return None


def set_up(config):
    """Determinism, dtype policy and the distribution, its replicas checked
    against the batches (each training run seeds itself: `train.train`);
    returns the `keras_vit.distribute.DistributionSetup`."""
    import keras

    from keras_vit import distribute

    if config.deterministic:  # docs/recipes.md, "Reproducible runs"
        distribute.enable_determinism()
    try:
        keras.config.set_dtype_policy(config.dtype_policy)
    except ValueError as error:
        raise RecipeError(f"--dtype_policy={config.dtype_policy}: {error}") from None
    try:
        setup = distribute.get_distribution(config.distribution)
    except (ValueError, RuntimeError) as error:
        raise RecipeError(f"--distribution={config.distribution}: {error}") from None
    check_steps_per_execution(config, setup)
    check_batches(config, setup)
    return setup
