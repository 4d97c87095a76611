"""Typed configs of the recipes, one module per recipe (as big_vision's
`configs/*.py`).

Each module has `get_config(name=DEFAULT, smoke=False)` returning a
dataclass instance; its named configs are functions whose docstring holds
the command, what it reproduces and the result to expect (with its
source). Fields are attributes: a misspelt field fails at once, when set
(`config.learnig_rate = ...`) or read.

This package imports no framework: `--help` stays fast.
"""

import dataclasses
import math
import typing


# The library functions whose defaults are the recipes' (dotted paths: the
# configs import no framework, so that `--help` is fast).
FINETUNING = "keras_vit.training.finetuning_optimizer"
PRETRAINING = "keras_vit.training.pretraining_optimizer"


def arg(default, help, valid=None, library=None):  # noqa: A002 - the flag's help text
    """A config field with its `--help` text and, for numbers, the `valid`
    interval (`"[0, 1)"`, `"(0, inf)"`, ...; each item of a tuple field);
    mutable defaults are copied. Every float must also be finite.

    `library`: the dotted path of the library function whose keyword of the
    same name gives the default. The field is then None until the recipe
    starts (`recipes.run.check_fields` fills it in), so that each default is
    written once, in the library."""
    metadata = {"help": help, "valid": valid, "library": library}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _in_interval(value, interval):
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    above = value > low if interval[0] == "(" else value >= low
    below = value < high if interval[-1] == ")" else value <= high
    return above and below


class Config:
    """Base of the config dataclasses: only declared fields can be set."""

    def __setattr__(self, name, value):
        if name not in self.__dataclass_fields__:
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r}; fields: "
                f"{', '.join(self.__dataclass_fields__)}. Received: {name}={value!r}"
            )
        object.__setattr__(self, name, value)

    def replace(self, **changes):
        """A copy with `changes` (unknown names fail)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    def check(self):
        """Raises ValueError naming the first field whose number is outside
        its `valid` interval or not finite, before any work."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            items = value if isinstance(value, tuple) else (value,)
            for item in items:
                if isinstance(item, bool) or not isinstance(item, (int, float)):
                    continue
                interval = field.metadata.get("valid")
                if not math.isfinite(item) or (interval and not _in_interval(item, interval)):
                    rule = f"in {interval}" if interval else "a finite number"
                    raise ValueError(f"--{field.name} must be {rule}. Received: --{field.name}={item!r}")

    @classmethod
    def types(cls):
        """`{field: type}` of the fields, for the command-line parser."""
        return typing.get_type_hints(cls)


def named(configs, name):
    """Calls the named config `name` of `configs` (`{name: function}`)."""
    if name not in configs:
        raise ValueError(f"Unknown config; expected one of {sorted(configs)}. Received: config={name!r}")
    return configs[name]()


# ---------------------------------------------------------------------------
# Field groups shared by the training recipes.
# ---------------------------------------------------------------------------

Optional = typing.Optional
Tuple = typing.Tuple

# The optimizer-state dtypes the recipes offer (the optimizers take any).
# The decay shapes and augmentations are the library's own lists
# (`recipes.run.check_fields` reads them there).
MOMENT_DTYPES = ("bfloat16", "float32")


@dataclasses.dataclass(eq=True)
class RunFields(Config):
    run_dir: Optional[str] = arg(
        None, "run directory (checkpoints, logs, final model, summary); default "
        "runs/<recipe>/<config>. The same command resumes an interrupted run")
    overwrite: bool = arg(False, "delete the run directory of an earlier run first")
    distribution: str = arg(
        "auto", "auto, none, tpu, mirrored, data_parallel or model_parallel "
        "(keras_vit.distribute.get_distribution)")
    dtype_policy: str = arg(
        "float32", "Keras dtype policy, e.g. mixed_bfloat16 on TPUs (the head and losses stay float32)")
    jit_compile: str = arg(
        "auto", "Keras jit_compile: auto (XLA on JAX/TensorFlow, eager on PyTorch), true, or false "
        "(no compilation: slower steps, no compile time)")
    steps_per_execution: int = arg(1, "batches per compiled call (e.g. 50 on TPUs: fewer host round trips)", valid="[1, inf)")
    seed: int = arg(0, "random seed (weights, shuffling)", valid="[0, 4294967295]")
    deterministic: bool = arg(
        False, "bit-identical reruns also with --batch_augmentation and on GPUs (TensorFlow op determinism, "
        "PyTorch deterministic algorithms; docs/recipes.md). CPU runs repeat without it")
    verbose: int = arg(1, "1: a progress bar of updates, 2: one line per log_every updates, 0: silent", valid="[0, 2]")
    log_every: int = arg(100, "optimizer updates per Keras epoch (one line of logs, CSV and TensorBoard)", valid="[1, inf)")
    checkpoint_every: int = arg(500, "optimizer updates between resumable checkpoints", valid="[1, inf)")


@dataclasses.dataclass(eq=True)
class DataFields(Config):
    data_dir: Optional[str] = arg(None, "tensorflow-datasets data directory (default: tfds')")
    download: bool = arg(True, "download and prepare a missing tfds dataset")
    manual_dir: Optional[str] = arg(None, "files of manual-download datasets (ImageNet, ...)")
    shuffle_buffer: int = arg(50_000, "training shuffle buffer (vit_jax: 50,000)", valid="[1, inf)")
    cache: str = arg("auto", "auto (cache splits of at most 150,000 examples), true or false")
    skip_bad_images: bool = arg(
        False, "image folders: leave out (and count) files that do not decode instead of failing")


@dataclasses.dataclass(eq=True)
class ModelFields(Config):
    model: Optional[str] = arg(
        "ViT-B_16", "original config or AugReg name (ViT-B_16, R50+ViT-B_16, B_16, ...); "
        "none for a custom model given by model_overrides alone")
    model_overrides: dict = arg({}, 'JSON object of ViT keyword arguments, e.g. \'{"num_layers": 2}\'')
    dropout_rate: Optional[float] = arg(None, "dropout (default: the variant's)", valid="[0, 1)")


@dataclasses.dataclass(eq=True)
class ScheduleFields(Config):
    image_size: int = arg(384, "training and evaluation resolution", valid="[1, inf)")
    batch_size: int = arg(512, "global batch per optimizer update", valid="[1, inf)")
    accum_steps: int = arg(1, "micro-batches accumulated per update; 1 for none", valid="[1, inf)")
    eval_batch_size: int = arg(64, "evaluation batch", valid="[1, inf)")
    total_steps: int = arg(10_000, "optimizer updates", valid="[1, inf)")
    warmup_steps: int = arg(500, "linear warmup", valid="[0, inf)")
    learning_rate: float = arg(0.03, "base learning rate", valid="(0, inf)")
    decay_type: Optional[str] = arg(None, "decay after the warmup, one of keras_vit.training.WarmupDecay's",
                                    library=FINETUNING)
    grad_clip: Optional[float] = arg(1.0, "global gradient-norm clipping; none for off", valid="(0, inf)")
    eval_every: int = arg(
        0, "evaluate the test split every this many updates during training (a multiple of "
        "log_every); 0: only at the end", valid="[0, inf)")


# `--smoke`: a tiny model, a few steps, tfds replaced by generated examples
# (keras_vit.data.testing; no download). The batch of 16 is 2 accumulated
# micro-batches of 8, and 8 divides over 8 devices (TPU cores, simulated JAX
# devices), so the smoke run exercises accumulation under every
# distribution. Flags given on the command line still win.
SMOKE_MODEL = dict(hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, patch_size=8)
SMOKE = dict(
    model=None, model_overrides=SMOKE_MODEL, image_size=16, batch_size=16, accum_steps=2,
    eval_batch_size=16, total_steps=4, warmup_steps=1, log_every=2, checkpoint_every=2,
    eval_every=0, shuffle_buffer=16, cache="true",
)
