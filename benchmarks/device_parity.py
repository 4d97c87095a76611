"""How far a device's float32 arithmetic moves ViT logits from float64 ones.

    python benchmarks/device_parity.py                       # ViT-B/16 at 224 px, every backend
    python benchmarks/device_parity.py --backends jax,torch --json parity.json
    python benchmarks/device_parity.py --smoke               # ViT-Ti/16 (the suite runs its worker)

The reference is timm's model of the same architecture (random weights,
seed 0) in float64 on the CPU. keras_vit loads its weights
(`keras_vit.weights.timm.load_timm_state`) and computes the same images in
float32 on whatever device the backend sees, compiled (`predict_on_batch`)
and eagerly (`model(x)`), once with the backend's default matmul precision
and once with its highest: NVIDIA GPUs from Ampere on multiply float32
matrices in TF32 (10-bit mantissas) by default under JAX and TensorFlow,
and PyTorch does so for convolutions (`torch.backends.cudnn.allow_tf32`).
timm in float32 on the same device is the peer, under the same switch.
Each row gives the largest logit error over the largest reference logit
(the tests' `assert_close_rel`) and how many top-1 classes agree.
Each backend and precision runs in its own process (`bench.run_backends`).
"""

import argparse
import json
import os
import tempfile

import bench
import numpy as np
from accelerator import device_name

ARCHITECTURES = {"B": "vit_base_patch16_224", "tiny": "vit_tiny_patch16_224"}
PRECISIONS = ("default", "highest")


def reference(architecture, batch, folder):
    """timm's random model and images, its float64 logits: saved for the workers."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model(architecture, pretrained=False).eval()
    size = model.pretrained_cfg["input_size"][-1]
    images = np.random.default_rng(0).uniform(-1, 1, (batch, size, size, 3)).astype("float32")
    with torch.no_grad():
        logits = model.double()(torch.from_numpy(images.transpose(0, 3, 1, 2)).double()).numpy()
    state = {key: value.float().numpy() for key, value in model.state_dict().items()}
    path = os.path.join(folder, "reference.npz")
    np.savez(path, images=images, logits=logits, **{f"state/{key}": value for key, value in state.items()})
    return path


def set_precision(backend, precision):
    """The switch that turns TF32 (and the like) off; "default" leaves it."""
    if precision == "default":
        return
    if backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    import torch  # the timm peer runs in every worker

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def error(logits, expected):
    return {"max_rel": float(np.abs(logits - expected).max() / np.abs(expected).max()),
            "top1_agree": int((logits.argmax(-1) == expected.argmax(-1)).sum())}


def measure(model_name, precision, reference_path):
    """The rows of this process's backend: keras_vit compiled and eager, and
    timm in float32, against the stored float64 logits."""
    import keras
    import timm
    import torch

    import keras_vit
    from keras_vit.weights import timm as timm_format

    backend = keras.backend.backend()
    with np.load(reference_path) as stored:
        images, expected = stored["images"], stored["logits"]
        state = {key[len("state/"):]: stored[key] for key in stored.files if key.startswith("state/")}
    architecture = ARCHITECTURES[model_name]
    model = keras_vit.ViT(None, **timm_format.builder_kwargs(
        {**timm_format.architecture_args(architecture), "num_classes": expected.shape[-1],
         "img_size": images.shape[1:3]}))
    left = timm_format.load_timm_state(model, state)
    if left:
        raise RuntimeError(f"timm keys keras_vit did not load: {left}")
    base = {"backend": backend, "device": device_name(), "model": architecture, "precision": precision,
            "batch": len(images)}
    rows = [{**base, "library": "keras_vit", "mode": "predict_on_batch",
             **error(np.asarray(model.predict_on_batch(images), np.float64), expected)},
            {**base, "library": "keras_vit", "mode": "model(x)",
             **error(keras.ops.convert_to_numpy(model(images)).astype(np.float64), expected)}]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    peer = timm.create_model(architecture, pretrained=False).eval().to(device)
    peer.load_state_dict({key: torch.from_numpy(value) for key, value in state.items()})
    with torch.no_grad():
        logits = peer(torch.from_numpy(images.transpose(0, 3, 1, 2)).to(device)).cpu().numpy()
    rows.append({**base, "library": "timm", "mode": f"on {device}", **error(logits.astype(np.float64), expected)})
    return rows


def markdown(rows):
    lines = ["| device | backend | precision | library | mode | max error / max logit | top-1 agree |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['device']} | {row['backend']} | {row['precision']} | {row['library']} | {row['mode']} "
                     f"| {row['max_rel']:.1e} | {row['top1_agree']}/{row['batch']} |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--model", default="B", choices=sorted(ARCHITECTURES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--smoke", action="store_true", help="ViT-Ti/16, 2 images")
    parser.add_argument("--json", help="write all rows to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for precision in args.precisions.split(","):
        if precision not in PRECISIONS:
            parser.error(f"--precisions: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if args.smoke:
        args.model, args.batch = "tiny", 2
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        set_precision(os.environ["KERAS_BACKEND"], args.precision)
        for row in measure(args.model, args.precision, args.reference):
            print(json.dumps(row), flush=True)
        return None
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = reference(ARCHITECTURES[args.model], args.batch, folder)
        for precision in args.precisions.split(","):
            rows += bench.run_backends(__file__, [f"--model={args.model}", f"--precision={precision}",
                                                  f"--reference={path}"], args.backends.split(","))
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)
    return rows


if __name__ == "__main__":
    main()
