"""The fine-tuning recipe end to end under each backend's distributions, in
real processes, with the smoke config's gradient accumulation (and remat and
LoRA, issue 23): TensorFlow's MirroredStrategy on 2 logical CPUs, JAX's
DataParallel and ModelParallel on 8 simulated devices. The library's
distribution numerics are tests/test_distribute.py's."""

import json
import os
import subprocess
import sys

import keras
import pytest

from tests.test_distribute import ROOT
from tests.test_distribute import child_env

BACKEND = keras.backend.backend()


def _run_recipe(tmp_path, env, flags, split_cpus=False):
    """`python -m recipes.finetune --smoke` in a fresh process (TensorFlow:
    the CPU split into 2 logical devices first); returns summary.json."""
    run_dir = tmp_path / "run"
    argv = ["recipes.finetune", "--smoke", f"--run_dir={run_dir}", "--verbose=0", *flags]
    code = "import runpy, sys\n"
    if split_cpus:
        code += (
            "import tensorflow as tf\n"
            "cpu = tf.config.list_physical_devices('CPU')[0]\n"
            "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
        )
    code += f"sys.argv = {argv!r}\nrunpy.run_module('recipes.finetune', run_name='__main__')\n"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=child_env(**env), capture_output=True,
        text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    # The evaluation split's first example is read uncached before training:
    # a cache read in part logged a warning on every run.
    assert "did not fully read the dataset being cached" not in result.stderr, result.stderr[-3000:]
    with open(run_dir / "summary.json") as f:
        return json.load(f)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute is TensorFlow only")
def test_finetune_recipe_mirrored_with_accumulation(tmp_path):
    summary = _run_recipe(
        # TensorFlow's warnings shown, as the recipes show them (TF_CPP_MIN_LOG_LEVEL=1).
        tmp_path, {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "1"},
        ["--distribution=mirrored", "--remat", "--lora_rank=2"],
        split_cpus=True,
    )
    assert summary["distribution"] == "mirrored" and summary["replicas"] == 2
    assert summary["config"]["remat"] and os.path.exists(summary["lora_npz"])  # issue 23
    assert summary["accum_steps"] == 2 and summary["steps"] == summary["config"]["total_steps"]
    assert 0.0 <= summary["accuracy"] <= 1.0


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX only")
@pytest.mark.parametrize("mode, replicas", [("data_parallel", 8), ("model_parallel", 1)])
def test_finetune_recipe_on_8_jax_devices_with_accumulation(tmp_path, mode, replicas):
    # Micro-batches of 16 / 2 = 8 rows: one per device.
    summary = _run_recipe(
        tmp_path,
        {"KERAS_BACKEND": "jax", "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"},
        # Issue 23: gradient checkpointing and LoRA under both.
        [f"--distribution={mode}", "--batch_size=16", "--remat", "--lora_rank=2"],
    )
    assert summary["config"]["remat"] and os.path.exists(summary["lora_npz"])
    assert summary["distribution"] == mode and summary["replicas"] == replicas
    assert summary["accum_steps"] == 2 and summary["steps"] == summary["config"]["total_steps"]
