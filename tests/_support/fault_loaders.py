"""Loader functions shared by the fault tests' fresh processes (importable by name, so every process
computes the same cache key for them).

Gates are files in ``$GATE_DIR``: a gated loader announces it runs (``claimed-<tag>``) and then waits
(bounded) until ``open-<tag>`` exists, so a test can hold a claim for as long as it needs.
"""
from __future__ import annotations

import os
import time

import torch

GATE_WAIT_S = 40.0  # a bound for a test gone wrong, never reached by one going right: a victim process may take
# over 12 s to start (import torch) on a slow host under two test workers, and must still find the claim held


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


def bundle(n: int) -> dict:
    """A small object with several storages, a module and plain values (``same_bundle`` compares two): enough
    work on a miss and a hit for an interrupt to land in any step of either."""
    layer = torch.nn.utils.skip_init(torch.nn.Linear, 16, 8)  # no draw: a drawing loader is not cached
    with torch.no_grad():
        layer.weight.copy_(expected(n)[:128].reshape(8, 16))
        layer.bias.copy_(expected(n + 1)[:8])
    return {"t": expected(n), "pair": [expected(n + 2), expected(n + 3).half()], "layer": layer, "name": f"bundle-{n}"}


def same_bundle(a: dict, b: dict) -> bool:
    return (type(a) is type(b) is dict and a["name"] == b["name"] and type(a["layer"]) is type(b["layer"])
            and all(torch.equal(x, y) and x.dtype == y.dtype
                    for x, y in [(a["t"], b["t"]), *zip(a["pair"], b["pair"]),
                                 (a["layer"].weight, b["layer"].weight), (a["layer"].bias, b["layer"].bias)]))


class Counted:
    """A tensor holder that writes a line to the file ``$PICKLED_LOG`` each time it is pickled (was it ever?)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce_ex__(self, protocol):
        with open(os.environ["PICKLED_LOG"], "a") as f:
            f.write("pickled\n")
        return (Counted, (self.tensor,))


def reduce_counted_tensor(nbytes: int) -> Counted:
    """``nbytes`` of float32 ones in a :class:`Counted` (the refused-publish tests)."""
    return Counted(torch.ones(nbytes // 4))
