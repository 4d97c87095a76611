"""Self-supervised pre-training: masked patch prediction (paper Sec. 4.6).

See `keras_vit.pretraining.mpp` and `docs/inspect.md`.
"""

from keras_vit.pretraining.mpp import (
    CLEAN,
    KEPT,
    MASKED,
    QUANTIZATIONS,
    REPLACED,
    TARGETS,
    MaskedPatchPrediction,
    PatchCorruption,
    patch_targets,
    quantize_colors,
)

__all__ = [
    "CLEAN",
    "KEPT",
    "MASKED",
    "QUANTIZATIONS",
    "REPLACED",
    "TARGETS",
    "MaskedPatchPrediction",
    "PatchCorruption",
    "patch_targets",
    "quantize_colors",
]
