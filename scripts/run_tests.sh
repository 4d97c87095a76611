#!/usr/bin/env bash
# The whole test suite, creating the environments it needs on first use.
# Each environment runs what only it can check:
#   py312   .venv-py312   Python 3.12, the newest versions (requirements/py312.txt,
#                         JAX 0.12): the library's and recipes' tests on jax and
#                         tensorflow;
#   main    .venv         Python 3.11, the newest versions for it
#                         (requirements/test.txt): every test on torch (PyTorch
#                         stays on 3.11), and on jax and tensorflow the tests
#                         that need its tools or versions (timm parity, the
#                         benchmarks, ONNX and JAX 0.10's export, the notebook:
#                         markers `timm`, `main_env`);
#   lowest  .venv-lowest  Python 3.11, the lowest versions keras_vit declares
#                         (requirements/lowest.txt), the library's tests.
# Tests marked `one_backend` (their subject does not depend on the Keras
# backend: flags, docs, tf.data pipelines, the catalogue, ...) run in one
# backend's run of each environment ($ONE_BACKEND, tensorflow by default).
# Runs go $JOBS at a time (default 3 on 2 cores): one run alone keeps about
# one core busy (imports, compilations, subprocesses).
#
#   bash scripts/run_tests.sh                 # everything (CI runs this)
#   BACKENDS=jax bash scripts/run_tests.sh    # one backend
#   ENVS="main" bash scripts/run_tests.sh     # some environments (main lowest py312)
#   JOBS=1 bash scripts/run_tests.sh          # one run at a time
#   bash scripts/run_tests.sh -k parity       # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 501 )); then
  echo "error: scripts/run_tests.sh needs bash 5.1 or newer (wait -n -p); this is $BASH_VERSION" >&2
  exit 1
fi
BACKENDS="${BACKENDS:-jax tensorflow torch}"
ENVS="${ENVS:-main lowest py312}"
JOBS="${JOBS:-3}"
# Backend-independent tests run under tensorflow: most of them are tf.data's.
ONE_BACKEND="${ONE_BACKEND:-tensorflow}"
# PyTorch stays on Python 3.11 (see requirements/py312.txt).
PY312_BACKENDS="jax tensorflow"
# What the declared floor can break: the library's numerics, Keras seams
# and data pipelines. The recipes, benchmarks, export, notebook and docs
# tests need the newest tools (TensorBoard, timm, scikit-learn, onnx).
# Full-size models (marker `large`) are left out there: their subject is
# size, and the tiny configs run the same code at the floor.
LOWEST_TESTS="tests/models/test_models.py tests/models/test_vit_model.py tests/test_anatomy.py tests/layers/test_layers.py tests/weights/test_weights.py tests/weights/test_flax_reference.py
  tests/models/test_hybrid.py tests/data/test_data.py tests/data/test_vtab_tasks.py tests/test_big_models.py
  tests/training/test_training.py tests/test_distribute.py tests/training/test_fault_tolerance.py tests/training/test_progress.py tests/test_features.py tests/test_dynamic_size.py"
# Python 3.12: the library's and the recipes' tests (not the benchmarks',
# which compare with timm, nor the notebook's, which needs Jupyter).
PY312_TESTS="tests --ignore=tests/benchmarks --ignore=tests/test_notebook.py"
# Main's jax and tensorflow runs: what Python 3.12's cannot check. Its
# tensorflow, keras and tfds are Python 3.12's; Python 3.11 itself is
# checked by the torch and lowest runs.
MAIN_MARKERS="timm or main_env"
source scripts/venv.sh

has() { [[ " $1 " == *" $2 "* ]]; }

created=$(date +%s)
if has "$ENVS" main; then
  ensure_venv
  # Quiet unless it fails (setuptools warns at length about editable installs).
  if ! out="$("$VENV/bin/python" -m pip install -q --no-deps -e . 2>&1)"; then echo "$out"; exit 1; fi
fi
if has "$ENVS" lowest; then
  ensure_venv .venv-lowest requirements/lowest.txt
fi
if has "$ENVS" py312; then
  # Fails loudly, saying how to get Python 3.12, rather than skipping the run.
  python312="$(find_python312)"
  ensure_venv .venv-py312 requirements/py312.txt "$python312"
fi
created=$(( $(date +%s) - created ))

export TF_CPP_MIN_LOG_LEVEL=2 PYTHONHASHSEED=0
# The tests run tiny models, where XLA's compile time dominates: skipping
# LLVM's optimisation passes makes the JAX run ~3x faster (numerics are
# unaffected; the parity tests hold). Benchmarks never set this.
# One thread per op: tiny models gain nothing from two, and $JOBS runs
# share the cores (three runs of two test files took 62 s instead of 70).
export XLA_FLAGS="${XLA_FLAGS:---xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false}"
# JAX also skips most of XLA's HLO passes (what `--smoke` runs do): the
# JAX-heavy test files compile ~8 % faster, and every tolerance holds.
export JAX_DISABLE_MOST_OPTIMIZATIONS="${JAX_DISABLE_MOST_OPTIMIZATIONS:-1}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TF_NUM_INTRAOP_THREADS="${TF_NUM_INTRAOP_THREADS:-1}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
# The checkout is imported from source by every run and by the processes the
# tests start: with bytecode caching off (some sandboxes set this), each one
# compiles keras_vit, recipes and the test modules again (the recipes' tests:
# 80.9 s of CPU against 79.4 s with a fresh cache, 76.2 s with a warm one).
unset PYTHONDONTWRITEBYTECODE
if ! has "$BACKENDS" "$ONE_BACKEND"; then ONE_BACKEND="${BACKENDS%% *}"; fi

# The runs: "name|venv|backend|marker expression|tests".
runs=()
add_run() {  # add_run ENV VENV BACKEND MARKERS TESTS...
  local env="$1" venv="$2" backend="$3" markers="$4"; shift 4
  if [ "$backend" != "$ONE_BACKEND" ]; then markers="${markers:+($markers) and }not one_backend"; fi
  runs+=("$env-$backend|$venv|$backend|${markers:-}|$*")
}
# Longest first (on 2 cores: py312's take 7-9 minutes each, the others
# 1.5-5), so that no long run starts last: main's torch run (4-5 minutes)
# takes the first free slot. Started after lowest-jax it ran alone for the
# last minute, one core idle (763 s against 691 s; docs/testing.md); started
# beside both py312 runs it measured 840 s.
for run in py312-jax py312-tensorflow lowest-tensorflow main-torch lowest-jax main-jax main-tensorflow lowest-torch; do
  env="${run%%-*}" backend="${run#*-}"
  if ! has "$ENVS" "$env" || ! has "$BACKENDS" "$backend"; then continue; fi
  # shellcheck disable=SC2086
  case "$env" in
    main) add_run main "$VENV" "$backend" "$([ "$backend" = torch ] || echo "$MAIN_MARKERS")" tests ;;
    py312) if has "$PY312_BACKENDS" "$backend"; then add_run py312 .venv-py312 "$backend" "not timm" $PY312_TESTS; fi ;;
    lowest) add_run lowest .venv-lowest "$backend" "not timm and not large" $LOWEST_TESTS ;;
  esac
done

logs="$(mktemp -d)"
# Each run's temporary files (pytest's, its subprocesses', and what
# libraries leave behind: tensorflow-datasets leaves an empty `tmp*tfds`
# directory per builder it looks up) go under one directory, removed at exit.
scratch="$(mktemp -d)"
trap 'rm -rf "$logs" "$scratch"' EXIT
run_one() {  # run_one "name|venv|backend|markers|tests" [pytest args...]
  local name venv backend markers tests
  IFS='|' read -r name venv backend markers tests <<< "$1"; shift
  # The checkout itself is imported (PYTHONPATH), not installed, so that
  # the lowest and py312 environments hold nothing but their pins. Each run
  # shares JAX compilations with its own subprocesses; JAX's and
  # torch.compile's (inductor's C++ kernels) are kept in the environment
  # for the next run of the suite (the temporary directory is removed).
  # shellcheck disable=SC2086
  mkdir -p "$scratch/$name"
  TMPDIR="$scratch/$name" KERAS_BACKEND="$backend" PYTHONPATH="$PWD" JAX_COMPILATION_CACHE_DIR="$PWD/$venv/jax_cache" \
    TORCHINDUCTOR_CACHE_DIR="$PWD/$venv/inductor_cache" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --large --durations=10 \
    ${markers:+-m "$markers"} $tests "$@"
}

declare -A pid_of_run=() started=()
failed=()
summary=()
finish() {  # finish PID STATUS: prints the run's output and records it
  local pid="$1" status="$2" name
  name="${pid_of_run[$pid]}"
  unset "pid_of_run[$pid]"
  local seconds=$(( $(date +%s) - started[$name] ))
  echo "== $name (${seconds} s, exit $status)"
  cat "$logs/$name.log"
  summary+=("$(printf '%-18s %5d s  %s' "$name" "$seconds" "$(grep -E '(passed|failed|error|skipped|deselected).* in [0-9.]+s' "$logs/$name.log" | tail -1 | tr -d '=')")")
  if [ "$status" != 0 ]; then failed+=("$name"); fi
}
tests_started=$(date +%s)
for run in "${runs[@]}"; do
  while [ "${#pid_of_run[@]}" -ge "$JOBS" ]; do
    status=0; wait -n -p done_pid "${!pid_of_run[@]}" || status=$?
    finish "$done_pid" "$status"
  done
  name="${run%%|*}"
  run_one "$run" "$@" > "$logs/$name.log" 2>&1 &
  pid_of_run[$!]="$name"
  started[$name]=$(date +%s)
done
while [ "${#pid_of_run[@]}" -gt 0 ]; do
  status=0; wait -n -p done_pid "${!pid_of_run[@]}" || status=$?
  finish "$done_pid" "$status"
done

echo "== Summary: environments ${created} s, tests $(( $(date +%s) - tests_started )) s ($JOBS runs at a time)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
