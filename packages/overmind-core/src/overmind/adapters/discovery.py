"""Adapter discovery (entry-point group ``overmind.adapters``), the state of every adapter seen and the modules
adapters key themselves (``code_keyed_prefixes``); the pluggy manager, made at the first hook call with the
discovered adapters registered in order (``activate()`` imports no pluggy).

Adapters are discovered once per process, on ``activate()`` or on the first ``load()`` (their reducers and key hooks
apply to direct ``overmind.load`` calls too). Before an adapter's module is imported, the library versions it needs
(its distribution's requirements with ``extra == "instruments"``: lower bounds, and upper ones only for versions
known to break) are checked against what is installed: an adapter for a library that is missing or too old is
skipped with one line of why. A library newer than the adapter's ``tested`` extra does not skip it: the adapter
checks itself when it patches (:mod:`overmind.loading.adapter_check`). An adapter the user blocks with
``OVERMIND_DISABLED_ADAPTERS=a,b`` is not imported at all. An adapter is *live* once its libraries are imported (see
:mod:`overmind.adapters.libraries`).

>>> from overmind import adapters
>>> discovery.states()["bnb"].status
'loaded'
"""
from __future__ import annotations

import threading
import types

from .._util import distributions, interrupts
from .._util.lazy_logger import logger
from ..errors import OvermindError
from ..fallback import OvermindWarning
from . import hookspecs, libraries

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logger("overmind")
GROUP = "overmind.adapters"
_UNSUPPORTED = ("wrapper", "hookwrapper")  # pluggy impl options; each adapter's hook is called on its own


class AdapterError(OvermindError):
    """An adapter failed to load or patch (raised by ``activate(strict=True)``), or declares a hook in a way
    Overmind does not support."""


class AdapterState:
    """What discovery and activation know of one adapter (a plain class: a dataclass costs ~1 ms to create, and
    this module is imported by ``activate()``)."""

    __slots__ = ("name", "dist", "status", "reason", "targets", "modules", "deferred", "on_import", "later",
                 "untested", "self_check")

    def __init__(self, name: str, dist: str | None, status: str, reason: str = "", modules: tuple = ()):
        self.name = name
        self.dist = dist
        self.status = status  # "loaded", "skipped", "disabled", "failed"
        self.reason = reason
        self.targets: list = []  # what activation patched for it
        self.modules = modules  # libraries.module_groups(): the adapter is live once each group has one imported
        self.deferred = False  # activation is waiting for the library's import to patch it
        self.on_import: Any = None  # the post-import callback while deferred
        self.later: list = []  # post-import callbacks of its overmind_patch_later modules
        # (library, installed version, tested range) of each library outside the adapter's ``tested`` extra:
        # the adapter checks itself before it patches (self_check.py)
        self.untested: list[tuple[str, str, str]] = []
        self.self_check: Any = None  # that check's self_check.Outcome, once it ran

    def __repr__(self) -> str:
        return (f"AdapterState(name={self.name!r}, dist={self.dist!r}, status={self.status!r}, "
                f"reason={self.reason!r}, targets={self.targets!r}, deferred={self.deferred!r}, "
                f"untested={self.untested!r})")

    def live(self) -> bool:
        return libraries.missing_module(self.modules) is None


lock = threading.RLock()
# The pluggy PluginManager, made at the first hook call (get_manager), not at discovery: activate() in a process
# that has imported no library calls no hook, and importing pluggy (with inspect and typing) cost it ~17 ms.
_manager: Any = None
_discovered = False
_pending: list[tuple[str, Any]] = []  # (name, plugin) of the adapters discovery loaded, in order, to register
_states: dict[str, AdapterState] = {}
# Module names whose code an adapter keys and carries itself (code_keyed_by_adapter): no entry varies
# with their files (loading/code_deps.py).
code_keyed_prefixes: set[str] = set()
_generation = 0  # changes whenever an adapter is registered or forgotten: caches of hook results key on it


def disabled_names() -> set[str]:
    from ..settings import current

    return set(current().disabled_adapters)


def unmet_requirements(dist: distributions.Distribution | None) -> list[str]:
    """Requirements marked ``extra == "instruments"`` that the installed packages do not satisfy."""
    unmet = []
    for req in libraries.instruments_requirements(dist):
        have = distributions.version(req.name)
        if have is None:
            unmet.append(f"{req} (not installed)")
            continue
        if req.specifier and not req.satisfied_by(have):
            unmet.append(f"{req} (found {have})")
    return unmet


def _report(state: AdapterState, strict: bool) -> None:
    # Discovery always finishes; under strict, activate() raises for the failed adapter instead of a warning.
    if state.status == "failed" and not strict:
        from ..fallback import warn_at_user_line

        warn_at_user_line(OvermindWarning(state.reason))
    elif state.status == "skipped":
        log.info("%s", state.reason.removeprefix("overmind: "))


def _refusal(name: str, hook: str, option: str) -> AdapterError:
    return AdapterError(
        f"overmind: adapter {name} declares {hook} with {option}=True, which Overmind does not "
        f"support: it calls each adapter's hook on its own, so that a failing adapter is named and "
        f"skipped. Drop {option}=True and return the hook's value (to run code around pickling, return "
        f"a context manager from overmind_prepare_result).")


def _impl_options(plugin: Any):
    """``(hook name, options)`` of each hook implementation on ``plugin``, read from the marker's attribute
    without running any descriptor (as pluggy's registration finds them; it has the last word)."""
    if isinstance(plugin, types.ModuleType):
        spaces = [vars(plugin)]
    else:
        cls = plugin if isinstance(plugin, type) else type(plugin)
        own = [] if isinstance(plugin, type) else [getattr(plugin, "__dict__", None) or {}]
        spaces = own + [vars(c) for c in cls.__mro__]
    seen: set[str] = set()
    for space in spaces:
        for attr, value in list(space.items()):
            if attr in seen or not isinstance(attr, str):
                continue
            seen.add(attr)
            for holder in (value, getattr(value, "__func__", None)):
                opts = (getattr(holder, "__dict__", None) or {}).get(hookspecs.PROJECT + "_impl") \
                    if isinstance(holder, (types.FunctionType, classmethod, staticmethod)) else None
                if isinstance(opts, dict):
                    yield opts.get("specname") or attr, opts
                    break


def _check_options(plugin: Any, name: str) -> None:
    """Refuse, at discovery, the impl options whose meaning Overmind's hook calls cannot keep."""
    for hook, opts in _impl_options(plugin):
        option = next((o for o in _UNSUPPORTED if opts.get(o)), None)
        if option is not None:
            raise _refusal(name, hook, option)


def _register(pm: Any, plugin: Any, name: str) -> None:
    """Register ``plugin``, refusing the impl options whose meaning Overmind's hook calls cannot keep."""
    pm.register(plugin, name=name)
    for caller in pm.get_hookcallers(plugin) or ():
        for impl in caller.get_hookimpls():
            option = next((o for o in _UNSUPPORTED if impl.plugin is plugin and getattr(impl, o, False)), None)
            if option is not None:
                pm.unregister(plugin)
                raise _refusal(name, caller.name, option)


def register_adapter(name: str, plugin: Any, dist: str | None = None) -> AdapterState:
    """Register an adapter object directly (tests, or adapters shipped inside an application)."""
    global _generation
    with lock:
        pm = get_manager()
        if pm.get_plugin(name) is None:
            _register(pm, plugin, name)
        state = _states[name] = AdapterState(name, dist, "loaded")
        _generation += 1
        return state


def _discover(strict: bool) -> None:
    blocked = disabled_names()
    for ep in distributions.entry_points(GROUP):
        if ep.name in _states:
            continue
        dist = ep.dist
        dist_name = dist.name
        if ep.name in blocked:
            _states[ep.name] = AdapterState(ep.name, dist_name, "disabled", "blocked by OVERMIND_DISABLED_ADAPTERS")
            continue
        unmet = unmet_requirements(dist)
        if unmet:
            state = _states[ep.name] = AdapterState(
                ep.name, dist_name, "skipped",
                f"overmind: adapter {ep.name} skipped: needs {', '.join(unmet)}.")
            _report(state, strict)
            continue
        try:
            plugin = ep.load()
            _check_options(plugin, ep.name)
        except AdapterError as e:
            state = _states[ep.name] = AdapterState(ep.name, dist_name, "failed", str(e))
            _report(state, strict)
            continue
        except Exception as e:
            interrupts.raise_users(e)
            state = _states[ep.name] = AdapterState(
                ep.name, dist_name, "failed",
                f"overmind: adapter {ep.name} ({dist_name}) failed to import {ep.value}: {type(e).__name__}: {e}. "
                f"Reinstall or upgrade {dist_name}, or skip it with OVERMIND_DISABLED_ADAPTERS={ep.name}.")
            _report(state, strict)
            continue
        state = _states[ep.name] = AdapterState(ep.name, dist_name, "loaded", modules=libraries.module_groups(dist))
        state.untested = libraries.untested(dist)
        _pending.append((ep.name, plugin))


def discover_installed(strict: bool = False) -> None:
    """Find the installed adapters, once: check each one's requirements, import it, check its hook options.
    Registering them with the plugin manager waits for the first hook call (:func:`get_manager`)."""
    global _discovered, _generation
    with lock:
        if not _discovered:
            _discovered = True  # first: an adapter's import that asks for the states sees discovery under way
            _discover(strict)
            _generation += 1
            if _manager is not None:  # made meanwhile (a hook called while an adapter imported): register the rest
                _register_pending(_manager)


def get_manager(strict: bool = False) -> Any:
    """The pluggy plugin manager, made on first use with every discovered adapter registered in discovery order.
    An adapter pluggy refuses (a hook argument its spec does not have) is marked failed, with one warning."""
    global _manager, _generation
    with lock:
        discover_installed(strict)
        if _manager is None:
            pm = new_manager()
            _manager = pm
            _register_pending(pm)
            _generation += 1
        return _manager


def new_manager() -> Any:
    """A new pluggy plugin manager that holds the hook specifications and no adapter."""
    import pluggy

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _register_pending(pm: Any) -> None:
    """Register the adapters discovery loaded and nobody registered yet, in discovery order."""
    global _generation
    while _pending:
        name, plugin = _pending.pop(0)
        state = _states.get(name)
        if state is None or state.status != "loaded" or pm.get_plugin(name) is not None:
            continue
        try:
            _register(pm, plugin, name)
        except Exception as e:
            interrupts.raise_users(e)
            state.status = "failed"
            state.reason = (f"overmind: adapter {name} ({state.dist}) was refused by the plugin manager: "
                            f"{type(e).__name__}: {e}. Upgrade {state.dist}, or skip it with "
                            f"OVERMIND_DISABLED_ADAPTERS={name}.")
            _report(state, strict=False)
        _generation += 1


def states(discover: bool = True) -> dict[str, AdapterState]:
    """The state of every adapter seen: loaded, skipped (requirements), disabled (by name) or failed.
    Discovers the installed adapters first, unless ``discover`` is false."""
    if discover:
        discover_installed()
    return dict(_states)


def live_names() -> frozenset[str]:
    """Adapters whose libraries are imported in this process (and those registered directly)."""
    return frozenset(n for n, s in _states.items() if s.status == "loaded" and s.live())


def generation() -> int:
    """A number that changes whenever the set of registered adapters does."""
    return _generation


def code_keyed_by_adapter(*prefixes: str) -> None:
    """Say that modules under these names (``"transformers_modules"``) hold code this adapter keys
    itself and carries in its entries (a library's copies of a model folder's code): the core then
    does not make an entry vary with their files (a loader's user modules do, see
    ``overmind/loading/code_deps.py``).

    >>> code_keyed_by_adapter("transformers_modules", "diffusers_modules")
    """
    code_keyed_prefixes.update(prefixes)


def forget() -> None:
    """Drop the manager and every adapter's state, so the next use rediscovers (see ``activation.reset``)."""
    global _manager, _generation, _discovered
    with lock:
        _manager = None
        _discovered = False
        _pending.clear()
        _states.clear()
        _generation += 1
