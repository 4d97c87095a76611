"""Fine-tune a pre-trained ViT at a higher resolution, as the paper does.

The model is rebuilt at `--image_size` (384 in the paper): the position
embeddings of the checkpoint are resampled to the new patch grid (bilinear,
as the original) and the head is replaced by a zero-initialised one for the
new classes (paper Sec. 3.2). Training is the paper's (App. B.1.1): SGD with
momentum 0.9 in the original's update order, batch 512 through gradient
accumulation, global-norm clipping at 1, linear warmup then cosine decay, no
weight decay. The accuracy is reported on the test split.

    # ViT-B/16 (ImageNet-21k) on CIFAR-10 at 384 px, vit_jax's settings:
    python -m recipes.finetune --config=cifar10
    # The paper's protocol: lr grid on a held-out split, best lr on all data:
    python -m recipes.finetune --config=oxford_iiit_pet --sweep
    # Any field is a flag; any weights the models accept (a pretrain run's
    # model.npz, a registered name, a file):
    python -m recipes.finetune --config=cifar100 --weights=runs/pretrain/custom/model.npz
    # Seconds, no download: a tiny model on generated data.
    python -m recipes.finetune --smoke

Everything goes to one run directory (`--run_dir`, default
runs/finetune/<config>): `checkpoints/` (the same command resumes an
interrupted run), `logs/` (TensorBoard), `history.csv`, `model.keras`,
`model.npz` (original format) and `summary.json`. See docs/recipes.md.
"""

import os

from recipes import classifier
from recipes import cli
from recipes import run as skeleton
from recipes.configs import finetune as configs

PROG = "python -m recipes.finetune"
DESCRIPTION = __doc__.split("\n\n")[0]
SUMMARY_KEYS = ("accuracy", "eval_loss", "eval_examples", "eval_split", "steps", "learning_rate",
                "images_per_second", "total_wall_time_s", "model_keras", "model_npz")


def _run_on_splits(config, train_split, eval_split, *, run_dir, setup, header=(), callbacks=(), save_model):
    from keras_vit import data

    train_source = skeleton.load_source(config, train_split)
    eval_source = (
        skeleton.load_source(config, eval_split, class_names=train_source.class_names)
        if eval_split else None
    )
    if eval_source is not None and eval_source.num_classes != train_source.num_classes:
        raise cli.RecipeError(
            f"the splits have different class counts ({train_source.num_classes} in "
            f"{train_split!r}, {eval_source.num_classes} in {eval_split!r}). "
            f"Received: --dataset={config.dataset}"
        )
    cache = skeleton.cache_setting(config)

    def train_data(batch_size):
        try:
            return data.finetune_pipeline(
                train_source, training=True, batch_size=batch_size, image_size=config.image_size,
                augmentation=config.augmentation, flip=config.flip,
                shuffle_buffer=config.shuffle_buffer, cache=cache, seed=config.seed,
                batch_augmentation=classifier.augmentation_layers(config.batch_augmentation),
            )
        except ValueError as error:  # a layer that cannot run there, found as the pipeline is built
            if "batch_augmentation" not in str(error):
                raise
            raise cli.RecipeError(f"--batch_augmentation={config.batch_augmentation}: {error}") from None

    def eval_data(batch_size):
        return data.finetune_pipeline(
            eval_source, training=False, batch_size=batch_size, image_size=config.image_size, cache=cache,
            pad_to_batch=True,
        )

    header = [*header, skeleton.data_line(train_split, train_source, eval_split, eval_source)]
    result = classifier.fit_one(
        config, run_dir=run_dir, setup=setup, train_data=train_data,
        eval_data=eval_data if eval_source is not None else None, num_classes=train_source.num_classes,
        eval_label=repr(eval_split), header=header, callbacks=callbacks, save_model=save_model,
    )
    return dict(result, num_classes=train_source.num_classes, train_split=train_split, eval_split=eval_split)


def check(config):
    skeleton.check_fields(config)
    if config.sweep and not (config.sweep_train_split and config.sweep_val_split):
        raise cli.RecipeError(
            "--sweep needs --sweep_train_split and --sweep_val_split. Received: "
            f"--sweep_train_split={config.sweep_train_split}, --sweep_val_split={config.sweep_val_split}"
        )
    skeleton.check_schedule(config)
    classifier.augmentation_layers(config.batch_augmentation)  # A bad name fails before any data is read.


def run(config, config_name=None, smoke=False, callbacks=()):
    """Runs a parsed config; returns the summary (also `summary.json`)."""
    check(config)

    def body(run_dir, setup, header):
        final, rows = {"learning_rate": config.learning_rate}, []
        if config.sweep:
            def fit(changes, name):
                return _run_on_splits(
                    config.replace(**changes), config.sweep_train_split, config.sweep_val_split,
                    run_dir=os.path.join(run_dir, "sweep", name), setup=setup, callbacks=callbacks,
                    save_model=False,
                )["accuracy"]

            grid = [(f"lr_{lr:g}", {"learning_rate": lr}) for lr in config.lr_grid]
            final, rows = skeleton.sweep(grid, fit, repr(config.sweep_val_split))
        result = _run_on_splits(
            config.replace(**final), config.train_split, config.test_split, run_dir=run_dir, setup=setup,
            header=header, callbacks=callbacks, save_model=True,
        )
        return {"learning_rate": final["learning_rate"], "sweep": rows, **result}

    return skeleton.run_recipe(
        "finetune", config, config_name, smoke=smoke, body=body, title="Fine-tuning",
        summary_keys=SUMMARY_KEYS,
    )


parse, main = cli.entry_points(configs, run, prog=PROG, description=DESCRIPTION)


if __name__ == "__main__":
    cli.run_command(main)
