"""overmind.load across fresh processes: zero-copy hits, copy-on-write isolation, stale files, key rules.

Every test runs against a private server, on both zero-copy implementations (the compiled ``overmind.native._C``
and its pure-Python twin: the ``impl`` fixture; the fresh processes inherit its ``OVERMIND_ZEROCOPY``).
"""
from __future__ import annotations

import os

import pytest
import torch

from overmind.testing import run_fresh

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

BUILD = '''
import os, torch
def build(path, scale=1.0):
    with open(os.environ["LOAD_LOG"], "a") as f:
        f.write("load\\n")
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        m.register_buffer("table", torch.load(path))
        with torch.no_grad():
            m[0].weight.mul_(scale)
        return m
'''


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "table.pt"
    torch.save(torch.arange(1000, dtype=torch.float32), path)
    return str(path)


@pytest.fixture
def load_log(tmp_path, monkeypatch):
    log = tmp_path / "loads.log"
    log.touch()
    monkeypatch.setenv("LOAD_LOG", str(log))
    return lambda: log.read_text().count("load")


def _client_script(body: str) -> str:
    return BUILD + '''
import overmind
from overmind.testing import report, overmind_mapped
''' + body


def test_second_process_maps_shared_memory_zero_copy(overmind_runtime, weights, load_log, impl):
    env = {"OVERMIND_ZEROCOPY": impl, "OVERMIND_STRICT": "1"}
    script = _client_script(f'''
m = overmind.load(build, {weights!r})
x = torch.linspace(-1, 1, 64).unsqueeze(0)
report({{
    "out": m(x).tolist(),
    "mapped": [overmind_mapped(t.data_ptr()) for t in list(m.parameters()) + list(m.buffers())],
    "table_sum": float(m.table.sum()),
    "impl": __import__("overmind.native.zerocopy", fromlist=["x"]).IMPLEMENTATION,
}})
''')
    first = run_fresh(script, env=env)
    second = run_fresh(script, env=env)
    assert load_log() == 1, "the loader must run once, in the first process only"
    assert second["impl"] == impl
    assert all(second["mapped"]) and all(first["mapped"])
    ns: dict = {}
    os.environ["LOAD_LOG"] = os.devnull
    exec(BUILD, ns)
    plain = ns["build"](weights)
    expected = plain(torch.linspace(-1, 1, 64).unsqueeze(0)).tolist()
    assert second["out"] == expected and first["out"] == expected
    assert second["table_sum"] == float(torch.arange(1000, dtype=torch.float32).sum())


def test_in_place_writes_stay_private(overmind_runtime, weights, load_log):
    writer = _client_script(f'''
a = overmind.load(build, {weights!r})
with torch.no_grad():
    for p in a.parameters():
        p.add_(1000.0)
    a.table.zero_()
a.load_state_dict({{k: torch.zeros_like(v) for k, v in a.state_dict().items()}})
b = overmind.load(build, {weights!r})    # the same process again: an independent object
report({{"a_sum": float(a.table.sum()), "b_sum": float(b.table.sum()), "b_w": float(b[0].weight.sum())}})
''')
    reader = _client_script(f'''
m = overmind.load(build, {weights!r})
report({{"sum": float(m.table.sum()), "w": float(m[0].weight.sum())}})
''')
    w = run_fresh(writer, env={"OVERMIND_STRICT": "1"})
    r = run_fresh(reader, env={"OVERMIND_STRICT": "1"})
    table_sum = float(torch.arange(1000, dtype=torch.float32).sum())
    assert w["a_sum"] == 0.0
    assert w["b_sum"] == table_sum and r["sum"] == table_sum
    assert r["w"] == pytest.approx(w["b_w"])
    assert load_log() == 1


def test_changed_checkpoint_is_loaded_fresh(overmind_runtime, weights, load_log):
    script = _client_script(f'''
m = overmind.load(build, {weights!r})
report(float(m.table.sum()))
''')
    assert run_fresh(script) == float(torch.arange(1000, dtype=torch.float32).sum())
    torch.save(torch.ones(1000), weights)  # overwrite in place: same path, new bytes
    assert run_fresh(script) == 1000.0
    assert run_fresh(script) == 1000.0
    assert load_log() == 2


def test_keyword_order_and_explicit_defaults_share_an_entry(overmind_runtime, weights, load_log):
    script = _client_script(f'''
a = overmind.load(build, {weights!r})
b = overmind.load(build, path={weights!r}, scale=1.0)
c = overmind.load(build, scale=1.0, path={weights!r})
d = overmind.load(build, {weights!r}, 2.0)
report([float(x[0].weight.sum()) for x in (a, b, c, d)])
''')
    sums = run_fresh(script)
    assert sums[0] == sums[1] == sums[2]
    assert sums[3] == pytest.approx(2 * sums[0])
    assert load_log() == 2  # scale=1.0 (three spellings) and scale=2.0


def test_sibling_classes_sharing_a_classmethod_do_not_collide(overmind_runtime, weights, tmp_path):
    log = tmp_path / "fixture.log"
    script = f'''
import overmind
from overmind.testing import report
from overmind_fixture_adapter.lib import Model, SpecialModel
a = overmind.load(Model.from_pretrained, {weights!r})
b = overmind.load(SpecialModel.from_pretrained, {weights!r})
report([type(a).__name__, type(b).__name__])
'''
    env = {"FIXTURE_LOAD_LOG": str(log), "OVERMIND_STRICT": "1"}
    assert run_fresh(script, env=env) == ["Model", "SpecialModel"]
    assert run_fresh(script, env=env) == ["Model", "SpecialModel"]
    assert log.read_text().split().count("Model") == 1
    assert log.read_text().split().count("SpecialModel") == 1


def test_concurrent_first_loads_run_the_loader_once(overmind_runtime, weights, load_log):
    import subprocess
    import sys

    script = _client_script(f'''
import time
m = overmind.load(build, {weights!r})
report(float(m.table.sum()))
''').replace("    return m\n", "    time.sleep(1.0)\n    return m\n", 1).replace("import os, torch", "import os, time, torch")
    path = os.path.join(overmind_runtime, "om_concurrent_load.py")
    with open(path, "w") as f:
        f.write(script)
    procs = [subprocess.Popen([sys.executable, path], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OVERMIND_STRICT": "1"}) for _ in range(6)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert load_log() == 1
