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
    # A few seconds, no download:
    python -m recipes.pretrain --smoke

The run directory (`--run_dir`, default runs/pretrain/<config>) holds
`checkpoints/` (the same command resumes), `logs/` (TensorBoard),
`history.csv`, `model.keras`, `model.npz` (original format: fine-tune it with
`python -m recipes.finetune --weights=<run_dir>/model.npz`) and
`summary.json`. See docs/recipes.md.
"""

import math
import os
import sys
import time

if __package__ in (None, ""):  # `python recipes/pretrain.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from recipes import common
from recipes import configs

DESCRIPTION = __doc__.split("\n\n")[0] + (
    " Every config field below is a flag; --config picks a named config "
    "(paper Table 3, AugReg), --smoke shrinks everything to seconds."
)
LOSSES = ("softmax", "sigmoid")
AUGMENTATIONS = ("inception_crop", "resize", "resize_crop")


def parse(argv=None):
    """`(config_name, config, smoke)` from command-line arguments."""
    return common.parse_flags(
        argv,
        fields=configs.PRETRAIN_FIELDS,
        named_configs=configs.PRETRAIN_CONFIGS,
        default_config="imagenet2012",
        smoke=configs.PRETRAIN_SMOKE,
        description=DESCRIPTION,
        prog="python -m recipes.pretrain",
    )


def head_bias(config, num_classes):
    """The head bias: 0 for softmax; for sigmoid big_vision's -10
    (ImageNet-21k) / -6.9 (ImageNet-1k), about -log(num_classes) elsewhere."""
    from keras_vit import training

    if config["head_bias_init"] is not None:
        return float(config["head_bias_init"])
    if config["loss"] != "sigmoid":
        return 0.0
    known = {21843: training.SIGMOID_HEAD_BIAS_INIT["imagenet21k"],
             1000: training.SIGMOID_HEAD_BIAS_INIT["imagenet2012"]}
    return known.get(num_classes, -math.log(num_classes))


def build_model(config, num_classes):
    """A freshly initialised model for pre-training; returns `(model, notes)`."""
    import keras_vit

    variant, kwargs = common.model_fields(config)
    if "representation_size" not in kwargs:
        kwargs["representation_size"] = (
            common.hidden_size(variant, kwargs) if config["pre_logits"] else None
        )
    kwargs.setdefault("drop_path_rate", config["drop_path_rate"])
    kwargs.setdefault("head_bias_init", head_bias(config, num_classes))
    size = config["image_size"]
    model = keras_vit.ViT(variant, num_classes=num_classes, input_shape=(size, size, 3), **kwargs)
    notes = [
        f"representation_size={kwargs['representation_size']}, "
        f"head_bias_init={kwargs['head_bias_init']:g}"
    ]
    return model, notes


def _check(config):
    if config["loss"] not in LOSSES:
        raise ValueError(f"`loss` must be one of {LOSSES}. Received: loss={config['loss']!r}")
    if config["augmentation"] not in AUGMENTATIONS:
        raise ValueError(
            f"`augmentation` must be one of {AUGMENTATIONS}. "
            f"Received: augmentation={config['augmentation']!r}"
        )
    if config["augmentation"] != "inception_crop" and config["augreg"] not in (None, "none"):
        raise ValueError(
            "AugReg presets (RandAugment, mixup) come with the inception_crop pipeline. "
            f"Received: augreg={config['augreg']!r}, augmentation={config['augmentation']!r}"
        )


def run(config, config_name=None, smoke=False, callbacks=()):
    """Runs a parsed config; returns the summary (also `summary.json`)."""
    from keras_vit import data
    from keras_vit import training

    _check(config)
    run_dir = common.prepare_run_dir(config, "pretrain", config_name)
    summary_path = os.path.join(run_dir, "summary.json")
    done = common.read_json(summary_path)
    if done is not None:
        print(f"Finished earlier: {summary_path}")
        return done
    start = time.perf_counter()
    setup = common.set_up(config)
    with common.maybe_smoke_data(config, smoke):
        train_source = common.load_source(config, config["train_split"])
        eval_source = common.load_source(config, config["test_split"]) if config["test_split"] else None
        num_classes = train_source.num_classes
        effective = dict(config)
        if not config["total_steps"]:
            if not train_source.num_examples:
                raise ValueError(
                    f"The size of {config['train_split']!r} is unknown, so `epochs` cannot give "
                    "the number of steps: pass --total_steps. Received: total_steps=0"
                )
            effective["total_steps"] = common.steps_from_epochs(
                config["epochs"], train_source.num_examples, config["batch_size"]
            )
        cache = common.cache_setting(config)
        size = config["image_size"]
        inception = config["augmentation"] == "inception_crop"
        augreg = None if config["augreg"] in (None, "none") else config["augreg"]

        def train_data(batch_size):
            if inception:
                return data.pretrain_pipeline(
                    train_source, training=True, batch_size=batch_size, image_size=size,
                    augreg=augreg, shuffle_buffer=config["shuffle_buffer"], cache=cache,
                    seed=config["seed"],
                )
            return data.finetune_pipeline(
                train_source, training=True, batch_size=batch_size, image_size=size,
                augmentation=config["augmentation"], flip=config["flip"],
                shuffle_buffer=config["shuffle_buffer"], cache=cache, seed=config["seed"],
            )

        def eval_data(batch_size):
            if inception:
                return data.pretrain_pipeline(
                    eval_source, training=False, batch_size=batch_size, image_size=size, cache=cache
                )
            return data.finetune_pipeline(
                eval_source, training=False, batch_size=batch_size, image_size=size, cache=cache
            )

        def build():
            model, notes = build_model(effective, num_classes)
            accum = effective["accum_steps"]
            optimizer = training.pretraining_optimizer(
                model,
                effective["learning_rate"],
                effective["total_steps"],
                warmup_steps=effective["warmup_steps"],
                decay_type=effective["decay_type"],
                weight_decay=effective["weight_decay"],
                global_clipnorm=effective["grad_clip"],
                linear_end=effective["linear_end"],
                first_moment_dtype=effective["first_moment_dtype"],
                gradient_accumulation_steps=accum if accum > 1 else None,
            )
            loss_class = (
                training.SigmoidCrossEntropy if effective["loss"] == "sigmoid"
                else training.SoftmaxCrossEntropy
            )
            common.compile_model(
                model, optimizer, loss_class(label_smoothing=effective["label_smoothing"]), effective
            )
            return model, notes

        result = common.train_and_evaluate(
            effective,
            run_dir=run_dir,
            setup=setup,
            build=build,
            train_data=train_data,
            eval_data=eval_data if eval_source is not None else None,
            callbacks=callbacks,
        )
    summary = {
        "recipe": "pretrain",
        "config_name": config_name,
        "config": common.jsonable(config),
        "total_steps": effective["total_steps"],
        "num_classes": num_classes,
        "train_examples": train_source.num_examples,
        **result,
        **common.environment(setup),
        "total_wall_time_s": time.perf_counter() - start,
    }
    common.write_json(summary_path, summary)
    common.print_summary(
        f"Pre-training finished: {run_dir}",
        summary,
        ("accuracy", "eval_examples", "steps", "final_loss", "images_per_second",
         "total_wall_time_s", "model_keras", "model_npz"),
    )
    return summary


def main(argv=None, callbacks=()):
    config_name, config, smoke = parse(argv)
    return run(config, config_name, smoke=smoke, callbacks=callbacks)


if __name__ == "__main__":
    with common.exit_on_missing_data():
        main()
