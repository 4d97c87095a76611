"""The 19 tasks of VTAB-1k, as the ViT paper evaluated them.

One table (`TASKS`, in the order of the paper's Table 9), one row per task,
with the definitions of google-research/task_adaptation (`data/*.py`): the
tfds builder and version, the class count, the split strings of the VTAB-1k
protocol (`train800`, `val200`, `train800val200`, `test`, the offsets computed
from the tfds split sizes), the label and image transforms, BiT's rules that
switch random flip / random crop off where they would change the label, the
group (natural / specialized / structured) and the paper's Table 9 numbers.

```python
from keras_vit.data import vtab
task = vtab.get_task("Clevr-Dist")
train = vtab.vtab_pipeline(task, "train800val200", batch_size=512)  # 384 px
test = vtab.vtab_pipeline(task, "test", batch_size=512)
```

Out-of-range inputs. The original maps values that the real data never
holds to odd labels (a Clevr depth above 100 gives label 6 of a 6-class
task, a KITTI vehicle beyond 999 m counts as "no vehicle", a Clevr scene
without objects gets 6). keras_vit never clips or guesses: such an example
raises `tf.errors.InvalidArgumentError` naming the task and the valid range,
when it is read. The checked ranges are: Clevr-Count 3-10 objects;
Clevr-Dist at least one object, closest depth in (0, 100]; KITTI-Dist every
vehicle depth in (-100, 999] m; dSprites position < 32, orientation < 40;
every produced label in `[0, num_classes)`. dSprites pixels are 0/1 and are
multiplied by 255 in uint8, as in the original.
"""

import dataclasses
import math
import warnings
from typing import Callable, Mapping, Optional, Tuple

import tensorflow as tf

from keras_vit.data import _checks
from keras_vit.data import ops
from keras_vit.data import pipelines
from keras_vit.data import sources

SPLITS = ("train800", "val200", "train800val200", "test")
GROUPS = ("natural", "specialized", "structured")
TRAIN_SPLITS = ("train800", "train800val200")
# VTAB-1k sizes of the fixed splits.
SPLIT_SIZES = {"train800": 800, "val200": 200, "train800val200": 1000}

# The paper's Table 9 (VTAB-1k accuracy, %), one column per model.
PAPER_MODELS = ("ViT-H/14 (JFT)", "ViT-L/16 (JFT)", "ViT-L/16 (I21k)")
# The paper's "Mean" column: the mean over the 19 tasks.
PAPER_MEANS = {"ViT-H/14 (JFT)": 77.6, "ViT-L/16 (JFT)": 76.3, "ViT-L/16 (I21k)": 72.7}


# ---------------------------------------------------------------------------
# Label and image transforms (task_adaptation `data/<dataset>.py`).
# ---------------------------------------------------------------------------


def _bin(value, thresholds):
    """Largest i with thresholds[i] < value (strict, as the original's
    `reduce_max(where(thrs - value < 0))`): a value equal to a threshold falls
    in the lower bin. Thresholds ascending; `value` above the first."""
    thresholds = tf.constant(thresholds, tf.float32)
    below = tf.cast(thresholds < tf.cast(value, tf.float32), tf.int64)
    return tf.reduce_sum(below) - 1


# task_adaptation clevr.py: "closest_object_distance" thresholds on the depth
# (pixel_coords[:, 2]) of the closest object.
CLEVR_DISTANCE_THRESHOLDS = (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0)
# task_adaptation kitti.py: "closest_vehicle_distance"; 1000 m stands for "no
# vehicle" and lands in the last bin.
KITTI_DISTANCE_THRESHOLDS = (-100.0, 8.0, 20.0, 999.0)
KITTI_NO_VEHICLE_DISTANCE = 1000.0
# KITTI object types below 3 are vehicles: Car, Van, Truck.
KITTI_VEHICLE_TYPES = 3


def clevr_count_label(objects):
    """Clevr-Count: number of objects - 3 (scenes hold 3 to 10 objects).

    Args:
        objects: the tfds `objects` dict of a CLEVR example.
    """
    count = tf.cast(tf.size(objects["size"]), tf.int64)
    return ops.checked(
        count - 3,
        (count >= 3) & (count <= 10),
        "Clevr-Count: a CLEVR scene holds 3 to 10 objects; got",
        count,
    )


def clevr_distance_label(objects):
    """Clevr-Dist: bin of the depth of the closest object, 6 classes.

    Bins (0, 8], (8, 8.5], (8.5, 9], (9, 9.5], (9.5, 10], (10, 100].
    """
    depth = objects["pixel_coords"][:, 2]
    closest = tf.reduce_min(depth)  # +inf for a scene without objects.
    return ops.checked(
        _bin(closest, CLEVR_DISTANCE_THRESHOLDS),
        (tf.size(depth) > 0) & (closest > 0.0) & (closest <= 100.0),
        "Clevr-Dist: a scene needs objects, the closest at a depth in (0, 100]; "
        "got closest depth (inf: no object)",
        closest,
    )


def kitti_distance_label(objects):
    """KITTI-Dist: bin of the depth of the closest vehicle, 4 classes.

    Vehicles are objects of type Car, Van or Truck (type < 3); depth is
    `location[:, 2]` in metres. Bins (-100, 8], (8, 20], (20, 999] and "no
    vehicle" (3).
    """
    depth = objects["location"][:, 2]
    vehicle_depth = tf.boolean_mask(depth, objects["type"] < KITTI_VEHICLE_TYPES)
    closest = tf.reduce_min(tf.concat([vehicle_depth, [KITTI_NO_VEHICLE_DISTANCE]], 0))
    in_range = tf.reduce_all((vehicle_depth > -100.0) & (vehicle_depth <= 999.0))
    return ops.checked(
        _bin(closest, KITTI_DISTANCE_THRESHOLDS),
        in_range,
        "KITTI-Dist: vehicle depths must be in (-100, 999] m; got",
        vehicle_depth,
    )


def dsprites_label(value, num_original_classes, num_classes=16):
    """dSprites: `floor(value / (num_original_classes / num_classes))`.

    Position: 32 values -> 16 bins of 2. Orientation: 40 values -> 16 bins of
    2.5, so the bins hold 3, 2, 3, 2, ... values (computed in float32, as the
    original).
    """
    value = tf.cast(value, tf.int64)
    factor = float(num_original_classes) / num_classes
    label = tf.cast(tf.math.floordiv(tf.cast(value, tf.float32), factor), tf.int64)
    return ops.checked(
        label,
        (value >= 0) & (value < num_original_classes),
        f"dSprites: the attribute takes values 0 to {num_original_classes - 1}; got",
        value,
    )


def _decode_rgb(image):
    return ops.decode_image(image, channels=3)


def _decode_grey_tiled(image):
    """Grey-scale (H, W, 1) tiled to 3 channels, values unchanged (sNORB)."""
    if image.dtype == tf.string:
        image = tf.io.decode_image(image, channels=1, expand_animations=False)
        image.set_shape([None, None, 1])
    return tf.tile(image, [1, 1, 3])


def _decode_dsprites(image):
    """dSprites' 0/1 pixels tiled to 3 channels and multiplied by 255 (uint8)."""
    return _decode_grey_tiled(image) * tf.constant(255, tf.uint8)


def _label(key):
    return lambda example: tf.cast(example[key], tf.int64)


def _dsprites(key, num_original_classes):
    return lambda example: dsprites_label(example[key], num_original_classes)


# ---------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VtabTask:
    """One VTAB-1k task.

    Args:
        key: short identifier (`"clevr_distance"`).
        name: the paper's name (`"Clevr-Dist"`, Table 9).
        group: `"natural"`, `"specialized"` or `"structured"`.
        registry: task_adaptation's registry string.
        tfds_name: tfds builder, config and version that is loaded.
        num_classes: int.
        split_rule: how the splits are cut (see `split_strings`).
        train_size: catalog size of the tfds `train` split that the offsets
            come from, or None when no offset is computed.
        label: the label definition, in words.
        image: the image transform, in words.
        random_flip: bool. False where BiT switches random flips off.
        random_crop: bool. False where BiT switches random crops off.
        paper: Table 9 accuracy (%) per model of `PAPER_MODELS`.
        manual_download: instructions when tfds cannot download it, or None.
        note: remarks (version differences).
        label_fn: example dict -> int64 label.
        decode: image (bytes or pixels) -> uint8 RGB.
    """

    key: str
    name: str
    group: str
    registry: str
    tfds_name: str
    num_classes: int
    split_rule: Tuple
    train_size: Optional[int]
    label: str
    image: str
    random_flip: bool
    random_crop: bool
    paper: Mapping[str, float]
    manual_download: Optional[str] = None
    note: str = ""
    label_fn: Callable = dataclasses.field(default=_label("label"), repr=False)
    decode: Callable = dataclasses.field(default=_decode_rgb, repr=False)

    def split_strings(self, train_size=None):
        """The four tfds split strings; offsets from `train_size` (the size of
        the tfds `train` split), defaulting to the catalog size."""
        return _split_strings(self.split_rule, train_size or self.train_size)

    @property
    def splits(self):
        """`{"train800": ..., "val200": ..., "train800val200": ..., "test": ...}`
        with the catalog sizes."""
        return self.split_strings()


def _split_strings(rule, train_size):
    """The VTAB-1k split strings of task_adaptation.

    Rules (`a = train_size * percent // 100`, as the original's integer
    arithmetic):
    - `("from_train", percent, test)`: val200 = `train[a:a+200]`, test as given.
    - `("validation",)`: val200 = `validation[:200]`, test = `test`.
    - `("from_train_3way", train_percent, val_percent)`: val200 =
      `train[a:a+200]`, test = `train[a+b:]` (b from `val_percent`).
    - `("half_test",)`: val200 = `test[:200]`, test = `test[50%:]` (sNORB).
    """
    kind = rule[0]
    if kind == "from_train":
        start = rule[1] * train_size // 100
        val, test = f"train[{start}:{start + 200}]", rule[2]
    elif kind == "validation":
        val, test = "validation[:200]", "test"
    elif kind == "from_train_3way":
        start = train_size * rule[1] // 100
        end = start + train_size * rule[2] // 100
        val, test = f"train[{start}:{start + 200}]", f"train[{end}:]"
    elif kind == "half_test":
        val, test = "test[:200]", "test[50%:]"
    else:  # pragma: no cover - the table only uses the rules above.
        raise ValueError(f"Unknown split rule. Received: rule={rule!r}")
    train = "train[:800]"
    return {"train800": train, "val200": val, "train800val200": f"{train}+{val}", "test": test}


RESISC45_INSTRUCTIONS = (
    "Resisc45 (NWPU-RESISC45) cannot be downloaded by tensorflow-datasets. "
    "Download NWPU-RESISC45.rar from the authors' OneDrive "
    "(https://1drv.ms/u/s!AmgKYzARBl5ca3HNaHIlzp_IXjs, linked from "
    "https://www.tensorflow.org/datasets/catalog/resisc45) and extract it in "
    "the manual directory, so that it holds NWPU-RESISC45/<class>/<image>.jpg."
)
RETINOPATHY_INSTRUCTIONS = (
    "Diabetic Retinopathy comes from the Kaggle competition "
    "'diabetic-retinopathy-detection' (https://www.kaggle.com/c/"
    "diabetic-retinopathy-detection/data; accept its rules, then e.g. "
    "`kaggle competitions download -c diabetic-retinopathy-detection`). "
    "Unpack into the manual directory: the train.zip.* parts into train/, "
    "the test.zip.* parts into test/, sample.zip into sample/, and "
    "trainLabels.csv. Preparing the btgraham-300 config needs opencv-python "
    "and network access for the test labels (retinopathy_solution.csv)."
)


def _paper(h14, l16, l16_i21k):
    return dict(zip(PAPER_MODELS, (h14, l16, l16_i21k)))


_AS_IS = "label as is"
_RGB = "RGB as is"

TASKS = (
    # --- natural ---
    VtabTask("caltech101", "Caltech101", "natural", "caltech101", "caltech101:3.*.*", 102,
             ("from_train", 90, "test"), 3060, _AS_IS, _RGB, True, True, _paper(95.3, 95.4, 90.8)),
    VtabTask("cifar100", "CIFAR-100", "natural", "cifar(num_classes=100)", "cifar100:3.*.*", 100,
             ("from_train", 90, "test"), 50000, _AS_IS, _RGB, True, True, _paper(85.5, 81.9, 84.1)),
    VtabTask("dtd", "DTD", "natural", "dtd", "dtd:3.*.*", 47,
             ("validation",), None, _AS_IS, _RGB, True, True, _paper(75.2, 74.3, 74.1)),
    VtabTask("flowers102", "Flowers102", "natural", "oxford_flowers102", "oxford_flowers102:2.*.*", 102,
             ("validation",), None, _AS_IS, _RGB, True, True, _paper(99.7, 99.7, 99.3)),
    VtabTask("pets", "Pets", "natural", "oxford_iiit_pet", "oxford_iiit_pet:4.*.*", 37,
             ("from_train", 80, "test"), 3680, _AS_IS, _RGB, True, True, _paper(97.2, 96.7, 92.7),
             note="task_adaptation pins oxford_iiit_pet:3.*.*, which tensorflow-datasets "
                  "4.9 no longer builds; 4.0.0 has the same 3,680 training images and labels."),
    VtabTask("sun397", "Sun397", "natural", "sun397", "sun397/tfds:4.*.*", 397,
             ("validation",), None, _AS_IS, _RGB, True, True, _paper(65.0, 63.5, 61.0)),
    VtabTask("svhn", "SVHN", "natural", "svhn", "svhn_cropped:3.*.*", 10,
             ("from_train", 90, "test"), 73257, _AS_IS, _RGB, True, True, _paper(88.9, 87.4, 80.9)),
    # --- specialized ---
    VtabTask("camelyon", "Camelyon", "specialized", "patch_camelyon", "patch_camelyon:2.*.*", 2,
             ("validation",), None, _AS_IS, _RGB, True, True, _paper(83.3, 83.6, 82.5)),
    VtabTask("eurosat", "EuroSAT", "specialized", "eurosat(subset=\"rgb\")", "eurosat/rgb:2.*.*", 10,
             ("from_train_3way", 60, 20), 27000, _AS_IS, _RGB, True, True, _paper(96.7, 96.5, 95.6)),
    VtabTask("resisc45", "Resisc45", "specialized", "resisc45", "resisc45:3.*.*", 45,
             ("from_train_3way", 60, 20), 31500, _AS_IS, _RGB, True, True, _paper(91.4, 89.7, 85.2),
             manual_download=RESISC45_INSTRUCTIONS),
    VtabTask("retinopathy", "Retinopathy", "specialized",
             "diabetic_retinopathy(config=\"btgraham-300\")",
             "diabetic_retinopathy_detection/btgraham-300:3.*.*", 5,
             ("validation",), None, _AS_IS, _RGB, True, True, _paper(76.6, 77.1, 75.3),
             manual_download=RETINOPATHY_INSTRUCTIONS,
             note="task_adaptation's optional heavy augmentation is off by default and "
                  "not provided."),
    # --- structured ---
    VtabTask("clevr_count", "Clevr-Count", "structured", "clevr(task=\"count_all\")", "clevr:3.*.*", 8,
             ("from_train", 90, "validation"), 70000, "number of objects - 3", _RGB,
             True, False, _paper(91.7, 86.4, 70.3),
             label_fn=lambda ex: clevr_count_label(ex["objects"]),
             note="The test split reads `validation`: CLEVR's test split has no labels."),
    VtabTask("clevr_distance", "Clevr-Dist", "structured",
             "clevr(task=\"closest_object_distance\")", "clevr:3.*.*", 6,
             ("from_train", 90, "validation"), 70000,
             "closest depth in bins (0,8], (8,8.5], (8.5,9], (9,9.5], (9.5,10], (10,100]", _RGB,
             True, False, _paper(63.8, 63.1, 56.1),
             label_fn=lambda ex: clevr_distance_label(ex["objects"]),
             note="The test split reads `validation`: CLEVR's test split has no labels."),
    VtabTask("dmlab", "DMLab", "structured", "dmlab", "dmlab:2.0.1", 6,
             ("validation",), None, _AS_IS, _RGB, True, False, _paper(53.1, 49.7, 41.9)),
    VtabTask("dsprites_location", "dSpr-Loc", "structured",
             "dsprites(predicted_attribute=\"label_x_position\",num_classes=16)", "dsprites:2.*.*", 16,
             ("from_train_3way", 80, 10), 737280, "floor(x_position / 2): 32 -> 16",
             "grey 0/1 tiled to RGB, x255", False, False, _paper(79.4, 74.5, 74.7),
             label_fn=_dsprites("label_x_position", 32), decode=_decode_dsprites),
    VtabTask("dsprites_orientation", "dSpr-Ori", "structured",
             "dsprites(predicted_attribute=\"label_orientation\",num_classes=16)", "dsprites:2.*.*", 16,
             ("from_train_3way", 80, 10), 737280, "floor(orientation / 2.5): 40 -> 16",
             "grey 0/1 tiled to RGB, x255", False, True, _paper(63.3, 60.5, 64.9),
             label_fn=_dsprites("label_orientation", 40), decode=_decode_dsprites),
    VtabTask("kitti_distance", "KITTI-Dist", "structured",
             "kitti(task=\"closest_vehicle_distance\")", "kitti:3.1.0", 4,
             ("validation",), None,
             "closest vehicle depth in bins (-100,8], (8,20], (20,999] m, or no vehicle", _RGB,
             True, False, _paper(84.5, 82.2, 79.9),
             label_fn=lambda ex: kitti_distance_label(ex["objects"])),
    VtabTask("smallnorb_azimuth", "sNORB-Azim", "structured",
             "smallnorb(predicted_attribute=\"label_azimuth\")", "smallnorb:2.*.*", 18,
             ("half_test",), None, "label_azimuth",
             "first of the two grey images, tiled to RGB", False, True, _paper(33.2, 36.2, 30.5),
             label_fn=_label("label_azimuth"), decode=_decode_grey_tiled),
    VtabTask("smallnorb_elevation", "sNORB-Elev", "structured",
             "smallnorb(predicted_attribute=\"label_elevation\")", "smallnorb:2.*.*", 9,
             ("half_test",), None, "label_elevation",
             "first of the two grey images, tiled to RGB", True, True, _paper(51.2, 51.1, 41.7),
             label_fn=_label("label_elevation"), decode=_decode_grey_tiled),
)

_BY_NAME = {}
for _task in TASKS:
    _BY_NAME[_task.key] = _task
    _BY_NAME[_task.name.lower()] = _task


def get_task(task):
    """A `VtabTask` by key (`"clevr_distance"`) or paper name
    (`"Clevr-Dist"`, case-insensitive); a `VtabTask` is returned as is."""
    if isinstance(task, VtabTask):
        return task
    found = _BY_NAME.get(task.lower()) if isinstance(task, str) else None
    if found is None:
        raise ValueError(
            f"Unknown VTAB task; expected one of {[t.key for t in TASKS]} or "
            f"{[t.name for t in TASKS]}. Received: task={task!r}"
        )
    return found


def tasks_in_group(group):
    """The tasks of one group, in table order."""
    _checks.one_of(group, "group", GROUPS)
    return tuple(t for t in TASKS if t.group == group)


def _prepared_train_size(builder):
    try:
        size = builder.info.splits["train"].num_examples
    except Exception:  # Not prepared (mocked data): use the catalog size.
        return None
    return int(size) or None


def load_task(task, split, *, data_dir=None, download=True, manual_dir=None, train_size=None):
    """The examples of one task and split, labels transformed.

    Args:
        task: a `VtabTask`, its key or its paper name.
        split: one of `"train800"`, `"val200"`, `"train800val200"`,
            `"test"`.
        data_dir: tfds data directory. Defaults to tfds' own.
        download: bool. Download and prepare the dataset when missing.
            Defaults to True. With False a missing dataset raises
            `DatasetNotAvailableError` without network access.
        manual_dir: where manual-download files are (Resisc45,
            Retinopathy). Defaults to `<data_dir>/downloads/manual`.
        train_size: size of the tfds `train` split for the offsets.
            Defaults to the prepared dataset's (as task_adaptation), else the
            catalog size in the table.

    Returns:
        A `keras_vit.data.DataSource` (images still encoded; its `decode`
        applies the task's image transform).
    """
    task = get_task(task)
    _checks.one_of(split, "split", SPLITS)
    builder = sources.tfds_builder(
        task.tfds_name,
        data_dir=data_dir,
        download=download,
        manual_dir=manual_dir,
        instructions=task.manual_download,
    )
    if train_size is None and task.train_size is not None:
        train_size = _prepared_train_size(builder)
        if train_size is not None and train_size != task.train_size:
            warnings.warn(
                f"{task.name}: the prepared tfds train split has {train_size} "
                f"examples, the catalog {task.train_size}; the split offsets "
                "follow the prepared data, as task_adaptation does.",
                stacklevel=2,
            )
    split_string = task.split_strings(train_size)[split]
    import tensorflow_datasets as tfds

    # Images stay encoded (cached as bytes); unused ones (sNORB's second
    # camera) are never decoded.
    decoders = {
        key: tfds.decode.SkipDecoding()
        for key, feature in builder.info.features.items()
        if isinstance(feature, tfds.features.Image)
    }
    read = sources.tfds_reader(builder, split_string, decoders)
    num_classes = task.num_classes

    @tf.autograph.experimental.do_not_convert
    def select(example):
        label = ops.checked_label(task.label_fn(example), num_classes, task.name)
        return {"image": example["image"], "label": label}

    num_examples = SPLIT_SIZES.get(split) or sources.split_size(builder, split_string)
    return sources.DataSource(
        dataset=read().map(select, num_parallel_calls=tf.data.AUTOTUNE),
        num_classes=num_classes,
        num_examples=num_examples,
        class_names=None,
        decode=task.decode,
        name=task.name,
        shuffled=lambda seed: read(seed, shuffle=True).map(select, num_parallel_calls=tf.data.AUTOTUNE),
    )


def vtab_pipeline(
    task,
    split,
    *,
    batch_size,
    image_size=384,
    training=None,
    augmentation="resize_crop",
    flip=True,
    resize_size=None,
    batch_augmentation=None,
    data_dir=None,
    download=True,
    manual_dir=None,
    shuffle_buffer=pipelines.SHUFFLE_BUFFER,
    repeat=None,
    cache="auto",
    seed=None,
    pad_to_batch=False,
):
    """Batches of one VTAB task and split, as the paper's protocol.

    Training follows BiT except for the resolution (paper Sec. 4.1, App.
    B.1.1): resize to `resize_size` (448 for 384), random `image_size` crop,
    random flip; without the crop for Clevr-Count, Clevr-Dist, DMLab,
    KITTI-Dist and dSpr-Loc, and without the flip for dSpr-Loc, dSpr-Ori and
    sNORB-Azim (BiT App. F). Evaluation resizes to `image_size`.

    Args:
        task: a `VtabTask`, its key or paper name.
        split: `"train800"`, `"val200"`, `"train800val200"` or `"test"`.
        batch_size: int.
        image_size: int. Defaults to 384 (every task in the paper).
        training: bool. Defaults to True for `train800`/`train800val200`,
            False for `val200`/`test`.
        augmentation: training crop, `"resize_crop"` (the paper's, default),
            `"inception_crop"` (vit_jax's fine-tuning default) or `"resize"`;
            the task's BiT rules still switch crops and flips off.
        flip: bool. False turns the random flip off for every task (the
            task's BiT rule turns it off for some either way).
        resize_size: side before the random crop. Defaults to
            `image_size * 448 / 384`.
        batch_augmentation: Keras preprocessing layers on the training
            batches (not in the paper), as `keras_vit.data.finetune_pipeline`.
        data_dir, download, manual_dir: as `load_task`.
        shuffle_buffer, repeat, cache, seed, pad_to_batch: as
            `keras_vit.data.finetune_pipeline`.

    Returns:
        A `tf.data.Dataset` of `(images, labels)`: float32
        `(B, image_size, image_size, 3)` in [-1, 1] and one-hot float32
        `(B, task.num_classes)`; with `pad_to_batch` (evaluation),
        `(images, labels, weights)`.
    """
    task = get_task(task)
    if training is None:
        training = split in TRAIN_SPLITS
    _checks.one_of(augmentation, "augmentation", pipelines.FINETUNE_AUGMENTATIONS)
    _checks.boolean(flip, "flip")
    source = load_task(task, split, data_dir=data_dir, download=download, manual_dir=manual_dir)
    return pipelines.finetune_pipeline(
        source,
        training=training,
        batch_size=batch_size,
        image_size=image_size,
        augmentation=augmentation if task.random_crop else "resize",
        flip=flip and task.random_flip,
        resize_size=resize_size,
        batch_augmentation=batch_augmentation,
        shuffle_buffer=shuffle_buffer,
        repeat=repeat,
        cache=cache,
        seed=seed,
        pad_to_batch=pad_to_batch,
    )


def paper_results(model=PAPER_MODELS[0]):
    """`{task name: accuracy %}` of one model of the paper's Table 9."""
    _checks.one_of(model, "model", PAPER_MODELS)
    return {t.name: t.paper[model] for t in TASKS}


def _by_key(accuracies):
    """`{task key: accuracy}` of `{task key or name: accuracy or None}`; a
    task given twice (`"dtd"` and `"DTD"`) is refused, not one value kept."""
    by_key, given = {}, {}
    for name, value in accuracies.items():
        key = get_task(name).key
        if key in given:
            raise ValueError(f"`accuracies` gives task {key!r} twice. Received: {given[key]!r} and {name!r}")
        given[key] = name
        if value is not None:
            by_key[key] = float(value)
    return by_key


def group_means(accuracies):
    """The means of Table 9 over `{task key or name: accuracy}`.

    Returns `{"natural": (mean, n, size), "specialized": ..., "structured":
    ..., "mean": ...}`: the mean over the tasks present (None if none), how
    many are present and how many the group has. The overall mean averages
    the tasks (as the paper's "Mean" column), not the group means.
    """
    by_key = _by_key(accuracies)
    means = {}
    for group, tasks in [(g, tasks_in_group(g)) for g in GROUPS] + [("mean", TASKS)]:
        values = [by_key[t.key] for t in tasks if t.key in by_key]
        means[group] = (sum(values) / len(values) if values else None, len(values), len(tasks))
    return means


def table9_rows(accuracies, label):
    """Markdown lines in the layout of the paper's Table 9: the header, our
    row (`accuracies`, `{task key or name: accuracy %}`, under `label`) and
    the paper's rows (`PAPER_MODELS`). A missing task is "–"; a group mean
    over part of its tasks is marked "*"."""
    ours = _by_key(accuracies)

    def row(name, values):
        cells = [f"{values[t.key]:.1f}" if t.key in values else "–" for t in TASKS]
        for mean, present, size in group_means(values).values():
            cells.append("–" if mean is None else f"{mean:.1f}" + ("" if present == size else "*"))
        return f"| {name} | " + " | ".join(cells) + " |"

    return [
        "| Model | " + " | ".join(t.name for t in TASKS) + " | Natural | Specialized | Structured | Mean |",
        "|---" * (len(TASKS) + 5) + "|", row(label, ours),
        *(row(f"{model}, paper", {t.key: t.paper[model] for t in TASKS}) for model in PAPER_MODELS),
    ]


def bar_chart(accuracies, path, label, paper_model=PAPER_MODELS[-1]):
    """Writes `accuracies` (`{task key or name: accuracy %}`) per task and
    per group beside `paper_model`'s, coloured by group, as an image at
    `path` (any format matplotlib writes), drawn on a bare
    `matplotlib.figure.Figure` (no pyplot state, no display). Returns
    `path`."""
    _bar_chart_figure(accuracies, label, paper_model).savefig(path, dpi=120)
    return path


def _bar_chart_figure(accuracies, label, paper_model):
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    _checks.one_of(paper_model, "paper_model", PAPER_MODELS)
    ours = _by_key(accuracies)
    colours = {"natural": "#4c72b0", "specialized": "#dd8452", "structured": "#55a868"}
    means, paper_means = group_means(ours), group_means(paper_results(paper_model))
    summaries = (*GROUPS, "mean")
    # A task not run has no bar and a "(–)" label; a mean over part of its
    # tasks is marked "*", as in `table9_rows`.
    labels = [t.name if t.key in ours else f"{t.name} (–)" for t in TASKS] + [
        name + ("" if means[g][1] == means[g][2] else "*")
        for name, g in zip(("Natural", "Specialized", "Structured", "Mean"), summaries)]
    mine = [ours.get(t.key, math.nan) for t in TASKS] + [
        math.nan if means[g][0] is None else means[g][0] for g in summaries]
    theirs = [t.paper[paper_model] for t in TASKS] + [paper_means[g][0] for g in summaries]
    edge = [colours.get(g, "#444444") for g in [t.group for t in TASKS] + list(summaries)]
    x = range(len(labels))
    fig = Figure(figsize=(14, 4.8))
    ax = fig.subplots()
    ax.bar([i - 0.2 for i in x], mine, 0.4, color=edge)
    ax.bar([i + 0.2 for i in x], theirs, 0.4, color="none", edgecolor=edge, hatch="//")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=60, ha="right")
    ax.set(ylabel="Top-1 accuracy (%)", ylim=(0, 100))
    ax.set_title("VTAB-1k" + ("" if means["mean"][1] == len(TASKS) else
                              f" ({means['mean'][1]} of {len(TASKS)} tasks; * mean over those run)"), loc="left")
    handles = [Patch(facecolor="#777777", label=label),
               Patch(facecolor="none", edgecolor="#777777", hatch="//", label=f"{paper_model}, paper")]
    handles += [Patch(facecolor=c, label=g) for g, c in colours.items()]
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=5, frameon=False)
    fig.tight_layout()
    return fig
