"""Throughput of the recipes' tf.data input pipelines, in images/s.

    python benchmarks/input_pipeline.py                      # generated JPEGs
    python benchmarks/input_pipeline.py --data /data/train   # a class-folder tree
    python benchmarks/input_pipeline.py --smoke              # seconds
    python benchmarks/input_pipeline.py --deterministic      # the recipes' --deterministic

The question it answers: can the input keep up with training? It runs each
training pipeline of `keras_vit.data` (pre-training with the AugReg presets,
fine-tuning with inception crop and with resize + crop) and the evaluation
pipelines on a folder of JPEG files, one sub-folder per class, and reports
the median images/s over repeated passes after a warm-up. Without `--data`
it writes ImageNet-like JPEGs (random sizes around 500x375, smooth random
content so that decoding costs what it does on photos) into a temporary
folder. Pass `--train-img-s` (a training throughput from
`benchmarks/bench.py`) to get the ratio input / training.

Caching is off: every image is read and decoded in every pass, as on a
dataset that does not fit in memory. `--deterministic` measures the same
pipelines under TensorFlow's op determinism, as the recipes' flag runs
them (docs/recipes.md): compare with a run without it.
"""

import argparse
import json
import os
import statistics
import tempfile
import time


def write_jpegs(directory, count, classes, seed=0):
    """`count` JPEGs of ImageNet-like sizes in `classes` sub-folders."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    for i in range(count):
        height, width = int(rng.integers(300, 450)), int(rng.integers(400, 600))
        # Low-frequency content (an upsampled 8x8 grid + mild noise): JPEG
        # sizes and decode times like photographs, not like white noise.
        coarse = rng.uniform(0, 255, (1, 8, 8, 3)).astype("float32")
        image = tf.image.resize(coarse, (height, width), method="bicubic")[0]
        image += rng.normal(0, 8, (height, width, 3)).astype("float32")
        image = tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8)
        folder = os.path.join(directory, f"class_{i % classes:02d}")
        os.makedirs(folder, exist_ok=True)
        tf.io.write_file(os.path.join(folder, f"{i:05d}.jpg"), tf.io.encode_jpeg(image, quality=90))


def pipelines(source, image_size, batch_size):
    """name -> a dataset factory, every pipeline the recipes use."""
    from keras_vit import data

    common = dict(batch_size=batch_size, cache=False, seed=0, shuffle_buffer=1000)
    return {
        "pretrain train (inception crop, flip)": lambda: data.pretrain_pipeline(
            source, training=True, image_size=image_size, **common),
        "pretrain train, AugReg medium1 (RandAugment 2/15, mixup 0.2)": lambda: data.pretrain_pipeline(
            source, training=True, image_size=image_size, randaugment=(2, 15), mixup_alpha=0.2, **common),
        "pretrain eval (resize_small, centre crop)": lambda: data.pretrain_pipeline(
            source, training=False, image_size=image_size, **common),
        "finetune train (inception crop, flip)": lambda: data.finetune_pipeline(
            source, training=True, image_size=image_size, **common),
        "finetune train (resize + random crop, flip)": lambda: data.finetune_pipeline(
            source, training=True, image_size=image_size, augmentation="resize_crop", **common),
        "finetune train + Keras layers (RandomFlip, MixUp)": lambda: data.finetune_pipeline(
            source, training=True, image_size=image_size, batch_augmentation=keras_layers(), **common),
        "finetune eval (resize)": lambda: data.finetune_pipeline(
            source, training=False, image_size=image_size, **common),
    }


def keras_layers():
    """What `--batch_augmentation=RandomFlip,MixUp` gives the recipes."""
    import keras

    return [keras.layers.RandomFlip(dtype="float32"), keras.layers.MixUp(dtype="float32")]


def measure(dataset_fn, images, batch_size, repeats):
    """Median images/s of `repeats` passes over `images` images."""
    steps = max(1, images // batch_size)
    dataset = dataset_fn()
    iterator = iter(dataset.repeat())
    for _ in range(min(steps, 3)):  # Warm-up: thread pools, file handles.
        next(iterator)
    rates = []
    for _ in range(repeats):
        start, count = time.perf_counter(), 0
        for _ in range(steps):
            count += len(next(iterator)[0])  # the images of the batch: an evaluation pass ends in a partial one
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a folder with one sub-folder of images per class")
    parser.add_argument("--images", type=int, default=512, help="generated images (without --data)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-img-s", type=float, help="training images/s to compare with")
    parser.add_argument("--json", help="write the rows to this JSON file")
    parser.add_argument("--smoke", action="store_true", help="a few small images, one pass")
    parser.add_argument("--deterministic", action="store_true", help="under TensorFlow's op determinism")
    args = parser.parse_args(argv)
    if args.smoke:
        args.images, args.image_size, args.batch_size, args.repeats = 16, 32, 4, 1

    import tensorflow as tf

    from keras_vit import data

    tf.config.set_visible_devices([], "GPU")
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()  # process-wide, as in a recipe
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.data
        if folder is None:
            folder = os.path.join(scratch, "images")
            write_jpegs(folder, args.images, classes=8)
        source = data.from_directory(folder)
        count = source.num_examples or args.images
        rows = []
        for name, dataset_fn in pipelines(source, args.image_size, args.batch_size).items():
            rate = measure(dataset_fn, count, args.batch_size, args.repeats)
            row = {"pipeline": name, "img_s": round(rate, 1), "deterministic": args.deterministic,
                   "image_size": args.image_size,
                   "batch_size": args.batch_size, "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
            if args.train_img_s:
                row["ratio_to_training"] = round(rate / args.train_img_s, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{count} images, {args.image_size} px, batch {args.batch_size}, {os.cpu_count()} cores\n")
    print("| pipeline | images/s |" + (" x training |" if args.train_img_s else ""))
    print("|---|---|" + ("---|" if args.train_img_s else ""))
    for row in rows:
        ratio = f" {row['ratio_to_training']}x |" if args.train_img_s else ""
        print(f"| {row['pipeline']} | {row['img_s']} |{ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
