"""Peak memory of one compiled training step, from the compiler's own
accounting (XLA's buffer assignment, through JAX), for the models users
fine-tune: which model, resolution and batch fits in 16, 40 or 80 GB.

    KERAS_BACKEND=jax python benchmarks/memory.py               # the table of docs/performance.md
    KERAS_BACKEND=jax python benchmarks/memory.py --smoke       # minutes on CPU: a tiny model
    KERAS_BACKEND=jax python benchmarks/memory.py --check B/16,224,16 [--remat] [--mode lora] [--dtype bfloat16]
        # runs the step for real: the device's measured peak and the step time

For each case it builds the model, the paper's fine-tuning optimizer (SGD
momentum, bfloat16 buffer) and Keras' own JAX training step
(`model.train_step`, the function `fit` compiles), lowers it for abstract
inputs and reads `compile().memory_analysis()`: arguments (weights,
optimizer state, the batch) + outputs + temporaries - what the outputs
reuse of the arguments (the state is donated, as `fit` does). Nothing runs,
so it works for ViT-H/14 at 384 px on a CPU. Memory grows linearly with the
batch: each case is compiled at two micro-batches and the line gives the
largest micro-batch under each budget (checked against a third compile).
XLA's buffer assignment for a GPU or TPU differs from the CPU's in its
details (fusion, layouts); run on the accelerator, the figures are its
compiler's, and `--check` runs the step there for real (on an H200 the
device's peak matched the GPU compiler's figure within 0.05 %, and was
0.3x-0.8x of the CPU compiler's).
"""

import argparse
import contextlib
import json
import math
import platform
import statistics
import sys
import time

GIB = 2**30
# Accelerators' memory as sold: a "16 GB" GPU holds 16 GiB (16,384 MiB).
BUDGETS_GB = (16, 40, 80)
# The line through two batches under-estimates larger ones (ViT-B/16, 224
# px: 8.9 and 17.2 GiB compiled at 32 and 64, 8.0 and 15.4 predicted): the
# largest batch is taken with 15 % more per image.
MARGIN = 1.15
MODELS = {"Ti/16": "ViT-Ti_16", "S/16": "ViT-S_16", "B/16": "ViT-B_16", "L/16": "ViT-L_16", "H/14": "ViT-H_14"}
MODES = ("full", "lora", "linear_probe")
LORA_RANK = 8
# `--smoke`'s model: heads 16 wide, room for LoRA's rank.
SMOKE_MODEL = dict(hidden_size=32, num_layers=3, num_heads=2, mlp_dim=128, patch_size=4)


@contextlib.contextmanager
def training_step(variant, image_size, batch, *, mode="full", dtype="float32", remat=False, num_classes=1000,
                  overrides=None):
    """Yields `(model, compiled)`: the case's model and Keras' JAX training
    step (`model.train_step`, what `fit` jits, the state donated as `fit`
    does) compiled ahead of time for the case's shapes."""
    import jax
    import keras

    import keras_vit
    from keras_vit import training

    keras.config.set_dtype_policy("mixed_bfloat16" if dtype == "bfloat16" else "float32")
    try:
        model = keras_vit.ViT(variant, input_shape=(image_size, image_size, 3), num_classes=num_classes,
                              remat=remat, **(overrides or {}))
        if mode == "lora":
            keras_vit.enable_lora(model, rank=LORA_RANK)
        elif mode == "linear_probe":
            keras_vit.freeze_backbone(model)
        model.compile(optimizer=training.finetuning_optimizer(0.01, 1000), loss=training.SoftmaxCrossEntropy())
        model.optimizer.build(model.trainable_variables)
        model.make_train_function()  # builds the metrics' variables as fit does

        def abstract(variables):
            return [jax.ShapeDtypeStruct(v.shape, v.value.dtype) for v in variables]

        state = (abstract(model.trainable_variables), abstract(model.non_trainable_variables),
                 abstract(model.optimizer.variables), abstract(model.metrics_variables))
        data = (jax.ShapeDtypeStruct((batch, image_size, image_size, 3), "float32"),
                jax.ShapeDtypeStruct((batch, num_classes), "float32"))
        yield model, jax.jit(model.train_step, donate_argnums=0).lower(state, data).compile()
    finally:
        keras.config.set_dtype_policy("float32")
        keras.backend.clear_session()


def accounting(model, compiled):
    """The compiler's peak bytes of the step, and its parts."""
    stats = compiled.memory_analysis()
    parts = {name: int(getattr(stats, f"{name}_size_in_bytes")) for name in ("argument", "output", "alias", "temp")}
    parts["peak"] = parts["argument"] + parts["output"] - parts["alias"] + parts["temp"]
    parts["parameters"] = int(model.count_params())
    parts["trainable"] = int(sum(math.prod(v.shape) for v in model.trainable_variables))
    return parts


def step_bytes(variant, image_size, batch, **case):
    """The compiler's peak bytes of one training step, and its parts."""
    with training_step(variant, image_size, batch, **case) as (model, compiled):
        return accounting(model, compiled)


def side(model_name, size):
    """`size` rounded up to a multiple of the model's patch (H/14: 392 for 384)."""
    patch = int(model_name.split("/")[1])
    return -(-size // patch) * patch


def fit_line(sizes):
    """`(bytes at batch 0, bytes per example)` from `{batch: bytes}`."""
    (b0, m0), (b1, m1) = sorted(sizes.items())[:2]
    slope = (m1 - m0) / (b1 - b0)
    return m0 - slope * b0, slope


def largest_batch(base, per_example, budget_gb):
    """The largest batch whose predicted peak, with `MARGIN` on the
    per-example bytes, fits in `budget_gb` GiB."""
    if base >= budget_gb * GIB:
        return 0
    return int((budget_gb * GIB - base) // (per_example * MARGIN))


def measure(cases, batches, check_batch=None, overrides=None):
    rows = []
    for model_name, image_size, mode, dtype, remat in cases:
        start = time.perf_counter()
        case = dict(mode=mode, dtype=dtype, remat=remat, overrides=overrides)
        sizes = {b: step_bytes(MODELS[model_name], image_size, b, **case) for b in batches}
        base, per_example = fit_line({b: s["peak"] for b, s in sizes.items()})
        row = dict(model=model_name, image_size=image_size, mode=mode, dtype=dtype, remat=remat,
                   parameters=sizes[batches[0]]["parameters"], trainable=sizes[batches[0]]["trainable"],
                   fixed_gib=base / GIB, per_example_mib=per_example / 2**20,
                   peak_gib={b: s["peak"] / GIB for b, s in sizes.items()},
                   largest_batch={f"{g} GB": largest_batch(base, per_example, g) for g in BUDGETS_GB})
        if check_batch:
            actual = step_bytes(MODELS[model_name], image_size, check_batch, **case)["peak"]
            row["linearity_error"] = abs(base + per_example * check_batch - actual) / actual
        row["seconds"] = time.perf_counter() - start
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def markdown(rows):
    lines = ["| model | px | mode | dtype | remat | trainable | fixed (GiB) | per image (MiB) | "
             + " | ".join(f"max batch {g} GB" for g in BUDGETS_GB) + " |",
             "|---" * (8 + len(BUDGETS_GB)) + "|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['image_size']} | {r['mode']} | {r['dtype']} | {'on' if r['remat'] else 'off'} | "
            f"{r['trainable'] / 1e6:.1f}M | {r['fixed_gib']:.2f} | {r['per_example_mib']:.0f} | "
            + " | ".join(str(r["largest_batch"][f"{g} GB"]) for g in BUDGETS_GB) + " |")
    return "\n".join(lines)


def check(variant, image_size, batch, *, steps=5, **case):
    """Runs the case's compiled step for real, `steps` + 1 times, in this
    process: the compiler's peak against the device's measured one (a GPU's
    or TPU's peak bytes in use, which a fresh process has counted since it
    started: weights, optimizer state, the batch, the step; on a CPU the
    growth of the process's peak RSS over the steps, against what the step
    adds to its arguments), and the step's time (median of the warm steps)."""
    import resource

    import jax
    import keras
    import numpy as np

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    with training_step(variant, image_size, batch, **case) as (model, compiled):
        parts = accounting(model, compiled)
        state = tuple([v.value for v in variables] for variables in (
            model.trainable_variables, model.non_trainable_variables, model.optimizer.variables,
            model.metrics_variables))
        device = jax.devices()[0]
        images = jax.device_put(np.random.default_rng(0).normal(size=(batch, image_size, image_size, 3))
                                .astype("float32"), device)
        classes = model.output_shape[-1]
        labels = jax.device_put(np.eye(classes, dtype="float32")[np.arange(batch) % classes], device)
        before, times = rss(), []
        for _ in range(steps + 1):
            start = time.perf_counter()
            logs, state = compiled(state, (images, labels))
            jax.block_until_ready((logs, state))
            times.append(time.perf_counter() - start)
        stats = device.memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            measured, predicted, what = stats["peak_bytes_in_use"], parts["peak"], "device peak bytes in use"
        else:
            measured, what = rss() - before, "growth of the process's peak RSS over the steps"
            predicted = parts["output"] - parts["alias"] + parts["temp"]
    return {"variant": variant, "image_size": image_size, "batch": batch, **case,
            "device": f"{device.platform}: {device.device_kind}", "measured": what,
            "measured_gib": measured / GIB, "compiler_gib": predicted / GIB,
            "compiler_parts_gib": {k: parts[k] / GIB for k in ("argument", "output", "alias", "temp")},
            "step_ms": 1000 * statistics.median(times[1:]), "loss": float(logs["loss"]),
            "jax": jax.__version__, "keras": keras.__version__}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny custom model (SMOKE_MODEL), every mode: minutes on CPU")
    parser.add_argument("--check", metavar="MODEL,PX,BATCH", default=None,
                        help="run one case's step for real (e.g. B/16,224,16): the compiler's peak against the "
                        "device's measured peak, and the step time; one case per process")
    parser.add_argument("--mode", default="full", choices=MODES, help="with --check")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="with --check")
    parser.add_argument("--remat", action="store_true", help="with --check: the model with remat")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--sizes", default="224,384")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    import keras

    if keras.backend.backend() != "jax":
        sys.exit("error: the compiler's memory accounting is read through JAX: run with KERAS_BACKEND=jax")
    if args.check:
        model_name, image_size, batch = args.check.split(",")
        row = check(MODELS.get(model_name, model_name), int(image_size), int(batch), mode=args.mode, dtype=args.dtype,
                    remat=args.remat)
        print(json.dumps(row))
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        return row
    if args.smoke:
        MODELS["tiny"] = None
        cases = [("tiny", 32, mode, dtype, remat) for mode in MODES for dtype in ("float32", "bfloat16")
                 for remat in (False, True)]
        rows = measure(cases, (2, 4), check_batch=8, overrides=SMOKE_MODEL)
    else:
        models, sizes = args.models.split(","), [int(size) for size in args.sizes.split(",")]
        # Full fine-tuning for every model; LoRA and the linear probe for the
        # models users fine-tune on 16 GB (B/16, L/16), in float32.
        cases = [(m, side(m, size), "full", dtype, remat) for m in models for size in sizes
                 for dtype in ("float32", "bfloat16") for remat in (False, True)]
        cases += [(m, side(m, size), mode, "float32", remat) for m in models if m in ("B/16", "L/16")
                  for size in sizes for mode in MODES[1:] for remat in (False, True)]
        rows = measure(cases, (8, 16), check_batch=None)
        # The line is checked once per model at a third batch.
        for m in models:
            rows += measure([(m, sizes[0], "full", "float32", False)], (8, 16), check_batch=32)
    print(markdown(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "machine": platform.processor() or platform.machine(),
                       "command": "KERAS_BACKEND=jax python benchmarks/memory.py " + " ".join(argv or sys.argv[1:])},
                      f, indent=1)
    return rows


if __name__ == "__main__":
    main()
