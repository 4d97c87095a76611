"""Training on a real image folder: keras_vit's recipe against timm, per backend.

    python benchmarks/real_images.py --data /data/cifar10 --json results.json
    python benchmarks/real_images.py --data /data/cifar10 --seeds 0 --steps 60 \\
        --backends tensorflow --no-timm --recipe-flags="--steps_per_execution=10"
    python benchmarks/real_images.py --smoke          # generated folder, seconds

`--data` is a folder with `train/<class>/<image>` and `test/<class>/<image>`
(any image folder; the numbers in docs/performance.md are CIFAR-10's).
keras_vit is trained the way a user trains it, through its recipe
(`python -m recipes.pretrain --dataset=<folder> --model=none ...`: the
`keras_vit.data` pipeline reading the JPEG files, `fit`, checkpoints,
logs, evaluation); timm's `VisionTransformer` through a plain PyTorch loop
on the decoded images held in memory. Both get the same model (width 128,
4 blocks, 4 heads, MLP 512, patches of 4, 32 px, class token, no pre-logits
layer, no dropout), optimizer (AdamW, lr 1e-3, decoupled weight decay 0.1
times the learning rate on the kernels only, global-norm clipping at 1),
schedule (linear warmup 30 updates, then cosine to 0, the first update at
lr 0), augmentation (random horizontal flips), batch (128) and number of
updates (300); each keeps its own initialisers (keras_vit: the original's,
Flax defaults and a zero head; timm: truncated normal).
`--timm-init=original` gives timm the original's initialisers instead, to
measure what the initialisation alone changes.

Every (seed, runner) is its own process. Runs are interleaved (seed 0:
TensorFlow, timm, JAX, PyTorch; seed 1: ...) so that the load other work
puts on the machine hits every runner alike; the 1-minute load average is
recorded before and after each run. Throughput (img/s) is the training
loop's, after the first two updates (compilation, warm-up), input pipeline
included; evaluation and start-up are not in it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The compared set-up (docs/performance.md); `--smoke` shrinks it.
MODEL = dict(hidden_size=128, mlp_dim=512, num_heads=4, num_layers=4, patch_size=4)
SMOKE_MODEL = dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=4)
# Updates skipped before timing (the recipe's `throughput_timer(skip=2)`).
SKIP = 2


def schedule(step, base, total, warmup):
    """keras_vit.training.WarmupDecay (cosine), the original's schedule, in
    plain Python for the PyTorch loop: `step` counts finished updates, so the
    first update uses lr(0) = 0 when there is a warmup."""
    import math

    progress = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    lr = base * 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * min(1.0, step / warmup) if warmup else lr


# --- keras_vit: the recipe, as a user runs it ----------------------------------


def recipe_command(args, seed, run_dir):
    return [
        sys.executable, "-m", "recipes.pretrain",
        f"--dataset={args.data}", "--train_split=train", "--test_split=test",
        "--model=none", f"--model_overrides={json.dumps(args.model)}",
        # Explicit: a custom model would otherwise inherit the named config's
        # dropout (0.1 for the default `imagenet2012`).
        "--dropout_rate=0", "--drop_path_rate=0", "--pre_logits=false",
        "--loss=softmax", "--label_smoothing=0",
        "--augmentation=resize", "--flip=true", f"--image_size={args.image_size}",
        f"--batch_size={args.batch_size}", "--accum_steps=1",
        f"--eval_batch_size={args.eval_batch_size}",
        f"--total_steps={args.steps}", f"--warmup_steps={args.warmup}",
        f"--learning_rate={args.lr}", "--decay_type=cosine",
        f"--weight_decay={args.weight_decay}", "--grad_clip=1",
        f"--seed={seed}", f"--run_dir={run_dir}", "--overwrite",
        f"--log_every={args.log_every}", f"--checkpoint_every={args.steps}",
        "--distribution=none", "--verbose=0",
        *args.recipe_flags.split(),
    ]


def run_recipe(args, backend, seed, scratch):
    run_dir = os.path.join(scratch, f"{backend}_{seed}")
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    if args.torch_threads and backend == "torch":
        env["OMP_NUM_THREADS"] = str(args.torch_threads)
    result = subprocess.run(
        recipe_command(args, seed, run_dir), cwd=REPO, env=env, capture_output=True, text=True
    )
    if result.returncode:
        sys.stderr.write(result.stdout[-2000:] + result.stderr[-4000:])
        raise SystemExit(f"the keras_vit recipe failed ({backend}, seed {seed})")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "history.csv")) as f:
        header, *lines = [line.strip().split(",") for line in f if line.strip()]
    train_accuracy = [round(float(row[header.index("accuracy")]), 4) for row in lines]
    return dict(
        accuracy=summary["accuracy"], img_s=summary["images_per_second"],
        train_wall_s=summary["train_wall_time_s"], total_wall_s=summary["total_wall_time_s"],
        final_loss=summary["final_loss"], train_accuracy=train_accuracy,
    )


# --- timm: a plain PyTorch loop --------------------------------------------------


def load_folder(folder, image_size):
    """(uint8 NCHW tensor, int64 labels) of every image of `folder/<class>/`,
    resized to `image_size` where it differs (bilinear)."""
    import numpy as np
    import torch
    from PIL import Image

    classes = sorted(c for c in os.listdir(folder) if os.path.isdir(os.path.join(folder, c)))
    images, labels = [], []
    for index, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(folder, name))):
            with Image.open(os.path.join(folder, name, file)) as image:
                image = image.convert("RGB")
                if image.size != (image_size, image_size):
                    image = image.resize((image_size, image_size), Image.BILINEAR)
                images.append(np.asarray(image))
            labels.append(index)
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
    return x, torch.tensor(labels), len(classes)


def original_init(model):
    """The original's initialisers on timm's modules (vit_jax `models_vit.py`,
    Flax defaults), as keras_vit builds them: LeCun-normal patch embedding,
    Xavier-uniform q/k/v/out per (D, D) block and MLP kernels, MLP biases
    N(0, 1e-6), zero class token, position embeddings N(0, 0.02), zero
    head."""
    import math

    import torch

    with torch.no_grad():
        proj = model.patch_embed.proj
        std = math.sqrt(1.0 / proj.weight[0].numel()) / 0.87962566103423978
        torch.nn.init.trunc_normal_(proj.weight, std=std, a=-2 * std, b=2 * std)
        torch.nn.init.zeros_(proj.bias)
        torch.nn.init.zeros_(model.cls_token)
        torch.nn.init.normal_(model.pos_embed, std=0.02)
        for block in model.blocks:
            width = block.attn.proj.weight.shape[0]
            limit = math.sqrt(3.0 / width)  # Xavier on each (D, D) kernel.
            for weight in (block.attn.qkv.weight, block.attn.proj.weight):
                torch.nn.init.uniform_(weight, -limit, limit)
            torch.nn.init.zeros_(block.attn.qkv.bias)
            torch.nn.init.zeros_(block.attn.proj.bias)
            for layer in (block.mlp.fc1, block.mlp.fc2):
                torch.nn.init.xavier_uniform_(layer.weight)
                torch.nn.init.normal_(layer.bias, std=1e-6)
        torch.nn.init.zeros_(model.head.weight)
        torch.nn.init.zeros_(model.head.bias)


def timm_loop(args, seed, x_train, y_train, classes, gelu="erf"):
    """timm's ViT, its AdamW and the schedule; returns `(model, steps)`:
    `steps(n)` runs n updates of the plain PyTorch loop (sample a batch of
    the in-memory images, flip, normalise, forward, backward, clip, update)
    and returns `(last loss, correct, seen)`."""
    import functools

    import torch
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    m = args.model
    model = VisionTransformer(
        img_size=args.image_size, patch_size=m["patch_size"], embed_dim=m["hidden_size"],
        depth=m["num_layers"], num_heads=m["num_heads"], mlp_ratio=m["mlp_dim"] / m["hidden_size"],
        num_classes=classes, class_token=True, global_pool="token",
        # timm's exact GELU, or keras_vit's (the original's) tanh approximation.
        act_layer=functools.partial(torch.nn.GELU, approximate="none" if gelu == "erf" else "tanh"),
    )
    if args.timm_init == "original":
        original_init(model)
    # Kernels only, as keras_vit.training.kernel_variables: no decay on biases,
    # norms, the class token or the position embeddings.
    skip = model.no_weight_decay()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and n not in skip]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and n not in skip)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
    )
    lr_at = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: schedule(step, 1.0, args.steps, args.warmup)
    )
    generator = torch.Generator().manual_seed(seed)
    state = {"order": torch.randperm(len(x_train), generator=generator), "position": 0}
    model.train()

    def steps(n):
        correct = seen = 0
        for _ in range(n):
            if state["position"] + args.batch_size > len(x_train):  # A new epoch, a new order.
                state["order"], state["position"] = torch.randperm(len(x_train), generator=generator), 0
            index = state["order"][state["position"]:state["position"] + args.batch_size]
            state["position"] += args.batch_size
            images, labels = x_train[index], y_train[index]
            flip = torch.rand(len(index), generator=generator) < 0.5
            images = torch.where(flip[:, None, None, None], images.flip(-1), images)
            logits = model((images.float() - 127.5) / 127.5)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            lr_at.step()
            correct += int((logits.argmax(-1) == labels).sum())
            seen += len(labels)
        return float(loss), correct, seen

    return model, steps


def run_timm(args, seed):
    import torch

    start = time.perf_counter()
    x_train, y_train, classes = load_folder(os.path.join(args.data, "train"), args.image_size)
    x_test, y_test, _ = load_folder(os.path.join(args.data, "test"), args.image_size)
    decode_s = time.perf_counter() - start
    model, steps = timm_loop(args, seed, x_train, y_train, classes)
    train_start = time.perf_counter()
    loss, correct, seen = steps(SKIP)
    timed_start = time.perf_counter()
    window_accuracy, done = [], SKIP
    while True:  # Training accuracy per log_every updates.
        if done % args.log_every == 0 or done == args.steps:
            window_accuracy.append(round(correct / seen, 4))
            correct = seen = 0
        if done == args.steps:
            break
        n = min(args.log_every - done % args.log_every, args.steps - done)
        loss, c, k = steps(n)
        correct, seen, done = correct + c, seen + k, done + n
    train_end = time.perf_counter()
    model.eval()
    hits = 0
    with torch.no_grad():
        for i in range(0, len(x_test), args.eval_batch_size):
            batch = (x_test[i:i + args.eval_batch_size].float() - 127.5) / 127.5
            hits += int((model(batch).argmax(-1) == y_test[i:i + args.eval_batch_size]).sum())
    return dict(
        accuracy=hits / len(x_test),
        img_s=(args.steps - SKIP) * args.batch_size / (train_end - timed_start),
        train_wall_s=train_end - train_start, total_wall_s=time.perf_counter() - start,
        decode_s=decode_s, final_loss=loss, train_accuracy=window_accuracy,
    )


def worker_timm(args):
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    print("ROW " + json.dumps(run_timm(args, args.seeds[0])), flush=True)


def run_timm_process(args, seed):
    argv = [
        sys.executable, os.path.abspath(__file__), "--worker-timm", f"--data={args.data}",
        f"--seeds={seed}", f"--steps={args.steps}", f"--warmup={args.warmup}",
        f"--batch-size={args.batch_size}", f"--eval-batch-size={args.eval_batch_size}",
        f"--image-size={args.image_size}", f"--log-every={args.log_every}", f"--lr={args.lr}",
        f"--weight-decay={args.weight_decay}", f"--timm-init={args.timm_init}",
        f"--model-json={json.dumps(args.model)}", f"--torch-threads={args.torch_threads}",
    ]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode:
        sys.stderr.write(result.stderr[-4000:])
        raise SystemExit(f"the timm run failed (seed {seed})")
    return json.loads(next(l for l in result.stdout.splitlines() if l.startswith("ROW "))[4:])


# --- Where the time goes: one backend, variants interleaved --------------------


def throughput_worker(args):
    """Training img/s of the same keras_vit model and optimizer fed four
    ways, and of timm's loop, interleaved in one process (`--throughput`):

    - `train_on_batch, in memory`: one fixed batch of NumPy arrays;
    - `fit, in memory`: `fit` on a tf.data dataset repeating that batch
      (Keras' loop, no input work);
    - `fit, image folder`: `fit` on `keras_vit.data.finetune_pipeline` over
      the folder's JPEG files (the recipe's input: read, decode, flip);
    - the last two again with `steps_per_execution=--spe`;
    - `timm loop`: the PyTorch loop of the accuracy runs, in memory, with
      timm's exact GELU and with keras_vit's tanh approximation (the same
      function as keras_vit computes).

    The shuffle buffer is 2,000 here (`fit` restarts the pipeline every
    sample; the buffer size does not change the per-image work).
    """
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit import data, training

    tf.config.set_visible_devices([], "GPU")
    keras.utils.set_random_seed(0)
    backend = keras.backend.backend()
    source = data.from_directory(os.path.join(args.data, "train"))
    classes = source.num_classes
    x_train, y_train, _ = load_folder(os.path.join(args.data, "train"), args.image_size)
    rng = np.random.default_rng(0)
    pick = rng.choice(len(x_train), args.batch_size, replace=False)
    x = (x_train[pick].permute(0, 2, 3, 1).numpy().astype("float32") - 127.5) / 127.5
    y = np.eye(classes, dtype="float32")[y_train[pick].numpy()]

    def compiled(spe, jit_compile="auto"):
        model = keras_vit.ViT(None, num_classes=classes, representation_size=None,
                              input_shape=(args.image_size, args.image_size, 3), **args.model)
        model.compile(
            optimizer=training.pretraining_optimizer(
                model, args.lr, args.steps, warmup_steps=args.warmup, decay_type="cosine",
                weight_decay=args.weight_decay, global_clipnorm=1.0),
            loss=training.SoftmaxCrossEntropy(), steps_per_execution=spe, jit_compile=jit_compile,
            weighted_metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
        )
        return model

    # PyTorch: Keras allows no steps_per_execution > 1; its compiled mode is
    # torch.compile (`jit_compile=True`) instead.
    torch_backend = backend == "torch"
    models = {1: compiled(1)}
    more_spe = 1 if torch_backend else args.spe
    if args.torch_compile or not torch_backend:
        models["more"] = compiled(1, jit_compile=True) if torch_backend else compiled(args.spe)
    more = "jit_compile=True (torch.compile)" if torch_backend else f"steps_per_execution={args.spe}"
    in_memory = tf.data.Dataset.from_tensors((x, y)).repeat()
    folder = data.finetune_pipeline(
        source, training=True, batch_size=args.batch_size, image_size=args.image_size,
        augmentation="resize", flip=True, shuffle_buffer=2000, seed=0)
    steps = args.throughput_steps

    class Timer(keras.callbacks.Callback):
        # Like the recipe's: from the first callback after the warm-up on.
        def on_train_begin(self, logs=None):
            self.times = []

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())

    def fit(model, dataset, spe):
        timer = Timer()
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer])
        first = max(1, SKIP // spe)  # Callbacks come once per execution.
        return (len(timer.times) - first) * spe * args.batch_size / (timer.times[-1] - timer.times[first - 1])

    def on_batch():
        model = models[1]
        for _ in range(SKIP):
            model.train_on_batch(x, y)
        start = time.perf_counter()
        for _ in range(steps - SKIP):
            model.train_on_batch(x, y)
        return (steps - SKIP) * args.batch_size / (time.perf_counter() - start)

    def timm(gelu):
        _, timm_steps = timm_loop(args, 0, x_train, y_train, classes, gelu)

        def run():
            timm_steps(SKIP)
            start = time.perf_counter()
            timm_steps(steps - SKIP)
            return (steps - SKIP) * args.batch_size / (time.perf_counter() - start)

        return run

    variants = {} if not args.timm else {
        "timm loop, in memory": timm("erf"),
        "timm loop, in memory, tanh GELU": timm("tanh"),
    }
    variants.update({
        "train_on_batch, in memory": on_batch,
        "fit, in memory": lambda: fit(models[1], in_memory, 1),
        "fit, image folder": lambda: fit(models[1], folder, 1),
    })
    if "more" in models:
        variants.update({
            f"fit, in memory, {more}": lambda: fit(models["more"], in_memory, more_spe),
            f"fit, image folder, {more}": lambda: fit(models["more"], folder, more_spe),
        })
    for name, run in list(variants.items()):  # Compilation, first calls.
        try:
            run()
        except Exception as error:  # E.g. torch.compile without a C++ compiler.
            print(f"skipped {name}: {type(error).__name__}: {error}", file=sys.stderr)
            del variants[name]
    rates = {name: [] for name in variants}
    loads = []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name, run in variants.items():
            rates[name].append(run())
    rows = []
    for name, samples in rates.items():
        timm_rates = rates.get("timm loop, in memory")
        rows.append(dict(
            backend=backend, variant=name, img_s=round(statistics.median(samples), 1),
            samples=[round(r, 1) for r in samples],
            vs_timm=round(statistics.median(r / t for r, t in zip(samples, timm_rates)), 3)
            if timm_rates else None,
            vs_fit_in_memory=round(statistics.median(
                r / f for r, f in zip(samples, rates["fit, in memory"])), 3),
            load=round(statistics.mean(loads), 2), steps=steps, batch=args.batch_size,
        ))
    for row in rows:
        print("ROW " + json.dumps(row), flush=True)


def throughput_markdown(rows):
    out = ["| backend | variant | img/s (median) | x timm loop | x fit in memory | load |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        vs_timm = f"{r['vs_timm']:.2f}x" if r["vs_timm"] is not None else "–"
        out.append(f"| {r['backend']} | {r['variant']} | {r['img_s']} | {vs_timm} "
                   f"| {r['vs_fit_in_memory']:.2f}x | {r['load']:.2f} |")
    return "\n".join(out)


def run_throughput(args):
    rows = []
    for backend in args.backends:
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        argv = [a for a in (args.argv or []) if a != "--throughput"] + ["--worker-throughput"]
        if args.smoke:
            argv.append(f"--data={args.data}")
        result = subprocess.run([sys.executable, os.path.abspath(__file__), *argv],
                                env=env, capture_output=True, text=True)
        if result.returncode:
            sys.stderr.write(result.stderr[-4000:])
            raise SystemExit(f"the {backend} throughput worker failed")
        for line in result.stdout.splitlines():
            if line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
                print(line[4:], flush=True)
    return rows


# --- The driver ------------------------------------------------------------------


def write_folder(directory, classes=4, train_per_class=16, test_per_class=4, size=8, seed=0):
    """A learnable image folder (`--smoke`, tests): class c is a colour
    gradient along one of four directions, plus noise, as PNG files."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size)
    patterns = [ramp[None, :], ramp[:, None], ramp[::-1][None, :], ramp[::-1][:, None]]
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for c in range(classes):
            folder = os.path.join(directory, split, f"class_{c}")
            os.makedirs(folder, exist_ok=True)
            base = np.broadcast_to(patterns[c % 4], (size, size))[..., None] * 200.0
            for i in range(count):
                pixels = base + rng.normal(0, 20, (size, size, 3)) + 25 * (c // 4)
                pixels = np.clip(pixels, 0, 255).astype("uint8")
                Image.fromarray(pixels).save(os.path.join(folder, f"{i:04d}.png"))
    return directory


def summarize(rows):
    """One line per runner: accuracy and img/s as mean, sample standard
    deviation, min and max over seeds; img/s relative to timm's run of the
    same seed."""
    timm_rate = {r["seed"]: r["img_s"] for r in rows if r["runner"] == "timm"}
    runners = []
    for row in rows:
        if row["runner"] not in runners:
            runners.append(row["runner"])
    lines = []
    for runner in runners:
        mine = [r for r in rows if r["runner"] == runner]
        acc = [100 * r["accuracy"] for r in mine]
        rate = [r["img_s"] for r in mine]
        ratios = [r["img_s"] / timm_rate[r["seed"]] for r in mine if r["seed"] in timm_rate]
        sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
        lines.append(dict(
            runner=runner, seeds=len(mine),
            accuracy_mean=round(statistics.mean(acc), 2), accuracy_sd=round(sd(acc), 2),
            accuracy_min=round(min(acc), 2), accuracy_max=round(max(acc), 2),
            img_s_mean=round(statistics.mean(rate), 1), img_s_sd=round(sd(rate), 1),
            img_s_vs_timm=round(statistics.mean(ratios), 2) if ratios else None,
            load_mean=round(statistics.mean(r["load_before"] for r in mine), 2),
        ))
    return lines


def markdown(summary):
    out = [
        "| runner | seeds | test accuracy % (mean ± sd) | min–max | img/s (mean ± sd) "
        "| img/s / timm | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        ratio = f"{s['img_s_vs_timm']:.2f}x" if s["img_s_vs_timm"] is not None else "–"
        out.append(
            f"| {s['runner']} | {s['seeds']} | {s['accuracy_mean']:.2f} ± {s['accuracy_sd']:.2f} "
            f"| {s['accuracy_min']:.2f}–{s['accuracy_max']:.2f} "
            f"| {s['img_s_mean']:.1f} ± {s['img_s_sd']:.1f} | {ratio} | {s['load_mean']:.2f} |"
        )
    return "\n".join(out)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a folder with train/<class>/* and test/<class>/*")
    parser.add_argument("--backends", default="tensorflow,jax,torch",
                        help="keras_vit backends ('' for none)")
    parser.add_argument("--no-timm", dest="timm", action="store_false", help="skip timm")
    parser.add_argument("--timm-init", default="timm", choices=("timm", "original"),
                        help="timm's own initialisers, or the original's (keras_vit's)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--eval-batch-size", type=int, default=500)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--log-every", type=int, default=50,
                        help="updates per training-accuracy window (and recipe log line)")
    parser.add_argument("--recipe-flags", default="",
                        help="extra recipe flags, e.g. '--steps_per_execution=10'")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="PyTorch threads of timm and the keras_vit PyTorch runs (0: PyTorch's "
                             "default, one per core); 1 on a heavily shared machine, where two "
                             "OpenMP threads wait on each other")
    parser.add_argument("--model-json", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the rows and the summary to this JSON file")
    parser.add_argument("--smoke", action="store_true",
                        help="a generated folder, a tiny model, 4 updates, one seed")
    parser.add_argument("--throughput", action="store_true",
                        help="where the time goes: the ways of feeding keras_vit against timm's loop, "
                             "interleaved in one process per backend (no accuracy runs)")
    parser.add_argument("--spe", type=int, default=10, help="--throughput: steps_per_execution tried")
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="--throughput on PyTorch: skip the torch.compile variants "
                        "(compiling takes minutes on a CPU)")
    parser.add_argument("--rounds", type=int, default=3, help="--throughput: interleaved rounds")
    parser.add_argument("--throughput-steps", type=int, default=40,
                        help="--throughput: updates per timed sample (a multiple of --spe)")
    parser.add_argument("--worker-timm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-throughput", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.model = json.loads(args.model_json) if args.model_json else dict(MODEL)
    if args.smoke:
        args.model = dict(SMOKE_MODEL)
        args.seeds, args.steps, args.warmup, args.batch_size = "0", 4, 1, 8
        args.eval_batch_size, args.image_size, args.log_every = 8, 8, 2
        args.spe, args.rounds, args.throughput_steps = 2, 1, 4
    args.seeds = [int(s) for s in str(args.seeds).split(",")]
    args.backends = [b for b in args.backends.split(",") if b]
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker_timm:
        worker_timm(args)
        return None
    if args.worker_throughput:
        throughput_worker(args)
        return None
    with tempfile.TemporaryDirectory(prefix="keras_vit_real_images_") as scratch:
        if args.data is None:
            if not args.smoke:
                raise SystemExit("--data is required (a folder with train/ and test/), or --smoke")
            args.data = write_folder(os.path.join(scratch, "images"))
        if args.throughput:
            rows = run_throughput(args)
            print(f"\n{args.throughput_steps} updates of {args.batch_size} per sample, "
                  f"{args.rounds} rounds, {os.cpu_count()} cores\n")
            print(throughput_markdown(rows))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"setup": {k: v for k, v in vars(args).items() if k != "argv"},
                               "rows": rows}, f, indent=1)
            return rows
        runners = [("keras_vit", b) for b in args.backends]
        if args.timm:
            runners.insert(min(1, len(runners)), ("timm", "torch"))
        rows = []
        for seed in args.seeds:
            for library, backend in runners:
                load_before = os.getloadavg()[0]
                if library == "timm":
                    row = run_timm_process(args, seed)
                    name = "timm" if args.timm_init == "timm" else "timm, original init"
                else:
                    row = run_recipe(args, backend, seed, scratch)
                    name = f"keras_vit {backend}"
                row.update(runner=name, library=library, backend=backend, seed=seed,
                           load_before=round(load_before, 2),
                           load_after=round(os.getloadavg()[0], 2))
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = summarize(rows)
    print(f"\n{args.steps} updates of {args.batch_size}, {os.cpu_count()} cores, "
          f"recipe flags: {args.recipe_flags or '-'}\n")
    print(markdown(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setup": {k: v for k, v in vars(args).items() if k != "argv"},
                       "rows": rows, "summary": summary}, f, indent=1)
    return rows, summary


if __name__ == "__main__":
    main()
