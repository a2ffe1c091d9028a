"""Following what a loader drew at random (``loading/draws/``): the tracker's verdict is sound.

Hypothesis generates small loaders: draws into tensors (torch's own initialisers among them), checkpoint values
copied over all or part of them, values computed from others, reads into Python. Each loader runs under the tracker
from one seed, then plainly from another: where the tracker says the result keeps no drawn value, the two results
must be equal byte for byte. Examples pin the verdict where it must be "none kept" (the plain PyTorch pattern, a
routine's own rejection sampling) and where a drawn value reaches Python or is drawn where the tracker cannot see.
"""
from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from overmind.loading.draws import tracker
from overmind.loading.draws.taint import Taint

SLOTS = 3
N = 8
CHECKPOINT = torch.arange(float(N))


def _bytes(tensors: list[torch.Tensor]) -> list[bytes]:
    return [t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() for t in tensors]


def verdict_of(program, seed: int = 0) -> tuple[str | None, list[bytes]]:
    """Run ``program`` (returns its result's tensors) under a tracker from ``seed``; the verdict and the result."""
    torch.manual_seed(seed)
    follower = tracker.following()
    try:
        result = program()
    finally:
        tracker.stop(follower)
    return follower.verdict(result), _bytes(result)


# -- the taint's ranges against a byte-by-byte model ------------------------------------------------------------

ranges = st.tuples(st.integers(0, 40), st.integers(0, 40)).map(sorted)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), ranges), max_size=25), st.lists(ranges, min_size=1, max_size=5))
def test_taint_ranges_agree_with_a_byte_model(steps, queries):
    taint, model = Taint(), [False] * 40
    for drawn, (start, stop) in steps:
        if drawn:
            taint.add(1, start, stop, object)
        else:
            taint.clear(1, start, stop)
        for i in range(start, stop):
            model[i] = drawn
    for start, stop in queries:
        assert taint.overlaps(1, start, stop) == any(model[start:stop])
    kept = taint.ranges(1)
    assert kept == sorted(kept) and all(a < b for a, b in kept)
    assert all(b < c for (_, b), (c, _) in zip(kept, kept[1:]))  # disjoint, and merged where they touch
    assert sum(b - a for a, b in kept) == sum(model)


# -- generated loaders: "none kept" means the result does not depend on the draws ------------------------------

DRAWS = ("normal_", "uniform_", "kaiming", "trunc_normal", "randn")
step = st.one_of(
    st.tuples(st.just("draw"), st.integers(0, SLOTS - 1), st.sampled_from(DRAWS)),
    st.tuples(st.just("load"), st.integers(0, SLOTS - 1), st.integers(0, N), st.integers(0, N)),
    st.tuples(st.just("add"), st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1)),
    st.tuples(st.just("new"), st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1)),
    st.tuples(st.just("fill"), st.integers(0, SLOTS - 1)),
    st.tuples(st.just("strided"), st.integers(0, SLOTS - 1)),
    st.tuples(st.just("gappy"), st.integers(0, SLOTS - 1)),
    st.tuples(st.just("branch"), st.integers(0, SLOTS - 1), st.integers(0, N - 1), st.sampled_from([-0.5, 0.0, 0.5])),
)


def make_program(steps: list, keep: list[int]):
    def program() -> list[torch.Tensor]:
        slots = [torch.zeros(N) for _ in range(SLOTS)]
        for s in steps:
            kind, i = s[0], s[1]
            if kind == "draw":
                how = s[2]
                if how == "randn":
                    slots[i] = torch.randn(N)
                elif how == "kaiming":
                    torch.nn.init.kaiming_uniform_(slots[i].view(2, N // 2))
                elif how == "trunc_normal":
                    torch.nn.init.trunc_normal_(slots[i])
                else:
                    getattr(slots[i], how)()
            elif kind == "load":  # the checkpoint's values over [a, b)
                a, b = sorted(s[2:])
                slots[i][a:b].copy_(CHECKPOINT[a:b])
            elif kind == "add":
                slots[i].add_(slots[s[2]])
            elif kind == "new":
                slots[i] = slots[s[2]] * 2
            elif kind == "fill":
                slots[i].fill_(1.5)
            elif kind == "strided":  # every other element: a write that is not one dense block
                slots[i][::2].copy_(CHECKPOINT[::2])
            elif kind == "gappy":  # the first two and the last two elements: the span is whole, the write is not
                slots[i].as_strided((2, 2), (N - 2, 1)).copy_(CHECKPOINT[:4].view(2, 2))
            elif kind == "branch":  # a drawn value decides what is written
                if slots[i][s[2]].item() > s[3]:
                    slots[i].fill_(2.0)
        return [slots[k] for k in keep]

    return program


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=10), st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=SLOTS, unique=True))
def test_a_result_said_to_keep_no_draw_is_the_same_from_any_seed(steps, keep):
    program = make_program(steps, keep)
    verdict, first = verdict_of(program, seed=1)
    if verdict is None:
        torch.manual_seed(2)
        assert _bytes(program()) == first, steps


@pytest.mark.parametrize("init", ["kaiming_uniform_", "trunc_normal_", "normal_", "orthogonal_", "xavier_normal_"])
def test_the_plain_pytorch_pattern_keeps_no_draw(init):
    """A layer initialised at random (torch's routines, their own rejection sampling included), then loaded."""
    saved = torch.nn.Linear(N, N).state_dict()

    def load() -> list[torch.Tensor]:
        layer = torch.nn.Linear(N, N)
        getattr(torch.nn.init, init)(layer.weight)
        layer.load_state_dict(saved)
        return [layer.weight, layer.bias]

    assert verdict_of(load)[0] is None


def test_a_head_the_checkpoint_lacks_is_kept_and_named():
    saved = torch.nn.Linear(N, N).state_dict()

    def load() -> torch.nn.Module:
        net = torch.nn.Sequential(torch.nn.Linear(N, N), torch.nn.Linear(N, 2))
        net[0].load_state_dict(saved)
        return net

    follower = tracker.following()
    try:
        net = load()
    finally:
        tracker.stop(follower)
    assert "1.weight" in (follower.verdict(net) or "")


@pytest.mark.parametrize("read", ["item", "tolist", "numpy", "bool", "nonzero", "data_ptr"])
def test_a_drawn_value_read_into_python_is_kept(read):
    def program() -> list[torch.Tensor]:
        drawn = torch.rand(N)
        if read == "item":
            drawn.sum().item()
        elif read == "tolist":
            drawn.tolist()
        elif read == "numpy":
            drawn.numpy().sum()
        elif read == "bool":
            bool(drawn[0] > 0.5)
        elif read == "nonzero":
            (drawn > 0.5).nonzero().shape[0]
        elif read == "data_ptr":
            drawn.data_ptr()
        return [torch.zeros(N)]

    verdict, _ = verdict_of(program)
    assert verdict is not None and "reached Python" in verdict


def test_reads_of_values_that_were_never_drawn_are_not_kept():
    def program() -> list[torch.Tensor]:
        t = torch.rand(N)
        t.copy_(CHECKPOINT)
        t.sum().item(), t.tolist(), t.numpy(), t.data_ptr()
        return [t]

    assert verdict_of(program)[0] is None


def test_a_draw_in_another_thread_breaks_the_chain():
    def program() -> list[torch.Tensor]:
        box: list[torch.Tensor] = []
        worker = threading.Thread(target=lambda: box.append(torch.rand(N)))
        worker.start()
        worker.join()
        return [box[0]]

    verdict, _ = verdict_of(program)
    assert verdict is not None and "could not follow" in verdict


def test_a_drawn_tensor_the_loader_dropped_in_a_cycle_is_not_kept():
    def program() -> list[torch.Tensor]:
        holder: dict = {"t": torch.rand(N)}
        holder["self"] = holder  # freed by the collector only
        return [torch.ones(N)]

    assert verdict_of(program)[0] is None


def _tensor_attributes() -> dict:
    names = (*tracker._ESCAPES, *tracker.TENSOR_DRAWS)
    return {**{n: torch.Tensor.__dict__.get(n) for n in names}, **{n: getattr(torch, n) for n in tracker.TORCH_DRAWS}}


def test_the_mode_starts_at_the_first_draw_from_the_global_generator_and_everything_is_put_back():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    plain = _tensor_attributes()
    follower = tracker.following()
    try:
        torch.zeros(3).normal_(generator=torch.Generator().manual_seed(1))  # a generator of the loader's own
        assert _get_current_dispatch_mode() is None and torch.Tensor.__dict__.get("numpy") is None
        torch.rand(2)
        assert _get_current_dispatch_mode() is follower and torch.Tensor.__dict__.get("numpy") is not None
    finally:
        tracker.stop(follower)
    assert _get_current_dispatch_mode() is None and _tensor_attributes() == plain


class FromData(torch.Tensor):
    """A tensor subclass made from data, as stable-fast's tracing makes them: no dispatch mode may be active."""

    def __new__(cls, data):
        return super().__new__(cls, data)


def test_a_loader_that_draws_nothing_from_the_global_generator_runs_without_the_mode():
    def program() -> list[torch.Tensor]:
        drawn = torch.randn(4, generator=torch.Generator().manual_seed(0))
        return [FromData([1.0, 2.0]), drawn]

    assert verdict_of(program)[0] is None


def test_a_draw_that_python_did_not_start_breaks_the_chain():
    def program() -> list[torch.Tensor]:
        torch.nn.functional.dropout(torch.ones(N), 0.5, training=True)  # drawn inside torch's C++ function
        return [torch.ones(N)]

    verdict, _ = verdict_of(program)
    assert verdict is not None and "could not follow" in verdict
