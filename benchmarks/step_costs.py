"""Two costs inside a small ViT's training step, against timm's, per backend.

    KERAS_BACKEND=torch python benchmarks/step_costs.py
    KERAS_BACKEND=torch OMP_NUM_THREADS=1 python benchmarks/step_costs.py --repeats 15

For the CIFAR-sized ViT of `benchmarks/real_images.py` (width 128, 4 blocks,
MLP 512, 65 tokens, batch 128):

- `optimizer`: one update of the recipes' optimizer
  (`keras_vit.training.pretraining_optimizer`: decoupled Adam, decay on the
  kernels, global-norm clipping, warmup-cosine) through `optimizer.apply`,
  against `torch.optim.AdamW` (its default for CPU tensors: the for-loop) + `clip_grad_norm_` on timm's
  model. On PyTorch, Keras runs the update eagerly, one small op at a time,
  inside every training step; on TensorFlow and JAX the update is compiled
  into the step and this eager figure is not what training pays.
- `gelu`: forward + backward of PyTorch's tanh GELU (keras_vit's, the
  original's) against the exact GELU (timm's) on the MLP activations of
  one step (4 x [128, 65, 512]).

Interleaved, minimum of `--repeats`; milliseconds per training step.
"""

import argparse
import json
import os
import time

MODEL = dict(hidden_size=128, mlp_dim=512, num_heads=4, num_layers=4, patch_size=4)


def _min_times(runs, repeats):
    for run in runs.values():  # Warm-up.
        run()
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: round(1000 * min(samples), 2) for name, samples in times.items()}


def optimizer_costs(repeats):
    import keras
    import torch
    from timm.models.vision_transformer import VisionTransformer

    import keras_vit
    from keras_vit import training

    model = keras_vit.ViT(None, num_classes=10, representation_size=None,
                          input_shape=(32, 32, 3), **MODEL)
    optimizer = training.pretraining_optimizer(
        model, 1e-3, 300, warmup_steps=30, decay_type="cosine", weight_decay=0.1,
        global_clipnorm=1.0)
    variables = model.trainable_variables
    optimizer.build(variables)
    grads = [keras.random.normal(v.shape, seed=i) * 1e-3 for i, v in enumerate(variables)]
    timm = VisionTransformer(img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4,
                             mlp_ratio=4, num_classes=10)
    params = list(timm.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    adamw = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)

    def timm_update():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        adamw.step()

    costs = _min_times({
        "keras_vit optimizer.apply (eager)": lambda: optimizer.apply(grads, variables),
        "torch AdamW + clip_grad_norm_": timm_update,
    }, repeats)
    return dict(costs, variables=len(variables))


def gelu_costs(repeats):
    import torch

    x = torch.randn(128, 65, 512, requires_grad=True)
    upstream = torch.randn(128, 65, 512)

    def gelu(approximate):
        def run():
            for _ in range(MODEL["num_layers"]):
                torch.nn.functional.gelu(x, approximate=approximate).backward(upstream)
        return run

    return _min_times({"tanh GELU (keras_vit)": gelu("tanh"), "exact GELU (timm)": gelu("none")},
                      repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", help="append the row to this JSON-lines file")
    args = parser.parse_args(argv)
    import keras
    import torch

    row = dict(
        backend=keras.backend.backend(), torch_threads=torch.get_num_threads(),
        optimizer_ms=optimizer_costs(args.repeats), gelu_ms=gelu_costs(args.repeats),
        load=round(os.getloadavg()[0], 2), repeats=args.repeats,
    )
    print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    main()
