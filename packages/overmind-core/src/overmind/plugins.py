"""Adapter discovery (entry-point group ``overmind.adapters``), the pluggy manager, activate/deactivate.

Adapters are discovered once per process, on ``activate()`` or on the first ``load()`` (their reducers and
key hooks apply to direct ``overmind.load`` calls too); only ``activate()`` patches loaders. An adapter acts
only once its library is imported: ``activate()`` patches it then (a post-import hook, see ``importwatch``),
so activating costs no library imports, and its per-load hooks are skipped in processes without it.

Before an adapter's module is imported, the library versions it declares (its distribution's requirements
with ``extra == "instruments"``) are checked against what is installed, as opentelemetry instrumentors do:
an adapter for a library that is missing or too new is skipped with one line of why. An adapter the user
blocks with ``OVERMIND_DISABLED_ADAPTERS=a,b`` is not imported at all.
"""
from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Mapping

import pluggy

from . import fallback, hookspecs, importwatch, libraries, patching
from .errors import OvermindError
from .fallback import OvermindWarning
from .key import Unkeyable

log = logging.getLogger("overmind")
GROUP = "overmind.adapters"


class AdapterError(OvermindError):
    """An adapter failed to load or patch (raised by ``activate(strict=True)``)."""


@dataclass
class AdapterState:
    name: str
    dist: str | None
    status: str  # "loaded", "skipped", "disabled", "failed"
    reason: str = ""
    targets: list = field(default_factory=list)
    modules: tuple = ()  # libraries.module_groups(): the adapter is live once each group has one imported
    deferred: bool = False  # activate() is waiting for the library's import to patch it
    on_import: Any = None  # the post-import callback while deferred

    def live(self) -> bool:
        return libraries.missing_module(self.modules) is None


_lock = threading.RLock()
_manager: pluggy.PluginManager | None = None
_adapters: dict[str, AdapterState] = {}
_active = False
_reducers: dict | None = None


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def disabled_names() -> set[str]:
    return {n.strip() for n in os.environ.get("OVERMIND_DISABLED_ADAPTERS", "").split(",") if n.strip()}


def unmet_requirements(dist: metadata.Distribution | None) -> list[str]:
    """Requirements marked ``extra == "instruments"`` that the installed packages do not satisfy."""
    unmet = []
    for req in libraries.instruments_requirements(dist):
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{req} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} (found {have})")
    return unmet


def _report(state: AdapterState, strict: bool) -> None:
    # Discovery always finishes; under strict, activate() raises for the failed adapter instead of a warning.
    if state.status == "failed" and not strict:
        warnings.warn(OvermindWarning(state.reason), stacklevel=4)
    elif state.status == "skipped":
        log.info("%s", state.reason)


def register_adapter(name: str, plugin: Any, dist: str | None = None) -> AdapterState:
    """Register an adapter object directly (tests, or adapters shipped inside an application)."""
    with _lock:
        pm = get_manager()
        if pm.get_plugin(name) is None:
            pm.register(plugin, name=name)
        state = _adapters[name] = AdapterState(name, dist, "loaded")
        _invalidate()
        return state


def _discover(pm: pluggy.PluginManager, strict: bool) -> None:
    blocked = disabled_names()
    for ep in metadata.entry_points(group=GROUP):
        if ep.name in _adapters:
            continue
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        if ep.name in blocked:
            _adapters[ep.name] = AdapterState(ep.name, dist_name, "disabled", "blocked by OVERMIND_DISABLED_ADAPTERS")
            continue
        unmet = unmet_requirements(dist)
        if unmet:
            state = _adapters[ep.name] = AdapterState(
                ep.name, dist_name, "skipped",
                f"overmind: adapter {ep.name} skipped: needs {', '.join(unmet)}.")
            _report(state, strict)
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as e:
            state = _adapters[ep.name] = AdapterState(
                ep.name, dist_name, "failed",
                f"overmind: adapter {ep.name} ({dist_name}) failed to import {ep.value}: {type(e).__name__}: {e}. "
                f"Reinstall or upgrade {dist_name}, or skip it with OVERMIND_DISABLED_ADAPTERS={ep.name}.")
            _report(state, strict)
            continue
        _adapters[ep.name] = AdapterState(ep.name, dist_name, "loaded", modules=libraries.module_groups(dist))


def get_manager(strict: bool = False) -> pluggy.PluginManager:
    """The plugin manager, with the installed adapters discovered on first use."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = _new_manager()
            _discover(_manager, strict)
        return _manager


def adapters() -> dict[str, AdapterState]:
    """The state of every adapter seen: loaded, skipped (requirements), disabled (by name) or failed."""
    get_manager()
    return dict(_adapters)


def _invalidate() -> None:
    global _reducers
    _reducers = None


def reducers() -> Mapping[type, list[Callable]]:
    """Every adapter's ``overmind_reducers`` and the core's (plain tensors, TorchScript), as
    ``{type: [reducer, ...]}``:
    where two claim one type, both are kept and tried in hook order (see ``pickling._Reducers``)."""
    global _reducers
    live = _live_names()
    if _reducers is not None and _reducers[0] == live:
        return _reducers[1]
    parts = [part for _, part in _call_each("overmind_reducers")]
    from . import tensors

    parts.append(tensors.reducers())
    try:
        from . import torchscript

        parts.append(torchscript.reducers())
    except ImportError:
        pass
    table = {}
    for part in parts:
        for t, r in (part or {}).items():
            table.setdefault(t, []).append(r)
    _reducers = (live, table)
    return table


# Hooks that run in every process whatever it imported: an entry being unpickled needs its adapters
# before the library is imported (the unpickling imports it); a key needs every adapter's stand-ins and key
# parts whether or not its library is imported yet (a BitsAndBytesConfig reaches a key before the load
# imports bitsandbytes). These hooks look values up in sys.modules and never import their library.
_ALWAYS = {"overmind_before_unpickle", "overmind_after_unpickle", "overmind_key_for_value", "overmind_key_parts"}


def _live_names() -> frozenset[str]:
    """Adapters whose libraries are imported in this process (and those registered directly)."""
    return frozenset(n for n, s in _adapters.items() if s.status == "loaded" and s.live())


def _impls(hook_name: str) -> list:
    # pluggy calls the last registered implementation first; keep that order (tryfirst/trylast honoured)
    impls = reversed(getattr(get_manager().hook, hook_name).get_hookimpls())
    if hook_name in _ALWAYS:
        return list(impls)
    live = _live_names()
    return [i for i in impls if i.plugin_name in live]


def _call_one(impl, hook_name: str, kwargs: dict) -> Any:
    """Call one adapter's hook; a failure is named and skipped (raised under OVERMIND_STRICT=1)."""
    try:
        return impl.function(**{a: kwargs[a] for a in impl.argnames})
    except Unkeyable:
        raise  # an adapter's way to say "do not cache this call": load() then calls the loader directly
    except Exception as e:
        if fallback.strict():
            raise
        warnings.warn(OvermindWarning(
            f"overmind: adapter {impl.plugin_name} failed in {hook_name}: {type(e).__name__}: {e}; "
            f"continuing without it. Skip it with OVERMIND_DISABLED_ADAPTERS={impl.plugin_name}."), stacklevel=4)
        return None


def _call_each(hook_name: str, **kwargs) -> list[tuple[str, Any]]:
    """Call a hook on each adapter separately, so a failing adapter is named and skipped, not fatal."""
    return [(impl.plugin_name, _call_one(impl, hook_name, kwargs)) for impl in _impls(hook_name)]


def chain(hook_name: str, arg: str, value: Any, **kwargs) -> Any:
    """Pass ``value`` (as argument ``arg``) through each adapter's hook in turn; ``None`` keeps it."""
    for impl in _impls(hook_name):
        result = _call_one(impl, hook_name, {**kwargs, arg: value})
        if result is not None:
            value = result
    return value


def call_hook(hook_name: str, **kwargs) -> list[Any]:
    return [r for _, r in _call_each(hook_name, **kwargs) if r is not None]


def first_result(hook_name: str, **kwargs) -> Any:
    for impl in _impls(hook_name):
        r = _call_one(impl, hook_name, kwargs)
        if r is not None:
            return r
    return None


def activate(strict: bool = False) -> list[str]:
    global _active
    if fallback.disabled():
        log.info("overmind: OVERMIND_DISABLE=1, activate() patches nothing")
        return []
    with _lock:
        pm = get_manager(strict)
        if strict:
            failed = [s for s in _adapters.values() if s.status == "failed"]
            if failed:
                raise AdapterError(failed[0].reason)
        for state in _adapters.values():
            if state.status == "loaded" and not state.targets and not state.deferred:
                _apply_when_live(state, pm.get_plugin(state.name), strict)
        _active = True
        return sorted(n for n, s in _adapters.items() if s.status == "loaded")


def _apply_when_live(state: AdapterState, plugin: Any, strict: bool) -> None:
    """Patch now if the adapter's libraries are imported, else right after they are."""
    missing = libraries.missing_module(state.modules)
    if missing is None:
        state.deferred = False
        _apply_adapter(state, plugin, strict)
        return
    state.deferred = True

    def on_import(_module) -> None:
        with _lock:
            if state.deferred and _adapters.get(state.name) is state:
                _apply_when_live(state, plugin, strict=False)

    state.on_import = on_import
    importwatch.when_imported(missing, on_import)


def _apply_adapter(state: AdapterState, plugin: Any, strict: bool) -> None:
    hook = getattr(plugin, "overmind_patch_targets", None)
    if hook is None:
        return
    applied = []
    try:
        targets = list(hook() or [])
        for t in targets:
            t = t if t.adapter else patching.PatchTarget(t.owner, t.name, t.kind, state.name, t.replacement)
            patching.apply(t)
            applied.append(t)
    except Exception as e:
        for t in reversed(applied):
            patching.restore(t)
        state.status, state.reason = "failed", _patch_failure(state, e)
        if strict:
            raise AdapterError(state.reason) from e
        warnings.warn(OvermindWarning(state.reason), stacklevel=4)
        return
    state.targets = applied


def _patch_failure(state: AdapterState, e: Exception) -> str:
    if isinstance(e, patching.PatchError):
        return str(e)
    return (f"overmind: adapter {state.name} ({state.dist}) failed to patch: {type(e).__name__}: {e}. "
            f"Its library may have changed; upgrade {state.dist} or skip it with OVERMIND_DISABLED_ADAPTERS={state.name}.")


def deactivate() -> None:
    global _active
    with _lock:
        for state in reversed(list(_adapters.values())):
            if state.deferred:
                importwatch.cancel(state.on_import)
                state.deferred = False
            for t in reversed(state.targets):
                patching.restore(t)
            state.targets = []
        _active = False


def is_active() -> bool:
    return _active


def reset() -> None:
    """Forget every adapter (tests): deactivate, then drop the manager so the next use rediscovers."""
    global _manager
    with _lock:
        deactivate()
        _manager = None
        _adapters.clear()
        _invalidate()
