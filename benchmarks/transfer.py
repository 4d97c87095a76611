"""The paper's Sec. 4.6 setting on real images: masked patch prediction
without labels, then full fine-tuning, LoRA and a linear probe from that
checkpoint, through the recipes as a user runs them.

    python benchmarks/transfer.py --data /data/cifar10 --json benchmarks/results/transfer_cifar10.json
    python benchmarks/transfer.py --smoke          # a generated folder, a minute

`--data` holds `train/<class>/<image>` and `test/<class>/<image>`.
1. `python -m recipes.pretrain_mpp --dataset=<data> --train_split=train`
   (labels ignored) pre-trains a small ViT (width 128, 4 blocks, 4 heads,
   patches of 4, 32 px: the model of benchmarks/real_images.py);
2. from its `encoder.npz`, `python -m recipes.finetune` on the labelled
   training split, evaluated on `test`: every block trained (`full`), LoRA
   of rank 4, 8 and 16 on query and value (`--lora_rank`), and the head
   alone (`--linear_probe`), each for every seed.
Each run is its own process; the table gives the test accuracy (mean and
spread over the seeds), the trainable parameters, the training step time
(the recipe's images/s after the first updates) and the process's peak RSS.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = dict(hidden_size=128, num_layers=4, num_heads=4, mlp_dim=512, patch_size=4)
# name: (recipe flags, learning rate). Adapters and a lone head take a
# larger step than the whole network (SGD momentum, the paper's optimizer).
VARIANTS = {
    "full": ([], 0.03),
    "lora_4": (["--lora_rank=4"], 0.1),
    "lora_8": (["--lora_rank=8"], 0.1),
    "lora_16": (["--lora_rank=16"], 0.1),
    "linear_probe": (["--linear_probe"], 0.1),
}


def run(module, flags, env):
    """Runs `python -m recipes.<module> ...`; returns its summary.json and
    the process's peak RSS (MB)."""
    process = subprocess.Popen([sys.executable, "-m", f"recipes.{module}", *flags], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    if status:
        sys.stderr.write(output[-3000:])
        raise SystemExit(f"recipes.{module} failed")
    run_dir = next(f.split("=", 1)[1] for f in flags if f.startswith("--run_dir="))
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f), usage.ru_maxrss / 1024


def trainable_parameters(variant_flags, num_classes):
    import keras_vit

    model = keras_vit.ViT(None, input_shape=(32, 32, 3), num_classes=num_classes, **MODEL)
    if any(f.startswith("--lora_rank=") for f in variant_flags):
        keras_vit.enable_lora(model, int(variant_flags[0].split("=")[1]))
    elif "--linear_probe" in variant_flags:
        keras_vit.freeze_backbone(model)
    return int(sum(int(__import__("numpy").prod(v.shape)) for v in model.trainable_weights))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="image folder with train/ and test/")
    parser.add_argument("--out", default=None, help="run directories (default: a temporary folder)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--pretrain-steps", type=int, default=600)
    parser.add_argument("--finetune-steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--backend", default="tensorflow")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    env = dict(os.environ, KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    scratch = tempfile.mkdtemp(prefix="keras_vit_transfer_") if args.out is None else args.out
    if args.smoke:
        args.data = _folder(os.path.join(scratch, "data"))
        args.seeds, args.pretrain_steps, args.finetune_steps, args.batch = "0", 4, 4, 8
    model = f"--model_overrides={json.dumps(MODEL)}"
    common = ["--model=none", model, f"--dataset={args.data}", "--train_split=train", "--verbose=2", "--cache=true",
              f"--batch_size={args.batch}", "--accum_steps=1"]
    steps = args.pretrain_steps
    mpp, mpp_rss = run("pretrain_mpp", [
        *common, "--image_size=32", f"--total_steps={steps}", f"--warmup_steps={max(1, steps // 10)}",
        "--learning_rate=1e-3", "--weight_decay=0.05", f"--log_every={max(1, steps // 10)}",
        f"--checkpoint_every={steps}", f"--run_dir={os.path.join(scratch, 'mpp')}"], env)
    print(json.dumps({"mpp_final_loss": mpp["final_loss"], "mpp_images_per_second": mpp["images_per_second"]}),
          flush=True)
    rows = []
    steps = args.finetune_steps
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, (flags, lr) in VARIANTS.items():
            summary, rss = run("finetune", [
                *common, "--test_split=test", f"--weights={mpp['encoder_npz']}", "--image_size=32",
                f"--total_steps={steps}", f"--warmup_steps={max(1, steps // 10)}", f"--learning_rate={lr}",
                "--augmentation=resize_crop", f"--log_every={max(1, steps // 10)}", f"--checkpoint_every={steps}",
                f"--eval_batch_size={args.batch}", f"--seed={seed}",
                f"--run_dir={os.path.join(scratch, f'{name}_{seed}')}", *flags], env)
            row = dict(variant=name, seed=seed, accuracy=summary["accuracy"], learning_rate=lr,
                       step_ms=1e3 * args.batch / summary["images_per_second"], peak_rss_mb=round(rss),
                       trainable=trainable_parameters(flags, summary["num_classes"]), steps=summary["steps"])
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mpp": {k: mpp[k] for k in ("final_loss", "steps", "images_per_second")},
                       "mpp_peak_rss_mb": round(mpp_rss), "rows": rows, "args": vars(args)}, f, indent=1)
    if args.out is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def _folder(root, per_class=4):
    """A generated image folder (train/ and test/, two classes)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label in ("a", "b"):
            os.makedirs(os.path.join(root, split, label), exist_ok=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                    os.path.join(root, split, label, f"{i}.png"))
    return root


def markdown(rows):
    lines = ["| fine-tuning | trainable parameters | test accuracy (mean ± sd over seeds) | step (ms) | peak RSS (MiB) |",
             "|---|---|---|---|---|"]
    for name in VARIANTS:
        mine = [r for r in rows if r["variant"] == name]
        if not mine:
            continue
        accuracies = [100 * r["accuracy"] for r in mine]
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
        lines.append(f"| {name} | {mine[0]['trainable']:,} | {statistics.mean(accuracies):.2f} ± {spread:.2f} | "
                     f"{statistics.median(r['step_ms'] for r in mine):.0f} | "
                     f"{statistics.median(r['peak_rss_mb'] for r in mine):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
