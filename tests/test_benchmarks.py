"""A smoke run of the benchmark command, so that it never rots (speed itself
is never asserted: see docs/performance.md)."""

import pathlib
import sys

import keras

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import bench  # noqa: E402
import input_pipeline  # noqa: E402

sys.path.pop(0)


def test_flop_count_of_vit_b16():
    # 17.6 G multiply-adds per 224-px image (ViT-B/16).
    assert abs(bench.forward_flops("B", 224) / 2e9 - 17.56) < 0.05


def test_smoke_run_measures_keras_vit_and_reports():
    rows = bench.run_worker(bench.parse_args(["--smoke"]))
    assert [(r["mode"], r["backend"]) for r in rows] == [
        ("inference", keras.backend.backend()), ("training", keras.backend.backend())
    ]
    for row in rows:
        assert row["keras_vit_img_s"] > 0 and row["matmul_peak_gflops"] > 0
    table = bench.markdown(rows)
    assert table.count("\n") == 3 and "| tiny |" in table


def test_input_pipeline_smoke_run_covers_every_recipe_pipeline(tmp_path):
    rows = input_pipeline.main(["--smoke", "--train-img-s=2", f"--json={tmp_path / 'rows.json'}"])
    assert len(rows) == 6 and len({r["pipeline"] for r in rows}) == 6
    for row in rows:
        # Both are rounded to 0.1 from the unrounded rate.
        assert row["img_s"] > 0 and abs(row["ratio_to_training"] - row["img_s"] / 2) <= 0.1
    assert (tmp_path / "rows.json").stat().st_size > 0
