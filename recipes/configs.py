"""Named configurations of the recipes, as plain Python dicts.

Every recipe has one table of fields (name, default, type, help): the
defaults are the paper's fine-tuning / pre-training set-up, and every field
is a command-line flag (`--field=value`). A named config (`--config=NAME`) is
a function returning the fields it changes; its docstring says what it
reproduces and the result to expect.

Sources of the numbers:
- Fine-tuning: paper App. B.1.1 and Table 4 (SGD momentum 0.9, batch 512,
  cosine decay, no weight decay, global-norm clipping at 1, 384 px, zero
  head; steps and learning-rate grids per dataset), and the released code
  google-research/vision_transformer (`vit_jax/configs/common.py`,
  `configs/vit.py`: warmup 500, base lr 0.03 / 0.01 for B/16 on CIFAR-10,
  batch 512 as 8 accumulated micro-batches of 64, splits `train[:98%]` /
  `train[:99%]`).
- Pre-training: paper Table 3 and Sec. 4.1 / App. B.1 (Adam 0.9 / 0.999,
  batch 4096, 10k warmup steps, decoupled weight decay, clipping at 1 for
  ImageNet, pre-training head with one tanh hidden layer), and AugReg
  (Steiner et al., "How to train your ViT?", Sec. 3.3; big_vision
  `configs/vit_i21k.py`: cosine, lr 1e-3, wd 0.1, sigmoid cross-entropy with
  head bias -10, RandAugment/mixup presets).
- Expected results: vit_jax README ("Expected results", i21k checkpoints
  fine-tuned at 384 px) and the paper's Tables 2 and 5.
"""

import collections

Field = collections.namedtuple("Field", ["name", "default", "kind", "help"])

# Kinds: "int", "float", "str", "bool", "str?"/"int?"/"float?" (None allowed:
# `none` on the command line), "floats"/"ints" (comma-separated), "json"
# (a JSON object).

_RUN_FIELDS = [
    Field("run_dir", None, "str?", "run directory (checkpoints, logs, final model, summary); "
          "default runs/<recipe>/<config>. The same command resumes an interrupted run"),
    Field("overwrite", False, "bool", "delete the run directory of an earlier run first"),
    Field("distribution", "auto", "str",
          "auto, none, tpu, mirrored, multi_worker, data_parallel or model_parallel "
          "(keras_vit.distribute.get_distribution)"),
    Field("dtype_policy", "float32", "str",
          "Keras dtype policy, e.g. mixed_bfloat16 on TPUs (the head and losses stay float32)"),
    Field("jit_compile", "auto", "str",
          "Keras jit_compile: auto (XLA on JAX/TensorFlow, eager on PyTorch), true, or false "
          "(no compilation: slower steps, no compile time)"),
    Field("steps_per_execution", 1, "int",
          "batches per compiled call (e.g. 50 on TPUs: fewer host round trips)"),
    Field("seed", 0, "int", "random seed (weights, shuffling)"),
    Field("verbose", 1, "int", "Keras verbosity: 1 progress bars, 2 one line per epoch, 0 silent"),
    Field("log_every", 100, "int",
          "optimizer updates per Keras epoch (one line of logs, CSV and TensorBoard)"),
    Field("checkpoint_every", 500, "int", "optimizer updates between resumable checkpoints"),
]

_DATA_FIELDS = [
    Field("data_dir", None, "str?", "tensorflow-datasets data directory (default: tfds')"),
    Field("download", True, "bool", "download and prepare a missing tfds dataset"),
    Field("manual_dir", None, "str?", "files of manual-download datasets (ImageNet, ...)"),
    Field("shuffle_buffer", 50_000, "int", "training shuffle buffer (vit_jax: 50,000)"),
    Field("cache", "auto", "str", "auto (cache splits of at most 150,000 examples), true or false"),
]

_MODEL_FIELDS = [
    Field("model", "ViT-B_16", "str?",
          "original config or AugReg name (ViT-B_16, R50+ViT-B_16, B_16, ...); "
          "none for a custom model given by model_overrides alone"),
    Field("model_overrides", {}, "json",
          'JSON object of ViT keyword arguments, e.g. \'{"num_layers": 2}\''),
    Field("dropout_rate", None, "float?", "dropout (default: the variant's)"),
]

FINETUNE_FIELDS = _MODEL_FIELDS + [
    Field("weights", "imagenet21k", "str?",
          "pre-trained weights: a registered name (imagenet21k, augreg, ...), an .npz or "
          ".weights.h5 file, e.g. the model.npz of a pretrain run; none for random"),
    Field("reset_head", True, "bool",
          "replace the head by a zero-initialised one (paper Sec. 3.2) even when the "
          "checkpoint's has the right size"),
    Field("dataset", "cifar10", "str?",
          "tfds name (cifar10, imagenet2012, ...) or a folder holding one sub-folder per "
          "split, each with one sub-folder per class"),
] + _DATA_FIELDS + [
    Field("train_split", "train[:98%]", "str", "split to train on (tfds string or sub-folder)"),
    Field("test_split", "test", "str?", "split to report accuracy on; none to skip"),
    Field("sweep", False, "bool",
          "the paper's protocol: try every lr of lr_grid on sweep_train_split -> "
          "sweep_val_split, then train with the best on train_split, report test_split"),
    Field("lr_grid", (0.001, 0.003, 0.01, 0.03), "floats", "learning rates of the sweep"),
    Field("sweep_train_split", "train[:98%]", "str", "training split of the sweep"),
    Field("sweep_val_split", "train[98%:]", "str", "held-out split of the sweep"),
    Field("image_size", 384, "int", "fine-tuning resolution (paper: 384)"),
    Field("batch_size", 512, "int", "global batch per optimizer update (paper: 512)"),
    Field("accum_steps", 8, "int",
          "micro-batches accumulated per update (vit_jax: 8 x 64 = 512); 1 for none"),
    Field("eval_batch_size", 64, "int", "evaluation batch"),
    Field("total_steps", 10_000, "int", "optimizer updates"),
    Field("warmup_steps", 500, "int", "linear warmup (vit_jax: 500)"),
    Field("learning_rate", 0.03, "float", "base learning rate (vit_jax default 0.03)"),
    Field("decay_type", "cosine", "str", "cosine or linear"),
    Field("momentum", 0.9, "float", "SGD momentum (optax order, not Nesterov)"),
    Field("grad_clip", 1.0, "float?", "global gradient-norm clipping; none for off"),
    Field("accumulator_dtype", "bfloat16", "str",
          "momentum buffer dtype (the original's is bfloat16; float32 for exact momentum)"),
    Field("augmentation", "inception_crop", "str",
          "training crop: inception_crop (vit_jax), resize_crop (paper/BiT: 448 -> 384) or "
          "resize"),
    Field("flip", True, "bool", "random horizontal flips at training"),
    Field("eval_every", 0, "int",
          "evaluate test_split every this many updates during training (a multiple of "
          "log_every); 0: only at the end"),
] + _RUN_FIELDS

PRETRAIN_FIELDS = _MODEL_FIELDS + [
    Field("pre_logits", True, "bool",
          "pre-training head with one tanh hidden layer of the model's width (paper Sec. 3.1, "
          "App. D.3; AugReg i21k: false)"),
    Field("drop_path_rate", 0.0, "float", "stochastic depth, increasing linearly to this rate"),
    Field("dataset", "imagenet2012", "str?",
          "tfds name or a folder holding one sub-folder per split, each with one sub-folder "
          "per class"),
] + _DATA_FIELDS + [
    Field("train_split", "train[:99%]", "str", "split to train on"),
    Field("test_split", "validation", "str?", "split to report accuracy on; none to skip"),
    Field("image_size", 224, "int", "pre-training resolution (paper: 224)"),
    Field("batch_size", 4096, "int", "global batch per optimizer update (paper: 4096)"),
    Field("accum_steps", 1, "int", "micro-batches accumulated per update"),
    Field("eval_batch_size", 256, "int", "evaluation batch"),
    Field("epochs", 300.0, "float", "training length in epochs of train_split (if total_steps is 0)"),
    Field("total_steps", 0, "int", "optimizer updates; 0: from epochs"),
    Field("warmup_steps", 10_000, "int", "linear warmup (paper: 10k)"),
    Field("learning_rate", 3e-3, "float", "base learning rate (Table 3)"),
    Field("decay_type", "cosine", "str", "cosine or linear (Table 3)"),
    Field("linear_end", 1e-5, "float", "final learning rate of the linear decay"),
    Field("weight_decay", 0.3, "float",
          "decoupled weight decay times the learning rate, on kernels (Table 3)"),
    Field("grad_clip", 1.0, "float?", "global gradient-norm clipping; none for off"),
    Field("first_moment_dtype", "float32", "str", "Adam first moment dtype (big_vision: bfloat16)"),
    Field("loss", "softmax", "str",
          "softmax (cross-entropy) or sigmoid (AugReg: per-class sigmoid, head bias -10 / -6.9)"),
    Field("label_smoothing", 0.0, "float", "label smoothing"),
    Field("head_bias_init", None, "float?",
          "head bias (default: 0 for softmax; sigmoid: -10 for imagenet21k, -6.9 otherwise)"),
    Field("augmentation", "inception_crop", "str",
          "inception_crop (the AugReg pipeline: crop, flip, RandAugment, mixup), or resize / "
          "resize_crop for small images (no RandAugment or mixup)"),
    Field("augreg", None, "str?",
          "AugReg preset: none, light1, light2, medium1, medium2, strong1, strong2"),
    Field("flip", True, "bool", "random flips (resize / resize_crop; inception_crop always flips)"),
    Field("eval_every", 0, "int", "evaluate test_split every this many updates; 0: at the end"),
] + _RUN_FIELDS


# ---------------------------------------------------------------------------
# Fine-tuning configs (paper Table 4; vit_jax configs). The model is ViT-B/16
# pre-trained on ImageNet-21k unless stated.
# ---------------------------------------------------------------------------


def cifar10():
    """CIFAR-10, ViT-B/16 (ImageNet-21k) at 384 px: 10k steps, lr 0.01.

    vit_jax `configs/vit.py` (b16, cifar10): base lr 0.01, 500 warmup steps,
    10,000 updates of 512 (8 x 64), trained on `train[:98%]`. Paper grid
    {0.001, 0.003, 0.01, 0.03} (`--sweep=true`).

    Expected: 99.02 % test accuracy (vit_jax README, ViT-B_16, dropout 0);
    the paper's Table 5 gives 98.95 % for ViT-B/16 pre-trained on
    ImageNet-21k.
    """
    return dict(dataset="cifar10", learning_rate=0.01, total_steps=10_000)


def cifar100():
    """CIFAR-100, ViT-B/16 (ImageNet-21k) at 384 px: 10k steps, lr 0.03.

    vit_jax defaults (`configs/common.py`): base lr 0.03, 500 warmup steps,
    10,000 updates, `train[:98%]`.

    Expected: 92.06 % (vit_jax README, ViT-B_16, dropout 0); paper Table 5:
    91.67 %.
    """
    return dict(
        dataset="cifar100", learning_rate=0.03, total_steps=10_000,
    )


def oxford_iiit_pet():
    """Oxford-IIIT Pets, ViT-L/16 (ImageNet-21k) at 384 px: 500 steps.

    Paper Table 4: 500 steps, grid {0.001, 0.003, 0.01, 0.03} chosen on 10 %
    of the training set held out (`--sweep=true` does exactly that:
    `train[:90%]` -> `train[90%:]`, then the best on all of `train`). Warmup
    100 steps as big_vision's transfer configs for 500-step runs; lr 0.01 is
    big_vision's transfer default.

    Expected: 94.67 % (paper Table 2, ViT-L/16 pre-trained on ImageNet-21k).
    """
    return dict(
        model="ViT-L_16", dataset="oxford_iiit_pet", train_split="train",
        sweep_train_split="train[:90%]", sweep_val_split="train[90%:]",
        total_steps=500, warmup_steps=100, learning_rate=0.01, log_every=50, checkpoint_every=100,
    )


def oxford_flowers102():
    """Oxford Flowers-102, ViT-L/16 (ImageNet-21k) at 384 px: 500 steps.

    Trained on the 2,040 images of tfds' `train` + `validation` (the
    dataset's official training set); sweep on 90 % of them -> the other
    10 % (paper Table 4); warmup 100, lr 0.01 as for Pets.

    Expected: 99.61 % (paper Table 2, ViT-L/16 pre-trained on ImageNet-21k).
    """
    return dict(
        model="ViT-L_16", dataset="oxford_flowers102", train_split="train+validation",
        sweep_train_split="train[:90%]+validation[:90%]",
        sweep_val_split="train[90%:]+validation[90%:]",
        total_steps=500, warmup_steps=100, learning_rate=0.01, log_every=50, checkpoint_every=100,
    )


def imagenet2012():
    """ImageNet, ViT-B/16 (ImageNet-21k) at 384 px: 20k steps, lr 0.03.

    vit_jax: 20,000 updates of 512, warmup 500, base lr 0.03, trained on
    `train[:99%]`, evaluated on `validation`; paper grid {0.003, 0.01, 0.03,
    0.06} with 1 % of train held out. ImageNet needs a manual download
    (tensorflow-datasets says where to put the tar files).

    Expected: 84.53 % top-1 (vit_jax README, ViT-B_16, dropout 0); paper
    Table 5: 83.97 %.
    """
    return dict(
        dataset="imagenet2012", train_split="train[:99%]", test_split="validation",
        sweep_train_split="train[:99%]", sweep_val_split="train[99%:]",
        lr_grid=(0.003, 0.01, 0.03, 0.06), total_steps=20_000, learning_rate=0.03,
    )


FINETUNE_CONFIGS = {
    f.__name__: f for f in (cifar10, cifar100, oxford_iiit_pet, oxford_flowers102, imagenet2012)
}

# ---------------------------------------------------------------------------
# Pre-training configs.
# ---------------------------------------------------------------------------


def pretrain_imagenet2012():
    """ViT-B/16 from scratch on ImageNet-2012, paper Table 3.

    300 epochs of `train[:99%]` at batch 4096, Adam, base lr 3e-3, 10k
    warmup steps, cosine decay, weight decay 0.3 (decoupled, times the
    learning rate, on kernels), dropout 0.1, clipping at 1, pre-training head
    with a tanh hidden layer; 224 px.

    Expected: 77.91 % ImageNet top-1 after fine-tuning the result at 384 px
    (paper Table 5, ViT-B/16 pre-trained on ImageNet): run the `imagenet2012`
    fine-tuning config with `--weights=<run_dir>/model.npz`.
    """
    return dict(
        dataset="imagenet2012", train_split="train[:99%]", test_split="validation",
        epochs=300.0, learning_rate=3e-3, decay_type="cosine", weight_decay=0.3,
        dropout_rate=0.1, log_every=1000, checkpoint_every=1000,
    )


def pretrain_imagenet21k():
    """ViT-B/16 on ImageNet-21k, paper Table 3.

    90 epochs at batch 4096, Adam, base lr 1e-3, 10k warmup steps, linear
    decay, weight decay 0.03, dropout 0.1, clipping at 1, tanh hidden layer in
    the head; 224 px. ImageNet-21k is not in tensorflow-datasets: give
    `--dataset=/path/to/imagenet21k` holding `train/<wnid>/*.JPEG` (21,843
    classes) and a held-out `val/<wnid>/...` (or `--test_split=none`).

    Expected (after fine-tuning at 384 px, paper Table 5): ImageNet 83.97 %,
    CIFAR-10 98.95 %, CIFAR-100 91.67 %.
    """
    return dict(
        dataset=None, train_split="train", test_split="val",
        epochs=90.0, learning_rate=1e-3, decay_type="linear", weight_decay=0.03,
        dropout_rate=0.1, log_every=1000, checkpoint_every=1000,
    )


def augreg_imagenet21k():
    """ViT-B/16 on ImageNet-21k with AugReg's recommended recipe.

    AugReg Sec. 3.3 / big_vision `configs/vit_i21k.py`: 300 epochs at batch
    4096, Adam (first moment in bfloat16), lr 1e-3, 10k warmup, cosine,
    weight decay 0.1 (decoupled, times the lr), clipping at 1, sigmoid
    cross-entropy with head bias -10, no hidden layer in the head,
    RandAugment(2, 15) + mixup 0.2 (`medium1`), dropout 0, stochastic depth 0:
    the `B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0`
    checkpoint. Dataset as `pretrain_imagenet21k`.

    Expected: 85.49 % ImageNet top-1 after fine-tuning at 384 px (AugReg
    index, the recommended B/16 checkpoint).
    """
    return dict(
        dataset=None, train_split="train", test_split="val",
        epochs=300.0, learning_rate=1e-3, decay_type="cosine", weight_decay=0.1,
        first_moment_dtype="bfloat16", loss="sigmoid", pre_logits=False, augreg="medium1",
        dropout_rate=0.0, drop_path_rate=0.0, log_every=1000, checkpoint_every=1000,
    )


PRETRAIN_CONFIGS = {
    "imagenet2012": pretrain_imagenet2012,
    "imagenet21k": pretrain_imagenet21k,
    "augreg_imagenet21k": augreg_imagenet21k,
}

# ---------------------------------------------------------------------------
# VTAB-1k (recipes/vtab.py).
# ---------------------------------------------------------------------------

VTAB_FIELDS = _MODEL_FIELDS + [
    Field("weights", "imagenet21k", "str?",
          "pre-trained weights: a registered name, an .npz or .weights.h5 file; none for random"),
    Field("reset_head", True, "bool", "zero-initialised head (paper Sec. 3.2)"),
    Field("tasks", "all", "str",
          "comma-separated task keys or paper names (clevr_count, Clevr-Dist, ...), group names "
          "(natural, specialized, structured) or all"),
] + _DATA_FIELDS[:3] + [
    Field("cache", "auto", "str", "auto, true or false (VTAB-1k splits are small: cached)"),
    Field("image_size", 384, "int", "resolution of every task (paper: 384)"),
    Field("batch_size", 512, "int", "global batch per update (paper: 512)"),
    Field("accum_steps", 8, "int", "micro-batches accumulated per update (8 x 64 = 512)"),
    Field("eval_batch_size", 64, "int", "evaluation batch"),
    Field("total_steps", 2500, "int", "updates per task (paper: 2,500)"),
    Field("warmup_steps", 200, "int", "linear warmup (AugReg's 200 for 2,500-step runs)"),
    Field("learning_rate", 0.01, "float", "base learning rate (paper: 0.01)"),
    Field("decay_type", "cosine", "str", "cosine or linear"),
    Field("momentum", 0.9, "float", "SGD momentum"),
    Field("grad_clip", 1.0, "float?", "global gradient-norm clipping; none for off"),
    Field("accumulator_dtype", "bfloat16", "str", "momentum buffer dtype (original: bfloat16)"),
    Field("augmentation", "resize_crop", "str",
          "training crop: resize_crop (paper/BiT, 448 -> 384), inception_crop or resize; BiT's "
          "per-task switches still turn crops and flips off"),
    Field("shuffle_buffer", 1000, "int", "training shuffle buffer"),
    Field("sweep", False, "bool",
          "AugReg protocol: every lr of lr_grid x steps of steps_grid on train800 -> val200, "
          "the best retrained on train800val200, evaluated on test"),
    Field("lr_grid", (0.001, 0.003, 0.01, 0.03), "floats", "learning rates of the sweep"),
    Field("steps_grid", (500, 2500), "ints", "training lengths of the sweep"),
    Field("warmup_grid", (100, 200), "ints", "warmup of each training length of steps_grid"),
    Field("save_models", False, "bool", "also write each task's final model.keras / model.npz"),
    Field("paper_model", "ViT-L/16 (I21k)", "str",
          "paper row the bar chart compares with: ViT-H/14 (JFT), ViT-L/16 (JFT), ViT-L/16 (I21k)"),
    Field("eval_every", 0, "int", "evaluate the test split every this many updates; 0: at the end"),
] + _RUN_FIELDS


def vtab_paper():
    """The ViT paper's VTAB-1k protocol (App. B.1.1, Table 4).

    Every task: train on train800val200 (1,000 examples) for 2,500 updates of
    512 at 384 px, SGD momentum 0.9, lr 0.01, cosine decay, clipping at 1, no
    weight decay; report the test split. BiT's augmentation (resize 448,
    random crop 384, flip; crops/flips off where they change the label).

    Expected (paper Table 9, mean over the 19 tasks): 72.7 % for ViT-L/16
    pre-trained on ImageNet-21k (`--model=ViT-L_16`), 77.6 % for ViT-H/14 and
    76.3 % for ViT-L/16 pre-trained on JFT-300M (not public).
    """
    return {}


def vtab_augreg():
    """AugReg's VTAB-1k protocol (Steiner et al., App. C).

    Per task, lr {0.001, 0.003, 0.01, 0.03} x {500, 2,500} updates (warmup
    100 / 200) trained on train800 and scored on val200; the best is retrained
    on train800val200 and evaluated on test: 8 + 1 runs per task.

    Expected: per-task numbers of the AugReg paper's figures; the ViT paper's
    Table 9 rows are printed beside the results for reference.
    """
    return dict(sweep=True)


VTAB_CONFIGS = {"paper": vtab_paper, "augreg": vtab_augreg}

# `--smoke`: a tiny model, a few steps, tfds replaced by generated examples
# (no download); flags given on the command line still win.
SMOKE_MODEL = dict(hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, patch_size=8)
SMOKE_COMMON = dict(
    model=None, model_overrides=SMOKE_MODEL, image_size=16, batch_size=8, accum_steps=2,
    eval_batch_size=8, total_steps=4, warmup_steps=1, log_every=2, checkpoint_every=2,
    eval_every=0, shuffle_buffer=16, cache="true",
)
FINETUNE_SMOKE = dict(SMOKE_COMMON, weights=None, lr_grid=(0.01, 0.03))
PRETRAIN_SMOKE = dict(SMOKE_COMMON, accum_steps=1, epochs=1.0)
VTAB_SMOKE = dict(
    SMOKE_COMMON, weights=None, total_steps=2, warmup_steps=1, checkpoint_every=1, log_every=1,
    lr_grid=(0.01, 0.03), steps_grid=(2,), warmup_grid=(1,),
)


def defaults(fields):
    """`{name: default}` of a field table."""
    return {f.name: f.default for f in fields}


def named(configs, name):
    """The fields a named config sets (a fresh dict)."""
    if name not in configs:
        raise ValueError(f"Unknown config; expected one of {sorted(configs)}. Received: config={name!r}")
    return dict(configs[name]())
