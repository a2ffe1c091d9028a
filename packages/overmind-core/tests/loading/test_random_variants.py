"""Loaders that draw from the global random generators, across fresh processes, against plain processes.

Each case is a script run as a plain process, then twice with Overmind against one private server. Every process
reports the result's digest and what the generators give next (``torch.randn``, and ``random.random`` and NumPy where
the script seeds them: unseeded, they start from the OS in every process); each must equal the plain process's. The second Overmind process must not run the loader (a hit on the variant of the
generators' states), and the first must publish one (so the property cannot hold by caching nothing).
"""
from __future__ import annotations

import pytest

from _support import pythonpath_env
from overmind.testing import run_fresh

PRELUDE = """
import hashlib, json, os, random, sys
import numpy as np
import torch
import overmind
from overmind.testing import recorded_calls, report
from _support import random_loaders as rl
PATH = os.environ["NET_PATH"]
def digest(module):
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode() + t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
def load(fn, *args):
    return overmind.load(fn, *args) if os.environ.get("VIA") == "overmind" else fn(*args)
"""

EPILOGUE = """
report({"digest": digest(net), "torch": torch.randn(4).tolist(), "random": random.random(),
        "numpy": float(np.random.rand()), "ran": len(recorded_calls())})
"""

CASES = {
    "plain PyTorch pattern in a seeded script": "torch.manual_seed(0)\nnet = load(rl.load_net, PATH)",
    "every generator seeded": "torch.manual_seed(7); random.seed(7); np.random.seed(7)\nnet = load(rl.load_net, PATH)",
    "draws between the seed and the load": "torch.manual_seed(1); torch.rand(5)\nnet = load(rl.load_net, PATH)",
    "a head the checkpoint lacks": "torch.manual_seed(3)\nnet = load(rl.load_net_with_new_head, PATH)",
    "two loads in a row": "torch.manual_seed(4)\na = load(rl.load_net, PATH)\n"
                          "net = load(rl.load_net_with_new_head, PATH)\nassert digest(a)",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_drawing_loader_hits_in_the_next_process_and_leaves_the_generators_as_plain(tmp_path, overmind_runtime,
                                                                                    case):
    from _support.random_loaders import save_net

    path = save_net(str(tmp_path / "net.pt"))
    script = PRELUDE + CASES[case] + EPILOGUE
    env = {"PYTHONPATH": pythonpath_env(), "NET_PATH": path, "OVERMIND_RUNTIME_DIR": overmind_runtime}
    plain = run_fresh(script, env={**env, "VIA": "plain"})
    first = run_fresh(script, env={**env, "VIA": "overmind"})
    second = run_fresh(script, env={**env, "VIA": "overmind"})
    info = run_fresh("import overmind\nfrom overmind.testing import report\n"
                     "report(len(overmind.cache_info().entries))", env=env)
    ran = plain.pop("ran")
    assert first.pop("ran") == ran and second.pop("ran") == 0, "the second process ran the loader"
    compared = ("digest", "torch", "random", "numpy") if "np.random.seed" in CASES[case] else ("digest", "torch")
    for got in (first, second):
        assert {k: got[k] for k in compared} == {k: plain[k] for k in compared}
    assert info >= 2  # the call's marker and its variant


def test_another_seed_is_another_variant_and_each_hits(tmp_path, overmind_runtime):
    from _support.random_loaders import save_net

    path = save_net(str(tmp_path / "net.pt"))
    script = PRELUDE + "torch.manual_seed(int(os.environ['SEED']))\nnet = load(rl.load_net_with_new_head, PATH)" \
        + EPILOGUE
    env = {"PYTHONPATH": pythonpath_env(), "NET_PATH": path, "OVERMIND_RUNTIME_DIR": overmind_runtime}
    plain = {seed: run_fresh(script, env={**env, "VIA": "plain", "SEED": seed}) for seed in ("1", "2")}
    assert plain["1"]["digest"] != plain["2"]["digest"]  # the head follows the seed
    for seed, runs_loader in (("1", 1), ("2", 1), ("1", 0), ("2", 0)):
        got = run_fresh(script, env={**env, "VIA": "overmind", "SEED": seed})
        assert got.pop("ran") == runs_loader, (seed, runs_loader)
        assert (got["digest"], got["torch"]) == (plain[seed]["digest"], plain[seed]["torch"]), seed


def test_torch_imported_before_overmind_counts_as_seeded_and_publishes_nothing(tmp_path, overmind_runtime):
    """torch seeded its generator from the OS, and what the program did with it before ``overmind`` was imported
    cannot be told: no other process starts from that state, so no variant is made."""
    from _support.random_loaders import save_net

    path = save_net(str(tmp_path / "net.pt"))
    script = PRELUDE + "net = load(rl.load_net, PATH)\n" + \
        "report({'digest': digest(net), 'ran': len(recorded_calls()), 'seed': torch.initial_seed()})"
    env = {"PYTHONPATH": pythonpath_env(), "NET_PATH": path, "OVERMIND_RUNTIME_DIR": overmind_runtime}
    plain = run_fresh(script, env={**env, "VIA": "plain"})
    for _ in range(2):
        got = run_fresh(script, env={**env, "VIA": "overmind"})
        assert got["digest"] == plain["digest"] and got["ran"] == 1 and got["seed"] >= 2**32
    entries = run_fresh("import overmind\nfrom overmind.testing import report\n"
                        "report(len(overmind.cache_info().entries))", env=env)
    assert entries == 0


UNSEEDED = """
import hashlib, json, logging, os, sys
import overmind
overmind.activate()
import torch
from overmind.testing import recorded_calls, report
from _support import random_loaders as rl
records = []
handler = logging.Handler()
handler.emit = lambda r: records.append(r.getMessage())
logging.getLogger("overmind").addHandler(handler)
logging.getLogger("overmind").setLevel(logging.INFO)
PATH = os.environ["NET_PATH"]
if os.environ.get("SEED"):
    torch.manual_seed(int(os.environ["SEED"]))
def digest(module):
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode() + t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
digests = []
for name in os.environ["LOADERS"].split():
    fn = getattr(rl, name)
    digests.append(digest(overmind.load(fn, PATH) if os.environ.get("VIA") == "overmind" else fn(PATH)))
report({"digests": digests, "ran": len(recorded_calls()), "next": torch.randn(4).tolist(),
        "os_seeded": torch.initial_seed() >= 2**32,
        "said_kept": sum("keeps values drawn at random" in m for m in records)})
"""


def _unseeded_runs(tmp_path, runtime, loaders, runs, **extra):
    from _support.random_loaders import save_net

    path = save_net(str(tmp_path / "net.pt"))
    env = {"PYTHONPATH": pythonpath_env(), "NET_PATH": path, "OVERMIND_RUNTIME_DIR": runtime, "LOADERS": loaders,
           **extra}
    plain = run_fresh(UNSEEDED, env={**env, "VIA": "plain"})
    got = [run_fresh(UNSEEDED, env={**env, "VIA": "overmind"}) for _ in range(runs)]
    entries = run_fresh("import overmind\nfrom overmind.testing import report\n"
                        "report(len(overmind.cache_info().entries))", env=env)
    return plain, got, entries


def test_processes_that_never_seed_share_one_entry_of_a_loader_that_keeps_no_draw(tmp_path, overmind_runtime):
    """The plain PyTorch pattern: its random initialisation is overwritten by the checkpoint, so every process that
    has not seeded gets the same result; from the second process on it runs no loader and leaves the generator
    unseeded. A head the checkpoint lacks keeps its draws: it is drawn anew in every process, twice in each here,
    with one INFO line per process."""
    plain, got, entries = _unseeded_runs(tmp_path, overmind_runtime,
                                         "load_net load_net_with_new_head load_net_with_new_head", 3)
    assert [g["ran"] for g in got] == [3, 2, 2]
    assert all(g["digests"][0] == plain["digests"][0] and g["os_seeded"] for g in got)
    heads = [d for run in (plain, *got) for d in run["digests"][1:]]
    assert len(set(heads)) == len(heads)
    assert [g["said_kept"] for g in got] == [1, 1, 1]
    assert len({tuple(g["next"]) for g in got}) == 3  # each generator where its own start put it
    assert entries == 2  # the call's marker and its unseeded variant


def test_a_seeded_process_is_not_served_the_unseeded_entry(tmp_path, overmind_runtime):
    """After an unseeded process published, a seeded one gets the variant of its own state, and the generator
    where the plain call leaves it."""
    from _support.random_loaders import save_net

    path = save_net(str(tmp_path / "net.pt"))
    env = {"PYTHONPATH": pythonpath_env(), "NET_PATH": path, "OVERMIND_RUNTIME_DIR": overmind_runtime,
           "LOADERS": "load_net"}
    seeded_plain = run_fresh(UNSEEDED, env={**env, "VIA": "plain", "SEED": "5"})
    assert run_fresh(UNSEEDED, env={**env, "VIA": "overmind"})["ran"] == 1
    for ran in (1, 0):
        got = run_fresh(UNSEEDED, env={**env, "VIA": "overmind", "SEED": "5"})
        assert got["ran"] == ran
        assert (got["digests"], got["next"]) == (seeded_plain["digests"], seeded_plain["next"])


def test_a_loader_that_seeds_leaves_the_process_seeded_as_plain_does(tmp_path, overmind_runtime):
    """The generator is unseeded before the call and seeded after it: no entry can serve both, so the call runs as
    plain and the process draws afterwards what the plain process draws."""
    plain, got, entries = _unseeded_runs(tmp_path, overmind_runtime, "load_net_seeded_inside", 2)
    assert [g["ran"] for g in got] == [1, 1]
    assert all((g["digests"], g["next"]) == (plain["digests"], plain["next"]) for g in got)
    assert entries == 0
