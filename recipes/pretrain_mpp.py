"""Self-supervised masked patch prediction (paper Sec. 4.6, App. B.1.2).

Pre-trains a plain ViT by predicting the 3-bit mean colour of corrupted
patches, then writes the encoder as an original-format `.npz` that the normal
models load for fine-tuning.

    # The paper's set-up (ViT-B/16; Adam, base lr 2e-4, 10k warmup, cosine decay;
    # the paper ran 1M steps at batch 4096 on JFT and also tried ImageNet):
    python -m recipes.pretrain_mpp --config=paper --dataset=imagenet2012 --run_dir=runs/mpp_b16
    # Any folder of images (<folder>/<class>/<image>; labels are ignored):
    python -m recipes.pretrain_mpp --dataset=path/to/images --train_split=. --run_dir=runs/mpp_folder
    # The demo of docs/inspect.md (minutes on a CPU): a small custom ViT on
    # synthetic colour fields, whose position embeddings learn the 2-D grid:
    python -m recipes.pretrain_mpp --config=colour_fields --run_dir=runs/mpp_demo
    # Seconds: a tiny model on synthetic images, then the encoder is loaded
    # into a classifier and checked:
    python -m recipes.pretrain_mpp --smoke --run_dir=runs/mpp_smoke

The run directory holds `checkpoints/` (the same command resumes),
`logs/`, `history.csv`, `mpp.weights.h5` (the whole MPP model),
`encoder.npz` (fine-tune it like any checkpoint:
`keras_vit.ViT("ViT-B_16", weights="runs/mpp_b16/encoder.npz", num_classes=...)`
or `python -m recipes.finetune --weights=runs/mpp_b16/encoder.npz`),
`backbone.keras` (for recipes.inspect_vit) and `summary.json`. See
docs/inspect.md.
"""

import os

from recipes import cli
from recipes import run as skeleton
from recipes.configs import pretrain_mpp as configs
from recipes.configs.pretrain_mpp import SMOKE_INPUT_SHAPE  # noqa: F401 - tests build the same model
from recipes.configs.pretrain_mpp import SMOKE_MODEL  # noqa: F401

PROG = "python -m recipes.pretrain_mpp"
DESCRIPTION = __doc__.split("\n\n")[0]
SUMMARY_KEYS = ("steps", "final_loss", "images_per_second", "total_wall_time_s", "encoder_npz", "backbone_keras")


def write_samples(directory, count, height, width, seed):
    """Writes `count` synthetic images as PNG files (for inspection)."""
    import numpy as np
    from PIL import Image

    from keras_vit.data.testing import synthetic_images

    os.makedirs(directory, exist_ok=True)
    images = synthetic_images(count, height, width, seed=seed + 2**31)
    for i, image in enumerate(images):
        pixels = np.round((image + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(directory, f"sample_{i}.png"))
    return directory


def input_size(config):
    size = tuple(config.image_size)
    if len(size) not in (1, 2) or min(size) <= 0:
        raise cli.RecipeError(f"--image_size takes one or two positive ints. Received: --image_size={size}")
    return (size[0], size[-1])


def check(config):
    skeleton.check_fields(config)
    cli.check_choice(config, "target", configs.TARGETS)
    cli.check_choice(config, "quantization", configs.QUANTIZATIONS)
    if not config.dataset:
        raise cli.RecipeError("give --dataset: a tfds name, a folder of images, or synthetic (or --smoke).")
    input_size(config)
    skeleton.check_schedule(config)


def run(config, config_name=None, smoke=False, callbacks=()):
    """Runs a parsed config; returns the summary (also `summary.json`) with
    the trained `model` (None for a run finished earlier)."""
    check(config)
    trained = {}

    def body(run_dir, setup, header):
        from keras_vit import data
        from keras_vit import pretraining
        from keras_vit import training
        from keras_vit.data import testing

        height, width = input_size(config)
        synthetic = config.dataset == "synthetic"
        if synthetic:
            # Fresh images at every step, except in smoke mode: the same 6
            # batches, so that 24 updates show the loss falling.
            def train_data(batch_size):
                return testing.SyntheticImages(batch_size, config.log_every * config.accum_steps, height, width,
                                               config.seed, fresh=not smoke)

            header = [*header, f"  data: synthetic colour fields, {height}x{width} px"]
            write_samples(os.path.join(run_dir, "samples"), 8, height, width, config.seed)
        else:
            if height != width:
                raise cli.RecipeError(f"--image_size must be square for --dataset={config.dataset}. "
                                      f"Received: --image_size={height},{width}")
            source = skeleton.load_source(config, config.train_split)

            def train_data(batch_size):
                # Images only, through the paper's pre-training crops.
                return data.pretrain_pipeline(
                    source, training=True, batch_size=batch_size, image_size=height,
                    shuffle_buffer=config.shuffle_buffer, cache=skeleton.cache_setting(config), seed=config.seed,
                ).map(lambda images, labels: images)

            header = [*header, skeleton.data_line(config.train_split, source)]

        def build():
            backbone = skeleton.build_vit(config, include_top=False, input_shape=(height, width, 3))
            try:
                model = pretraining.MaskedPatchPrediction(
                    backbone, target=config.target, bits=config.bits, quantization=config.quantization,
                    corruption_rate=config.corruption_rate,
                    head_hidden_size=config.head_hidden_size, seed=config.seed,
                )
            except ValueError as error:
                raise cli.RecipeError(f"masked patch prediction: {error}") from None
            accum = config.accum_steps
            optimizer = training.pretraining_optimizer(
                model, config.learning_rate, config.total_steps, warmup_steps=config.warmup_steps,
                decay_type=config.decay_type, weight_decay=config.weight_decay,
                global_clipnorm=config.grad_clip, gradient_accumulation_steps=accum if accum > 1 else None,
            )
            model.compile(optimizer=optimizer, **skeleton.compile_options(config))
            return model, []

        def save(model, run_dir):
            trained["model"] = model
            model.save_weights(os.path.join(run_dir, "mpp.weights.h5"))
            encoder = model.export_encoder(os.path.join(run_dir, "encoder.npz"))
            # The encoder as a Keras model too, e.g. for recipes/inspect_vit.py.
            backbone = os.path.join(run_dir, "backbone.keras")
            model.backbone.save(backbone)
            return {"encoder_npz": encoder, "backbone_keras": backbone}

        result = skeleton.train_and_evaluate(
            config, run_dir=run_dir, setup=setup, build=build, train_data=train_data, header=header,
            callbacks=callbacks, save=save,
        )
        if smoke and "model" in trained:
            check_encoder_loads(config, trained["model"], result["encoder_npz"], (height, width, 3))
        return result

    summary = skeleton.run_recipe(
        "pretrain_mpp", config, config_name, smoke=False, body=body, title="Masked patch prediction",
        summary_keys=SUMMARY_KEYS,
    )
    print(f"Fine-tune the encoder with keras_vit.ViT(..., weights={summary['encoder_npz']!r}).")
    return dict(summary, model=trained.get("model"), encoder=summary["encoder_npz"])


def check_encoder_loads(config, model, encoder, input_shape):
    """Smoke check: the encoder loads into a normal classifier, weights intact."""
    import keras
    import numpy as np

    backbone = model.backbone
    classifier = skeleton.build_vit(config, input_shape=input_shape, num_classes=3, weights=encoder)
    for name in ("embedding", "posembed_input", "encoderblock_0", "encoder_norm"):
        for mine, theirs in zip(classifier.get_layer(name).weights, backbone.get_layer(name).weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine), keras.ops.convert_to_numpy(theirs))
    print("smoke: the encoder loads into a classifier: OK")


parse, main = cli.entry_points(configs, run, prog=PROG, description=DESCRIPTION)


if __name__ == "__main__":
    cli.run_command(main)
