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
  pip_once -r "$req"
}
pip_once() {  # pip_once ARGS...: pip install ARGS -c constraints.txt into $PYTHON, skipped where that environment has
  # done the same install before (a stamp in its prefix, named by a checksum of the arguments, requirements*.txt and
  # constraints.txt; delete the environment's .pip-once-* files to check again). Only in a virtual or conda
  # environment: pip runs every time for any other Python.
  local prefix sum
  prefix=$("$PYTHON" -c 'import sys; print(sys.prefix)' 2>/dev/null || true)
  sum=$( (echo "$*"; cat requirements*.txt constraints.txt 2>/dev/null || true) | cksum | cut -d' ' -f1)
  if [ -n "$prefix" ] && [ -e "$prefix/.pip-once-$sum" ]; then return 0; fi
  "$PYTHON" -m pip install -q --disable-pip-version-check "$@" -c constraints.txt
  if [ -e "$prefix/pyvenv.cfg" ] || [ -d "$prefix/conda-meta" ]; then touch "$prefix/.pip-once-$sum"; fi
}
