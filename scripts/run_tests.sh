#!/usr/bin/env bash
# Runs the whole test suite under each Keras backend (jax, tensorflow, torch),
# creating the virtual environment on first use.
#
#   bash scripts/run_tests.sh               # every backend
#   BACKENDS=jax bash scripts/run_tests.sh  # one backend
#   bash scripts/run_tests.sh -k parity     # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
BACKENDS="${BACKENDS:-jax tensorflow torch}"
source scripts/venv.sh
ensure_venv
"$VENV/bin/python" -m pip install -q --no-deps -e .

export TF_CPP_MIN_LOG_LEVEL=2 PYTHONHASHSEED=0
# The tests run tiny models, where XLA's compile time dominates: skipping
# LLVM's optimisation passes makes the JAX run ~3x faster (numerics are
# unaffected; the parity tests hold). Benchmarks never set this.
export XLA_FLAGS="${XLA_FLAGS:---xla_backend_optimization_level=0}"
# Share JAX compilations between the pytest process and its subprocesses.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$PWD/$VENV/jax_cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
status=0
for backend in $BACKENDS; do
  echo "== KERAS_BACKEND=$backend"
  KERAS_BACKEND="$backend" "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" || status=1
done
exit $status
