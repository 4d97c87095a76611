"""The recipes: flags, the offline demo end to end (pre-training at 16 px,
fine-tuning at 32 px through recipes/finetune.py), the resolution change
(resampled position embeddings, zero head), smoke runs on mocked tfds, the
lr sweep, and a run killed with SIGKILL that the same command resumes."""

import csv
import json
import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers.position_embedding import resample_position_embedding
from keras_vit.weights import read_npz
from recipes import common
from recipes import configs
from recipes import demo
from recipes import finetune
from recipes import pretrain
from tests.helpers import fast_jax_compiles

BACKEND = keras.backend.backend()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, patch_size=4)
POSEMB = "Transformer/posembed_input/pos_embedding"


_fast_compiles = pytest.fixture(scope="module", autouse=True, name="_fast_compiles")(fast_jax_compiles)


# ---------------------------------------------------------------------------
# Flags and configs.
# ---------------------------------------------------------------------------


def test_flags_override_any_field_and_help_lists_them(capsys):
    name, config, smoke = finetune.parse([
        "--config=cifar100", "--learning_rate=0.003", "--lr_grid=0.1,0.2", "--sweep",
        '--model_overrides={"num_layers": 2}', "--weights=none", "--total-steps", "7",
    ])
    assert (name, smoke) == ("cifar100", False)
    assert config["dataset"] == "cifar100" and config["train_split"] == "train[:98%]"
    assert config["learning_rate"] == 0.003 and config["lr_grid"] == (0.1, 0.2)
    assert config["sweep"] is True and config["total_steps"] == 7 and config["weights"] is None
    assert config["model_overrides"] == {"num_layers": 2}
    # Paper defaults (Table 4, App. B.1.1) where the config is silent.
    assert (config["batch_size"], config["accum_steps"], config["image_size"]) == (512, 8, 384)
    assert (config["momentum"], config["grad_clip"], config["decay_type"]) == (0.9, 1.0, "cosine")
    # --smoke shrinks everything; flags still win.
    _, config, smoke = finetune.parse(["--smoke", "--total_steps=3"])
    assert smoke and config["total_steps"] == 3 and config["weights"] is None
    assert config["image_size"] == 16 and config["model"] is None

    with pytest.raises(SystemExit):
        finetune.parse(["--help"])
    out = capsys.readouterr().out
    assert all(f"--{field.name}" in out for field in configs.FINETUNE_FIELDS)
    assert all(name in out for name in configs.FINETUNE_CONFIGS)
    with pytest.raises(SystemExit):
        pretrain.parse(["--learning_rate=fast"])
    assert "--learning_rate" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="Received: config='cifar11'"):
        finetune.parse(["--config=cifar11"])


def test_named_configs_state_their_expected_result():
    expected = {
        "cifar10": "99.02", "cifar100": "92.06", "imagenet2012": "84.53",
        "oxford_iiit_pet": "94.67", "oxford_flowers102": "99.61",
    }
    for name, function in configs.FINETUNE_CONFIGS.items():
        assert f"{expected[name]} %" in function.__doc__, name
        config = dict(configs.defaults(configs.FINETUNE_FIELDS), **function())
        steps = {"imagenet2012": 20_000, "oxford_iiit_pet": 500, "oxford_flowers102": 500}
        assert config["total_steps"] == steps.get(name, 10_000), name
    for name, function in configs.PRETRAIN_CONFIGS.items():
        assert "Expected" in function.__doc__, name
    table3 = dict(configs.defaults(configs.PRETRAIN_FIELDS), **configs.pretrain_imagenet2012())
    assert (table3["learning_rate"], table3["weight_decay"], table3["batch_size"]) == (3e-3, 0.3, 4096)
    assert (table3["warmup_steps"], table3["epochs"], table3["dropout_rate"]) == (10_000, 300.0, 0.1)
    assert common.steps_from_epochs(300, 1_268_355, 4096) == 92_897


# ---------------------------------------------------------------------------
# The demo: pre-train at 16 px, fine-tune at 32 px.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("demo")
    outcome = demo.main([
        f"--run_dir={run_dir}", "--pretrain_steps=4", "--finetune_steps=4", "--verbose=0",
        f"--model_overrides={json.dumps(TINY)}",
    ])
    return run_dir, outcome


def test_demo_end_to_end(demo_run):
    run_dir, outcome = demo_run
    up, down = outcome["pretrain"], outcome["finetune"]
    # Real digits: 1,797 images split 80 / 20, stratified.
    files = {s: sum(len(f) for _, _, f in os.walk(run_dir / "data" / "digits" / s)) for s in ("train", "test")}
    assert files == {"train": 1437, "test": 360}
    assert up["steps"] == 4 and down["steps"] == 4
    assert up["eval_examples"] == 360 and down["eval_examples"] == 360
    assert 0.0 <= down["accuracy"] <= 1.0 and down["num_classes"] == 10
    assert down["accum_steps"] == 2 and down["batch_size"] == 64
    for part in ("pretrain", "finetune"):
        for name in ("model.keras", "model.npz", "summary.json", "history.csv", "config.json",
                     "checkpoints/checkpoint.json"):
            assert (run_dir / part / name).exists(), (part, name)
    with open(run_dir / "finetune" / "history.csv") as f:
        assert [int(row["epoch"]) for row in csv.DictReader(f)] == [0, 1, 2, 3]
    # TensorBoard event files for the training and the evaluation curves.
    for part in ("pretrain", "finetune"):
        events = [f for _, _, files in os.walk(run_dir / part / "logs") for f in files]
        assert any(f.startswith("events.out.tfevents") for f in events), (part, events)
    # The fine-tuned model's inspection figures (paper Figures 6 and 7).
    assert set(outcome["figures"]) == {"rollout", "posemb_similarity", "embedding_filters", "attention_distance"}
    for path in outcome["figures"].values():
        assert os.path.dirname(path) == str(run_dir / "inspect") and os.path.getsize(path) > 1000, path
    # The fine-tuning went through the resolution change.
    notes = " ".join(down["notes"])
    assert "resampled from a 4x4 to a 8x8 grid" in notes
    assert "pre_logits/kernel` in the checkpoint is not used" in notes
    assert "head: zero-initialised" in notes


def test_final_model_files_agree(demo_run):
    run_dir, _ = demo_run
    loaded = keras.saving.load_model(str(run_dir / "finetune" / "model.keras"), compile=False)
    rebuilt = keras_vit.ViT(
        None, input_shape=(32, 32, 3), num_classes=10, weights=str(run_dir / "finetune" / "model.npz"), **TINY
    )
    x = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
    a = keras.ops.convert_to_numpy(loaded(x))
    b = keras.ops.convert_to_numpy(rebuilt(x))
    assert np.abs(a).max() > 0  # the trained head is not zero any more
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_finetune_builds_the_model_at_the_new_resolution(demo_run):
    """Position embeddings resampled from the checkpoint's 4x4 grid, every
    other weight as in the checkpoint, a zero head for any class count."""
    run_dir, _ = demo_run
    npz = str(run_dir / "pretrain" / "model.npz")
    arrays = read_npz(npz)
    assert arrays[POSEMB].shape == (1, 17, 16) and "pre_logits/kernel" in arrays
    assert np.abs(arrays["head/kernel"]).max() > 0
    config = dict(configs.defaults(configs.FINETUNE_FIELDS), model=None, model_overrides=TINY,
                  weights=npz, image_size=32)
    for num_classes in (10, 7):
        model, notes = finetune.build_model(config, num_classes)
        weights = {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}
        posemb = keras.ops.convert_to_numpy(model.get_layer("posembed_input").pos_embedding)
        want = resample_position_embedding(arrays[POSEMB], (8, 8), (4, 4), num_prefix_tokens=1)
        assert posemb.shape == (1, 65, 16)
        np.testing.assert_allclose(posemb, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(posemb[:, 0], arrays[POSEMB][:, 0])  # class token row
        head = model.get_layer("head")
        assert tuple(head.kernel.shape) == (16, num_classes)
        assert not np.any(keras.ops.convert_to_numpy(head.kernel))
        assert not np.any(keras.ops.convert_to_numpy(head.bias))
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(model.get_layer("embedding").kernel), arrays["embedding/kernel"]
        )
        block = model.get_layer("encoderblock_0")
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(block.mlp.dense_0.kernel),
            arrays["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"],
        )
        with pytest.raises(ValueError):
            model.get_layer("pre_logits")
        assert len(weights) > 0


def test_demo_rerun_is_instant_and_a_changed_config_is_refused(demo_run, monkeypatch):
    run_dir, outcome = demo_run

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run trained again")

    monkeypatch.setattr(common, "train_and_evaluate", no_training)
    argv = [f"--run_dir={run_dir}", "--pretrain_steps=4", "--verbose=0", f"--model_overrides={json.dumps(TINY)}"]
    again = demo.main(argv + ["--finetune_steps=4"])
    assert again["finetune"]["accuracy"] == outcome["finetune"]["accuracy"]
    with pytest.raises(ValueError, match="another config .*total_steps: 4 -> 5"):
        demo.main(argv + ["--finetune_steps=5"])


# ---------------------------------------------------------------------------
# Smoke runs on mocked tfds, the sweep.
# ---------------------------------------------------------------------------


def test_finetune_smoke_on_mocked_tfds(tmp_path):
    summary = finetune.main(["--smoke", f"--run_dir={tmp_path}", "--verbose=0"])
    assert summary["steps"] == 4 and summary["eval_examples"] == 16  # generated examples
    assert summary["num_classes"] == 10 and summary["config"]["dataset"] == "cifar10"
    assert summary["backend"] == BACKEND and summary["images_per_second"] > 0
    assert np.isfinite(summary["final_loss"]) and 0.0 <= summary["accuracy"] <= 1.0
    assert (tmp_path / "model.keras").exists() and (tmp_path / "model.npz").exists()
    assert read_npz(str(tmp_path / "model.npz"))["head/kernel"].shape == (16, 10)


def test_sweep_trains_the_best_lr_on_the_full_split(tmp_path, monkeypatch):
    """The paper's protocol: every lr on sweep_train -> sweep_val, then the
    best on train_split, reported on test_split (training stubbed)."""
    calls = []

    def fake_fit(config, *, run_dir, setup, train_data, eval_data, num_classes, callbacks=(), save_model=True):
        images, labels = next(iter(train_data(4)))
        assert images.shape == (4, 16, 16, 3) and labels.shape == (4, num_classes)
        calls.append((config["learning_rate"], os.path.relpath(run_dir, tmp_path), save_model))
        score = {0.001: 0.5, 0.003: 0.75, 0.01: 0.75, 0.03: 0.25}[config["learning_rate"]]
        return {"accuracy": score, "eval_examples": 16, "steps": config["total_steps"]}

    monkeypatch.setattr(finetune, "fit_one", fake_fit)
    summary = finetune.main(["--smoke", f"--run_dir={tmp_path}", "--sweep", "--lr_grid=0.001,0.003,0.01,0.03"])
    assert calls == [
        (0.001, "sweep/lr_0.001", False), (0.003, "sweep/lr_0.003", False),
        (0.01, "sweep/lr_0.01", False), (0.03, "sweep/lr_0.03", False),
        (0.003, ".", True),  # the first of the best
    ]
    assert summary["learning_rate"] == 0.003 and [s["val_accuracy"] for s in summary["sweep"]] == [0.5, 0.75, 0.75, 0.25]


# ---------------------------------------------------------------------------
# SIGKILL, then the same command.
# ---------------------------------------------------------------------------

KILL_AFTER = 11  # micro-batches: 5 updates of 2 micro-batches, then one more


class _KillOnce(keras.callbacks.Callback):
    def __init__(self, marker):
        super().__init__()
        self.marker = marker
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.batches == KILL_AFTER and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def _argv(run_dir):
    return ["--smoke", f"--run_dir={run_dir}", "--total_steps=8", "--log_every=4", "--accum_steps=2",
            "--checkpoint_every=1", "--verbose=0"]


def _child():
    """The command, in a process of its own that kills itself after 11
    micro-batches."""
    run_dir = os.environ["KERAS_VIT_TEST_RUN_DIR"]
    if BACKEND == "jax":
        import jax

        jax.config.update("jax_disable_most_optimizations", True)
    pretrain.main(_argv(run_dir), callbacks=[_KillOnce(os.path.join(run_dir, "killed"))])


def _run_child(run_dir):
    env = dict(os.environ, KERAS_BACKEND=BACKEND, KERAS_VIT_TEST_RUN_DIR=str(run_dir),
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, "-c", "from tests.test_recipes import _child; _child()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


def test_pretrain_killed_then_resumed_by_the_same_command(tmp_path):
    killed = _run_child(tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    with open(tmp_path / "checkpoints" / "checkpoint.json") as f:
        checkpoint = json.load(f)
    # Killed after micro-batch 11: the last checkpoint is update 5 (epoch 1,
    # 2 of its 8 micro-batches); no final model yet.
    assert (checkpoint["step"], checkpoint["epoch"], checkpoint["batch"]) == (5, 1, 2)
    assert not (tmp_path / "summary.json").exists()

    # The same command again (here in this process: a fresh process would
    # only add seconds of imports).
    summary = pretrain.main(_argv(tmp_path))
    assert summary["steps"] == 8 and summary["resumed_from_step"] == 5
    assert summary["config"]["dataset"] == "imagenet2012" and summary["num_classes"] == 1000
    with open(tmp_path / "checkpoints" / "checkpoint.json") as f:
        assert json.load(f)["step"] == 8
    with open(tmp_path / "history.csv") as f:
        assert [int(row["epoch"]) for row in csv.DictReader(f)] == [0, 1]
    assert (tmp_path / "model.keras").exists() and (tmp_path / "model.npz").exists()
