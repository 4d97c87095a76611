"""The inspection recipe's config (`python -m recipes.inspect_vit`)."""

import dataclasses

from recipes.configs import SMOKE_MODEL
from recipes.configs import Config
from recipes.configs import Optional
from recipes.configs import Tuple
from recipes.configs import arg
from recipes.configs import named

FORMATS = ("png", "svg", "pdf")


@dataclasses.dataclass(eq=True)
class InspectConfig(Config):
    model: str = arg(
        "ViT-B_16", "an original config name (ViT-B_16, R50+ViT-B_16, ViT-B_16-gap-norep, ...), an "
        "AugReg name (B_16, R26_S_32, ...), none for a custom model given by model_overrides, or a "
        "saved .keras model file")
    model_overrides: dict = arg({}, 'JSON object of ViT keyword arguments, e.g. \'{"num_layers": 2}\'')
    weights: Optional[str] = arg(
        None, "an original .npz, a registered name (imagenet21k, imagenet21k+imagenet2012, augreg, "
        "...) or a .weights.h5 file; none for random weights (figures of an untrained model)")
    num_classes: Optional[int] = arg(None, "with a .weights.h5 file: the classes of the saved model's head", valid="[1, inf)")
    image_size: Optional[Tuple[int, ...]] = arg(
        None, "model input size: one int (square) or height,width; default 224, or the saved model's", valid="[1, inf)")
    images: Optional[str] = arg(None, "a folder of images (sub-folders searched)")
    run_dir: str = arg("runs/inspect", "where the figures, inspect.npz and summary.json go")
    max_images: int = arg(128, "images used for the attention distance (the paper used 128)", valid="[1, inf)")
    rollout_images: int = arg(4, "images shown in the rollout figure", valid="[1, inf)")
    components: int = arg(28, "principal components of the filters", valid="[1, inf)")
    format: str = arg("png", f"figure format: {', '.join(FORMATS)}")  # noqa: A003
    batch_size: int = arg(16, "images per forward pass", valid="[1, inf)")
    seed: int = arg(0, "random seed (random weights, --smoke images)", valid="[0, 4294967295]")


def default():
    """Figures of an original checkpoint fine-tuned on ImageNet at 384 px.

        python -m recipes.inspect_vit --weights=imagenet21k+imagenet2012 --image_size=384 \\
            --images=path/to/images --run_dir=runs/inspect_b16

    Expected: the paper's Figure 7 patterns (docs/inspect.md): position
    embeddings similar along rows and columns, attention distances that grow
    with depth.
    """
    return InspectConfig()


CONFIGS = {"default": default}
DEFAULT = "default"


def smoke_config(config):
    """`--smoke`: a tiny random ViT on a few generated images."""
    return config.replace(
        model="none", model_overrides=dict(SMOKE_MODEL), weights=None, image_size=(16, 24),
        max_images=4, rollout_images=2, components=4,
    )


def get_config(name=DEFAULT, smoke=False):
    config = named(CONFIGS, name)
    return smoke_config(config) if smoke else config
