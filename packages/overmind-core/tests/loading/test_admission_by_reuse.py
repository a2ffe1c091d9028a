"""Admission by reuse across fresh processes (``OVERMIND_ADMIT=reuse``, what a user gets by default): a first load
returns the plain result and publishes nothing but a mark, a second publishes, a third hits; a load that arrives
while the first runs waits and hits, so eight processes started together run the loader once; ``OVERMIND_ADMIT=first``,
``admit="first"``, ``overmind.admitting`` and ``overmind warm`` publish on the first load; a loader whose publish is
cheap against its own time publishes at once.

The loaders count their runs in a file; ``CHEAP_PUBLISH_SHARE = 0`` in a child turns the cheap-publish rule off
where a test is about reuse alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from overmind.client.connection import Client
from overmind.testing import run_fresh

LOADERS = '''
import os, time, torch
def build(path, pause=0.0, waiters=0):
    with open(os.environ["LOAD_LOG"], "a") as f:
        f.write("load\\n")
    time.sleep(pause)
    if waiters:  # hold the claim until that many other processes wait on it
        from overmind.client.connection import Client
        deadline = time.monotonic() + 120
        while Client(autostart=False).status()["waiting"] < waiters and time.monotonic() < deadline:
            time.sleep(0.02)
    return {"weights": torch.load(path), "name": "net"}
'''

CALLER = '''
import json, sys, torch
sys.path.insert(0, {folder!r})
import overmind
from overmind.loading import admission_by_reuse
from overmind.testing import overmind_mapped, report
import loaders
{before}
out = overmind.load(loaders.build, {path!r}{extra})
report({{"equal": torch.equal(out["weights"], torch.load({path!r})), "name": out["name"],
         "mapped": overmind_mapped(out["weights"].data_ptr())}})
'''


@pytest.fixture
def setup(tmp_path, monkeypatch, overmind_runtime):
    (tmp_path / "loaders.py").write_text(LOADERS)
    path = tmp_path / "weights.pt"
    torch.save(torch.randn(256, 256, generator=torch.Generator().manual_seed(1)), path)
    log = tmp_path / "loads.log"
    log.touch()
    monkeypatch.setenv("LOAD_LOG", str(log))
    monkeypatch.setenv("OVERMIND_ADMIT", "reuse")

    class Setup:
        folder, weights = str(tmp_path), str(path)

        @staticmethod
        def loads() -> int:
            return log.read_text().count("load")

        @staticmethod
        def script(before: str = "admission_by_reuse.CHEAP_PUBLISH_SHARE = 0.0", extra: str = "") -> str:
            return CALLER.format(folder=str(tmp_path), path=str(path), before=before, extra=extra)

    return Setup


def _status() -> dict:
    return Client(autostart=False).status()


def _overmind(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "overmind", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_first_load_marks_second_publishes_third_hits(setup):
    first = run_fresh(setup.script())
    assert first == {"equal": True, "name": "net", "mapped": False}  # the loader's own result
    st = _status()
    assert (st["publishes"], st["marks"], st["entries"], setup.loads()) == (0, 1, 0, 1)
    listed = _overmind("ls").stdout
    assert "loaded once, not cached (1 key)" in listed and "loaders.build" in listed, listed
    assert "1 key loaded once, not cached" in _overmind("status").stdout

    second = run_fresh(setup.script())
    assert second == {"equal": True, "name": "net", "mapped": True}  # published, and rebuilt from its entry
    st = _status()
    assert (st["publishes"], st["marks"], st["hits"], setup.loads()) == (1, 0, 0, 2)

    third = run_fresh(setup.script())
    assert third == {"equal": True, "name": "net", "mapped": True}
    st = _status()
    assert (st["publishes"], st["hits"], setup.loads()) == (1, 1, 2)


def test_eight_processes_started_together_run_the_loader_once(setup, tmp_path):
    go = tmp_path / "go"
    # Each process is ready (torch and overmind imported) before any loads; the first loader holds its claim until
    # the other seven wait on it (waiters=7), so every one of them arrives while the first load runs.
    script = setup.script(before=f"""
admission_by_reuse.CHEAP_PUBLISH_SHARE = 0.0
import os, time
while not os.path.exists({str(go)!r}):
    time.sleep(0.01)""", extra=", waiters=7")
    path = tmp_path / "caller.py"
    path.write_text(script)
    Client().status()  # the server is up before eight processes race to start it
    procs = [subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    time.sleep(1.0)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    reports = [json.loads(o[0].split("OVERMIND-RESULT:")[-1]) for o in outs]
    assert all(r["equal"] and r["mapped"] for r in reports), reports
    st = _status()
    assert (setup.loads(), st["publishes"], st["hits"], st["marks"]) == (1, 1, 7, 0), st


@pytest.mark.parametrize("how", ["setting", "argument", "block"])
def test_admit_first_publishes_on_the_first_load(setup, how):
    env = {"OVERMIND_ADMIT": "first"} if how == "setting" else {}
    before = "with overmind.admitting('first'):\n    pass" if how == "block" else ""
    extra = ", admit='first'" if how == "argument" else ""
    script = setup.script(before=before, extra=extra)
    if how == "block":
        script = script.replace("out = overmind.load(", "with overmind.admitting('first'):\n    out = overmind.load(")
    first = run_fresh(script, env=env)
    assert first == {"equal": True, "name": "net", "mapped": True}
    st = _status()
    assert (st["publishes"], st["marks"], setup.loads()) == (1, 0, 1)
    assert run_fresh(setup.script())["mapped"] and _status()["hits"] == 1 and setup.loads() == 1


def test_admit_reuse_at_the_call_keeps_the_default_whatever_the_setting(setup):
    run_fresh(setup.script(extra=", admit='reuse'"), env={"OVERMIND_ADMIT": "first"})
    st = _status()
    assert (st["publishes"], st["marks"]) == (0, 1)


def test_a_bad_admit_names_the_policies(setup):
    out = run_fresh(setup.script(extra=", admit='sometimes'"), check=False)
    assert out["returncode"] != 0
    assert "admit='sometimes' is not a policy; give admit='first'" in out["stderr"], out["stderr"][-2000:]
    assert setup.loads() == 0


def test_overmind_warm_runs_the_program_publishing_on_first_load(setup, tmp_path):
    program = tmp_path / "program.py"
    program.write_text(setup.script() + "\nraise SystemExit(3)\n")
    done = _overmind("warm", "--", sys.executable, str(program))
    assert done.returncode == 3, done.stderr[-2000:]  # exits as its program does
    assert '"mapped": true' in done.stdout
    assert (_status()["publishes"], setup.loads()) == (1, 1)
    usage = _overmind("warm")
    assert usage.returncode == 2 and "name the program to run after '--'" in usage.stderr


def test_a_loader_much_slower_than_its_publish_publishes_on_its_first_load(setup):
    # 1.5 s for a 256 KiB result: publishing it costs well under 5% of that
    first = run_fresh(setup.script(before="", extra=", pause=1.5"))
    assert first == {"equal": True, "name": "net", "mapped": True}
    assert (_status()["publishes"], setup.loads()) == (1, 1)
    assert run_fresh(setup.script(before="", extra=", pause=1.5"))["mapped"] and setup.loads() == 1


def test_a_thread_that_waits_on_another_threads_first_load_counts_as_reuse(setup):
    # No server runs: the first thread starts one that holds the key's claim for it; the second waits on that thread
    script = f"""
import sys, threading, time, torch
sys.path.insert(0, {setup.folder!r})
import overmind
from overmind.loading import admission_by_reuse
from overmind.testing import overmind_mapped, report
import loaders
admission_by_reuse.CHEAP_PUBLISH_SHARE = 0.0
got = {{}}
def load(name):
    got[name] = overmind.load(loaders.build, {setup.weights!r}, pause=1.0)
threads = [threading.Thread(target=load, args=(n,)) for n in ("a", "b")]
threads[0].start()
time.sleep(0.3)
threads[1].start()
for t in threads:
    t.join()
report([torch.equal(got[n]["weights"], torch.load({setup.weights!r})) and overmind_mapped(got[n]["weights"].data_ptr())
        for n in ("a", "b")])
"""
    assert run_fresh(script) == [True, True]
    st = _status()
    assert (setup.loads(), st["publishes"], st["marks"]) == (1, 1, 0), st
