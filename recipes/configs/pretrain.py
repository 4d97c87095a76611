"""Pre-training configs (`python -m recipes.pretrain --config=NAME`).

Sources: paper Table 3 and Sec. 4.1 / App. B.1 (Adam 0.9 / 0.999, batch
4096, 10k warmup steps, decoupled weight decay, clipping at 1 for ImageNet,
pre-training head with one tanh hidden layer), and AugReg (Steiner et al.,
"How to train your ViT?", Sec. 3.3; big_vision `configs/vit_i21k.py`:
cosine, lr 1e-3, wd 0.1, sigmoid cross-entropy with head bias -10,
RandAugment/mixup presets).

Dropout: `imagenet2012` and `imagenet21k` set 0.1 (paper Table 3),
`augreg_imagenet21k` 0.0 (AugReg's recommended checkpoint). A custom model
(`--model=none`) inherits the config's `dropout_rate`; the run's start
header warns about it.
"""

import dataclasses

from recipes.configs import SMOKE
from recipes.configs import DataFields
from recipes.configs import ModelFields
from recipes.configs import PRETRAINING
from recipes.configs import Optional
from recipes.configs import RunFields
from recipes.configs import ScheduleFields
from recipes.configs import arg
from recipes.configs import named

# AugReg's augmentation presets (Steiner et al., Sec. 3.3; big_vision
# `configs/vit_i21k.py`, RANDAUG_DEF and MIXUP_DEF): RandAugment
# (layers, magnitude), or None, and the mixup alpha.
AUGREG = {
    "none": (None, 0.0),
    "light1": ((2, 0), 0.0),
    "light2": ((2, 10), 0.2),
    "medium1": ((2, 15), 0.2),
    "medium2": ((2, 15), 0.5),
    "strong1": ((2, 20), 0.5),
    "strong2": ((2, 20), 0.8),
}
LOSSES = ("softmax", "sigmoid")


@dataclasses.dataclass(eq=True)
class PretrainConfig(ModelFields, DataFields, ScheduleFields, RunFields):
    pre_logits: bool = arg(
        True, "pre-training head with one tanh hidden layer of the model's width (paper Sec. 3.1, "
        "App. D.3; AugReg i21k: false)")
    drop_path_rate: float = arg(0.0, "stochastic depth, increasing linearly to this rate", valid="[0, 1)")
    dataset: Optional[str] = arg(
        "imagenet2012", "tfds name or a folder holding one sub-folder per split, each with one "
        "sub-folder per class")
    train_split: str = arg("train[:99%]", "split to train on")
    test_split: Optional[str] = arg("validation", "split to report accuracy on; none to skip")
    image_size: int = arg(224, "pre-training resolution (paper: 224)", valid="[1, inf)")
    batch_size: int = arg(4096, "global batch per optimizer update (paper: 4096)", valid="[1, inf)")
    eval_batch_size: int = arg(256, "evaluation batch", valid="[1, inf)")
    epochs: float = arg(300.0, "training length in epochs of train_split (if total_steps is 0)", valid="(0, inf)")
    total_steps: int = arg(0, "optimizer updates; 0: from epochs", valid="[0, inf)")
    warmup_steps: Optional[int] = arg(None, "linear warmup (paper: 10k)", valid="[0, inf)", library=PRETRAINING)
    learning_rate: float = arg(3e-3, "base learning rate (Table 3)", valid="(0, inf)")
    decay_type: str = arg("cosine", "decay after the warmup (keras_vit.training.WarmupDecay's; Table 3)")
    linear_end: Optional[float] = arg(
        None, "final learning rate of the linear decay", valid="[0, inf)", library=PRETRAINING)
    weight_decay: float = arg(0.3, "decoupled weight decay times the learning rate, on kernels (Table 3)", valid="[0, inf)")
    first_moment_dtype: Optional[str] = arg(
        None, "Adam first moment dtype: float32 or bfloat16 (big_vision)", library=PRETRAINING)
    loss: str = arg(
        "softmax", "softmax (cross-entropy) or sigmoid (AugReg: per-class sigmoid, head bias -10 / -6.9)")
    label_smoothing: float = arg(0.0, "label smoothing", valid="[0, 1)")
    head_bias_init: Optional[float] = arg(
        None, "head bias (default: 0 for softmax; sigmoid: -10 for imagenet21k, -6.9 otherwise)")
    augmentation: str = arg(
        "inception_crop", "inception_crop (the AugReg pipeline: crop, flip, RandAugment, mixup), or "
        "resize / resize_crop for small images (no RandAugment or mixup)")
    augreg: str = arg("none", f"AugReg preset: {', '.join(AUGREG)}")
    flip: bool = arg(True, "random flips (resize / resize_crop; inception_crop always flips)")


def imagenet2012():
    """ViT-B/16 from scratch on ImageNet-2012, paper Table 3.

        python -m recipes.pretrain --config=imagenet2012 --manual_dir=/data/imagenet

    300 epochs of `train[:99%]` at batch 4096, Adam, base lr 3e-3, 10k
    warmup steps, cosine decay, weight decay 0.3 (decoupled, times the
    learning rate, on kernels), dropout 0.1, clipping at 1, pre-training head
    with a tanh hidden layer; 224 px.

    Expected: 77.91 % ImageNet top-1 after fine-tuning the result at 384 px
    (paper Table 5, ViT-B/16 pre-trained on ImageNet): run the `imagenet2012`
    fine-tuning config with `--weights=<run_dir>/model.npz`.
    """
    return PretrainConfig(
        dataset="imagenet2012", train_split="train[:99%]", test_split="validation",
        epochs=300.0, learning_rate=3e-3, decay_type="cosine", weight_decay=0.3,
        dropout_rate=0.1, log_every=1000, checkpoint_every=1000,
    )


def imagenet21k():
    """ViT-B/16 on ImageNet-21k, paper Table 3.

        python -m recipes.pretrain --config=imagenet21k --dataset=/data/imagenet21k

    90 epochs at batch 4096, Adam, base lr 1e-3, 10k warmup steps, linear
    decay, weight decay 0.03, dropout 0.1, clipping at 1, tanh hidden layer in
    the head; 224 px. ImageNet-21k is not in tensorflow-datasets: give
    `--dataset=/path/to/imagenet21k` holding `train/<wnid>/*.JPEG` (21,843
    classes) and a held-out `val/<wnid>/...` (or `--test_split=none`).

    Expected (after fine-tuning at 384 px, paper Table 5): ImageNet 83.97 %,
    CIFAR-10 98.95 %, CIFAR-100 91.67 %.
    """
    return PretrainConfig(
        dataset=None, train_split="train", test_split="val",
        epochs=90.0, learning_rate=1e-3, decay_type="linear", weight_decay=0.03,
        dropout_rate=0.1, log_every=1000, checkpoint_every=1000,
    )


def augreg_imagenet21k():
    """ViT-B/16 on ImageNet-21k with AugReg's recommended recipe.

        python -m recipes.pretrain --config=augreg_imagenet21k --dataset=/data/imagenet21k

    AugReg Sec. 3.3 / big_vision `configs/vit_i21k.py`: 300 epochs at batch
    4096, Adam (first moment in bfloat16), lr 1e-3, 10k warmup, cosine,
    weight decay 0.1 (decoupled, times the lr), clipping at 1, sigmoid
    cross-entropy with head bias -10, no hidden layer in the head,
    RandAugment(2, 15) + mixup 0.2 (`medium1`), dropout 0, stochastic depth 0:
    the `B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0`
    checkpoint. Dataset as `imagenet21k`.

    Expected: 85.49 % ImageNet top-1 after fine-tuning at 384 px (AugReg
    index, the recommended B/16 checkpoint).
    """
    return PretrainConfig(
        dataset=None, train_split="train", test_split="val",
        epochs=300.0, learning_rate=1e-3, decay_type="cosine", weight_decay=0.1,
        first_moment_dtype="bfloat16", loss="sigmoid", pre_logits=False, augreg="medium1",
        dropout_rate=0.0, drop_path_rate=0.0, log_every=1000, checkpoint_every=1000,
    )


CONFIGS = {f.__name__: f for f in (imagenet2012, imagenet21k, augreg_imagenet21k)}
DEFAULT = "imagenet2012"


def smoke_config(config):
    """`--smoke`: a tiny random model for a few updates on generated data."""
    return config.replace(**dict(SMOKE, accum_steps=1), epochs=1.0)


def get_config(name=DEFAULT, smoke=False):
    config = named(CONFIGS, name)
    return smoke_config(config) if smoke else config
