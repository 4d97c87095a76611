"""The recipes: one flag dialect (fast `--help`, one-line errors), the
offline demo end to end (pre-training at 16 px, fine-tuning at 32 px through
recipes/finetune.py), the resolution change (resampled position embeddings,
zero head), smoke runs on mocked tfds, the evaluation loss on padded
batches, the lr sweep, and a run killed with SIGKILL that the same command
resumes."""

import csv
import errno
import dataclasses
import json
import os
import shutil
import re
import signal
import stat
import subprocess
import sys
import time
import types
import typing

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers.position_embedding import resample_position_embedding
from keras_vit.weights import read_npz
from recipes import checks
from recipes import cli
from recipes import configs
from recipes import demo
from recipes import finetune
from recipes import inputs
from recipes import inspect_vit
from recipes import pretrain
from recipes import pretrain_mpp
from recipes import rundir
from recipes import train
from recipes import vtab
from recipes.configs import TrainConfig
from tests.helpers import ROOT as REPO_ROOT
from tests.helpers import fast_jax_compiles

BACKEND = keras.backend.backend()
ROOT = str(REPO_ROOT)
TINY = dict(hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, patch_size=4)
POSEMB = "Transformer/posembed_input/pos_embedding"


_fast_compiles = pytest.fixture(scope="module", autouse=True, name="_fast_compiles")(fast_jax_compiles)


# ---------------------------------------------------------------------------
# Flags and configs.
# ---------------------------------------------------------------------------


def _numeric_fields(config):
    """`(field, item type, interval)` of a config's number fields (tuples of
    numbers and optional numbers included)."""
    found = []
    for field in dataclasses.fields(config):
        annotation = type(config).types()[field.name]
        args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
        inner = typing.get_args(args[0])[0] if typing.get_origin(args[0]) is tuple else args[0]
        if inner in (int, float):
            found.append((field.name, inner, field.metadata.get("valid")))
    return found


@pytest.mark.one_backend
def test_every_numeric_flag_is_range_checked_before_any_work(capsys):
    """Issue 21: --learning_rate=nan and inf trained, other bad numbers ended
    in tracebacks. Every number field of every recipe declares its interval
    (only a bias may be any finite number) and a value outside it, or not
    finite, is one error line at parse time."""
    checked = 0
    for recipe in (finetune, pretrain, pretrain_mpp, vtab, demo, inspect_vit):
        _, config, _ = recipe.parse([])
        for name, kind, interval in _numeric_fields(config):
            if name in recipe.RECIPE.fixed:
                continue
            assert interval or name == "head_bias_init", (recipe.__name__, name)
            bad = ["nan", "inf", "-inf"] if kind is float else []
            if interval:
                low, high = (float(b) for b in interval[1:-1].split(","))
                bad.append(repr(kind(low - 1 if interval[0] == "[" else low)))
                if high != float("inf"):
                    bad.append(repr(kind(high + 1 if interval[-1] == "]" else high)))
            for value in bad:
                with pytest.raises(SystemExit) as exit_info:
                    recipe.parse([f"--{name}={value}"])
                err = capsys.readouterr().err
                assert exit_info.value.code == 2 and err.count("\n") == 1, (name, value, err)
                assert err.startswith(f"error: --{name} must be ") and f"Received: --{name}=" in err, err
                checked += 1
    assert checked > 150


@pytest.mark.one_backend
def test_flags_override_any_field_and_help_lists_them(capsys):
    name, config, smoke = finetune.parse([
        "--config=cifar100", "--learning_rate=0.003", "--lr_grid=0.1,0.2", "--sweep",
        '--model_overrides={"num_layers": 2}', "--weights=none", "--total-steps", "7",
    ])
    assert (name, smoke) == ("cifar100", False)
    assert config.dataset == "cifar100" and config.train_split == "train[:98%]"
    assert config.learning_rate == 0.003 and config.lr_grid == (0.1, 0.2)
    assert config.sweep is True and config.total_steps == 7 and config.weights is None
    assert config.model_overrides == {"num_layers": 2}
    # Paper defaults (Table 4, App. B.1.1) where the config is silent.
    assert (config.batch_size, config.accum_steps, config.image_size) == (512, 8, 384)
    assert config.grad_clip == 1.0
    checks.fill_library_defaults(config)  # as a run starts
    assert (config.momentum, config.decay_type) == (0.9, "cosine")
    # --smoke shrinks everything; flags still win.
    _, config, smoke = finetune.parse(["--smoke", "--total_steps=3"])
    assert smoke and config.total_steps == 3 and config.weights is None
    assert config.image_size == 16 and config.model is None
    # The smoke batch splits over 8 devices and keeps 2 accumulated micro-batches.
    assert config.accum_steps == 2 and (config.batch_size // config.accum_steps) % 8 == 0
    assert config.eval_batch_size % 8 == 0
    # A JSON value with a space right after a bare --smoke (issue 15: it was
    # taken as the value of --smoke).
    _, config, smoke = finetune.parse(["--smoke", '--model_overrides={"a": 1}'])
    assert smoke and config.model_overrides == {"a": 1}
    # `--smoke false` is no smoke run (it took the smoke settings with the real data).
    _, config, smoke = finetune.parse(["--smoke", "false"])
    assert not smoke and config.image_size == 384
    # No abbreviations: `--conf=cifar100` named the run cifar100 and trained the default config.
    for abbreviated in (["--conf=cifar100"], ["--smok"], ["--learning_r=0.5"]):
        with pytest.raises(SystemExit):
            finetune.parse(abbreviated)
        assert "unrecognized arguments" in capsys.readouterr().err

    with pytest.raises(SystemExit):
        finetune.parse(["--help"])
    out = capsys.readouterr().out
    assert all(f"--{field}" in out for field in TrainConfig.__dataclass_fields__)
    # A field whose help says what None (or an empty list) means shows that
    # once (it showed "(default: the variant's) (default: none...", and
    # "(default: , in [1, inf))").
    flat = " ".join(out.split())
    assert "dropout (default: the variant's, in [0, 1))" in flat
    assert "training lengths of the sweep (default: total_steps, in [1, inf))" in flat
    assert "tensorflow-datasets data directory (default: tfds')" in flat and "(default: )" not in flat
    assert all(name in out and named.expected[:20] in " ".join(out.split())
               for name, named in finetune.RECIPE.configs.items())
    with pytest.raises(SystemExit) as exit_info:
        pretrain.parse(["--learning_rate=fast"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--learning_rate" in err
    assert err.startswith("error: ") and err.count("\n") == 1
    with pytest.raises(SystemExit):
        finetune.parse(["--config=cifar11"])
    assert "Received: config='cifar11'" in capsys.readouterr().err


@pytest.mark.one_backend
def test_augreg_presets_table():
    """AugReg's presets (Steiner et al. Sec. 3.3; big_vision RANDAUG_DEF,
    MIXUP_DEF), beside the pre-training config that uses them."""
    assert configs.AUGREG == {
        "none": (None, 0.0), "light1": ((2, 0), 0.0), "light2": ((2, 10), 0.2),
        "medium1": ((2, 15), 0.2), "medium2": ((2, 15), 0.5), "strong1": ((2, 20), 0.5),
        "strong2": ((2, 20), 0.8),
    }


@pytest.mark.one_backend
def test_configs_are_typed_attributes(monkeypatch):
    from keras_vit.training import schedules

    # Issue 22: the choice lists are the library's, never copied: a decay
    # shape added there is a valid --decay_type at once.
    assert not hasattr(configs, "DECAY_TYPES") and not hasattr(configs, "AUGMENTATIONS")
    monkeypatch.setattr(schedules, "DECAY_TYPES", (*schedules.DECAY_TYPES, "rsqrt"))
    checks.check(finetune.RECIPE.get_config(smoke=True).replace(decay_type="rsqrt"))
    config = finetune.RECIPE.get_config("cifar10")
    with pytest.raises(AttributeError, match="learnig_rate"):
        config.learnig_rate = 0.1
    with pytest.raises(AttributeError):
        config.learnig_rate  # noqa: B018
    with pytest.raises(TypeError):
        TrainConfig(learnig_rate=0.1)
    assert finetune.RECIPE.get_config("cifar10", smoke=True).image_size == 16
    # The AugReg presets (big_vision vit_i21k.py: RandAugment(2, 15) and
    # mixup 0.2 for medium1).
    assert configs.AUGREG["medium1"] == ((2, 15), 0.2)
    assert pretrain.RECIPE.get_config("augreg_imagenet21k").augreg == "medium1"


@pytest.mark.one_backend
def test_fine_tuning_defaults_are_the_librarys(monkeypatch, capsys):
    """Issue 22: the recipes write no default the library has. A new
    default warmup or decay in `finetuning_optimizer` is what
    `--config=cifar10` and VTAB run with, recorded in their config;
    pre-training takes `pretraining_optimizer`'s; an option the chosen
    optimizer does not take is refused."""
    from keras_vit import training

    config = finetune.RECIPE.get_config("cifar10")
    assert (config.warmup_steps, config.decay_type, config.momentum, config.accumulator_dtype) == (None,) * 4
    checks.check(config)
    assert (config.warmup_steps, config.decay_type, config.momentum, config.accumulator_dtype) == (
        500, "cosine", 0.9, "bfloat16")
    assert (config.weight_decay, config.first_moment_dtype, config.linear_end) == (None,) * 3
    original = training.finetuning_optimizer.__defaults__
    changed = tuple(300 if v == 500 else "linear" if v == "cosine" else v for v in original)
    monkeypatch.setattr(training.finetuning_optimizer, "__defaults__", changed)
    for config in (finetune.RECIPE.get_config("cifar10"), vtab.RECIPE.get_config()):
        checks.check(config)
        assert config.decay_type == "linear"
    config = finetune.RECIPE.get_config("cifar10")
    checks.check(config)
    assert config.warmup_steps == 300
    # A value the config or a flag gives wins.
    config = finetune.RECIPE.get_config("oxford_iiit_pet")
    checks.check(config)
    assert config.warmup_steps == 100
    with pytest.raises(SystemExit):
        finetune.parse(["--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "linear warmup (default: keras_vit.training.finetuning_optimizer's, in [0, inf))" in shown
    config = pretrain.RECIPE.get_config("imagenet21k")
    checks.check(config)
    assert (config.warmup_steps, config.linear_end, config.first_moment_dtype, config.momentum) == (
        10_000, 1e-5, "float32", None)
    with pytest.raises(cli.RecipeError, match=r"--momentum is not an option of keras_vit.training."
                       r"pretraining_optimizer \(--optimizer=adam; it applies to --optimizer=sgd; pass "
                       r"--momentum=none, the config may set it\). Received: --momentum=0.8"):
        checks.check(pretrain.RECIPE.get_config().replace(momentum=0.8))
    # --help says which optimizer's default a field takes, or that it does not apply.
    with pytest.raises(SystemExit):
        pretrain.parse(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "momentum (optax order, not Nesterov) (default: none; --optimizer=sgd only, in [0, 1))" in shown
    assert "linear warmup (default: keras_vit.training.pretraining_optimizer's, in [0, inf))" in shown


@pytest.mark.one_backend
def test_one_dialect_for_every_recipe():
    """The same flags for the same things; older spellings still parse."""
    for recipe in (finetune, pretrain, vtab, pretrain_mpp):
        _, config, _ = recipe.parse(["--smoke", "--run_dir=runs/x", "--seed=3", "--distribution=none"])
        assert (config.run_dir, config.seed, config.distribution) == ("runs/x", 3, "none"), recipe
        assert hasattr(config, "total_steps") and hasattr(config, "model_overrides"), recipe
    _, config, _ = demo.parse(["--smoke", "--run_dir=runs/x", "--seed=3"])
    assert (config.run_dir, config.seed, config.pretrain_steps) == ("runs/x", 3, 4)
    _, config, _ = inspect_vit.parse(["--run_dir=runs/x", "--image_size=16,24"])
    assert (config.run_dir, config.image_size) == ("runs/x", (16, 24))
    # pretrain_mpp: --smoke no longer ignores the input size (issue 15).
    _, config, smoke = pretrain_mpp.parse(["--smoke", "--image_size=32"])
    assert smoke and config.image_size == (32,) and config.dataset == "synthetic"
    _, config, _ = pretrain_mpp.parse(["--smoke", "--run_dir", "runs/y", "--image_size", "16,32", "--total_steps=5"])
    assert (config.run_dir, config.image_size, config.total_steps) == ("runs/y", (16, 32), 5)
    # ... and reaches the trainer (`--smoke --dataset=cifar10` downloaded CIFAR-10).
    seen = {}

    def trainer(recipe, config, config_name, **kwargs):
        seen.update(kwargs)
        raise cli.RecipeError("stop")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "run", trainer)
        with pytest.raises(cli.RecipeError, match="stop"):
            pretrain_mpp.main(["--smoke", "--dataset=cifar10"])
    assert seen["smoke"] is True


@pytest.mark.one_backend
def test_smoke_stand_in_data_lives_in_keras_vit_data_testing(tmp_path):
    """`--smoke`'s generated images come from keras_vit.data.testing, with
    the other stand-ins: inspect_vit's random-pixel PNGs, pretrain_mpp's
    smooth colour fields."""
    from PIL import Image

    from keras_vit.data import testing

    assert testing.smoke_images(str(tmp_path), (16, 24), count=2, seed=3) == str(tmp_path)
    rng = np.random.default_rng(3)
    for i in range(2):
        want = rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)
        np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / f"{i}.png")), want)
    images = testing.synthetic_images(3, 16, 24, seed=1)
    assert images.shape == (3, 16, 24, 3) and images.dtype == np.float32
    assert np.abs(images).max() <= 0.95 + 1e-6 and images.std() > 0.1
    np.testing.assert_array_equal(images, testing.synthetic_images(3, 16, 24, seed=1))
    assert not hasattr(pretrain_mpp, "synthetic_images") and not hasattr(inspect_vit, "smoke_images")


@pytest.mark.one_backend
def test_help_imports_no_framework():
    """`--help` answers before Keras, TensorFlow, JAX or PyTorch are imported."""
    code = (
        "import runpy, sys\n"
        "for name in ('demo', 'pretrain', 'finetune', 'vtab', 'pretrain_mpp', 'inspect_vit'):\n"
        "    sys.argv = [name, '--help']\n"
        "    try:\n"
        "        runpy.run_module('recipes.' + name, run_name='__main__')\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (name, e.code)\n"
        "print(sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert out.stdout.count("Named configs (--config=NAME)") == 6


RECIPE_MODULES = ("demo", "finetune", "inspect_vit", "pretrain", "pretrain_mpp", "vtab")


@pytest.mark.one_backend
def test_recipes_import_the_trainer_the_configs_and_the_library_never_each_other():
    """Issue 22: a recipe module is its configs and an entry point; what two
    recipes share lives in the trainer's modules or the library."""
    import ast

    for name in RECIPE_MODULES:
        tree = ast.parse((REPO_ROOT / "recipes" / f"{name}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "recipes" for alias in node.names}
        imported |= {node.module.split(".")[1] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     and (node.module or "").startswith("recipes.")}
        assert imported and not imported & set(RECIPE_MODULES), (name, sorted(imported))


@pytest.mark.one_backend
def test_named_configs_state_their_expected_result():
    expected = {
        "cifar10": "99.02", "cifar100": "92.06", "imagenet2012": "84.53",
        "oxford_iiit_pet": "94.67", "oxford_flowers102": "99.61",
    }
    for name, named in finetune.RECIPE.configs.items():
        assert f"{expected[name]} %" in named.expected, name
        assert finetune.RECIPE.command(name).startswith(f"python -m recipes.finetune --config={name}")
        steps = {"imagenet2012": 20_000, "oxford_iiit_pet": 500, "oxford_flowers102": 500}
        assert finetune.RECIPE.get_config(name).total_steps == steps.get(name, 10_000), name
    assert "Dropout" in finetune.__doc__ and "Dropout" in pretrain.__doc__
    for recipe in (pretrain, pretrain_mpp, vtab, demo, inspect_vit):
        assert all(named.summary and named.expected for named in recipe.RECIPE.configs.values()), recipe
    table3 = pretrain.RECIPE.get_config("imagenet2012")
    checks.check(table3)  # the library's defaults (warmup), filled in as a run starts
    assert (table3.learning_rate, table3.weight_decay, table3.batch_size) == (3e-3, 0.3, 4096)
    assert (table3.warmup_steps, table3.epochs, table3.dropout_rate) == (10_000, 300.0, 0.1)
    assert (table3.optimizer, table3.decay_type, table3.pipeline, table3.pre_logits) == ("adam", "cosine", "pretrain", True)
    assert checks.steps_from_epochs(300, 1_268_355, 4096) == 92_897
    # Issue 13: a custom model inherits the config's dropout, and is told so.
    custom = table3.replace(model=None, model_overrides={"hidden_size": 16})
    assert "dropout_rate=0.1" in checks.inherited_dropout_warning(custom)
    assert checks.inherited_dropout_warning(table3) is None
    assert checks.inherited_dropout_warning(custom.replace(dropout_rate=0.0)) is None


def test_dropout_in_model_overrides_wins_and_is_said():
    """Issue 13: a `dropout_rate` inside --model_overrides is not overridden
    by the config's --dropout_rate (imagenet2012 sets 0.1), and the start
    header says which one the model trains with."""
    _, config, _ = pretrain.parse([
        "--config=imagenet2012", "--model=none", '--model_overrides={"hidden_size": 16, "dropout_rate": 0}',
    ])
    assert config.dropout_rate == 0.1 and train.model_kwargs(config)["dropout_rate"] == 0
    assert checks.inherited_dropout_warning(config) == (
        "warning: --model_overrides sets dropout_rate=0, which wins over --dropout_rate=0.1 "
        "(the config's or the flag's)."
    )
    model, _ = train.build_model(config.replace(model_overrides=dict(config.model_overrides, **TINY)), 3, (16, 16, 3))
    assert model.get_layer("dropout").rate == 0 and model.get_layer("encoderblock_0").dropout_rate == 0
    # The same value twice, or no --dropout_rate: nothing to say.
    assert checks.inherited_dropout_warning(config.replace(dropout_rate=0.0)) is None
    assert checks.inherited_dropout_warning(config.replace(dropout_rate=None)) is None
    assert train.model_kwargs(config.replace(dropout_rate=None))["dropout_rate"] == 0
    # Without one in --model_overrides, --dropout_rate applies (and is warned about).
    plain = config.replace(model_overrides={"hidden_size": 16})
    assert train.model_kwargs(plain)["dropout_rate"] == 0.1
    assert "trains with this config's dropout_rate=0.1" in checks.inherited_dropout_warning(plain)


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
    files = {s: sum(len(f) for _, _, f in os.walk(run_dir / "data" / "digits_test0.2_seed0" / s))
             for s in ("train", "test")}
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
    # Nothing but what --overwrite may delete (issue 21).
    for directory in (run_dir, run_dir / "pretrain", run_dir / "finetune"):
        assert set(os.listdir(directory)) <= rundir.RUN_ENTRIES, os.listdir(directory)
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
    config = TrainConfig(model=None, model_overrides=TINY, weights=npz, image_size=32)
    for num_classes in (10, 7):
        model, notes = train.build_model(config, num_classes, (32, 32, 3))
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


def test_demo_rerun_is_instant_and_a_changed_config_is_refused(demo_run, monkeypatch, capsys):
    run_dir, outcome = demo_run

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run trained again")

    monkeypatch.setattr(train, "train", no_training)
    argv = [f"--run_dir={run_dir}", "--pretrain_steps=4", "--verbose=0", f"--model_overrides={json.dumps(TINY)}"]
    capsys.readouterr()
    again = demo.main(argv + ["--finetune_steps=4"])
    assert again["finetune"]["accuracy"] == outcome["finetune"]["accuracy"]
    # A finished run prints its main results again (finetune.SUMMARY_KEYS;
    # the whole summary is in summary.json).
    out = capsys.readouterr().out
    assert f"Fine-tuning finished earlier: {run_dir / 'finetune'}" in out
    assert f"accuracy: {outcome['finetune']['accuracy']:.4f}" in out and "model_npz:" in out
    with pytest.raises(ValueError, match="another config .*total_steps: 4 -> 5"):
        demo.main(argv + ["--finetune_steps=5"])
    # Another split: refused, the first split's files untouched (they were
    # rewritten in place, 549 digits then in both splits, and the finished
    # runs reported).
    with pytest.raises(ValueError, match="another config .*dataset: .*digits_test0.2_seed0' -> .*digits_test0.5_seed0"):
        demo.main(argv + ["--finetune_steps=4", "--test_fraction=0.5"])
    split = {s: {name for _, _, names in os.walk(run_dir / "data" / "digits_test0.2_seed0" / s) for name in names}
             for s in ("train", "test")}
    assert (len(split["train"]), len(split["test"]), split["train"] & split["test"]) == (1437, 360, set())
    # From the command line: one `error:` line, exit status 2.
    with pytest.raises(SystemExit) as exit_info:
        cli.run_command(lambda: demo.main(argv + ["--finetune_steps=5"]))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: the run directory") and err.count("\n") == 1


# ---------------------------------------------------------------------------
# Smoke runs on mocked tfds, the sweep.
# ---------------------------------------------------------------------------


def test_finetune_smoke_on_mocked_tfds(tmp_path, capsys):
    summary = finetune.main(["--smoke", f"--run_dir={tmp_path}", "--verbose=1"])
    out = capsys.readouterr().out
    # The start header, progress in updates (not micro-batches), a labelled
    # evaluation, no `examples` metric on the bars.
    for line in (f"== finetune: {tmp_path}", f"tensorboard --logdir {tmp_path / 'logs'}",
                 f"backend {BACKEND}, distribution", "head: zero-initialised",
                 "data: train 'train[:98%]'", "updates: 4 of 16 (2 x 8)", "Updates 1-2 of 4",
                 "Updates 3-4 of 4", "Evaluating on 'test'", "Fine-tuning finished"):
        assert line in out, (line, out)
    assert "/update" in out and "- examples:" not in out
    assert summary["steps"] == 4 and summary["eval_examples"] == 16  # generated examples
    assert summary["num_classes"] == 10 and summary["config"]["dataset"] == "cifar10"
    assert summary["backend"] == BACKEND and summary["images_per_second"] > 0
    assert np.isfinite(summary["final_loss"]) and 0.0 <= summary["accuracy"] <= 1.0
    assert (tmp_path / "model.keras").exists() and (tmp_path / "model.npz").exists()
    assert read_npz(str(tmp_path / "model.npz"))["head/kernel"].shape == (16, 10)


def test_finetune_linear_probe_trains_the_head_only(tmp_path):
    """--linear_probe (keras_vit.freeze_backbone): starting from a checkpoint,
    every weight but the head's comes out exactly as it went in."""
    finetune.main(["--smoke", f"--run_dir={tmp_path / 'a'}", "--verbose=0"])
    start = read_npz(str(tmp_path / "a" / "model.npz"))
    finetune.main(["--smoke", f"--run_dir={tmp_path / 'b'}", f"--weights={tmp_path / 'a' / 'model.npz'}",
                   "--linear_probe", "--learning_rate=0.3", "--verbose=0"])
    end = read_npz(str(tmp_path / "b" / "model.npz"))
    assert set(start) == set(end)
    for key in start:
        if key.startswith("head/"):
            continue
        np.testing.assert_array_equal(end[key], start[key], err_msg=key)
    assert np.abs(end["head/kernel"]).max() > 0  # the head trained (from zero)
    # The saved model is still a linear probe (issue 21).
    saved = keras.saving.load_model(tmp_path / "b" / "model.keras", compile=False)
    assert [w.path for w in saved.trainable_weights] == ["head/kernel", "head/bias"]
    # Issue 23, --lora_rank (with --remat): the saved model is the merged one,
    # whose kernels changed only where adapters were (query, value) and in the
    # head; the adapters and the head alone are in lora.npz, and load onto
    # the starting checkpoint's model to give the merged model's logits.
    summary = finetune.main(["--smoke", f"--run_dir={tmp_path / 'c'}", f"--weights={tmp_path / 'a' / 'model.npz'}",
                             "--lora_rank=2", "--remat", "--learning_rate=0.3", "--verbose=0"])
    assert "LoRA rank 2 on query, value" in " ".join(summary["notes"])
    merged = read_npz(str(tmp_path / "c" / "model.npz"))
    changed = sorted(k for k in start if not np.array_equal(merged[k], start[k]))
    assert changed == ["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel",
                       "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/value/kernel",
                       "head/bias", "head/kernel"], changed
    model = keras_vit.ViT(None, input_shape=(16, 16, 3), num_classes=10, weights=str(tmp_path / "a" / "model.npz"),
                          **configs.SMOKE_MODEL)
    keras_vit.load_lora(keras_vit.enable_lora(model, 2), summary["lora_npz"])
    x = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype("float32")
    loaded = keras.saving.load_model(summary["model_keras"], compile=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), keras.ops.convert_to_numpy(loaded(x)),
                               rtol=1e-5, atol=1e-6)


def test_finetune_batch_augmentation_flag(tmp_path, monkeypatch, capsys):
    """--batch_augmentation: Keras layers on the training batches (MixUp
    mixes the labels), the smoke run trains; off by default; an unknown
    layer is one error line."""
    assert finetune.RECIPE.get_config("cifar10").batch_augmentation is None
    # RandAugment through the pipeline is tests/data/test_data.py's (its
    # tracing costs a minute under JAX); here a cheap layer and MixUp.
    summary = finetune.main(["--smoke", f"--run_dir={tmp_path / 'run'}", "--verbose=0",
                             "--batch_augmentation=RandomFlip,MixUp"])
    assert np.isfinite(summary["final_loss"]) and summary["steps"] == 4
    assert summary["config"]["batch_augmentation"] == "RandomFlip,MixUp"
    # Issue 21: a layer that cannot run in tf.data (an unadapted
    # Normalization) failed deep inside TensorFlow.
    err = _error(finetune.main, ["--smoke", f"--run_dir={tmp_path / 'norm'}", "--batch_augmentation=Normalization"],
                 capsys)
    assert err.startswith("error: --batch_augmentation=Normalization: `batch_augmentation` layer") and "normalization" in err
    assert "cannot run on" in err and "in tf.data" in err
    labels = []

    def fake_train(config, run_dir, setup, **kwargs):
        labels.append(next(iter(inputs.load_data(config, run_dir).train(16)))[1].numpy())
        return {"accuracy": 0.0, "eval_examples": 0, "steps": 0}

    monkeypatch.setattr(train, "train", fake_train)
    finetune.main(["--smoke", f"--run_dir={tmp_path / 'fake'}", '--batch_augmentation=[{"class_name": "MixUp", '
                   '"config": {"alpha": 1.0}}]'])
    np.testing.assert_allclose(labels[0].sum(-1), 1.0, atol=1e-6)
    assert (labels[0].max(-1) < 0.99).any()  # mixed, no longer one-hot
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.run_command(lambda: finetune.main(["--smoke", f"--run_dir={tmp_path / 'bad'}",
                                               "--batch_augmentation=RandAugment,Mixup"]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == ("error: --batch_augmentation=RandAugment,Mixup: `batch_augmentation` names an unknown Keras "
                   "layer 'Mixup' (a class of keras.layers, e.g. RandAugment, MixUp, CutMix). Received: "
                   "batch_augmentation='RandAugment,Mixup'\n")
    assert not (tmp_path / "bad").exists()


def test_sweep_trains_the_best_lr_on_the_full_split(tmp_path, monkeypatch):
    """The paper's protocol: every lr on sweep_train -> sweep_val, then the
    best on train_split, reported on test_split (training stubbed)."""
    calls = []

    def fake_train(config, run_dir, setup, *, save=True, **kwargs):
        data = inputs.load_data(config, run_dir)
        images, labels = next(iter(data.train(4)))
        assert images.shape == (4, 16, 16, 3) and labels.shape == (4, data.num_classes)
        calls.append((config.learning_rate, os.path.relpath(run_dir, tmp_path), save,
                      config.train_split, config.test_split))
        score = {0.001: 0.5, 0.003: 0.75, 0.01: 0.75, 0.03: 0.25}[config.learning_rate]
        return {"accuracy": score, "eval_examples": 16, "steps": config.total_steps}

    monkeypatch.setattr(train, "train", fake_train)
    summary = finetune.main(["--smoke", f"--run_dir={tmp_path}", "--sweep", "--lr_grid=0.001,0.003,0.01,0.03"])
    sweep = ("train[:98%]", "train[98%:]")
    assert calls == [
        (0.001, "sweep/lr_0.001", False, *sweep), (0.003, "sweep/lr_0.003", False, *sweep),
        (0.01, "sweep/lr_0.01", False, *sweep), (0.03, "sweep/lr_0.03", False, *sweep),
        (0.003, ".", True, "train[:98%]", "test"),  # the first of the best
    ]
    assert summary["learning_rate"] == 0.003 and [s["val_accuracy"] for s in summary["sweep"]] == [0.5, 0.75, 0.75, 0.25]


@pytest.mark.one_backend
def test_every_training_run_starts_from_the_configs_seed(tmp_path, monkeypatch):
    """A sweep's trials and final run (and a resumed sweep's) drew their
    initial weights from wherever the previous run left the random state:
    the final run differed from a plain run of the same config."""
    draws = []

    class Stop(Exception):
        pass

    def first_step_of_a_run(config, run_dir):
        draws.append(np.random.rand(3))
        raise Stop

    monkeypatch.setattr(inputs, "load_data", first_step_of_a_run)
    config = finetune.RECIPE.get_config(smoke=True)
    for run in ("a", "b"):
        np.random.rand(5)  # what an earlier run consumed
        with pytest.raises(Stop):
            train.train(config, str(tmp_path / run), setup=None)
    np.testing.assert_array_equal(draws[0], draws[1])
    # tfds names may carry a config and a version (they were taken for folders).
    assert not inputs._is_folder("eurosat/rgb:2.*.*") and inputs._is_folder(str(tmp_path))


# ---------------------------------------------------------------------------
# Run directories (issue 21): a recipe writes only into a new or empty
# directory or its own run, and deletes only what it wrote, never under a
# live run.
# ---------------------------------------------------------------------------


def _files(path):
    return {p.name: p.read_text() for p in path.iterdir()}


@pytest.mark.one_backend
def test_a_folder_no_recipe_wrote_is_refused_and_untouched(tmp_path, capsys):
    # Someone's model folder with a config.json, with and without --overwrite.
    for extra in ([], ["--overwrite"]):
        folder = tmp_path / f"model{len(extra)}"
        folder.mkdir()
        for name, text in {"config.json": '{"architectures": ["ViTModel"]}', "model.safetensors": "w",
                           "notes.txt": "mine"}.items():
            (folder / name).write_text(text)
        before = _files(folder)
        err = _error(finetune.main, ["--smoke", f"--run_dir={folder}", *extra], capsys)
        assert f"the run directory {folder} is not empty (config.json, model.safetensors, notes.txt)" in err
        assert "Pass a new or empty --run_dir" in err
        assert _files(folder) == before
    # No config.json: the user's model.keras and history.csv stay as they are.
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "model.keras").write_text("theirs")
    (folder / "history.csv").write_text("epoch,loss\n0,1.0\n")
    assert "is not empty (history.csv, model.keras)" in _error(pretrain.main, ["--smoke", f"--run_dir={folder}"], capsys)
    assert _files(folder) == {"model.keras": "theirs", "history.csv": "epoch,loss\n0,1.0\n"}
    path = tmp_path / "a_file"
    path.write_text("x")
    assert f"the run directory {path} is a file" in _error(vtab.main, ["--smoke", f"--run_dir={path}"], capsys)
    assert path.read_text() == "x"
    # A place nobody may write (under a file: no permission bits to rely on as root).
    assert f"the run directory {path / 'run'} cannot be written" in _error(
        finetune.main, ["--smoke", f"--run_dir={path / 'run'}"], capsys)


@pytest.mark.one_backend
def test_overwrite_deletes_only_what_recipes_wrote_and_damaged_records_are_one_line(tmp_path, capsys):
    run = f"--run_dir={tmp_path / 'run'}"
    refused = ["--smoke", run, "--distribution=nope"]  # refused after the config is recorded: no work
    _error(finetune.main, refused, capsys)
    (tmp_path / "run" / "summary.json").write_text("[1, 2]")
    assert "summary.json holds a list; a recipe writes a JSON object there" in _error(finetune.main, refused, capsys)
    (tmp_path / "run" / "config.json").write_text("{broken")
    assert "config.json cannot be read" in _error(finetune.main, refused, capsys)
    # --overwrite: the recipe's files go, the user's notes stay.
    (tmp_path / "run" / "notes.txt").write_text("mine")
    (tmp_path / "run" / "checkpoints").mkdir()
    _error(finetune.main, refused + ["--overwrite"], capsys)
    assert sorted(os.listdir(tmp_path / "run")) == [rundir.MARKER, "config.json", "notes.txt"]


@pytest.mark.one_backend
def test_a_record_that_cannot_be_written_is_one_error_and_leaves_no_temporary(tmp_path, monkeypatch):
    """A full disk as `summary.json` or `result.json` is written: one
    RecipeError naming the file, the earlier record kept, nothing else left."""
    path = tmp_path / "summary.json"
    umask = os.umask(0o022)
    try:
        rundir.write_json(str(path), {"steps": 1})
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by others, as `open` creates (was 0600)

    def full_disk(source, target):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rundir.os, "replace", full_disk)
    with pytest.raises(cli.RecipeError, match=f"cannot write {re.escape(str(path))}: No space left on device"):
        rundir.write_json(str(path), {"steps": 2})
    assert os.listdir(tmp_path) == ["summary.json"] and rundir.read_json(str(path)) == {"steps": 1}


# One backend: what differs per backend (the checkpoint writer's error and
# the last good checkpoint kept) is the library's, tested on every backend by
# tests/training/test_fault_tolerance.py; resuming a recipe run is tested on
# every backend by test_pretrain_killed_then_resumed_by_the_same_command.
@pytest.mark.one_backend
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full (every write: ENOSPC)")
def test_a_full_disk_is_one_error_line_and_the_run_resumes(tmp_path):
    """Issue 21, in a real process: the checkpoint of update 4 goes to
    /dev/full (a disk that is always full); update 2's is kept, and the
    same command finishes the run once there is space."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "recipes.finetune", "--smoke", f"--run_dir={run_dir}", "--verbose=0"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / rundir.MARKER).touch()  # a run directory of the recipe's
    (run_dir / "checkpoints" / ".tmp-step-000000000004.weights.h5").symlink_to("/dev/full")
    full = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    # Exit status 2 (not a segfault), the message last, no traceback (the
    # smoke run's stand-in tfds data logs its own warnings first).
    assert full.returncode == 2, full.stderr[-3000:]
    assert "Traceback" not in full.stderr and full.stderr.splitlines()[-1].startswith(
        f"error: Writing the checkpoint of step 4 in {run_dir / 'checkpoints'} failed: the disk is full. "
        "The last good checkpoint is kept (step-000000000002.weights.h5)"), full.stderr
    summary = finetune.main([*command[3:]])
    assert summary["steps"] == 4 and summary["resumed_from_step"] == 2


@pytest.mark.skipif(BACKEND == "jax", reason="on JAX the flag is TensorFlow's op determinism for tf.data, "
                    "as on the tensorflow run (XLA:CPU is deterministic as it is)")
def test_deterministic_runs_end_with_the_same_weights_bit_for_bit(tmp_path):
    """Issue 21, as users run it: two processes of the same command with
    `--deterministic` write the same weights, Keras' batch-augmentation
    layers included (their seed generators are stateful: without the flag
    tf.data's parallel map calls them in any order, and the weights
    differed by about 5e-3)."""
    command = [sys.executable, "-m", "recipes.finetune", "--smoke", "--verbose=0", "--deterministic",
               "--batch_augmentation=RandomFlip,MixUp"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    runs = [subprocess.Popen([*command, f"--run_dir={tmp_path / str(i)}"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for run in runs:
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr[-3000:]
    first, second = (read_npz(str(tmp_path / str(i) / "model.npz")) for i in range(2))
    assert first.keys() == second.keys() and len(first) > 4
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
    summary = json.loads((tmp_path / "0" / "summary.json").read_text())
    assert summary["config"]["deterministic"] is True and summary["steps"] == 4


def _live_run():
    """A fine-tuning run that stays alive in its first epoch, holding its
    run directory, until the test kills it."""
    run_dir, ready = os.environ["KERAS_VIT_TEST_RUN_DIR"], os.environ["KERAS_VIT_TEST_READY"]

    class Wait(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if os.path.exists(os.path.join(run_dir, "checkpoints", "checkpoint.json")):
                open(ready, "w").close()
                time.sleep(600)

    finetune.main(["--smoke", f"--run_dir={run_dir}", "--verbose=0", "--checkpoint_every=1"], callbacks=[Wait()])


@pytest.mark.one_backend  # the run directory's OS lock: the same on every backend
def test_a_live_run_is_never_deleted_nor_joined(tmp_path):
    """Issue 21: --overwrite while another process trains in the directory
    deleted it under the live run. In real processes: the live run, then
    the same command with and without --overwrite."""
    run_dir, ready = tmp_path / "run", tmp_path / "ready"
    env = dict(os.environ, KERAS_VIT_TEST_RUN_DIR=str(run_dir), KERAS_VIT_TEST_READY=str(ready),
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    live = subprocess.Popen([sys.executable, "-c", "from tests.recipes.test_recipes import _live_run; _live_run()"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not ready.exists():
            assert live.poll() is None and time.time() < deadline, live.stderr.read()[-3000:] if live.poll() else "slow"
            time.sleep(0.2)
        before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
        assert "checkpoints/checkpoint.json" in before and "history.csv" in before
        for extra in (["--overwrite"], []):
            done = subprocess.run(
                [sys.executable, "-m", "recipes.finetune", "--smoke", f"--run_dir={run_dir}", "--verbose=0", *extra],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
            assert done.returncode == 2, done.stderr[-3000:]
            assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
            assert f"the run directory {run_dir} is in use by a live run (pid {live.pid} on " in done.stderr
        assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == before
    finally:
        live.kill()
        live.wait()
    # The lock died with the process: the directory opens again.
    with rundir.claim(str(run_dir)):
        pass


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
        [sys.executable, "-c", "from tests.recipes.test_recipes import _child; _child()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


def test_pretrain_killed_then_resumed_by_the_same_command(tmp_path, capsys):
    killed = _run_child(tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    with open(tmp_path / "checkpoints" / "checkpoint.json") as f:
        checkpoint = json.load(f)
    # Killed after micro-batch 11 (update 5, in the second Keras epoch of 4
    # updates): the last checkpoint is the first epoch's end, where
    # `fit(initial_epoch=1)` resumes (issue 22: checkpoints only at epoch
    # ends); no final model yet.
    assert (checkpoint["step"], checkpoint["epoch"], checkpoint["batch"]) == (4, 1, 0)
    assert not (tmp_path / "summary.json").exists()

    # The same command again (here in this process: a fresh process would
    # only add seconds of imports).
    summary = pretrain.main(_argv(tmp_path)[:-1] + ["--verbose=2"])
    out = capsys.readouterr().out
    assert "Resumed from update 4 of 8" in out
    # The smoke run's custom model inherits the imagenet2012 config's dropout.
    assert "warning: the custom model (--model=none) trains with this config's dropout_rate=0.1" in out
    progress = [line for line in out.splitlines() if line.startswith("update ")]
    assert progress[-1].startswith("update 8/8: ") and not any("examples" in line for line in progress)
    assert summary["steps"] == 8 and summary["resumed_from_step"] == 4
    assert summary["config"]["dataset"] == "imagenet2012" and summary["num_classes"] == 1000
    with open(tmp_path / "checkpoints" / "checkpoint.json") as f:
        assert json.load(f)["step"] == 8
    with open(tmp_path / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["epoch"]) for row in rows] == [0, 1]
    # The summary covers the whole run, not only this process's share
    # (issue 21): both epochs, the last loss, the time since the first start.
    assert summary["history"]["loss"] == [float(row["loss"]) for row in rows]
    assert summary["final_loss"] == float(rows[-1]["loss"])
    started = json.loads((tmp_path / "config.json").read_text())["started"]
    assert started < os.path.getmtime(tmp_path / "killed") < started + summary["total_wall_time_s"]
    assert (tmp_path / "model.keras").exists() and (tmp_path / "model.npz").exists()


@pytest.mark.one_backend
def test_a_resumed_run_logs_the_epochs_it_trains_again_once(tmp_path):
    """Epochs trained after the last checkpoint are trained again on resume:
    their rows were kept in history.csv and logged a second time."""
    path = tmp_path / "history.csv"
    path.write_text("epoch,loss\n0,3.0\n1,2.0\n2,1.5\n3,1.")  # killed while writing epoch 3
    rundir.trim_history(str(path), 2)  # resumed at epoch 2
    assert path.read_text() == "epoch,loss\n0,3.0\n1,2.0\n"
    rundir.trim_history(str(path), 0)
    assert path.read_text() == "epoch,loss\n"
    rundir.trim_history(str(tmp_path / "none.csv"), 1)  # a first start
    assert os.listdir(tmp_path) == ["history.csv"]


# ---------------------------------------------------------------------------
# The evaluation loss on padded batches (issue 12).
# ---------------------------------------------------------------------------


def _image_folder(root, per_class, size=16, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split in ("train", "test"):
        for label in ("a", "b"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                pixels[..., 0] = 40 if label == "a" else 210  # learnable
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def test_eval_loss_is_right_with_padded_batches(tmp_path):
    """8 test images in an evaluation batch of 64 (56 weight-0 rows): the
    reported loss is the loss of the 8, at the end and in history.csv."""
    data_dir = _image_folder(tmp_path / "data", per_class=4)
    run_dir = tmp_path / "run"
    summary = finetune.main([
        "--smoke", f"--dataset={data_dir}", "--train_split=train", "--test_split=test",
        "--eval_batch_size=64", "--total_steps=2", "--log_every=2", "--eval_every=2",
        "--learning_rate=0.3", f"--run_dir={run_dir}", "--verbose=0",
    ])
    assert summary["eval_examples"] == 8
    model = keras.saving.load_model(str(run_dir / "model.keras"), compile=False)
    from keras_vit import data

    source = data.from_directory(str(data_dir / "test"))
    images, labels = next(iter(data.finetune_pipeline(source, training=False, batch_size=8, image_size=16)))
    logits = keras.ops.convert_to_numpy(model(np.asarray(images))).astype("float64")
    log_softmax = logits - logits.max(-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
    want = float(-(np.asarray(labels) * log_softmax).sum(-1).mean())
    assert want > 0.1  # a real loss, not a padded-down one
    assert summary["eval_loss"] == pytest.approx(want, rel=1e-4)
    with open(run_dir / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["val_loss"]) == pytest.approx(want, rel=1e-4)
    accuracy = float(np.mean(logits.argmax(-1) == np.asarray(labels).argmax(-1)))
    assert summary["accuracy"] == pytest.approx(accuracy)


# ---------------------------------------------------------------------------
# Expected failures: one `error:` line, exit status 2, no traceback.
# ---------------------------------------------------------------------------


def _error(main, argv, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.run_command(lambda: main(argv))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.one_backend
def test_steps_per_execution_under_mirrored_replicas_is_refused():
    """Keras' fit fails under MirroredStrategy over 2 replicas with more than
    one step per execution (a 45-frame traceback; tests/test_distribute.py
    runs the strategy itself): refused with the set-up's other checks."""
    from keras_vit import distribute

    config = finetune.RECIPE.get_config(smoke=True).replace(steps_per_execution=2)
    with pytest.raises(cli.RecipeError, match=r"^--steps_per_execution must be 1 under MirroredStrategy over 2 "
                                              r"replicas: .* Received: --steps_per_execution=2$"):
        checks.check_steps_per_execution(config, distribute.DistributionSetup("mirrored", "tensorflow", num_replicas=2))
    checks.check_steps_per_execution(config, distribute.DistributionSetup("mirrored", "tensorflow", num_replicas=1))
    checks.check_steps_per_execution(config, distribute.DistributionSetup("data_parallel", "jax", num_replicas=2))


@pytest.mark.skipif(BACKEND != "torch", reason="Keras' PyTorch trainer only")
def test_steps_per_execution_on_pytorch_is_one_error_line(tmp_path, capsys):
    """It failed inside `fit`, a traceback after the set-up."""
    assert ("--steps_per_execution must be 1 on PyTorch (Keras runs one batch per call there). Received: "
            "--steps_per_execution=2") in _error(
        finetune.main, ["--smoke", f"--run_dir={tmp_path}", "--steps_per_execution=2"], capsys)


def test_expected_failures_end_in_one_error_line(tmp_path, capsys):
    run = f"--run_dir={tmp_path / 'run'}"
    assert "--total_steps must be in [0, inf). Received: --total_steps=-5" in _error(
        finetune.main, ["--smoke", run, "--total_steps=-5"], capsys)
    assert ("--total_steps=4, --warmup_steps=4: `total_steps` must be larger than `warmup_steps`"
            in _error(finetune.main, ["--smoke", run, "--warmup_steps=4"], capsys))
    assert "unknown VTAB task or group 'nope'" in _error(vtab.main, ["--smoke", run, "--tasks=nope"], capsys)
    assert "--model=ViT-Q_99" in _error(finetune.main, ["--smoke", run, "--model=ViT-Q_99"], capsys)
    assert "no folder" in _error(
        pretrain.main, ["--smoke", run, f"--dataset={tmp_path / 'missing'}", "--train_split=train"], capsys)
    # A dataset that is not prepared, without downloads: the advice in the recipes' flags.
    tiny = ['--model=none', '--model_overrides={"hidden_size": 8, "num_layers": 1, "num_heads": 2, "mlp_dim": 8, '
            '"patch_size": 8}', "--weights=none", "--image_size=16", "--batch_size=4", "--accum_steps=1",
            "--total_steps=2", "--warmup_steps=0", "--eval_batch_size=8"]
    err = _error(finetune.main, [*tiny, f"--run_dir={tmp_path / 'offline'}", "--dataset=cifar10", "--download=false",
                                 f"--data_dir={tmp_path / 'tfds'}"], capsys)
    assert "Dataset 'cifar10' is not prepared" in err and "--download=true" in err, err
    # Weights that cannot load are refused before any data is read (a download, offline, retried for minutes).
    offline = [*tiny, f"--run_dir={tmp_path / 'early'}", "--dataset=cifar10", "--download=false",
               f"--data_dir={tmp_path / 'tfds'}"]
    missing = tmp_path / "missing.npz"
    assert f"--weights={missing}: Weights file not found" in _error(
        finetune.main, [*offline, f"--weights={missing}"], capsys)
    assert "--weights=imagenet21k: No 'imagenet21k' checkpoint is published for ViT-Ti_16" in _error(
        finetune.main, [*offline, "--model=Ti/16", "--weights=imagenet21k"], capsys)
    assert "--weights=augreg: Registered weights need a named variant" in _error(
        finetune.main, [*offline, "--weights=augreg"], capsys)
    # An unknown tfds name (a traceback and tfds' list of every dataset before).
    assert "--dataset=no_such_dataset_xyz, split 'train[:98%]'" in _error(
        finetune.main, ["--smoke", f"--run_dir={tmp_path / 'tfds'}", "--dataset=no_such_dataset_xyz"], capsys)
    assert "--distribution=nope" in _error(finetune.main, ["--smoke", run, "--distribution=nope"], capsys)
    assert "--weights=" in _error(
        finetune.main, ["--smoke", run, f"--weights={tmp_path / 'missing.npz'}"], capsys)
    assert "--model_overrides" in _error(finetune.main, ["--smoke", run, '--model_overrides={"a": 1}'], capsys)
    # Keras runs whole executions: 3 of the smoke run's 4 micro-batches per
    # epoch ran 6 (9 updates for 6, silently).
    assert ("--steps_per_execution must divide the micro-batches of a Keras epoch (log_every=2 x accum_steps=2 = 4), "
            "or more updates run than --total_steps: use --steps_per_execution=2. Received: --steps_per_execution=3"
            in _error(finetune.main, ["--smoke", run, "--steps_per_execution=3"], capsys))
    # Fields with a fixed set of values, in every recipe that has them.
    bad_values = [
        (finetune.main, "--augmentation=crop", "['inception_crop', 'resize_crop', 'resize']"),
        (finetune.main, "--decay_type=cosinus", "['cosine', 'linear']"),
        (finetune.main, "--accumulator_dtype=float64", "['bfloat16', 'float32']"),
        (finetune.main, "--cache=maybe", "['auto', 'true', 'false']"),
        (finetune.main, "--jit_compile=maybe", "['auto', 'true', 'false']"),
        (pretrain.main, "--decay_type=cosinus", "['cosine', 'linear']"),
        (pretrain.main, "--first_moment_dtype=float64", "['bfloat16', 'float32']"),
        (pretrain.main, "--cache=maybe", "['auto', 'true', 'false']"),
        (pretrain_mpp.main, "--decay_type=cosinus", "['cosine', 'linear']"),
        (pretrain_mpp.main, "--jit_compile=maybe", "['auto', 'true', 'false']"),
        (vtab.main, "--augmentation=crop", "['inception_crop', 'resize_crop', 'resize']"),
        (vtab.main, "--decay_type=cosinus", "['cosine', 'linear']"),
        (demo.main, "--jit_compile=maybe", "['auto', 'true', 'false']"),
        (finetune.main, "--optimizer=rmsprop", "['sgd', 'adam']"),
        (pretrain.main, "--pipeline=augreg", "['finetune', 'pretrain']"),
    ]
    for main, flag, choices in bad_values:
        name, value = flag.split("=")
        err = _error(main, ["--smoke", run, flag], capsys)
        assert err == f"error: {name} must be one of {choices}. Received: {flag}\n", (main, err)
    assert "AugReg presets (RandAugment, mixup) come with the pretrain pipeline's inception crop" in _error(
        pretrain.main, ["--smoke", run, "--augreg=medium1", "--augmentation=resize"], capsys)
    assert "--momentum is not an option of keras_vit.training.pretraining_optimizer" in _error(
        pretrain.main, ["--smoke", run, "--momentum=0.5"], capsys)
    assert "--lora_rank trains adapters in the backbone, --linear_probe freezes all of it" in _error(
        finetune.main, ["--smoke", run, "--lora_rank=4", "--linear_probe"], capsys)
    assert "--lora_targets must be names from ['query', 'key', 'value', 'output', 'mlp']" in _error(
        vtab.main, ["--smoke", run, "--lora_rank=4", "--lora_targets=query,qkv"], capsys)
    assert "--lora_rank must be in [1, inf). Received: --lora_rank=0" in _error(
        finetune.main, ["--smoke", run, "--lora_rank=0"], capsys)
    # Lists as they were typed (Python's tuples before: --image_size=(16, 24, 3)).
    assert _error(pretrain_mpp.main, ["--smoke", run, "--image_size=16,24,3"], capsys).endswith(
        "Received: --image_size=16,24,3\n")
    assert _error(finetune.main, ["--smoke", run, "--sweep", "--steps_grid=2"], capsys).endswith(
        "Received: --steps_grid=2, --warmup_grid=\n")
    # Past what the model's kernels can take: the library's refusal, one line (a traceback before).
    assert "--lora_rank=1000: `rank` must be at most" in _error(finetune.main, ["--smoke", run, "--lora_rank=1000"],
                                                              capsys)
    # Refused before any work: no training, no VTAB task, no demo data.
    assert sorted(os.listdir(tmp_path / "run")) == [rundir.MARKER, "config.json"]
    # A batch that does not split over the replicas: said before any work,
    # naming the flag and a value that works.
    config = finetune.RECIPE.get_config(smoke=True).replace(batch_size=12)
    with pytest.raises(cli.RecipeError, match="--batch_size=12 .* use --batch_size=16"):
        checks.check_batches(config, types.SimpleNamespace(num_replicas=8, mode="data_parallel"))
    with pytest.raises(cli.RecipeError, match="--eval_batch_size=12 .* use --eval_batch_size=16"):
        checks.check_batches(config.replace(batch_size=16, eval_batch_size=12),
                               types.SimpleNamespace(num_replicas=8, mode="data_parallel"))


_TWO_WORKERS = json.dumps(
    {"cluster": {"worker": ["localhost:12345", "localhost:12346"]}, "task": {"type": "worker", "index": 0}}
)
# A machine with 2 devices: the CPU split into 2 logical ones before the
# recipe runs (as tests/test_distribute.py does), so TensorFlow loads before
# the command; it loads as the command loads it (`cli.run_command` sets
# TF_CPP_MIN_LOG_LEVEL's default, `cli.import_tensorflow_quietly` filters).
_TWO_CPUS = (
    "import os, runpy, sys\n"
    "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')\n"
    "from recipes import cli\n"
    "cli.import_tensorflow_quietly()\n"
    "import tensorflow as tf\n"
    "cpu = tf.config.list_physical_devices('CPU')[0]\n"
    "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
    "sys.argv = ['recipes.finetune'] + sys.argv[1:]\n"
    "runpy.run_module('recipes.finetune', run_name='__main__')\n"
)
# What TensorFlow 2.21's native libraries print at import on a CPU with AMX,
# whatever TF_CPP_MIN_LOG_LEVEL says (twice per process), written to file
# descriptor 2 as native code writes it, so that any CPU shows it; and a
# native warning, which must reach the user.
_AMX_STARTUP = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1764028026.123456   4242 port.cc:153] oneDNN custom operations are on. You may see "
    "slightly different numerical results due to floating-point round-off errors from different "
    "computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n"
) * 2 + "W0000 00:00:1764028026.200000   4242 native.cc:1] a native warning\n"
_SITECUSTOMIZE = f"""
import os, sys

class _LoudTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow":
            sys.meta_path.remove(self)
            os.write(2, {_AMX_STARTUP.encode()!r})
        return None

sys.meta_path.insert(0, _LoudTensorFlow())
"""


@pytest.mark.skipif(BACKEND != "tensorflow", reason="the commands run on TensorFlow whatever the backend: once is enough")
def test_distribution_failures_as_a_user_sees_them(tmp_path):
    """`python -m recipes.finetune --smoke` in real processes (stdout and
    stderr as a terminal shows them, about 20 s each, mostly imports): no
    TPU, a batch that does not split over 2 replicas, TF_CONFIG with 2
    workers. Each ends in one `error:` line and nothing else (no TensorFlow
    start-up lines, no traceback), status 2, on every CPU: the lines CPUs
    with AMX print at import are simulated, and left out; a native warning
    is kept."""
    (tmp_path / "amx").mkdir()
    (tmp_path / "amx" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG", "TPU_NAME")}
    env.update(KERAS_BACKEND="tensorflow", PYTHONPATH=os.pathsep.join([str(tmp_path / "amx"), ROOT]))
    # The simulation works: looking TensorFlow up (as its import does)
    # writes the lines.
    plain = subprocess.run([sys.executable, "-c", "import importlib.util; importlib.util.find_spec('tensorflow')"],
                           env=env, stderr=subprocess.PIPE, text=True, timeout=120)
    assert plain.stderr.count("oneDNN custom operations are on") == 2, plain.stderr
    command = [sys.executable, "-m", "recipes.finetune", "--smoke"]
    cases = {
        "tpu": (command + [f"--run_dir={tmp_path / 'tpu'}", "--distribution=tpu"], {}),
        "batch": ([sys.executable, "-c", _TWO_CPUS, "--smoke", f"--run_dir={tmp_path / 'batch'}",
                   "--distribution=mirrored", "--accum_steps=1", "--batch_size=3"], {}),
        "workers": (command + [f"--run_dir={tmp_path / 'workers'}", "--distribution=auto"],
                    {"TF_CONFIG": _TWO_WORKERS}),
    }
    # One after the other: on 2 busy cores, processes started together each
    # take as long as all of them in a row.
    outputs = {}
    for name, (argv, extra) in cases.items():
        done = subprocess.run(argv, cwd=ROOT, env=dict(env, **extra), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=120)
        outputs[name] = (done.stdout, done.returncode)
    expected = {
        "tpu": "error: --distribution=tpu: No TPU could be initialised for mode='tpu'. On Colab/Kaggle, "
               "select a TPU runtime/accelerator;",
        "batch": "error: --batch_size=3 with --accum_steps=1 gives micro-batches of 3, which do not split "
                 "over the 2 replicas of distribution 'mirrored': use --batch_size=4 (a multiple of "
                 "accum_steps x replicas = 2).",
        "workers": "error: --distribution=auto: TF_CONFIG lists 2 workers, but keras_vit cannot train on "
                   "several TensorFlow workers:",
    }
    for name, (output, returncode) in outputs.items():
        lines = [line for line in output.splitlines() if line.strip()]
        assert returncode == 2 and "Traceback" not in output, (name, output)
        assert lines[0] == "W0000 00:00:1764028026.200000   4242 native.cc:1] a native warning", (name, output)
        assert len(lines) == 2 and lines[1].startswith(expected[name]), (name, output)
        assert not (tmp_path / name / "checkpoints").exists()


def test_image_folder_problems_are_one_line_or_skipped(tmp_path, capsys):
    """Issue 15: a test folder whose classes differ from the training
    folder's, and an undecodable image, are refused naming them; with
    --skip_bad_images the run goes on and its header counts what it left out."""
    data_dir = _image_folder(tmp_path / "data", per_class=4)
    common = ["--smoke", f"--dataset={data_dir}", "--train_split=train", "--test_split=test",
              "--total_steps=2", "--warmup_steps=1", "--log_every=1", "--verbose=0"]
    (data_dir / "test" / "b").rename(data_dir / "test" / "c")
    err = _error(finetune.main, [*common, f"--run_dir={tmp_path / 'r1'}"], capsys)
    assert "'c'" in err and "'b'" in err, err
    (data_dir / "test" / "c").rename(data_dir / "test" / "b")
    # One class: nothing to learn (it trained to a loss of 0 and an accuracy of 1).
    one_class = _image_folder(tmp_path / "one", per_class=2)
    for split in ("train", "test"):
        shutil.rmtree(one_class / split / "b")
    err = _error(finetune.main, [*common[:1], f"--dataset={one_class}", *common[2:], f"--run_dir={tmp_path / 'r0'}"],
                 capsys)
    assert "a classifier needs two classes or more; 'train' has 1" in err, err
    # --epochs: the flag given, and the updates it came to (the message
    # named --total_steps=2 alone, a value nobody passed).
    err = _error(finetune.main, [*common, "--total_steps=0", "--epochs=0.5", "--warmup_steps=2", "--batch_size=2",
                                 "--accum_steps=1", "--eval_batch_size=2",
                                 f"--run_dir={tmp_path / 'r4'}"], capsys)
    assert err.startswith("error: --epochs=0.5 of 8 examples at --batch_size=2 is 2 updates: --total_steps=2, "
                          "--warmup_steps=2: `total_steps` must be larger than `warmup_steps`"), err
    (data_dir / "train" / "a" / "broken.jpg").write_bytes(b"<html>not an image</html>")
    err = _error(finetune.main, [*common, f"--run_dir={tmp_path / 'r2'}"], capsys)
    assert "broken.jpg" in err and "pass --skip_bad_images=true" in err, err  # the flag, not the library's argument
    summary = finetune.main([*common, f"--run_dir={tmp_path / 'r3'}", "--skip_bad_images", "--verbose=1"])
    assert summary["eval_examples"] == 8
    assert "train 'train' (8 examples, 2 classes, 1 unreadable files skipped)" in capsys.readouterr().out


@pytest.mark.one_backend
def test_a_sweep_that_failed_before_training_takes_a_retyped_flag(tmp_path, capsys):
    """A sweep makes its first trial's folder before the data are read: a
    mistyped --dataset, retyped, was refused as "another config"."""
    common = ["--smoke", "--sweep", f"--run_dir={tmp_path / 'run'}", "--train_split=train", "--test_split=test",
              "--verbose=0"]
    assert "no folder" in _error(finetune.main, [*common, f"--dataset={tmp_path / 'typo'}"], capsys)
    assert [name for _, _, files in os.walk(tmp_path / "run" / "sweep") for name in files] == []
    err = _error(finetune.main, [*common, f"--dataset={tmp_path / 'retyped'}"], capsys)
    assert "no folder" in err and "another config" not in err, err


@pytest.mark.one_backend
def test_an_evaluation_split_without_labels_is_refused_before_training(tmp_path, capsys):
    """tfds gives -1 to the examples of a split without labels (imagenet2012's
    test split): it scored an accuracy of 1 after the whole training; now
    the run ends before it. The dataset is tfds' real preparation."""
    from tests.data.test_data import KerasVitSortedTiny  # noqa: F401 - registers the builder with tfds

    keras_vit.data.from_tfds("keras_vit_sorted_tiny", "train", data_dir=tmp_path / "tfds")  # tfds' progress bars
    run_dir = tmp_path / "run"
    err = _error(finetune.main, [
        "--dataset=keras_vit_sorted_tiny", f"--data_dir={tmp_path / 'tfds'}", "--test_split=unlabelled",
        "--model=none", '--model_overrides={"hidden_size": 16, "num_layers": 1, "num_heads": 2, "mlp_dim": 32, '
        '"patch_size": 4}', "--weights=none", "--image_size=8", "--batch_size=8", "--accum_steps=1",
        "--total_steps=2", "--warmup_steps=1", "--log_every=1", f"--run_dir={run_dir}", "--verbose=0"], capsys)
    assert err.startswith("error: --test_split=unlabelled: assertion failed: [keras_vit_sorted_tiny: labels must "
                          "be in [0, 10) (tfds gives -1 to the examples of a split without labels"), err
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "history.csv").exists()


def test_inspect_vit_keeps_the_pooling_its_rollout_starts_from():
    """Built without its head, a gap model with a class token (MAE's) lost
    its pooling, and rollout started from the class token, not from the mean
    its head reads."""
    from keras_vit import inspect as vit_inspect

    images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 24, 3)).astype("float32")
    for overrides, source in ((dict(classifier="gap", class_token=True), "mean"), ({}, "token"),
                              (dict(classifier="gap"), "mean"), (dict(classifier="gap", class_token=True,
                                                                       pooling="token"), "token")):
        config = inspect_vit.RECIPE.get_config(smoke=True)
        model = inspect_vit.build_model(config.replace(model_overrides={**config.model_overrides, **overrides}))
        for got, expected in zip(vit_inspect.rollout_maps(model, images),
                                 vit_inspect.rollout_maps(model, images, source=source)):
            np.testing.assert_array_equal(got, expected, err_msg=str(overrides))
    other = {"token": "mean", "mean": "token"}[source]
    assert not np.allclose(vit_inspect.rollout_maps(model, images)[0],
                           vit_inspect.rollout_maps(model, images, source=other)[0])


def test_inspect_vit_failures_are_one_line(tmp_path, capsys):
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.zeros((16, 24, 3), np.uint8)).save(images / "good.jpg")
    written = inspect_vit.main(["--smoke", f"--images={images}", f"--run_dir={tmp_path / 'out'}"])
    assert os.path.getsize(written["posemb_similarity"]) > 1000
    assert set(os.listdir(tmp_path / "out")) <= rundir.RUN_ENTRIES  # what --overwrite deletes
    # Its run directory is a recipe's: it wrote its summary.json into a
    # killed training run (which then reported itself finished) and into
    # folders of the user's.
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / rundir.MARKER).touch()
    rundir.write_json(str(killed / "config.json"), {"recipe": "pretrain", "config": {}, "started": 0})
    (killed / "history.csv").write_text("epoch,loss\n")
    assert f"the run directory {killed} holds a run of pretrain, not of inspect_vit" in _error(
        inspect_vit.main, ["--smoke", f"--images={images}", f"--run_dir={killed}"], capsys)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "summary.json").write_text("{}")
    assert "is not a recipe's run directory" in _error(
        inspect_vit.main, ["--smoke", f"--images={images}", f"--run_dir={tmp_path / 'mine'}"], capsys)
    assert sorted(os.listdir(killed)) == [rundir.MARKER, "config.json", "history.csv"]
    run = f"--run_dir={tmp_path / 'out2'}"
    # Weights of another architecture, and a missing file.
    other = keras_vit.ViT(None, input_shape=(16, 24, 3), num_classes=3, **dict(TINY, hidden_size=8, num_heads=2))
    npz = keras_vit.export_npz(other, str(tmp_path / "other.npz"))
    assert f"--weights={npz}" in _error(inspect_vit.main, ["--smoke", f"--images={images}", run, f"--weights={npz}"], capsys)
    assert "num_registers" in _error(  # a traceback before
        inspect_vit.main, ["--smoke", f"--images={images}", run, '--model_overrides={"num_registers": 2}'], capsys)
    assert "missing.npz" in _error(
        inspect_vit.main, ["--smoke", f"--images={images}", run, f"--weights={tmp_path / 'missing.npz'}"], capsys)
    # A truncated JPEG is named.
    with open(images / "good.jpg", "rb") as f:
        payload = f.read()
    with open(images / "truncated.jpg", "wb") as f:
        f.write(payload[: len(payload) // 2])
    err = _error(inspect_vit.main, ["--smoke", f"--images={images}", run], capsys)
    assert "truncated.jpg cannot be read" in err
    # Issue 21: a decompression bomb (200 million pixels in 25 kB) was PIL's
    # traceback; it is refused before its pixels are allocated.
    os.remove(images / "truncated.jpg")
    Image.new("1", (20_000, 10_000)).save(images / "bomb.png")
    assert os.path.getsize(images / "bomb.png") < 100_000
    err = _error(inspect_vit.main, ["--smoke", f"--images={images}", run], capsys)
    assert "bomb.png cannot be read as an image (DecompressionBombError: Image size (200000000 pixels)" in err


@pytest.mark.one_backend  # which files a run writes
def test_options_the_npz_format_lacks_train_and_save_the_keras_model(tmp_path, capsys):
    """A model with `qk_norm` trained to the end, then crashed writing
    model.npz, and again on every rerun: it could never finish."""
    overrides = json.dumps(dict(TINY, qk_norm=True))
    summary = pretrain.main(["--smoke", f"--run_dir={tmp_path / 'p'}", f"--model_overrides={overrides}", "--verbose=1"])
    assert "model.npz: not written, the original format has no keys for qk_norm=True (model.keras holds the model)" \
        in capsys.readouterr().out
    assert "model_npz" not in summary and os.path.exists(summary["model_keras"])
    summary = pretrain_mpp.main(["--smoke", f"--run_dir={tmp_path / 'm'}", f"--model_overrides={overrides}"])
    assert "encoder_npz" not in summary and os.path.exists(summary["backbone_keras"])
    assert f"Fine-tune the encoder from {summary['backbone_keras']}" in capsys.readouterr().out


class _CrashAfter(keras.callbacks.Callback):
    """Raises once after `batches` training batches."""

    def __init__(self, batches):
        super().__init__()
        self.batches, self.seen = batches, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.batches:
            raise RuntimeError("simulated crash")


def test_pretrain_mpp_resumes_and_reports_like_the_other_recipes(tmp_path, capsys):
    argv = ["--smoke", f"--run_dir={tmp_path}", "--total_steps=12", "--verbose=2", "--distribution=none"]
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain_mpp.main(argv, callbacks=[_CrashAfter(8)])
    assert not (tmp_path / "summary.json").exists()
    capsys.readouterr()
    summary = pretrain_mpp.main(argv)
    out = capsys.readouterr().out
    assert "Resumed from update 6 of 12" in out and "== pretrain_mpp:" in out
    assert summary["steps"] == 12 and summary["resumed_from_step"] == 6
    assert summary["distribution"] == "none" and os.path.exists(summary["encoder_npz"])
    assert set(os.listdir(tmp_path)) <= rundir.RUN_ENTRIES, os.listdir(tmp_path)
    # A changed field is refused; the finished run prints its summary again.
    with pytest.raises(cli.RecipeError, match="total_steps: 12 -> 18"):
        pretrain_mpp.main(argv[:2] + ["--total_steps=18"])
    again = pretrain_mpp.main(argv)
    assert again["final_loss"] == summary["final_loss"]
    assert "Masked patch prediction finished earlier" in capsys.readouterr().out
