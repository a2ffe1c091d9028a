"""A process forked by the loader (a multiprocessing fork, a prefetch worker) does
not share the loader's connection, so when the loader dies its claim dies with it even though the child
lives on, and another process's load of the same key is not blocked.
"""
from __future__ import annotations

import os
import signal

import pytest

from _support import fault_procs

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

LOADER = """
import overmind
from _support import fault_loaders as L
overmind.load(L.forking, 7, "f7")   # forks a sleeping child, then hangs until killed
"""

OTHER = """
import time, warnings, torch, overmind
from _support import fault_loaders as L
from overmind.fallback import OvermindWarning
from overmind.testing import report
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    obj = overmind.load(L.forking, 7, "f7")
report({"right": bool(torch.equal(obj, L.expected(7))), "took": time.monotonic() - t0,
        "warned": [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]})
"""


@pytest.mark.parametrize("fork_with", ["os.fork", "multiprocessing"])
def test_loaders_forked_child_does_not_keep_its_claim(overmind_runtime, tmp_path, fork_with):
    loader = fault_procs.start(LOADER, {"GATE_DIR": str(tmp_path), "FORK_WITH": fork_with})
    child = None
    try:
        assert fault_procs.wait_file(str(tmp_path / "claimed-f7")), fault_procs.finish(loader, 1)
        child = int((tmp_path / "child-f7").read_text())
        os.kill(loader.pid, signal.SIGKILL)
        loader.wait(10)
        os.kill(child, 0)  # the child still runs, holding whatever it inherited
        other = fault_procs.run(OTHER, {"GATE_DIR": str(tmp_path), "OVERMIND_WAIT_TIMEOUT": "4"})
    finally:
        if child:  # first: it holds the loader's output pipes open
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if loader.poll() is None:
            loader.kill()
        fault_procs.finish(loader, 5)
    assert other.get("warned") == [] and other["right"], other
    assert other["took"] < 3.5, other
