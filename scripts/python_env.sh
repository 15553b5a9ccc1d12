# Sourced by run.sh and test.sh: choose the Python and install a requirements file into it, pinned by
# constraints.txt. PYTHON=/path/to/python: that interpreter, as it is. Inside an active virtual or conda
# environment: its python. Otherwise a virtual environment in .venv (made on the first run, reused after), so
# that a system Python that refuses pip installs (PEP 668: Debian, Ubuntu) is never written to.
python_env() {  # python_env REQUIREMENTS_FILE WHO
  local req=$1 who=$2
  if [ -n "${PYTHON:-}" ]; then
    :
  elif [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then
    PYTHON=python
  elif [ -x .venv/bin/python ]; then
    PYTHON=.venv/bin/python
    echo "$who: using the virtual environment in .venv"
  else
    local base
    base=$(command -v python3 || true)
    if [ -z "$base" ]; then
      echo "$who: no python3 on PATH; install Python 3.10 or newer, or set PYTHON=/path/to/python" >&2; exit 1
    fi
    if ! "$base" -m venv .venv >/dev/null 2>&1; then
      rm -rf .venv
      echo "$who: '$base -m venv' failed: install the venv module (Debian/Ubuntu: sudo apt install python3-venv)," \
           "or set PYTHON=/path/to/python to install into that interpreter" >&2; exit 1
    fi
    PYTHON=.venv/bin/python
    echo "$who: made a virtual environment in .venv (to use it by hand: source .venv/bin/activate)"
  fi
  "$PYTHON" -m pip install -q --disable-pip-version-check -r "$req" -c constraints.txt
}
