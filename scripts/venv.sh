# Sourced by scripts that need the project's environment: creates `.venv`
# (or $KERAS_VIT_VENV) from requirements/test.txt on first use, exactly as
# scripts/run_tests.sh does, and recreates it when the requirements change.
# Sets VENV.
VENV="${KERAS_VIT_VENV:-.venv}"

# ensure_venv [DIR REQUIREMENTS]: the environment in DIR (default $VENV) with
# REQUIREMENTS (default requirements/test.txt) installed, rebuilt when that
# file changes.
ensure_venv() {
  local venv="${1:-$VENV}" requirements="${2:-requirements/test.txt}"
  local stamp="$venv/.keras_vit_requirements"
  if [ ! -x "$venv/bin/python" ] || ! cmp -s "$requirements" "$stamp"; then
    echo "== Creating the environment in $venv from $requirements (first run: a few minutes)"
    # Rebuilt from scratch only when it is one of ours (it has the stamp), so
    # that a changed pin is a clean install; a foreign environment is kept.
    if [ -f "$stamp" ]; then rm -rf "$venv"; fi
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -r "$requirements"
    # torch's CUDA build brings triton (GPU kernels only); importing it after
    # TensorFlow segfaults, and nothing here runs on a GPU.
    "$venv/bin/python" -m pip uninstall -q -y triton
    cp "$requirements" "$stamp"
  fi
}
