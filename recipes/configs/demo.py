"""The offline demo's config (`python -m recipes.demo`)."""

import dataclasses

from recipes.configs import SMOKE_MODEL
from recipes.configs import Config
from recipes.configs import arg
from recipes.configs import named


@dataclasses.dataclass(eq=True)
class DemoConfig(Config):
    run_dir: str = arg("runs/demo", "where the data, both runs and their models go")
    overwrite: bool = arg(False, "delete the results of an earlier demo in run_dir first")
    pretrain_size: int = arg(16, "pre-training resolution (px)", valid="[1, inf)")
    finetune_size: int = arg(32, "fine-tuning resolution (px)", valid="[1, inf)")
    pretrain_steps: int = arg(1000, "pre-training updates", valid="[1, inf)")
    pretrain_batch_size: int = arg(64, "pre-training batch", valid="[1, inf)")
    finetune_steps: int = arg(300, "fine-tuning updates", valid="[1, inf)")
    finetune_batch_size: int = arg(
        64, "fine-tuning batch, as 2 accumulated micro-batches (the paper's 512 as 8 x 64, scaled down)", valid="[1, inf)")
    finetune_learning_rate: float = arg(0.03, "fine-tuning base learning rate", valid="(0, inf)")
    model_overrides: dict = arg(
        dict(hidden_size=64, num_layers=4, num_heads=4, mlp_dim=128, patch_size=4),
        "the ViT's size (patch 4: a 4x4 grid at 16 px, 8x8 at 32 px)")
    inspect: bool = arg(True, "write the inspection figures of the fine-tuned model to run_dir/inspect")
    test_fraction: float = arg(0.2, "share of the digits held out for testing (stratified)", valid="(0, 1)")
    jit_compile: str = arg("auto", "Keras jit_compile: auto, true or false")
    distribution: str = arg("auto", "see keras_vit.distribute.get_distribution")
    seed: int = arg(0, "random seed (split, weights, shuffling)", valid="[0, 4294967295]")
    deterministic: bool = arg(False, "bit-identical reruns on GPUs too (the recipes' --deterministic)")
    verbose: int = arg(2, "1: a progress bar of updates, 2: one line per log_every updates, 0: silent", valid="[0, 2]")


def digits():
    """Pre-train at 16 px, fine-tune at 32 px, on scikit-learn's digits.

        python -m recipes.demo      # or: bash scripts/demo.sh

    A ViT of width 64, 4 blocks, 4 heads, patches of 4, no dropout:
    1,000 Adam updates of 64 at 16 px, then 300 SGD-momentum updates of 64
    (2 x 32) at 32 px.

    Expected: 96-99 % test accuracy on the 360 held-out digits, in 2-4
    minutes on 2 CPU cores (measured: 97.8 % in 2.0 min with TensorFlow,
    98.1 % in 3.4 min with JAX; docs/recipes.md).
    """
    return DemoConfig()


CONFIGS = {"digits": digits}
DEFAULT = "digits"


def smoke_config(config):
    """`--smoke`: a one-block ViT for 4 + 4 updates (about a minute); patches
    of 4 as the full demo's, so that fine-tuning resamples a 4x4 grid to 8x8."""
    return config.replace(pretrain_steps=4, finetune_steps=4, model_overrides=dict(SMOKE_MODEL, patch_size=4))


def get_config(name=DEFAULT, smoke=False):
    config = named(CONFIGS, name)
    return smoke_config(config) if smoke else config
