#!/usr/bin/env bash
# Runs the whole test suite under each Keras backend (jax, tensorflow, torch),
# creating the virtual environment on first use; then the library's tests
# again in a second environment with the lowest versions keras_vit declares
# (requirements/lowest.txt, in .venv-lowest).
#
#   bash scripts/run_tests.sh               # every backend, both environments
#   BACKENDS=jax bash scripts/run_tests.sh  # one backend
#   LOWEST=0 bash scripts/run_tests.sh      # skip the lowest-versions run
#   bash scripts/run_tests.sh -k parity     # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
BACKENDS="${BACKENDS:-jax tensorflow torch}"
LOWEST="${LOWEST:-1}"
LOWEST_VENV="${KERAS_VIT_LOWEST_VENV:-.venv-lowest}"
# The library's own tests; the recipes, benchmarks and docs tests need the
# newest tools (TensorBoard, timm, scikit-learn) and run in the main environment.
LOWEST_TESTS="tests/models/test_models.py tests/test_anatomy.py tests/layers/test_layers.py tests/weights/test_weights.py
  tests/models/test_hybrid.py tests/data/test_data.py tests/data/test_vtab_tasks.py
  tests/training/test_training.py tests/test_distribute.py tests/training/test_fault_tolerance.py"
source scripts/venv.sh
ensure_venv
"$VENV/bin/python" -m pip install -q --no-deps -e .
if [ "$LOWEST" = 1 ]; then
  ensure_venv "$LOWEST_VENV" requirements/lowest.txt
fi

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
  KERAS_BACKEND="$backend" "$VENV/bin/python" -m pytest -q -p no:cacheprovider --large --durations=10 "$@" || status=1
done
if [ "$LOWEST" = 1 ]; then
  # The checkout itself is imported (PYTHONPATH), not installed, so this
  # environment holds nothing but the pinned floor.
  for backend in $BACKENDS; do
    echo "== lowest versions (requirements/lowest.txt), KERAS_BACKEND=$backend"
    # shellcheck disable=SC2086
    KERAS_BACKEND="$backend" PYTHONPATH="$PWD" JAX_COMPILATION_CACHE_DIR="$PWD/$LOWEST_VENV/jax_cache" \
      "$LOWEST_VENV/bin/python" -m pytest -q -p no:cacheprovider --large -m "not timm" $LOWEST_TESTS "$@" || status=1
  done
fi
exit $status
