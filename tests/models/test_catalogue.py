"""Listing models and checkpoints: `list_models`, `available_weights`, the
AugReg catalogue (`augreg/index.csv`, served from a loopback HTTP server)."""

import csv

import numpy as np
import pytest

import keras_vit
from keras_vit import variants
from keras_vit.weights import augreg as augreg_lib
from keras_vit.weights import registry
from tests.helpers import randomize_weights
from tests.weights.test_weights import bucket  # noqa: F401 - the fixture: a loopback server with faults

# --- list_models / available_weights ------------------------------------------


@pytest.mark.one_backend
def test_list_models_names_constructors_and_weights():
    models = {m.name: m for m in keras_vit.list_models()}
    assert list(models) == list(variants.VARIANTS) and len(models) == 20
    b16 = models["ViT-B_16"]
    assert (b16.constructor, b16.augreg_name) == ("ViTB16", "B_16")
    assert b16.weights == ["imagenet21k", "imagenet21k+imagenet2012", "augreg", "augreg+imagenet2012", "sam"]
    assert models["R50+ViT-L_32"].constructor == "R50ViTL32"
    assert models["ViT-B_16-gap-norep"][1:] == (None, None, [])
    # Every constructor is listed once and builds its listed config.
    constructors = [m.constructor for m in models.values() if m.constructor]
    assert len(constructors) == len(set(constructors)) == 14
    for info in models.values():
        if info.constructor:
            assert getattr(keras_vit, info.constructor).__doc__.startswith(f"Builds {info.name} ")


@pytest.mark.one_backend
def test_list_models_pattern():
    names = [m.name for m in keras_vit.list_models("*b_16*")]
    assert names == ["ViT-B_16", "ViT-B_16-gap-norep", "R50+ViT-B_16"]
    assert [m.name for m in keras_vit.list_models("ViTL*")] == ["ViT-L_16", "ViT-L_32"]
    assert [m.name for m in keras_vit.list_models("R26_*")] == ["R26+ViT-B_32", "R26+ViT-S_32"]
    assert keras_vit.list_models("nothing*") == []
    # big_vision-style names, as `get_model` and `available_weights` take them.
    assert [m.name for m in keras_vit.list_models("B/16")] == ["ViT-B_16"]
    assert [m.name for m in keras_vit.list_models("R26+S/32")] == ["R26+ViT-S_32"]
    with pytest.raises(ValueError, match="Received: pattern=3"):
        keras_vit.list_models(3)


@pytest.mark.one_backend
def test_available_weights_accepts_every_alias():
    expected = ["imagenet21k", "imagenet21k+imagenet2012"]
    for name in ("R50ViTB16", "R50+ViT-B_16", "R50_B_16", "R50+B/16"):
        assert keras_vit.available_weights(name) == expected
    assert keras_vit.available_weights("ViTTi16") == ["augreg", "augreg+imagenet2012"]
    with pytest.raises(ValueError, match="Received: variant='ViT-Q_3'"):
        keras_vit.available_weights("ViT-Q_3")
    # One public function: `keras_vit.weights` no longer offers a second one
    # that knows only the original names (issue 16).
    assert not hasattr(keras_vit.weights, "available_weights")
    assert "available_weights" not in keras_vit.weights.__all__


# --- The AugReg catalogue -----------------------------------------------------

UP = {
    "B16_med": "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
    "B16_none": "B_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.1-sd_0.1",
    "B16_i1k": "B_16-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0",
    "Ti16": "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
    "R50L32": "R50_L_32-i21k_30-30ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1",
}
# name, ds, epochs, aug, final_val, upstream key, adapt_ds, adapt_lr, adapt_steps,
# adapt_resolution, adapt_final_val, infer_samples_per_sec (empty: unknown, as B/8's)
ROWS = [
    ("B/16", "i21k", "300", "medium1", 0.478, "B16_med", "imagenet2012", 0.03, 20000, 384, 0.85486, "137.92"),
    ("B/16", "i21k", "300", "medium1", 0.478, "B16_med", "imagenet2012", 0.01, 20000, 384, 0.85301, "137.92"),
    ("B/16", "i21k", "300", "medium1", 0.478, "B16_med", "imagenet2012", 0.03, 20000, 224, 0.84192, "409.1"),
    ("B/16", "i21k", "300", "medium1", 0.478, "B16_med", "cifar100", 0.003, 10000, 384, 0.9392, "137.92"),
    ("B/16", "i21k", "300", "none", 0.461, "B16_none", "imagenet2012", 0.03, 20000, 384, 0.86001, ""),
    ("B/16", "i1k", "300.0", "medium2", 0.781, "B16_i1k", "imagenet2012", 0.01, 20000, 384, 0.8173, "137.92"),
    ("Ti/16", "i21k", "300", "none", 0.351, "Ti16", "imagenet2012", 0.03, 20000, 384, 0.7822, "609.58"),
    ("Ti/16", "i21k", "300", "none", 0.351, "Ti16", "oxford_iiit_pet", 0.001, 500, 224, 0.9012, "2000.5"),
    ("R50+L/32", "i21k_30", "30", "medium1", 0.433, "R50L32", "imagenet2012", 0.01, 20000, 384, 0.8544, "326.73"),
]


def adapt_name(upstream, adapt_ds, lr, steps, res):
    return f"{upstream}--{adapt_ds}-steps_{steps // 1000}k-lr_{lr:g}-res_{res}"


def write_index(path, rows=ROWS):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(augreg_lib.COLUMNS)
        for name, ds, epochs, aug, final_val, up, adapt_ds, lr, steps, res, adapt_val, speed in rows:
            filename = UP[up]
            wd, do, sd = (v.split("_")[1] for v in filename.split("-")[-3:])
            writer.writerow([
                name, ds, epochs, 0.001, aug, wd, do, sd, final_val + 0.01, final_val,
                final_val - 0.01, adapt_ds, lr, steps, res, adapt_val, adapt_val - 0.02,
                86859496, speed, filename, adapt_name(filename, adapt_ds, lr, steps, res),
            ])
    return path


@pytest.fixture
def index(local_bucket):
    (local_bucket / "augreg").mkdir()
    write_index(local_bucket / "augreg" / "index.csv")
    return keras_vit.weights.augreg_index()


@pytest.mark.one_backend
def test_index_is_downloaded_cached_and_parsed(index, local_bucket, tmp_path):
    assert len(index) == len(ROWS)
    row = index[0]
    assert row["name"] == "B/16" and row["filename"] == UP["B16_med"]
    assert row["adapt_filename"] == UP["B16_med"] + "--imagenet2012-steps_20k-lr_0.03-res_384"
    assert (row["epochs"], row["adapt_steps"], row["adapt_resolution"], row["params"]) == (300, 20000, 384, 86859496)
    assert all(type(row[c]) is int for c in ("epochs", "adapt_steps", "adapt_resolution", "params"))
    assert (row["lr"], row["wd"], row["do"], row["adapt_lr"]) == (0.001, 0.1, 0.0, 0.03)
    assert row["infer_samples_per_sec"] == 137.92
    assert index[4]["infer_samples_per_sec"] is None  # empty cell
    assert index[5]["epochs"] == 300  # "300.0" as pandas writes a column with gaps
    cached = tmp_path / "cache" / "models" / "keras_vit" / "augreg__index.csv"
    assert cached.exists()
    # Cached: read again with the server's file gone; refresh=True downloads.
    (local_bucket / "augreg" / "index.csv").unlink()
    assert len(keras_vit.weights.augreg_index()) == len(ROWS)
    # A failed refresh keeps the cached copy; the error names the URL (it
    # was urllib's bare "HTTP Error 404" or "Connection refused").
    with pytest.raises(OSError, match=r"The server of http://.*/augreg/index.csv answered 404 .*nothing was cached"):
        keras_vit.weights.augreg_index(refresh=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERAS_VIT_WEIGHTS_URL", "http://127.0.0.1:9")  # nothing listens there
        with pytest.raises(OSError, match=r"Cannot reach http://127.0.0.1:9/augreg/index.csv \(.*\): offline, or a "
                                          r"mirror that does not answer \(KERAS_VIT_WEIGHTS_URL='http://127.0.0.1:9'\)"):
            keras_vit.weights.augreg_index(refresh=True)
    assert len(keras_vit.weights.augreg_index()) == len(ROWS)


@pytest.mark.one_backend
def test_an_index_cut_at_a_line_boundary_never_enters_the_cache(bucket, tmp_path):
    """Issue 21: cut after a whole line and sent without a length, half the
    index parsed, was cached and trusted."""
    bucket.files["augreg/index.csv"] = write_index(tmp_path / "index.csv", ROWS).read_bytes()
    cached = tmp_path / "cache" / "models" / "keras_vit" / "augreg__index.csv"
    for fault, match in (("lines_no_length", "states no length for it"),
                         ("lines", "bytes, the server stated .*: the download was cut short")):
        bucket.faults["augreg/index.csv"] = fault
        with pytest.raises(ValueError, match=match):
            keras_vit.weights.augreg_index()
        assert not cached.exists()
    del bucket.faults["augreg/index.csv"]
    assert len(keras_vit.weights.augreg_index()) == len(ROWS) and cached.exists()


@pytest.mark.one_backend
def test_index_from_a_local_path(tmp_path):
    path = write_index(tmp_path / "index.csv", ROWS[:2])
    assert keras_vit.weights.augreg_index(path).column("adapt_lr") == [0.03, 0.01]
    with pytest.raises(FileNotFoundError, match="Received: path="):
        keras_vit.weights.augreg_index(tmp_path / "missing.csv")


@pytest.mark.one_backend
def test_filter_by_model_dataset_augmentation_and_resolution(index):
    b16 = index.filter(model="B/16")
    assert len(b16) == 6
    for alias in ("B_16", "ViT-B_16", "B/16"):
        assert index.filter(model=alias).rows == b16.rows
    assert len(index.filter(model="R50+L/32")) == len(index.filter(model="R50+ViT-L_32")) == 1
    assert len(index.filter(model="B/16", ds="i21k")) == 5
    assert len(index.filter(model="B/16", ds="i21k", aug="medium1")) == 4
    rows = index.filter(model="B/16", adapt_ds="imagenet2012", adapt_resolution=384)
    assert rows.column("adapt_final_val") == [0.85486, 0.85301, 0.86001, 0.8173]
    assert index.filter(adapt_ds="oxford_iiit_pet").column("name") == ["Ti/16"]
    assert len(index.filter(wd=0.03, adapt_lr=0.03)) == 2  # floats, any column
    assert len(index.filter(model="S/16")) == 0
    with pytest.raises(ValueError, match=r"Unknown AugReg index column\(s\) \['resolution'\]"):
        index.filter(resolution=384)
    with pytest.raises(ValueError, match="Received: model='Q/9'"):
        index.filter(model="Q/9")


@pytest.mark.one_backend
def test_sort_by_metric(index):
    rows = index.filter(model="B/16", adapt_ds="imagenet2012").sort("adapt_final_val")
    assert rows.column("adapt_final_val") == [0.86001, 0.85486, 0.85301, 0.84192, 0.8173]
    ascending = index.filter(model="B/16").sort("adapt_final_val", descending=False)
    assert ascending.column("adapt_final_val")[0] == 0.8173
    # Rows without a value come last, whichever the direction.
    speed = index.filter(model="B/16").sort("infer_samples_per_sec").column("infer_samples_per_sec")
    assert speed == [409.1, 137.92, 137.92, 137.92, 137.92, None]
    with pytest.raises(ValueError, match="Received: metric='params'"):
        index.sort("params")


@pytest.mark.one_backend
def test_best_picks_a_name_that_weights_accepts(index):
    best = index.best(model="B/16", adapt_ds="imagenet2012", adapt_resolution=384)
    assert best == UP["B16_none"] + "--imagenet2012-steps_20k-lr_0.03-res_384"
    assert index.best(model="B/16", adapt_ds="imagenet2012", adapt_resolution=224).endswith("-res_224")
    assert index.best(model="B/16", adapt_ds="imagenet2012", metric="adapt_final_test").startswith(UP["B16_none"])
    # No fine-tuning filter: the pre-trained file with the best upstream final_val.
    assert index.best(model="B/16", ds="i21k") == UP["B16_med"]
    assert index.best(model="B/16") == UP["B16_i1k"]
    assert index.best(model="Ti/16", metric="infer_samples_per_sec") == (
        UP["Ti16"] + "--oxford_iiit_pet-steps_0k-lr_0.001-res_224"
    )
    for row in index:
        for name in (row["filename"], row["adapt_filename"]):
            assert registry.is_registered(name)
            config = variants.resolve_variant(row["name"])[0]
            assert registry.resolve(name, config) == f"augreg/{name}.npz"
    with pytest.raises(ValueError, match="No AugReg checkpoint with a adapt_final_val matches"):
        index.best(model="B/16", adapt_ds="kitti")
    assert len(index.pretrained()) == 5
    assert index.filter(model="Ti/16").pretrained().column("filename") == [UP["Ti16"]]


def test_best_name_downloads_and_loads(index, local_bucket):
    name = index.best(model="Ti/16", adapt_ds="imagenet2012", adapt_resolution=384)
    # The published architecture (registered names refuse overrides), small input.
    source = randomize_weights(keras_vit.ViTTi16(input_shape=(32, 32, 3)))
    keras_vit.export_npz(source, local_bucket / "augreg" / f"{name}.npz")
    model = keras_vit.ViTTi16(input_shape=(32, 32, 3), weights=name)
    for a, b in zip(source.weights, model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.one_backend
def test_bad_index_files_are_clear_errors(tmp_path):
    path = tmp_path / "index.csv"
    path.write_text("name,ds\nB/16,i21k\n")
    with pytest.raises(ValueError, match=r"not an AugReg index: columns \['epochs'"):
        keras_vit.weights.augreg_index(path)
    write_index(path, ROWS[:1])
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0], text[1].replace(",86859496,", ",many,")]) + "\n")
    with pytest.raises(ValueError, match="line 2: column 'params' is not a number. Received: 'many'"):
        keras_vit.weights.augreg_index(path)
    path.write_text("\n".join([text[0], text[1] + ",extra"]) + "\n")
    with pytest.raises(ValueError, match="line 2 has 22 fields, the header 21"):
        keras_vit.weights.augreg_index(path)
    path.write_text("\n".join([text[0], text[1].replace(",0.478,", ",inf,")]) + "\n")
    with pytest.raises(ValueError, match="line 2: column 'final_val' is not a finite number. Received: 'inf'"):
        keras_vit.weights.augreg_index(path)
    # Issue 21: the csv module's and the decoder's errors were tracebacks
    # the cache's validator did not catch.
    path.write_text("\n".join([text[0], text[1].replace(",0.478,", f',"{"9" * 200_000}",')]) + "\n")
    with pytest.raises(ValueError, match="is not an AugReg index: field larger than field limit"):
        keras_vit.weights.augreg_index(path)
    path.write_bytes(("\n".join(text) + "\n").encode().replace(b"i21k", b"i21\xff", 1))
    with pytest.raises(ValueError, match="is not an AugReg index: 'utf-8' codec can't decode byte 0xff"):
        keras_vit.weights.augreg_index(path)


@pytest.mark.one_backend
@pytest.mark.parametrize("missing", ["nan", "-nan", "NaN", ""])
def test_a_metric_without_a_value_is_never_best(tmp_path, missing):
    # Issue 21: "-nan" parsed to NaN, which `best()` returned as the best row.
    path = write_index(tmp_path / "index.csv", [ROWS[0], ROWS[4]])
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1].replace(",0.478,", f",{missing},"), lines[2]]) + "\n")
    index = keras_vit.weights.augreg_index(path)
    assert index.rows[0]["final_val"] is None
    assert index.best() == UP["B16_none"]


@pytest.mark.one_backend
def test_to_pandas(index):
    pandas = pytest.importorskip("pandas")
    frame = index.to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns) == list(augreg_lib.COLUMNS)
    assert frame["adapt_final_val"].max() == 0.86001


@pytest.mark.one_backend
def test_augreg_module_imports_only_what_it_uses():
    # Before: `registry` was imported and never used (the catalogue reaches
    # the bucket through the cache).
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(augreg_lib))
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert sorted(imported - used) == []
