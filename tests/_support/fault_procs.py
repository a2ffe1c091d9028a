"""Background fresh processes for the fault tests: start a script (spawned, never forked), read its report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

from overmind.testing import RESULT_MARK

from . import pythonpath_env


def start(script: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """Start ``script`` in a fresh interpreter with ``_support`` importable; stdout/stderr piped."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False, dir="/tmp") as f:
        f.write(textwrap.dedent(script))
    os.chmod(f.name, 0o644)
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = pythonpath_env(full)
    proc = subprocess.Popen([sys.executable, f.name], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)
    proc.script_path = f.name  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen, timeout: float = 60) -> dict:
    """Wait for ``proc`` (killing it past ``timeout``) and return its report, or its exit and stderr."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    finally:
        os.unlink(proc.script_path)  # type: ignore[attr-defined]
    reports = [line[len(RESULT_MARK):] for line in out.splitlines() if line.startswith(RESULT_MARK)]
    if reports:
        return json.loads(reports[-1])
    return {"returncode": proc.returncode, "stderr": err[-4000:], "stdout": out[-2000:]}


def run(script: str, env: dict[str, str] | None = None, timeout: float = 60) -> dict:
    """``start`` then ``finish``."""
    return finish(start(script, env), timeout)


def wait_file(path: str, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
