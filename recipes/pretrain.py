"""Pre-train a ViT with the paper's (or AugReg's) supervised recipe.

Adam (beta 0.9 / 0.999, epsilon added after the bias correction as optax),
decoupled weight decay times the learning rate on the kernels, 10k warmup
steps then cosine or linear decay, global-norm clipping at 1, batch 4096,
224 px, a pre-training head with one tanh hidden layer (paper Table 3, Sec.
4.1, App. B.1); or AugReg's variant: sigmoid cross-entropy, RandAugment and
mixup presets, no hidden layer (`--config=augreg_imagenet21k`).

    # ViT-B/16 on ImageNet-2012 from scratch, paper Table 3:
    python -m recipes.pretrain --config=imagenet2012
    # ImageNet-21k is not in tensorflow-datasets: a folder train/<class>/*.JPEG, val/...
    python -m recipes.pretrain --config=imagenet21k --dataset=/data/imagenet21k
    # Any field is a flag:
    python -m recipes.pretrain --config=imagenet2012 --model=ViT-S_16 --augreg=medium2
    # Seconds, no download:
    python -m recipes.pretrain --smoke

The run directory (`--run_dir`, default runs/pretrain/<config>) holds
`checkpoints/` (the same command resumes), `logs/` (TensorBoard),
`history.csv`, `model.keras`, `model.npz` (original format: fine-tune it with
`python -m recipes.finetune --weights=<run_dir>/model.npz`) and
`summary.json`. See docs/recipes.md.

Sources: the paper's Table 3, Sec. 4.1 and App. B.1, and AugReg (Steiner et
al., "How to train your ViT?", Sec. 3.3; big_vision `configs/vit_i21k.py`).
Dropout: 0.1 for `imagenet2012` and `imagenet21k` (Table 3), 0.0 for
`augreg_imagenet21k`; a custom model (`--model=none`) inherits the config's
`dropout_rate`, and the start header says so.
"""

import functools

from recipes import cli
from recipes import train
from recipes.configs import SMOKE
from recipes.configs import Named
from recipes.configs import Recipe
from recipes.configs import TrainConfig

# Table 3's set-up for ViT-B/16, from random weights.
BASE = dict(
    optimizer="adam", pipeline="pretrain", weights=None, reset_head=False, pre_logits=True, drop_path_rate=0.0,
    dataset="imagenet2012", train_split="train[:99%]", test_split="validation", image_size=224, batch_size=4096,
    accum_steps=1, eval_batch_size=256, total_steps=0, epochs=300.0, learning_rate=3e-3, log_every=1000,
    checkpoint_every=1000,
)
RECIPE = Recipe("pretrain", "Pre-training", TrainConfig, base=BASE, smoke=dict(SMOKE, accum_steps=1, epochs=1.0),
                summary_keys=("accuracy", "eval_loss", "eval_examples", "steps", "final_loss", "images_per_second",
                              "total_wall_time_s", "model_keras", "model_npz"), configs={
    "imagenet2012": Named(
        "ViT-B/16 from scratch on ImageNet, paper Table 3: 300 epochs, lr 3e-3, cosine, weight decay 0.3, dropout 0.1",
        dict(decay_type="cosine", weight_decay=0.3, dropout_rate=0.1),
        "77.91 % ImageNet top-1 after fine-tuning the result at 384 px (paper Table 5; run the imagenet2012 "
        "fine-tuning config with --weights=<run_dir>/model.npz)", "--manual_dir=/data/imagenet"),
    "imagenet21k": Named(
        "ViT-B/16 on ImageNet-21k (a folder: train/<wnid>/*.JPEG, val/...), paper Table 3: 90 epochs, lr 1e-3, "
        "linear decay, weight decay 0.03, dropout 0.1",
        dict(dataset=None, train_split="train", test_split="val", epochs=90.0, learning_rate=1e-3,
             decay_type="linear", weight_decay=0.03, dropout_rate=0.1),
        "after fine-tuning at 384 px, paper Table 5: ImageNet 83.97 %, CIFAR-10 98.95 %, CIFAR-100 91.67 %",
        "--dataset=/data/imagenet21k"),
    "augreg_imagenet21k": Named(
        "ViT-B/16 on ImageNet-21k, AugReg's recommended recipe: 300 epochs, lr 1e-3, cosine, weight decay 0.1, "
        "sigmoid loss (head bias -10), no hidden layer, RandAugment(2, 15) + mixup 0.2 (medium1), dropout 0",
        dict(dataset=None, train_split="train", test_split="val", learning_rate=1e-3, decay_type="cosine",
             weight_decay=0.1, first_moment_dtype="bfloat16", loss="sigmoid", pre_logits=False, augreg="medium1",
             dropout_rate=0.0),
        "85.49 % ImageNet top-1 after fine-tuning at 384 px (AugReg index: the "
        "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0 checkpoint)", "--dataset=/data/imagenet21k"),
})

parse, main = cli.entry_points(RECIPE, functools.partial(train.run, RECIPE), prog="python -m recipes.pretrain",
                               description=__doc__.split("\n\n")[0])

if __name__ == "__main__":
    cli.run_command(main)
