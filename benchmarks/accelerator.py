"""keras_vit on an accelerator, against keras-hub and timm in the same run.

    python benchmarks/accelerator.py                 # B/16 and L/16 at 224 and 384 px, every backend
    python benchmarks/accelerator.py --backends jax --models B --sizes 224
    python benchmarks/accelerator.py --smoke         # tiny sizes on any device, seconds (the suite runs it)

On whatever device JAX, TensorFlow and PyTorch see (a GPU, a TPU, or the
CPU), for each model, resolution, dtype (float32, mixed bfloat16) and
attention kernel (Keras' flash attention on and off,
`keras.config.enable_flash_attention`), it reports training and inference
images per second, the step time, the compile time (the first two calls
minus two steady ones) and the peak device memory. `--jit-compile` compiles
the Keras models with `jit_compile=True` (`torch.compile` on PyTorch) and
timm through `torch.compile`. keras_vit, keras-hub's ViT (same
backend) and timm (PyTorch, on CUDA when present, bfloat16 through
autocast, its fused attention as it ships) are measured one after the
other (each library's peak memory is its own), each backend in its own
process (`KERAS_BACKEND` is fixed at import), medians
of `--repeats`. Every library gets its batch already on the device
(`--numpy-inputs`: Keras models copy a numpy batch in every step). Rows are
printed and saved as they come, so a run cut short keeps what it measured.
JAX cannot reset its peak-memory count: its figure is the process's
running maximum. The helpers are `benchmarks/bench.py`'s.
"""

import argparse
import json
import statistics
import time

import bench

MODELS = {"B": "B", "L": "L", "tiny": "tiny"}
bench.SIZES.setdefault("L", (1024, 4096, 16, 24, 16))


def device_name():
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}: {device.device_kind}"
    if backend == "torch":
        import torch

        return f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return f"gpu: {tf.config.experimental.get_device_details(gpus[0]).get('device_name', gpus[0].name)}"
    return "tpu" if tf.config.list_logical_devices("TPU") else "cpu"


def reset_peak():
    """Starts the device's peak-memory count afresh where the backend can."""
    import keras

    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
    elif keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if tf.config.list_physical_devices("GPU"):
            tf.config.experimental.reset_memory_stats("GPU:0")


def peak_memory_mb():
    """The device's peak bytes in use (GPU/TPU), or the process's peak RSS
    on a CPU (the device memory there), in MB."""
    import resource

    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            return round(stats["peak_bytes_in_use"] / 2**20)
    elif backend == "torch":
        import torch

        if torch.cuda.is_available():
            return round(torch.cuda.max_memory_allocated() / 2**20)
    else:
        import tensorflow as tf

        if tf.config.list_physical_devices("GPU"):
            return round(tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def timm_bf16(runner):
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"

    def run():
        with torch.autocast(device, dtype=torch.bfloat16):
            runner()

    return run


def measure(runner, repeats):
    """`(compile seconds, median step seconds)`: the first two calls against
    two steady ones (Keras' `torch.compile` training step compiles again in
    its second call: the gradients and the optimizer's state appear in the
    first, which guards check)."""
    start = time.perf_counter()
    runner()
    runner()
    warmup = time.perf_counter() - start
    steps = [bench._timed(runner, 1) for _ in range(repeats)]
    median = statistics.median(steps)
    return max(warmup - 2 * median, 0.0), median


def configure(dtype, flash):
    """Sets Keras' global dtype policy and flash-attention switch; needed
    before every model, because `keras.backend.clear_session()` resets both
    (to float32 and to "flash where possible"; a first H200 run measured
    models in float32 under the bfloat16 label before this was seen).
    `enable_flash_attention()` stores None, "wherever the kernel applies"."""
    import keras

    keras.config.set_dtype_policy("mixed_bfloat16" if dtype == "bfloat16" else "float32")
    (keras.config.enable_flash_attention if flash else keras.config.disable_flash_attention)()


def run_worker(args):
    import keras
    import numpy as np

    backend = keras.backend.backend()
    device = device_name()
    rows = []
    for model in args.models:
        for image in args.sizes:
            for dtype, flash in args.configs:
                for mode, batch in (("inference", args.batch), ("training", args.train_batch)):
                    if mode not in args.modes:
                        continue
                    rng = np.random.default_rng(0)
                    x = rng.uniform(-1, 1, (batch, image, image, 3)).astype("float32")
                    y = rng.integers(0, bench.num_classes(model), (batch,))
                    row = dict(backend=backend, device=device, model=model, image=image, dtype=dtype,
                               flash_attention=flash, mode=mode, batch=batch, jit_compile=args.jit_compile)
                    builders = {"keras_vit": bench.build_keras_vit, "keras-hub": bench.build_keras_hub}
                    for name, build in builders.items():
                        try:
                            configure(dtype, flash)
                            built = build(model, image)
                            runner = bench.keras_runner(built, x, y, mode, on_device=not args.numpy_inputs,
                                                        jit_compile=True if args.jit_compile else "auto")
                        except ImportError:
                            continue
                        except Exception as error:  # e.g. flash attention refused on this device
                            row[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                            continue
                        reset_peak()
                        try:
                            compile_s, step_s = measure(runner, args.repeats)
                        except Exception as error:
                            row[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                            continue
                        row.update({f"{name}_img_s": round(batch / step_s, 2), f"{name}_step_ms": round(1e3 * step_s, 2),
                                    f"{name}_compile_s": round(compile_s, 2), f"{name}_peak_mb": peak_memory_mb(),
                                    # What the measured model really ran with.
                                    f"{name}_policy": built.dtype_policy.name,
                                    f"{name}_flash": keras.config.is_flash_attention_enabled() is not False})
                        keras.backend.clear_session()
                    if backend == "torch" and not flash:  # timm once per dtype: its own attention kernel
                        try:
                            runner = bench.timm_runner(model, image, x, y, mode, compile=args.jit_compile)
                            runner = timm_bf16(runner) if dtype == "bfloat16" else runner
                            reset_peak()
                            compile_s, step_s = measure(runner, args.repeats)
                            row.update({"timm_img_s": round(batch / step_s, 2),
                                        "timm_step_ms": round(1e3 * step_s, 2), "timm_peak_mb": peak_memory_mb()})
                        except ImportError:
                            pass
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    configure("float32", False)
    return rows


def markdown(rows):
    lines = ["| backend | device | model | px | dtype | flash | mode | batch | keras_vit img/s | step ms | compile s "
             "| peak MiB | keras-hub img/s | ratio | timm img/s |", "|---" * 15 + "|"]
    for r in rows:
        ours, hub = r.get("keras_vit_img_s"), r.get("keras-hub_img_s")
        ratio = f"{ours / hub:.2f}x" if ours and hub else "n/a"
        lines.append(
            f"| {r['backend']} | {r['device']} | {r['model']} | {r['image']} | {r['dtype']} | "
            f"{'on' if r['flash_attention'] else 'off'} | {r['mode']} | {r['batch']} | "
            f"{ours if ours else r.get('keras_vit_error', 'n/a')} | {r.get('keras_vit_step_ms', '–')} | "
            f"{r.get('keras_vit_compile_s', '–')} | {r.get('keras_vit_peak_mb', '–')} | {hub or 'n/a'} | {ratio} | "
            f"{r.get('timm_img_s', '–')} |")
    return "\n".join(lines)


def parse_config(text):
    dtype, _, flash = text.partition(":")
    if dtype not in ("float32", "bfloat16") or flash not in ("on", "off"):
        raise SystemExit(f"--configs: expected dtype:flash pairs like bfloat16:on, got {text!r}")
    return dtype, flash == "on"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="jax,tensorflow,torch")
    parser.add_argument("--models", default="B,L")
    parser.add_argument("--sizes", default="224,384")
    parser.add_argument("--configs", default="float32:off,float32:on,bfloat16:off,bfloat16:on",
                        help="dtype:flash pairs, e.g. bfloat16:on (fused attention kernels need 16-bit inputs)")
    parser.add_argument("--numpy-inputs", action="store_true",
                        help="Keras models get numpy batches (copied to the device in every step) instead of "
                             "batches already on the device, as timm's are")
    parser.add_argument("--jit-compile", action="store_true",
                        help="Keras models compiled with jit_compile=True (torch.compile on PyTorch; JAX always "
                             "compiles, TensorFlow's default already uses XLA) and timm through torch.compile")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--batch", type=int, default=32, help="inference batch")
    parser.add_argument("--train-batch", type=int, default=16, help="training batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a tiny model at 32 px, 1 repeat")
    parser.add_argument("--json", help="write all rows to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = ["tiny"] if args.smoke else args.models.split(",")
    args.sizes = [32] if args.smoke else [int(s) for s in args.sizes.split(",")]
    args.configs = [parse_config(c) for c in args.configs.split(",")]
    args.modes = args.modes.split(",")
    if args.smoke:
        args.batch, args.train_batch, args.repeats = 2, 2, 1
    return args


def main(argv=None):
    return bench.worker_script_main(__file__, argv, parse_args, run_worker, markdown)


if __name__ == "__main__":
    main()
