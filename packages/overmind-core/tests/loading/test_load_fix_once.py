"""A load that cannot be cached warns once, and its fix is said once (a budget or pickling failure seen by nested
loads too)."""
from __future__ import annotations

import warnings

import pytest
import torch

import overmind
from overmind import fallback
from overmind.entries import pickling
from overmind.errors import ServerError
from overmind.fallback import OvermindWarning
from overmind.testing import isolated_runtime

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin


def _warnings_of(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        overmind.load(fn, *args)
    return [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]


def build(n: int) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(n)
        return torch.nn.Linear(n, n)


class Unpicklable:
    def __init__(self):
        self.pending = (i for i in range(3))


def unpicklable():
    return Unpicklable()


def test_a_budget_refusal_names_its_fix_once(monkeypatch):
    with isolated_runtime():
        monkeypatch.setenv("OVERMIND_MAX_BYTES", "4K")
        [message] = _warnings_of(build, 96)
    # larger than the whole budget: one fix, a larger budget and a restart (evicting others would not help)
    assert message.count("OVERMIND_MAX_BYTES") == 1 and message.count("'overmind stop'") == 1, message
    assert "overmind evict" not in message
    assert "overmind doctor" not in message


def test_a_pickling_failure_names_its_fix_once(overmind_runtime):
    [message] = _warnings_of(unpicklable)
    assert message.count("overmind_reducers") == 1, message
    assert "overmind doctor" not in message


def test_the_fix_table():
    assert fallback.fix_for(ServerError("publish refused: ... Raise OVERMIND_MAX_BYTES", "budget")) == ""
    assert fallback.fix_for(pickling.PicklingFailed(object(), TypeError("d"), TypeError("p"))) == ""
    assert fallback.fix_for(ServerError("publish refused: not sealed", "not sealed")) == " Run 'overmind doctor'."
    assert fallback.fix_for(OSError("no space")) == " Run 'overmind doctor'."
