"""The adapter kit (``overmind.adapter``): everything it names exists, it imports no library, and its
target specs resolve to each class's own loader plus the imported subclasses overriding it."""
from __future__ import annotations

import subprocess
import sys
import types
import warnings

from overmind import adapter
from overmind.fallback import OvermindWarning
from overmind.keys.key import Unkeyable


def test_every_public_name_exists():
    assert all(hasattr(adapter, name) for name in adapter.__all__)
    import overmind

    assert adapter.hookimpl is overmind.hookimpl
    assert adapter.Uncacheable is Unkeyable
    assert adapter.NotCacheable.has_fix


def test_the_kit_is_a_face_of_imports():
    """``overmind/adapter.py`` holds no machinery: its names live in the parts of the core."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(adapter.__file__).read_text())
    kinds = {type(node).__name__ for node in tree.body} - {"Expr", "ImportFrom", "Assign"}
    assert not kinds, f"overmind/adapter.py defines {kinds}: put it in the part it belongs to"
    assert all(getattr(adapter, name).__module__ != adapter.__name__ for name in adapter.__all__
               if hasattr(getattr(adapter, name), "__module__"))


def test_the_kit_table_of_the_docs_names_the_kit():
    """docs/adapters.md's table of the kit names exactly ``overmind.adapter.__all__``."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[4] / "docs" / "adapters.md").read_text()
    section = text[text.index("## The adapter kit"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {re.match(r"\w+", cell)[0] for row in rows for cell in re.findall(r"`([^`]+)`", row.split(" | ")[0])}
    assert named == set(adapter.__all__), (sorted(named - set(adapter.__all__)),
                                           sorted(set(adapter.__all__) - named))


def test_every_public_exception_and_warning_is_exported_from_overmind():
    import overmind
    from overmind import errors, fallback, inspection
    from overmind.adapters.discovery import AdapterError
    from overmind.adapters.patching import PatchError

    exported = {id(getattr(overmind, name)) for name in overmind.__all__}
    public = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, BaseException)]
    public += [getattr(adapter, name) for name in adapter.__all__
               if isinstance(getattr(adapter, name), type) and issubclass(getattr(adapter, name), BaseException)]
    public += [fallback.OvermindWarning, fallback.CacheBypassed, AdapterError, PatchError, inspection.PrefixError,
               inspection.NoSuchEntry, inspection.AmbiguousPrefix, inspection.EvictUsage]
    assert not [c.__qualname__ for c in public if id(c) not in exported]
    assert overmind.Uncacheable is Unkeyable and overmind.OvermindWarning is OvermindWarning


def test_importing_the_kit_imports_no_library():
    code = ("import sys, overmind.adapter; "
            "print([m for m in ('torch', 'transformers', 'diffusers', 'bitsandbytes') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class Base:
    @classmethod
    def load(cls):
        return cls()


class Inherits(Base):
    pass


class Overrides(Base):
    @classmethod
    def load(cls):
        return super().load()


def test_collect_takes_overriding_subclasses_once_and_warns_about_what_cannot_be_patched(monkeypatch):
    monkeypatch.setitem(sys.modules, "kitlib", types.SimpleNamespace(Base=Base))
    specs = [adapter.Spec("kitlib:Base", "load"), adapter.Spec("kitlib:Base", "load"),
             adapter.Spec("kitlib:Gone", "load"), adapter.Spec("kitlib:Base", "__init__")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        targets = adapter.collect("kitlib", specs)
    assert [(t.owner, t.name, t.kind, t.adapter) for t in targets] == [
        (Base, "load", "classmethod", "kitlib"), (Overrides, "load", "classmethod", "kitlib")]
    messages = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
    # kitlib.Gone is not defined by this "version": skipped quietly (tests/adapters/test_adapter_targets_by_version.py).
    assert len(messages) == 1 and "adapter kitlib (overmind-kitlib not installed" in messages[0]
    assert "kitlib.Base.__init__" in messages[0] and "not a classmethod" in messages[0]
    assert adapter.resolve_roots(specs) == (Base, Base, Base)


def test_owns_by_the_loader_owner_class():
    assert adapter.owns(types.SimpleNamespace(owner=Inherits), (Base,))
    assert not adapter.owns(types.SimpleNamespace(owner=int), (Base,))
    assert not adapter.owns(types.SimpleNamespace(owner=None), (Base,))


class LoraMixin:
    @classmethod
    def load_lora_weights(cls):
        return cls


class Pipeline(LoraMixin):
    @classmethod
    def from_pretrained(cls):
        return cls()

    @classmethod
    def from_config(cls):
        return cls()


class CustomPipeline(Pipeline):
    @classmethod
    def from_pretrained(cls):
        return super().from_pretrained()


def test_owns_a_spec_by_its_attribute_exactly(monkeypatch):
    from overmind.keys.key import describe_loader

    monkeypatch.setitem(sys.modules, "kitpipes", types.SimpleNamespace(Pipeline=Pipeline, LoraMixin=LoraMixin))
    pipelines, lora = [adapter.Spec("kitpipes:Pipeline")], [adapter.Spec("kitpipes:LoraMixin", "load_lora_weights")]
    assert adapter.owns(describe_loader(CustomPipeline.from_pretrained), pipelines)
    assert adapter.owns(describe_loader(Pipeline.from_pretrained), pipelines)
    assert not adapter.owns(describe_loader(Pipeline.from_config), pipelines)
    # a mixin's spec claims the mixin's loader, never the pipeline's own (which another adapter may own)
    assert not adapter.owns(describe_loader(Pipeline.from_pretrained), lora)
    assert adapter.owns(describe_loader(CustomPipeline.load_lora_weights), lora)
    # the class form owns every classmethod of the subclasses, as it says
    assert adapter.owns(describe_loader(Pipeline.from_config), (Pipeline,))


def test_owns_a_spec_while_it_is_patched_and_never_imports(monkeypatch):
    from overmind.adapters import patching
    from overmind.keys.key import describe_loader

    monkeypatch.setitem(sys.modules, "kitpipes", types.SimpleNamespace(Pipeline=Pipeline))
    specs = [adapter.Spec("kitpipes:Pipeline")]
    seen = []
    targets = adapter.collect("kitpipes", specs)
    for target in targets:
        patching.apply(target, lambda fn, *a, **k: seen.append(describe_loader(fn)) or fn(*a, **k))
    try:
        CustomPipeline.from_pretrained()
        Pipeline.from_pretrained()
    finally:
        for target in targets:
            patching.restore(target)
    # the override, then the base's loader it reaches through super() (bound to the subclass), then the base's
    assert [(loader.owner, loader.func) for loader in seen] == [
        (CustomPipeline, vars(CustomPipeline)["from_pretrained"].__func__),
        (CustomPipeline, vars(Pipeline)["from_pretrained"].__func__),
        (Pipeline, vars(Pipeline)["from_pretrained"].__func__)]
    assert all(adapter.owns(loader, specs) for loader in seen)
    monkeypatch.delitem(sys.modules, "kitpipes")
    assert not adapter.owns(seen[0], specs)  # its module is not imported (here: gone): nothing is imported to tell


def _write_package(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_function_spec_patches_the_function_and_every_re_export_to_one_original(tmp_path, monkeypatch):
    from overmind.adapters import patching
    from overmind.keys.key import describe_loader

    _write_package(tmp_path, {
        "kitfn/__init__.py": "from .models import create_model\nfrom .models._factory import create_model as make\n",
        "kitfn/models/__init__.py": "from ._factory import create_model, other\n",
        "kitfn/models/_factory.py": "def create_model(name, seed=0):\n    return (name, seed)\n\n"
                                    "def other():\n    return 1\n",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    kitfn = importlib.import_module("kitfn")
    factory = importlib.import_module("kitfn.models._factory")
    original = factory.create_model
    try:
        spec = adapter.Function("kitfn.models._factory:create_model")
        targets = adapter.collect("kitfn", [spec])
        assert sorted((t.owner.__name__, t.name, t.kind) for t in targets) == [
            ("kitfn", "create_model", "function"), ("kitfn", "make", "function"),
            ("kitfn.models", "create_model", "function"), ("kitfn.models._factory", "create_model", "function")]
        calls = []
        for target in targets:
            patching.apply(target, lambda fn, *a, **k: calls.append(describe_loader(fn)) or fn(*a, **k))
        try:
            assert adapter.collect("kitfn", [spec]) == targets  # found again while patched, once each
            results = [kitfn.create_model("a"), kitfn.make("b"), kitfn.models.create_model("c"),
                       factory.create_model("d", seed=1)]
        finally:
            for target in targets:
                patching.restore(target)
        assert results == [("a", 0), ("b", 0), ("c", 0), ("d", 1)]
        assert [loader.func for loader in calls] == [original] * 4  # one loader, so one key, whichever name
        assert all(adapter.owns(loader, [spec]) for loader in calls)
        assert not adapter.owns(describe_loader(factory.other), [spec])
        assert not adapter.owns(describe_loader(Pipeline.from_pretrained), [spec])
        assert kitfn.create_model is original and kitfn.make is original  # restored by identity
    finally:
        for name in [m for m in sys.modules if m == "kitfn" or m.startswith("kitfn.")]:
            del sys.modules[name]


def test_a_function_spec_the_version_lacks_is_skipped_quietly_and_a_non_function_warns(monkeypatch):
    monkeypatch.setitem(sys.modules, "kitnone", types.SimpleNamespace(__name__="kitnone", loader=len))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert adapter.collect("kitnone", [adapter.Function("kitnone_absent.sub:f")]) == []
        assert adapter.collect("kitnone", [adapter.Function("kitnone:missing")]) == []
        assert caught == []
        assert adapter.collect("kitnone", [adapter.Function("kitnone:loader")]) == []
    assert len(caught) == 1 and "kitnone.loader" in str(caught[0].message)
    assert "not a function" in str(caught[0].message)


# --- what the core does that an adapter may ask of it -------------------------------------------------------

def test_raise_users_lets_a_signal_handlers_exception_through_and_nothing_else():
    import signal

    def deadline(signum, frame):
        raise TimeoutError("the user's deadline")

    previous = signal.signal(signal.SIGALRM, deadline)
    try:
        try:
            signal.raise_signal(signal.SIGALRM)
        except TimeoutError as e:
            users = e
        try:
            adapter.raise_users(users)
        except TimeoutError as e:
            assert e is users
        else:
            raise AssertionError("the user's deadline was swallowed")
        adapter.raise_users(TimeoutError("a socket's own timeout"))  # Overmind's failure: returns
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_patch_now_installs_a_replacement_kept_in_the_registry_of_originals():
    def original():
        return "original"

    module = types.ModuleType("kit_patch_demo")
    module.convert = original
    target = adapter.PatchTarget(module, "convert", kind="replace", adapter="demo", replacement=lambda: "ours")
    assert not adapter.is_patched(module, "convert")
    assert adapter.patch_now(target) and not adapter.patch_now(target)  # once
    try:
        assert module.convert() == "ours" and adapter.is_patched(module, "convert")
        assert adapter.get_original(module, "convert") is original
    finally:
        from overmind.adapters import patching

        patching.restore(target)
    assert module.convert is original and not adapter.is_patched(module, "convert")


def test_fingerprint_changes_with_the_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"a" * 10)
    before = adapter.fingerprint(str(path))
    assert adapter.fingerprint(str(path)) == before
    path.write_bytes(b"b" * 11)
    assert adapter.fingerprint(str(path)) != before
    assert adapter.fingerprint(str(tmp_path)) != adapter.fingerprint(str(path))  # a folder lists its files


def test_load_memo_lasts_while_a_load_runs():
    from overmind.loading import scope

    adapter.load_memo("kit-test")["x"] = 1
    assert adapter.load_memo("kit-test") == {}  # outside a load: kept by no one
    with scope.scope():
        adapter.load_memo("kit-test")["x"] = 1
        with scope.scope():  # a nested load sees it
            assert adapter.load_memo("kit-test") == {"x": 1}
        assert adapter.load_memo("kit-test") == {"x": 1}
    assert adapter.load_memo("kit-test") == {}


def test_logger_is_the_named_logger(caplog):
    with caplog.at_level("INFO", logger="overmind.kit-test"):
        adapter.logger("overmind.kit-test").info("from an adapter")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [("overmind.kit-test", "from an adapter")]


def test_cache_mappings_and_their_untouched_pages():
    import os

    import torch

    from overmind.shm.writer import write_entry

    tensor = torch.arange(4096, dtype=torch.float32)
    assert not adapter.in_cache_mapping(tensor.data_ptr())
    fd = write_entry(b"skeleton", [(tensor.untyped_storage(), 0)], tensor.nbytes)
    try:
        from overmind.shm.reader import EntryMapping

        entry = EntryMapping("kit-test", fd)
    finally:
        os.close(fd)
    storage = entry.storage(0, tensor.nbytes)
    address = storage.data_ptr()
    assert adapter.in_cache_mapping(address) and adapter.in_cache_mapping(address + tensor.nbytes - 1)
    assert adapter.pages_untouched([(address, tensor.nbytes)])
    torch.tensor([], dtype=torch.float32).set_(storage).add_(1)  # a write makes the page the process's own
    assert not adapter.pages_untouched([(address, tensor.nbytes)])


def test_reduce_script_module_rebuilds_the_module():
    import torch

    module = torch.jit.script(torch.nn.Linear(3, 2))
    rebuild, args = adapter.reduce_script_module(module)[:2]
    copy = rebuild(*args)
    x = torch.ones(1, 3)
    assert isinstance(copy, torch.jit.ScriptModule) and torch.equal(copy(x), module(x))


def test_pickling_failed_is_the_cores():
    from overmind.entries import pickling

    assert adapter.PicklingFailed is pickling.PicklingFailed
    assert issubclass(pickling.ResourceRefused, adapter.PicklingFailed)
