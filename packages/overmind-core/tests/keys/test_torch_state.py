"""Replaced ``nn.Module`` registration (what ``accelerate.init_empty_weights()`` / ``init_on_device()`` install) is
part of every key (``keys/torch_state.py``), and a result holding meta tensors is published only where the key says so.

Generated: sequences of loads made plain, inside ``init_on_device(device)`` for a drawn device, or under a meta
default device, against a real server; every cached call returns what the plain call returns at that point.
"""
from __future__ import annotations

import contextlib

import torch
from accelerate import init_on_device
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overmind
from overmind.client.connection import get_client
from overmind.keys import torch_state


class Pair(torch.nn.Module):
    """Parameters and a buffer made without random draws: where they land is what registration decides."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((2, 3), 0.5))
        self.register_buffer("scale", torch.ones(2))


def make_pair():
    return Pair()


def _describe(m) -> list:
    return [(name, t.device.type, str(t.dtype), None if t.device.type == "meta" else t.tolist())
            for name, t in list(m.named_parameters()) + list(m.named_buffers())]


CONTEXTS = {
    "plain": contextlib.nullcontext,
    "init_on_device(meta)": lambda: init_on_device(torch.device("meta")),
    "init_on_device(cpu)": lambda: init_on_device(torch.device("cpu")),
    "nested meta in cpu": lambda: _nested(torch.device("cpu"), torch.device("meta")),
    "default device meta": lambda: torch.device("meta"),
}


@contextlib.contextmanager
def _nested(outer, inner):
    with init_on_device(outer), init_on_device(inner):
        yield


def test_the_key_part_tells_each_context_apart_and_is_back_to_the_defaults_after_them():
    parts = {}
    for name, context in CONTEXTS.items():
        with context():
            parts[name] = torch_state.key_part()
            assert parts[name] == torch_state.key_part()  # stable while the state is
        assert torch_state.key_part() == torch_state.DEFAULTS
    assert len(set(map(repr, parts.values()))) == len(CONTEXTS)
    assert [torch_state.makes_meta(p) for p in parts.values()] == [False, True, True, True, True]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(sorted(CONTEXTS)), min_size=1, max_size=6))
def test_every_call_in_any_order_of_contexts_returns_what_plain_returns(overmind_runtime, sequence):
    for name in sequence:
        with CONTEXTS[name]():
            plain = _describe(make_pair())
            cached = _describe(overmind.load(make_pair))
        assert cached == plain, name


def test_each_context_gets_its_own_entry_and_is_served_from_it(overmind_runtime):
    for _ in range(2):
        for name, context in CONTEXTS.items():
            with context():
                assert _describe(overmind.load(make_pair)) == _describe(make_pair()), name
    assert [e["hits"] for e in _entries("make_pair")] == [1] * len(CONTEXTS)


def _entries(suffix: str) -> list:
    return [e for e in get_client().ls() if e["meta"].get("loader", "").endswith(suffix)]


def make_meta_unasked():
    """A loader that makes meta tensors itself, which the caller's state does not say: not published."""
    with torch.device("meta"):
        return torch.nn.Linear(2, 2)


def test_a_result_with_meta_tensors_the_key_did_not_ask_for_is_returned_not_published(overmind_runtime):
    for _ in range(2):
        got = overmind.load(make_meta_unasked)
        assert got.weight.device.type == "meta"
    assert _entries("make_meta_unasked") == []
    with torch.device("meta"):  # asked for: cached and served
        overmind.load(make_meta_unasked)
        assert overmind.load(make_meta_unasked).weight.device.type == "meta"
    assert [e["hits"] for e in _entries("make_meta_unasked")] == [1]
