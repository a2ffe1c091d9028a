"""Calls a cache could answer with a wrong object, each through ``overmind.load`` with a real server, most across
fresh processes.

Every test compares what a cached call returns with what the plain call returns: a key that describes less than
the call would serve a wrong object here, with no warning (docs/architecture.md states the contract).
"""
from __future__ import annotations

import os
import sys
import textwrap

import pytest
import torch

import overmind
from overmind.client import connection as client_mod
from overmind.testing import run_fresh

HERE = os.path.dirname(__file__)
PRELUDE = f"import sys; sys.path.insert(0, {HERE!r})\n"


def _strict(monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")


def _entries(loader_suffix: str) -> list:
    return [e for e in client_mod.get_client().ls() if e["meta"]["loader"].endswith(loader_suffix)]


# --- closures, defaults, globals, helpers ---------------------------------------------


def make_loader(scale: float):
    def load_scaled():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 4).weight.detach() * scale
    return load_scaled


def make_transform(factor: float):
    return lambda t: t * factor


def load_with_transform(n: int, transform=None):
    t = torch.arange(float(n))
    return transform(t) if transform is not None else t


def test_lambdas_over_different_values_get_their_own_results(overmind_runtime, monkeypatch):
    _strict(monkeypatch)
    got = [overmind.load(lambda: torch.full((2,), float(s))) for s in (1, 2, 3)]  # noqa: B023  (the cell is the point)
    assert [g.tolist() for g in got] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]


def test_closures_and_function_arguments_are_keyed_by_what_they_capture(overmind_runtime, monkeypatch):
    _strict(monkeypatch)
    one, two = overmind.load(make_loader(1.0)), overmind.load(make_loader(2.0))
    assert torch.equal(two, one * 2)
    a = overmind.load(load_with_transform, 3, transform=make_transform(2.0))
    b = overmind.load(load_with_transform, 3, transform=make_transform(3.0))
    assert a.tolist() == [0.0, 2.0, 4.0] and b.tolist() == [0.0, 3.0, 6.0]
    # and in a fresh process, each still gets its own
    again = run_fresh(PRELUDE + """
import overmind
from overmind.testing import report
from test_never_wrong_object import make_loader, load_with_transform, make_transform
report([overmind.load(make_loader(2.0)).sum().item(),
        overmind.load(load_with_transform, 3, transform=make_transform(3.0)).tolist()])
""")
    assert again[0] == pytest.approx(two.sum().item()) and again[1] == [0.0, 3.0, 6.0]


USER_MODULE = '''
import os
import torch

SEED = int(os.environ["TEST_SEED"])


def helper(n):
    return torch.arange(float(n)) + {offset}


def load(n):
    torch.manual_seed(SEED)
    return helper(n) + torch.rand(1)
'''


def test_globals_and_helpers_the_loader_reads_are_part_of_its_key(overmind_runtime, tmp_path):
    """A module-level SEED set from the environment, and a helper edited between two processes."""
    (tmp_path / "user_loaders.py").write_text(USER_MODULE.format(offset=0))
    script = f"""
import sys; sys.path.insert(0, {str(tmp_path)!r})
import overmind, torch, user_loaders
from overmind.testing import report
plain = user_loaders.load(3)
cached = overmind.load(user_loaders.load, 3)
report([plain.tolist(), cached.tolist()])
"""
    results = {}
    for seed in ("1", "2"):
        results[seed] = run_fresh(script, env={"TEST_SEED": seed, "OVERMIND_STRICT": "1"})
    for seed, (plain, cached) in results.items():
        assert cached == plain, f"SEED={seed}"
    assert results["1"][0] != results["2"][0]
    (tmp_path / "user_loaders.py").write_text(USER_MODULE.format(offset=100))
    plain, cached = run_fresh(script, env={"TEST_SEED": "1", "OVERMIND_STRICT": "1"})
    assert cached == plain and plain[0] >= 100, "an edited helper must not be served its old entry"


# --- derived objects do not keep their origin key ---------------------------------------


def make_module(n: int):
    torch.manual_seed(n)
    return torch.nn.Sequential(torch.nn.Linear(n, n), torch.nn.Linear(n, 2))


def describe_module(module, probe: int = 0):
    """What a pipeline built from ``module`` would see: dtypes, classes, one output."""
    x = torch.ones(1, module[0].in_features, dtype=module[0].weight.dtype)
    with torch.no_grad():
        out = module(x)
    return {"dtype": str(module[0].weight.dtype), "sum": float(out.double().sum()), "probe": probe,
            "training": module.training}


def test_a_module_changed_after_loading_is_not_keyed_as_its_entry(overmind_runtime, monkeypatch):
    _strict(monkeypatch)
    base = overmind.load(make_module, 8)
    first = overmind.load(describe_module, base)
    assert first == describe_module(base)
    changes = {
        "half": lambda m: m.half(),
        "replaced parameter": lambda m: setattr(m[0], "weight", torch.nn.Parameter(m[0].weight.detach() + 1)),
        "in-place write": lambda m: m[0].weight.data.add_(1),
        "swapped weights": lambda m: m.__setitem__(1, torch.nn.Linear(8, 2)),
        "train mode": lambda m: m.train(False),
    }
    for what, change in changes.items():
        m = overmind.load(make_module, 8)
        change(m)
        got = overmind.load(describe_module, m)
        assert got == describe_module(m), what


class Settings:
    def __init__(self):
        self.scale = 1.0
        self.names = ["a"]


def apply_settings(settings):
    return torch.ones(2) * settings.scale * len(settings.names)


def test_a_plain_object_changed_in_place_gets_a_new_key(overmind_runtime, monkeypatch):
    _strict(monkeypatch)
    s = Settings()
    assert overmind.load(apply_settings, s).tolist() == [1.0, 1.0]
    s.names.append("b")
    assert overmind.load(apply_settings, s).tolist() == [2.0, 2.0]
    s.scale = 3.0
    assert overmind.load(apply_settings, s).tolist() == [6.0, 6.0]


def mutate_argument(module):
    module.half()  # a loader that changes what it was given
    return torch.zeros(1)


def test_a_loader_that_changes_its_argument_is_not_published(overmind_runtime, monkeypatch):
    _strict(monkeypatch)
    m = overmind.load(make_module, 6)
    overmind.load(mutate_argument, m)
    assert m[0].weight.dtype == torch.float16
    assert not _entries("mutate_argument")


# --- tensor arguments -----------------------------------------------------------------


def tensor_view(t):
    return {"values": t.resolve_conj().resolve_neg().clone(), "conj": t.is_conj(), "neg": t.is_neg()}


def test_conjugate_and_negative_views_are_different_arguments(overmind_runtime, monkeypatch):
    _strict(monkeypatch)
    z = torch.tensor([1 + 2j, 3 - 1j])
    for arg in (z, z.conj(), torch._neg_view(z), z.conj().imag):
        plain = tensor_view(arg)
        got = overmind.load(tensor_view, arg)
        assert torch.equal(got["values"], plain["values"]) and (got["conj"], got["neg"]) == (plain["conj"], plain["neg"])


# --- files ------------------------------------------------------------------------------


def read_checkpoint(path):
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).clone()


def test_a_checkpoint_overwritten_with_its_size_and_mtime_kept_is_read_again(overmind_runtime, monkeypatch, tmp_path):
    _strict(monkeypatch)
    ckpt = tmp_path / "w.bin"
    ckpt.write_bytes(b"\x01" * 64)
    st = os.stat(ckpt)
    assert overmind.load(read_checkpoint, str(ckpt))[0] == 1
    ckpt.write_bytes(b"\x02" * 64)
    os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(ckpt).st_size == st.st_size and os.stat(ckpt).st_mtime_ns == st.st_mtime_ns
    assert overmind.load(read_checkpoint, str(ckpt))[0] == 2
    # a bytes path is a path too
    assert overmind.load(read_checkpoint, os.fsencode(ckpt))[0] == 2
    ckpt.write_bytes(b"\x03" * 64)
    assert overmind.load(read_checkpoint, os.fsencode(ckpt))[0] == 3


def read_while_swapped(path, swap_to, swap_back):
    """Reads the checkpoint while another writer swaps it in, then puts the original back."""
    os.replace(path, path + ".orig")
    os.replace(swap_to, path)
    data = read_checkpoint(path)
    os.replace(path, swap_to)
    os.replace(path + ".orig", path)
    return data


def test_a_checkpoint_swapped_during_the_load_is_not_published(overmind_runtime, monkeypatch, tmp_path):
    _strict(monkeypatch)
    ckpt, other = tmp_path / "w.bin", tmp_path / "other.bin"
    ckpt.write_bytes(b"\x01" * 16)
    other.write_bytes(b"\x09" * 16)
    swapped = overmind.load(read_while_swapped, str(ckpt), str(other), True)
    assert swapped[0] == 9  # what the plain call returns
    assert not _entries("read_while_swapped"), "weights read from a swapped file must not be cached under the key"
    assert overmind.load(read_checkpoint, str(ckpt))[0] == 1


def test_fresh_processes_agree_with_plain_for_each_case(overmind_runtime, tmp_path):
    """One fresh process publishes, a second hits: both equal their plain call."""
    script = PRELUDE + textwrap.dedent("""
        import torch, overmind
        from overmind.testing import report
        from test_never_wrong_object import make_module, describe_module, tensor_view, make_loader
        m = overmind.load(make_module, 8)
        h = overmind.load(make_module, 8); h.half()
        z = torch.tensor([1 + 2j, 3 - 1j])
        out = [overmind.load(describe_module, m) == describe_module(m),
               overmind.load(describe_module, h) == describe_module(h),
               bool(overmind.load(tensor_view, z.conj())["conj"]),
               float(overmind.load(make_loader(5.0)).sum()) == float(make_loader(5.0)().sum())]
        report(out)
    """)
    env = {"OVERMIND_STRICT": "1"}
    assert run_fresh(script, env=env) == [True, True, True, True]
    assert run_fresh(script, env=env) == [True, True, True, True]
    assert sys.modules.get("overmind") is not None


# --- torch's process-wide state: default dtype, default device, inference mode ----------------------------


def make_default_tensors():
    return {"zeros": torch.zeros(2), "ones": torch.ones(3, 2)}


AMBIENTS = {
    "plain": lambda: __import__("contextlib").nullcontext(),
    "float64": lambda: _default_dtype(torch.float64),
    "bfloat16": lambda: _default_dtype(torch.bfloat16),
    "meta": lambda: torch.device("meta"),
    "inference": lambda: torch.inference_mode(),
    "inference_float64": lambda: _both(torch.inference_mode(), _default_dtype(torch.float64)),
}


def _default_dtype(dtype):
    import contextlib

    @contextlib.contextmanager
    def cm():
        before = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(before)
    return cm()


def _both(a, b):
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(a)
    stack.enter_context(b)
    return stack


def _describe(result):
    return {k: (t.dtype, t.device.type, t.is_inference(), tuple(t.shape)) for k, t in result.items()}


def test_the_default_dtype_device_and_inference_mode_key_the_call(overmind_runtime, monkeypatch):
    """``torch.zeros(2)`` inside a loader is float64 under ``set_default_dtype(torch.float64)``, a meta tensor under
    ``torch.device("meta")``, an inference tensor under ``inference_mode``: each state is its own entry, and every
    call, miss or hit, in any order, returns what the plain call returns in that state."""
    _strict(monkeypatch)
    order = list(AMBIENTS) + list(reversed(AMBIENTS))  # each state missed once, then hit
    for name in order:
        with AMBIENTS[name]():
            plain = _describe(make_default_tensors())
            cached = _describe(overmind.load(make_default_tensors))
        assert cached == plain, name
    assert len(_entries("make_default_tensors")) == len(AMBIENTS)
    from overmind.keys import torch_state

    assert torch_state.key_part() == torch_state.DEFAULTS  # the state a process that imported torch starts in


def make_float64_for_good():
    """A loader that changes torch's default dtype and leaves it changed."""
    torch.set_default_dtype(torch.float64)
    return torch.zeros(2)


def test_a_loader_that_changes_the_default_dtype_is_not_served_where_it_would_change_it(overmind_runtime,
                                                                                         monkeypatch):
    """A hit cannot change the caller's state as the plain call does: the key, computed again after the loader,
    includes the default dtype, so the first call (float32 before, float64 after) is not published; once the
    state is float64 the loader changes nothing, and that call is cached and served as plain."""
    _strict(monkeypatch)
    try:
        for _ in range(3):
            torch.set_default_dtype(torch.float32)
            plain = make_float64_for_good()
            plain_after = torch.get_default_dtype()
            torch.set_default_dtype(torch.float32)
            got = overmind.load(make_float64_for_good)
            assert (got.dtype, torch.get_default_dtype()) == (plain.dtype, plain_after) == (torch.float64,) * 2
        assert _entries("make_float64_for_good") == []
        for _ in range(2):  # already float64: nothing changes, so the call is cached (one entry, then a hit)
            assert overmind.load(make_float64_for_good).dtype == torch.float64
        assert [e["hits"] for e in _entries("make_float64_for_good")] == [1]
    finally:
        torch.set_default_dtype(torch.float32)
