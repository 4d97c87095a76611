"""The training data of a run, from its config: a tfds dataset, an image
folder, a VTAB task (`vtab:<task>`) or, for masked patch prediction,
synthetic images; and `--smoke`'s stand-ins.

The batches come from the library's pipelines (`keras_vit.data`);
evaluation batches are padded to full weighted batches (`pad_to_batch`).
"""

import collections
import contextlib
import os
import re

from recipes import checks
from recipes.cli import RecipeError
from recipes.cli import one_line
from recipes.configs import AUGREG
from recipes.configs import VTAB_PREFIX
from recipes.configs import MppConfig

# `train(micro_batch)`: repeating training batches; `eval(batch, cache=...)`:
# one padded pass, or None; `num_classes`: None for images without labels.
Data = collections.namedtuple(
    "Data", "train eval num_classes input_shape train_examples line description eval_label")


# A tfds name, with its config and version (`eurosat/rgb:2.*.*`).
_TFDS_NAME = re.compile(r"^[a-z][a-z0-9_]*(/[a-z0-9_.]+)?(:[0-9.*]+)?$")


def _is_folder(dataset):
    if os.path.isdir(os.path.expanduser(dataset)) or dataset.startswith((".", "~", "gs://", os.sep)):
        return True
    # `name/config` is a tfds name, unless `name` is a folder here.
    return "/" in dataset and (not _TFDS_NAME.match(dataset) or os.path.isdir(dataset.split("/")[0]))


def load_source(config, split, class_names=None):
    """A `keras_vit.data.DataSource` for one split of `config.dataset`: a
    tfds dataset (any split string) or `<folder>/<split>/<class>/<image>`;
    `class_names`, the training split's, for an evaluation folder."""
    from keras_vit import data

    dataset = config.dataset
    if _is_folder(dataset):
        folder = os.path.join(os.path.expanduser(dataset), split)
        if not dataset.startswith("gs://") and not os.path.isdir(folder):
            raise RecipeError(f"no folder {folder} (--dataset={dataset}, split {split!r}).")
        try:
            return data.from_directory(folder, class_names=class_names, skip_bad_images=config.skip_bad_images)
        except ValueError as error:
            raise RecipeError(f"--dataset={dataset}: {as_flags(error)}") from None
    try:
        return data.from_tfds(dataset, split, data_dir=config.data_dir, download=config.download,
                              manual_dir=config.manual_dir)
    except data.DatasetNotAvailableError as error:
        raise RecipeError(as_flags(error)) from None
    except ValueError as error:  # an unknown name, a bad split
        raise RecipeError(f"--dataset={dataset}, split {split!r}: {one_line(error, details=0)} (a folder? "
                          f"there is none at {os.path.abspath(dataset)})") from None


# The library's advice names its arguments (`skip_bad_images=True`); a
# recipe's user passes flags.
_ADVICE = re.compile(r"(?<![-\w])(download|manual_dir|skip_bad_images)=(True\b)?")


def as_flags(error):
    """The library's message with its arguments as the recipes' flags."""
    return _ADVICE.sub(lambda m: f"--{m.group(1)}=" + ("true" if m.group(2) else ""), str(error))


def _describe(label, split, source):
    size = f"{source.num_examples:,} examples" if source.num_examples else "size unknown"
    skipped = f", {len(source.skipped)} unreadable files skipped" if source.skipped else ""
    return f"{label} {split!r} ({size}, {source.num_classes} classes{skipped})"


def load_data(config, run_dir):
    """The run's `Data`."""
    from keras_vit import data
    from keras_vit.data import testing
    from keras_vit.data import vtab

    if not config.dataset:
        raise RecipeError(
            "this config needs a dataset: a tfds name or a folder with one sub-folder per split (e.g. train/ and "
            f"val/), each holding one sub-folder of images per class. Pass --dataset=... Received: "
            f"--dataset={config.dataset}")
    cache, seed = checks.auto_bool(config, "cache"), config.seed
    training = dict(training=True, shuffle_buffer=config.shuffle_buffer, seed=seed)
    if isinstance(config, MppConfig):
        height, width = config.image_size[0], config.image_size[-1]
        shape = (height, width, 3)
        if config.dataset == "synthetic":
            cycle = config.synthetic_batches or config.log_every * config.accum_steps
            testing.write_sample_images(os.path.join(run_dir, "samples"), 8, height, width, seed)
            return Data(lambda b: testing.SyntheticImages(b, cycle, height, width, seed,
                                                          fresh=not config.synthetic_batches),
                        None, None, shape, None, f"  data: synthetic colour fields, {height}x{width} px", {}, None)
        source = load_source(config, config.train_split)
        # Images only, through the paper's pre-training crops.
        return Data(lambda b: data.pretrain_pipeline(source, batch_size=b, image_size=height, cache=cache, **training).map(
            lambda images, labels: images), None, None, shape, source.num_examples,
            "  data: " + _describe("train", config.train_split, source), {}, None)

    size, test_split = config.image_size, config.test_split
    if config.dataset.startswith(VTAB_PREFIX):
        try:
            task = vtab.get_task(config.dataset[len(VTAB_PREFIX):])
        except ValueError as error:
            raise RecipeError(f"--dataset={config.dataset}: {error}") from None
        common = dict(image_size=size, data_dir=config.data_dir, download=config.download,
                      manual_dir=config.manual_dir)
        return Data(
            _train_batches(config, lambda b: vtab.vtab_pipeline(
                task, config.train_split, batch_size=b, augmentation=config.augmentation, flip=config.flip,
                batch_augmentation=config.batch_augmentation, cache=cache, **training, **common)),
            (lambda b, cache=cache: vtab.vtab_pipeline(task, test_split, batch_size=b, training=False,
                                                          pad_to_batch=True, cache=cache, **common))
            if test_split else None,
            task.num_classes, (size, size, 3), None,
            f"  data: VTAB {task.name}, train {config.train_split!r}, evaluation {test_split!r}",
            dict(num_classes=task.num_classes, train_split=config.train_split, eval_split=test_split),
            f"{task.name} {test_split}")
    train_source = load_source(config, config.train_split)
    if train_source.num_classes < 2:  # every label the same: a loss of 0, an accuracy of 1, nothing learnt
        raise RecipeError(f"a classifier needs two classes or more; {config.train_split!r} has "
                          f"{train_source.num_classes}. Received: --dataset={config.dataset}")
    eval_source = load_source(config, test_split, class_names=train_source.class_names) if test_split else None
    if eval_source is not None and eval_source.num_classes != train_source.num_classes:
        raise RecipeError(
            f"the splits have different class counts ({train_source.num_classes} in {config.train_split!r}, "
            f"{eval_source.num_classes} in {test_split!r}). Received: --dataset={config.dataset}")
    # big_vision's pre-training crops; other crops (small images) take the
    # fine-tuning pipeline's.
    if config.pipeline == "pretrain" and config.augmentation == "inception_crop":
        randaugment, mixup_alpha = AUGREG[config.augreg]
        pipeline = data.pretrain_pipeline
        augment = dict(randaugment=randaugment, mixup_alpha=mixup_alpha)
    else:
        pipeline = data.finetune_pipeline
        augment = dict(augmentation=config.augmentation, flip=config.flip,
                       batch_augmentation=config.batch_augmentation)

    def eval_batches(batch_size, cache=cache):
        return pipeline(eval_source, training=False, batch_size=batch_size, image_size=size, cache=cache,
                        pad_to_batch=True)

    parts = [_describe("train", config.train_split, train_source)]
    if eval_source is not None:
        parts.append(_describe("evaluation", test_split, eval_source))
    train_batches = _train_batches(config, lambda b: pipeline(
        train_source, batch_size=b, image_size=size, cache=cache, **augment, **training))
    return Data(train_batches, eval_batches if eval_source is not None else None, train_source.num_classes,
                (size, size, 3), train_source.num_examples, "  data: " + ", ".join(parts),
                dict(num_classes=train_source.num_classes, train_split=config.train_split, eval_split=test_split,
                     train_examples=train_source.num_examples), repr(test_split))


def read_first_batch(batches, flag, value):
    """Reads the first example of `batches` now, so that a bad one (tfds'
    label -1 of a split without labels) ends the run before its training,
    not after."""
    import tensorflow as tf

    from keras_vit.data import ops

    try:  # uncached: a cache read in part is discarded with a warning
        next(iter(batches(1, cache=False).take(1)))
    except tf.errors.OpError as error:
        raise RecipeError(f"--{flag}={value}: {ops.op_error_message(error)}") from None


def _train_batches(config, pipeline):
    """`pipeline(batch_size)`, a `--batch_augmentation` layer that cannot
    run there (found as the pipeline is built) an `error:` line."""
    def train_batches(batch_size):
        try:
            return pipeline(batch_size)
        except ValueError as error:
            if "batch_augmentation" not in str(error):
                raise
            raise RecipeError(f"--batch_augmentation={config.batch_augmentation}: {error}") from None

    return train_batches


@contextlib.contextmanager
def smoke_mode(config, smoke):
    """`--smoke`: on JAX, XLA without its optimisation passes (they cost
    more than they save on tiny models); a tfds dataset replaced by
    generated examples (`keras_vit.data.testing.mock_tfds`)."""
    if not smoke:
        yield
        return
    import keras

    jax_config = None
    if keras.backend.backend() == "jax":
        import jax

        jax_config, before = jax.config, jax.config.read("jax_disable_most_optimizations")
        jax_config.update("jax_disable_most_optimizations", True)
    try:
        if config.dataset and _is_folder(config.dataset):
            yield
            return
        from keras_vit.data import testing

        with testing.mock_tfds() as manual_dir:
            previous = config.manual_dir
            config.manual_dir = previous or manual_dir
            try:
                yield
            finally:
                config.manual_dir = previous
    finally:
        if jax_config is not None:
            jax_config.update("jax_disable_most_optimizations", before)
