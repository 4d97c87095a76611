"""A dynamic-size model against a static one, per backend (issue 25).

    python benchmarks/dynamic_size.py                  # Ti/16 and S/16 at 224 and 384 px, every backend
    python benchmarks/dynamic_size.py --backends jax --models S --sizes 384
    python benchmarks/dynamic_size.py --smoke          # a tiny model, seconds (the suite runs it)

For each model and image size: `keras_vit.ViT(input_shape=(S, S, 3))` and
`keras_vit.ViT(input_shape=(None, None, 3))` (position embeddings stored
for 224 px, resampled inside the graph at 384), inference through
`predict_on_batch` (JAX: `jax.jit`; TensorFlow: `tf.function` with XLA,
Keras' "auto"; PyTorch: eager), timed interleaved (static, dynamic,
static, ...) in one process per backend; medians of `--repeats`, and the
ratio dynamic / static of images per second.
"""

import argparse
import json
import statistics

import bench


def build(size, image, dynamic):
    import keras_vit

    hidden, mlp, heads, layers, patch = bench.SIZES[size]
    shape = (None, None, 3) if dynamic else (image, image, 3)
    stored = dict(image_size=bench.image_size(size)) if dynamic else {}
    return keras_vit.ViT(None, hidden_size=hidden, mlp_dim=mlp, num_heads=heads, num_layers=layers,
                         patch_size=patch, input_shape=shape, num_classes=bench.num_classes(size), **stored)


def run_worker(args):
    import keras
    import numpy as np

    rows = []
    for size in args.models:
        for image in args.sizes:
            x = np.random.default_rng(0).uniform(-1, 1, (args.batch, image, image, 3)).astype("float32")
            models = {"static": build(size, image, False), "dynamic": build(size, image, True)}
            runners = {name: (lambda m=m: keras.ops.convert_to_numpy(m.predict_on_batch(x))) for name, m in models.items()}
            for runner in runners.values():
                runner()  # compile
            times = {name: [] for name in runners}
            for _ in range(args.repeats):
                for name, runner in runners.items():
                    times[name].append(bench._timed(runner, args.iterations))
            row = dict(backend=keras.backend.backend(), model=size, image=image, batch=args.batch)
            for name in runners:
                row[f"{name}_img_s"] = round(args.batch / statistics.median(times[name]), 2)
            row["ratio"] = round(row["dynamic_img_s"] / row["static_img_s"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
            keras.backend.clear_session()
    return rows


def markdown(rows):
    lines = ["| backend | model | px | batch | static img/s | dynamic img/s | dynamic / static |", "|---" * 7 + "|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['model']}/{bench.SIZES[r['model']][4]} | {r['image']} | {r['batch']} | {r['static_img_s']} "
                     f"| {r['dynamic_img_s']} | {r['ratio']:.3f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--models", default="Ti,S")
    parser.add_argument("--sizes", default="224,384")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=2, help="steps per timed sample")
    parser.add_argument("--smoke", action="store_true", help="a tiny model at 32 and 48 px, 1 repeat")
    parser.add_argument("--json", help="write all rows to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = ["tiny"] if args.smoke else args.models.split(",")
    args.sizes = [32, 48] if args.smoke else [int(s) for s in args.sizes.split(",")]
    if args.smoke:
        args.batch, args.repeats, args.iterations = 2, 1, 1
    return args


def main(argv=None):
    return bench.worker_script_main(__file__, argv, parse_args, run_worker, markdown)


if __name__ == "__main__":
    main()
