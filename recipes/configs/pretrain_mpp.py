"""Masked patch prediction configs (`python -m recipes.pretrain_mpp --config=NAME`).

Paper Sec. 4.6 and App. B.1.2: corrupt 50 % of the patch embeddings (80 %
a learned [mask] embedding, 10 % another patch, 10 % kept) and predict the
3-bit mean colour of each corrupted patch (512 classes). Dropout: the
variant's (0.0 for ViT-B/16; `paper` and `colour_fields` both train
without dropout).
"""

import dataclasses

from recipes.configs import SMOKE_MODEL
from recipes.configs import DataFields
from recipes.configs import ModelFields
from recipes.configs import PRETRAINING
from recipes.configs import Optional
from recipes.configs import RunFields
from recipes.configs import Tuple
from recipes.configs import arg
from recipes.configs import named

TARGETS = ("mean_color", "downsampled", "pixels")
QUANTIZATIONS = ("uint8", "uniform")
# `--smoke`: 24 updates of a tiny ViT on 6 batches of smooth colour fields
# at 16 x 24 px (a 2 x 3 grid of 8 x 8 patches).
SMOKE_INPUT_SHAPE = (16, 24, 3)


@dataclasses.dataclass(eq=True)
class MppConfig(ModelFields, DataFields, RunFields):
    dataset: Optional[str] = arg(
        None, "tfds name, a folder (<dataset>/<train_split>/<class>/<image>; labels are ignored), "
        "or synthetic: endless smooth random colour fields (a patch's colour follows from its "
        "neighbours'; 8 of them are also written to <run_dir>/samples for recipes.inspect_vit)")
    train_split: str = arg("train", "split to train on (tfds string or sub-folder; . for the folder itself)")
    image_size: Tuple[int, ...] = arg((224,), "input size: one int (square) or height,width", valid="[1, inf)")
    batch_size: int = arg(4096, "global batch per optimizer update (paper: 4096)", valid="[1, inf)")
    accum_steps: int = arg(1, "micro-batches accumulated per update", valid="[1, inf)")
    total_steps: int = arg(1_000_000, "optimizer updates (paper: 1M on JFT)", valid="[1, inf)")
    warmup_steps: Optional[int] = arg(None, "linear warmup", valid="[0, inf)", library=PRETRAINING)
    learning_rate: float = arg(2e-4, "base learning rate (paper: 2e-4)", valid="(0, inf)")
    decay_type: str = arg("cosine", "decay after the warmup (keras_vit.training.WarmupDecay's)")
    grad_clip: Optional[float] = arg(1.0, "global gradient-norm clipping; none for off", valid="(0, inf)")
    weight_decay: float = arg(
        0.1, "decoupled, on kernels; the paper does not give MPP's, 0.1 is its JFT pre-training value", valid="[0, inf)")
    target: str = arg("mean_color", f"prediction target: {', '.join(TARGETS)}")
    bits: int = arg(3, "bits per colour channel of the target", valid="[1, 8]")
    quantization: str = arg("uint8", f"colour quantisation: {', '.join(QUANTIZATIONS)}")
    corruption_rate: float = arg(0.5, "share of the patches corrupted", valid="(0, 1]")
    head_hidden_size: Optional[int] = arg(None, "hidden layer of the prediction head (default: the width)", valid="[1, inf)")


def paper():
    """The paper's set-up: ViT-B/16, Adam, base lr 2e-4, 10k warmup, cosine.

        python -m recipes.pretrain_mpp --config=paper --dataset=imagenet2012 --manual_dir=/data/imagenet

    The paper ran 1M steps at batch 4096 on JFT (not public) and also tried
    ImageNet. Expected (paper Sec. 4.6): 79.9 % ImageNet accuracy after
    fine-tuning ViT-B/16 pre-trained this way on JFT, 4 % below supervised
    pre-training.
    """
    return MppConfig(dataset="imagenet2012", log_every=1000, checkpoint_every=1000)


def colour_fields():
    """The demo of docs/inspect.md: a small custom ViT on synthetic colour
    fields, whose position embeddings learn the 2-D grid (minutes on a CPU).

        python -m recipes.pretrain_mpp --config=colour_fields --run_dir=runs/mpp_demo

    Expected: the loss falls from ln(512) = 6.24 and the position-embedding
    similarity of `recipes.inspect_vit` shows the grid (docs/inspect.md).
    """
    return MppConfig(
        model=None, model_overrides=dict(hidden_size=64, num_heads=4, mlp_dim=128, num_layers=4, patch_size=8),
        dataset="synthetic", image_size=(64,), batch_size=32, total_steps=1000, log_every=100,
        checkpoint_every=100, learning_rate=1e-3, warmup_steps=100, weight_decay=0.0,
    )


CONFIGS = {f.__name__: f for f in (paper, colour_fields)}
DEFAULT = "paper"


def smoke_config(config):
    """`--smoke`: a tiny model on 6 batches of synthetic images, 24 updates;
    the encoder is then loaded into a classifier and checked."""
    return config.replace(
        model=None, model_overrides=dict(SMOKE_MODEL), dataset="synthetic",
        image_size=SMOKE_INPUT_SHAPE[:2], batch_size=16, total_steps=24, log_every=6,
        checkpoint_every=6, learning_rate=3e-3, warmup_steps=2,
    )


def get_config(name=DEFAULT, smoke=False):
    config = named(CONFIGS, name)
    return smoke_config(config) if smoke else config
