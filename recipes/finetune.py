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
    python -m recipes.finetune --config=oxford_iiit_pet --sweep=true
    # Any field is a flag; any weights the models accept (a pretrain run's
    # model.npz, a registered name, a file):
    python -m recipes.finetune --config=cifar100 --weights=runs/pretrain/custom/model.npz
    # A few seconds, no download: a tiny model on generated data.
    python -m recipes.finetune --smoke

Everything goes to one run directory (`--run_dir`, default
runs/finetune/<config>): `checkpoints/` (the same command resumes an
interrupted run), `logs/` (TensorBoard), `history.csv`, `model.keras`,
`model.npz` (original format) and `summary.json`. See docs/recipes.md.
"""

import os
import sys
import time

if __package__ in (None, ""):  # `python recipes/finetune.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from recipes import common
from recipes import configs

DESCRIPTION = __doc__.split("\n\n")[0] + (
    " Every config field below is a flag; --config picks a named config "
    "(paper Table 4), --smoke shrinks everything to seconds."
)


def parse(argv=None):
    """`(config_name, config, smoke)` from command-line arguments."""
    return common.parse_flags(
        argv,
        fields=configs.FINETUNE_FIELDS,
        named_configs=configs.FINETUNE_CONFIGS,
        default_config="cifar10",
        smoke=configs.FINETUNE_SMOKE,
        description=DESCRIPTION,
        prog="python -m recipes.finetune",
    )


def build_model(config, num_classes):
    """The model at the target resolution with the pre-trained weights.

    `keras_vit.load_weights` resamples the position embeddings to the new
    grid and re-initialises a head of another size; with `reset_head` the
    head is zeroed in any case (paper Sec. 3.2: "we remove the pre-trained
    prediction head and attach a zero-initialized D x K feedforward layer").

    Returns:
        `(model, notes)`: an uncompiled model and the loader's notes (what
        was resampled, dropped or re-initialised).
    """
    import keras_vit
    from keras_vit.models import variants

    variant, kwargs = common.model_fields(config)
    size = config["image_size"]
    model = keras_vit.ViT(variant, num_classes=num_classes, input_shape=(size, size, 3), **kwargs)
    notes = []
    if config["weights"]:
        config_name = variants.resolve_variant(variant)[0] if variant else None
        notes = list(keras_vit.load_weights(model, config["weights"], variant=config_name))
    if config["reset_head"]:
        common.zero_head(model, kwargs.get("head_bias_init", 0.0))
        notes.append("head: zero-initialised for fine-tuning.")
    return model, notes


def make_optimizer(config):
    from keras_vit import training

    accum = config["accum_steps"]
    return training.finetuning_optimizer(
        config["learning_rate"],
        config["total_steps"],
        warmup_steps=config["warmup_steps"],
        decay_type=config["decay_type"],
        momentum=config["momentum"],
        global_clipnorm=config["grad_clip"],
        accumulator_dtype=config["accumulator_dtype"],
        gradient_accumulation_steps=accum if accum > 1 else None,
    )


def fit_one(config, *, run_dir, setup, train_data, eval_data, num_classes, callbacks=(), save_model=True):
    """One fine-tuning run on prepared data (also used by recipes/vtab.py).

    Args:
        config: fine-tuning fields (model, weights, image_size, optimizer,
            steps, batch sizes).
        run_dir: where this run writes (resumable).
        setup: a `keras_vit.distribute.DistributionSetup`.
        train_data: `(batch_size) -> tf.data.Dataset`, repeating.
        eval_data: `(batch_size) -> tf.data.Dataset`, one pass, or None.
        num_classes: int.
    """
    from keras_vit import training

    def build():
        model, notes = build_model(config, num_classes)
        common.compile_model(model, make_optimizer(config), training.SoftmaxCrossEntropy(), config)
        return model, notes

    return common.train_and_evaluate(
        config,
        run_dir=run_dir,
        setup=setup,
        build=build,
        train_data=train_data,
        eval_data=eval_data,
        callbacks=callbacks,
        save_model=save_model,
    )


def _run_on_splits(config, train_split, eval_split, *, run_dir, setup, callbacks, save_model):
    from keras_vit import data

    train_source = common.load_source(config, train_split)
    eval_source = common.load_source(config, eval_split) if eval_split else None
    if eval_source is not None and eval_source.num_classes != train_source.num_classes:
        raise ValueError(
            f"The splits have different class counts ({train_source.num_classes} in "
            f"{train_split!r}, {eval_source.num_classes} in {eval_split!r}). "
            f"Received: dataset={config['dataset']!r}"
        )
    cache = common.cache_setting(config)

    def train_data(batch_size):
        return data.finetune_pipeline(
            train_source, training=True, batch_size=batch_size, image_size=config["image_size"],
            augmentation=config["augmentation"], flip=config["flip"],
            shuffle_buffer=config["shuffle_buffer"], cache=cache, seed=config["seed"],
        )

    def eval_data(batch_size):
        return data.finetune_pipeline(
            eval_source, training=False, batch_size=batch_size, image_size=config["image_size"],
            cache=cache,
        )

    result = fit_one(
        config,
        run_dir=run_dir,
        setup=setup,
        train_data=train_data,
        eval_data=eval_data if eval_source is not None else None,
        num_classes=train_source.num_classes,
        callbacks=callbacks,
        save_model=save_model,
    )
    return dict(result, num_classes=train_source.num_classes, train_split=train_split, eval_split=eval_split)


def run(config, config_name=None, smoke=False, callbacks=()):
    """Runs a parsed config; returns the summary (also `summary.json`)."""
    if config["sweep"] and not (config["sweep_train_split"] and config["sweep_val_split"]):
        raise ValueError(
            "`sweep` needs `sweep_train_split` and `sweep_val_split`. Received: "
            f"sweep_train_split={config['sweep_train_split']!r}, "
            f"sweep_val_split={config['sweep_val_split']!r}"
        )
    common.check_schedule(config)
    run_dir = common.prepare_run_dir(config, "finetune", config_name)
    summary_path = os.path.join(run_dir, "summary.json")
    done = common.read_json(summary_path)
    if done is not None:
        print(f"Finished earlier: {summary_path}")
        return done
    start = time.perf_counter()
    setup = common.set_up(config)
    sweep = []
    final = dict(config)
    with common.maybe_smoke_data(config, smoke):
        if config["sweep"]:
            for lr in config["lr_grid"]:
                trial = dict(config, learning_rate=lr)
                result = _run_on_splits(
                    trial, config["sweep_train_split"], config["sweep_val_split"],
                    run_dir=os.path.join(run_dir, "sweep", f"lr_{lr:g}"), setup=setup,
                    callbacks=callbacks, save_model=False,
                )
                sweep.append({"learning_rate": lr, "val_accuracy": result["accuracy"]})
                print(f"sweep lr={lr:g}: accuracy on {config['sweep_val_split']!r} "
                      f"{result['accuracy']:.4f}", flush=True)
            # The first of the best on ties (the grids are in increasing order).
            best = max(sweep, key=lambda row: row["val_accuracy"])
            final["learning_rate"] = best["learning_rate"]
        result = _run_on_splits(
            final, config["train_split"], config["test_split"], run_dir=run_dir, setup=setup,
            callbacks=callbacks, save_model=True,
        )
    summary = {
        "recipe": "finetune",
        "config_name": config_name,
        "config": common.jsonable(config),
        "learning_rate": final["learning_rate"],
        "sweep": sweep,
        **result,
        **common.environment(setup),
        "total_wall_time_s": time.perf_counter() - start,
    }
    common.write_json(summary_path, summary)
    common.print_summary(
        f"Fine-tuning finished: {run_dir}",
        summary,
        ("accuracy", "eval_examples", "eval_split", "steps", "learning_rate", "images_per_second",
         "total_wall_time_s", "model_keras", "model_npz"),
    )
    return summary


def main(argv=None, callbacks=()):
    config_name, config, smoke = parse(argv)
    return run(config, config_name, smoke=smoke, callbacks=callbacks)


if __name__ == "__main__":
    with common.exit_on_missing_data():
        main()
