# Sourced by scripts that need the project's environment: creates `.venv`
# (or $KERAS_VIT_VENV) from requirements/test.txt on first use, exactly as
# scripts/run_tests.sh does, and recreates it when the requirements change.
# Sets VENV.
VENV="${KERAS_VIT_VENV:-.venv}"

# ensure_venv [DIR REQUIREMENTS PYTHON]: the environment in DIR (default
# $VENV) with REQUIREMENTS (default requirements/test.txt) installed by the
# interpreter PYTHON (default python3), rebuilt when that file changes.
ensure_venv() {
  local venv="${1:-$VENV}" requirements="${2:-requirements/test.txt}" python="${3:-python3}"
  local stamp="$venv/.keras_vit_requirements"
  if [ ! -x "$venv/bin/python" ] || ! cmp -s "$requirements" "$stamp"; then
    echo "== Creating the environment in $venv from $requirements (first run: a few minutes)"
    # Rebuilt from scratch only when it is one of ours (it has the stamp), so
    # that a changed pin is a clean install; a foreign environment is kept.
    if [ -f "$stamp" ]; then rm -rf "$venv"; fi
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -r "$requirements"
    # torch's CUDA build brings triton (GPU kernels only); importing it after
    # TensorFlow segfaults, and nothing here runs on a GPU.
    if "$venv/bin/python" -m pip show -q triton 2>/dev/null; then
      "$venv/bin/python" -m pip uninstall -q -y triton
    fi
    cp "$requirements" "$stamp"
  fi
}

# find_python312: prints the path of a Python 3.12 interpreter
# ($KERAS_VIT_PYTHON312, `python3.12` on PATH, or pyenv's newest 3.12.x);
# fails, saying how to get one, when there is none.
find_python312() {
  local candidate
  for candidate in "${KERAS_VIT_PYTHON312:-}" "$(command -v python3.12 || true)"; do
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  if command -v pyenv >/dev/null; then
    candidate="$(pyenv root)/versions/$(pyenv versions --bare | grep -E '^3\.12\.[0-9]+$' | sort -V | tail -1)/bin/python"
    if [ -x "$candidate" ]; then
      echo "$candidate"
      return 0
    fi
  fi
  echo "error: the Python 3.12 run needs a Python 3.12 interpreter, and none was found" \
    "(KERAS_VIT_PYTHON312, python3.12 on PATH, pyenv). Install one (\`pyenv install 3.12\`," \
    "or your system's python3.12 and python3.12-venv packages) and/or set KERAS_VIT_PYTHON312" \
    "to its path; ENVS=\"main lowest\" skips that run." >&2
  return 1
}
