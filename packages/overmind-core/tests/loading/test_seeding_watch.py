"""Whether the program has seeded torch's generator (``loading/draws/seeding.py``), in fresh processes.

One fresh process imports ``overmind`` and then torch, and forks a child per way of seeding: each child seeds its
own way and says what the watch answers; the parent is still unseeded after them all. A process that imports torch
before ``overmind`` counts as seeded from the start.
"""
from __future__ import annotations

from _support import pythonpath_env
from overmind.testing import run_fresh

WAYS = {
    "nothing": "pass",
    "draws only": "torch.rand(100); torch.randn(3, 3)",
    "torch.manual_seed": "torch.manual_seed(3)",
    "a 64-bit seed": "torch.manual_seed(2**40 + 7)",
    "torch.random.manual_seed": "torch.random.manual_seed(2**40 + 7)",
    "torch.seed": "torch.seed()",
    "torch.set_rng_state": "torch.set_rng_state(torch.get_rng_state())",
    "torch.random.fork_rng": "with torch.random.fork_rng():\n        pass",
    "the generator's own manual_seed": "torch.default_generator.manual_seed(2**40 + 7)",
    "the generator's own seed": "torch.default_generator.seed()",
    "the function itself, past its wrapper": "seeding._State.wrapped[('torch', 'manual_seed')](2**40 + 9)",
}

FORKS = """
import json, os
import overmind
import torch
from overmind.loading.draws import seeding
from overmind.testing import report
WAYS = json.loads(os.environ["WAYS"])
answers = {}
for name, code in WAYS.items():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        exec("def way():\\n    " + code + "\\nway()")
        os.write(w, b"1" if seeding.unseeded() else b"0")
        os._exit(0)
    os.close(w)
    answers[name] = os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
originals = [torch.manual_seed, torch.random.set_rng_state, torch.random.fork_rng]
seeding.unwatch()
restored = [torch.manual_seed, torch.random.set_rng_state, torch.random.fork_rng]
report({"answers": answers,
        "wrapped": [getattr(f, "_overmind_seeding", False) for f in originals],
        "restored": [getattr(f, "_overmind_seeding", False) for f in restored],
        "same": torch.manual_seed is torch.random.manual_seed})
"""


def test_the_watch_tells_each_way_of_seeding_from_none():
    import json

    got = run_fresh(FORKS, env={"PYTHONPATH": pythonpath_env(), "WAYS": json.dumps(WAYS)})
    unseeded = {name for name, answer in got["answers"].items() if answer}
    assert unseeded == {"nothing", "draws only"}
    assert got["wrapped"] == [True, True, True] and got["restored"] == [False, False, False]
    assert got["same"]


def test_torch_imported_before_overmind_counts_as_seeded():
    got = run_fresh("import torch\nimport overmind\nfrom overmind.loading.draws import seeding\n"
                    "from overmind.testing import report\nreport([seeding.watching(), seeding.unseeded()])",
                    env={"PYTHONPATH": pythonpath_env()})
    assert got == [True, False]
