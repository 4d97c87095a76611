"""Writes tests/weights/flax_reference/: tiny checkpoints made by the original
Flax model and the logits it gives, so that the tests compare keras_vit with
the real thing rather than a transcription of it.

Needs flax and a checkout of google-research/vision_transformer (its
`vit_jax` package; nothing of it is copied here):

    pip install flax ml-collections packaging pandas scipy tqdm
    python tools/make_flax_reference.py --vit_jax_dir=DIR --vit_jax_commit=SHA

For each case: `<case>.npz`, the parameters as the original's checkpoints
store them (flattened with "/", float32, every one moved off its
initialisation so that no term is trivially zero), and `<case>.io.npz`,
the images and `vit_jax.models_vit.VisionTransformer`'s logits
(`train=False`) at the stored size and at a resized one. The resized
parameters come from `vit_jax.checkpoint.load_pretrained` (position
embeddings resampled by `scipy.ndimage.zoom`, order 1), with the
checkpoint's head put back (`load_pretrained` swaps in the fresh head).
"""

import argparse
import builtins
import json
import os
import sys
import types

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "weights", "flax_reference")

# (config, num_classes, stored size, resized size). Widths as small as the
# code paths allow: two encoder blocks (block indices), a pre-logits layer,
# a non-square `gap` model, a hybrid (GroupNorm's 32 groups need a width
# factor of 0.5: its ResNet root, strided, and one stage of one unit, with
# its projection).
CASES = {
    "token": (dict(patches=(4, 4), hidden_size=16, representation_size=8, classifier="token"), 5, (16, 16),
              (24, 24)),
    "gap": (dict(patches=(4, 4), hidden_size=16, representation_size=None, classifier="gap"), 3, (16, 24), None),
    "hybrid": (dict(patches=(1, 1), hidden_size=16, representation_size=None, classifier="token",
                    resnet=dict(num_layers=(1,), width_factor=0.5)), 4, (32, 32), (48, 48)),
}
TRANSFORMER = dict(mlp_dim=32, num_heads=2, num_layers=2, attention_dropout_rate=0.0, dropout_rate=0.0)


def import_vit_jax(path):
    """The original package; `tensorflow.io.gfile` (file access only) is
    replaced by Python's `open` when TensorFlow is not installed."""
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        import flax.training.checkpoints  # noqa: F401 - before the stand-in, which it would probe

        gfile = types.ModuleType("tensorflow.io.gfile")
        gfile.GFile = builtins.open
        gfile.stat = lambda p: types.SimpleNamespace(length=os.path.getsize(p))
        io = types.ModuleType("tensorflow.io")
        io.gfile = gfile
        tf = types.ModuleType("tensorflow")
        tf.io = io
        sys.modules.update({"tensorflow": tf, "tensorflow.io": io, "tensorflow.io.gfile": gfile})
    sys.path.insert(0, path)
    from vit_jax import checkpoint, models_vit

    return checkpoint, models_vit


def config_dict(options):
    import ml_collections

    options = dict(options)
    return ml_collections.ConfigDict({
        "patches": {"size": options.pop("patches")}, "transformer": dict(TRANSFORMER), **options,
    })


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vit_jax_dir", required=True, help="a checkout of google-research/vision_transformer")
    parser.add_argument("--vit_jax_commit", required=True, help="its commit, recorded with the files")
    args = parser.parse_args()
    checkpoint, models_vit = import_vit_jax(args.vit_jax_dir)
    import flax
    import jax
    from flax import traverse_util

    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(0)
    for case, (options, num_classes, size, resized) in CASES.items():
        config = config_dict(options)
        model = models_vit.VisionTransformer(num_classes=num_classes, **config)
        apply = jax.jit(lambda params, images: model.apply({"params": params}, images, train=False))
        params = model.init(jax.random.PRNGKey(0), np.zeros((1, *size, 3), "float32"), train=False)["params"]
        flat = traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/")
        flat = {k: (np.asarray(v) + rng.normal(0, 0.05, v.shape)).astype("float32") for k, v in flat.items()}
        path = os.path.join(OUT, f"{case}.npz")
        np.savez(path, **flat)
        # Read back through the original's loader, as its users read files.
        images = rng.uniform(-1, 1, (2, *size, 3)).astype("float32")
        io = {"images": images, "logits": np.asarray(apply(checkpoint.load(path), images))}
        if resized:
            init = model.init(jax.random.PRNGKey(1), np.zeros((1, *resized, 3), "float32"), train=False)["params"]
            params = flax.core.unfreeze(checkpoint.load_pretrained(
                pretrained_path=path, init_params=flax.core.unfreeze(init), model_config=config))
            params["head"] = checkpoint.load(path)["head"]
            images = rng.uniform(-1, 1, (2, *resized, 3)).astype("float32")
            io.update(resized_images=images, resized_logits=np.asarray(apply(params, images)),
                      resized_pos_embedding=np.asarray(params["Transformer"]["posembed_input"]["pos_embedding"]))
        np.savez(os.path.join(OUT, f"{case}.io.npz"), **io)
        print(case, {k: v.shape for k, v in io.items()})
    versions = {"vision_transformer": args.vit_jax_commit, "flax": flax.__version__, "jax": jax.__version__,
                "numpy": np.__version__}
    with open(os.path.join(OUT, "versions.json"), "w") as f:
        json.dump(versions, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
