"""Fine-tune a pre-trained ViT at a higher resolution, as the paper does.

The model is rebuilt at `--image_size` (384 in the paper): the checkpoint's
position embeddings are resampled to the new patch grid (bilinear, as the
original) and the head is replaced by a zero-initialised one for the new
classes (paper Sec. 3.2). Training is the paper's (App. B.1.1): SGD with
momentum 0.9 in the original's update order, batch 512 through gradient
accumulation, global-norm clipping at 1, linear warmup then cosine decay, no
weight decay; accuracy on the test split.

    # ViT-B/16 (ImageNet-21k) on CIFAR-10 at 384 px, vit_jax's settings:
    python -m recipes.finetune --config=cifar10
    # The paper's protocol: lr grid on a held-out split, best lr on all data:
    python -m recipes.finetune --config=oxford_iiit_pet --sweep
    # Any field is a flag; any weights the models accept (a pretrain run's
    # model.npz, a registered name, a file); any VTAB task as the dataset:
    python -m recipes.finetune --config=cifar100 --weights=runs/pretrain/custom/model.npz
    python -m recipes.finetune --dataset=vtab:dtd --train_split=train800val200 --total_steps=2500
    # Seconds, no download: a tiny model on generated data.
    python -m recipes.finetune --smoke

Everything goes to one run directory (`--run_dir`, default
runs/finetune/<config>): `checkpoints/` (the same command resumes an
interrupted run), `logs/` (TensorBoard), `history.csv`, `model.keras`,
`model.npz` (original format) and `summary.json`. See docs/recipes.md.

Sources of the numbers: the paper's App. B.1.1 and Table 4, and
google-research/vision_transformer (`vit_jax/configs/common.py`,
`configs/vit.py`: warmup 500, batch 512 as 8 x 64, `train[:98%]`).
Dropout: the variant's (`keras_vit.models.variants`: vit_jax's fine-tuning
values, 0.0 for ViT-B/16, 0.1 for ViT-L/16, 0.0 for AugReg names) unless
`--dropout_rate` is given.
"""

import functools

from recipes import cli
from recipes import train
from recipes.configs import SMOKE
from recipes.configs import Named
from recipes.configs import Recipe
from recipes.configs import TrainConfig

# ViT-B/16 pre-trained on ImageNet-21k unless stated; 384 px, batch 512.
RECIPE = Recipe("finetune", "Fine-tuning", TrainConfig, base={}, smoke=SMOKE, configs={
    "cifar10": Named(
        "CIFAR-10: 10k steps, lr 0.01 (vit_jax configs/vit.py, b16 cifar10; paper grid via --sweep)",
        dict(dataset="cifar10", learning_rate=0.01),
        "99.02 % test accuracy (vit_jax README, ViT-B_16); paper Table 5: 98.95 %"),
    "cifar100": Named(
        "CIFAR-100: 10k steps, lr 0.03 (vit_jax configs/common.py)",
        dict(dataset="cifar100", learning_rate=0.03),
        "92.06 % (vit_jax README, ViT-B_16); paper Table 5: 91.67 %"),
    "oxford_iiit_pet": Named(
        "Pets, ViT-L/16: 500 steps, warmup 100, lr 0.01; --sweep holds out 10 % of train (paper Table 4)",
        dict(model="ViT-L_16", dataset="oxford_iiit_pet", train_split="train", sweep_train_split="train[:90%]",
             sweep_val_split="train[90%:]", total_steps=500, warmup_steps=100, learning_rate=0.01, log_every=50,
             checkpoint_every=100),
        "94.67 % (paper Table 2, ViT-L/16 pre-trained on ImageNet-21k)", "--sweep"),
    "oxford_flowers102": Named(
        "Flowers-102, ViT-L/16: 500 steps on train+validation, warmup 100, lr 0.01 (paper Table 4)",
        dict(model="ViT-L_16", dataset="oxford_flowers102", train_split="train+validation",
             sweep_train_split="train[:90%]+validation[:90%]", sweep_val_split="train[90%:]+validation[90%:]",
             total_steps=500, warmup_steps=100, learning_rate=0.01, log_every=50, checkpoint_every=100),
        "99.61 % (paper Table 2, ViT-L/16 pre-trained on ImageNet-21k)", "--sweep"),
    "imagenet2012": Named(
        "ImageNet: 20k steps, lr 0.03 on train[:99%], evaluated on validation (vit_jax)",
        dict(dataset="imagenet2012", train_split="train[:99%]", test_split="validation",
             sweep_train_split="train[:99%]", sweep_val_split="train[99%:]", lr_grid=(0.003, 0.01, 0.03, 0.06),
             total_steps=20_000, learning_rate=0.03),
        "84.53 % top-1 (vit_jax README, ViT-B_16); paper Table 5: 83.97 %", "--manual_dir=/data/imagenet"),
})

parse, main = cli.entry_points(RECIPE, functools.partial(train.run, RECIPE), prog="python -m recipes.finetune",
                               description=__doc__.split("\n\n")[0])

if __name__ == "__main__":
    cli.run_command(main)
