"""A loader that changes a module it is given (PEFT's ``PeftModel.from_pretrained(base, lora)``): a hit leaves the
caller's module as the plain call leaves it (``loading/writes/arguments.py``).

Each process builds the base module itself, then calls the loader: plainly, then through ``overmind.load`` in three
fresh processes against one server. Every process reports what its base looks like afterwards (which module is
where, which holds the original, gradient flags, attributes, hooks, the output) and the result's output; the second
and third must not run the loader.
"""
from __future__ import annotations

from _support import pythonpath_env
from overmind.testing import run_fresh

SCRIPT = """
import hashlib, os
import overmind
overmind.activate()
import torch
from overmind.testing import recorded_calls, report
from _support import argument_loaders as al
PATH = os.environ["CKPT"]
base = al.build_base(PATH)
fc = base.fc
fn = getattr(al, os.environ["LOADER"])
adapted = overmind.load(fn, base, PATH) if os.environ.get("VIA") == "overmind" else fn(base, PATH)
with torch.no_grad():
    out = adapted(torch.arange(8.0).view(2, 4))
report({"out": hashlib.sha256(out.numpy().tobytes()).hexdigest(),
        "modules": [(n, type(m).__name__) for n, m in base.named_modules()],
        "holds_original": getattr(base.fc, "inner", None) is fc, "wraps_base": adapted.base is base,
        "grads": [(n, p.requires_grad) for n, p in base.named_parameters()],
        "attrs": sorted(k for k in vars(base) if not k.startswith("_")), "hooks": len(base.head._forward_hooks),
        "ran": len(recorded_calls("argument_loaders"))})
"""


def _runs(tmp_path, runtime, loader, n):
    from _support.argument_loaders import save

    env = {"PYTHONPATH": pythonpath_env(), "CKPT": save(str(tmp_path / "ckpt.pt")), "OVERMIND_RUNTIME_DIR": runtime,
           "LOADER": loader}
    plain = run_fresh(SCRIPT, env={**env, "VIA": "plain"})
    return plain, [run_fresh(SCRIPT, env={**env, "VIA": "overmind"}) for _ in range(n)]


def test_a_hit_changes_the_callers_module_as_the_plain_call_does(tmp_path, overmind_runtime):
    plain, got = _runs(tmp_path, overmind_runtime, "adapt", 3)
    assert plain["holds_original"] and plain["wraps_base"] and plain["hooks"] == 1
    assert [g.pop("ran") for g in got] == [1, 0, 0]
    plain.pop("ran")
    assert got == [plain] * 3


def test_a_loader_that_changes_an_arguments_values_is_not_cached(tmp_path, overmind_runtime):
    plain, got = _runs(tmp_path, overmind_runtime, "scale_in_place", 2)
    assert [g.pop("ran") for g in got] == [1, 1]
    plain.pop("ran")
    assert got == [plain] * 2
