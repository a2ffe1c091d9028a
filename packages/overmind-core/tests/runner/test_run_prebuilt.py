"""Objects an ``overmind run`` template builds ahead (``runner/prebuild.py``): a child's hit that takes one is
indistinguishable from a fresh hit in a plain ``python`` process (values, classes, dtypes, a new object per call,
the random generators afterwards, the loader's warnings), an entry that changed or left the server is never
served from the template, and what a child could not take ready-made is left out, saying why. The pages the first
taking program of a generation copied are copied ahead by the next spares (``runner/page_copies.py``). Real template,
server, processes and a tiny BERT saved to disk; the template preloads torch and transformers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _support import run_support as rs
from _support import tiny_models
from _support.snippets import SAID

PRELOAD = "torch,transformers"

LOAD = """
import glob, os

def pages_ahead():
    # of the pages the first program of this generation recorded (runner/page_copies.py) that lie in this process's
    # anonymous mappings as it starts (the rest are in mappings that program made later), the share this process
    # holds its own copy of, before its imports: the spare copied them ahead
    from overmind.runner import page_copies
    runs = [r for p in glob.glob(os.path.join(os.environ.get("OVERMIND_RUNTIME_DIR", "/nonexistent"), "templates", "*.pages"))
            for r in page_copies.read(p)]
    if not runs:
        return None
    runs = page_copies._within(runs, page_copies.regions())
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    own = sum(sum(1 for b in os.pread(fd, n * 8, first * 8)[7::8] if b & 0x80 and b & 0x01) for first, n in runs)
    os.close(fd)
    return {"share": own / max(1, sum(n for _, n in runs)), "pages": sum(n for _, n in runs)}

pages_at_start = pages_ahead()
import hashlib, json, logging, sys, warnings
import overmind
overmind.activate()
import torch
from transformers import BertModel

""" + SAID + """
def digest(model):
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode()); h.update(str(t.dtype).encode()); h.update(t.float().numpy().tobytes())
    return h.hexdigest()

def warns(size):
    warnings.warn("a loader's own warning", FutureWarning)
    return {"weights": torch.ones(size)}

def draws(size):  # a loader that draws: its entry is the variant of the generator's state before the call
    return {"weights": torch.rand(size)}

from overmind.adapters.patching import routed_classmethods
from overmind.keys.key import _signatures, describe_loader
# whether BertModel.from_pretrained's signature was read before this program's first load (the spare's warm-up)
described_ahead = [describe_loader(fn).func in _signatures for fn in routed_classmethods(BertModel)]
torch.manual_seed(7)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = BertModel.from_pretrained(sys.argv[1], torch_dtype=torch.float16)
    warned = overmind.load(warns, 3)
    drawn = overmind.load(draws, 4)
after = torch.rand(3).tolist()
second = BertModel.from_pretrained(sys.argv[1], torch_dtype=torch.float16)
print(json.dumps({
    "digest": digest(first), "class": type(first).__qualname__, "dtype": str(first.dtype),
    "config": first.config.to_dict()["hidden_act"], "after": after, "drawn": drawn["weights"].tolist(),
    "warned": warned["weights"].tolist(),
    "warnings": sorted(f"{w.category.__name__}: {w.message}" for w in caught),
    "second_is_new": second is not first and digest(second) == digest(first),
    "ahead": sum("built ahead by the template" in m for m in said),
    "bert_ahead": sum("built ahead by the template" in m and "BertModel" in m for m in said),
    "hits": sum(m.startswith("hit ") for m in said),
    "pid": __import__("os").getpid(), "described_ahead": described_ahead, "pages_ahead": pages_at_start,
}))
"""


@pytest.fixture(scope="module")
def rt():
    with rs.shared_runtime() as path:
        yield path


def _log(rt: str) -> str:
    try:
        with open(os.path.join(rt, "templates", "templates.log")) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _served(rt, script, model, **extra) -> dict:
    out = rs.run([script, model], rt, env_extra={"OVERMIND_PRELOAD": PRELOAD, **extra})
    assert out.returncode == 0 and not rs.warnings_in(out.stderr), out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def _plain(rt, script, model) -> dict:
    out = subprocess.run([sys.executable, script, model], capture_output=True, text=True, timeout=240,
                         env=rs.env(rt))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def _built(rt: str, count: int) -> None:
    rs.wait_for(lambda: _log(rt).count("objects built ahead: built ") >= count, what="the template to build ahead")


def _bert_builds(rt: str) -> int:
    return sum("objects built ahead: built " in line and "BertModel" in line for line in _log(rt).splitlines())


def test_a_child_takes_the_object_built_ahead_and_it_is_a_fresh_hits_object(rt, tmp_path):
    model = str(tiny_models.build_bert(tmp_path / "bert", seed=3))
    script = rs.write(str(tmp_path), "load.py", LOAD)
    published = _served(rt, script, model)  # the misses publish; the template builds the entries ahead after
    assert published["ahead"] == 0
    _built(rt, 3)
    served = _served(rt, script, model)
    assert served["ahead"] == 3 and served["hits"] == 4, "the first calls took the objects, the second BERT rebuilt"
    fresh = _plain(rt, script, model)  # a fresh python process's hits of the same entries
    assert fresh["ahead"] == 0 and fresh["hits"] == 4
    for field in ("digest", "class", "dtype", "config", "after", "drawn", "warned", "warnings", "second_is_new"):
        assert served[field] == fresh[field] == published[field], field
    assert served["second_is_new"]
    assert "FutureWarning: a loader's own warning" in served["warnings"], "the loader's warning is issued again"
    assert served["described_ahead"] == [True] and fresh["described_ahead"] == [False], \
        "the spare described the loader of the object built ahead; a fresh process describes it at its first load"
    again = _served(rt, script, model)
    assert again["ahead"] == 3 and again["pid"] != served["pid"], "every child takes its own copy"


def _records(rt: str) -> list[str]:
    return sorted(name for name in os.listdir(os.path.join(rt, "templates")) if name.endswith(".pages"))


def test_the_next_spares_copy_ahead_the_pages_the_first_taking_program_copied(rt, tmp_path):
    model = str(tiny_models.build_bert(tmp_path / "bert", seed=5))
    script = rs.write(str(tmp_path), "load.py", LOAD)
    builds = _bert_builds(rt)
    _served(rt, script, model)  # misses: nothing taken, nothing recorded
    rs.wait_for(lambda: _bert_builds(rt) > builds, what="the template to build the BERT ahead")
    assert _records(rt) == [], "a new generation starts without a record"
    first = _served(rt, script, model)
    assert first["ahead"] == 3 and first["pages_ahead"] is None
    rs.wait_for(lambda: _records(rt), what="the first taking program's record")
    rs.run(["-c", "pass"], rt, env_extra={"OVERMIND_PRELOAD": PRELOAD})  # takes the spare forked before the record
    spare = rs.wait_for_spare(rt)  # its copying done: a request that came first would stop it halfway
    later = _served(rt, script, model)
    assert later["pid"] == spare
    assert later["ahead"] == 3
    assert later["digest"] == first["digest"] and later["after"] == first["after"]
    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    if release < (5, 14):
        pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14: a spare copies nothing ahead here")
    assert later["pages_ahead"]["pages"] > 500, "the loads copied pages of the mappings the template has"
    assert later["pages_ahead"]["share"] > 0.9, "the spare it ran in copied the recorded pages before the program started"


def test_a_changed_checkpoint_and_an_evicted_entry_are_never_served_from_the_template(rt, tmp_path):
    model = tiny_models.build_bert(tmp_path / "bert", seed=4)
    script = rs.write(str(tmp_path), "load.py", LOAD)
    before = _bert_builds(rt)
    _served(rt, script, str(model))
    rs.wait_for(lambda: _bert_builds(rt) > before, what="the template to build the BERT ahead")
    tiny_models.build_bert(model, seed=5)  # other weights, same folder
    changed = _served(rt, script, str(model))
    assert changed["bert_ahead"] == 0, "the BERT whose checkpoint changed is loaded again, never taken ahead"
    assert changed["digest"] == _plain(rt, script, str(model))["digest"]

    subprocess.run([rs.OVERMIND, "evict", "--all"], env=rs.env(rt), check=True, capture_output=True, timeout=60)
    rs.wait_for(lambda: "objects built ahead: dropped" in _log(rt), what="the template to drop what was evicted")
    republished = _served(rt, script, str(model))
    assert republished["ahead"] == 0 and republished["hits"] == 1  # misses, then a hit of the new BERT entry
    assert republished["digest"] == changed["digest"]


USES_ARGUMENTS = """
import json, logging, sys
import overmind
overmind.activate()
import torch

""" + SAID + """
def attach(model, parts, size):
    return {"model": model, "parts": [parts[1], parts[0]], "extra": torch.ones(size)}

def paired(model, size):
    return (model, torch.ones(size))  # a tuple: the caller's object cannot be put back into a built one

torch.manual_seed(0)  # the same weights in every run: the same key
model, a, b = torch.nn.Linear(2, 2), torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
out = overmind.load(attach, model, [a, b], 5)
pair = overmind.load(paired, model, 4)
other = torch.nn.Linear(2, 2)
with torch.no_grad():
    other.weight.copy_(model.weight); other.bias.copy_(model.bias)
again = overmind.load(attach, other, [a, b], 5)  # equal arguments, other objects: the call's own come back
print(json.dumps({"same": out["model"] is model and out["parts"][0] is b and out["parts"][1] is a,
                  "again": again["model"] is other and again["model"] is not model,
                  "pair": pair[0] is model, "extra": out["extra"].tolist(),
                  "ahead": sum("built ahead by the template" in m for m in said)}))
"""


def test_a_result_holding_the_calls_arguments_gets_the_taking_calls_own_objects(rt, tmp_path):
    script = rs.write(str(tmp_path), "attach.py", USES_ARGUMENTS)
    before = _log(rt).count("objects built ahead: built ")
    first = rs.run([script], rt, env_extra={"OVERMIND_PRELOAD": PRELOAD})
    assert first.returncode == 0, first.stderr
    _built(rt, before + 1)
    rs.wait_for(lambda: "held by a tuple" in _log(rt), what="the template to leave the tuple out, saying why")
    out = rs.run([script], rt, env_extra={"OVERMIND_PRELOAD": PRELOAD})
    assert out.returncode == 0 and not rs.warnings_in(out.stderr), out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got == {"same": True, "again": True, "pair": True, "extra": [1.0] * 5, "ahead": 1}, got


CUSTOM = """
import json, sys
import overmind
overmind.activate()
sys.path.insert(0, sys.argv[1])
import custom_model  # the user's own module, beside the script: never imported into a template
import torch

torch.manual_seed(0)  # Custom() draws its initial weights: seeded, the call is cached (a variant of that state)
out = overmind.load(custom_model.build, 3)
print(json.dumps({"class": type(out).__module__ + "." + type(out).__qualname__, "sum": float(out.weight.sum())}))
"""

MODULE = """
import torch

class Custom(torch.nn.Linear):
    pass

def build(size):
    layer = Custom(size, size)
    with torch.no_grad():
        layer.weight.fill_(SCALE)
    return layer

SCALE = 1.0
"""


def test_an_entry_whose_rebuild_imports_the_users_own_code_is_left_out(rt, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    rs.write(str(code), "custom_model.py", MODULE)
    script = rs.write(str(tmp_path), "custom.py", CUSTOM)
    # the project's folder on PYTHONPATH: the template could import custom_model, and must not
    extra = {"OVERMIND_PRELOAD": PRELOAD, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(code), os.environ.get("PYTHONPATH"))))}
    for _ in range(2):
        out = rs.run([script, str(code)], rt, env_extra=extra)
        assert out.returncode == 0 and not rs.warnings_in(out.stderr), out.stderr
    rs.wait_for(lambda: "custom_model, code of the user's own" in _log(rt), what="the template to say why")
    rs.write(str(code), "custom_model.py", MODULE.replace("SCALE = 1.0", "SCALE = 2.0"))
    out = rs.run([script, str(code)], rt, env_extra=extra)
    assert json.loads(out.stdout.splitlines()[-1]) == {"class": "custom_model.Custom", "sum": 18.0}
