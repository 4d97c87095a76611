"""ViT model builders, and the anatomy of a built model."""

# The variant table and the anatomy reader live outside `models/` so that
# `weights/` can use them without importing the builders (models import
# weights, never the reverse); they are public here.
from keras_vit import variants
from keras_vit.anatomy import ModelAnatomy, anatomy

# `ViT`, `get_model` and one constructor per row of `variants.CONSTRUCTORS`.
from keras_vit.models.vit import *  # noqa: F403
from keras_vit.models.vit import __all__ as _builders
from keras_vit.models.from_timm import from_timm
from keras_vit.models.vit_model import SurvivesFailedSteps, ViTModel

__all__ = ["ModelAnatomy", "SurvivesFailedSteps", "ViTModel", "anatomy", "from_timm", "variants", *_builders]
