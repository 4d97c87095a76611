"""Self-supervised masked patch prediction (paper Sec. 4.6, App. B.1.2).

Pre-trains a plain ViT by predicting the 3-bit mean colour of corrupted
patches, then writes the encoder as an original-format `.npz` that the normal
models load for fine-tuning.

    # The paper's set-up (ViT-B/16; Adam, base lr 2e-4, 10k warmup, cosine decay;
    # the paper ran 1M steps at batch 4096 on JFT and also tried ImageNet):
    python -m recipes.pretrain_mpp --model ViT-B_16 --tfds imagenet2012 \\
        --batch-size 4096 --steps 1000000 --out runs/mpp_b16

    # A minute on a CPU: a tiny model on synthetic images, then the checkpoint
    # is loaded into a classifier and checked:
    python -m recipes.pretrain_mpp --smoke --out runs/mpp_smoke

    # The demo of docs/inspect.md (minutes on a CPU): a small custom ViT on
    # synthetic colour fields, whose position embeddings learn the 2-D grid:
    python -m recipes.pretrain_mpp --model custom --set hidden_size=64 --set num_heads=4 \
        --set mlp_dim=128 --set num_layers=4 --set patch_size=8 --input-size 64 \
        --synthetic --batch-size 32 --steps 1000 --steps-per-epoch 100 \
        --learning-rate 1e-3 --warmup-steps 100 --weight-decay 0 --out runs/mpp_demo

Fine-tune the result like any checkpoint:
`keras_vit.ViT("ViT-B_16", weights="runs/mpp_b16/encoder.npz", num_classes=...)`.
See docs/inspect.md.
"""

import argparse
import ast
import json
import os

SMOKE_MODEL = dict(hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, patch_size=8)
SMOKE_INPUT_SHAPE = (16, 24, 3)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Masked patch prediction pre-training (ViT paper Sec. 4.6).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--model", default="ViT-B_16",
        help="a plain ViT config name (not a hybrid), or `custom` for the defaults of "
        "keras_vit.ViT(None) changed with --set",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE",
        help="override a model field, e.g. --set num_layers=4 --set patch_size=8 (repeatable)",
    )
    parser.add_argument("--input-size", type=int, default=224)
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--tfds", default=None, help="a tensorflow-datasets name, e.g. imagenet2012")
    data.add_argument(
        "--images", default=None,
        help="a folder with one sub-folder of images per class (labels are ignored)",
    )
    data.add_argument(
        "--synthetic", action="store_true",
        help="endless smooth random colour fields (a demo: a patch's colour follows from its "
        "neighbours'); also writes 8 of them to <out>/samples for recipes/inspect_vit.py",
    )
    parser.add_argument("--split", default="train", help="tfds split")
    parser.add_argument("--data-dir", default=None, help="tfds data directory")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--steps-per-epoch", type=int, default=1000, help="steps between logs/checkpoints")
    parser.add_argument("--learning-rate", type=float, default=2e-4, help="base learning rate (paper: 2e-4)")
    parser.add_argument("--warmup-steps", type=int, default=10_000)
    parser.add_argument(
        "--weight-decay", type=float, default=0.1,
        help="decoupled, on kernels; the paper does not give MPP's, 0.1 is its JFT pre-training value",
    )
    parser.add_argument("--target", default="mean_color", choices=("mean_color", "downsampled", "pixels"))
    parser.add_argument("--bits", type=int, default=3)
    parser.add_argument("--quantization", default="uint8", choices=("uint8", "uniform"))
    parser.add_argument("--corruption-rate", type=float, default=0.5)
    parser.add_argument("--head-hidden-size", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument(
        "--smoke", action="store_true",
        help="a tiny model on synthetic images for a few steps (overrides model, data and steps)",
    )
    args = parser.parse_args(argv)
    if not args.smoke and args.tfds is None and args.images is None and not args.synthetic:
        parser.error("give --tfds, --images or --synthetic (or --smoke)")
    overrides = {}
    for item in args.set:
        field, _, value = item.partition("=")
        try:
            overrides[field.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            parser.error(f"--set takes FIELD=VALUE with a Python literal value. Received: {item!r}")
    args.overrides = overrides
    return args


def synthetic_images(count, height, width, seed=0, waves=3):
    """Smooth random colour fields in [-1, 1], the same in law at every position.

    Each channel is a sum of `waves` plane waves of random direction, phase
    and wavelength (half to twice the image's side), so a patch's colour
    follows from its neighbours' and only *relative* positions matter.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = (count, 1, 1, waves, 3)
    angle = rng.uniform(0, 2 * np.pi, shape)
    cycles = rng.uniform(0.5, 2.0, shape)
    phase = rng.uniform(0, 2 * np.pi, shape)
    amplitude = rng.uniform(0.2, 1.0, shape)
    y = (np.arange(height) / height)[None, :, None, None, None]
    x = (np.arange(width) / width)[None, None, :, None, None]
    waves = amplitude * np.cos(
        2 * np.pi * cycles * (np.cos(angle) * x + np.sin(angle) * y) + phase
    )
    images = 0.95 * waves.sum(axis=3) / amplitude.sum(axis=3)
    return images.astype(np.float32)


def synthetic_dataset(batch_size, steps, height, width, seed=0):
    """A `keras.utils.PyDataset` of fresh `synthetic_images` at every step."""
    import keras

    class SyntheticImages(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.epoch = 0

        def __len__(self):
            return steps

        def __getitem__(self, index):
            step_seed = (seed * 1_000_003 + self.epoch * steps + index) % 2**32
            return synthetic_images(batch_size, height, width, seed=step_seed)

        def on_epoch_end(self):
            self.epoch += 1

    return SyntheticImages()


def write_samples(directory, count, height, width, seed):
    """Writes `count` synthetic images as PNG files (for inspection)."""
    import numpy as np
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    images = synthetic_images(count, height, width, seed=seed + 2**31)
    for i, image in enumerate(images):
        pixels = np.round((image + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(directory, f"sample_{i}.png"))
    return directory


def image_dataset(args):
    """A tf.data pipeline of images only, as the paper's pre-training input."""
    from keras_vit import data

    if args.tfds is not None:
        source = data.from_tfds(args.tfds, args.split, data_dir=args.data_dir)
    else:
        source = data.from_directory(args.images)
    pipeline = data.pretrain_pipeline(
        source, training=True, batch_size=args.batch_size, image_size=args.input_size,
        seed=args.seed,
    )
    return pipeline.map(lambda images, labels: images)


def main(argv=None):
    args = parse_args(argv)
    import keras
    import numpy as np

    import keras_vit
    from keras_vit import pretraining, training

    keras.utils.set_random_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    if args.smoke:
        args.batch_size, args.steps = 16, 24
        args.steps_per_epoch, args.learning_rate, args.warmup_steps = 6, 3e-3, 2
        backbone = keras_vit.ViT(
            None, include_top=False, input_shape=SMOKE_INPUT_SHAPE, **SMOKE_MODEL
        )
    else:
        size = args.input_size
        variant = None if args.model == "custom" else args.model
        backbone = keras_vit.ViT(
            variant, include_top=False, input_shape=(size, size, 3), **args.overrides
        )
    model = pretraining.MaskedPatchPrediction(
        backbone,
        target=args.target,
        bits=args.bits,
        quantization=args.quantization,
        corruption_rate=args.corruption_rate,
        head_hidden_size=args.head_hidden_size,
        seed=args.seed,
    )
    model.compile(
        optimizer=training.pretraining_optimizer(
            model,
            args.learning_rate,
            args.steps,
            warmup_steps=args.warmup_steps,
            decay_type="cosine",
            weight_decay=args.weight_decay,
        )
    )
    epochs = max(1, args.steps // args.steps_per_epoch)
    if args.smoke:
        images = synthetic_images(
            args.batch_size * args.steps_per_epoch, *SMOKE_INPUT_SHAPE[:2], seed=args.seed
        )
        history = model.fit(images, batch_size=args.batch_size, epochs=epochs, shuffle=True, verbose=2)
    else:
        if args.synthetic:
            data = synthetic_dataset(
                args.batch_size, args.steps_per_epoch, args.input_size, args.input_size, args.seed
            )
            write_samples(os.path.join(args.out, "samples"), 8, args.input_size, args.input_size,
                          args.seed)
        else:
            data = image_dataset(args)
        history = model.fit(
            data, steps_per_epoch=args.steps_per_epoch, epochs=epochs, verbose=2,
            callbacks=[keras.callbacks.ModelCheckpoint(
                os.path.join(args.out, "mpp.weights.h5"), save_weights_only=True)],
        )
    model.save_weights(os.path.join(args.out, "mpp.weights.h5"))
    encoder = model.export_encoder(os.path.join(args.out, "encoder.npz"))
    # The encoder as a Keras model too, e.g. for recipes/inspect_vit.py.
    backbone.save(os.path.join(args.out, "backbone.keras"))
    with open(os.path.join(args.out, "history.json"), "w") as f:
        json.dump({k: [float(v) for v in vals] for k, vals in history.history.items()}, f, indent=2)
    print(f"Encoder written to {encoder}; fine-tune it with keras_vit.ViT(..., weights={encoder!r}).")

    if args.smoke:
        # The checkpoint must load into a normal classifier, weights intact.
        classifier = keras_vit.ViT(
            None, input_shape=SMOKE_INPUT_SHAPE, num_classes=3, weights=encoder, **SMOKE_MODEL
        )
        for name in ("embedding", "posembed_input", "encoderblock_0", "encoder_norm"):
            for mine, theirs in zip(classifier.get_layer(name).weights, backbone.get_layer(name).weights):
                np.testing.assert_array_equal(
                    keras.ops.convert_to_numpy(mine), keras.ops.convert_to_numpy(theirs)
                )
        losses = history.history["loss"]
        print(f"smoke: loss {losses[0]:.4f} -> {losses[-1]:.4f}; encoder loads into a classifier: OK")
    return {"model": model, "history": history.history, "encoder": encoder}


if __name__ == "__main__":
    main()
