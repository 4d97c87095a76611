"""Input pipelines: ops, RandAugment, mixup (augment), sources and batches for fit."""

import dataclasses
import importlib.util
import os
import random
import re
import shutil
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import keras_vit
from keras_vit.data import augment
from keras_vit.data import ops
from keras_vit.data import padding
from keras_vit.data import pipelines
from keras_vit.data import sources
from tests.helpers import ROOT

# Base colour per class; images are the colour plus noise in [-25, 25], so a
# crop's mean colour tells the class whatever the crop and flip.
BACKEND = keras.backend.backend()
CLASS_COLORS = {"ant": (200, 30, 30), "bee": (30, 200, 30), "cat": (30, 30, 200)}
SIZES = [(40, 56), (48, 36), (33, 33)]


def _image(color, size, seed):
    rng = np.random.default_rng(seed)
    noise = rng.integers(-25, 26, size + (3,))
    return np.clip(np.array(color) + noise, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Class folders created out of order; one JPEG, one upper-case name, a
    non-image file and a hidden folder that must be skipped."""
    root = tmp_path_factory.mktemp("images")
    expected = []  # (path, label, pixels) in sorted order.
    for label, name in enumerate(sorted(CLASS_COLORS)):
        (root / name).mkdir()
        for i, size in enumerate(SIZES):
            pixels = _image(CLASS_COLORS[name], size, seed=10 * label + i)
            fname = f"img{i}.png" if i != 1 else f"IMG{i}.PNG"
            tf.io.write_file(str(root / name / fname), tf.io.encode_png(pixels))
            expected.append((str(root / name / fname), label, pixels))
    jpeg = _image(CLASS_COLORS["cat"], (30, 40), seed=99)
    tf.io.write_file(str(root / "cat" / "z.jpg"), tf.io.encode_jpeg(jpeg, quality=95))
    expected.append((str(root / "cat" / "z.jpg"), 2, None))
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    expected.sort(key=lambda e: (e[1], os.path.basename(e[0])))
    return root, expected


def _batches(dataset, n):
    images, labels = [], []
    for x, y in dataset.take(n):
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


# ---------------------------------------------------------------------------
# Ops.
# ---------------------------------------------------------------------------


@pytest.mark.one_backend
def test_normalization_is_the_originals_bit_for_bit():
    # vit_jax: (x - 127.5) / 127.5 in float32. `x / 127.5 - 1` differs by one
    # ulp on 128 of the 256 values, so exact equality is the test.
    x = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    want = (x.astype(np.float32) - np.float32(127.5)) / np.float32(127.5)
    assert want.dtype == np.float32
    assert (want != x.astype(np.float32) / np.float32(127.5) - 1).sum() > 0  # The test can fail.
    # preprocess_input on the active backend, eager and compiled.
    eager = keras.ops.convert_to_numpy(keras_vit.preprocess_input(x))
    np.testing.assert_array_equal(eager, want)
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        compiled = jax.jit(keras_vit.preprocess_input)(x)
    elif backend == "tensorflow":
        compiled = tf.function(keras_vit.preprocess_input, jit_compile=True)(tf.constant(x))
    else:
        compiled = keras_vit.preprocess_input(keras.ops.convert_to_tensor(x))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(compiled), want)
    # The tf.data path: ops.normalize inside Dataset.map (a traced graph).
    mapped = tf.data.Dataset.from_tensors(x[0]).map(ops.normalize)
    np.testing.assert_array_equal(next(iter(mapped)).numpy(), want[0])
    np.testing.assert_array_equal(ops.normalize(tf.constant(x)).numpy(), want)


@pytest.mark.one_backend
def test_inception_crop_area_and_aspect():
    image = tf.zeros((120, 100, 3), tf.uint8)
    crop_shapes = tf.data.Dataset.from_tensors(image).repeat(300).map(
        lambda x: tf.shape(ops.inception_crop(x))[:2]
    )
    shapes = np.array([s.numpy() for s in crop_shapes])
    area = shapes[:, 0] * shapes[:, 1] / (120 * 100)
    aspect = shapes[:, 1] / shapes[:, 0]
    # Integer box sides: allow one pixel of rounding on each side.
    assert area.min() >= 0.05 * (1 - 2 / 11) and area.max() <= 1.0
    assert aspect.min() >= 0.75 * (1 - 1 / 10) and aspect.max() <= 1.33 * (1 + 1 / 10)
    assert area.min() < 0.2 and area.max() > 0.8  # The whole range is used.
    resized = ops.inception_crop(image, 24)
    assert resized.shape == (24, 24, 3) and resized.dtype == tf.float32


@pytest.mark.one_backend
def test_resize_small_central_and_random_crop():
    image = np.arange(60 * 40 * 3, dtype=np.float32).reshape(60, 40, 3) % 251
    small = ops.resize_small(tf.constant(image), 20)
    assert small.shape == (30, 20, 3)
    np.testing.assert_array_equal(ops.central_crop(tf.constant(image), (20, 10)), image[20:40, 15:25])
    np.testing.assert_array_equal(ops.central_crop(tf.constant(image), 7), image[26:33, 16:23])
    crop = ops.random_crop(tf.constant(image), 9).numpy()
    top, left = np.argwhere(image[..., 0] == crop[0, 0, 0])[0]
    np.testing.assert_array_equal(crop, image[top : top + 9, left : left + 9])
    with pytest.raises(ValueError, match=r"Received: size=-3"):
        ops.resize(tf.constant(image), -3)
    with pytest.raises(ValueError, match=r"Received: smaller_size=2.5"):
        ops.resize_small(tf.constant(image), 2.5)


@pytest.mark.one_backend
def test_to_uint8_truncates_like_big_vision():
    np.testing.assert_array_equal(
        ops.to_uint8(tf.constant([-3.0, 0.9, 254.99, 300.0])).numpy(), [0, 0, 254, 255]
    )


@pytest.mark.one_backend
def test_random_flip_gives_both_orientations():
    image = np.arange(2 * 5 * 3, dtype=np.uint8).reshape(2, 5, 3)
    outs = [ops.random_flip(tf.constant(image)).numpy() for _ in range(40)]
    flipped = [np.array_equal(o, image[:, ::-1]) for o in outs]
    same = [np.array_equal(o, image) for o in outs]
    assert all(f or s for f, s in zip(flipped, same))
    assert 0 < sum(flipped) < 40


# ---------------------------------------------------------------------------
# RandAugment and mixup.
# ---------------------------------------------------------------------------


@pytest.mark.one_backend
def test_randaugment_ops_match_pil_and_formulas():
    from PIL import Image, ImageOps

    rng = np.random.default_rng(1)
    image = rng.integers(40, 200, (17, 23, 3)).astype(np.uint8)
    image[0, 0] = [0, 255, 7]
    x = tf.constant(image)
    np.testing.assert_array_equal(augment.equalize(x), np.asarray(ImageOps.equalize(Image.fromarray(image))))
    # Autocontrast truncates (PIL rounds): the original's formula per channel.
    part = image[1:].astype(np.float32)
    low, high = part.min((0, 1)), part.max((0, 1))
    scale = np.float32(255.0) / (high - low)
    want = np.clip(part * scale - low * scale, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(augment.autocontrast(tf.constant(image[1:])), want)
    np.testing.assert_array_equal(augment.invert(x), 255 - image)
    np.testing.assert_array_equal(augment.posterize(x, 4), image & 0xF0)
    np.testing.assert_array_equal(augment.solarize(x, 128), np.where(image < 128, image, 255 - image))
    np.testing.assert_array_equal(
        augment.solarize_add(x, 110), np.where(image < 128, np.minimum(image.astype(int) + 110, 255), image)
    )
    # Blends truncate towards zero: brightness 0.5 of 201 is 100.
    np.testing.assert_array_equal(augment.brightness(x, 0.5), (image * 0.5).astype(np.uint8))
    # Contrast's grey level is pixel count / 256 (17 * 23 / 256 = 1.53 -> 1).
    np.testing.assert_array_equal(augment.contrast(x, 0.0), np.ones_like(image))


@pytest.mark.one_backend
def test_randaugment_geometry_fills_grey():
    image = np.arange(36, dtype=np.uint8).reshape(6, 6, 1).repeat(3, -1)
    x = tf.constant(image)
    moved = augment.translate_x(x, 2.0).numpy()
    np.testing.assert_array_equal(moved[:, :4], image[:, 2:])
    assert (moved[:, 4:] == 128).all()
    moved = augment.translate_y(x, -1.0).numpy()
    np.testing.assert_array_equal(moved[1:], image[:-1])
    assert (moved[0] == 128).all()
    odd = np.arange(25, dtype=np.uint8).reshape(5, 5, 1).repeat(3, -1)
    np.testing.assert_array_equal(augment.rotate(tf.constant(odd), 90.0), np.rot90(odd))
    cut = augment.cutout(tf.zeros((40, 40, 3), tf.uint8), 5).numpy()
    rows, cols = np.nonzero(cut[..., 0] == 128)
    assert 0 < len(rows) <= 100 and rows.max() - rows.min() < 10 and cols.max() - cols.min() < 10


@pytest.mark.one_backend
@pytest.mark.one_backend
def test_randaugment_holds_no_stateful_op():
    """Under op determinism (the recipes' --deterministic) tf.data runs a
    map function holding a stateful op one image at a time: RandAugment ran
    at half speed (an Assert in `grayscale_to_rgb`, a stateful op)."""
    graph = augment._randaugment_layer(15.0).get_concrete_function().graph
    stateful = [op.type for op in graph.get_operations() if op.op_def.is_stateful]
    # A Case op is stateless when all 16 branches are (else TensorFlow emits `Case`).
    assert stateful == [] and "StatelessCase" in [op.type for op in graph.get_operations()]


def test_randaugment_draws_ops():
    # Eagerly (fast); the pre-training pipeline test runs it inside tf.data.
    image = tf.constant(np.random.default_rng(2).integers(0, 256, (24, 24, 3)), tf.uint8)
    outs = [augment.randaugment(image, 2, 15).numpy() for _ in range(8)]
    assert all(o.shape == (24, 24, 3) and o.dtype == np.uint8 for o in outs)
    assert sum(not np.array_equal(o, image) for o in outs) >= 4
    assert len({o.tobytes() for o in outs}) >= 4  # Different ops are drawn.
    np.testing.assert_array_equal(augment.randaugment(image, 0, 30), image)
    with pytest.raises(ValueError, match=r"Received: num_layers=-1"):
        augment.randaugment(image, -1, 10)
    with pytest.raises(ValueError, match="uint8"):
        augment.randaugment(tf.cast(image, tf.float32), 2, 10)


@pytest.mark.one_backend
def test_mixup_one_sorted_weight_shared_by_images_and_labels():
    images = tf.random.uniform((6, 4, 4, 3))
    labels = tf.one_hot([0, 1, 2, 0, 1, 2], 3)
    mixed_images, mixed_labels = augment.mixup(images, labels, 0.5)
    # Example i keeps weight w >= 0.5 of its own label, 1 - w of example i-1's.
    weight = float(mixed_labels[0, 0])
    assert 0.5 <= weight <= 1.0
    expected = weight * images + (1 - weight) * tf.roll(images, 1, axis=0)
    np.testing.assert_allclose(mixed_images, expected, atol=1e-6)
    np.testing.assert_allclose(mixed_labels, weight * labels + (1 - weight) * tf.roll(labels, 1, 0), atol=1e-6)
    np.testing.assert_allclose(mixed_labels.numpy().sum(-1), 1.0, atol=1e-6)


@pytest.mark.one_backend
def test_mixup_weights_follow_beta():
    """The kept share max(w, 1 - w), w ~ Beta(alpha, alpha), against numpy's
    draws (200 seeds): a tiny alpha hardly mixes (it mixed 50/50 in 82 % of
    batches at 1e-3: both gamma draws clamped to the smallest float)."""
    images, labels = tf.zeros((2, 1, 1, 1)), tf.one_hot([0, 1], 2)
    beta = np.random.default_rng(0).beta
    for alpha in (1e-3, 0.2, 1.0):
        kept = np.array([float(augment.mixup(images, labels, alpha, seed=s)[1][1, 1]) for s in range(200)])
        expected = np.maximum(w := beta(alpha, alpha, 20000), 1 - w)
        assert abs(kept.mean() - expected.mean()) < 0.03, (alpha, kept.mean(), expected.mean())
        assert abs(np.mean(kept > 0.99) - np.mean(expected > 0.99)) < 0.1, alpha
    for bad in (float("inf"), 0.0, -1.0):
        with pytest.raises(ValueError, match="`alpha` must be a finite number > 0"):
            augment.mixup(images, labels, bad)


@pytest.mark.one_backend
def test_each_name_has_one_home():
    # Issue 22: no back-compat shims in a 0.1.0 package. RandAugment and
    # mixup live in `augment`, the sources in `sources` (and keras_vit.data).
    for name in ("randaugment", "mixup", "equalize", "RANDAUGMENT_OPS"):
        assert hasattr(augment, name) and not hasattr(ops, name)
    for name in ("from_tfds", "from_directory", "tfds_builder", "DatasetNotAvailableError"):
        assert getattr(sources, name) is getattr(keras_vit.data, name) and not hasattr(pipelines, name)


# ---------------------------------------------------------------------------
# Sources.
# ---------------------------------------------------------------------------


@pytest.mark.one_backend
def test_from_directory_lists_sorted_classes(folder):
    root, expected = folder
    source = keras_vit.data.from_directory(root)
    assert source.class_names == ("ant", "bee", "cat")
    assert source.num_classes == 3 and source.num_examples == len(expected) == 10
    labels = [int(ex["label"]) for ex in source.dataset]
    assert labels == [e[1] for e in expected]
    with pytest.raises(ValueError, match="Received: directory="):
        keras_vit.data.from_directory(root / "missing")
    with pytest.raises(ValueError, match="no sub-folder"):
        keras_vit.data.from_directory(root / "cat")


@pytest.mark.one_backend
def test_from_directory_reads_sub_folders_of_a_class(tmp_path):
    """As Keras' `image_dataset_from_directory`: `bee/2024/b.png` is a bee
    (it was left out without a word); hidden folders stay out."""
    pixels = _image(CLASS_COLORS["bee"], (8, 8), seed=0)
    for path in ("ant/a.png", "bee/b.png", "bee/2024/c.png", "bee/.cache/d.png"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        tf.io.write_file(str(tmp_path / path), tf.io.encode_png(pixels))
    source = keras_vit.data.from_directory(tmp_path)
    assert source.num_examples == 3 and [int(ex["label"]) for ex in source.dataset] == [0, 1, 1]


@pytest.mark.one_backend
def test_from_tfds_mock_data(tmp_path):
    with tfds.testing.mock_data(num_examples=5):
        source = keras_vit.data.from_tfds("cifar10", "train[:98%]", data_dir=tmp_path)
        assert source.num_classes == 10 and len(source.class_names) == 10
        examples = list(source.dataset)
        assert len(examples) == 5
        assert examples[0]["image"].dtype == tf.string  # Kept encoded for caching.
        batch = next(iter(keras_vit.data.finetune_pipeline(source, training=False, batch_size=5, image_size=16)))
        assert batch[0].shape == (5, 16, 16, 3) and batch[1].shape == (5, 10)
        with pytest.raises(ValueError, match="Received: label_key='fine'"):
            keras_vit.data.from_tfds("cifar10", data_dir=tmp_path, label_key="fine")
        # Issue 21: a feature that is not an image failed inside the pipeline.
        with pytest.raises(ValueError, match=r"Feature 'label' of 'cifar10' is not an image \(ClassLabel\); "
                                             r"its image features are \['image'\]. Received: image_key='label'"):
            keras_vit.data.from_tfds("cifar10", data_dir=tmp_path, image_key="label")


@pytest.mark.one_backend
def test_every_pipeline_on_mock_data(tmp_path):
    # Mocked splits report no size: cache and a small buffer, or the shuffle
    # buffer would fill 50,000 elements from tfds' Python mock generator.
    train = dict(training=True, batch_size=4, image_size=16, shuffle_buffer=8, cache=True)
    builds = {
        # RandAugment is exercised on the image folder (its graph is slow to build).
        "pretrain train": lambda s: keras_vit.data.pretrain_pipeline(s, mixup_alpha=0.2, **train),
        "pretrain eval": lambda s: keras_vit.data.pretrain_pipeline(s, training=False, batch_size=4, image_size=16),
        "finetune eval": lambda s: keras_vit.data.finetune_pipeline(s, training=False, batch_size=4, image_size=16),
    }
    for augmentation in pipelines.FINETUNE_AUGMENTATIONS:
        builds[f"finetune {augmentation}"] = lambda s, a=augmentation: keras_vit.data.finetune_pipeline(
            s, augmentation=a, **train
        )
    with tfds.testing.mock_data(num_examples=4):
        source = keras_vit.data.from_tfds("cifar100", "train[:800]+train[45000:45200]", data_dir=tmp_path)
        for name, build in builds.items():
            images, labels = next(iter(build(source)))
            assert images.shape == (4, 16, 16, 3) and labels.shape == (4, 100), name
            _check_train_batches(images.numpy(), labels.numpy(), num_classes=100)
            if name != "pretrain train":  # The only one with mixup.
                assert set(labels.numpy().max(-1)) == {1.0}, name


@pytest.mark.one_backend
def test_mistyped_dataset_name_gives_tfds_advice_without_its_catalogue(tmp_path):
    """tfds lists its ~1,300 datasets in the error (about 9,000 characters),
    with its "Did you mean" after them."""
    with pytest.raises(ValueError) as info:
        keras_vit.data.from_tfds("cifar_10", data_dir=tmp_path)
    message = str(info.value)
    assert "Dataset cifar_10 not found." in message and "Did you mean: cifar_10 -> cifar10" in message
    assert message.endswith("Received: name='cifar_10'") and "abstract_reasoning" not in message
    assert len(message) < 1500, len(message)


@pytest.mark.one_backend
def test_missing_dataset_says_what_to_download(tmp_path):
    with pytest.raises(keras_vit.data.DatasetNotAvailableError) as info:
        keras_vit.data.from_tfds("cifar10", "train", data_dir=tmp_path, download=False)
    message = str(info.value)
    assert "download_and_prepare" in message and str(tmp_path) in message
    assert message.endswith("or call with download=True here.")
    # Manual downloads fail before any network access, even with download=True.
    with pytest.raises(keras_vit.data.DatasetNotAvailableError) as info:
        keras_vit.data.from_tfds("resisc45", "train", data_dir=tmp_path)
    message = str(info.value)
    assert "1drv.ms" in message and os.path.join(str(tmp_path), "downloads", "manual") in message
    # What to do on its first line (the recipes' one-line errors keep the first lines).
    manual_dir = os.path.join(str(tmp_path), "downloads", "manual")
    assert f"manual download: put the files in manual_dir={manual_dir!r}, then call again with download=True" in (
        message.splitlines()[0])
    # The files are there, download=False: that is what to change.
    os.makedirs(manual_dir)
    open(os.path.join(manual_dir, "NWPU-RESISC45.rar"), "w").close()
    with pytest.raises(keras_vit.data.DatasetNotAvailableError, match=r"holds files, and download=False: call "
                                                                        r"again with download=True"):
        keras_vit.data.from_tfds("resisc45", "train", data_dir=tmp_path, download=False)


# ---------------------------------------------------------------------------
# Pipelines.
# ---------------------------------------------------------------------------


def _check_train_batches(images, labels, num_classes=3):
    assert images.dtype == np.float32 and labels.dtype == np.float32
    assert images.min() >= -1.0 and images.max() <= 1.0
    assert labels.shape[1] == num_classes
    np.testing.assert_allclose(labels.sum(-1), 1.0, atol=1e-6)


@pytest.mark.one_backend
@pytest.mark.parametrize("augmentation", ["inception_crop", "resize_crop", "resize"])
def test_finetune_train_keeps_label_mapping(folder, augmentation):
    source = keras_vit.data.from_directory(folder[0])
    ds = keras_vit.data.finetune_pipeline(
        source, training=True, batch_size=4, image_size=16, augmentation=augmentation, seed=0
    )
    images, labels = _batches(ds, 5)
    assert images.shape == (20, 16, 16, 3)
    _check_train_batches(images, labels)
    assert set(labels.max(-1)) == {1.0}  # One-hot, no mixing here.
    # The dominant channel of every (cropped, flipped) image is its class's.
    np.testing.assert_array_equal(images.mean(axis=(1, 2)).argmax(-1), labels.argmax(-1))
    assert len(set(labels.argmax(-1))) == 3


@pytest.mark.one_backend
def test_finetune_eval_is_a_plain_resize(folder):
    root, expected = folder
    source = keras_vit.data.from_directory(root)
    ds = keras_vit.data.finetune_pipeline(source, training=False, batch_size=4, image_size=24)
    first, labels = _batches(ds, 3)
    second, _ = _batches(ds, 3)
    assert first.shape == (10, 24, 24, 3)  # The last batch is partial: all examples.
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(labels.argmax(-1), [e[1] for e in expected])
    for got, (path, _, pixels) in zip(first, expected):
        if pixels is None:
            pixels = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        want = (tf.image.resize(pixels, (24, 24)).numpy() - 127.5) / 127.5
        np.testing.assert_array_equal(got, want)


@pytest.mark.one_backend
def test_eval_pad_to_batch_gives_full_weighted_batches(folder):
    root, expected = folder  # 10 examples: batches of 4, 4 and 2 (+ 2 padding rows).
    source = keras_vit.data.from_directory(root)
    kwargs = dict(training=False, batch_size=4, image_size=8)
    plain = keras_vit.data.finetune_pipeline(source, **kwargs)
    padded = keras_vit.data.finetune_pipeline(source, pad_to_batch=True, **kwargs)
    assert [spec.shape.as_list() for spec in padded.element_spec] == [[4, 8, 8, 3], [4, 3], [4]]
    batches = [[t.numpy() for t in batch] for batch in padded]
    assert len(batches) == 3
    images, labels, weights = (np.concatenate(parts) for parts in zip(*batches))
    np.testing.assert_array_equal(weights, [1.0] * 10 + [0.0] * 2)
    want_images, want_labels = _batches(plain, 3)
    np.testing.assert_array_equal(images[:10], want_images)
    np.testing.assert_array_equal(labels[:10], want_labels)
    assert not images[10:].any() and not labels[10:].any()
    # The same batches as padding.pad_batches on the plain pipeline (the recipes' path, recipes/inputs.py).
    for got, want in zip(batches, padding.pad_batches(plain, 4)):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b.numpy())
    pretrain = keras_vit.data.pretrain_pipeline(source, pad_to_batch=True, **kwargs)
    _, _, weights = list(pretrain)[-1]
    np.testing.assert_array_equal(weights, [1.0, 1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"`pad_to_batch` must be False when training=True.*Received: pad_to_batch=True"):
        keras_vit.data.finetune_pipeline(source, training=True, batch_size=4, pad_to_batch=True)
    with pytest.raises(ValueError, match=r"Received: pad_to_batch='yes'"):
        keras_vit.data.pretrain_pipeline(source, training=False, batch_size=4, pad_to_batch="yes")


@pytest.mark.one_backend
def test_pretrain_eval_resize_small_central_crop(folder):
    root, expected = folder
    source = keras_vit.data.from_directory(root)
    ds = keras_vit.data.pretrain_pipeline(source, training=False, batch_size=10, image_size=14)
    images, labels = _batches(ds, 1)
    np.testing.assert_array_equal(labels.argmax(-1), [e[1] for e in expected])
    index = [os.path.basename(e[0]) for e in expected].index("img0.png")
    pixels = expected[index][2]  # 40 x 56: smaller side -> round(14 * 8 / 7) = 16.
    small = tf.cast(tf.image.resize(pixels, (16, 22), method="area"), tf.uint8).numpy()
    want = (small[1:15, 4:18].astype(np.float32) - 127.5) / 127.5
    np.testing.assert_array_equal(images[index], want)


@pytest.mark.one_backend
def test_pretrain_train_with_randaugment_and_mixup(folder):
    source = keras_vit.data.from_directory(folder[0])
    # AugReg's strong2 (recipes/configs.py): RandAugment 2/20, mixup 0.8.
    ds = keras_vit.data.pretrain_pipeline(
        source, training=True, batch_size=5, image_size=16, randaugment=(2, 20), mixup_alpha=0.8, seed=1
    )
    images, labels = _batches(ds, 4)
    assert images.shape == (20, 16, 16, 3)
    _check_train_batches(images, labels)
    # Mixup: each row is w * own label + (1 - w) * previous row's, w >= 0.5.
    assert (labels.max(-1) >= 0.5 - 1e-6).all() and (labels.max(-1) < 1.0).any()
    plain = keras_vit.data.pretrain_pipeline(source, training=True, batch_size=5, image_size=16)
    _, plain_labels = _batches(plain, 2)
    assert set(plain_labels.max(-1)) == {1.0}
    # Issue 21: the draws are a function of the seed, not of the parallel
    # map's thread timing (the inception crop drew from the OS's entropy).
    again = _batches(keras_vit.data.pretrain_pipeline(
        source, training=True, batch_size=5, image_size=16, randaugment=(2, 20), mixup_alpha=0.8, seed=1), 4)
    np.testing.assert_array_equal(again[0], images)
    np.testing.assert_array_equal(again[1], labels)
    other = _batches(keras_vit.data.pretrain_pipeline(
        source, training=True, batch_size=5, image_size=16, randaugment=(2, 20), mixup_alpha=0.8, seed=2), 4)
    assert not np.array_equal(other[0], images)


@pytest.mark.one_backend
@pytest.mark.parametrize("augmentation", ["inception_crop", "resize_crop"])
def test_a_seed_gives_the_same_augmented_batches_on_every_build(folder, augmentation):
    """Issue 21: two runs of the same recipe command differed (about 1e-2 in
    the weights after 4 updates) because the crops and flips came from
    stateful random ops in a parallel map. Stateless draws keyed by each
    example's position: the same batches for a seed, others for another,
    and new crops every epoch."""
    source = keras_vit.data.from_directory(folder[0])

    def batches(seed):
        return _batches(keras_vit.data.finetune_pipeline(
            source, training=True, batch_size=4, image_size=16, augmentation=augmentation, seed=seed), 6)[0]

    first = batches(0)
    np.testing.assert_array_equal(batches(0), first)
    assert not np.array_equal(batches(1), first)
    # Six batches are 2.4 passes over the 10 files. Crops that repeated
    # every epoch would leave 10 distinct rows; new ones leave about 23.5
    # (resize_crop has 32 crops and flips of a file at this size, so a pair
    # may coincide by chance: 5 such pairs have p ~ 2e-4).
    assert len({row.tobytes() for row in first}) >= 20


def _augmented(source, batch_augmentation, training=True, n=3, **kwargs):
    # Deterministic crop (a resize, no flip) and seeded order: only the hook varies.
    kwargs = dict(training=training, batch_size=4, image_size=16, augmentation="resize", flip=False, seed=0) | kwargs
    ds = keras_vit.data.finetune_pipeline(source, batch_augmentation=batch_augmentation, **kwargs)
    return _batches(ds, n)


class _Identity:
    name = "identity"

    def __call__(self, images):
        return images


def test_batch_augmentation_off_is_unchanged_and_runs_before_normalisation(folder):
    source = keras_vit.data.from_directory(folder[0])
    plain = _batches(keras_vit.data.finetune_pipeline(
        source, training=True, batch_size=4, image_size=16, augmentation="resize", flip=False, seed=0), 3)
    for got in (_augmented(source, None), _augmented(source, [_Identity()])):
        np.testing.assert_array_equal(got[0], plain[0])
        np.testing.assert_array_equal(got[1], plain[1])
    seen = []

    class Spy(_Identity):
        def __call__(self, images):
            seen.append(images)
            return images * 0.0  # All black: -1 after the normalisation.

    images, _ = _augmented(source, Spy(), n=1)
    assert seen and seen[0].dtype == tf.float32
    np.testing.assert_array_equal(images, -1.0)
    # Evaluation is never augmented.
    evaluated = _augmented(source, keras.layers.RandAugment(), training=False)
    np.testing.assert_array_equal(evaluated[0], _augmented(source, None, training=False)[0])


def test_batch_augmentation_keras_layers(folder):
    source = keras_vit.data.from_directory(folder[0])
    plain, plain_labels = _augmented(source, None, n=5)
    # In tf.data a Keras layer runs on TensorFlow whatever the backend, so
    # RandAugment's own numbers are checked once; the other backends run a
    # cheap layer through the same seam (RandAugment's tracing costs 15 s
    # of CPU under JAX).
    layer = keras.layers.RandAugment() if BACKEND == "tensorflow" else keras.layers.RandomContrast(0.9, seed=1)
    images, labels = _augmented(source, layer, n=5)
    _check_train_batches(images, labels)
    assert np.abs(images - plain).max() > 0.1  # The pixels changed ...
    np.testing.assert_array_equal(labels, plain_labels)  # ... the labels did not.
    images, labels = _augmented(source, [_Identity(), keras.layers.MixUp(alpha=1.0)], n=5)
    _check_train_batches(images, labels)  # Rows of the mixed labels still sum to 1.
    assert labels.min() >= 0.0 and (labels.max(-1) < 0.99).any()  # No longer one-hot.
    mixed = labels.max(-1) < 0.99
    assert np.abs(images[mixed] - plain[mixed]).max() > 0.1  # The images of mixed rows too.


def test_batch_augmentation_cutmix_mixes_labels_by_patch_area(folder):
    # Issue 17: CutMix (Keras' `transform_labels`) through the pipeline.
    source = keras_vit.data.from_directory(folder[0])
    plain, plain_labels = _augmented(source, None, n=5)
    images, labels = _augmented(source, keras.layers.CutMix(factor=1.0, seed=1), n=5)
    _check_train_batches(images, labels)  # Rows still sum to 1.
    assert labels.min() >= 0.0
    mixed = labels.max(-1) < 0.99
    assert mixed.any() and not mixed.all(), labels  # Some rows are no longer one-hot.
    checked = 0
    for i in np.flatnonzero(mixed):
        # The changed pixels are one rectangle, pasted from another image of
        # the same batch (the colours of different classes differ everywhere).
        changed = np.abs(images[i] - plain[i]).max(-1) > 1e-6
        rows, cols = np.flatnonzero(changed.any(1)), np.flatnonzero(changed.any(0))
        assert changed[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()
        batch = slice(i // 4 * 4, i // 4 * 4 + 4)
        assert any(np.allclose(images[i][changed], other[changed], atol=1e-6) for other in plain[batch])
        # The label keeps 1 - (patch area) of its own class (up to the
        # patch's pixel rounding).
        own = labels[i, plain_labels[i].argmax()]
        assert abs((1.0 - changed.mean()) - own) < 0.15, (own, changed.mean())
        checked += 1
    assert checked


def test_batch_augmentation_calls_augment_labels_layers_with_the_labels(folder):
    # Issue 17: keras-cv style layers (an `augment_labels` method) get and
    # return {"images", "labels"}; the returned labels are the batch's.
    calls = []

    class LabelStub(_Identity):
        name = "label_stub"

        def augment_labels(self, labels, transformation=None):
            return labels

        def __call__(self, inputs):
            calls.append(inputs)
            return {"images": inputs["images"], "labels": tf.reverse(inputs["labels"], [1])}

    source = keras_vit.data.from_directory(folder[0])
    plain, plain_labels = _augmented(source, None)
    images, labels = _augmented(source, LabelStub())
    assert calls and all(isinstance(c, dict) and set(c) == {"images", "labels"} for c in calls)
    assert calls[0]["labels"].dtype == tf.float32 and calls[0]["labels"].shape[-1] == 3
    np.testing.assert_array_equal(images, plain)
    np.testing.assert_array_equal(labels, plain_labels[:, ::-1])  # The one-hot labels went in and back.


def test_batch_augmentation_as_text(folder):
    """`augmentation_layers`: the text a config gives (class names, or a
    JSON list of serialized layers) as float32 layers; the pipeline takes
    the text too, with the same batches as the layers built by hand."""
    layers = keras_vit.data.augmentation_layers(
        '[{"class_name": "RandAugment", "config": {"num_ops": 3}}, {"class_name": "MixUp", "config": {"alpha": 0.5}}]')
    assert [type(layer).__name__ for layer in layers] == ["RandAugment", "MixUp"]
    assert layers[0].num_ops == 3 and layers[1].alpha == 0.5
    # Under a mixed policy and a global channels_first (a PyTorch user's
    # keras.json), the layers still compute in float32 on NHWC batches.
    keras.config.set_dtype_policy("mixed_bfloat16")
    keras.config.set_image_data_format("channels_first")
    try:
        named = keras_vit.data.augmentation_layers(" RandomFlip , MixUp, AutoContrast")
    finally:
        keras.config.set_dtype_policy("float32")
        keras.config.set_image_data_format("channels_last")
    assert [(type(layer).__name__, layer.compute_dtype, layer.data_format) for layer in named] == [
        ("RandomFlip", "float32", "channels_last"), ("MixUp", "float32", "channels_last"),
        ("AutoContrast", "float32", "channels_last")]
    source = keras_vit.data.from_directory(folder[0])
    spec = '[{"class_name": "Rescaling", "config": {"scale": 0.5}}]'
    by_text = _augmented(source, spec, n=2)
    by_hand = _augmented(source, keras.layers.Rescaling(0.5), n=2)
    np.testing.assert_array_equal(by_text[0], by_hand[0])
    assert np.abs(by_text[0] - _augmented(source, None, n=2)[0]).max() > 0.1
    for text, match in [("RandAugment,Mixup", "unknown Keras layer 'Mixup'.*Received: batch_augmentation='RandAugment,Mixup'"),
                        ("[{", "is not a JSON list"), (" , ", "names no layer"),
                        ('[{"name": "MixUp"}]', 'entries must be {"class_name"'),
                        ('[{"class_name": "MixUp", "config": {"alpha": "x", "beta": 1}}]', "cannot build 'MixUp'")]:
        with pytest.raises(ValueError, match=match):
            keras_vit.data.augmentation_layers(text)


def test_batch_augmentation_errors_name_the_layer(folder):
    source = keras_vit.data.from_directory(folder[0])
    with pytest.raises(ValueError, match=r"Received: batch_augmentation=\['RandAugment'\]"):
        _augmented(source, ["RandAugment"])
    with pytest.raises(ValueError, match=r"must be a string.*Received: batch_augmentation=None"):
        keras_vit.data.augmentation_layers(None)

    class Pair(_Identity):
        name = "pair"

        def __call__(self, images):
            return images, images

    with pytest.raises(ValueError, match=r"layer 'pair' \(Pair\) must return images or a dict.*Received: tuple"):
        _augmented(source, [Pair()])

    class Shrink(_Identity):
        name = "shrink"

        def __call__(self, images):
            return images[:, :8]

    with pytest.raises(ValueError, match=r"layer 'shrink' \(Shrink\) changed the batch shapes"):
        _augmented(source, Shrink())
    with pytest.raises(ValueError, match=r"layer 'mix_up(_\d+)?' computes in bfloat16.*dtype='float32'"):
        _augmented(source, keras.layers.MixUp(dtype="mixed_bfloat16"))
    with pytest.raises(ValueError, match=r"layer 'random_flip(_\d+)?' reads data_format='channels_first'"):
        _augmented(source, keras.layers.RandomFlip(data_format="channels_first"))


@pytest.mark.one_backend
def test_pipeline_argument_errors(folder):
    source = keras_vit.data.from_directory(folder[0])
    with pytest.raises(ValueError, match=r"Received: augmentation='bit'"):
        keras_vit.data.finetune_pipeline(source, training=True, batch_size=2, augmentation="bit")
    with pytest.raises(ValueError, match=r"Received: batch_size=0"):
        keras_vit.data.finetune_pipeline(source, training=True, batch_size=0)
    with pytest.raises(TypeError, match=r"Received: source="):
        keras_vit.data.finetune_pipeline("cifar10", training=True, batch_size=2)
    # Batches larger than the padded size: said, naming `batch_size` (tf.pad's "Paddings must be non-negative").
    larger = keras_vit.data.finetune_pipeline(source, training=False, batch_size=5, image_size=8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`batch_size`=3 is smaller than a batch"):
        next(iter(padding.pad_batches(larger, 3)))


@pytest.mark.one_backend
def test_argument_errors_name_the_argument_and_value(folder):
    # One helper (keras_vit/data/_checks.py) behind every check: "`name`
    # must be ... Received: name=value".
    source = keras_vit.data.from_directory(folder[0])
    finetune = dict(source=source, training=True, batch_size=2)
    cases = [
        (lambda: keras_vit.data.finetune_pipeline(**finetune | {"training": 1}), "training", "1", "a bool"),
        (lambda: keras_vit.data.finetune_pipeline(**finetune | {"cache": "yes"}), "cache", "'yes'",
         "'auto', True or False"),
        (lambda: keras_vit.data.finetune_pipeline(**finetune, flip="no"), "flip", "'no'", "a bool"),
        (lambda: keras_vit.data.finetune_pipeline(**finetune, shuffle_buffer=2.0), "shuffle_buffer", "2.0",
         "a positive int"),
        (lambda: keras_vit.data.finetune_pipeline(
            **finetune, image_size=16, augmentation="resize_crop", resize_size=8),
         "resize_size", "8", "at least image_size=16"),
        (lambda: keras_vit.data.pretrain_pipeline(**finetune, mixup_alpha=-0.5), "mixup_alpha", "-0.5",
         "a finite number >= 0"),
        (lambda: keras_vit.data.pretrain_pipeline(**finetune, mixup_alpha=float("inf")), "mixup_alpha", "inf",
         "a finite number >= 0"),
        (lambda: keras_vit.data.pretrain_pipeline(**finetune, randaugment=2), "randaugment", "2",
         "None or \\(num_layers, magnitude\\)"),
        (lambda: keras_vit.data.pretrain_pipeline(**finetune, randaugment=(2, float("inf"))), "randaugment",
         "\\(2, inf\\)", "None or \\(num_layers, magnitude\\)"),
        (lambda: keras_vit.data.finetune_pipeline(**finetune | {"training": False}, repeat="no"), "repeat", "'no'",
         "a bool"),
        (lambda: keras_vit.data.from_directory(folder[0], check_images="no"), "check_images", "'no'", "a bool"),
        # A str is a sequence of characters: ".png" matched every name ending in "g".
        (lambda: keras_vit.data.from_directory(folder[0], extensions=".png"), "extensions", "'.png'",
         "a sequence of file name endings such as \\('.jpg', '.png'\\)"),
        (lambda: keras_vit.data.from_directory(folder[0], extensions=()), "extensions", "\\(\\)",
         "a sequence of file name endings such as \\('.jpg', '.png'\\)"),
        (lambda: keras_vit.data.from_directory(folder[0], extensions=None), "extensions", "None",
         "a sequence of file name endings such as \\('.jpg', '.png'\\)"),
        (lambda: keras_vit.data.from_directory(b"folder"), "directory", "b'folder'", "an existing folder"),
        # One training pass drops its partial batch: no batch at all, and fit's bare StopIteration.
        (lambda: keras_vit.data.finetune_pipeline(**finetune | {"batch_size": 11}, repeat=False), "batch_size",
         "11", "at most the 10 examples of source .* for one training pass without repeat"),
        (lambda: keras_vit.data.vtab.vtab_pipeline("dtd", "train", batch_size=2), "split", "'train'", "one of"),
        (lambda: ops.inception_crop(tf.zeros((8, 8, 3)), area_range=(0.5, 0.1)), "area_range",
         "\\(0.5, 0.1\\)", "a pair \\(min, max\\)"),
        (lambda: augment.mixup(tf.zeros((2, 1)), tf.zeros((2, 1)), 0), "alpha", "0", "a finite number > 0"),
        (lambda: padding.pad_batches(source.dataset, True), "batch_size", "True",
         "a positive int"),
        (lambda: keras_vit.data.finetune_pipeline(**finetune, seed=-1), "seed", "-1", "an int >= 0"),
        (lambda: keras_vit.data.finetune_pipeline(**finetune, seed=2**63), "seed", str(2**63),
         "None or an int in \\[0, 2\\*\\*63\\)"),
        (lambda: ops.random_flip(tf.zeros((4, 4, 3)), seed=True), "seed", "True",
         "None, an int or a pair of ints"),
        (lambda: ops.random_flip(tf.zeros((4, 4, 3)), seed=(1, 2, 3)), "seed", "\\(1, 2, 3\\)",
         "None, an int or a pair of ints"),
        (lambda: augment.cutout(tf.zeros((4, 4, 3), tf.uint8), 1, seed=0.5), "seed", "0.5",
         "None, an int or a pair of ints"),
    ]
    for build, name, value, requirement in cases:
        with pytest.raises(ValueError, match=rf"^`{name}` must be {requirement}.*Received: {name}={value}$"):
            build()


def test_pipeline_feeds_fit_on_active_backend(folder):
    source = keras_vit.data.from_directory(folder[0])
    train = keras_vit.data.finetune_pipeline(source, training=True, batch_size=4, image_size=16, seed=0)
    test = keras_vit.data.finetune_pipeline(source, training=False, batch_size=4, image_size=16)
    model = keras_vit.ViT(
        None, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, patch_size=8,
        input_shape=(16, 16, 3), num_classes=3,
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
    )
    head = model.get_layer("head").kernel
    before = keras.ops.convert_to_numpy(head).copy()
    # One compiled step per kind (the JAX compile dominates this test).
    history = model.fit(train, steps_per_epoch=2, epochs=1, verbose=0, shuffle=False)
    loss = history.history["loss"][0]
    # The zero-initialised head gives loss log(3) on the first step; one SGD
    # step on a 3-class problem cannot move the mean far from it.
    assert np.isfinite(loss) and abs(loss - np.log(3)) < 0.3
    assert np.abs(keras.ops.convert_to_numpy(head) - before).max() > 0
    # Evaluation batches feed the model too (the last one partial).
    images, labels = next(iter(test))
    logits = keras.ops.convert_to_numpy(model(images))
    assert logits.shape == (4, 3) and np.isfinite(logits).all()


# ---------------------------------------------------------------------------
# Shuffled sources (issue 13): sources in class order, larger than the buffer.
# ---------------------------------------------------------------------------

NUM_SORTED_CLASSES = 10
BUFFER = 20  # The folder holds ten times as many images.


def _chi_square_p(labels, num_classes=NUM_SORTED_CLASSES):
    """p-value of the label histogram against uniform (scipy's chi2)."""
    from scipy import stats

    counts = np.bincount(labels, minlength=num_classes)[:num_classes]
    return stats.chisquare(counts).pvalue


def _first_labels(dataset, num_batches=3):
    labels = [y.numpy().argmax(-1) for _, y in dataset.take(num_batches)]
    return np.concatenate(labels)


@pytest.fixture(scope="module")
def sorted_folder(tmp_path_factory):
    """10 classes x 20 tiny PNGs: files list class by class."""
    root = tmp_path_factory.mktemp("sorted")
    for label in range(NUM_SORTED_CLASSES):
        (root / f"c{label}").mkdir()
        for i in range(BUFFER):
            pixels = np.full((4, 4, 3), 20 * label + i, np.uint8)
            tf.io.write_file(str(root / f"c{label}" / f"{i:02d}.png"), tf.io.encode_png(pixels))
    return root


def _sorted_builds():
    common = dict(training=True, batch_size=BUFFER, image_size=4, shuffle_buffer=BUFFER, seed=0)
    return {
        "pretrain": lambda s: keras_vit.data.pretrain_pipeline(s, **common),
        "finetune cached": lambda s: keras_vit.data.finetune_pipeline(s, augmentation="resize", **common),
        "finetune uncached": lambda s: keras_vit.data.finetune_pipeline(
            s, augmentation="resize", cache=False, **common
        ),
    }


@pytest.mark.one_backend
@pytest.mark.parametrize("name", list(_sorted_builds()))
def test_first_batches_mix_classes_of_a_sorted_folder(sorted_folder, name):
    source = keras_vit.data.from_directory(sorted_folder)
    assert source.num_examples == NUM_SORTED_CLASSES * BUFFER
    labels = _first_labels(_sorted_builds()[name](source))
    assert len(labels) == 3 * BUFFER
    # Reading files in order, the first 60 labels come from about 3 classes
    # (p ~ 1e-40); a full shuffle of the files gives p > 0.001.
    assert _chi_square_p(labels) > 1e-3, np.bincount(labels)


def _epoch_orders(source, seed, cache):
    # Buffer 1 (no example shuffle) and one epoch per batch: batch k holds
    # epoch k's file order.
    n = source.num_examples
    ds = keras_vit.data.finetune_pipeline(
        source, training=True, batch_size=n, image_size=4, augmentation="resize", flip=False,
        shuffle_buffer=1, cache=cache, seed=seed,
    )
    # Pixel value 20 * label + i identifies the file.
    return [tuple(np.round(x.numpy()[:, 0, 0, 0] * 127.5 + 127.5).astype(int)) for x, _ in ds.take(2)]


@pytest.mark.one_backend
@pytest.mark.parametrize("cache", [True, False])
def test_file_order_new_every_epoch_and_seeded(sorted_folder, cache):
    source = keras_vit.data.from_directory(sorted_folder)
    first, second = _epoch_orders(source, seed=3, cache=cache)
    assert sorted(first) == sorted(second) and len(set(first)) == source.num_examples
    assert first != second and first != tuple(sorted(first))
    assert _epoch_orders(source, seed=3, cache=cache) == [first, second]
    assert _epoch_orders(source, seed=4, cache=cache)[0] != first
    # Evaluation keeps the sorted order.
    labels = [int(ex["label"]) for ex in source.dataset]
    assert labels == sorted(labels)


# ---------------------------------------------------------------------------
# Image folders: bad files, class names, empty classes (issue 15).
# ---------------------------------------------------------------------------


def _good_png(path, value=100):
    tf.io.write_file(str(path), tf.io.encode_png(np.full((6, 6, 3), value, np.uint8)))


@pytest.fixture()
def bad_folder(tmp_path):
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        for i in range(3):
            _good_png(tmp_path / name / f"ok{i}.png")
    jpeg = tf.io.encode_jpeg(np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)).numpy()
    bad = {
        tmp_path / "cat" / "truncated.jpg": jpeg[: len(jpeg) // 2],
        tmp_path / "dog" / "empty.png": b"",
        tmp_path / "dog" / "garbage.jpg": b"this is not a picture",
    }
    for path, data in bad.items():
        path.write_bytes(data)
    return tmp_path, sorted(str(p) for p in bad)


@pytest.mark.one_backend
def test_bad_images_named_or_skipped_and_counted(bad_folder):
    root, bad = bad_folder
    with pytest.raises(ValueError) as info:
        keras_vit.data.from_directory(root)
    message = str(info.value)
    assert message.startswith("3 file(s) in directory=")
    for path in bad:
        assert path in message
    assert "Invalid JPEG data" in message and "Input is empty" in message
    assert "Unknown image file format" in message and "skip_bad_images=True" in message
    assert len(message.splitlines()) == 5  # One line per file, no traceback.
    with pytest.warns(UserWarning, match="Skipped 3 unreadable image file"):
        source = keras_vit.data.from_directory(root, skip_bad_images=True)
    assert sorted(source.skipped) == bad and source.num_examples == 6
    labels = [int(ex["label"]) for ex in source.dataset]
    assert labels == [0, 0, 0, 1, 1, 1]
    # The remaining files feed a whole training epoch.
    ds = keras_vit.data.finetune_pipeline(
        source, training=True, batch_size=6, image_size=4, shuffle_buffer=1, seed=0
    )
    _, y = next(iter(ds))
    assert sorted(y.numpy().argmax(-1)) == labels
    # Unchecked, the folder builds (the cost of the check is opt-out).
    assert keras_vit.data.from_directory(root, check_images=False).num_examples == 9
    with pytest.raises(ValueError, match="Received: check_images=False"):
        keras_vit.data.from_directory(root, check_images=False, skip_bad_images=True)
    with pytest.raises(ValueError, match="Received: skip_bad_images='yes'"):
        keras_vit.data.from_directory(root, skip_bad_images="yes")


@pytest.mark.one_backend
def test_file_names_that_are_not_utf8_read_and_are_named(tmp_path):
    """A Latin-1 file name (an old archive's) reaches Python with
    surrogates: the folder failed with "Error converting unicode string",
    naming no file."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        _good_png(tmp_path / name / "ok.png", value=10)
    good, bad = os.path.join(str(tmp_path), "b", os.fsdecode(b"caf\xe9.png")), os.fsdecode(b"\xe9t\xe9.png")
    with open(good, "wb") as f:
        f.write(tf.io.encode_png(np.full((6, 6, 3), 200, np.uint8)).numpy())
    with open(tmp_path / "a" / bad, "wb") as f:
        f.write(b"not a picture")
    with pytest.raises(ValueError, match="1 file") as info:
        keras_vit.data.from_directory(tmp_path)
    assert os.path.join(str(tmp_path), "a", bad) in str(info.value)
    os.remove(tmp_path / "a" / bad)
    source = keras_vit.data.from_directory(tmp_path)
    pixels = [round(float(x.numpy()[0, 0, 0, 0]) * 127.5 + 127.5) for x, _ in keras_vit.data.finetune_pipeline(
        source, training=False, batch_size=1, image_size=2)]
    assert pixels == [10, 200, 10]  # b/café.png sorts before b/ok.png


def _bmp8(indices, table):
    """An 8-bit BMP file: `indices` (rows of colour indices) into `table`
    (RGB rows), bottom-up rows padded to 4 bytes, the 40-byte info header."""
    import struct

    height, width = indices.shape
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8, 0, 0, 2835, 2835, len(table), 0)
    entries = b"".join(bytes(rgb[::-1]) + b"\0" for rgb in table)
    row_size = (width + 3) // 4 * 4
    pixels = b"".join(bytes(row) + b"\0" * (row_size - width) for row in indices[::-1])
    offset = 14 + len(info) + len(entries)
    return b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + info + entries + pixels


@pytest.mark.one_backend
def test_an_8_bit_bmp_reads_as_its_colours(tmp_path):
    """TensorFlow's BMP decoder returns an 8-bit BMP's colour indices as
    grey levels (a red and a blue class were both black); the table's
    colours are looked up, as PIL reads them."""
    from PIL import Image

    table = np.array([(220, 20, 20), (20, 20, 220), (0, 255, 0), (7, 8, 9)], np.uint8)
    indices = np.array([[0, 1, 2], [3, 2, 1]], np.uint8)
    path = tmp_path / "palette.bmp"
    path.write_bytes(_bmp8(indices, table))
    np.testing.assert_array_equal(np.asarray(Image.open(path).convert("RGB")), table[indices])
    np.testing.assert_array_equal(ops.decode_image(tf.io.read_file(str(path))).numpy(), table[indices])
    # A grey table (what TensorFlow's reading is right for) is unchanged.
    grey = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
    (tmp_path / "grey.bmp").write_bytes(_bmp8(indices * 60, grey))
    np.testing.assert_array_equal(ops.decode_image(tf.io.read_file(str(tmp_path / "grey.bmp"))).numpy(),
                                  np.repeat((indices * 60)[..., None], 3, axis=-1))
    # In an image folder, through a pipeline: one class red, one blue.
    for name, index in (("red", 0), ("blue", 1)):
        (tmp_path / "folder" / name).mkdir(parents=True)
        (tmp_path / "folder" / name / "a.bmp").write_bytes(_bmp8(np.full((4, 4), index, np.uint8), table))
    source = keras_vit.data.from_directory(tmp_path / "folder")
    x, y = next(iter(pipelines.finetune_pipeline(source, training=False, batch_size=2, image_size=4)))
    pixels = np.round(x.numpy()[:, 0, 0] * 127.5 + 127.5)
    np.testing.assert_array_equal(pixels[y.numpy().argmax(-1)], table[[source.class_names.index("blue"),
                                                                      source.class_names.index("red")]][::-1])


@pytest.mark.one_backend
def test_decoded_pixels_other_than_uint8_rgb_are_refused():
    """The pipelines pass decoded pixels through: float pixels in [0, 1]
    became a near-constant -1 image, RGBA batches had 4 channels."""
    for pixels in (np.zeros((2, 4, 4, 3), np.float32), np.zeros((2, 4, 4, 3), np.uint16),
                   np.zeros((2, 4, 4, 4), np.uint8)):
        source = sources.DataSource(
            tf.data.Dataset.from_tensor_slices({"image": pixels, "label": [0, 1]}), num_classes=2)
        for pipeline in (pipelines.finetune_pipeline, pipelines.pretrain_pipeline):
            with pytest.raises(ValueError, match=r"`source.dataset` must be .*uint8 pixels .*Received: "
                                                 r"source.dataset=TensorSpec"):
                pipeline(source, training=False, batch_size=2, image_size=4)
    # Grey uint8 pixels and a source with its own decode are accepted.
    grey = sources.DataSource(tf.data.Dataset.from_tensor_slices(
        {"image": np.zeros((2, 4, 4, 1), np.uint8), "label": [0, 1]}), num_classes=2)
    assert next(iter(pipelines.finetune_pipeline(grey, training=False, batch_size=2, image_size=4)))[0].shape[-1] == 3
    floats = sources.DataSource(tf.data.Dataset.from_tensor_slices(
        {"image": np.ones((2, 4, 4, 3), np.float32), "label": [0, 1]}), num_classes=2,
        decode=lambda image: tf.cast(image * 255.0, tf.uint8))
    x, _ = next(iter(pipelines.finetune_pipeline(floats, training=False, batch_size=2, image_size=4)))
    np.testing.assert_array_equal(x.numpy(), 1.0)


@pytest.mark.one_backend
def test_pixels_of_open_channel_count_are_tiled_or_refused_when_read():
    """A generator's source may leave the channels open, `(None, None,
    None)`: grey stayed one channel and RGBA passed through to the model."""

    def source(*depths):
        def images():
            for i, depth in enumerate(depths):
                yield {"image": np.full((4, 4, depth), 10 * (i + 1), np.uint8), "label": i % 2}

        spec = {"image": tf.TensorSpec((None, None, None), tf.uint8), "label": tf.TensorSpec((), tf.int64)}
        return sources.DataSource(tf.data.Dataset.from_generator(images, output_signature=spec), num_classes=2)

    x, _ = next(iter(pipelines.finetune_pipeline(source(1, 3), training=False, batch_size=2, image_size=4)))
    assert x.shape == (2, 4, 4, 3)
    np.testing.assert_array_equal(x.numpy()[0], np.float32((10 - 127.5) / 127.5))
    np.testing.assert_array_equal(x.numpy()[1], np.float32((20 - 127.5) / 127.5))
    with pytest.raises(tf.errors.InvalidArgumentError, match="must have 1 or 3 channels.*got an image of channels.*4"):
        next(iter(pipelines.finetune_pipeline(source(3, 4), training=False, batch_size=2, image_size=4)))


@pytest.mark.one_backend
def test_from_directory_follows_no_linked_sub_folder(tmp_path):
    """A link to a parent folder inside a class folder gave every image
    again, under that class's label, 40 times over (the walk followed it
    until the path was too long); a class folder may itself be a link."""
    for path, value in (("data/cat/a.png", 0), ("data/dog/b.png", 1), ("elsewhere/bird/c.png", 2)):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        _good_png(tmp_path / path, value=value)
    os.symlink("..", tmp_path / "data" / "cat" / "up")
    os.symlink(".", tmp_path / "data" / "dog" / "self")
    os.symlink(tmp_path / "elsewhere" / "bird", tmp_path / "data" / "bird")
    for directory in (tmp_path / "data", f"file://{tmp_path / 'data'}"):  # file:// is the local disk too
        source = keras_vit.data.from_directory(directory)
        assert source.class_names == ("bird", "cat", "dog")
        found = [(int(tf.io.decode_png(ex["image"])[0, 0, 0]), int(ex["label"])) for ex in source.dataset]
        assert found == [(2, 0), (0, 1), (1, 2)]


@pytest.mark.one_backend
def test_class_names_must_match_and_set_label_order(tmp_path):
    for split, names in (("train", ("cat", "dog")), ("test", ("cat", "dgo"))):
        for value, name in enumerate(names):
            (tmp_path / split / name).mkdir(parents=True)
            _good_png(tmp_path / split / name / "a.png", value=value)
    train = keras_vit.data.from_directory(tmp_path / "train")
    with pytest.raises(ValueError) as info:
        keras_vit.data.from_directory(tmp_path / "test", class_names=train.class_names)
    message = str(info.value)
    assert "['cat', 'dgo']" in message and "class_names=['cat', 'dog']" in message
    assert "missing folders: ['dog']" in message and "folders not in class_names: ['dgo']" in message
    # The given order sets the labels: dog (pixel value 1) is class 0.
    source = keras_vit.data.from_directory(tmp_path / "train", class_names=("dog", "cat"))
    assert source.class_names == ("dog", "cat")
    found = [(int(tf.io.decode_png(ex["image"])[0, 0, 0]), int(ex["label"])) for ex in source.dataset]
    assert found == [(1, 0), (0, 1)]
    for bad in ("cat", ["cat", "cat", "dog"], [1, 2]):
        with pytest.raises(ValueError, match="class_names="):
            keras_vit.data.from_directory(tmp_path / "train", class_names=bad)
    # A repeated name is named (the message listed no missing and no extra folder).
    with pytest.raises(ValueError, match=r"distinct names; \['cat'\] repeat. Received: class_names=\['cat', 'cat', 'dog'\]"):
        keras_vit.data.from_directory(tmp_path / "train", class_names=["cat", "cat", "dog"])


@pytest.mark.one_backend
def test_empty_class_folder_refused(tmp_path):
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
    _good_png(tmp_path / "cat" / "a.png")
    (tmp_path / "dog" / "notes.txt").write_text("no images here")
    with pytest.raises(ValueError) as info:
        keras_vit.data.from_directory(tmp_path)
    assert str(tmp_path / "dog") in str(info.value) and "hold no image files" in str(info.value)


# ---------------------------------------------------------------------------
# tfds' real preparation path, offline (issue 12): builders defined here run
# tfds' own download_and_prepare, writing, reading and split code.
# ---------------------------------------------------------------------------


class KerasVitSortedTiny(tfds.core.GeneratorBasedBuilder):
    """800 train and 50 test 8x8 images, stored class by class."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Test data."}

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 3)),
                "label": tfds.features.ClassLabel(num_classes=NUM_SORTED_CLASSES),
            }),
            disable_shuffling=True,  # Keep the class order tfds would hash away.
        )

    def _split_generators(self, dl_manager):
        # "unlabelled": tfds' label -1, as in imagenet2012's test split.
        return {"train": self._generate_examples(800), "test": self._generate_examples(50),
                "unlabelled": self._generate_examples(4, labelled=False)}

    def _generate_examples(self, n, labelled=True):
        for i in range(n):
            label = i * NUM_SORTED_CLASSES // n
            yield i, {"image": np.full((8, 8, 3), 20 * label, np.uint8), "label": label if labelled else -1}


class KerasVitSlowTiny(tfds.core.GeneratorBasedBuilder):
    """20 examples, 0.1 s each: two preparations started together overlap."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Test data."}

    def _info(self):
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(2, 2, 3)), "label": tfds.features.ClassLabel(num_classes=2)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(20):
            time.sleep(0.1)
            yield i, {"image": np.full((2, 2, 3), i, np.uint8), "label": i % 2}


def _prepare_when_told(data_dir, go):
    """One of the processes of the test below: Python's `random` seeded as
    `keras.utils.set_random_seed` does in every run of a command."""
    random.seed(0)
    while not os.path.exists(go):
        time.sleep(0.02)
    source = keras_vit.data.from_tfds("keras_vit_slow_tiny", "train", data_dir=data_dir)
    # Each epoch's tfds reader is built inside a tf.data function (without
    # AutoGraph, which walked into tfds' `as_dataset` and warned).
    next(iter(keras_vit.data.finetune_pipeline(source, training=True, batch_size=4, image_size=2, cache=False, seed=0)))
    print(sum(1 for _ in source.dataset), random.random())


@pytest.mark.one_backend
def test_two_processes_preparing_one_dataset_at_once(tmp_path):
    """Two first-use runs preparing one dataset at once wrote into one
    temporary folder (tfds names it with Python's `random`, seeded alike in
    both) and raced to rename it. One prepares while the other waits; the
    run's `random` stream is as without a preparation."""
    go = tmp_path / "go"
    code = f"from tests.data.test_data import _prepare_when_told; _prepare_when_told({str(tmp_path)!r}, {str(go)!r})"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    runs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(1)
    go.touch()
    outputs = [run.communicate(timeout=240) for run in runs]
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, err[-3000:]
        assert out.splitlines()[-1].split() == ["20", str(random.Random(0).random())], (out, err[-3000:])
    assert any("Waiting for pid" in err for _, err in outputs), [err[-2000:] for _, err in outputs]
    assert not [err for _, err in outputs if "AutoGraph" in err], [err[-2000:] for _, err in outputs]
    assert sorted(p.name for p in (tmp_path / "keras_vit_slow_tiny").iterdir()) == ["1.0.0", "1.0.0.lock"]


class KerasVitBrokenPrepare(tfds.core.GeneratorBasedBuilder):
    """Preparation fails the way a full disk or a missing package does."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Test data."}

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 3)),
                "label": tfds.features.ClassLabel(num_classes=2),
            })
        )

    def _split_generators(self, dl_manager):
        raise OSError("No space left on device (simulated)")

    def _generate_examples(self):  # pragma: no cover - never reached.
        yield from ()


@pytest.fixture(scope="module")
def tiny_tfds(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    # download=True (the default) runs tfds' download_and_prepare.
    source = keras_vit.data.from_tfds("keras_vit_sorted_tiny", "train", data_dir=data_dir)
    return data_dir, source


@pytest.mark.one_backend
def test_from_tfds_prepares_a_real_dataset_offline(tiny_tfds):
    data_dir, source = tiny_tfds
    assert (data_dir / "keras_vit_sorted_tiny" / "1.0.0" / "dataset_info.json").exists()
    assert source.num_examples == 800 and source.num_classes == NUM_SORTED_CLASSES
    labels = [int(ex["label"]) for ex in source.dataset]
    assert labels == sorted(labels) and np.bincount(labels).tolist() == [80] * 10
    # Prepared once: a second source reads it without preparing (download=False).
    test = keras_vit.data.from_tfds("keras_vit_sorted_tiny", "test", data_dir=data_dir, download=False)
    images, y = next(iter(keras_vit.data.finetune_pipeline(test, training=False, batch_size=50, image_size=8)))
    pixels = (20 * y.numpy().argmax(-1)).astype(np.float32)
    np.testing.assert_array_equal(images.numpy()[:, 0, 0, 0], (pixels - np.float32(127.5)) / np.float32(127.5))


@pytest.mark.one_backend
def test_a_label_outside_the_classes_is_an_error_not_a_zero_row(tiny_tfds):
    """tf.one_hot turns -1 (tfds' label of a split without labels) or a
    label past the classes into a row of zeros, which scored accuracy 1 and
    loss 0 under a zero head."""
    data_dir, _ = tiny_tfds
    unlabelled = keras_vit.data.from_tfds("keras_vit_sorted_tiny", "unlabelled", data_dir=data_dir, download=False)
    for pipeline in (pipelines.finetune_pipeline, pipelines.pretrain_pipeline):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"keras_vit_sorted_tiny.*labels must be in \[0, 10\).*validation split.*\[-1\]"):
            next(iter(pipeline(unlabelled, training=False, batch_size=2, image_size=8)))
    past = sources.DataSource(
        tf.data.Dataset.from_tensor_slices({"image": np.zeros((3, 4, 4, 3), np.uint8), "label": [0, 5, 2]}),
        num_classes=3, name="past")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"past: labels must be in \[0, 3\).*\[5\]"):
        list(pipelines.finetune_pipeline(past, training=False, batch_size=3, image_size=4))


@pytest.mark.one_backend
def test_tfds_and_vtab_training_mix_a_sorted_split(tiny_tfds):
    data_dir, source = tiny_tfds
    common = dict(batch_size=BUFFER, image_size=4, shuffle_buffer=BUFFER, seed=0)
    finetune = keras_vit.data.finetune_pipeline(source, training=True, augmentation="resize", **common)
    assert _chi_square_p(_first_labels(finetune)) > 1e-3
    # The VTAB pipeline on the same data: a task whose tfds name points here.
    task = dataclasses.replace(keras_vit.data.vtab.get_task("dtd"), tfds_name="keras_vit_sorted_tiny")
    vtab = keras_vit.data.vtab.vtab_pipeline(task, "train800", data_dir=data_dir, download=False, **common)
    labels = _first_labels(vtab)
    assert len(labels) == 3 * BUFFER and _chi_square_p(labels) > 1e-3, np.bincount(labels)


# tfds' shuffled reading (issue 13): uncached training reads the shard files
# through `shuffle_files=True` and `ReadConfig(shuffle_seed=seed)`.
SHARDS, SHARD_SIZE = 8, 30


class KerasVitShardedTiny(tfds.core.GeneratorBasedBuilder):
    """240 2x2 train images in 8 shard files of 30, stored class by class;
    every pixel holds the example's index."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Test data."}

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(2, 2, 3)),
                "label": tfds.features.ClassLabel(num_classes=NUM_SORTED_CLASSES),
            }),
            disable_shuffling=True,  # An ordered dataset: tfds guards its order.
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(SHARDS * SHARD_SIZE)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, {"image": np.full((2, 2, 3), i, np.uint8), "label": i * NUM_SORTED_CLASSES // n}


@pytest.fixture(scope="module")
def sharded_tfds_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds_sharded")
    builder = tfds.builder("keras_vit_sharded_tiny", data_dir=data_dir)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=SHARDS))
    assert builder.info.splits["train"].shard_lengths == [SHARD_SIZE] * SHARDS
    return data_dir


@pytest.fixture(scope="module")
def sharded_tfds(sharded_tfds_dir):
    return keras_vit.data.from_tfds("keras_vit_sharded_tiny", "train", data_dir=sharded_tfds_dir, download=False)


@pytest.mark.one_backend
def test_a_data_dir_copied_in_part_names_the_missing_files(sharded_tfds_dir, tmp_path):
    """tfds' `is_prepared()` reads the info files only: a data_dir copied
    without some shard files passed, and training stopped inside `fit` with
    a traceback from the iterator (NotFoundError)."""
    missing = "keras_vit_sharded_tiny-train.tfrecord-00003-of-00008"
    shutil.copytree(sharded_tfds_dir, tmp_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns(missing))
    for split in ("train", "train[25%:50%]"):  # shard 3 holds examples 90-119
        with pytest.raises(keras_vit.data.DatasetNotAvailableError, match=(
                rf"lacks 1 of the \d files of split '{re.escape(split)}' \({missing}\): a copy in part\? Copy the "
                r"missing files, or delete the folder and prepare the dataset again \(download=True\)")):
            keras_vit.data.from_tfds("keras_vit_sharded_tiny", split, data_dir=tmp_path, download=False)
    # The splits the copy holds whole still read.
    source = keras_vit.data.from_tfds("keras_vit_sharded_tiny", "train[:25%]", data_dir=tmp_path, download=False)
    assert sum(1 for _ in source.dataset) == 60


def _uncached_epochs(source, seed, epochs=2):
    # No example shuffle (buffer 1) and one epoch per batch: batch k is the
    # order in which epoch k read the files.
    ds = keras_vit.data.finetune_pipeline(
        source, training=True, batch_size=source.num_examples, image_size=2, augmentation="resize",
        flip=False, shuffle_buffer=1, cache=False, seed=seed,
    )
    return [tuple(np.round(x.numpy()[:, 0, 0, 0] * 127.5 + 127.5).astype(int)) for x, _ in ds.take(epochs)]


@pytest.mark.one_backend
@pytest.mark.parametrize("kind", ["cached", "folder", "tfds"])
def test_every_iterator_reads_the_same_stream(sorted_folder, sharded_tfds, kind):
    """Keras' `fit` (JAX, PyTorch, TensorFlow under a strategy) reads a
    first batch through an iterator it then drops. tf.data's per-epoch
    reshuffle drew from a seed state all iterators share, so the stream of
    the next iterator depended on how many epochs the dropped one had
    prefetched: two runs of one command trained on different orders."""
    source = sharded_tfds if kind == "tfds" else keras_vit.data.from_directory(sorted_folder)
    n = source.num_examples
    ds = keras_vit.data.finetune_pipeline(
        source, training=True, batch_size=n // 2, image_size=2, augmentation="resize", flip=False,
        shuffle_buffer=n // 3, cache=kind == "cached", seed=3,
    )

    def ids(iterator, batches=6):
        return [tuple(np.round(next(iterator)[0].numpy()[:, 0, 0, 0] * 127.5 + 127.5).astype(int))
                for _ in range(batches)]

    fresh = ids(iter(ds))
    assert len(set(fresh)) == len(fresh)  # three epochs, each in its own order
    dropped = iter(ds)
    ids(dropped, 8)  # four epochs read, then dropped
    del dropped
    assert ids(iter(ds)) == fresh
    assert ds.cardinality() == tf.data.INFINITE_CARDINALITY


@pytest.mark.one_backend
@pytest.mark.parametrize("kind", ["cached", "folder", "tfds"])
def test_a_training_pipeline_without_repeat_gives_a_new_order_every_pass(sorted_folder, sharded_tfds, kind):
    """`repeat=False`: `fit(epochs=...)` reads one pass per epoch, each
    through a new iterator; each pass in its own order, with its length
    known (`len()`, progress bars)."""
    source = sharded_tfds if kind == "tfds" else keras_vit.data.from_directory(sorted_folder)
    n = source.num_examples
    ds = keras_vit.data.finetune_pipeline(
        source, training=True, batch_size=n // 4, image_size=2, augmentation="resize", flip=False,
        shuffle_buffer=1, cache=kind == "cached", repeat=False, seed=3,
    )
    assert len(ds) == 4
    passes = [np.concatenate([np.round(x.numpy()[:, 0, 0, 0] * 127.5 + 127.5) for x, _ in ds]) for _ in range(3)]
    assert all(sorted(p) == sorted(passes[0]) and len(set(p)) == n for p in passes)  # each example once
    assert len({tuple(p) for p in passes}) == 3


@pytest.mark.one_backend
@pytest.mark.parametrize("kind", ["cached", "folder", "tfds"])
def test_a_pipeline_seed_fixes_the_order_whatever_the_global_seed(sorted_folder, sharded_tfds, kind):
    """tf.data pairs an op's seed with TensorFlow's global seed: the same
    `seed=` read another order after `keras.utils.set_random_seed` with
    another value, and hosts seeded apart (`seed + process_index`, for
    their dropout) read one stream in different orders."""
    source = sharded_tfds if kind == "tfds" else keras_vit.data.from_directory(sorted_folder)
    n = source.num_examples

    def ids(images):
        return tuple(np.round(images.numpy()[:, 0, 0, 0] * 127.5 + 127.5).astype(int))

    def stream(global_seed, repeat):
        tf.random.set_seed(global_seed)
        ds = keras_vit.data.finetune_pipeline(
            source, training=True, batch_size=n // 2, image_size=2, augmentation="resize", flip=False,
            shuffle_buffer=n // 3, cache=kind == "cached", repeat=repeat, seed=3,
        )
        batches = ds.take(6) if repeat else [batch for _ in range(3) for batch in ds]
        return [ids(x) for x, _ in batches]

    for repeat in (True, False):
        assert stream(0, repeat) == stream(7, repeat)
    tf.config.run_functions_eagerly(True)  # tf.function bodies run as Python: still pinned
    try:
        assert stream(7, False) == stream(0, False)
    finally:
        tf.config.run_functions_eagerly(False)
    orders = []
    for global_seed in (0, 7):
        tf.random.set_seed(global_seed)
        orders.append([int(example["label"]) for example in source.shuffled(3)])
    assert orders[0] == orders[1] and orders[0] != sorted(orders[0])


@pytest.mark.one_backend
def test_building_a_pipeline_in_tf_data_debug_mode_keeps_the_global_seed():
    """Debug mode runs tf.data's functions eagerly: a seed meant for the
    function's own graph became the process' global seed, and the batches
    of a seed were not those of graph mode (a process of its own: debug
    mode cannot be switched off)."""
    build = (
        "source = keras_vit.data.DataSource(tf.data.Dataset.from_tensor_slices({'image': np.zeros((6, 2, 2, 3), "
        "np.uint8), 'label': np.arange(6)}), num_classes=6, num_examples=6)\n"
        "ds = keras_vit.data.finetune_pipeline(source, training=True, batch_size=2, image_size=2, shuffle_buffer=3, "
        "seed=0)\n"
        "labels = [y.numpy().argmax(-1).tolist() for _, y in ds.take(6)]\n"
    )
    code = (
        "import numpy as np, tensorflow as tf, keras_vit.data\n"
        "from tensorflow.python.eager import context\n"
        "tf.data.experimental.enable_debug_mode()\n"
        "tf.random.set_seed(42)\n"
        f"{build}"
        "print(labels, context.global_seed())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT)))
    namespace = dict(np=np, tf=tf, keras_vit=keras_vit)
    exec(build, namespace)  # graph mode
    assert run.returncode == 0 and run.stdout.strip() == f"{namespace['labels']} 42", (run.stdout, run.stderr[-3000:])


def _shard_order(ids):
    """Shards in the order their first example is read."""
    return tuple(dict.fromkeys(i // SHARD_SIZE for i in ids))


@pytest.mark.one_backend
def test_uncached_tfds_training_reads_shuffled_seeded_files(sharded_tfds):
    source = sharded_tfds
    n = source.num_examples
    assert n == SHARDS * SHARD_SIZE
    assert [int(ex["label"]) for ex in source.dataset] == sorted(int(ex["label"]) for ex in source.dataset)
    first, second = _uncached_epochs(source, seed=3)
    for epoch in (first, second):
        assert sorted(epoch) == list(range(n))  # Every example once per epoch.
        # Whole files in a random order: each shard's examples keep their
        # order (files are shuffled, not examples) ...
        for shard in range(SHARDS):
            ids = [i for i in epoch if i // SHARD_SIZE == shard]
            assert ids == sorted(ids)
        assert sorted(_shard_order(epoch)) == list(range(SHARDS))
    # ... a new order every epoch, the same sequence of orders for a seed.
    assert _shard_order(first) != tuple(range(SHARDS)) and first != tuple(range(n))
    assert _shard_order(first) != _shard_order(second)
    assert _uncached_epochs(source, seed=3) == [first, second]
    assert _shard_order(_uncached_epochs(source, seed=4, epochs=1)[0]) != _shard_order(first)


@pytest.mark.one_backend
def test_uncached_tfds_training_mixes_classes_of_an_ordered_dataset(sharded_tfds):
    common = dict(
        training=True, batch_size=BUFFER, image_size=2, augmentation="resize", shuffle_buffer=BUFFER,
        cache=False, seed=0,
    )
    shuffled = keras_vit.data.finetune_pipeline(sharded_tfds, **common)
    batches = [y.numpy().argmax(-1) for _, y in shuffled.take(3)]
    in_order = keras_vit.data.finetune_pipeline(dataclasses.replace(sharded_tfds, shuffled=None), **common)
    in_order_batches = [y.numpy().argmax(-1) for _, y in in_order.take(3)]
    # Files in order: three batches through a buffer of 20 see examples
    # 0-79 only, classes 0-3 (24 examples a class).
    assert np.concatenate(in_order_batches).max() <= 3
    # Shuffled files, interleaved by tfds (16 files at a time, blocks of 16
    # examples), fill the buffer from several files at once, later ones
    # included. (Ordered datasets mix no further: tfds shuffles the others'
    # examples across files when it prepares them.)
    labels = np.concatenate(batches)
    assert len(set(labels)) >= 4 and labels.max() >= 4, batches


@pytest.mark.one_backend
def test_failed_preparation_gives_the_cause_first(tmp_path):
    with pytest.raises(keras_vit.data.DatasetNotAvailableError) as info:
        keras_vit.data.from_tfds("keras_vit_broken_prepare", data_dir=tmp_path)
    message = str(info.value)
    assert message.startswith("Preparing dataset 'keras_vit_broken_prepare' in ")
    assert message.splitlines()[0].endswith("failed: OSError: No space left on device (simulated)")
    assert "network access" in message.splitlines()[1]
    assert "download=True" not in message  # what this call did


@pytest.mark.one_backend
def test_without_tensorflow_the_data_package_names_what_to_install():
    """A `keras-vit[jax]` install has no TensorFlow: `import keras_vit`
    works, `keras_vit.data` says what it needs (a bare ModuleNotFoundError
    from a module inside before)."""
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "import keras_vit\n"
            "try:\n    import keras_vit.data\nexcept ImportError as error:\n    print(error)")
    backend = "jax" if importlib.util.find_spec("jax") else "torch"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "KERAS_BACKEND": backend})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == ("keras_vit.data needs TensorFlow (tf.data): `pip install tensorflow-cpu` (the "
                                     "`tensorflow` and `recipes` extras have it); the batches then feed any "
                                     "KERAS_BACKEND.")
