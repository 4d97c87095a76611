"""Throughput of keras_vit against keras-hub's ViT and timm, per backend.

    python benchmarks/bench.py                      # Ti/S/B, every backend
    python benchmarks/bench.py --backends jax --models B --batches 32
    python benchmarks/bench.py --backends torch --models C --batches 128 --train-batches 128
    python benchmarks/bench.py --smoke              # tiny sizes, seconds

Each backend runs in its own process (`KERAS_BACKEND` is fixed at import).
Inside it the libraries are measured in interleaved repeats (keras_vit,
keras-hub, timm, keras_vit, ...) so that a change in machine load hits all of
them alike; warm-up (compilation) is excluded and the median is reported.
Inference is `predict_on_batch`; training is `train_on_batch` (the compiled
train step `fit` runs) with AdamW and softmax cross-entropy. The fraction of
the matmul peak uses a large float32 matmul measured in the same process.
Peers that are not installed are reported as such.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {
    # name: (hidden, mlp, heads, layers, patch)
    "Ti": (192, 768, 3, 12, 16),
    "S": (384, 1536, 6, 12, 16),
    "B": (768, 3072, 12, 12, 16),
    # CIFAR-sized, the model of benchmarks/real_images.py: 32 px, 10 classes.
    "C": (128, 512, 4, 4, 4),
    "tiny": (32, 64, 2, 1, 8),  # --smoke
}
# Input side and classes where they differ from ImageNet's 224 px / 1,000.
IMAGE_SIZES = {"C": 32, "tiny": 32}
NUM_CLASSES = {"C": 10}


def image_size(size):
    return IMAGE_SIZES.get(size, 224)


def num_classes(size):
    return NUM_CLASSES.get(size, 1000)


def forward_flops(size, image, classes=1000):
    """Multiply-adds x 2 of one forward pass (matmuls only; the rest is
    negligible): patch embedding, per block q/k/v, scores, weighted sum,
    output projection and MLP, and the head."""
    hidden, mlp, _, layers, patch = SIZES[size]
    patches = (image // patch) ** 2
    tokens = patches + 1
    per_block = (
        3 * tokens * hidden * hidden  # q, k, v
        + 2 * tokens * tokens * hidden  # q.k and probs.v
        + tokens * hidden * hidden  # output projection
        + 2 * tokens * hidden * mlp  # MLP
    )
    embed = patches * patch * patch * 3 * hidden
    return 2 * (embed + layers * per_block + hidden * classes)


# --- Worker: one backend, one process -----------------------------------------


def _timed(fn, iterations):
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - start) / iterations


def matmul_peak_gflops(n=2048, iterations=10):
    import keras

    a = keras.random.normal((n, n))
    b = keras.random.normal((n, n))
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        f = jax.jit(lambda x, y: x @ y)
        run = lambda: f(a, b).block_until_ready()  # noqa: E731
    elif backend == "tensorflow":
        import tensorflow as tf

        f = tf.function(lambda x, y: tf.matmul(x, y), jit_compile=True)
        run = lambda: f(a, b).numpy()  # noqa: E731
    else:
        run = lambda: keras.ops.matmul(a, b).cpu()  # noqa: E731
    run()
    return 2 * n**3 / _timed(run, iterations) / 1e9


def build_keras_vit(size, image):
    import keras_vit

    hidden, mlp, heads, layers, patch = SIZES[size]
    return keras_vit.ViT(
        None, hidden_size=hidden, mlp_dim=mlp, num_heads=heads, num_layers=layers,
        patch_size=patch, input_shape=(image, image, 3), num_classes=num_classes(size),
    )


def build_keras_hub(size, image):
    import keras
    import keras_hub

    hidden, mlp, heads, layers, patch = SIZES[size]
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(image, image, 3), patch_size=patch, num_layers=layers,
        num_heads=heads, hidden_dim=hidden, mlp_dim=mlp,
    )
    logits = keras.layers.Dense(num_classes(size), dtype="float32")(backbone.output[:, 0])
    return keras.Model(backbone.input, logits)


def make_optimizer(name, model):
    """`adamw`: Keras' AdamW; `original`: the recipes' optimizer
    (`keras_vit.training.pretraining_optimizer`: decoupled Adam, decay on
    kernels only, global-norm clipping, warmup-cosine schedule); `sgd`: plain
    SGD, the cheapest update (the difference to the others is the cost of
    their update)."""
    import keras

    from keras_vit import training

    if name == "original":
        return training.pretraining_optimizer(
            model, 1e-4, total_steps=1_000_000, warmup_steps=10, decay_type="cosine",
            weight_decay=0.1, global_clipnorm=1.0,
        )
    if name == "sgd":
        return keras.optimizers.SGD(1e-4)
    return keras.optimizers.AdamW(1e-4)


def keras_runner(model, x, y, mode, optimizer="adamw", jit_compile="auto", on_device=False):
    """`on_device`: the batch is put on the accelerator once, as timm's is and
    as a prefetching input pipeline delivers it; otherwise every call copies
    the numpy batch to the device first."""
    import keras

    if on_device:
        x, y = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y)
    if mode == "inference":
        if jit_compile != "auto":  # predict takes compile's setting
            model.compile(jit_compile=jit_compile)
        return lambda: keras.ops.convert_to_numpy(model.predict_on_batch(x))
    model.compile(
        optimizer=make_optimizer(optimizer, model),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    return lambda: model.train_on_batch(x, y)


def timm_runner(size, image, x, y, mode, optimizer="adamw", compile=False):
    """`compile`: the model through `torch.compile`, as Keras'
    `jit_compile=True` does on the torch backend."""
    import timm
    import torch

    hidden, mlp, heads, layers, patch = SIZES[size]
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=image, patch_size=patch, embed_dim=hidden, depth=layers,
        num_heads=heads, mlp_ratio=mlp / hidden, num_classes=num_classes(size),
    )
    # On CUDA when present, like Keras' torch backend; a step ends with a
    # synchronize because CUDA calls return before the work is done (Keras'
    # runners return numpy, which waits too).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = model.to(device)
    if compile:
        model = torch.compile(model)
    xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device)
    yt = torch.from_numpy(y.astype("int64")).to(device)
    if mode == "inference":
        model.eval()

        def run():
            with torch.no_grad():
                model(xt)
            sync()

        return run
    params = list(model.parameters())
    if optimizer == "sgd":
        update = torch.optim.SGD(params, lr=1e-4)
    else:
        update = torch.optim.AdamW(params, lr=1e-4)

    def step():
        update.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        if optimizer == "original":  # The recipes' global-norm clipping.
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        update.step()
        sync()

    return step


def run_worker(args):
    """Measures every configuration on the active backend; returns rows."""
    import keras
    import numpy as np

    if args.dtype != "float32":
        keras.config.set_dtype_policy(args.dtype)
    backend = keras.backend.backend()
    peak = matmul_peak_gflops(512 if args.smoke else 2048)
    rows = []
    for size in args.models:
        image = image_size(size)
        for mode, batches in (("inference", args.batches), ("training", args.train_batches)):
            for batch in batches:
                rng = np.random.default_rng(0)
                x = rng.uniform(-1, 1, (batch, image, image, 3)).astype("float32")
                y = rng.integers(0, num_classes(size), (batch,))
                options = dict(optimizer=args.optimizer, jit_compile=args.jit_compile)
                runners = {"keras_vit": keras_runner(build_keras_vit(size, image), x, y, mode, **options)}
                try:
                    runners["keras-hub"] = keras_runner(build_keras_hub(size, image), x, y, mode, **options)
                except ImportError:
                    pass
                if backend == "torch" and args.dtype == "float32":
                    try:
                        runners["timm"] = timm_runner(size, image, x, y, mode, args.optimizer)
                    except ImportError:
                        pass
                iterations = args.iterations if mode == "inference" else args.train_iterations
                for run in runners.values():
                    run()  # Warm-up: compilation and first-call allocations.
                    if mode == "inference":
                        run()
                times = {name: [] for name in runners}
                for _ in range(args.repeats):
                    for name, run in runners.items():
                        times[name].append(_timed(run, iterations))
                flops = forward_flops(size, image, num_classes(size)) * (3 if mode == "training" else 1)
                row = dict(
                    backend=backend, model=size, image=image, mode=mode, batch=batch, dtype=args.dtype,
                    optimizer=args.optimizer, jit_compile=args.jit_compile,
                    matmul_peak_gflops=round(peak, 1), load=os.getloadavg()[0],
                    peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                )
                for name, samples in times.items():
                    median = statistics.median(samples)
                    row[f"{name}_img_s"] = round(batch / median, 2)
                    row[f"{name}_gflops"] = round(flops * batch / median / 1e9, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


# --- Driver -------------------------------------------------------------------


def markdown(rows):
    lines = [
        "| backend | model | mode | batch | keras_vit img/s | keras-hub img/s | keras_vit / keras-hub "
        "| timm img/s | keras_vit GFLOP/s | % of matmul peak | process peak RSS (MiB) | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours, hub = r["keras_vit_img_s"], r.get("keras-hub_img_s")
        lines.append(
            f"| {r['backend']} | {r['model']} | {r['mode']} | {r['batch']} | {ours} "
            f"| {hub if hub else 'n/a'} | {f'{ours / hub:.2f}x' if hub else 'n/a'} "
            f"| {r.get('timm_img_s', '–')} | {r['keras_vit_gflops']} "
            f"| {100 * r['keras_vit_gflops'] / r['matmul_peak_gflops']:.0f} % "
            f"| {r['peak_rss_mb']} | {r['load']:.1f} |"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--models", default="Ti,S,B")
    parser.add_argument("--batches", default="1,32", help="inference batch sizes")
    parser.add_argument("--train-batches", default="16", help="training batch sizes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3, help="inference steps per timed sample")
    parser.add_argument("--train-iterations", type=int, default=1, help="training steps per timed sample")
    parser.add_argument("--dtype", default="float32", help="float32 or mixed_bfloat16")
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "original", "sgd"),
                        help="training: Keras' AdamW, the recipes' optimizer, or plain SGD")
    parser.add_argument("--jit-compile", default="auto", type=lambda v: v if v == "auto" else v == "true",
                        help="Keras jit_compile for training: auto, true (PyTorch: torch.compile) or false")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 1 repeat")
    parser.add_argument("--json", help="write all rows to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = ["tiny"] if args.smoke else args.models.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.train_batches = [int(b) for b in args.train_batches.split(",")]
    if args.smoke:
        args.batches, args.train_batches, args.repeats, args.iterations = [2], [2], 1, 1
        args.train_iterations = 1
    return args


def run_backends(script, argv, backends, json_path=None):
    """Runs `script ... --worker` once per backend (`KERAS_BACKEND` is fixed
    at import) and returns the JSON rows the workers print. Rows are echoed
    and saved to `json_path` as they come, so that a run cut short (a lent
    accelerator's time limit) keeps what it measured."""
    rows = []
    for backend in backends:
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        # stderr to a file: a pipe nobody reads stalls a worker that logs much.
        with tempfile.TemporaryFile("w+") as errors:
            worker = subprocess.Popen([sys.executable, os.path.abspath(script), *argv, "--worker"], env=env,
                                      stdout=subprocess.PIPE, stderr=errors, text=True)
            for line in worker.stdout:
                if line.startswith("{"):
                    rows.append(json.loads(line))
                    print(line, end="", flush=True)
                    if json_path:
                        with open(json_path, "w") as f:
                            json.dump(rows, f, indent=1)
            if worker.wait():
                errors.seek(0)
                sys.stderr.write(errors.read()[-3000:])
                raise SystemExit(f"the {backend} worker failed")
    return rows


def worker_script_main(script, argv, parse_args, run_worker, markdown):
    """The `main` of a script measured in one worker per backend: under
    `--worker` the worker itself; otherwise a worker per `--backends`, whose
    rows are printed as `markdown(rows)` and returned."""
    args = parse_args(argv)
    if args.worker:
        return run_worker(args)
    rows = run_backends(script, argv or sys.argv[1:], args.backends.split(","), args.json)
    print(markdown(rows))
    return rows


def main(argv=None):
    def report(rows):
        return f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}\n" + markdown(rows)

    return worker_script_main(__file__, argv, parse_args, run_worker, report)


if __name__ == "__main__":
    main()
