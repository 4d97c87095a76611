"""VTAB-1k configs (`python -m recipes.vtab --config=NAME`).

Dropout: the fine-tuned variant's (0.1 for ViT-L/16, 0.0 for ViT-B/16 and
every AugReg name), unless `--dropout_rate` is given.
"""

import dataclasses

from recipes.configs import FINETUNING
from recipes.configs import SMOKE
from recipes.configs import DataFields
from recipes.configs import ModelFields
from recipes.configs import Optional
from recipes.configs import RunFields
from recipes.configs import ScheduleFields
from recipes.configs import Tuple
from recipes.configs import arg
from recipes.configs import named


@dataclasses.dataclass(eq=True)
class VtabConfig(ModelFields, DataFields, ScheduleFields, RunFields):
    weights: Optional[str] = arg(
        "imagenet21k", "pre-trained weights: a registered name, an .npz or .weights.h5 file; none for random")
    reset_head: bool = arg(True, "zero-initialised head (paper Sec. 3.2)")
    tasks: str = arg(
        "all", "comma-separated task keys or paper names (clevr_count, Clevr-Dist, ...), group names "
        "(natural, specialized, structured) or all")
    cache: str = arg("auto", "auto, true or false (VTAB-1k splits are small: cached)")
    image_size: int = arg(384, "resolution of every task (paper: 384)", valid="[1, inf)")
    batch_size: int = arg(512, "global batch per update (paper: 512)", valid="[1, inf)")
    accum_steps: int = arg(8, "micro-batches accumulated per update (8 x 64 = 512)", valid="[1, inf)")
    total_steps: int = arg(2500, "updates per task (paper: 2,500)", valid="[1, inf)")
    warmup_steps: int = arg(200, "linear warmup (AugReg's 200 for 2,500-step runs)", valid="[0, inf)")
    learning_rate: float = arg(0.01, "base learning rate (paper: 0.01)", valid="(0, inf)")
    momentum: Optional[float] = arg(None, "SGD momentum", valid="[0, 1)", library=FINETUNING)
    accumulator_dtype: Optional[str] = arg(
        None, "momentum buffer dtype: bfloat16 (the original's) or float32", library=FINETUNING)
    augmentation: str = arg(
        "resize_crop", "training crop: resize_crop (paper/BiT, 448 -> 384), inception_crop or resize; BiT's "
        "per-task switches still turn crops and flips off")
    shuffle_buffer: int = arg(1000, "training shuffle buffer", valid="[1, inf)")
    sweep: bool = arg(
        False, "AugReg protocol: every lr of lr_grid x steps of steps_grid on train800 -> val200, "
        "the best retrained on train800val200, evaluated on test")
    lr_grid: Tuple[float, ...] = arg((0.001, 0.003, 0.01, 0.03), "learning rates of the sweep", valid="(0, inf)")
    steps_grid: Tuple[int, ...] = arg((500, 2500), "training lengths of the sweep", valid="[1, inf)")
    warmup_grid: Tuple[int, ...] = arg((100, 200), "warmup of each training length of steps_grid", valid="[0, inf)")
    save_models: bool = arg(False, "also write each task's final model.keras / model.npz")
    paper_model: str = arg(
        "ViT-L/16 (I21k)",
        "paper row the bar chart compares with: ViT-H/14 (JFT), ViT-L/16 (JFT), ViT-L/16 (I21k)")


def paper():
    """The ViT paper's VTAB-1k protocol (App. B.1.1, Table 4).

        python -m recipes.vtab --model=ViT-L_16 --weights=imagenet21k

    Every task: train on train800val200 (1,000 examples) for 2,500 updates of
    512 at 384 px, SGD momentum 0.9, lr 0.01, cosine decay, clipping at 1, no
    weight decay; report the test split. BiT's augmentation (resize 448,
    random crop 384, flip; crops/flips off where they change the label).

    Expected (paper Table 9, mean over the 19 tasks): 72.7 % for ViT-L/16
    pre-trained on ImageNet-21k (`--model=ViT-L_16`), 77.6 % for ViT-H/14 and
    76.3 % for ViT-L/16 pre-trained on JFT-300M (not public).
    """
    return VtabConfig()


def augreg():
    """AugReg's VTAB-1k protocol (Steiner et al., App. C).

        python -m recipes.vtab --config=augreg --model=B_16 --weights=augreg

    Per task, lr {0.001, 0.003, 0.01, 0.03} x {500, 2,500} updates (warmup
    100 / 200) trained on train800 and scored on val200; the best is retrained
    on train800val200 and evaluated on test: 8 + 1 runs per task.

    Expected: per-task numbers of the AugReg paper's figures; the ViT paper's
    Table 9 rows are printed beside the results for reference.
    """
    return VtabConfig(sweep=True)


CONFIGS = {"paper": paper, "augreg": augreg}
DEFAULT = "paper"


def smoke_config(config):
    """`--smoke`: all tasks on generated examples, a tiny random model, two
    updates each."""
    return config.replace(
        **dict(SMOKE, total_steps=2, checkpoint_every=2, log_every=2), weights=None,
        lr_grid=(0.01, 0.03), steps_grid=(2,), warmup_grid=(1,),
    )


def get_config(name=DEFAULT, smoke=False):
    config = named(CONFIGS, name)
    return smoke_config(config) if smoke else config
