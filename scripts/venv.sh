# Sourced by scripts that need the project's environment: creates `.venv`
# (or $KERAS_VIT_VENV) from requirements/test.txt on first use, exactly as
# scripts/run_tests.sh does, and recreates it when the requirements change.
# Sets VENV.
VENV="${KERAS_VIT_VENV:-.venv}"

ensure_venv() {
  local stamp="$VENV/.keras_vit_requirements"
  if [ ! -x "$VENV/bin/python" ] || ! cmp -s requirements/test.txt "$stamp"; then
    echo "== Creating the environment in $VENV (first run: a few minutes)"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -r requirements/test.txt
    # torch's CUDA build brings triton (GPU kernels only); importing it after
    # TensorFlow segfaults, and nothing here runs on a GPU.
    "$VENV/bin/python" -m pip uninstall -q -y triton
    cp requirements/test.txt "$stamp"
  fi
}
