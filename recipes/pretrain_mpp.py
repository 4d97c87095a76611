"""Self-supervised masked patch prediction (paper Sec. 4.6, App. B.1.2).

Pre-trains a plain ViT by predicting the 3-bit mean colour of corrupted
patches (50 % of them: 80 % a learned [mask] embedding, 10 % another patch,
10 % kept), then writes the encoder as an original-format `.npz` that the
normal models load for fine-tuning.

    # The paper's set-up (ViT-B/16; Adam, base lr 2e-4, 10k warmup, cosine decay;
    # the paper ran 1M steps at batch 4096 on JFT and also tried ImageNet):
    python -m recipes.pretrain_mpp --config=paper --dataset=imagenet2012 --run_dir=runs/mpp_b16
    # Any folder of images (<folder>/<class>/<image>; labels are ignored):
    python -m recipes.pretrain_mpp --dataset=path/to/images --train_split=. --run_dir=runs/mpp_folder
    # The demo of docs/inspect.md (minutes on a CPU): a small custom ViT on
    # synthetic colour fields, whose position embeddings learn the 2-D grid:
    python -m recipes.pretrain_mpp --config=colour_fields --run_dir=runs/mpp_demo
    # Seconds: a tiny model on synthetic images; the encoder is then loaded
    # into a classifier and checked:
    python -m recipes.pretrain_mpp --smoke --run_dir=runs/mpp_smoke

The run directory holds `checkpoints/` (the same command resumes), `logs/`,
`history.csv`, `mpp.weights.h5` (the whole MPP model), `encoder.npz`
(fine-tune it like any checkpoint: `keras_vit.ViT("ViT-B_16",
weights="runs/mpp_b16/encoder.npz", num_classes=...)` or `python -m
recipes.finetune --weights=runs/mpp_b16/encoder.npz`), `backbone.keras` (for
recipes.inspect_vit) and `summary.json`. See docs/inspect.md.
"""

from recipes import cli
from recipes import train
from recipes.configs import SMOKE_MODEL
from recipes.configs import MppConfig
from recipes.configs import Named
from recipes.configs import Recipe

# `--smoke`: 24 updates of a tiny ViT on 6 batches of smooth colour fields at
# 16 x 24 px (a 2 x 3 grid of 8 x 8 patches).
SMOKE_INPUT_SHAPE = (16, 24, 3)
RECIPE = Recipe(
    "pretrain_mpp", "Masked patch prediction", MppConfig,
    # The paper gives no weight decay for MPP: 0.1 is its JFT pre-training value.
    base=dict(dataset=None, train_split="train", image_size=(224,), batch_size=4096, accum_steps=1,
              total_steps=1_000_000, learning_rate=2e-4, optimizer="adam", decay_type="cosine", weight_decay=0.1),
    smoke=dict(model=None, model_overrides=SMOKE_MODEL, dataset="synthetic", synthetic_batches=6,
               image_size=SMOKE_INPUT_SHAPE[:2], batch_size=16, total_steps=24, log_every=6, checkpoint_every=6,
               learning_rate=3e-3, warmup_steps=2),
    summary_keys=("steps", "final_loss", "images_per_second", "total_wall_time_s", "encoder_npz", "backbone_keras"),
    configs={
        "paper": Named(
            "ViT-B/16, Adam, base lr 2e-4, 10k warmup, cosine decay (the paper ran 1M steps at batch 4096 on JFT)",
            dict(dataset="imagenet2012", log_every=1000, checkpoint_every=1000),
            "79.9 % ImageNet accuracy after fine-tuning (paper Sec. 4.6, pre-trained on JFT: 4 % below "
            "supervised pre-training)", "--manual_dir=/data/imagenet"),
        "colour_fields": Named(
            "a small custom ViT on synthetic colour fields, whose position embeddings learn the 2-D grid",
            dict(model=None, model_overrides=dict(hidden_size=64, num_heads=4, mlp_dim=128, num_layers=4,
                                                  patch_size=8),
                 dataset="synthetic", image_size=(64,), batch_size=32, total_steps=1000, log_every=100,
                 checkpoint_every=100, learning_rate=1e-3, warmup_steps=100, weight_decay=0.0),
            "the loss falls from ln(512) = 6.24; recipes.inspect_vit's position-embedding similarity shows the "
            "grid (docs/inspect.md)", "--run_dir=runs/mpp_demo"),
    })


def run(config, config_name=None, smoke=False, callbacks=()):
    """Runs a parsed config; returns the summary (also `summary.json`)."""
    summary = train.run(RECIPE, config, config_name, smoke=smoke, callbacks=callbacks)
    if "encoder_npz" not in summary:  # options the original format lacks (said at the start)
        print(f"Fine-tune the encoder from {summary['backbone_keras']} (keras.saving.load_model).")
        return summary
    if smoke:
        check_encoder_loads(summary)
    print(f"Fine-tune the encoder with keras_vit.ViT(..., weights={summary['encoder_npz']!r}).")
    return summary


def check_encoder_loads(summary):
    """Smoke check: the encoder loads into a normal classifier, weights intact."""
    import keras
    import numpy as np

    import keras_vit

    backbone = keras.saving.load_model(summary["backbone_keras"])
    classifier = keras_vit.ViT(summary["config"]["model"], input_shape=backbone.input_shape[1:], num_classes=3,
                               weights=summary["encoder_npz"], **summary["config"]["model_overrides"])
    for name in ("embedding", "posembed_input", "encoderblock_0", "encoder_norm"):
        for mine, theirs in zip(classifier.get_layer(name).weights, backbone.get_layer(name).weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine), keras.ops.convert_to_numpy(theirs))
    print("smoke: the encoder loads into a classifier: OK")


parse, main = cli.entry_points(RECIPE, run, prog="python -m recipes.pretrain_mpp", description=__doc__.split("\n\n")[0])

if __name__ == "__main__":
    cli.run_command(main)
