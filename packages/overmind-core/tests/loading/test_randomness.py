"""A loader that draws from the global random generators is served as the variant of their states
(``loading/randomness.py``).

The plain call's values depend on where it found the generators, and it leaves them further on. Hypothesis
generates loaders (draws from torch, ``random`` and NumPy, seeding, a private ``torch.Generator``, nothing) and
generator states; each is called plain, then twice through ``overmind.load`` from the same state, against a real
server. Every call must give the plain values and leave every generator as the plain call left it, and the second
call must be served from the cache without running the loader (so the property cannot hold by caching nothing).
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overmind
from overmind.loading import randomness
from overmind.testing import clear_calls, record_call, recorded_calls

GLOBAL_OPS = ("torch", "torch-discarded", "random", "numpy", "seed-torch", "seed-random", "seed-then-draw")
LOCAL_OPS = ("private-generator", "nothing")


def load_with_draws(ops: tuple, n: int):
    record_call(ops)
    out = torch.arange(float(n))
    for op in ops:
        if op == "torch":
            out = out + torch.rand(n)
        elif op == "torch-discarded":  # the result does not depend on the draw; the generator still moves
            torch.rand(1)
        elif op == "random":
            out = out + random.random()
        elif op == "numpy":
            out = out + float(np.random.rand())
        elif op == "seed-torch":
            torch.manual_seed(11)
        elif op == "seed-random":
            random.seed(11)
        elif op == "seed-then-draw":  # the same values every time, but the generator ends elsewhere than it began
            torch.manual_seed(5)
            out = out + torch.rand(n)
        elif op == "private-generator":  # not a global generator: the same values every call, nothing moves
            out = out + torch.rand(n, generator=torch.Generator().manual_seed(3))
    return out


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _states() -> tuple:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return (bytes(torch.get_rng_state().numpy()), random.getstate(), (name, keys.tobytes(), pos, has_gauss, gauss))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(st.sampled_from(GLOBAL_OPS + LOCAL_OPS), max_size=3).map(tuple),
       n=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_a_loader_that_draws_is_served_from_the_same_states_and_leaves_the_generators_as_plain(
        overmind_runtime, ops, n, seed):
    _seed_all(seed)
    plain = load_with_draws(ops, n)
    plain_after = _states()
    for attempt in ("first", "second"):
        _seed_all(seed)
        clear_calls()
        got = overmind.load(load_with_draws, ops, n)
        assert torch.equal(got, plain), (ops, attempt)
        assert _states() == plain_after, (ops, attempt, "the generators are not where the plain call left them")
        if attempt == "second":
            assert recorded_calls() == [], (ops, "the second call from the same states ran the loader")


def test_moved_names_each_generator_and_ignores_a_private_one():
    before = randomness.snapshot()
    torch.Generator().manual_seed(1).seed()
    assert randomness.moved(before) == []
    for draw, name in ((lambda: torch.rand(1), "torch"), (lambda: random.random(), "random"),
                       (lambda: np.random.rand(), "numpy.random")):
        before = randomness.snapshot()
        draw()
        assert randomness.moved(before) == [name]


def test_torch_imported_by_the_loader_is_compared_with_its_starting_state():
    from overmind.testing import run_fresh

    script = """
import sys
from overmind.loading import randomness
from overmind.testing import clear_calls, record_call, recorded_calls
from overmind.testing import report
before = randomness.snapshot()
assert "torch" not in before
import torch
quiet = randomness.moved(before)
torch.rand(1)
report({"quiet": quiet, "drew": randomness.moved(before)})
"""
    assert run_fresh(script) == {"quiet": [], "drew": ["torch"]}


@pytest.mark.parametrize("draws", [0, 1, 2, 311, 313])
def test_numpy_imported_by_the_loader_is_compared_with_a_new_generator(draws):
    """Nothing in this script imports NumPy before the snapshot: any draw but a whole block (312 doubles) moves
    its generator from where a generator seeded from the OS stands."""
    from overmind.testing import run_fresh

    script = f"""
from overmind.loading import randomness
from overmind.testing import clear_calls, record_call, recorded_calls
from overmind.testing import report
before = randomness.snapshot()
assert "numpy.random" not in before, sorted(before)
import numpy.random
quiet = randomness.moved(before)
for _ in range({draws}):
    numpy.random.random_sample()
report({{"quiet": quiet, "drew": randomness.moved(before)}})
"""
    assert run_fresh(script) == {"quiet": [], "drew": ["numpy.random"] if draws else []}


@pytest.mark.parametrize("draws", [0, 1, 2, 623, 625])
def test_random_first_seen_after_the_loader_is_compared_with_a_new_generator(draws):
    """As if the loader imported ``random`` (seeded from the OS at import: ``random.seed()``) and drew."""
    saved = random.getstate()
    try:
        before = randomness.snapshot()
        del before["random"]
        random.seed()
        for _ in range(draws):
            random.getrandbits(32)
        assert ("random" in randomness.moved(before)) == bool(draws)
    finally:
        random.setstate(saved)


@pytest.mark.parametrize("op", ["torch", "seed-torch"])
def test_a_drawing_loader_says_which_generators_its_entry_varies_with(overmind_runtime, caplog, op):
    import logging

    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="overmind"):
        overmind.load(load_with_draws, (op,), 2)
    assert any("a variant by the random generator torch" in r.getMessage() for r in caplog.records)


def test_a_loader_that_starts_a_generator_from_the_os_and_draws_says_why_it_is_not_cached(overmind_runtime):
    """Nothing imports NumPy before this loader does: its draws start from a state no other process has."""
    from overmind.testing import run_fresh

    script = """
import logging, sys, io
import overmind
from overmind.testing import report
stream = io.StringIO()
logging.basicConfig(stream=stream, level=logging.DEBUG)
from _support.numpy_loaders import first_numpy_draw
assert "numpy" not in sys.modules
overmind.load(first_numpy_draw)
report({"log": stream.getvalue(), "entries": len(overmind.cache_info().entries)})
"""
    from _support import pythonpath_env

    out = run_fresh(script, env={"PYTHONPATH": pythonpath_env()})
    assert "in a state no other process starts from (seeded from the OS" in out["log"]
    assert "numpy.random" in out["log"]
    assert out["entries"] == 0
