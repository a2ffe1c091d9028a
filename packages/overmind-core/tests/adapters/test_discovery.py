"""Adapter discovery through real entry points (the fixture adapters installed by scripts/setup),
activate/deactivate symmetry, blocking by name, broken and unsupported adapters, adapter hooks."""
from __future__ import annotations

import warnings

import pytest
import torch

import overmind
from overmind import activation
from overmind.adapters import discovery, patching
from overmind.adapters.discovery import AdapterError
from overmind.fallback import OvermindWarning
from overmind.testing import (
    check_cached_like_plain,
    check_claims_only_its_own,
    check_patch_symmetry,
    check_targets_resolve,
    overmind_mapped,
    run_fresh,
)
from overmind_fixture_adapter import lib

FIXTURE_ADAPTERS = {"fixture", "fixture_broken", "future"}


def others_blocked(*extra: str) -> str:
    """OVERMIND_DISABLED_ADAPTERS naming every installed adapter but the fixture ones (and ``extra``)."""
    from importlib import metadata

    names = {ep.name for ep in metadata.entry_points(group=discovery.GROUP)} - FIXTURE_ADAPTERS
    return ",".join(sorted(names | set(extra)))


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch):
    # The real adapters are tested in their own packages; here only the fixture adapters take part.
    monkeypatch.setenv("OVERMIND_DISABLED_ADAPTERS", others_blocked())
    activation.reset()
    yield
    activation.reset()


def test_entry_point_adapter_is_discovered_and_patches_symmetrically(overmind_runtime):
    original = vars(lib.Model)["from_pretrained"]
    active = overmind.activate()
    assert "fixture" in active and "future" not in active
    assert vars(lib.Model)["from_pretrained"] is not original
    assert patching.is_patched(lib.Model, "from_pretrained")
    assert patching.get_original(lib.Model, "from_pretrained") is original
    assert overmind.activate() == active  # idempotent
    overmind.deactivate()
    assert vars(lib.Model)["from_pretrained"] is original
    assert "from_pretrained" not in vars(lib.SpecialModel)  # inherited before, inherited after


def test_conformance_checks_pass_for_the_fixture_adapter(overmind_runtime):
    assert check_targets_resolve("fixture")
    assert check_patch_symmetry("fixture")


def test_behavioural_conformance_passes_for_the_fixture_adapter_with_a_loader_that_draws(overmind_runtime, tmp_path):
    path = tmp_path / "w.pt"
    torch.save(torch.arange(6.0), path)
    plain, miss, hit = check_cached_like_plain(f"""
        import torch, overmind
        from overmind.testing import report
        overmind.activate(strict=True)
        from overmind_fixture_adapter.lib import Model
        torch.manual_seed(3)
        model = Model.from_pretrained({str(path)!r}, scale=2.0, head=4)  # draws its head
        after = torch.nn.Linear(6, 2)  # drawn after the load: from where the load left torch's generator
        report([type(model).__name__, model.weight.tolist(), model.handle.name, model.head.tolist(),
                after.weight.tolist()])
    """)
    torch.manual_seed(3)
    assert plain["reported"][0][:4] == ["Model", [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], "w.pt", torch.randn(4).tolist()]
    assert "torch" in plain["draws"]
    assert check_claims_only_its_own("fixture")


def test_behavioural_conformance_fails_where_nothing_is_served(overmind_runtime, tmp_path):
    path = tmp_path / "w.pt"
    torch.save(torch.arange(6.0), path)
    script = f"""
        import overmind
        from overmind.testing import report
        overmind.activate()
        from overmind_fixture_adapter.lib import Model
        report(Model.from_pretrained({str(path)!r}).weight.tolist())
    """
    with pytest.raises(AssertionError, match="was not served from the cache"):
        check_cached_like_plain(script, env={"OVERMIND_DISABLED_ADAPTERS": others_blocked("fixture")})


def test_behavioural_conformance_fails_where_the_random_stream_differs(overmind_runtime):
    """A script that leaves a seeded generator elsewhere with Overmind than without fails the check, as a loader
    whose hit skipped its draws would."""
    script = """
        import os, random
        from overmind.testing import report
        random.seed(0)
        if os.environ.get("OVERMIND_DISABLE") != "1":
            random.random()
        report("same")
    """
    with pytest.raises(AssertionError, match="left the random generator elsewhere"):
        check_cached_like_plain(script)


def test_patched_loader_is_cached_across_processes(overmind_runtime, tmp_path):
    path = tmp_path / "w.pt"
    torch.save(torch.arange(6.0), path)
    log, unpickle_log = tmp_path / "loads.log", tmp_path / "unpickle.log"
    script = f'''
import overmind
from overmind.testing import report, overmind_mapped
overmind.activate(strict=True)
from overmind_fixture_adapter.lib import Model, SpecialModel
m = Model.from_pretrained({str(path)!r}, scale=2.0)
s = SpecialModel.from_pretrained({str(path)!r}, scale=2.0)
report([type(m).__name__, type(s).__name__, m.weight.tolist(), m.handle.name, overmind_mapped(m.weight.data_ptr())])
'''
    env = {"FIXTURE_LOAD_LOG": str(log), "FIXTURE_UNPICKLE_LOG": str(unpickle_log), "OVERMIND_STRICT": "1",
           "OVERMIND_DISABLED_ADAPTERS": others_blocked()}
    first = run_fresh(script, env=env)
    second = run_fresh(script, env=env)
    assert first == second == ["Model", "SpecialModel", [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], "w.pt", True]
    assert sorted(log.read_text().split()[0::2]) == ["Model", "SpecialModel"]  # one real load each
    # the adapter's entry metadata reached its before-unpickle hook in the second process
    assert "Model.from_pretrained" in unpickle_log.read_text()


def test_adapter_reducer_is_used_for_direct_loads_without_activate(overmind_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    path = tmp_path / "w.pt"
    torch.save(torch.ones(3), path)
    m = overmind.load(lib.Model.from_pretrained, str(path))
    m2 = overmind.load(lib.Model.from_pretrained, str(path))
    assert isinstance(m2.handle, lib.Handle) and m2.handle.name == "w.pt"
    assert overmind_mapped(m2.weight.data_ptr()) and torch.equal(m.weight, m2.weight)
    assert not patching.is_patched(lib.Model, "from_pretrained")


def test_blocked_adapter_is_not_imported(monkeypatch):
    monkeypatch.setenv("OVERMIND_DISABLED_ADAPTERS", others_blocked("fixture"))
    assert "fixture" not in overmind.activate()
    assert discovery.states()["fixture"].status == "disabled"
    assert not patching.is_patched(lib.Model, "from_pretrained")


def test_adapter_with_unmet_requirements_is_skipped_with_its_reason():
    overmind.activate()
    state = discovery.states()["future"]
    assert state.status == "skipped" and "torch>=99" in state.reason


def break_fixture_adapter(monkeypatch, how: str = "1"):
    import sys

    monkeypatch.setenv("OVERMIND_FIXTURE_BREAK", how)
    monkeypatch.delitem(sys.modules, "overmind_fixture_adapter.broken", raising=False)


def test_broken_adapter_warns_once_and_the_others_still_work(monkeypatch):
    break_fixture_adapter(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        active = overmind.activate()
    ours = [w for w in caught if issubclass(w.category, OvermindWarning)]
    assert len(ours) == 1
    text = str(ours[0].message)
    assert "fixture_broken" in text and "OVERMIND_DISABLED_ADAPTERS=fixture_broken" in text
    assert "fixture" in active


def test_broken_adapter_raises_with_strict(monkeypatch):
    break_fixture_adapter(monkeypatch)
    with pytest.raises(AdapterError, match="fixture_broken"):
        overmind.activate(strict=True)


def test_target_that_moved_is_reported_with_adapter_target_and_fix():
    class Plugin:
        @overmind.hookimpl
        def overmind_patch_targets(self):
            return [patching.PatchTarget(lib.Model, "from_pretrained"),
                    patching.PatchTarget(lib.Model, "load_gone")]

    discovery.register_adapter("moved", Plugin())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        overmind.activate()
    msgs = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
    assert any("moved" in m and "Model.load_gone" in m and "OVERMIND_DISABLED_ADAPTERS" in m for m in msgs)
    # the adapter's earlier target was rolled back: an adapter is applied whole or not at all
    assert discovery.states()["moved"].status == "failed"
    assert patching.patched_targets() == [t for t in patching.patched_targets() if t.adapter != "moved"]


def test_disable_switch_makes_activate_a_no_op(monkeypatch):
    monkeypatch.setenv("OVERMIND_DISABLE", "1")
    assert overmind.activate() == []
    assert not patching.is_patched(lib.Model, "from_pretrained")


def test_every_hook_is_documented_with_its_signature():
    import inspect

    from overmind.adapters import hookspecs
    names = [n for n in dir(hookspecs) if n.startswith("overmind_")]
    assert len(names) >= 8
    for n in names:
        fn = getattr(hookspecs, n)
        assert fn.__doc__ and len(fn.__doc__.strip()) > 40, n
        assert inspect.signature(fn).return_annotation is not inspect.Signature.empty, n
    docs = open(__import__("os").path.join(__import__("os").path.dirname(__file__), "..", "..", "..", "..", "docs",
                                           "adapters.md")).read()
    for n in names:
        assert n in docs, f"{n} is missing from docs/adapters.md"
    # each hook is declared once, with its kind and when it runs, and its row in the table says all three
    assert set(names) == set(hookspecs.SPECS)
    rows = {line.split("|")[1].strip(" `"): line.replace("\\|", "|") for line in docs.splitlines()
            if line.startswith("| `overmind_")}
    for n in names:
        spec, signature = hookspecs.SPECS[n], str(inspect.signature(getattr(hookspecs, n))).replace("'", "")
        assert f"`{signature}`" in rows[n], f"docs/adapters.md: {n} should read `{signature}`"
        assert spec.kind.value in rows[n] and spec.when.value in rows[n], f"docs/adapters.md: {n} needs kind and when"


def test_a_key_hook_can_leave_one_call_uncached(overmind_runtime, tmp_path):
    from overmind.keys.key import Unkeyable

    class Plugin:
        @overmind.hookimpl
        def overmind_key_parts(self, loader, arguments):
            if arguments.get("scale") == 3.0:
                raise Unkeyable("scale 3 is never cached")

    discovery.register_adapter("picky", Plugin())
    path = tmp_path / "w.pt"
    torch.save(torch.ones(2), path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = overmind.load(lib.Model.from_pretrained, str(path), scale=3.0)
    assert not overmind_mapped(m.weight.data_ptr())
    m2 = overmind.load(lib.Model.from_pretrained, str(path), scale=2.0)
    assert overmind_mapped(m2.weight.data_ptr())


def make_mapping(**items):
    return dict(items)


def test_after_unpickle_gives_every_adapter_its_turn(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_STRICT", "1")
    seen = []

    class Tagger:
        def __init__(self, tag):
            self.tag = tag

        @overmind.hookimpl
        def overmind_after_unpickle(self, result, metadata):
            seen.append((self.tag, dict(result)))
            return {**result, self.tag: True}

    discovery.register_adapter("first", Tagger("a"))
    discovery.register_adapter("second", Tagger("b"))
    assert overmind.load(make_mapping, x=1) == {"x": 1}  # the miss: the loader's own object, nothing rebuilt
    assert seen == []
    out = overmind.load(make_mapping, x=1)  # a hit: rebuilt, and finished by every adapter
    assert out == {"x": 1, "a": True, "b": True}
    assert [t for t, _ in seen] == ["b", "a"]  # last registered runs first, as in pluggy
    assert seen[1][1] == {"x": 1, "b": True}   # the second adapter saw the first one's replacement


def test_a_wrapper_hook_is_refused_when_the_adapter_is_discovered(monkeypatch):
    break_fixture_adapter(monkeypatch, "wrapper")
    with pytest.raises(AdapterError, match=r"adapter fixture_broken declares overmind_key_parts with hookwrapper=True"):
        overmind.activate(strict=True)
    activation.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        active = overmind.activate()
    assert [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)] == [
        discovery.states()["fixture_broken"].reason]
    assert "fixture_broken" not in active and "fixture" in active


def test_an_adapter_pluggy_refuses_fails_at_the_first_hook_call_with_one_warning(monkeypatch):
    """The plugin manager is made at the first hook call (here activate()'s own, the fixture's library being
    imported): an adapter whose hook takes an argument its spec lacks is marked failed then, with one warning, and
    the other adapters' hooks still run."""
    from overmind.adapters import hooks

    break_fixture_adapter(monkeypatch, "argument")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        active = overmind.activate()
        hooks.key_parts(None, {})
        hooks.key_parts(None, {})
    ours = [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
    assert len(ours) == 1 and "adapter fixture_broken" in ours[0] and "no_such_argument" in ours[0], ours
    assert "OVERMIND_DISABLED_ADAPTERS=fixture_broken" in ours[0]
    assert "fixture_broken" not in active and "fixture" in active
    assert discovery.states()["fixture_broken"].status == "failed"
    assert discovery.get_manager().get_plugin("fixture") is not None
    assert discovery.get_manager().get_plugin("fixture_broken") is None

