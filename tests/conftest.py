"""Shared test helpers. Scripts run in-process (runpy) rather than in a subprocess: importing torch
costs seconds per process on a 2-core machine, and in-process runs can be patched (e.g. to simulate a kill)."""
import contextlib
import io
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_script(name, *args):
    """Run `python name args...` in this process -> Result(returncode, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv, code = sys.argv, 0
    sys.argv = [name, *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(ROOT / name), run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, str):
            err.write(e.code + "\n")
            code = 1
        else:
            code = e.code or 0
    finally:
        sys.argv = argv
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def script():
    return run_script
