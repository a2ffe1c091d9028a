"""Converted tensors written once: a miss's large CPU allocations are made in the memfd that becomes
its entry (overmind.shm.arena, csrc/load_arena.cpp), and what comes back is the plain result all the same.

The arena's threshold is lowered to one page here, so small tensors exercise it; the code path is the one a
1 MiB tensor takes.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overmind
from overmind.client.connection import get_client
from overmind.entries import pickling
from overmind.fallback import OvermindWarning
from overmind.shm import arena, reader, writer
from overmind.testing import run_fresh

SMALL = 4096



def _kept() -> list:
    """What each loader made, kept where the miss's writes recorder does not look (a list in a module of the standard
    library's: a write to a module of the program's is one a hit makes again, with the rebuilt object), and reached
    through this function, so that no loader's key describes the list."""
    return sys.modules["sysconfig"].__dict__.setdefault("_overmind_test_kept", [])


@pytest.fixture
def placing(monkeypatch, extension_problem):
    """Arenas available (the compiled extension in use) and placing anything of a page or more."""
    if extension_problem:
        pytest.skip(f"overmind.native._C does not import here ({extension_problem})")
    from overmind.native import zerocopy

    monkeypatch.setenv(zerocopy.ENV, "c")
    zerocopy._select()
    monkeypatch.setattr(arena, "THRESHOLD", SMALL)
    assert arena.available() is None
    yield
    monkeypatch.undo()
    zerocopy._select()


def source(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # fp16 tensors of 64 KiB or more: dedup keys them (dedup.MIN_BYTES)
    return {f"w{i}": torch.randn(128, 256 + 8 * i, generator=g) for i in range(5)} | {"b": torch.randn(7, generator=g)}


def convert(seed: int) -> dict[str, torch.Tensor]:
    """An fp32 checkpoint loaded as fp16, with a temporary on the way (freed before the loader returns)."""
    scratch = torch.empty(3 * SMALL, dtype=torch.uint8).fill_(0xAB)
    out = {k: v.to(torch.float16) for k, v in source(seed).items()}
    del scratch
    return out


def convert_and_keep(seed: int) -> dict[str, torch.Tensor]:
    """As convert, and the loader keeps its own reference to what it returned (a library's own cache, which
    the key does not see: kept on the torch module here)."""
    out = convert(seed)
    _kept().append(out)
    return out


def convert_other_way(seed: int) -> dict[str, torch.Tensor]:
    """The same tensors as convert, by another loader, which keeps its result too (as convert_and_keep): the
    second entry finds the bytes in the first, and the loader's own tensors must keep theirs."""
    out = {k: v.to(torch.float16) for k, v in source(seed).items()}
    _kept().append(out)
    return out


def convert_with_inner(seed: int) -> dict:
    """A pipeline-like loader: a nested cached load, and conversions of its own before and after it."""
    own = torch.randn(40, 100, generator=torch.Generator().manual_seed(seed)).to(torch.float64)
    inner = overmind.load(convert, seed)
    return {"inner": inner, "own": own, "after": torch.arange(3000, dtype=torch.float32).to(torch.int64)}


def _equal(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _meta(loader_suffix: str) -> dict:
    [e] = [e for e in get_client().ls() if e["meta"]["loader"].endswith(loader_suffix)]
    return e


FRESH = """
import torch, overmind
from overmind.client.connection import get_client
from overmind.shm import arena
from overmind.testing import report, overmind_mapped
arena.THRESHOLD = 4096


def convert(seed):
    g = torch.Generator().manual_seed(seed)
    scratch = torch.empty(3 * 4096, dtype=torch.uint8).fill_(0xAB)
    out = {f"w{i}": torch.randn(64, 96 + 8 * i, generator=g).to(torch.float16) for i in range(5)}
    del scratch
    return out


def plain(seed):
    return convert(seed)


got = overmind.load(convert, 1)
want = plain(1)
[e] = get_client().ls()
report({"equal": list(got) == list(want) and all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k])
                                                 for k in want),
        "hits": get_client().status()["hits"], "mapped": overmind_mapped(got["w0"].data_ptr()),
        "written_once": e["meta"].get("written_once"), "nbytes": e["nbytes"]})
"""


def test_a_conversion_is_written_once_and_comes_back_equal(overmind_runtime, placing):
    converted = sum(64 * (96 + 8 * i) * 2 for i in range(5))
    cold = run_fresh(FRESH, env={"OVERMIND_ZEROCOPY": "c"})
    assert cold["equal"] and cold["hits"] == 0 and cold["mapped"]
    assert cold["written_once"] == converted
    # The freed temporary and the fp32 tensors left holes: the entry holds the converted bytes, a header page
    # and the skeleton.
    assert cold["nbytes"] <= converted + 5 * 4096 + 2 * 4096
    warm = run_fresh(FRESH, env={"OVERMIND_ZEROCOPY": "c"})
    assert warm == dict(cold, hits=1)


def test_writes_after_the_publish_stay_in_the_loader_process(overmind_runtime, placing):
    got = overmind.load(convert_and_keep, 2)
    original = _kept().pop()
    assert got["w0"].data_ptr() != original["w0"].data_ptr()  # the caller got the rebuilt object
    with torch.no_grad():
        original["w0"].add_(1)  # the loader's own tensor: a private page now, not the entry's
        original["w1"].zero_()
    assert _equal(got, convert(2))
    again = overmind.load(convert_and_keep, 2)
    assert _equal(again, convert(2))
    assert not torch.equal(original["w0"], convert(2)["w0"])


def test_equal_bytes_found_elsewhere_are_detached_and_stored_once(overmind_runtime, placing):
    first = overmind.load(convert, 3)
    second = overmind.load(convert_other_way, 3)
    original = _kept().pop()
    assert _equal(first, convert(3)) and _equal(second, convert(3))
    assert _equal(original, convert(3))  # detached: a copy of its own, the memfd's range punched
    one, two = _meta(".convert"), _meta(".convert_other_way")
    assert two["deps"] == [one["entry_id"]]
    assert two["nbytes"] < 4 * 4096  # header, skeleton and the small bias: the large bytes are the first's
    assert "written_once" not in two["meta"] or two["meta"]["written_once"] == 0


def test_nested_loads_each_write_their_own(overmind_runtime, placing):
    got = overmind.load(convert_with_inner, 4)
    assert _equal(got["inner"], convert(4))
    assert got["own"].dtype == torch.float64 and got["own"].shape == (40, 100)
    assert torch.equal(got["after"], torch.arange(3000, dtype=torch.int64))
    outer, inner = _meta(".convert_with_inner"), _meta(".convert")
    assert inner["meta"]["written_once"] > 0
    assert outer["meta"]["written_once"] == 40 * 100 * 8 + 3000 * 8  # its own, not the inner load's
    assert outer["deps"] == [inner["entry_id"]]


def convert_slowly(seed: int) -> dict[str, torch.Tensor]:
    """Allocates in its arena, then sleeps (another thread runs meanwhile), then converts."""
    import time

    first = torch.ones(64, 256).to(torch.float16)
    time.sleep(0.3)
    return {"first": first} | convert(seed)


def test_another_threads_allocations_are_its_own(overmind_runtime, placing):
    stop, seen = threading.Event(), []

    def other_thread():
        while not stop.is_set():
            t = torch.full((20000,), 3.0)
            if arena.live_ranges():  # an arena of the loading thread has live ranges right now
                seen.append(_mapping_of(t.data_ptr()) or "")
            del t

    worker = threading.Thread(target=other_thread)
    worker.start()
    try:
        got = overmind.load(convert_slowly, 5)
    finally:
        stop.set()
        worker.join()
    assert _equal(got, convert_slowly(5))
    assert seen and not [m for m in seen if "memfd:" in m], seen[:5]
    assert _meta(".convert_slowly")["meta"]["written_once"] > 0


WORKER_LOADER = """
import threading, torch, overmind
from overmind.testing import report


def anonymous_kib():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Anonymous:"))


def convert_on_a_worker(seed):
    # As transformers 5 loads: the conversions run on a pool thread. A large temporary freed first raises
    # glibc's mmap threshold (to its size), so the tensors kept after it come from the thread's malloc arena.
    out = {}

    def work():
        g = torch.Generator().manual_seed(seed)
        torch.empty(16 << 20, dtype=torch.uint8).fill_(1)
        for i in range(6):
            out[f"w{i}"] = (torch.randn(1 << 20, generator=g) * (i + 1)).to(torch.float16)  # 2 MiB each

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return out


torch.ones(1)
# the miss's recorder of its loader's writes finds and marks the watched containers once per process (a few MiB of
# marks and copies): done first, so that what is measured is the loader's result
from overmind.loading.writes import recording
recording.finish(recording.start())
before = anonymous_kib()
got = overmind.load(convert_on_a_worker, 3)
after = anonymous_kib()
want = convert_on_a_worker(3)
report({"equal": list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want),
        "dtypes": sorted({str(v.dtype) for v in got.values()}), "grew_mib": (after - before) / 1024})
"""


def test_a_worker_threads_tensors_go_back_to_the_system_after_the_miss(overmind_runtime):
    # The miss frees the loader's result once it is rebuilt from the entry. Made on a worker thread while the
    # arena is open, those 12 MiB are mappings of their own (csrc/load_arena.cpp), unmapped when freed; from the
    # heap they would stay resident in the worker's malloc arena (glibc trims only the main one).
    out = run_fresh(WORKER_LOADER)
    assert out["equal"] and out["dtypes"] == ["torch.float16"]
    assert out["grew_mib"] < 6, out


def _mapping_of(address: int) -> str | None:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                parts = line.split(None, 5)
                return parts[5].strip() if len(parts) > 5 else ""
    return None


FORK_LOADER = """
import os, sys, torch, overmind
from overmind.shm import arena
from overmind.client.connection import get_client
from overmind.testing import report
arena.THRESHOLD = 4096

def forking_convert(seed):
    # A child forked in the middle of the load allocates and writes after the parent's next allocation was
    # made: were the child's allocations placed in the parent's arena, they would land on the parent's pages.
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(r, 1)
        t = torch.empty(8192, dtype=torch.uint8)
        t.fill_(0xEE)
        os.write(w2, b"x")
        os._exit(0)
    out = torch.zeros(8192, dtype=torch.uint8)
    os.write(w, b"x")
    os.read(r2, 1)
    os.waitpid(pid, 0)
    return {"out": out, "more": torch.ones(4096, dtype=torch.float32).to(torch.float16)}

got = overmind.load(forking_convert, 0)
[e] = get_client().ls()
report({"zeros": int(got["out"].sum()), "ones": float(got["more"].float().sum()),
        "written_once": e["meta"].get("written_once")})
"""


def test_a_child_forked_during_the_load_allocates_in_its_own_memory(overmind_runtime, placing):
    out = run_fresh(FORK_LOADER, env={"OVERMIND_ZEROCOPY": "c"})
    assert out == {"zeros": 0, "ones": 4096.0, "written_once": 8192 + 8192}


class Unpicklable:
    def __reduce__(self):
        raise TypeError("not today")


def convert_unpicklable(seed):
    out = convert(seed)
    out["handle"] = Unpicklable()
    return out


def test_a_result_that_cannot_be_cached_is_the_plain_one(overmind_runtime, placing):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = overmind.load(convert_unpicklable, 6)
    assert [w for w in caught if issubclass(w.category, OvermindWarning)]  # said once, as before
    handle = got.pop("handle")
    assert isinstance(handle, Unpicklable) and _equal(got, convert(6))
    with torch.no_grad():
        got["w0"].add_(1)  # the loader's own tensors: private pages of the memfd nobody else maps
    assert not get_client().ls()


def test_off_switch_copies_as_before(overmind_runtime, placing, monkeypatch):
    monkeypatch.setenv("OVERMIND_WRITE_ONCE", "0")
    assert arena.available() == "OVERMIND_WRITE_ONCE=0"
    got = overmind.load(convert, 7)
    assert _equal(got, convert(7))
    assert "written_once" not in _meta(".convert")["meta"]


# ---- the codec alone, over generated loads -----------------------------------------------------------------

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int64, torch.bool]
step = st.tuples(
    st.sampled_from(["keep", "temp", "view", "param", "worker"]),
    st.integers(1, 3000),  # elements: below and above the page threshold for every dtype
    st.sampled_from(DTYPES),
    st.integers(0, 2**31 - 1),
)


def _make(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 50).to(dtype)


def _on_a_worker(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    box = []
    worker = threading.Thread(target=lambda: box.append(_make(n, dtype, seed)))
    worker.start()
    worker.join()
    return box[0]


def _program(steps) -> dict:
    out: dict = {}
    temps = []
    for i, (kind, n, dtype, seed) in enumerate(steps):
        if kind == "worker":  # a loader's pool thread: its allocations are not the arena's (a mapping of its own)
            out[f"w{i}"] = _on_a_worker(n, dtype, seed)
            continue
        t = _make(n, dtype, seed)
        if kind == "temp":
            temps.append(t)
            if len(temps) > 2:
                temps.pop(0)  # freed while the arena is open: punched
        elif kind == "view" and any(k.startswith("k") for k in out):
            base = out[next(k for k in out if k.startswith("k"))]
            out[f"v{i}"] = base.view(-1)[n % base.numel():]
        elif kind == "param":
            out[f"p{i}"] = torch.nn.Parameter(t.float(), requires_grad=bool(seed % 2))
        else:
            out[f"k{i}"] = t
    return out


def _snapshot(obj: dict) -> dict:
    return {k: (v.dtype, tuple(v.shape), v.stride(), v.storage_offset(), type(v), v.requires_grad,
                v.detach().clone()) for k, v in obj.items()}


def _same(snap: dict, obj: dict) -> bool:
    if list(snap) != list(obj):
        return False
    for k, (dtype, shape, stride, offset, cls, grad, values) in snap.items():
        v = obj[k]
        if (v.dtype, tuple(v.shape), v.stride(), v.storage_offset(), type(v), v.requires_grad) != \
                (dtype, shape, stride, offset, cls, grad):
            return False
        if not torch.equal(v.detach().view(torch.uint8) if v.dtype != torch.bool else v.detach(),
                           values.view(torch.uint8) if values.dtype != torch.bool else values):
            return False
    return True


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=12))
def test_generated_loads_rebuild_bitwise_from_an_arena_entry(placing, steps):
    load_arena = arena.open_arena()
    assert load_arena is not None
    try:
        try:
            result = _program(steps)
        finally:
            load_arena.close()
        snap = _snapshot(result)
        pickled = pickling.dumps(result, arena=load_arena)
        placed_in_arena = {o for o in pickled.in_place}
        to_write = [(s, o) for s, o in pickled.storages if o not in pickled.in_place]
        fd = writer.write_entry(pickled.skeleton, to_write, pickled.data_len, arena=load_arena)
    finally:
        load_arena.release()
    try:
        mapping = reader.EntryMapping("e-arena", fd)
        rebuilt = pickling.loads(mapping.skeleton(), lambda where, off, n: mapping.storage(off, n),
                                 pickled.pickler)
        held = os.fstat(fd).st_blocks * 512
    finally:
        os.close(fd)
    assert _same(snap, rebuilt)
    # Views of one storage still share it; distinct storages stay distinct.
    ptrs = {k: v.untyped_storage().data_ptr() for k, v in result.items()}
    again = {k: v.untyped_storage().data_ptr() for k, v in rebuilt.items()}
    assert all((ptrs[a] == ptrs[b]) == (again[a] == again[b]) for a in ptrs for b in ptrs)
    # The entry holds pages for live storages only: temporaries were punched out.
    live = sum(-(-s.nbytes() // 4096) * 4096 for s, _ in pickled.storages)
    assert held <= live + 4096 + -(-len(pickled.skeleton) // 4096) * 4096 + 4096 * (1 + len(pickled.storages))
    # The loader's tensors and the rebuilt ones are copy-on-write of each other.
    big = [k for k, v in result.items() if v.untyped_storage().nbytes() >= SMALL and v.dtype.is_floating_point]
    for k in big[:1]:
        with torch.no_grad():
            result[k].view(-1)[0] = 123
        assert _same({k: snap[k]}, {k: rebuilt[k]})
    if any(s.nbytes() >= SMALL for s, _ in pickled.storages if not _made_on_a_worker(s, result)):
        assert placed_in_arena
    # What a worker thread made is not in the arena: the entry holds a copy of it.
    worker_storages = {v.untyped_storage().data_ptr() for k, v in result.items() if k.startswith("w")}
    assert not [s for s, o in pickled.storages if o in pickled.in_place and s.data_ptr() in worker_storages]


def _made_on_a_worker(storage, result: dict) -> bool:
    return any(k.startswith("w") and v.untyped_storage().data_ptr() == storage.data_ptr() for k, v in result.items())
