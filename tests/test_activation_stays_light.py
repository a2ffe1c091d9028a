"""``import overmind; overmind.activate()`` stays cheap: a fresh process with every shipped adapter
installed imports none of the modules that made it slow. Not timed (benchmarks/probes/activate.py times it): a module
list, so that a slow import cannot creep back unnoticed."""
from __future__ import annotations

from _support import without_test_plugins
from _support.adapter_packages import adapters_with_their_libraries
from overmind.testing import run_fresh

# What activation could import, and what its heavier neighbours would bring in: each costs milliseconds. The
# version checks read the adapters' metadata themselves (overmind._util.distributions, overmind.adapters.requirements); the rest
# is imported by the load path, at the first load.
SLOW = (
    "packaging",            # requirement and version parsing: overmind.adapters.requirements does the plain shapes
    "importlib.metadata",   # with email, zipfile, csv: overmind._util.distributions reads the dist-info folders
    "email", "zipfile", "csv", "tempfile",
    "importlib.abc", "importlib.resources",  # a post-import hook needs no ABC (overmind.adapters.importwatch)
    "json", "pickle", "hashlib", "ctypes",   # the adapters' reducers and key hooks, imported when they run
    "logging",              # with traceback, string, weakref: overmind._util.lazy_logger imports it on the first record
    "pluggy",               # with its TypedDicts: the plugin manager is made at the first hook call
    "inspect", "dataclasses",  # with ast, dis, tokenize: hookspecs reads code objects, frozen.Frozen
    "overmind.keys.key", "overmind.keys.canon", "overmind.loading.flow", "overmind.client.connection", "overmind.entries.pickling",
)
HEAVY = ("torch", "numpy", "transformers", "diffusers", "bitsandbytes", "safetensors", "huggingface_hub",
         "accelerate", "sfast", "tokenizers", "sentence_transformers", "PIL", "scipy", "timm", "torchvision")


def test_activate_in_a_fresh_process_imports_none_of_the_slow_modules():
    out = run_fresh('''
        import sys
        before = set(sys.modules)
        import overmind
        names = overmind.activate()
        new = sorted(set(sys.modules) - before)
        from overmind.testing import report
        report({"names": sorted(names), "new": new})
    ''', env={"PYTHONPATH": without_test_plugins().get("PYTHONPATH", "")})  # a user's view: no test-only adapter
    assert adapters_with_their_libraries() <= set(out["names"]), out["names"]
    slow = [m for m in out["new"] if m in SLOW or m.split(".")[0] in SLOW or m.split(".")[0] in HEAVY]
    assert not slow, (f"activate() now imports {slow}: import them late (inside the function that needs them), "
                      f"see benchmarks/probes/activate.py for what each costs")


def test_activate_creates_no_dataclass():
    """A dataclass compiles its methods when it is created (~1 ms each here); the records activation builds are
    ``overmind._util.frozen.Frozen`` or plain classes."""
    out = run_fresh('''
        import dataclasses
        made = []
        real = dataclasses._process_class
        def counting(cls, *args, **kwargs):
            made.append(cls.__module__ + "." + cls.__qualname__)
            return real(cls, *args, **kwargs)
        dataclasses._process_class = counting
        import overmind
        overmind.activate()
        by_activation = list(made)  # (overmind.testing imports pytest, which makes dataclasses of its own)
        from overmind.testing import report
        report(by_activation)
    ''', env={"PYTHONPATH": without_test_plugins().get("PYTHONPATH", "")})
    assert out == [], (
        f"activate() now creates the dataclasses {out}: make them overmind._util.frozen.Frozen subclasses or plain classes")


def test_the_plugin_manager_is_made_at_the_first_hook_call_with_every_adapter_in_discovery_order():
    out = run_fresh('''
        import sys
        import overmind
        from overmind.adapters import discovery, hooks
        names = overmind.activate()
        before = [discovery._manager is None, "pluggy" in sys.modules]
        hooks.key_parts(None, {})  # a hook every process runs
        registered = [n for n, _ in discovery.get_manager().list_name_plugin()]
        from overmind.testing import report
        report({"names": names, "before": before, "registered": registered,
                "order": [n for n, s in discovery.states().items() if s.status == "loaded"]})
    ''', env={"PYTHONPATH": without_test_plugins().get("PYTHONPATH", "")})
    assert out["before"] == [True, False], out
    assert out["registered"] == out["order"] and set(out["names"]) <= set(out["registered"]), out
