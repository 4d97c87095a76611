"""The whole ViT workflow in a few minutes on a laptop CPU, offline.

On real images that scikit-learn ships (the 1,797 8x8 handwritten digits of
`sklearn.datasets.load_digits`, grey-scale, tiled to RGB by the input
pipeline), this demo does what the paper does at scale:

1. writes the digits as PNG files, one folder per class, with a fixed
   stratified train/test split (80 % / 20 %);
2. pre-trains a small ViT from scratch at a low resolution (16 px, patches
   of 4: a 4x4 grid) with the pretrain recipe's settings (Adam, decoupled
   weight decay, warmup + cosine, a tanh pre-logits layer in the head);
3. fine-tunes it at a higher resolution (32 px: an 8x8 grid) as the
   finetune recipe does, the same trainer as for ImageNet: the position
   embeddings are resampled from 4x4 to 8x8, the head is replaced by a
   zero-initialised one, SGD with momentum, batch 64 as 2 accumulated
   micro-batches of 32, clipping at 1, warmup + cosine;
4. prints the test accuracy (expect about 96-99 %; 2-4 minutes on 2 CPU
   cores);
5. draws what the fine-tuned model learned (the paper's Figures 6 and 7)
   with `keras_vit.inspect`: attention rollout over test digits, the
   similarity of the resampled position embeddings, the principal
   components of the patch-embedding filters and the mean attention
   distance per head.

    python -m recipes.demo                     # or: bash scripts/demo.sh
    python -m recipes.demo --finetune_steps=100  # any field is a flag
    python -m recipes.demo --smoke               # about a minute: a tiny ViT, 4 + 4 updates

Everything stays in `--run_dir` (default runs/demo): `data/` (the PNGs),
`pretrain/` and `finetune/` (checkpoints, logs/ for TensorBoard, history.csv,
model.keras, model.npz, summary.json) and `inspect/` (the figures as PNG).
"""

import os
import time

from recipes import checks
from recipes import cli
from recipes import rundir
from recipes import train
from recipes.configs import SMOKE_MODEL
from recipes.configs import DemoConfig
from recipes.configs import Named
from recipes.configs import Recipe
from recipes.configs import TrainConfig

RECIPE = Recipe(
    "demo", "Demo", DemoConfig, base=dict(verbose=2),
    # Patches of 4 as the full demo's, so that fine-tuning resamples a 4x4 grid to 8x8.
    smoke=dict(pretrain_steps=4, finetune_steps=4, model_overrides=dict(SMOKE_MODEL, patch_size=4)),
    configs={"digits": Named(
        "pre-train at 16 px, fine-tune at 32 px on scikit-learn's digits: a ViT of width 64, 4 blocks, 4 heads, "
        "patches of 4; 1,000 Adam updates of 64, then 300 SGD-momentum updates of 64 (2 x 32)", {},
        "96-99 % test accuracy on the 360 held-out digits in 2-4 minutes on 2 CPU cores (docs/recipes.md)")})
# What both runs share: the digits folder, resize + random crop without
# flips (digits are too small for inception crops and change meaning when
# flipped), one cached split, no dropout.
COMMON = dict(model=None, dropout_rate=0.0, train_split="train", test_split="test", eval_batch_size=120,
              pipeline="finetune", augmentation="resize_crop", flip=False, shuffle_buffer=2000,
              cache="true", checkpoint_every=100)
# The two runs, as the pretrain and finetune recipes' configs (their run
# directories record those names): pre-training from random weights with
# Adam, decoupled weight decay, warmup + cosine and a tanh pre-logits layer
# (the paper's Table 3 set-up); fine-tuning from its model.npz with the
# trainer's defaults, SGD with momentum (App. B.1.1).
PRETRAINING = Recipe("pretrain", "Pre-training", TrainConfig, base=dict(
    COMMON, optimizer="adam", weights=None, reset_head=False, pre_logits=True, drop_path_rate=0.0, accum_steps=1,
    learning_rate=2e-3, decay_type="cosine", weight_decay=0.05), configs={}, smoke={})
FINETUNING = Recipe("finetune", "Fine-tuning", TrainConfig, base=dict(COMMON, accum_steps=2), configs={}, smoke={})


def demo_configs(demo, data_dir):
    """The `TrainConfig`s of the demo's pre-training and fine-tuning."""
    shared = dict(model_overrides=dict(demo.model_overrides), dataset=data_dir,
                  **{name: getattr(demo, name) for name in ("jit_compile", "distribution", "seed", "deterministic",
                                                           "verbose")})
    upstream = TrainConfig(**PRETRAINING.base).replace(
        **shared, image_size=demo.pretrain_size, batch_size=demo.pretrain_batch_size,
        total_steps=demo.pretrain_steps, warmup_steps=max(1, demo.pretrain_steps // 10),
        log_every=max(1, demo.pretrain_steps // 10), run_dir=os.path.join(demo.run_dir, "pretrain"))
    downstream = TrainConfig(**FINETUNING.base).replace(
        **shared, weights=os.path.join(demo.run_dir, "pretrain", "model.npz"), image_size=demo.finetune_size,
        batch_size=demo.finetune_batch_size, total_steps=demo.finetune_steps,
        warmup_steps=max(1, demo.finetune_steps // 10), learning_rate=demo.finetune_learning_rate,
        log_every=max(1, demo.finetune_steps // 10), run_dir=os.path.join(demo.run_dir, "finetune"))
    return upstream, downstream


def write_digits(directory, test_fraction, seed):
    """The digits as 8x8 grey PNGs in `directory/{train,test}/<digit>/`.

    Pixel values 0-16 are scaled to 0-255. Returns the split sizes. Files
    already there (a previous run with the same split: the directory is the
    split's) are reused.
    """
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    marker = os.path.join(directory, "split.json")
    wanted = {"test_fraction": test_fraction, "seed": seed}
    done = rundir.read_json(marker)
    if done is not None and done.get("split") == wanted:
        return done["sizes"]
    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    indices = np.arange(len(images))
    train, test = train_test_split(
        indices, test_size=test_fraction, random_state=seed, stratify=digits.target
    )
    sizes = {}
    for split, chosen in (("train", train), ("test", test)):
        for label in range(10):
            os.makedirs(os.path.join(directory, split, str(label)), exist_ok=True)
        for i in chosen:
            path = os.path.join(directory, split, str(digits.target[i]), f"{i:04d}.png")
            tf.io.write_file(path, tf.io.encode_png(images[i]))
        sizes[split] = int(len(chosen))
    rundir.write_json(marker, {"split": wanted, "sizes": sizes})
    return sizes


def write_inspection(model_path, test_dir, directory, per_class=6):
    """The paper's Figure 6 and 7 analyses of the fine-tuned model on test
    digits (`per_class` of each digit, interleaved so that the rollout
    figure shows different digits). Returns {figure: path}."""
    import keras
    import numpy as np

    import keras_vit
    from keras_vit import inspect as vit_inspect

    model = keras.saving.load_model(model_path, compile=False)
    size = vit_inspect.geometry(model).image_size
    per_digit = [
        vit_inspect.load_image_folder(os.path.join(test_dir, str(digit)), size, per_class)
        for digit in range(10)
    ]
    order = [(digit, i) for i in range(per_class) for digit in range(10) if i < len(per_digit[digit][0])]
    images = np.stack([per_digit[d][0][i] for d, i in order])
    titles = [f"digit {d}" for d, _ in order]
    written = vit_inspect.write_figures(
        model, keras_vit.preprocess_input(images), directory, rollout_images=5, titles=titles
    )
    return {name: path for name, path in written.items() if name not in ("arrays", "summary")}


def run(demo, config_name=None, smoke=False):
    """Runs the demo; returns `{"pretrain": summary, "finetune": summary}`.
    (`--smoke` is already in `demo`: `get_config(smoke=True)` sets the sizes.)"""
    start = time.perf_counter()
    checks.check_fields(demo)
    # The demo's directory is a run directory too (its data, both runs and
    # the figures): --overwrite deletes them, and only them.
    with rundir.claim(demo.run_dir, demo.overwrite):
        # One folder per split: another --test_fraction or --seed writes
        # its own (over the old one, files of both splits mixed), and the
        # runs' recorded dataset then differs.
        data_dir = os.path.join(demo.run_dir, "data", f"digits_test{demo.test_fraction:g}_seed{demo.seed}")
        sizes = write_digits(data_dir, demo.test_fraction, demo.seed)
        print(f"Digits written to {data_dir}: {sizes['train']} training, {sizes['test']} test images "
              "(8x8 grey, tiled to RGB by the pipeline).", flush=True)
        upstream_config, downstream_config = demo_configs(demo, data_dir)
        print(f"\n== Pre-training at {demo.pretrain_size} px", flush=True)
        upstream = train.run(PRETRAINING, upstream_config, "demo")
        print(f"\n== Fine-tuning at {demo.finetune_size} px from {downstream_config.weights}", flush=True)
        downstream = train.run(FINETUNING, downstream_config, "demo")
        wall = time.perf_counter() - start
        if wall < 0.5 * downstream["total_wall_time_s"]:
            print(f"\n(Results of an earlier demo in {demo.run_dir}; --overwrite trains again.)")
        print(
            f"\nTest accuracy: {100 * downstream['accuracy']:.2f} % on {downstream['eval_examples']} "
            f"held-out digits (pre-training at {demo.pretrain_size} px: "
            f"{100 * upstream['accuracy']:.2f} %). Demo wall time {wall:.0f} s, backend "
            f"{downstream['backend']}.\nModels: {downstream['model_keras']}, {downstream['model_npz']}",
            flush=True,
        )
        outcome = {"pretrain": upstream, "finetune": downstream, "wall_time_s": wall}
        if demo.inspect:
            figures = write_inspection(
                downstream["model_keras"], os.path.join(data_dir, "test"), os.path.join(demo.run_dir, "inspect")
            )
            print("Figures of the fine-tuned model (paper Figures 6 and 7):")
            for name, path in figures.items():
                print(f"  {name}: {path}")
            outcome["figures"] = figures
        return outcome


parse, main = cli.entry_points(RECIPE, run, prog="python -m recipes.demo", description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    cli.run_command(main)
