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

import json
import os

from recipes import cli
from recipes import run as skeleton
from recipes.configs import finetune as configs

PROG = "python -m recipes.finetune"
DESCRIPTION = __doc__.split("\n\n")[0]
SUMMARY_KEYS = ("accuracy", "eval_loss", "eval_examples", "eval_split", "steps", "learning_rate",
                "images_per_second", "total_wall_time_s", "model_keras", "model_npz")


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

    size = config.image_size
    model = skeleton.build_vit(config, num_classes=num_classes, input_shape=(size, size, 3))
    notes = []
    if config.weights:
        try:
            notes = list(keras_vit.load_weights(model, config.weights, variant=skeleton.check_model(config)))
        except (ValueError, OSError) as error:
            raise cli.RecipeError(f"--weights={config.weights}: {error}") from None
    if config.reset_head:
        # The builder's layers are kept (pre_logits too, when configured).
        model = keras_vit.reset_head(
            model, num_classes, keep_pre_logits=True,
            bias=config.model_overrides.get("head_bias_init", 0.0),
        )
        notes.append("head: zero-initialised for fine-tuning.")
    if getattr(config, "linear_probe", False):
        keras_vit.freeze_backbone(model)
        notes.append("backbone frozen: only the head trains (linear probe).")
    return model, notes


def _layer_class(name, flag):
    import keras

    cls = getattr(keras.layers, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
        raise cli.RecipeError(
            f"{flag}: unknown Keras layer {name!r} (a class of keras.layers, e.g. RandAugment, MixUp, CutMix)"
        )
    return cls


def augmentation_layers(text):
    """`--batch_augmentation` as a list of Keras layers, or None (off).

    `text`: comma-separated names of `keras.layers` classes, built with their
    default arguments (`RandAugment,MixUp`), or a JSON list of serialized
    layers: `{"class_name": ..., "config": {...}}` names a `keras.layers`
    class; an entry with a `"module"` (`keras.saving.serialize_keras_object`'s
    output, e.g. a registered custom layer) is deserialized as Keras does.
    """
    if text is None:
        return None
    import keras

    flag = f"--batch_augmentation={text}"
    if text.lstrip().startswith("["):
        try:
            specs = json.loads(text)
        except json.JSONDecodeError as error:
            raise cli.RecipeError(f"{flag}: not a JSON list ({error})") from None
    else:
        specs = [{"class_name": name.strip()} for name in text.split(",") if name.strip()]
    layers = []
    for spec in specs:
        if not (isinstance(spec, dict) and "class_name" in spec):
            raise cli.RecipeError(
                f'{flag}: each entry must be {{"class_name": ..., "config": {{...}}}}. Received: {json.dumps(spec)}'
            )
        if "module" in spec:
            build = lambda spec=spec: keras.saving.deserialize_keras_object(spec)  # noqa: E731
        else:
            cls = _layer_class(spec["class_name"], flag)
            # float32 pixels whatever --dtype_policy says (the pipeline requires it).
            config = {"dtype": "float32", **(spec.get("config") or {})}
            build = lambda cls=cls, config=config: cls.from_config(config)  # noqa: E731
        try:
            layers.append(build())
        except (TypeError, ValueError) as error:
            raise cli.RecipeError(f"{flag}: {error}") from None
    return layers or None


def make_optimizer(config):
    from keras_vit import training

    accum = config.accum_steps
    return training.finetuning_optimizer(
        config.learning_rate,
        config.total_steps,
        warmup_steps=config.warmup_steps,
        decay_type=config.decay_type,
        momentum=config.momentum,
        global_clipnorm=config.grad_clip,
        accumulator_dtype=config.accumulator_dtype,
        gradient_accumulation_steps=accum if accum > 1 else None,
    )


def fit_one(config, *, run_dir, setup, train_data, eval_data, num_classes, eval_label="the test split",
            header=(), callbacks=(), save_model=True):
    """One fine-tuning run on prepared data (also used by recipes/vtab.py).

    Args:
        config: a `FinetuneConfig` or `VtabConfig` (model, weights,
            image_size, optimizer, steps, batch sizes).
        run_dir: where this run writes (resumable).
        setup: a `keras_vit.distribute.DistributionSetup`.
        train_data: `(batch_size) -> tf.data.Dataset`, repeating.
        eval_data: `(batch_size) -> tf.data.Dataset`, one pass, or None.
        num_classes: int.
    """
    from keras_vit import training

    def build():
        model, notes = build_model(config, num_classes)
        skeleton.compile_model(model, make_optimizer(config), training.SoftmaxCrossEntropy(), config)
        return model, notes

    return skeleton.train_and_evaluate(
        config, run_dir=run_dir, setup=setup, build=build, train_data=train_data, eval_data=eval_data,
        eval_label=eval_label, header=header, callbacks=callbacks,
        save=skeleton.save_classifier if save_model else None,
    )


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
                batch_augmentation=augmentation_layers(config.batch_augmentation),
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
    result = fit_one(
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
    augmentation_layers(config.batch_augmentation)  # A bad name fails before any data is read.


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
