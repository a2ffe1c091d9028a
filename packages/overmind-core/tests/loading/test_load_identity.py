"""An object passed into a cached call is the very object the result holds, as in the plain call: in the
publishing process and in every later one, with its bytes in no new entry."""
from __future__ import annotations

import os

import pytest

from overmind.testing import run_fresh

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

HERE = os.path.dirname(os.path.abspath(__file__))
BIG = 256 * 256  # floats: a 256 KiB tensor, so a copy of it would show in an entry's size

LOADERS = '''
import os, sys, warnings, torch, overmind
from overmind.client.connection import get_client
from overmind.shm import mappings
from overmind.testing import report, overmind_mapped


def note(name):
    with open(os.environ["LOAD_LOG"], "a") as f:
        f.write(name + "\\n")


def build_base():
    note("base")
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(0)
        return torch.nn.Linear(256, 256)


def wrap(module, table, names, scale=2.0):
    """Holds its arguments as a plain loader would: the module twice (directly and inside a new Sequential),
    the dict and the list it was given, and an element of that dict."""
    note("wrap")
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(1)
        head = torch.nn.Sequential(module, torch.nn.Linear(256, 2))
        return {"module": module, "head": head, "table": table, "weights": table["weights"], "names": names,
                "scale": scale}


def passthrough(module):
    note("passthrough")
    return module


def pair(nets):
    note("pair")
    return torch.nn.ModuleList(nets)


def entry(loader_suffix):
    [e] = [e for e in get_client().ls() if e["meta"]["loader"].endswith(loader_suffix)]
    return e


def entry_of(t):
    s = t.untyped_storage()
    loc = mappings.locate(s.data_ptr(), s.nbytes())
    return loc.entry_id if loc else None
'''

SCRIPT = LOADERS + '''
base = overmind.load(build_base)
table = {"weights": torch.arange(%d, dtype=torch.float32), "tags": ["a", "b"]}
names = ["x", "y"]
out = overmind.load(wrap, base, table, names)
same = overmind.load(passthrough, base)
table["added"] = 1  # the result holds the caller's dict: the change shows, as with the plain call
w, b = entry("wrap"), entry("build_base")
report({
    "module_is_base": out["module"] is base, "head0_is_base": out["head"][0] is base,
    "table_is_table": out["table"] is table, "weights_is": out["weights"] is table["weights"],
    "names_is_names": out["names"] is names, "sees_change": out["table"].get("added") == 1,
    "passthrough_is_base": same is base,
    "head1_mapped": overmind_mapped(out["head"][1].weight.data_ptr()),
    "head1_entry": entry_of(out["head"][1].weight), "wrap_entry": w["entry_id"],
    "wrap_nbytes": w["nbytes"], "wrap_deps": w["deps"], "base_nbytes": b["nbytes"],
    "head1_sum": float(out["head"][1].weight.sum()), "scale": out["scale"],
})
''' % BIG


@pytest.fixture
def load_log(tmp_path, monkeypatch):
    log = tmp_path / "loads.log"
    log.touch()
    monkeypatch.setenv("LOAD_LOG", str(log))
    return lambda: log.read_text().split()


def test_arguments_are_the_results_objects_in_two_fresh_processes(overmind_runtime, load_log):
    env = {"OVERMIND_STRICT": "1"}
    first = run_fresh(SCRIPT, env=env)
    second = run_fresh(SCRIPT, env=env)
    assert load_log() == ["base", "wrap", "passthrough"], "the second process must be served from the cache"
    for got in (first, second):
        assert got["module_is_base"] and got["head0_is_base"], got
        assert got["table_is_table"] and got["weights_is"] and got["names_is_names"] and got["sees_change"], got
        assert got["passthrough_is_base"], got
        # What the loader made itself is the entry's, zero-copy.
        assert got["head1_mapped"] and got["head1_entry"] == got["wrap_entry"], got
        # The arguments' bytes are in no new entry: not the module's (its own entry), not the dict's tensor.
        assert got["wrap_deps"] == [], got
        assert got["wrap_nbytes"] < BIG * 4 // 2 < got["base_nbytes"], got
        assert got["scale"] == 2.0
    assert second["head1_sum"] == first["head1_sum"]


ALIASES = LOADERS + '''
a = overmind.load(build_base)
nets = [a, a] if os.environ["SHAPE"] == "same" else [a, overmind.load(build_base)]
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    out = overmind.load(pair, nets)
report({"first_is": out[0] is nets[0], "second_is": out[1] is nets[1], "one_object": out[0] is out[1]})
'''


@pytest.mark.parametrize("order", [("same", "distinct"), ("distinct", "same")])
def test_an_object_passed_twice_is_not_mistaken_for_two(overmind_runtime, load_log, order):
    """``[a, a]`` and ``[a1, a2]`` (two objects of one entry) share a key; each still gets what plain gives."""
    for shape in order:
        got = run_fresh(ALIASES, env={"SHAPE": shape})
        assert got["first_is"] and got["second_is"], (shape, got)
        assert got["one_object"] == (shape == "same"), (shape, got)
