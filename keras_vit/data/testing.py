"""Generated stand-in data for smoke runs and tests.

`mock_tfds()` replaces every tfds dataset by a few generated examples with
the features keras_vit's sources and VTAB tasks read, so a whole pipeline
(and the recipes' `--smoke`) runs without any download.
`synthetic_images()` draws smooth random colour fields and
`SyntheticImages` serves batches of them to `fit` (masked patch
prediction's `--dataset=synthetic`; `write_sample_images()` saves a few as
PNG files), `smoke_images()` writes a folder of random-pixel PNGs
(`recipes.inspect_vit --smoke`).
"""

import contextlib
import logging
import os
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

# Builders whose images are grey-scale (one channel); dSprites pixels are 0/1.
_GREY = ("dsprites", "smallnorb")


def _example(name, num_classes, channels):
    def example(i):
        pixels = tf.random.stateless_uniform(
            [8, 8, channels], seed=tf.stack([i, tf.constant(7, tf.int64)]), maxval=256, dtype=tf.int32,
        )
        if name == "dsprites":
            pixels = pixels % 2
        out = {"image": tf.io.encode_png(tf.cast(pixels, tf.uint8)), "label": i % num_classes}
        if name == "clevr":
            count = 3 + i % 8
            depth = 7.0 + tf.cast(i % 7, tf.float32) * 0.6
            out["objects"] = {
                "size": tf.zeros([count], tf.int64),
                "pixel_coords": tf.fill(tf.stack([count, tf.constant(3, tf.int64)]), depth),
            }
        elif name == "kitti":
            out["objects"] = {
                "type": tf.constant([0, 3], tf.int64),
                "location": tf.reshape(
                    tf.stack([0.0, 0.0, 5.0 + 10.0 * tf.cast(i % 3, tf.float32), 0.0, 0.0, 1.0]), [2, 3]
                ),
            }
        elif name == "dsprites":
            out["label_x_position"] = i % 32
            out["label_orientation"] = i % 40
        elif name == "smallnorb":
            out["label_azimuth"] = i % 18
            out["label_elevation"] = i % 9
        return out

    return example


@contextlib.contextmanager
def mock_tfds(num_examples=16):
    """Replaces every tensorflow-datasets dataset by generated examples.

    Every split of every builder yields `num_examples` examples with the
    features keras_vit reads (`image` as PNG bytes, `label`, and for the VTAB
    tasks CLEVR/KITTI `objects` and the dSprites / sNORB attributes) in their
    valid ranges. Yields a manual-download directory (holding a placeholder
    file) for datasets such as ImageNet; it is deleted on exit.
    """
    import tensorflow_datasets as tfds

    def as_dataset(builder, split, decoders=None, read_config=None, shuffle_files=False, **kwargs):
        features = builder.info.features
        label = features["label"] if "label" in features else None
        num_classes = getattr(label, "num_classes", None) or 10
        channels = 1 if builder.name in _GREY else 3
        return tf.data.Dataset.range(num_examples).map(_example(builder.name, num_classes, channels))

    manual_dir = tempfile.mkdtemp(prefix="keras_vit_mock_manual_")
    with open(os.path.join(manual_dir, "placeholder"), "w") as f:
        f.write("tensorflow-datasets is mocked (keras_vit.data.testing.mock_tfds)\n")
    # tfds warns about the metadata its mock lacks ("Variant folder ... has
    # no dataset_info.json"): lines about the mock, not the user's run.
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        with tfds.testing.mock_data(num_examples=num_examples, as_dataset_fn=as_dataset):
            yield manual_dir
    finally:
        absl.setLevel(level)
        shutil.rmtree(manual_dir, ignore_errors=True)


def synthetic_images(count, height, width, seed=0, waves=3):
    """Smooth random colour fields in [-1, 1], the same in law at every position.

    Each channel is a sum of `waves` plane waves of random direction, phase
    and wavelength (half to twice the image's side), so a patch's colour
    follows from its neighbours' and only *relative* positions matter.

    Returns:
        float32 array of shape `(count, height, width, 3)`.
    """
    rng = np.random.default_rng(seed)
    shape = (count, 1, 1, waves, 3)
    angle = rng.uniform(0, 2 * np.pi, shape)
    cycles = rng.uniform(0.5, 2.0, shape)
    phase = rng.uniform(0, 2 * np.pi, shape)
    amplitude = rng.uniform(0.2, 1.0, shape)
    y = (np.arange(height) / height)[None, :, None, None, None]
    x = (np.arange(width) / width)[None, None, :, None, None]
    waves = amplitude * np.cos(2 * np.pi * cycles * (np.cos(angle) * x + np.sin(angle) * y) + phase)
    images = 0.95 * waves.sum(axis=3) / amplitude.sum(axis=3)
    return images.astype(np.float32)


class SyntheticImages(keras.utils.PyDataset):
    """`steps` batches of `synthetic_images(batch_size, height, width)` per
    epoch: fresh ones every epoch, or (`fresh=False`) the same ones. Each
    batch's seed follows from `seed`, the epoch and its index."""

    def __init__(self, batch_size, steps, height, width, seed=0, fresh=True):
        super().__init__()
        self.batch_size, self.steps, self.height, self.width = batch_size, steps, height, width
        self.seed, self.fresh = seed, fresh
        self.epoch = 0

    def __len__(self):
        return self.steps

    def __getitem__(self, index):
        epoch = self.epoch if self.fresh else 0
        step_seed = (self.seed * 1_000_003 + epoch * self.steps + index) % 2**32
        return synthetic_images(self.batch_size, self.height, self.width, seed=step_seed)

    def on_epoch_end(self):
        self.epoch += 1


def write_sample_images(directory, count, height, width, seed=0):
    """Writes `count` of `synthetic_images` (drawn apart from the training
    batches' seeds) as `directory/sample_<i>.png`; returns `directory`."""
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    for i, image in enumerate(synthetic_images(count, height, width, seed=seed + 2**31)):
        pixels = np.round((image + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(directory, f"sample_{i}.png"))
    return directory


def smoke_images(directory, size, count=4, seed=0):
    """Writes `count` random-pixel PNGs of `size` (height, width) as
    `directory/<i>.png`; returns `directory`."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        tf.io.write_file(os.path.join(directory, f"{i}.png"), tf.io.encode_png(pixels))
    return directory
