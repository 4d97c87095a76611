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
"""

import math

from recipes import cli
from recipes import run as skeleton
from recipes.configs import pretrain as configs

PROG = "python -m recipes.pretrain"
DESCRIPTION = __doc__.split("\n\n")[0]
SUMMARY_KEYS = ("accuracy", "eval_loss", "eval_examples", "steps", "final_loss", "images_per_second",
                "total_wall_time_s", "model_keras", "model_npz")


def head_bias(config, num_classes):
    """The head bias: 0 for softmax; for sigmoid big_vision's -10
    (ImageNet-21k) / -6.9 (ImageNet-1k), about -log(num_classes) elsewhere."""
    from keras_vit import training

    if config.head_bias_init is not None:
        return float(config.head_bias_init)
    if config.loss != "sigmoid":
        return 0.0
    known = {21843: training.SIGMOID_HEAD_BIAS_INIT["imagenet21k"],
             1000: training.SIGMOID_HEAD_BIAS_INIT["imagenet2012"]}
    return known.get(num_classes, -math.log(num_classes))


def build_model(config, num_classes):
    """A freshly initialised model for pre-training; returns `(model, notes)`."""
    kwargs = dict(drop_path_rate=config.drop_path_rate, head_bias_init=head_bias(config, num_classes))
    kwargs.update(config.model_overrides)
    size = config.image_size
    if "representation_size" not in kwargs:
        # The tanh pre-logits layer has the model's width (paper Sec. 3.1).
        kwargs["representation_size"] = skeleton.hidden_size(config) if config.pre_logits else None
    model = skeleton.build_vit(
        config.replace(model_overrides=kwargs), num_classes=num_classes, input_shape=(size, size, 3)
    )
    notes = [f"representation_size={kwargs['representation_size']}, head_bias_init={kwargs['head_bias_init']:g}"]
    return model, notes


def check(config):
    skeleton.check_fields(config)
    cli.check_choice(config, "loss", configs.LOSSES)
    cli.check_choice(config, "augreg", configs.AUGREG)
    if config.augmentation != "inception_crop" and config.augreg != "none":
        raise cli.RecipeError(
            "AugReg presets (RandAugment, mixup) come with the inception_crop pipeline. "
            f"Received: --augreg={config.augreg}, --augmentation={config.augmentation}"
        )
    if config.total_steps < 0:
        raise cli.RecipeError(f"--total_steps must be a positive int, or 0 for --epochs. Received: --total_steps={config.total_steps}")
    if config.total_steps:
        skeleton.check_schedule(config)


def run(config, config_name=None, smoke=False, callbacks=()):
    """Runs a parsed config; returns the summary (also `summary.json`)."""
    check(config)

    def body(run_dir, setup, header):
        from keras_vit import data
        from keras_vit import training

        train_source = skeleton.load_source(config, config.train_split)
        eval_source = (
            skeleton.load_source(config, config.test_split, class_names=train_source.class_names)
            if config.test_split else None
        )
        num_classes = train_source.num_classes
        effective = config
        if not config.total_steps:
            if not train_source.num_examples:
                raise cli.RecipeError(
                    f"the size of {config.train_split!r} is unknown, so --epochs cannot give "
                    "the number of steps: pass --total_steps. Received: --total_steps=0"
                )
            effective = config.replace(total_steps=skeleton.steps_from_epochs(
                config.epochs, train_source.num_examples, config.batch_size
            ))
            skeleton.check_schedule(effective)
        cache = skeleton.cache_setting(config)
        size = config.image_size
        randaugment, mixup_alpha = configs.AUGREG[config.augreg]

        def train_data(batch_size):
            if config.augmentation == "inception_crop":
                return data.pretrain_pipeline(
                    train_source, training=True, batch_size=batch_size, image_size=size,
                    randaugment=randaugment, mixup_alpha=mixup_alpha,
                    shuffle_buffer=config.shuffle_buffer, cache=cache, seed=config.seed,
                )
            return data.finetune_pipeline(
                train_source, training=True, batch_size=batch_size, image_size=size,
                augmentation=config.augmentation, flip=config.flip,
                shuffle_buffer=config.shuffle_buffer, cache=cache, seed=config.seed,
            )

        def eval_data(batch_size):
            pipeline = data.pretrain_pipeline if config.augmentation == "inception_crop" else data.finetune_pipeline
            return pipeline(eval_source, training=False, batch_size=batch_size, image_size=size, cache=cache,
                            pad_to_batch=True)

        def build():
            model, notes = build_model(effective, num_classes)
            accum = effective.accum_steps
            optimizer = training.pretraining_optimizer(
                model,
                effective.learning_rate,
                effective.total_steps,
                warmup_steps=effective.warmup_steps,
                decay_type=effective.decay_type,
                weight_decay=effective.weight_decay,
                global_clipnorm=effective.grad_clip,
                linear_end=effective.linear_end,
                first_moment_dtype=effective.first_moment_dtype,
                gradient_accumulation_steps=accum if accum > 1 else None,
            )
            loss_class = training.SigmoidCrossEntropy if effective.loss == "sigmoid" else training.SoftmaxCrossEntropy
            skeleton.compile_model(model, optimizer, loss_class(label_smoothing=effective.label_smoothing), effective)
            return model, notes

        header = [*header, skeleton.data_line(config.train_split, train_source, config.test_split, eval_source)]
        result = skeleton.train_and_evaluate(
            effective, run_dir=run_dir, setup=setup, build=build, train_data=train_data,
            eval_data=eval_data if eval_source is not None else None, eval_label=repr(config.test_split),
            header=header, callbacks=callbacks, save=skeleton.save_classifier,
        )
        return {"total_steps": effective.total_steps, "num_classes": num_classes,
                "train_examples": train_source.num_examples, **result}

    return skeleton.run_recipe(
        "pretrain", config, config_name, smoke=smoke, body=body, title="Pre-training",
        summary_keys=SUMMARY_KEYS,
    )


parse, main = cli.entry_points(configs, run, prog=PROG, description=DESCRIPTION)


if __name__ == "__main__":
    cli.run_command(main)
