"""The recipes' configs, as data.

One dataclass per kind of run: `TrainConfig` (supervised training: the
paper's pre-training and fine-tuning, one VTAB task), `VtabConfig` (the 19
tasks), `MppConfig` (masked patch prediction), `DemoConfig` and
`InspectConfig`. Each field carries its `--help` text, the interval its
numbers must lie in, and its default; a field declared `library=` takes
the default of the optimizer function the run uses
(`keras_vit.training.finetuning_optimizer` for `--optimizer=sgd`,
`pretraining_optimizer` for `adam`), so that each default is written once.

A `Recipe` is a base (the changes of that recipe to the defaults) and its
named configs (`Named`: the changes, what it reproduces and the result to
expect, with its source). Fields are attributes: a misspelt field fails at
once. This module imports no framework: `--help` stays fast.
"""

import dataclasses
import math
import typing

Optional = typing.Optional
Tuple = typing.Tuple
# The library functions whose keyword defaults are the `library=` fields'.
OPTIMIZERS = {"sgd": "keras_vit.training.finetuning_optimizer", "adam": "keras_vit.training.pretraining_optimizer"}
# The optimizer-state dtypes the recipes offer (the optimizers take any).
MOMENT_DTYPES = ("bfloat16", "float32")
LOSSES = ("softmax", "sigmoid")
PIPELINES = ("finetune", "pretrain")
# AugReg's augmentation presets (Steiner et al., Sec. 3.3; big_vision
# `configs/vit_i21k.py`, RANDAUG_DEF and MIXUP_DEF): RandAugment (layers,
# magnitude) or None, and the mixup alpha.
AUGREG = {
    "none": (None, 0.0), "light1": ((2, 0), 0.0), "light2": ((2, 10), 0.2), "medium1": ((2, 15), 0.2),
    "medium2": ((2, 15), 0.5), "strong1": ((2, 20), 0.5), "strong2": ((2, 20), 0.8),
}
MPP_TARGETS = ("mean_color", "downsampled", "pixels")
# `--dataset=vtab:<task>`: a task of `keras_vit.data.vtab`.
VTAB_PREFIX = "vtab:"
MPP_QUANTIZATIONS = ("uint8", "uniform")
FIGURE_FORMATS = ("png", "svg", "pdf")


def arg(default, help, valid=None, library=None):  # noqa: A002 - the flag's help text
    """A field with its `--help` text and, for numbers, the `valid`
    interval (`"[0, 1)"`; each item of a tuple). `library`: the optimizers
    (`OPTIMIZERS` keys) whose function takes the keyword: None until the run
    starts, then that function's default (see above)."""
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
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    def check(self):
        """Raises ValueError naming the first number outside its field's
        `valid` interval, or not finite."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, bool) or not isinstance(item, (int, float)):
                    continue
                interval = field.metadata.get("valid")
                if not math.isfinite(item) or (interval and not _in_interval(item, interval)):
                    rule = f"in {interval}" if interval else "a finite number"
                    raise ValueError(f"--{field.name} must be {rule}. Received: --{field.name}={item!r}")

    @classmethod
    def types(cls):
        return typing.get_type_hints(cls)


@dataclasses.dataclass(eq=True)
class ExecutionFields(Config):
    """How any run executes: the demo's too."""

    distribution: str = arg(
        "auto", "auto, none, tpu, mirrored, data_parallel or model_parallel (keras_vit.distribute.get_distribution)")
    jit_compile: str = arg(
        "auto", "Keras jit_compile: auto (XLA on JAX/TensorFlow, eager on PyTorch), true, or false "
        "(no compilation: slower steps, no compile time)")
    seed: int = arg(0, "random seed (weights, shuffling, data splits)", valid="[0, 4294967295]")
    deterministic: bool = arg(
        False, "bit-identical reruns also with --batch_augmentation and on GPUs (TensorFlow op determinism, "
        "PyTorch deterministic algorithms; docs/recipes.md). CPU runs repeat without it")
    verbose: int = arg(1, "1: a progress bar of updates, 2: one line per log_every updates, 0: silent", valid="[0, 2]")


@dataclasses.dataclass(eq=True)
class RunFields(ExecutionFields):
    run_dir: Optional[str] = arg(
        None, "run directory (checkpoints, logs, final model, summary); default runs/<recipe>/<config>. "
        "The same command resumes an interrupted run")
    overwrite: bool = arg(False, "delete the run directory of an earlier run first")
    dtype_policy: str = arg("float32", "Keras dtype policy, e.g. mixed_bfloat16 on TPUs (the head and losses stay float32)")
    steps_per_execution: int = arg(1, "batches per compiled call (e.g. 50 on TPUs: fewer host round trips)", valid="[1, inf)")
    log_every: int = arg(100, "optimizer updates per Keras epoch (one line of logs, CSV and TensorBoard)", valid="[1, inf)")
    checkpoint_every: int = arg(
        500, "optimizer updates between resumable checkpoints (rounded up to whole Keras epochs)", valid="[1, inf)")


@dataclasses.dataclass(eq=True)
class DataFields(Config):
    dataset: Optional[str] = arg(
        "cifar10", "tfds name (cifar10, imagenet2012, ...), vtab:<task> (keras_vit.data.vtab), or a folder "
        "holding one sub-folder per split, each with one sub-folder per class")
    train_split: str = arg("train[:98%]", "split to train on (tfds string or sub-folder)")
    data_dir: Optional[str] = arg(None, "tensorflow-datasets data directory (default: tfds')")
    download: bool = arg(True, "download and prepare a missing tfds dataset")
    manual_dir: Optional[str] = arg(None, "files of manual-download datasets (ImageNet, ...)")
    shuffle_buffer: int = arg(50_000, "training shuffle buffer (vit_jax: 50,000)", valid="[1, inf)")
    cache: str = arg("auto", "auto (cache splits of at most 150,000 examples), true or false")
    skip_bad_images: bool = arg(False, "image folders: leave out (and count) files that do not decode instead of failing")


@dataclasses.dataclass(eq=True)
class ModelFields(Config):
    model: Optional[str] = arg(
        "ViT-B_16", "original config or AugReg name (ViT-B_16, R50+ViT-B_16, B_16, ...); none for a custom "
        "model given by model_overrides alone")
    model_overrides: dict = arg({}, 'JSON object of ViT keyword arguments, e.g. \'{"num_layers": 2}\'')
    dropout_rate: Optional[float] = arg(None, "dropout (default: the variant's)", valid="[0, 1)")
    drop_path_rate: Optional[float] = arg(None, "stochastic depth, rising linearly to this rate (default: the variant's)",
                                          valid="[0, 1)")
    remat: bool = arg(False, "gradient checkpointing per encoder block: training memory for about a third more "
                             "compute, the same numbers (docs/training.md)")


@dataclasses.dataclass(eq=True)
class ScheduleFields(Config):
    image_size: int = arg(384, "training and evaluation resolution", valid="[1, inf)")
    batch_size: int = arg(512, "global batch per optimizer update", valid="[1, inf)")
    accum_steps: int = arg(8, "micro-batches accumulated per update (vit_jax: 8 x 64 = 512); 1 for none", valid="[1, inf)")
    total_steps: int = arg(10_000, "optimizer updates", valid="[1, inf)")
    learning_rate: float = arg(0.03, "base learning rate", valid="(0, inf)")
    warmup_steps: Optional[int] = arg(None, "linear warmup", valid="[0, inf)", library=("sgd", "adam"))
    decay_type: Optional[str] = arg(None, "decay after the warmup, one of keras_vit.training.WarmupDecay's",
                                    library=("sgd", "adam"))
    linear_end: Optional[float] = arg(None, "final learning rate of the linear decay", valid="[0, inf)",
                                      library=("adam",))
    grad_clip: Optional[float] = arg(1.0, "global gradient-norm clipping; none for off", valid="(0, inf)")
    optimizer: str = arg(
        "sgd", "sgd: keras_vit.training.finetuning_optimizer (momentum, the paper's fine-tuning); adam: "
        "pretraining_optimizer (decoupled weight decay, the paper's pre-training)")
    momentum: Optional[float] = arg(None, "momentum (optax order, not Nesterov)", valid="[0, 1)", library=("sgd",))
    accumulator_dtype: Optional[str] = arg(
        None, "momentum dtype, bfloat16 (the original's) or float32 (exact)", library=("sgd",))
    weight_decay: Optional[float] = arg(
        None, "decoupled weight decay times the learning rate, on kernels", valid="[0, inf)", library=("adam",))
    first_moment_dtype: Optional[str] = arg(None, "first moment dtype, float32 or bfloat16 (big_vision)",
                                            library=("adam",))


@dataclasses.dataclass(eq=True)
class TrainConfig(ModelFields, DataFields, ScheduleFields, RunFields):
    """Supervised training (`recipes/train.py`)."""

    total_steps: int = arg(10_000, "optimizer updates; 0: from --epochs", valid="[0, inf)")
    test_split: Optional[str] = arg("test", "split to report accuracy on; none to skip")
    eval_batch_size: int = arg(64, "evaluation batch", valid="[1, inf)")
    eval_every: int = arg(
        0, "evaluate test_split every this many updates during training (a multiple of log_every); 0: at the end only",
        valid="[0, inf)")
    epochs: float = arg(1.0, "training length in epochs of train_split, when total_steps is 0", valid="(0, inf)")
    weights: Optional[str] = arg(
        "imagenet21k", "pre-trained weights: a registered name (imagenet21k, augreg, ...), an .npz or .weights.h5 "
        "file (e.g. the model.npz of a pretrain run); none for random")
    reset_head: bool = arg(True, "zero-initialised head (paper Sec. 3.2), also when the checkpoint's has the right size")
    linear_probe: bool = arg(False, "train the head only (keras_vit.freeze_backbone): a linear probe")
    lora_rank: Optional[int] = arg(
        None, "LoRA (keras_vit.enable_lora): train rank-r adapters and the head, the rest frozen; none for off",
        valid="[1, inf)")
    lora_targets: Tuple[str, ...] = arg(("query", "value"), "LoRA's layers: query, key, value, output, mlp")
    pre_logits: Optional[bool] = arg(
        None, "a tanh hidden layer of the model's width in the head (paper Sec. 3.1); default: the variant's")
    head_bias_init: Optional[float] = arg(
        None, "head bias (default: 0 for softmax; sigmoid: -10 for 21,843 classes, -6.9 for 1,000, -log(classes) else)")
    loss: str = arg("softmax", "softmax (cross-entropy) or sigmoid (AugReg: per-class sigmoid)")
    label_smoothing: float = arg(0.0, "label smoothing", valid="[0, 1)")
    pipeline: str = arg(
        "finetune", "input pipeline: finetune (vit_jax's: --augmentation, --flip, --batch_augmentation) or pretrain "
        "(big_vision's inception crop, flip, --augreg's RandAugment and mixup; other --augmentation: finetune's)")
    augmentation: str = arg("inception_crop", "finetune pipeline's training crop: inception_crop (vit_jax), resize_crop "
                                              "(paper/BiT: 448 -> 384) or resize")
    flip: bool = arg(True, "finetune pipeline: random horizontal flips at training")
    augreg: str = arg("none", f"pretrain pipeline: AugReg preset, {', '.join(AUGREG)}")
    batch_augmentation: Optional[str] = arg(
        None, "Keras preprocessing layers on the training batches (not in the paper): keras.layers class names, "
        'e.g. RandAugment,MixUp, or a JSON list of serialized layers, e.g. [{"class_name": "MixUp", "config": {"alpha": 0.5}}]')
    sweep: bool = arg(
        False, "the paper's protocol: every lr of lr_grid (x steps_grid) on sweep_train_split -> sweep_val_split, "
        "then the best on train_split, reported on test_split")
    lr_grid: Tuple[float, ...] = arg((0.001, 0.003, 0.01, 0.03), "learning rates of the sweep", valid="(0, inf)")
    steps_grid: Tuple[int, ...] = arg((), "training lengths of the sweep (default: total_steps)", valid="[1, inf)")
    warmup_grid: Tuple[int, ...] = arg((), "the warmup of each steps_grid length", valid="[0, inf)")
    sweep_train_split: str = arg("train[:98%]", "training split of the sweep")
    sweep_val_split: str = arg("train[98%:]", "held-out split of the sweep")


@dataclasses.dataclass(eq=True)
class VtabConfig(TrainConfig):
    total_steps: int = arg(10_000, "optimizer updates per task (with --sweep and steps_grid: the best length's)",
                           valid="[1, inf)")
    tasks: str = arg("all", "comma-separated task keys or paper names (clevr_count, Clevr-Dist, ...), groups "
                            "(natural, specialized, structured) or all")
    save_models: bool = arg(False, "also write each task's final model.keras / model.npz")
    paper_model: str = arg("ViT-L/16 (I21k)", "paper row of the report: ViT-H/14 (JFT), ViT-L/16 (JFT), ViT-L/16 (I21k)")


@dataclasses.dataclass(eq=True)
class MppConfig(ModelFields, DataFields, ScheduleFields, RunFields):
    """Masked patch prediction (paper Sec. 4.6): an encoder, no labels."""

    image_size: Tuple[int, ...] = arg((224,), "input size: one int (square) or height,width", valid="[1, inf)")
    target: str = arg("mean_color", f"prediction target: {', '.join(MPP_TARGETS)}")
    bits: int = arg(3, "bits per colour channel of the target", valid="[1, 8]")
    quantization: str = arg("uint8", f"colour quantisation: {', '.join(MPP_QUANTIZATIONS)}")
    corruption_rate: float = arg(0.5, "share of the patches corrupted", valid="(0, 1]")
    head_hidden_size: Optional[int] = arg(None, "width of a hidden layer in the prediction head (BERT's transform); "
                                                "none: a linear head", valid="[1, inf)")
    synthetic_batches: int = arg(0, "dataset synthetic: cycle through this many batches; 0: new images every step",
                                 valid="[0, inf)")


@dataclasses.dataclass(eq=True)
class DemoConfig(ExecutionFields):
    run_dir: str = arg("runs/demo", "where the data, both runs and their models go")
    overwrite: bool = arg(False, "delete the results of an earlier demo in run_dir first")
    pretrain_size: int = arg(16, "pre-training resolution (px)", valid="[1, inf)")
    finetune_size: int = arg(32, "fine-tuning resolution (px)", valid="[1, inf)")
    pretrain_steps: int = arg(1000, "pre-training updates", valid="[1, inf)")
    pretrain_batch_size: int = arg(64, "pre-training batch", valid="[1, inf)")
    finetune_steps: int = arg(300, "fine-tuning updates", valid="[1, inf)")
    finetune_batch_size: int = arg(64, "fine-tuning batch, as 2 accumulated micro-batches (the paper's 8 x 64, scaled "
                                       "down)", valid="[1, inf)")
    finetune_learning_rate: float = arg(0.03, "fine-tuning base learning rate", valid="(0, inf)")
    model_overrides: dict = arg(dict(hidden_size=64, num_layers=4, num_heads=4, mlp_dim=128, patch_size=4),
                                "the ViT's size (patch 4: a 4x4 grid at 16 px, 8x8 at 32 px)")
    inspect: bool = arg(True, "write the inspection figures of the fine-tuned model to run_dir/inspect")
    test_fraction: float = arg(0.2, "share of the digits held out for testing (stratified)", valid="(0, 1)")


@dataclasses.dataclass(eq=True)
class InspectConfig(Config):
    model: str = arg("ViT-B_16", "an original config or AugReg name, none for a custom model given by "
                                 "model_overrides, or a saved .keras model file")
    model_overrides: dict = arg({}, 'JSON object of ViT keyword arguments, e.g. \'{"num_layers": 2}\'')
    weights: Optional[str] = arg(None, "an original .npz, a registered name (imagenet21k+imagenet2012, augreg, ...) "
                                       "or a .weights.h5 file; none: an untrained model's figures")
    num_classes: Optional[int] = arg(None, "with a .weights.h5 file: the classes of its head", valid="[1, inf)")
    image_size: Optional[Tuple[int, ...]] = arg(
        None, "model input: one int (square) or height,width; default 224, or the saved model's", valid="[1, inf)")
    images: Optional[str] = arg(None, "a folder of images (sub-folders searched)")
    run_dir: str = arg("runs/inspect", "where the figures, inspect.npz and summary.json go (a new or empty "
                                       "directory, or an inspection's)")
    overwrite: bool = arg(False, "write over an earlier inspection of another config in run_dir")
    max_images: int = arg(128, "images for the attention distance (the paper used 128)", valid="[1, inf)")
    rollout_images: int = arg(4, "images shown in the rollout figure", valid="[1, inf)")
    components: int = arg(28, "principal components of the filters", valid="[1, inf)")
    format: str = arg("png", f"figure format: {', '.join(FIGURE_FORMATS)}")  # noqa: A003
    batch_size: int = arg(16, "images per forward pass", valid="[1, inf)")
    seed: int = arg(0, "random seed (random weights, --smoke images)", valid="[0, 4294967295]")


@dataclasses.dataclass(frozen=True)
class Named:
    """A named config: `summary` (one line), the `changes` to its recipe's
    base, the `expected` result with its source, and the `flags` its command
    needs besides `--config`."""

    summary: str
    changes: dict
    expected: str
    flags: str = ""


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A recipe's configs: `cls(**base, **named.changes)`, then `smoke`."""

    name: str
    title: str
    cls: type
    base: dict
    configs: dict
    smoke: dict
    summary_keys: tuple = ("accuracy", "eval_loss", "eval_examples", "steps", "learning_rate", "images_per_second",
                           "total_wall_time_s", "model_keras", "model_npz", "lora_npz")
    fixed: tuple = ()  # fields the recipe sets itself: not flags

    @property
    def default(self):
        return next(iter(self.configs))

    def command(self, name):
        named = self.configs[name]
        return f"python -m recipes.{self.name} --config={name}" + (f" {named.flags}" if named.flags else "")

    def get_config(self, name=None, smoke=False):
        name = self.default if name is None else name
        if name not in self.configs:
            raise ValueError(f"Unknown config; expected one of {sorted(self.configs)}. Received: config={name!r}")
        config = self.cls(**{**self.base, **self.configs[name].changes})
        return config.replace(**self.smoke) if smoke else config


# `--smoke`: a tiny model, a few steps, tfds replaced by generated examples
# (keras_vit.data.testing; no download). The batch of 16 is 2 accumulated
# micro-batches of 8, and 8 divides over 8 devices (TPU cores, simulated JAX
# devices), so the smoke run exercises accumulation under every
# distribution. Flags given on the command line still win.
SMOKE_MODEL = dict(hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, patch_size=8)
SMOKE = dict(
    model=None, model_overrides=SMOKE_MODEL, weights=None, image_size=16, batch_size=16, accum_steps=2,
    eval_batch_size=16, total_steps=4, warmup_steps=1, log_every=2, checkpoint_every=2, eval_every=0,
    shuffle_buffer=16, cache="true", lr_grid=(0.01, 0.03),
)
