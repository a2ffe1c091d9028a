"""Results equal plain in the small things: ``.grad`` survives (zero-copy); a result holding an
open file, socket, thread, lock and the like is not cached and its file is never touched; a graph too deep for
the pickler falls back instead of crashing, in the main thread and in a thread with a small stack."""
from __future__ import annotations

import mmap
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import warnings

import pytest
import torch

import overmind
from overmind.client.connection import get_client
from overmind.fallback import OvermindWarning
from overmind.testing import run_fresh

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

NOT_STRICT = {"OVERMIND_STRICT": "0"}  # these loads fall back on purpose: a warning, not an error

GRADS = '''
import torch, overmind
from overmind.testing import report, overmind_mapped


class Tagged(torch.Tensor):
    pass


def trained():
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        m(torch.randn(5, 4)).pow(2).sum().backward()
        leaf = torch.randn(6, requires_grad=True)
        (leaf * 3).sum().backward()
        half = torch.nn.Parameter(torch.randn(2, 2).half())
        half.grad = torch.full((2, 2), 0.5, dtype=torch.float16)
        tagged = torch.randn(3).as_subclass(Tagged).requires_grad_()  # takes torch's own reduce
        tagged.grad = torch.ones(3)
        return {"m": m, "leaf": leaf, "half": half, "tagged": tagged, "none": torch.nn.Parameter(torch.ones(2))}


def describe(t):
    g = t.grad
    return {"type": type(t).__name__, "dtype": str(t.dtype), "requires_grad": t.requires_grad,
            "grad": None if g is None else g.tolist(), "grad_dtype": None if g is None else str(g.dtype),
            "grad_mapped": None if g is None else overmind_mapped(g.data_ptr())}


out = overmind.load(trained)
tensors = {"weight": out["m"].weight, "bias": out["m"].bias, "leaf": out["leaf"], "half": out["half"],
           "tagged": out["tagged"], "none": out["none"]}
plain = trained()
expected = {"weight": plain["m"].weight, "bias": plain["m"].bias, "leaf": plain["leaf"], "half": plain["half"],
            "tagged": plain["tagged"], "none": plain["none"]}
report({"got": {k: describe(t) for k, t in tensors.items()}, "plain": {k: describe(t) for k, t in expected.items()}})
'''


def test_grad_requires_grad_class_and_dtype_survive_in_two_fresh_processes(overmind_runtime):
    for _ in range(2):  # publish, then a hit
        got = run_fresh(GRADS, env={"OVERMIND_STRICT": "1"})
        for name, plain in got["plain"].items():
            mine = got["got"][name]
            assert {k: v for k, v in mine.items() if k != "grad_mapped"} == \
                   {k: v for k, v in plain.items() if k != "grad_mapped"}, name
            if plain["grad"] is not None:
                assert mine["grad_mapped"], f"{name}.grad is not mapped from the entry"
    assert got["got"]["weight"]["grad"] is not None and got["got"]["none"]["grad"] is None


# --- results holding live system resources ----------------------------------------------------------

OPEN_FILE = '''
import os, warnings, overmind, torch
from overmind.client.connection import get_client
from overmind.fallback import OvermindWarning
from overmind.testing import report


def with_log():
    # The path is not an argument: a changed argument file would (rightly) leave the call uncached anyway.
    log = open(os.environ["TRAIN_LOG"], "w")
    log.write("header\\n")
    log.flush()
    model = torch.nn.utils.skip_init(torch.nn.Linear, 2, 2)  # no draw: a loader that draws is not cached
    torch.nn.init.ones_(model.weight)
    torch.nn.init.zeros_(model.bias)
    return {"model": model, "log": log}


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = overmind.load(with_log)
after_load = open(os.environ["TRAIN_LOG"]).read()
out["log"].write("more\\n")
out["log"].flush()
report({"after_load": after_load, "after_write": open(os.environ["TRAIN_LOG"]).read(),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)],
        "entries": len(get_client().ls())})
'''


def test_a_result_holding_a_file_open_for_writing_is_not_cached_and_the_file_untouched(overmind_runtime, tmp_path):
    path = str(tmp_path / "train.log")
    for _ in range(2):
        got = run_fresh(OPEN_FILE, env={**NOT_STRICT, "TRAIN_LOG": path})
        assert got["after_load"] == "header\n", "loading truncated or rewrote the file"
        assert got["after_write"] == "header\nmore\n", "the result's file is not the plain call's open file"
        [warning] = got["warnings"]
        assert "_io.TextIOWrapper" in warning and "result['log']" in warning and "not cached" in warning
        assert got["entries"] == 0


def _popen():
    return subprocess.Popen([sys.executable, "-c", "pass"])


RESOURCES = {
    "binary file": lambda: tempfile.TemporaryFile(),
    "socket": lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM),
    "lock": threading.Lock,
    "rlock": threading.RLock,
    "condition": threading.Condition,
    "event": threading.Event,
    "thread": lambda: threading.Thread(target=print),
    "selector": selectors.DefaultSelector,
    "mmap": lambda: mmap.mmap(-1, 4096),
    "subprocess": _popen,
}


class Holder:
    def __init__(self, thing):
        self.model = torch.nn.Linear(2, 2, device="meta").to_empty(device="cpu")  # no draw
        torch.nn.init.ones_(self.model.weight)
        torch.nn.init.zeros_(self.model.bias)
        self.state = {"inner": [thing]}


def holding(kind: str):
    return Holder(RESOURCES[kind]())


@pytest.mark.parametrize("kind", sorted(RESOURCES))
def test_results_holding_system_resources_are_not_cached(overmind_runtime, monkeypatch, kind):
    monkeypatch.delenv("OVERMIND_STRICT", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = overmind.load(holding, kind)
    thing = out.state["inner"][0]
    try:
        messages = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
        assert len(messages) == 1, messages
        assert "not cached" in messages[0] and "result.state['inner'][0]" in messages[0], messages[0]
        assert type(thing).__qualname__ in messages[0]
        assert get_client().ls() == []
    finally:
        if isinstance(thing, subprocess.Popen):
            thing.wait()
        elif hasattr(thing, "close"):
            thing.close()


# --- graphs deeper than the pickler can go -------------------------------------------------------------

DEEP = '''
import sys, threading, warnings, overmind
from overmind.fallback import OvermindWarning
from overmind.testing import report


class Node:
    def __init__(self, nxt):
        self.next = nxt


def chain(n):
    head = None
    for _ in range(n):
        head = Node(head)
    return head


def length(node):
    n = 0
    while node is not None:
        node, n = node.next, n + 1
    return n


sys.setrecursionlimit(100_000)


def run(box):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = overmind.load(chain, %(depth)d)
    box.update(length=length(out), limit=sys.getrecursionlimit(),
               warnings=[str(w.message) for w in caught if issubclass(w.category, OvermindWarning)])


box = {}
if %(thread_stack)d:
    threading.stack_size(%(thread_stack)d)
    t = threading.Thread(target=run, args=(box,))
    t.start()
    t.join()
else:
    run(box)
report(box)
'''


@pytest.mark.parametrize("thread_stack", [0, 256 << 10], ids=["main-thread", "thread-256KiB-stack"])
def test_a_graph_too_deep_to_pickle_falls_back_without_crashing(overmind_runtime, thread_stack):
    got = run_fresh(DEEP % {"depth": 50_000, "thread_stack": thread_stack}, env=NOT_STRICT, check=False)
    assert got.get("returncode", 0) != -signal.SIGSEGV, "the pickler overflowed the C stack (SIGSEGV)"
    assert "length" in got, got
    assert got["length"] == 50_000 and got["limit"] == 100_000
    [warning] = got["warnings"]
    assert "too deep" in warning and "recursion limit" in warning, warning


def test_a_deep_graph_within_the_raised_limit_is_cached_even_on_a_small_thread_stack(overmind_runtime):
    hits = []
    for _ in range(2):  # publish, then a hit
        got = run_fresh(DEEP % {"depth": 5_000, "thread_stack": 256 << 10}, env=NOT_STRICT, check=False)
        assert got.get("returncode", 0) != -signal.SIGSEGV, "the pickler overflowed the C stack (SIGSEGV)"
        assert got == {"length": 5_000, "limit": 100_000, "warnings": []}
        [entry] = get_client().ls()
        hits.append(entry["hits"])
    assert hits[1] == hits[0] + 1, "the second process was not served from the cache"
