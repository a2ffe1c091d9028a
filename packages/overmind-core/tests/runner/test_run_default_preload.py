"""``overmind run`` with the real default preload list (torch and the installed adapters' libraries): the
program finds torch, diffusers and transformers imported and Overmind active, CUDA untouched, and fresh
random state in every run (a forked child would otherwise draw the template's numbers), like plain python.
One template for the module: its imports take seconds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _support import run_support as rs

SCRIPT = """
import json, os, random, sys
preloaded = {m: m in sys.modules for m in ("torch", "diffusers", "transformers", "numpy")}
import numpy, torch
from overmind.adapters.discovery import states
print(json.dumps({
    "preloaded": preloaded, "ppid": os.getppid(), "cuda_initialized": torch.cuda.is_initialized(),
    "torch": torch.randn(4).tolist(), "numpy": numpy.random.rand(4).tolist(), "random": random.random(),
    "initial_seed": torch.initial_seed(),
    "adapters": sorted(n for n, s in states().items() if s.status == "loaded" and s.targets),
}))
"""


@pytest.fixture(scope="module")
def rt():
    with rs.shared_runtime() as path:
        yield path


def _run(rt, tmp_path) -> dict:
    script = rs.write(str(tmp_path), "prog.py", SCRIPT)
    extra = {"OVERMIND_DISABLED_ADAPTERS": "fixture,fixture_broken"}
    env = {k: v for k, v in rs.env(rt, **extra).items() if k != "OVERMIND_PRELOAD"}
    out = subprocess.run([rs.OVERMIND, "run", script], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and not rs.warnings_in(out.stderr), out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_the_default_preload_imports_the_libraries_and_activates(rt, tmp_path):
    got = _run(rt, tmp_path)
    assert got["preloaded"] == {"torch": True, "diffusers": True, "transformers": True, "numpy": True}
    assert got["ppid"] in [t["pid"] for t in rs.templates(rt)]
    assert not got["cuda_initialized"]
    assert {"diffusers", "transformers"} <= set(got["adapters"])
    (template,) = rs.templates(rt)
    assert "torch" in template["preloaded"] and "diffusers:StableDiffusionControlNetPipeline" in template["preloaded"]
    assert template["threads"] == 1


def test_every_run_draws_fresh_random_numbers(rt, tmp_path):
    # Only two runs forked by one template prove anything. A template stops serving when a module it imported
    # changes on disk, which a test running beside this one can cause (CI once saw the pair forked by two
    # templates); then the pair is drawn again.
    for _attempt in range(3):
        a, b = _run(rt, tmp_path), _run(rt, tmp_path)
        if a["ppid"] == b["ppid"]:
            break
    assert a["ppid"] == b["ppid"], "no two runs in a row were forked by the same template"
    for generator in ("torch", "numpy", "random", "initial_seed"):
        assert a[generator] != b[generator], generator


BLAS = """
import hashlib, json, os
tasks_at_start = len(os.listdir("/proc/self/task"))
import numpy
from threadpoolctl import threadpool_info
numpy_blas = [(i["internal_api"], i["num_threads"]) for i in threadpool_info()
              if i["internal_api"] == "openblas" and "numpy" in i["filepath"]]
a = numpy.arange(90000, dtype=numpy.float64).reshape(300, 300) / 7.0
product = a @ a.T  # large enough for OpenBLAS to use its threads
print(json.dumps({"start": tasks_at_start, "blas": numpy_blas, "after": len(os.listdir("/proc/self/task")),
                  "product": hashlib.sha256(product.tobytes()).hexdigest()}))
"""


def _one_cpu() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


# The spare sets OpenBLAS's usual count (all CPUs, no variable) ahead; a caller whose variables or CPUs give
# another count gets that one.
@pytest.mark.parametrize("caller", ["usual", "OPENBLAS_NUM_THREADS=1", "one CPU"])
def test_openblas_has_plain_pythons_thread_count_and_starts_its_workers_at_the_first_call(rt, tmp_path, caller):
    script = rs.write(str(tmp_path), "blas.py", BLAS)
    extra = {"OVERMIND_DISABLED_ADAPTERS": "fixture,fixture_broken"}
    if caller == "OPENBLAS_NUM_THREADS=1":
        extra["OPENBLAS_NUM_THREADS"] = "1"
    env = {k: v for k, v in rs.env(rt, **extra).items() if k != "OVERMIND_PRELOAD"}
    how = {"preexec_fn": _one_cpu} if caller == "one CPU" else {}
    served = subprocess.run([rs.OVERMIND, "run", script], capture_output=True, text=True, env=env, timeout=600, **how)
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=600, **how)
    assert served.returncode == 0 and not rs.warnings_in(served.stderr), served.stderr
    assert plain.returncode == 0, plain.stderr
    served_run, plain_run = (json.loads(out.stdout.splitlines()[-1]) for out in (served, plain))
    assert served_run["blas"] == plain_run["blas"] and served_run["blas"], "the same thread count as plain python"
    assert served_run["product"] == plain_run["product"]
    assert served_run["after"] == plain_run["after"], "the same workers once BLAS ran"
    # no worker spins on a CPU while the program starts: OpenBLAS starts them at its first threaded call
    assert served_run["start"] == 1
