"""A smoke run of the benchmark command, so that it never rots (speed itself
is never asserted: see docs/performance.md)."""

import json
import math
import sys

import keras
import numpy as np
import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import accelerator  # noqa: E402
import bench  # noqa: E402
import device_parity  # noqa: E402
import dynamic_size  # noqa: E402
import input_pipeline  # noqa: E402
import real_images  # noqa: E402
import step_costs  # noqa: E402

sys.path.pop(0)

pytestmark = pytest.mark.main_env


@pytest.mark.one_backend
def test_flop_count_of_vit_b16():
    # 17.6 G multiply-adds per 224-px image (ViT-B/16).
    assert abs(bench.forward_flops("B", 224) / 2e9 - 17.56) < 0.05


@pytest.mark.one_backend
def test_flop_count_of_the_cifar_sized_model():
    # Multiply-adds: patch embedding 64 x 48 x 128, 4 blocks over 65 tokens
    # (q/k/v 3 x 65 x 128^2, scores and sum 2 x 65^2 x 128, output 65 x 128^2,
    # MLP 2 x 65 x 128 x 512), head 128 x 10.
    assert bench.forward_flops("C", 32, 10) == 2 * 55_838_976
    assert (bench.image_size("C"), bench.num_classes("C")) == (32, 10)


def test_smoke_run_measures_keras_vit_and_reports():
    rows = bench.run_worker(bench.parse_args(["--smoke"]))
    assert [(r["mode"], r["backend"]) for r in rows] == [
        ("inference", keras.backend.backend()), ("training", keras.backend.backend())
    ]
    for row in rows:
        assert row["keras_vit_img_s"] > 0 and row["matmul_peak_gflops"] > 0
    table = bench.markdown(rows)
    assert table.count("\n") == 3 and "| tiny |" in table


@pytest.mark.one_backend
def test_input_pipeline_smoke_run_covers_every_recipe_pipeline(tmp_path):
    rows = input_pipeline.main(["--smoke", "--train-img-s=2", f"--json={tmp_path / 'rows.json'}"])
    assert len(rows) == 7 and len({r["pipeline"] for r in rows}) == 7
    for row in rows:
        # Both are rounded to 0.1 from the unrounded rate.
        assert row["img_s"] > 0 and abs(row["ratio_to_training"] - row["img_s"] / 2) <= 0.1
    assert (tmp_path / "rows.json").stat().st_size > 0


@pytest.mark.one_backend
def test_real_images_schedule_is_keras_vits():
    # The PyTorch loop must follow the recipe's learning rate update by update.
    from keras_vit import training

    reference = training.WarmupDecay(1e-3, 300, warmup_steps=30, decay_type="cosine")
    for step in (0, 1, 15, 29, 30, 31, 150, 298, 299):
        expected = float(keras.ops.convert_to_numpy(reference(step)))
        # keras_vit computes in float32: 1e-6 of the peak rate.
        assert math.isclose(real_images.schedule(step, 1e-3, 300, 30), expected, abs_tol=1e-9), step
    assert real_images.schedule(0, 1e-3, 300, 30) == 0.0
    assert math.isclose(real_images.schedule(30, 1e-3, 300, 30), 1e-3)


@pytest.mark.one_backend
def test_real_images_recipe_command_pins_the_set_up():
    args = real_images.parse_args(["--data=cifar10_folder", "--recipe-flags=--steps_per_execution=4"])
    command = real_images.recipe_command(args, seed=2, run_dir="runs/seed2")
    flags = dict(a[2:].split("=", 1) for a in command if a.startswith("--") and "=" in a)
    # No dropout inherited from the named config, the model and optimizer.
    assert flags["dropout_rate"] == "0" and flags["pre_logits"] == "false"
    assert json.loads(flags["model_overrides"]) == {
        "hidden_size": 128, "mlp_dim": 512, "num_heads": 4, "num_layers": 4, "patch_size": 4}
    assert (flags["total_steps"], flags["warmup_steps"], flags["batch_size"]) == ("300", "30", "128")
    assert (flags["weight_decay"], flags["learning_rate"], flags["seed"]) == ("0.1", "0.001", "2")
    assert flags["steps_per_execution"] == "4" and command[-1] == "--steps_per_execution=4"


@pytest.mark.one_backend
def test_real_images_original_init_on_timm():
    timm_vit = pytest.importorskip("timm.models.vision_transformer")
    import torch

    torch.manual_seed(0)
    model = timm_vit.VisionTransformer(img_size=32, patch_size=4, embed_dim=128, depth=1,
                                       num_heads=4, num_classes=10)
    real_images.original_init(model)
    assert float(model.head.weight.detach().abs().max()) == 0 and float(model.cls_token.detach().abs().max()) == 0
    qkv = model.blocks[0].attn.qkv.weight.detach().numpy()
    # Xavier-uniform on each (128, 128) kernel: limit sqrt(3 / 128), sd limit / sqrt(3).
    assert np.abs(qkv).max() <= math.sqrt(3 / 128)
    assert abs(qkv.std() / math.sqrt(1 / 128) - 1) < 0.05
    proj = model.patch_embed.proj.weight.detach().numpy()  # LeCun normal, fan-in 48.
    assert abs(proj.std() / math.sqrt(1 / 48) - 1) < 0.15


def test_real_images_smoke_run_trains_both(tmp_path):
    pytest.importorskip("timm")
    backend = keras.backend.backend()
    rows, summary = real_images.main(
        ["--smoke", f"--backends={backend}", f"--json={tmp_path / 'rows.json'}"])
    assert [r["runner"] for r in rows] == [f"keras_vit {backend}", "timm"]
    for row in rows:
        assert 0.0 <= row["accuracy"] <= 1.0 and row["img_s"] > 0
        assert len(row["train_accuracy"]) == 2  # 4 updates, a window of 2.
        assert row["load_before"] >= 0
    by_runner = {s["runner"]: s for s in summary}
    assert by_runner["timm"]["img_s_vs_timm"] == 1.0
    ours = by_runner[f"keras_vit {backend}"]
    assert math.isclose(ours["img_s_vs_timm"], rows[0]["img_s"] / rows[1]["img_s"], abs_tol=0.006)
    saved = json.loads((tmp_path / "rows.json").read_text())
    assert saved["summary"] == summary and saved["setup"]["steps"] == 4


def test_step_costs_smoke_run_times_both_sides():
    pytest.importorskip("timm")
    row = step_costs.main(["--repeats=1"])
    # The CIFAR-sized ViT's trainable variables: patch embedding 2, class token,
    # position embedding, 4 blocks x 16, encoder norm 2, head 2.
    assert row["optimizer_ms"]["variables"] == 72
    assert row["backend"] == keras.backend.backend()
    for costs in (row["optimizer_ms"], row["gelu_ms"]):
        assert all(v > 0 for k, v in costs.items() if k != "variables")


def test_real_images_throughput_smoke_run_reports_every_variant():
    """`--throughput` (where the small-model time goes): every way of feeding
    the same model is timed and compared with `fit` on in-memory batches."""
    pytest.importorskip("timm")
    backend = keras.backend.backend()
    if backend != "tensorflow":
        # The worker differs per backend only in its compile flags, and its
        # seven variants each compile: minutes under JAX and torch.compile on
        # 2 cores. The recipe's own backends run in the smoke run above.
        pytest.skip("--throughput smoke run on TensorFlow only (compile time)")
    rows = real_images.main(["--smoke", "--throughput", f"--backends={backend}"])
    by_variant = {row["variant"]: row for row in rows}
    expected = {"timm loop, in memory", "timm loop, in memory, tanh GELU",
                "train_on_batch, in memory", "fit, in memory", "fit, image folder"}
    expected |= {"fit, in memory, steps_per_execution=2", "fit, image folder, steps_per_execution=2"}
    assert expected == set(by_variant), sorted(by_variant)
    for row in rows:
        assert row["backend"] == backend and row["img_s"] > 0 and row["steps"] == 4
        assert row["vs_timm"] > 0 and row["vs_fit_in_memory"] > 0
    assert by_variant["fit, in memory"]["vs_fit_in_memory"] == 1.0
    assert by_variant["timm loop, in memory"]["vs_timm"] == 1.0


def test_accelerator_benchmark_smoke_run(tmp_path):
    """`benchmarks/accelerator.py --smoke` on this backend, in its worker
    process as the full run: every dtype and attention kernel, both modes,
    with throughput, step and compile times and the peak memory (issue 23)."""
    backend = keras.backend.backend()
    rows = accelerator.main(["--smoke", f"--backends={backend}", f"--json={tmp_path / 'rows.json'}"])
    assert len(rows) == 8 and {(r["dtype"], r["flash_attention"], r["mode"]) for r in rows} == {
        (d, f, m) for d in ("float32", "bfloat16") for f in (False, True) for m in ("inference", "training")}
    for row in rows:
        assert row["backend"] == backend and row["device"], row
        assert row["keras_vit_img_s"] > 0 and row["keras_vit_step_ms"] > 0 and row["keras_vit_peak_mb"] > 0, row
        assert row["keras_vit_compile_s"] >= 0
        # Each model runs under its row's policy and attention switch
        # (clear_session() between models resets both).
        policy = "mixed_bfloat16" if row["dtype"] == "bfloat16" else "float32"
        assert (row["keras_vit_policy"], row["keras_vit_flash"]) == (policy, row["flash_attention"]), row
    if backend == "torch":  # timm beside it, once per dtype
        assert sum("timm_img_s" in r for r in rows) == 4
    assert json.loads((tmp_path / "rows.json").read_text()) == rows
    assert accelerator.markdown(rows).count("\n") == 9


@pytest.mark.one_backend  # the worker's code is the same on every backend (tests/weights: the parity on each)
def test_device_parity_worker_matches_float64_timm(tmp_path):
    """`benchmarks/device_parity.py`'s worker on this backend (the CPU
    here): ViT-Ti/16 with timm's random weights gives timm's float64 logits
    within 1e-5 of the largest, eager and compiled, and timm in float32 does
    too; the table has a line per row."""
    reference = device_parity.reference(device_parity.ARCHITECTURES["tiny"], 2, str(tmp_path))
    rows = device_parity.measure("tiny", "default", reference)
    assert [(r["library"], r["mode"]) for r in rows] == [
        ("keras_vit", "predict_on_batch"), ("keras_vit", "model(x)"), ("timm", "on cpu")]
    for row in rows:
        assert row["backend"] == keras.backend.backend() and row["top1_agree"] == 2, row
        assert 0 < row["max_rel"] < 1e-5, row
    assert device_parity.markdown(rows).count("\n") == 4


@pytest.mark.one_backend  # the script's plumbing; its worker runs the same code on every backend
def test_dynamic_size_benchmark_smoke_run():
    """`benchmarks/dynamic_size.py --smoke` on this backend: a static and a
    dynamic model at the stored size and another, with their ratio."""
    backend = keras.backend.backend()
    rows = dynamic_size.main(["--smoke", f"--backends={backend}"])
    assert [(r["backend"], r["image"]) for r in rows] == [(backend, 32), (backend, 48)]
    for row in rows:
        assert row["static_img_s"] > 0 and row["dynamic_img_s"] > 0
        assert row["ratio"] == round(row["dynamic_img_s"] / row["static_img_s"], 3)
    assert dynamic_size.markdown(rows).count("\n") == 3
