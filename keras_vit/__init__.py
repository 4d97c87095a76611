"""keras_vit: the Vision Transformer (Dosovitskiy et al., ICLR 2021) in Keras 3."""

import re as _re

import keras as _keras

# The lowest Keras keras_vit is tested with (requirements/lowest.txt, run in
# CI). Keras 3.8 and 3.9 cannot give optimizer slots a sharding layout
# (`add_variable(layout=...)`), which training under a distribution needs.
MIN_KERAS_VERSION = (3, 10)
if tuple(int(part) for part in _re.findall(r"\d+", _keras.__version__)[:2]) < MIN_KERAS_VERSION:
    raise ImportError(
        f"keras_vit needs Keras >= {'.'.join(map(str, MIN_KERAS_VERSION))}; "
        f"found keras=={_keras.__version__}. Upgrade with: pip install -U 'keras>=3.10'"
    )

# `pretraining` registers `MaskedPatchPrediction`, so that its `.keras`
# files load after `import keras_vit`.
from keras_vit import distribute, layers, pretraining, training
from keras_vit.class_names import decode_predictions
from keras_vit.features import feature_maps
from keras_vit.finetuning import freeze_backbone, reset_head
from keras_vit.lora import enable_lora, load_lora, merge_lora, save_lora
# `ViT`, `get_model` and the constructors (`ViTB16`, `R50ViTB16`, ...), one
# per row of `keras_vit.variants.CONSTRUCTORS`.
from keras_vit.models.vit import *  # noqa: E402, F403
from keras_vit.models.vit import __all__ as _builders  # noqa: E402
from keras_vit.models.catalog import available_weights, list_models
from keras_vit.models.from_timm import from_timm
from keras_vit.preprocessing import preprocess_input
from keras_vit.weights import export_npz, export_timm, load_weights

__version__ = "0.1.0"

__all__ = [
    *_builders, "available_weights", "decode_predictions", "distribute", "enable_lora", "export_npz", "export_timm",
    "feature_maps", "freeze_backbone", "from_timm", "layers", "list_models", "load_lora", "load_weights",
    "merge_lora", "preprocess_input", "pretraining", "reset_head", "save_lora", "training", "weights",
]
