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


def test_an_unseeded_process_runs_the_drawing_loader_as_plain_and_publishes_nothing(tmp_path, overmind_runtime):
    """torch seeded its generator from the OS: no other process starts from that state, so no variant is made."""
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
