"""Loader functions shared by the fault tests' fresh processes (importable by name, so every process
computes the same cache key for them).

Gates are files in ``$GATE_DIR``: a gated loader announces it runs (``claimed-<tag>``) and then waits
(bounded) until ``open-<tag>`` exists, so a test can hold a claim for as long as it needs.
"""
from __future__ import annotations

import os
import time

import torch

GATE_WAIT_S = 12.0


def expected(n: int) -> torch.Tensor:
    """What every loader here returns for ``n``: distinct per ``n``, the same in every process."""
    g = torch.Generator().manual_seed(n)
    return torch.randn(256, generator=g)


def build(n: int) -> torch.Tensor:
    return expected(n)


def _gate(name: str) -> str:
    return os.path.join(os.environ["GATE_DIR"], name)


def touch(name: str) -> None:
    with open(_gate(name), "w") as f:
        f.write(str(os.getpid()))


def wait_for(name: str, timeout: float = GATE_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not os.path.exists(_gate(name)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def gated(n: int, tag: str) -> torch.Tensor:
    """``expected(n)`` once the gate ``tag`` opens; raises instead when ``GATED_FAIL=1`` in this process."""
    touch(f"claimed-{tag}")
    wait_for(f"open-{tag}")
    if os.environ.get("GATED_FAIL") == "1":
        raise RuntimeError("the gated loader failed on purpose")
    return expected(n)


def forking(n: int, tag: str) -> torch.Tensor:
    """With ``FORK_WITH`` set (``os.fork`` or ``multiprocessing``), start a sleeping child and hang (the test
    SIGKILLs this process); otherwise a plain loader of ``expected(n)``."""
    how = os.environ.get("FORK_WITH")
    if not how:
        return expected(n)
    if how == "multiprocessing":
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,), daemon=False)
        child.start()
        pid = child.pid
    else:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
    with open(_gate(f"child-{tag}"), "w") as f:
        f.write(str(pid))
    touch(f"claimed-{tag}")
    time.sleep(60)
    raise AssertionError("the test should have killed this loader")
