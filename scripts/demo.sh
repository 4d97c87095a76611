#!/usr/bin/env bash
# The first command to run: the offline demo. On scikit-learn's handwritten
# digits it pre-trains a small ViT at 16 px, fine-tunes it at 32 px through
# recipes/finetune.py (position embeddings resampled, new zero head) and
# prints the test accuracy; a few minutes on 2 CPU cores, no network needed
# once the environment exists (created on first use, the same .venv as
# scripts/run_tests.sh).
#
#   bash scripts/demo.sh                          # KERAS_BACKEND defaults to tensorflow
#   KERAS_BACKEND=jax bash scripts/demo.sh        # or torch (slower on CPU)
#   bash scripts/demo.sh --finetune_steps=100     # arguments go to recipes/demo.py
#   bash scripts/demo.sh --smoke                  # about a minute: a tiny ViT, 4 + 4 updates
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export KERAS_BACKEND="${KERAS_BACKEND:-tensorflow}"
exec "$VENV/bin/python" -m recipes.demo "$@"
