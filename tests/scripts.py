"""Run a Python snippet in a fresh interpreter (the project importable), with a timeout."""
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


def start(script, env=None):
    """Popen of ``script`` (dedented) with ``env`` added to this process's environment."""
    code = f"import sys; sys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(script)
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(script, env=None, timeout=120):
    """Run ``script`` to completion; returns its stdout; AssertionError with its output if it failed
    or did not finish within ``timeout`` seconds (then it is killed)."""
    proc = start(script, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"did not finish in {timeout} s (hung?)\n{out}\n{err}") from None
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{out}\n{err}"
    return out
