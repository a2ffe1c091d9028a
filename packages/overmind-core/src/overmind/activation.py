"""``activate()`` and ``deactivate()``: patch each discovered adapter's loaders once its library is imported (its
lazy targets once the user imports their module: ``overmind_patch_later``), routed through ``flow.load``, and put
every original back.

Activating costs no library imports: an adapter whose library is not imported yet is patched the moment it
is (a post-import hook, see :mod:`overmind.adapters.importwatch`), and a module the adapter names in
``overmind_patch_later`` adds its loaders the moment the user imports it. Its targets are routed through ``flow.load``,
handed to :mod:`overmind.adapters.patching`, which knows only the mechanism. An adapter is applied whole or not at
all: a target that fails rolls back the ones before it, with one warning naming the adapter and the fix, or
an :class:`~overmind.adapters.discovery.AdapterError` under ``activate(strict=True)``.
"""
from __future__ import annotations

import sys

from . import fallback
from ._util import interrupts
from ._util.lazy_logger import logger
from .adapters import discovery, hooks, importwatch, libraries, patching
from .adapters.discovery import AdapterError, AdapterState
from .fallback import OvermindWarning

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

log = logger("overmind")


def activate(strict: bool = False) -> list[str]:
    """Discover the adapters and patch each one now or once its library is imported; the names loaded."""
    if fallback.disabled():
        log.info("OVERMIND_DISABLE=1, activate() patches nothing")
        return []
    with discovery.lock:
        discovery.discover_installed(strict)
        states = discovery.states()
        if strict:
            failed = [s for s in states.values() if s.status == "failed"]
            if failed:
                raise AdapterError(failed[0].reason)
        for state in states.values():
            if state.status == "loaded" and not state.targets and not state.deferred and not state.later:
                _apply_when_live(state, strict)
        return sorted(n for n, s in discovery.states().items() if s.status == "loaded")


def _apply_when_live(state: AdapterState, strict: bool) -> None:
    """Patch now if the adapter's libraries are imported, else right after they are."""
    missing = libraries.missing_module(state.modules)
    if missing is None:
        state.deferred = False
        _apply_adapter(state, strict)
        return
    state.deferred = True

    def on_import(_module) -> None:
        with discovery.lock:
            if state.deferred and discovery.states(discover=False).get(state.name) is state:
                _apply_when_live(state, strict=False)

    state.on_import = on_import
    importwatch.when_imported(missing, on_import)


def _patch_all(state: AdapterState, targets: list) -> list:
    """Patch every one of ``targets`` for ``state``'s adapter and return them, or none: a failure restores the
    ones already patched and is raised."""
    applied: list = []
    try:
        route = _route if any(t.kind != "replace" for t in targets) else None
        for t in targets:
            t = t if t.adapter else patching.PatchTarget(t.owner, t.name, t.kind, state.name, t.replacement)
            patching.apply(t, route)
            applied.append(t)
    except Exception:
        for t in reversed(applied):
            patching.restore(t)
        raise
    return applied


def _apply_adapter(state: AdapterState, strict: bool) -> None:
    try:
        targets = hooks.patch_targets(state.name)
        check = hooks.self_check(state.name)
        if state.untested:
            if not _passes_self_check(state, targets, check, strict):
                return
            # its sample imported more of the library: the loaders of those modules are patched now, as they are
            # no longer among the modules still to come
            targets = hooks.patch_targets(state.name)
        applied = _patch_all(state, _fitting(state, targets, check))
    except Exception as e:
        interrupts.raise_users(e)
        state.status, state.reason = "failed", _patch_failure(state, e)
        if strict:
            raise AdapterError(state.reason) from e
        fallback.warn_at_user_line(OvermindWarning(state.reason))
        return
    state.targets = applied
    _watch_later(state)


def _fitting(state: AdapterState, targets: list, check) -> list:
    """``targets`` without the loaders whose signature lacks a parameter the adapter reads (its
    ``SelfCheck.relies_on``): those calls run plain, named in one INFO line. A loader of another kind that shares
    the name (transformers' ``MtpModel.from_pretrained(main_model)`` builds from a model, not from files) is one."""
    if check is None or not check.relies_on:
        return targets
    from .adapters import self_check

    targets, unfit = self_check.fit(targets, check)
    if unfit:
        log.info("adapter %s leaves unpatched the loaders that do not take what it reads: %s", state.name,
                 "; ".join(unfit.values()))
    return targets


def _passes_self_check(state: AdapterState, targets: list, check, strict: bool) -> bool:
    """On a library version outside the adapter's tested range: whether the adapter proves itself there. A
    failure leaves it off, with one warning (an AdapterError under strict)."""
    from .loading import adapter_check

    outcome = state.self_check = adapter_check.run(state.name, targets, check)
    versions = ", ".join(f"{lib} {have} (tested: {tested})" for lib, have, tested in state.untested)
    if outcome.passed:
        log.info("adapter %s is active on %s, outside its tested range: its self-check passed (%s)",
                 state.name, versions, outcome.detail)
        return True
    lib, have, tested = state.untested[0]
    state.status = "failed"
    state.reason = (f"overmind: adapter {state.name} ({state.dist}) is off: {versions} is outside its tested range "
                    f"and its self-check failed: {outcome.detail}. Loads of {lib} run without the cache. Install "
                    f'"{lib}{tested}" for a tested set, or upgrade {state.dist}.')
    if strict:
        raise AdapterError(state.reason)
    fallback.warn_at_user_line(OvermindWarning(state.reason))
    return False


def _watch_later(state: AdapterState) -> None:
    """Patch more of ``state``'s targets as each module of its ``overmind_patch_later`` is imported."""
    try:
        modules = hooks.patch_later(state.name)
    except Exception as e:  # the adapter's targets so far stay patched; the later ones are not
        interrupts.raise_users(e)
        fallback.warn_at_user_line(OvermindWarning(_patch_failure(state, e)))
        return
    for module in modules:
        on_import = _later_callback(state)
        state.later.append(on_import)
        importwatch.when_imported(module, on_import)


def _later_callback(state: AdapterState) -> Callable:
    """A post-import callback of its own for one later module of ``state`` (each knows itself, not the last)."""
    def on_import(_module) -> None:
        with discovery.lock:
            if on_import in state.later and discovery.states(discover=False).get(state.name) is state:
                state.later.remove(on_import)
                _patch_more(state)

    return on_import


def _patch_more(state: AdapterState) -> None:
    """Patch the targets of ``state`` that are not patched yet (a later module of the adapter was imported);
    all of them or, with one warning, none."""
    done = {(id(t.owner), t.name) for t in state.targets}
    try:
        new = [t for t in hooks.patch_targets(state.name) if (id(t.owner), t.name) not in done]
        applied = _patch_all(state, _fitting(state, new, hooks.self_check(state.name)))
    except Exception as e:
        interrupts.raise_users(e)
        fallback.warn_at_user_line(OvermindWarning(_patch_failure(state, e)))
        return
    state.targets.extend(applied)


def _route(loader: Callable, /, *args, **kwargs):
    """What a patched loader calls: ``flow.load``, imported at the first call. The load path imports torch and the
    cache's machinery (30 ms): activating imports no library, and patching, which runs inside the user's import of
    the library, imports nothing a process that never loads would not need."""
    from .loading.flow import load

    return load(loader, *args, **kwargs)


def _patch_failure(state: AdapterState, e: Exception) -> str:
    if isinstance(e, (patching.PatchError, AdapterError)):
        return str(e)
    return (f"overmind: adapter {state.name} ({state.dist}) failed to patch: {type(e).__name__}: {e}. "
            f"Its library may have changed; upgrade {state.dist} or skip it with "
            f"OVERMIND_DISABLED_ADAPTERS={state.name}.")


def deactivate() -> None:
    """Restore every patched attribute to its exact original object and stop waiting for imports."""
    with discovery.lock:
        for state in reversed(list(discovery.states(discover=False).values())):
            if state.deferred:
                importwatch.cancel(state.on_import)
                state.deferred = False
            for on_import in state.later:
                importwatch.cancel(on_import)
            state.later = []
            for t in reversed(state.targets):
                patching.restore(t)
            state.targets = []
    copies = sys.modules.get("overmind.shm.gpu_copies")  # torch.nn.Module.to/.cuda, replaced while twins live
    if copies is not None:
        copies.uninstall()


def reset() -> None:
    """Forget every adapter (tests): deactivate, then drop the manager so the next use rediscovers."""
    with discovery.lock:
        deactivate()
        discovery.forget()
