"""Input pipelines for pre-training and fine-tuning, on tfds or image folders.

A pipeline is built in two steps: a *source* (`from_tfds`, `from_directory`,
or `keras_vit.data.vtab.load_task`) gives the examples of one split, and a
*pipeline* (`pretrain_pipeline`, `finetune_pipeline`) turns them into batches
`(images, labels)`: float32 images in [-1, 1], NHWC, and float32 one-hot
labels, ready for `model.fit` / `model.evaluate` on any Keras backend.

```python
train = keras_vit.data.from_tfds("cifar10", "train[:98%]")
test = keras_vit.data.from_tfds("cifar10", "test")
model.fit(
    keras_vit.data.finetune_pipeline(train, training=True, batch_size=512),
    steps_per_epoch=100, epochs=100,
    validation_data=keras_vit.data.finetune_pipeline(test, training=False, batch_size=512),
)
```

Training pipelines repeat forever (the original trains for a number of
steps), so give `fit` a `steps_per_epoch`.
Sources are in `keras_vit.data.sources`, RandAugment and mixup in
`keras_vit.data.augment`.
"""

import json

import tensorflow as tf

from keras_vit.data import _checks
from keras_vit.data import augment
from keras_vit.data import ops
from keras_vit.data import padding
from keras_vit.data.sources import DataSource

# Training data up to this many examples is cached in memory (as encoded
# bytes), as task_adaptation does (`base.py`, 150k).
CACHE_MAX_EXAMPLES = 150_000
# vit_jax `configs/common.py`: shuffle_buffer = 50_000.
SHUFFLE_BUFFER = 50_000
FINETUNE_AUGMENTATIONS = ("inception_crop", "resize_crop", "resize")


# ---------------------------------------------------------------------------
# Pipelines.
# ---------------------------------------------------------------------------


def _check_common(source, training, batch_size, image_size, cache, pad_to_batch, seed):
    """The arguments both pipelines take."""
    if not isinstance(source, DataSource):
        _checks.fail(
            "source",
            source,
            "a keras_vit.data.DataSource (from `from_tfds`, `from_directory` or `vtab.load_task`)",
            error=TypeError,
        )
    spec = source.dataset.element_spec
    image = spec.get("image") if isinstance(spec, dict) else None
    if source.decode is ops.decode_image and image is not None and image.dtype != tf.string:
        # Float pixels in [0, 1] became a near-constant -1 image, RGBA
        # batches had 4 channels: the decoder passes decoded pixels through.
        if image.dtype != tf.uint8 or image.shape.rank != 3 or image.shape[-1] not in (1, 3, None):
            _checks.fail(
                "source.dataset",
                image,
                "a dataset of encoded images (tf.string) or of uint8 pixels (height, width, 1 or 3 channels); "
                "give the DataSource a `decode` function for other images",
            )
    _checks.boolean(training, "training")
    _checks.integer(batch_size, "batch_size")
    _checks.integer(image_size, "image_size")
    if cache not in ("auto", True, False):
        _checks.fail("cache", cache, "'auto', True or False")
    _checks.boolean(pad_to_batch, "pad_to_batch")
    # tf.data's and tfds' shuffle seeds are int64s.
    if seed is not None and (_checks.integer(seed, "seed", minimum=0) >= 2**63):
        _checks.fail("seed", seed, "None or an int in [0, 2**63)")
    if pad_to_batch and training:
        _checks.fail("pad_to_batch", pad_to_batch, "False when training=True (training batches are all full)")


# Training pipelines built with seed=None: their order and augmentation come
# from TensorFlow's global seed, which a multi-host JAX start
# (`keras.distribution.initialize`) makes equal across processes only for
# pipelines built after it.
unseeded_training_pipelines = 0


def _batched(
    source,
    preprocess,
    *,
    training,
    batch_size,
    shuffle_buffer,
    repeat,
    cache,
    seed,
    batch_fn=None,
    pad_to_batch=False,
):
    """[shuffled files] -> cache -> [full reshuffle] -> next epoch -> shuffle
    -> map -> batch -> [batch_fn] -> [pad to batch_size] -> prefetch.

    The order of vit_jax's `get_data` (files shuffled, repeat, shuffle, map,
    batch), with the cache of task_adaptation in front. Training reads the
    files in a new random order every epoch: sources in class order (image
    folders) would otherwise give single-class batches whenever the data
    outgrow the shuffle buffer.

    `preprocess(image, seed)` and `batch_fn(images, labels, seed)` get the
    stateless random seed of the example (the batch) at its position in
    the stream (None at evaluation), derived from `seed` (or one draw of TensorFlow's global
    generator): the augmentation of a run is the same whatever order the
    parallel maps run in. (The original draws with stateful ops, which a
    parallel map makes differ from run to run.)
    """
    if training and seed is None:  # `keras_vit.distribute` refuses a later multi-host start
        global unseeded_training_pipelines
        unseeded_training_pipelines += 1
    # One key per stream (examples, batches, epoch orders, the shuffle buffer), folded with the
    # position (the epoch's number). Evaluation draws nothing: no key, and
    # no draw from the global generator.
    example_key, batch_key, order_key, buffer_key = tf.unstack(ops.split_seed(seed, 4)) if training else (None,) * 4
    n = source.num_examples
    cached = cache is True or (cache == "auto" and n is not None and n <= CACHE_MAX_EXAMPLES)
    if repeat is None:
        repeat = training
    _checks.boolean(repeat, "repeat")  # a truthy "no" made an evaluation pass endless
    if training and not repeat and n is not None and n < batch_size:
        # Training drops the partial batch: one pass would hold no batch, and
        # `fit` ended in a bare StopIteration.
        _checks.fail(
            "batch_size",
            batch_size,
            f"at most the {n} examples of source {source.name!r} for one training pass "
            "without repeat (its partial batch is dropped); or repeat=True",
        )
    if training and cached and n:
        # A cache replays the order it was filled in; reshuffle the whole
        # cached split every epoch instead. The buffer holds references to
        # the cached tensors, not copies.
        examples = source.dataset.cache()
        dataset = _epochs(lambda epoch_seed: examples.shuffle(n, seed=epoch_seed), _epoch_seeds(order_key, repeat), n)
    elif training and source.shuffled is not None:
        if cached:  # size unknown: the cache replays the first epoch's order
            dataset = _epochs(source.shuffled, _epoch_seeds(order_key, True).take(1), n).cache()
            dataset = dataset.repeat() if repeat else dataset
        else:
            dataset = _epochs(source.shuffled, _epoch_seeds(order_key, repeat), n)
    else:
        dataset = source.dataset.cache() if cached else source.dataset
        dataset = dataset.repeat() if repeat else dataset
    if training:
        _checks.integer(shuffle_buffer, "shuffle_buffer")
        buffer = min(shuffle_buffer, n) if n else shuffle_buffer
        if buffer > 1:  # an endless stream is read once per iterator: the same order for every one
            dataset = ops.seeded_dataset(
                lambda: dataset.shuffle(buffer, seed=_draw(buffer_key), reshuffle_each_iteration=not repeat)
            )
    num_classes = source.num_classes

    # The map functions hold no Python control flow on tensors: no AutoGraph.
    @tf.autograph.experimental.do_not_convert
    def prepare(position, example):
        seed = None if example_key is None else tf.random.experimental.stateless_fold_in(example_key, position)
        image = preprocess(source.decode(example["image"]), seed)
        return image, ops.one_hot(ops.checked_label(example["label"], num_classes, source.name), num_classes)

    dataset = dataset.enumerate().map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    # Training batches keep a static size (one compiled step on every backend).
    dataset = dataset.batch(batch_size, drop_remainder=training)
    if batch_fn is not None:

        @tf.autograph.experimental.do_not_convert
        def prepare_batch(position, batch):
            return batch_fn(*batch, tf.random.experimental.stateless_fold_in(batch_key, position))

        dataset = dataset.enumerate().map(prepare_batch, num_parallel_calls=tf.data.AUTOTUNE)
    if pad_to_batch:
        dataset = padding.pad_batches(dataset, batch_size)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _epoch_seeds(key, repeat):
    """The seed of each epoch of a training pipeline.

    With `repeat`, drawn from `key` and the epoch's number: every iterator
    reads the same stream. (tf.data's own per-epoch reshuffle,
    `reshuffle_each_iteration=True`, draws from one seed state that all
    iterators of a dataset share, and Keras' `fit` reads a first batch
    through an iterator it then drops: the order a run trained in depended
    on how far that iterator had prefetched.) Without, one epoch per
    iteration (`fit(epochs=...)` iterates such a dataset once per epoch),
    a new seed each time from a state all iterators share, as tf.data's.
    """
    if repeat:
        fold_in = tf.random.experimental.stateless_fold_in
        return tf.data.Dataset.counter().map(lambda number: _draw(fold_in(key, number)))
    return ops.seeded_dataset(
        lambda: tf.data.Dataset.random(seed=_draw(key), rerandomize_each_iteration=True).take(1)
    )


def _draw(key):
    """A seed for `Dataset.shuffle`: an int64 over the full range."""
    return tf.random.stateless_uniform([], key, minval=None, maxval=None, dtype=tf.int64)


def _epochs(one_epoch, seeds, num_examples):
    """`one_epoch(seed)` for each seed of `seeds`, one after the other."""

    @tf.autograph.experimental.do_not_convert  # no AutoGraph inside tfds' reader
    def seeded_epoch(seed):
        return ops.seeded_dataset(lambda: one_epoch(seed))

    epochs = seeds.flat_map(seeded_epoch)
    # flat_map cannot tell the length; `len()` and progress bars can.
    count = int(seeds.cardinality())
    if count == tf.data.INFINITE_CARDINALITY:
        return epochs.apply(tf.data.experimental.assert_cardinality(count))
    return epochs.apply(tf.data.experimental.assert_cardinality(count * num_examples)) if num_examples else epochs


def pretrain_pipeline(
    source,
    *,
    training,
    batch_size,
    image_size=224,
    resize_size=None,
    randaugment=None,
    mixup_alpha=0.0,
    shuffle_buffer=SHUFFLE_BUFFER,
    repeat=None,
    cache="auto",
    seed=None,
    pad_to_batch=False,
):
    """Pre-training batches, as big_vision's AugReg configs.

    Training: inception crop (area 5-100 %) resized to `image_size` (cast
    back to uint8 as big_vision does) -> random flip -> optional RandAugment
    -> [-1, 1] -> one-hot -> batch -> optional mixup. Evaluation:
    `resize_small(resize_size)` (area) -> `central_crop(image_size)` -> [-1, 1].

    Args:
        source: a `DataSource`.
        training: bool. Training (augmented, shuffled, repeated) or
            evaluation (deterministic) batches.
        batch_size: int. Training batches all have this size; the last
            evaluation batch may be smaller.
        image_size: int. Side of the square images. Defaults to 224.
        resize_size: int. Evaluation only: the smaller side before the
            central crop. Defaults to `image_size * 8 / 7` rounded (256 for
            224).
        randaugment: optional `(num_layers, magnitude)`; AugReg's presets
            (`light1` ... `strong2`) are in `recipes/configs.py` (`AUGREG`).
        mixup_alpha: float >= 0; 0 turns mixup off. Defaults to 0.
        shuffle_buffer: int. Training shuffle buffer (capped at the number of
            examples). Defaults to 50,000.
        repeat: bool. Repeat forever. Defaults to `training`.
        cache: `"auto"` (cache encoded examples when at most 150,000), True
            or False. A cached training split is read whole before the first
            batch, then reshuffled whole every epoch.
        seed: optional int for the shuffle order (files and examples) and
            the augmentation's draws; None: TensorFlow's global seed
            (`keras.utils.set_random_seed`) decides.
        pad_to_batch: bool. Evaluation only: pad the last batch to
            `batch_size` with weight-0 rows and yield `(images, labels,
            weights)` (as `keras_vit.data.padding.pad_batches`): one static
            shape for every step (one compiled function, XLA and TPU
            friendly), batches that split evenly over replicas, and weighted
            metrics that count the real examples only. Defaults to False.

    Returns:
        A `tf.data.Dataset` of `(images, labels)`: float32
        `(B, image_size, image_size, 3)` in [-1, 1] and float32
        `(B, num_classes)`; with `pad_to_batch`, `(images, labels,
        weights)`, weights float32 `(batch_size,)`, 1 for real rows.
    """
    _check_common(source, training, batch_size, image_size, cache, pad_to_batch, seed)
    if randaugment is not None:
        try:
            layers, magnitude = randaugment
        except (TypeError, ValueError):
            layers = magnitude = None
        if not (_checks.is_int(layers) and layers >= 0 and _checks.is_real(magnitude) and magnitude >= 0):
            _checks.fail("randaugment", randaugment,
                         "None or (num_layers, magnitude): an int >= 0 and a finite number >= 0")
        if layers == 0:
            randaugment = None
    _checks.number(mixup_alpha, "mixup_alpha")
    if resize_size is None:
        resize_size = int(round(image_size * 256 / 224))
    _checks.integer(resize_size, "resize_size")
    if resize_size < image_size:
        _checks.fail("resize_size", resize_size, f"at least image_size={image_size}")

    if training:

        def preprocess(image, seed):
            crop_seed, flip_seed, randaugment_seed = tf.unstack(ops.split_seed(seed, 3))
            image = ops.to_uint8(ops.inception_crop(image, image_size, seed=crop_seed))
            image = ops.random_flip(image, seed=flip_seed)
            if randaugment is not None:
                image = augment.randaugment(image, *randaugment, seed=randaugment_seed)
            return ops.normalize(image)

    else:

        def preprocess(image, seed):
            image = ops.to_uint8(ops.resize_small(image, resize_size))
            return ops.normalize(ops.central_crop(image, image_size))

    batch_fn = None
    if training and mixup_alpha > 0:

        def batch_fn(images, labels, seed):
            return augment.mixup(images, labels, float(mixup_alpha), seed=seed)
    return _batched(
        source,
        preprocess,
        training=training,
        batch_size=batch_size,
        shuffle_buffer=shuffle_buffer,
        repeat=repeat,
        cache=cache,
        seed=seed,
        batch_fn=batch_fn,
        pad_to_batch=pad_to_batch,
    )


def finetune_pipeline(
    source,
    *,
    training,
    batch_size,
    image_size=384,
    augmentation="inception_crop",
    flip=True,
    resize_size=None,
    shuffle_buffer=SHUFFLE_BUFFER,
    repeat=None,
    cache="auto",
    seed=None,
    batch_augmentation=None,
    pad_to_batch=False,
):
    """Fine-tuning batches at the target resolution.

    Training, by `augmentation`:
    - `"inception_crop"` (vit_jax's default): inception crop (area
      5-100 %) resized to `image_size`, then random flip.
    - `"resize_crop"` (the paper's, after BiT): resize to `resize_size`
      (448 for 384), random `image_size` crop, random flip.
    - `"resize"`: resize to `image_size`, random flip (no crop; VTAB tasks
      whose label a crop would change).
    Evaluation: resize to `image_size` (aspect ratio not kept), as vit_jax.
    Pixels stay float after the resize (no uint8 rounding), then
    `(x - 127.5) / 127.5`.

    Args:
        source: a `DataSource`.
        training: bool. Augmented, shuffled, repeated batches, or
            deterministic evaluation batches.
        batch_size: int. Training batches all have this size; the last
            evaluation batch may be smaller.
        image_size: int. Target side. Defaults to 384.
        augmentation: one of `"inception_crop"`, `"resize_crop"`,
            `"resize"`. Defaults to `"inception_crop"`.
        flip: bool. Random horizontal flip at training. Defaults to True.
        resize_size: int. `"resize_crop"` only: the side before the crop.
            Defaults to `image_size * 448 / 384` rounded.
        shuffle_buffer: int. Defaults to 50,000 (capped at the dataset size).
        repeat: bool. Defaults to `training`.
        cache: `"auto"`, True or False. Defaults to `"auto"` (as
            `pretrain_pipeline`).
        seed: optional int for the shuffle order (files and examples) and
            the augmentation's draws; None: TensorFlow's global seed
            (`keras.utils.set_random_seed`) decides.
        batch_augmentation: optional Keras preprocessing layer or list of
            them (`keras.layers.RandAugment`, `MixUp`, `CutMix`, ...), or
            their text (`augmentation_layers`: `"RandAugment,MixUp"`),
            applied in order to the training batches after the crop/flip
            and before the normalisation: they see float32 pixels in
            [0, 255], Keras' default `value_range`. Layers that transform
            labels (Keras' `transform_labels`, keras-cv's
            `augment_labels`) get and return `{"images", "labels"}` with
            the one-hot labels, so MixUp and CutMix mix them; others get
            the images. Layers must compute in float32 (pass
            `dtype="float32"` under a mixed dtype policy). Not part of the
            paper's set-up; None (the default)
            leaves the pipeline as it is. Ignored at evaluation.
        pad_to_batch: bool. Evaluation only: full `(images, labels,
            weights)` batches, the last padded with weight-0 rows, as in
            `pretrain_pipeline`. Defaults to False.

    Returns:
        A `tf.data.Dataset` of `(images, labels)`: float32
        `(B, image_size, image_size, 3)` in [-1, 1] and float32 one-hot
        `(B, num_classes)` (mixed by a label-mixing `batch_augmentation`);
        with `pad_to_batch`, `(images, labels, weights)`, weights float32
        `(batch_size,)`, 1 for real rows and 0 for padding.
    """
    _check_common(source, training, batch_size, image_size, cache, pad_to_batch, seed)
    _checks.one_of(augmentation, "augmentation", FINETUNE_AUGMENTATIONS)
    _checks.boolean(flip, "flip")
    if resize_size is None:
        resize_size = int(round(image_size * 448 / 384))
    _checks.integer(resize_size, "resize_size")
    if augmentation == "resize_crop" and resize_size < image_size:
        _checks.fail("resize_size", resize_size, f"at least image_size={image_size}")
    layers = _batch_augmentation_layers(batch_augmentation)
    batch_fn = None

    if training:

        def preprocess(image, seed):
            crop_seed, flip_seed = tf.unstack(ops.split_seed(seed, 2))
            if augmentation == "inception_crop":
                image = ops.inception_crop(image, image_size, seed=crop_seed)
            elif augmentation == "resize_crop":
                image = ops.random_crop(ops.resize(image, resize_size), image_size, seed=crop_seed)
            else:
                image = ops.resize(image, image_size)
            if flip:
                image = ops.random_flip(image, seed=flip_seed)
            # With batch augmentation the pixels stay in [0, 255] until the
            # layers have run on the batch.
            return image if layers else ops.normalize(image)

        if layers:

            def batch_fn(images, labels, seed):  # Keras layers draw from their own seed generators
                images, labels = _augment_batch(layers, images, labels)
                return ops.normalize(images), labels

    else:

        def preprocess(image, seed):
            return ops.normalize(ops.resize(image, image_size))

    try:
        return _batched(
            source,
            preprocess,
            training=training,
            batch_size=batch_size,
            shuffle_buffer=shuffle_buffer,
            repeat=repeat,
            cache=cache,
            seed=seed,
            batch_fn=batch_fn,
            pad_to_batch=pad_to_batch,
        )
    except (AttributeError, TypeError, tf.errors.OpError) as error:
        # A layer whose traced call tf.data cannot take (e.g. an unadapted
        # `Normalization` leaks graph tensors), found as the map is built.
        if not layers:
            raise
        names = [getattr(layer, "name", type(layer).__name__) for layer in layers]
        raise ValueError(
            f"`batch_augmentation` layers {names} cannot run on batches in tf.data "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). "
            f"Received: batch_augmentation={batch_augmentation!r}"
        ) from error


def augmentation_layers(text):
    """Keras preprocessing layers from their text, as a config or a command
    line gives them (the recipes' `--batch_augmentation`).

    Args:
        text: comma-separated `keras.layers` class names, each built with
            its defaults (`"RandAugment,MixUp"`), or a JSON list of
            layers with their constructor arguments (`'[{"class_name":
            "MixUp", "config": {"alpha": 0.5}}]'`; an entry with a
            `"module"`, e.g. a registered custom layer, is a serialized
            layer, deserialized as Keras does).

    Returns:
        A list of layers, computing in float32 whatever the dtype policy
        (the pipelines' pixels are float32).

    Raises:
        ValueError: naming `batch_augmentation` and the text, for a JSON
            error, an unknown class or a bad config.
    """
    import keras

    def fail(problem):
        raise ValueError(f"`batch_augmentation` {problem}. Received: batch_augmentation={text!r}")

    if not isinstance(text, str):
        fail("must be a string: layer names or a JSON list")
    if text.lstrip().startswith("["):
        try:
            specs = json.loads(text)
        except json.JSONDecodeError as error:
            fail(f"is not a JSON list ({error})")
    else:
        specs = [{"class_name": name.strip()} for name in text.split(",") if name.strip()]
    if not isinstance(specs, list) or not specs:
        fail("names no layer")
    layers = []
    for spec in specs:
        if not (isinstance(spec, dict) and isinstance(spec.get("class_name"), str)):
            fail(f'entries must be {{"class_name": ..., "config": {{...}}}}, not {json.dumps(spec)}')
        name, cls = spec["class_name"], getattr(keras.layers, spec["class_name"], None)
        if "module" not in spec and not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
            fail(f"names an unknown Keras layer {name!r} (a class of keras.layers, e.g. RandAugment, MixUp, CutMix)")
        try:
            if "module" in spec:
                layers.append(keras.saving.deserialize_keras_object(spec))
                continue
            config = {"dtype": "float32", **(spec.get("config") or {})}
            layer = cls(**config)
            if getattr(layer, "data_format", None) == "channels_first" and "data_format" not in config:
                # The batches are NHWC, whatever keras.config.image_data_format() says.
                layer = cls(**config, data_format="channels_last")
            layers.append(layer)
        except (TypeError, ValueError) as error:
            fail(f"cannot build {name!r} ({error})")
    return layers


def _batch_augmentation_layers(batch_augmentation):
    """`batch_augmentation` as a tuple of callables (empty for None)."""
    if batch_augmentation is None:
        return ()
    if isinstance(batch_augmentation, str):
        batch_augmentation = augmentation_layers(batch_augmentation)
    layers = (
        tuple(batch_augmentation) if isinstance(batch_augmentation, (list, tuple)) else (batch_augmentation,)
    )
    for layer in layers:
        if not callable(layer):
            raise ValueError(
                "`batch_augmentation` must be None, a Keras preprocessing layer or a list of them. "
                f"Received: batch_augmentation={batch_augmentation!r}"
            )
        if getattr(layer, "data_format", "channels_last") != "channels_last":
            raise ValueError(
                f"`batch_augmentation` layer {getattr(layer, 'name', type(layer).__name__)!r} reads "
                f"data_format={layer.data_format!r}; the batches are (batch, height, width, channels): build it "
                "with data_format='channels_last'."
            )
        # A layer built under a mixed dtype policy would round the [0, 255]
        # pixels to bfloat16/float16 (MixUp fails outright).
        compute_dtype = getattr(layer, "compute_dtype", "float32")
        if compute_dtype != "float32":
            raise ValueError(
                f"`batch_augmentation` layer {getattr(layer, 'name', type(layer).__name__)!r} computes in "
                f"{compute_dtype} (a mixed dtype policy); build it with dtype='float32'."
            )
    return layers


def _augment_batch(layers, images, labels):
    """Runs `layers` on a batch; Keras layers use TensorFlow ops in tf.data."""
    for layer in layers:
        # Keras 3 preprocessing layers (and keras-cv's) take a dict and
        # transform the labels along with the images (MixUp, CutMix).
        with_labels = hasattr(layer, "transform_labels") or hasattr(layer, "augment_labels")
        name = getattr(layer, "name", type(layer).__name__)
        try:
            output = layer({"images": images, "labels": labels} if with_labels else images)
        except Exception as error:  # traced when the pipeline is built: said there, naming the layer
            raise ValueError(
                f"`batch_augmentation` layer {name!r} ({type(layer).__name__}) cannot run on a batch of "
                f"images {images.shape} in [0, 255] in tf.data: {type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}"
            ) from error
        if isinstance(output, dict) and "images" in output:
            new_images, new_labels = output["images"], output.get("labels", labels)
        else:
            new_images, new_labels = output, labels
        if not (tf.is_tensor(new_images) and tf.is_tensor(new_labels)):
            raise ValueError(
                f"`batch_augmentation` layer {name!r} ({type(layer).__name__}) must return images or a dict "
                f"with 'images' (and 'labels'). Received: {type(output).__name__}"
            )
        if not (new_images.shape.is_compatible_with(images.shape)
                and new_labels.shape.is_compatible_with(labels.shape)):
            raise ValueError(
                f"`batch_augmentation` layer {name!r} ({type(layer).__name__}) changed the batch shapes: "
                f"images {images.shape} -> {new_images.shape}, labels {labels.shape} -> {new_labels.shape}"
            )
        images, labels = tf.cast(new_images, tf.float32), tf.cast(new_labels, tf.float32)
    return images, labels
