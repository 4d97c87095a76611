"""Writes the golden files used by tests/weights/test_weights.py.

    PYTHONPATH=. KERAS_BACKEND=jax python tests/weights/golden/make_golden.py

`testing.npz`: random weights for the original "testing" config (original key
names), `testing_io.npz`: an input batch and the logits timm computes for them
with its own `.npz` loader, configured as the original (tanh GELU, LayerNorm
epsilon 1e-6).
"""

import functools
import pathlib

import numpy as np
import torch
from timm.models import vision_transformer as timm_vit

import keras_vit
from tests.helpers import randomize_weights

HERE = pathlib.Path(__file__).parent

model = keras_vit.get_model("testing", input_shape=(64, 48, 3), num_classes=10)
randomize_weights(model, seed=42, scale=0.3)
keras_vit.export_npz(model, HERE / "testing.npz")

reference = timm_vit.VisionTransformer(
    img_size=(64, 48), patch_size=16, embed_dim=10, depth=1, num_heads=2, mlp_ratio=1.0,
    num_classes=10, act_layer=functools.partial(torch.nn.GELU, approximate="tanh"),
)
timm_vit._load_weights(reference, str(HERE / "testing.npz"))
images = np.random.default_rng(7).uniform(-1, 1, (3, 64, 48, 3)).astype("float32")
with torch.no_grad():
    logits = reference.eval()(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
np.savez(HERE / "testing_io.npz", images=images, logits=logits)
print("logits", logits.shape, float(np.abs(logits).max()))
