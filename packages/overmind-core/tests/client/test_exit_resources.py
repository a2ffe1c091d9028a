"""A process that loads through Overmind ends as plain ends: under ``python -X dev`` or ``-W default`` (which show
``ResourceWarning``), and inside ``warnings.catch_warnings(record=True)`` with ``simplefilter("always")``, it prints
nothing plain does not print, at garbage collection or at exit. Its connections to the server are closed before the
interpreter tears down (``client/connection.py``), in a forked child as in its parent, and no memfd, mapping or file
of an entry is left for the collector to warn about.

Each script runs plain, then with Overmind (the miss, then a hit), each in a fresh interpreter.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from overmind.client.connection import Client

SCRIPT = textwrap.dedent('''
    import gc, os, sys, warnings
    import numpy, torch
    import overmind
    ON = os.environ["OVERMIND_ON"] == "1"
    torch.set_num_threads(1)  # no OpenMP pool: the forked child of a process that ran one can hang in it


    def build(rows):
        # the large tensor is made in the load arena's memfd (1 MiB or more), the rest is pickled
        return {"big": torch.ones(rows, 1024), "small": torch.arange(5), "array": numpy.arange(4.0)}


    def load():
        obj = overmind.load(build, 512) if ON else build(512)
        return [float(obj["big"].sum()), obj["small"].tolist(), obj["array"].tolist()]


    if os.environ.get("RECORD") == "1":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            values = load()
            warnings.warn("the user's own")  # the filters "always" shows by are the ones the interpreter's end sees
            gc.collect()
        print(values, sorted({(w.category.__name__, str(w.message)) for w in caught}))
    else:
        values = load()
        sys.stdout.flush()
        child = os.fork()
        if child == 0:  # a forked child loads too, and ends as a Python program does
            print("child", load())
            sys.exit(0)
        os.waitpid(child, 0)
        gc.collect()
        print(values)
''')

MODES = {"-X dev": (["-X", "dev"], {}), "-W default": (["-W", "default"], {}),
         "catch_warnings(record=True)": ([], {"RECORD": "1"})}


def _run(path: str, flags: list[str], env: dict[str, str]) -> tuple[str, str]:
    proc = subprocess.run([sys.executable, *flags, path], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout, proc.stderr


def _hits() -> tuple[int, int]:
    client = Client(autostart=False, control=True)
    try:
        entries = client.ls()
    finally:
        client.close()
    return len(entries), sum(e["hits"] for e in entries)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_process_that_loads_prints_nothing_plain_does_not(overmind_runtime, tmp_path, mode):
    flags, env = MODES[mode]
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT)
    env = {**env, "OVERMIND_STRICT": "1"}
    plain = _run(str(path), flags, {**env, "OVERMIND_ON": "0"})
    miss = _run(str(path), flags, {**env, "OVERMIND_ON": "1"})
    assert _hits() == (1, 0 if env.get("RECORD") else 1)  # published (a forked child's load is a hit on it)
    hit = _run(str(path), flags, {**env, "OVERMIND_ON": "1"})
    assert _hits()[1] > (0 if env.get("RECORD") else 1), "the second process did not hit"
    assert miss == plain
    assert hit == plain
