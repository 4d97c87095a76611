"""ViT model builders, and the anatomy of a built model."""

# The variant table and the anatomy reader live outside `models/` so that
# `weights/` can use them without importing the builders (models import
# weights, never the reverse); they are public here.
from keras_vit import variants
from keras_vit.anatomy import ModelAnatomy, anatomy

from keras_vit.models.vit import (
    R26ViTB32,
    R26ViTS32,
    R50ViTB16,
    R50ViTL32,
    RViTTi16,
    ViT,
    ViTB8,
    ViTB16,
    ViTB32,
    ViTH14,
    ViTL16,
    ViTL32,
    ViTS16,
    ViTS32,
    ViTTi16,
    get_model,
)
