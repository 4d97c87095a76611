"""The 19 VTAB-1k tasks: table, split strings, label transforms, pipelines."""

import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import keras_vit.data
from keras_vit.data import vtab
from tests.helpers import ROOT

# tf.data and the task table: the Keras backend plays no part.
pytestmark = pytest.mark.one_backend

# task key: (paper name, group, tfds builder, classes, val200, test, flip, crop)
# From task_adaptation's data/*.py (offsets: percent * catalog train size // 100)
# and BiT App. F for the flip/crop switches.
EXPECTED = {
    "caltech101": ("Caltech101", "natural", "caltech101:3.*.*", 102, "train[2754:2954]", "test", 1, 1),
    "cifar100": ("CIFAR-100", "natural", "cifar100:3.*.*", 100, "train[45000:45200]", "test", 1, 1),
    "dtd": ("DTD", "natural", "dtd:3.*.*", 47, "validation[:200]", "test", 1, 1),
    "flowers102": ("Flowers102", "natural", "oxford_flowers102:2.*.*", 102, "validation[:200]", "test", 1, 1),
    "pets": ("Pets", "natural", "oxford_iiit_pet:4.*.*", 37, "train[2944:3144]", "test", 1, 1),
    "sun397": ("Sun397", "natural", "sun397/tfds:4.*.*", 397, "validation[:200]", "test", 1, 1),
    "svhn": ("SVHN", "natural", "svhn_cropped:3.*.*", 10, "train[65931:66131]", "test", 1, 1),
    "camelyon": ("Camelyon", "specialized", "patch_camelyon:2.*.*", 2, "validation[:200]", "test", 1, 1),
    "eurosat": ("EuroSAT", "specialized", "eurosat/rgb:2.*.*", 10, "train[16200:16400]", "train[21600:]", 1, 1),
    "resisc45": ("Resisc45", "specialized", "resisc45:3.*.*", 45, "train[18900:19100]", "train[25200:]", 1, 1),
    "retinopathy": (
        "Retinopathy", "specialized", "diabetic_retinopathy_detection/btgraham-300:3.*.*", 5,
        "validation[:200]", "test", 1, 1,
    ),
    "clevr_count": ("Clevr-Count", "structured", "clevr:3.*.*", 8, "train[63000:63200]", "validation", 1, 0),
    "clevr_distance": ("Clevr-Dist", "structured", "clevr:3.*.*", 6, "train[63000:63200]", "validation", 1, 0),
    "dmlab": ("DMLab", "structured", "dmlab:2.0.1", 6, "validation[:200]", "test", 1, 0),
    "dsprites_location": (
        "dSpr-Loc", "structured", "dsprites:2.*.*", 16, "train[589824:590024]", "train[663552:]", 0, 0,
    ),
    "dsprites_orientation": (
        "dSpr-Ori", "structured", "dsprites:2.*.*", 16, "train[589824:590024]", "train[663552:]", 0, 1,
    ),
    "kitti_distance": ("KITTI-Dist", "structured", "kitti:3.1.0", 4, "validation[:200]", "test", 1, 0),
    "smallnorb_azimuth": ("sNORB-Azim", "structured", "smallnorb:2.*.*", 18, "test[:200]", "test[50%:]", 0, 1),
    "smallnorb_elevation": ("sNORB-Elev", "structured", "smallnorb:2.*.*", 9, "test[:200]", "test[50%:]", 1, 1),
}
# tfds attribute behind the label where it is a tfds ClassLabel (checked offline).
CLASS_LABEL_FEATURE = {"smallnorb_azimuth": "label_azimuth", "smallnorb_elevation": "label_elevation"}
CUSTOM_LABELS = ("clevr_count", "clevr_distance", "kitti_distance", "dsprites_location", "dsprites_orientation")


# ---------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------


def test_table_rows_and_order():
    assert [t.key for t in vtab.TASKS] == list(EXPECTED)
    assert [len(vtab.tasks_in_group(g)) for g in vtab.GROUPS] == [7, 4, 8]
    for task in vtab.TASKS:
        name, group, builder, classes, _, _, flip, crop = EXPECTED[task.key]
        assert (task.name, task.group, task.tfds_name, task.num_classes) == (name, group, builder, classes)
        assert (task.random_flip, task.random_crop) == (bool(flip), bool(crop))
        assert vtab.get_task(name.upper()) is task and vtab.get_task(task.key) is task
    with pytest.raises(ValueError, match=r"Received: task='Clevr'"):
        vtab.get_task("Clevr")


@pytest.mark.parametrize("key", list(EXPECTED))
def test_split_strings(key):
    val, test = EXPECTED[key][4:6]
    assert vtab.get_task(key).splits == {
        "train800": "train[:800]",
        "val200": val,
        "train800val200": f"train[:800]+{val}",
        "test": test,
    }


def _ranges(split, sizes):
    infos = {k: types.SimpleNamespace(num_examples=v) for k, v in sizes.items()}
    out = []
    for part in tfds.core.ReadInstruction.from_spec(split).to_absolute(infos):
        n = sizes[part.splitname]
        out.append((part.splitname, part.from_ or 0, n if part.to is None else part.to))
    return out


def _overlap(parts1, parts2):
    return any(s1 == s2 and a1 < b2 and a2 < b1 for s1, a1, b1 in parts1 for s2, a2, b2 in parts2)


def test_split_sizes_on_a_dataset_description_of_our_own():
    """Sizes and disjointness of the four splits from split sizes alone, with
    tfds' own slicing arithmetic (mock data would ignore the slices)."""
    for task in vtab.TASKS:
        sizes = {"train": task.train_size or 5000, "validation": 1000, "test": 3000}
        parts = {name: _ranges(s, sizes) for name, s in task.splits.items()}
        count = {name: sum(b - a for _, a, b in r) for name, r in parts.items()}
        assert (count["train800"], count["val200"], count["train800val200"]) == (800, 200, 1000), task.name
        assert parts["train800val200"] == parts["train800"] + parts["val200"]
        assert not _overlap(parts["train800"], parts["val200"]), task.name
        assert not _overlap(parts["test"], parts["train800val200"]), task.name
    # Splits cut out of `train`: test is the tail after train + val.
    dspr = vtab.get_task("dSpr-Loc")
    assert _ranges(dspr.splits["test"], {"train": 737280}) == [("train", 663552, 737280)]
    norb = vtab.get_task("sNORB-Elev")
    assert _ranges(norb.splits["test"], {"test": 24300}) == [("test", 12150, 24300)]
    # Offsets follow the prepared train size, as the original.
    assert vtab.get_task("eurosat").split_strings(1000)["test"] == "train[800:]"


def test_class_counts_match_tfds_features():
    for task in vtab.TASKS:
        if task.key in CUSTOM_LABELS:
            continue
        features = tfds.builder(task.tfds_name).info.features
        assert features[CLASS_LABEL_FEATURE.get(task.key, "label")].num_classes == task.num_classes
    dsprites = tfds.builder("dsprites:2.*.*").info.features
    assert dsprites["label_x_position"].num_classes == 32
    assert dsprites["label_orientation"].num_classes == 40


def test_paper_numbers_and_means():
    for model in vtab.PAPER_MODELS:
        results = vtab.paper_results(model)
        assert len(results) == 19
        assert abs(np.mean(list(results.values())) - vtab.PAPER_MEANS[model]) < 0.05
    assert vtab.get_task("Clevr-Count").paper == {
        "ViT-H/14 (JFT)": 91.7, "ViT-L/16 (JFT)": 86.4, "ViT-L/16 (I21k)": 70.3
    }


def test_table9_rows_and_bar_chart(tmp_path):
    # Our row: every task at 50 % except Caltech101 (a key) at 80 % and
    # SVHN (missing); one task given by its paper name.
    ours = {t.key: 50.0 for t in vtab.TASKS if t.key not in ("caltech101", "svhn", "dtd")}
    ours.update(caltech101=80.0, DTD=50.0, svhn=None)
    header, rule, row, *paper = vtab.table9_rows(ours, "mine")
    assert header.split(" | ")[1:3] == ["Caltech101", "CIFAR-100"] and rule.count("|---") == 24
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "mine" and cells[1] == "80.0" and cells[7] == "–"  # SVHN's column
    # Natural: 6 of 7 tasks present: (80 + 5 x 50) / 6, marked partial; the
    # full groups unmarked; the mean over the 18 tasks present.
    assert cells[20:] == ["55.0*", "50.0", "50.0", f"{(80 + 17 * 50) / 18:.1f}*"]
    assert [line.split(" | ")[0] for line in paper] == [f"| {m}, paper" for m in vtab.PAPER_MODELS]
    assert paper[-1].endswith(f"| {vtab.PAPER_MEANS['ViT-L/16 (I21k)']} |")
    pytest.importorskip("matplotlib")
    path = vtab.bar_chart(ours, str(tmp_path / "report.png"), "mine")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="paper_model='ViT-B/16'"):
        vtab.bar_chart(ours, str(tmp_path / "other.png"), "mine", paper_model="ViT-B/16")
    # SVHN has no bar (it was drawn as 0 %), the partial means are marked
    # as in the table, and the title says how many tasks ran.
    ax, = vtab._bar_chart_figure(ours, "mine", vtab.PAPER_MODELS[-1]).axes
    labels = [tick.get_text() for tick in ax.get_xticklabels()]
    assert labels[6] == "SVHN (–)" and labels[0] == "Caltech101"
    assert labels[19:] == ["Natural*", "Specialized", "Structured", "Mean*"]
    heights = [bar.get_height() for bar in ax.containers[0]]
    assert np.isnan(heights[6]) and heights[0] == 80.0 and heights[19] == pytest.approx(55.0)
    assert "18 of 19 tasks" in ax.get_title(loc="left")


# ---------------------------------------------------------------------------
# Label transforms on hand-built examples.
# ---------------------------------------------------------------------------


def _clevr(depths):
    depths = np.asarray(depths, np.float32)
    return {
        "size": tf.zeros([len(depths)], tf.int64),
        "pixel_coords": tf.constant(np.stack([np.zeros_like(depths)] * 2 + [depths], -1).reshape(-1, 3)),
    }


def test_clevr_distance_bins_edges_fall_low():
    cases = {0.5: 0, 8.0: 0, 8.001: 1, 8.5: 1, 8.75: 2, 9.0: 2, 9.5: 3, 10.0: 4, 10.01: 5, 100.0: 5}
    for depth, label in cases.items():
        assert int(vtab.clevr_distance_label(_clevr([depth, 50.0]))) == label, depth
    assert int(vtab.clevr_distance_label(_clevr([30.0, 9.2, 12.0]))) == 3  # The closest counts.
    for bad in ([], [100.5], [0.0], [-1.0, 5.0]):
        with pytest.raises(tf.errors.InvalidArgumentError, match="Clevr-Dist"):
            vtab.clevr_distance_label(_clevr(bad))


def test_clevr_count_minus_three():
    for n in range(3, 11):
        assert int(vtab.clevr_count_label(_clevr([9.0] * n))) == n - 3
    for n in (0, 2, 11):
        with pytest.raises(tf.errors.InvalidArgumentError, match="Clevr-Count"):
            vtab.clevr_count_label(_clevr([9.0] * n))


def _kitti(types_, depths):
    depths = np.asarray(depths, np.float32)
    return {
        "type": tf.constant(types_, tf.int64),
        "location": tf.constant(np.stack([np.ones_like(depths)] * 2 + [depths], -1).reshape(-1, 3)),
    }


def test_kitti_closest_vehicle_bins():
    car, van, truck, pedestrian, cyclist = 0, 1, 2, 3, 5
    cases = [
        ([car], [8.0], 0), ([van], [8.01], 1), ([truck], [20.0], 1), ([car], [20.5], 2),
        ([car], [999.0], 2), ([car], [-99.0], 0),
        ([pedestrian, cyclist], [3.0, 4.0], 3),  # No vehicle.
        ([], [], 3),
        ([pedestrian, car, truck], [2.0, 30.0, 15.0], 1),  # Closest vehicle; pedestrians ignored.
    ]
    for types_, depths, label in cases:
        assert int(vtab.kitti_distance_label(_kitti(types_, depths))) == label, (types_, depths)
    for types_, depths in (([car], [1000.0]), ([car, van], [5.0, -100.0])):
        with pytest.raises(tf.errors.InvalidArgumentError, match="KITTI-Dist"):
            vtab.kitti_distance_label(_kitti(types_, depths))


def test_dsprites_binning():
    orientation = [int(vtab.dsprites_label(v, 40)) for v in range(40)]
    # 2.5 values per bin: 3, 2, 3, 2, ... values.
    assert np.bincount(orientation).tolist() == [3, 2] * 8
    assert orientation[:8] == [0, 0, 0, 1, 1, 2, 2, 2]
    assert [int(vtab.dsprites_label(v, 32)) for v in range(32)] == [v // 2 for v in range(32)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="dSprites"):
        vtab.dsprites_label(40, 40)


def test_image_transforms():
    grey = np.random.default_rng(0).integers(0, 2, (64, 64, 1)).astype(np.uint8)
    rgb = vtab.get_task("dSpr-Ori").decode(tf.io.encode_png(grey))
    np.testing.assert_array_equal(rgb, np.repeat(grey * 255, 3, -1))
    norb = np.random.default_rng(1).integers(0, 256, (96, 96, 1)).astype(np.uint8)
    np.testing.assert_array_equal(vtab.get_task("sNORB-Azim").decode(tf.io.encode_png(norb)), np.repeat(norb, 3, -1))


# ---------------------------------------------------------------------------
# Pipelines on mock data.
# ---------------------------------------------------------------------------


def _index_image(n):
    """A 1x1 PNG whose pixel encodes the example index."""
    n = tf.cast(n, tf.int64)
    pixel = tf.stack([n % 256, n // 256 % 256, n // 65536])
    return tf.io.encode_png(tf.cast(tf.reshape(pixel, [1, 1, 3]), tf.uint8))


def _fake_builder(sizes, make_features):
    """`_as_dataset` for mock_data: example `i` of each split slice has an
    image encoding `i` and the features `make_features(i)` (tfds' random mock
    cannot build CLEVR/KITTI sequences nor valid Pets boxes)."""
    infos = {k: types.SimpleNamespace(num_examples=v) for k, v in sizes.items()}

    def as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False, **kwargs):
        assert isinstance(decoders["image"], tfds.decode.SkipDecoding)
        dataset = None
        for part in tfds.core.ReadInstruction.from_spec(split).to_absolute(infos):
            stop = sizes[part.splitname] if part.to is None else part.to
            piece = tf.data.Dataset.range(part.from_ or 0, stop).map(
                lambda n: {"image": _index_image(n), **make_features(n)}
            )
            dataset = piece if dataset is None else dataset.concatenate(piece)
        return dataset

    return as_dataset


def _clevr_objects(n):
    count = 3 + n % 8
    return {"objects": {"size": tf.zeros([count], tf.int64), "pixel_coords": tf.fill([count, 3], 9.25)}}


def _kitti_objects(n):
    return {"objects": {"type": tf.constant([0], tf.int64), "location": tf.constant([[0.0, 0.0, 10.0]])}}


def _decoded_indices(source):
    pixels = source.dataset.map(lambda ex: tf.cast(source.decode(ex["image"])[0, 0], tf.int64))
    pixels = np.concatenate([p.numpy() for p in pixels.batch(4096)])
    return (pixels[:, 0] + 256 * pixels[:, 1] + 65536 * pixels[:, 2]).tolist()


def test_load_task_reads_the_split_slices(tmp_path):
    fake = _fake_builder({"train": 70000, "validation": 15000}, _clevr_objects)
    with tfds.testing.mock_data(as_dataset_fn=fake):
        source = vtab.load_task("Clevr-Count", "train800val200", data_dir=tmp_path)
        assert source.num_examples == 1000 and source.num_classes == 8
        indices = _decoded_indices(source)
        assert indices == list(range(800)) + list(range(63000, 63200))
        labels = [int(ex["label"]) for ex in source.dataset.take(10)]
        assert labels == [i % 8 for i in range(10)]
        test = vtab.load_task("Clevr-Dist", "test", data_dir=tmp_path).dataset
        assert int(test.cardinality()) == 15000  # All of `validation`.


def test_out_of_range_example_fails_when_read(tmp_path):
    fake = _fake_builder(
        {"train": 70000, "validation": 15000},
        lambda n: {"objects": {"size": tf.zeros([11], tf.int64), "pixel_coords": tf.fill([11, 3], 9.0)}},
    )
    with tfds.testing.mock_data(as_dataset_fn=fake):
        ds = vtab.vtab_pipeline("Clevr-Count", "val200", batch_size=2, image_size=8, data_dir=tmp_path)
        with pytest.raises(tf.errors.InvalidArgumentError, match="Clevr-Count: a CLEVR scene holds 3 to 10"):
            next(iter(ds))


@pytest.fixture
def manual_dir(tmp_path):
    path = tmp_path / "manual"
    path.mkdir()
    (path / "placeholder").write_text("mocked")
    return path


def test_every_task_on_mock_data(tmp_path, manual_dir):
    fakes = {
        "clevr_count": _fake_builder({"train": 70000, "validation": 15000}, _clevr_objects),
        "clevr_distance": _fake_builder({"train": 70000, "validation": 15000}, _clevr_objects),
        "kitti_distance": _fake_builder({"train": 6347, "validation": 423, "test": 711}, _kitti_objects),
        "pets": _fake_builder({"train": 3680, "test": 3669}, lambda n: {"label": n % 37}),
    }
    kwargs = dict(image_size=8, data_dir=tmp_path, manual_dir=manual_dir)
    for task in vtab.TASKS:
        with tfds.testing.mock_data(num_examples=3, as_dataset_fn=fakes.get(task.key)):
            images, labels = next(iter(vtab.vtab_pipeline(task, "train800", batch_size=2, **kwargs)))
            # tfds accepts the test split string (its pipeline is the eval one,
            # tested below).
            test = vtab.load_task(task, "test", data_dir=tmp_path, manual_dir=manual_dir)
            assert test.num_classes == task.num_classes
        assert images.shape == (2, 8, 8, 3) and images.dtype == tf.float32, task.name
        assert labels.shape == (2, task.num_classes), task.name
        assert float(tf.reduce_min(images)) >= -1 and float(tf.reduce_max(images)) <= 1
        np.testing.assert_array_equal(tf.reduce_sum(labels, -1), [1.0, 1.0])
    # Labels through the pipeline: Clevr-Dist depth 9.25 is bin (9, 9.5] = 3,
    # KITTI-Dist a car at 10 m is bin (8, 20] = 1.
    for key, label in (("clevr_distance", 3), ("kitti_distance", 1)):
        with tfds.testing.mock_data(as_dataset_fn=fakes[key]):
            _, labels = next(iter(vtab.vtab_pipeline(key, "val200", batch_size=4, image_size=8, data_dir=tmp_path)))
            np.testing.assert_array_equal(np.argmax(labels, -1), [label] * 4)


def test_bit_switches_and_eval_is_a_plain_resize(tmp_path):
    with tfds.testing.mock_data(num_examples=4):
        # dSpr-Loc: no random crop, no random flip -> training == evaluation,
        # up to the order (training reshuffles the cached split every epoch;
        # one batch is one epoch of the 4 mocked examples).
        kwargs = dict(batch_size=4, image_size=16, data_dir=tmp_path, shuffle_buffer=1)
        train, _ = next(iter(vtab.vtab_pipeline("dSpr-Loc", "train800", **kwargs)))
        evaluation, _ = next(iter(vtab.vtab_pipeline("dSpr-Loc", "train800", training=False, **kwargs)))

        def rows(images):
            return sorted(x.tobytes() for x in images.numpy())

        assert rows(train) == rows(evaluation)
        source = vtab.load_task("dSpr-Loc", "train800", data_dir=tmp_path)
        first = next(iter(source.dataset))
        pixels = vtab.get_task("dSpr-Loc").decode(first["image"])
        want = (tf.image.resize(pixels, (16, 16)) - 127.5) / 127.5
        np.testing.assert_array_equal(evaluation[0], want)
        # DTD keeps BiT's resize-448 -> random-crop-384 (here 19 -> 16): never
        # the plain resize.
        train, _ = next(iter(vtab.vtab_pipeline("dtd", "train800", **kwargs)))
        evaluation, _ = next(iter(vtab.vtab_pipeline("dtd", "test", **kwargs)))
        assert np.abs(train.numpy() - evaluation.numpy()).max() > 0.01


def test_flip_and_batch_augmentation_reach_every_task(tmp_path):
    """`flip=False` and `batch_augmentation` were not parameters, so the
    recipes' `--flip=false` and `--batch_augmentation` trained VTAB tasks
    with flips and without the layers."""
    with tfds.testing.mock_data(num_examples=4):
        # DMLab: no crop (BiT), so only the flip changes the images.
        kwargs = dict(batch_size=4, image_size=16, data_dir=tmp_path, shuffle_buffer=1, seed=0)

        def rows(**options):
            images, labels = next(iter(vtab.vtab_pipeline("DMLab", "train800", **kwargs, **options)))
            return sorted(x.tobytes() for x in images.numpy()), labels.numpy()

        plain, _ = rows(training=False)
        assert rows(flip=False)[0] == plain
        assert rows()[0] != plain  # seed 0 flips at least one of the 4
        _, mixed = rows(flip=False, batch_augmentation="MixUp")
        assert np.any(mixed.max(-1) < 0.99) and np.allclose(mixed.sum(-1), 1.0)  # mixed pairs
        with pytest.raises(ValueError, match="Received: flip='no'"):
            vtab.vtab_pipeline("DMLab", "train800", flip="no", **kwargs)


def test_eval_pad_to_batch(tmp_path):
    kwargs = dict(batch_size=4, image_size=8, data_dir=tmp_path)
    with tfds.testing.mock_data(num_examples=5):
        batches = list(vtab.vtab_pipeline("dtd", "test", pad_to_batch=True, **kwargs))
        with pytest.raises(ValueError, match=r"Received: pad_to_batch=True"):
            vtab.vtab_pipeline("dtd", "train800", pad_to_batch=True, **kwargs)
    assert [tuple(images.shape) for images, _, _ in batches] == [(4, 8, 8, 3)] * 2
    np.testing.assert_array_equal(np.concatenate([w for _, _, w in batches]), [1.0] * 5 + [0.0] * 3)


def test_missing_and_manual_datasets_say_what_to_do(tmp_path):
    with pytest.raises(keras_vit.data.DatasetNotAvailableError, match="download_and_prepare"):
        vtab.load_task("dtd", "train800", data_dir=tmp_path, download=False)
    with pytest.raises(keras_vit.data.DatasetNotAvailableError) as info:
        vtab.load_task("Resisc45", "train800", data_dir=tmp_path)
    message = str(info.value)
    assert "NWPU-RESISC45.rar" in message and str(tmp_path / "downloads" / "manual") in message
    with pytest.raises(keras_vit.data.DatasetNotAvailableError) as info:
        vtab.vtab_pipeline("Retinopathy", "test", batch_size=2, data_dir=tmp_path, manual_dir=tmp_path / "dr")
    message = str(info.value)
    assert "kaggle competitions download -c diabetic-retinopathy-detection" in message
    assert str(tmp_path / "dr") in message
    with pytest.raises(ValueError, match=r"Received: split='train'"):
        vtab.load_task("dtd", "train", data_dir=tmp_path, download=False)


def test_docs_table_matches_the_code():
    import os

    path = os.path.join(ROOT, "docs", "vtab.md")
    with open(path, encoding="utf-8") as f:
        rows = {line.split("|")[2].strip(): line for line in f if line.startswith("| ") and line[2].isdigit()}
    assert list(rows) == [t.name for t in vtab.TASKS]
    for task in vtab.TASKS:
        cells = [c.strip() for c in rows[task.name].split("|")[1:-1]]
        assert cells[2] == task.group and cells[3].startswith(f"`{task.tfds_name}`")
        assert cells[4] == str(task.num_classes)
        assert (cells[5], cells[6]) == (f"`{task.splits['val200']}`", f"`{task.splits['test']}`")
        assert (cells[8], cells[9]) == tuple("yes" if on else "off" for on in (task.random_flip, task.random_crop))
        assert [float(c) for c in cells[10:]] == [task.paper[m] for m in vtab.PAPER_MODELS]
