"""Calling the adapters' hooks: one typed function per hook of :mod:`overmind.adapters.hookspecs`, derived from
``SPECS`` and named for what the core wants (``hooks.key_parts(loader, arguments)``,
``hooks.after_unpickle(result, metadata)``); the live adapters' reducers merged into one table.

How a hook's results combine (its kind) and whether it runs before its adapter's library is imported are
read from ``hookspecs.SPECS``, never decided here: each function names its hook and hands the arguments to
``_run``, which calls it as its kind says; a merged or entered hook's function then merges or enters.

Each adapter's hook is called on its own, the last registered first (pluggy's order, ``tryfirst`` and
``trylast`` honoured): a failing adapter is named in one warning and skipped (raised under
``OVERMIND_STRICT=1``), except that :class:`~overmind.errors.Unkeyable` passes through: an adapter raises it as
``overmind.adapter.Uncacheable`` to say "do not cache this call".

>>> hooks.key_for_value(BitsAndBytesConfig(load_in_4bit=True))
('BitsAndBytesConfig', {...})
"""
from __future__ import annotations

import contextlib

from .. import fallback
from .._util import interrupts
from ..errors import Unkeyable
from . import discovery
from .hookspecs import SPECS, Kind, When

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, ContextManager, Mapping

if TYPE_CHECKING:
    from ..keys.key import Loader
    from .derived_paths import DerivedPath
    from .patching import PatchTarget
    from .self_check import SelfCheck


# -- the hooks, one function each -------------------------------------------------------------------------

def patch_targets(adapter: str) -> list[PatchTarget]:
    """Adapter ``adapter``'s patch targets. Called by activation, for one adapter once it is live; a failure
    is raised, not skipped: activation reports it as that adapter's patch failure."""
    return _own_results("overmind_patch_targets", adapter)


def patch_later(adapter: str) -> list[str]:
    """The modules whose import should patch adapter ``adapter`` again; raised, not skipped, as above."""
    return _own_results("overmind_patch_later", adapter)


def self_check(adapter: str) -> SelfCheck | None:
    """Adapter ``adapter``'s :class:`~overmind.adapter.SelfCheck`, or None; raised, not skipped."""
    return next((c for c in _own_calls("overmind_self_check", adapter) if c is not None), None)


def _own_results(name: str, adapter: str) -> list:
    return [x for result in _own_calls(name, adapter) for x in (result or [])]


def _own_calls(name: str, adapter: str) -> list:
    return [impl.function() for impl in _hook(name).get_hookimpls() if impl.plugin_name == adapter]


_reducers: tuple[Any, Mapping[type, list[Callable]]] | None = None


def reducers() -> Mapping[type, list[Callable]]:
    """Every live adapter's ``overmind_reducers``, as ``{type: [reducer, ...]}`` in hook order: where two claim
    one type, both are kept and tried in turn (``pickling.reducer_table`` adds the core's own after them). The
    same table object while the live adapters stay the same."""
    global _reducers
    stamp = (discovery.generation(), discovery.live_names())
    if _reducers is not None and _reducers[0] == stamp:
        return _reducers[1]
    table: dict[type, list[Callable]] = {}
    for part in _run("overmind_reducers"):
        for t, r in (part or {}).items():
            table.setdefault(t, []).append(r)
    _reducers = (stamp, table)
    return table


def prepare_result(result: Any, loader: Loader) -> ContextManager:
    """One context manager entering every adapter's ``overmind_prepare_result`` around pickling ``result``."""
    stack = contextlib.ExitStack()
    with stack:
        for cm in _run("overmind_prepare_result", result=result, loader=loader):
            stack.enter_context(cm)
        return stack.pop_all()


def entry_metadata(result: Any, loader: Loader) -> dict[str, Any]:
    """The adapters' facts about ``result``, merged (a later adapter's key wins), to store with its entry."""
    merged: dict[str, Any] = {}
    for part in _run("overmind_entry_metadata", result=result, loader=loader):
        merged.update(part)
    return merged


def derived_paths(result: Any, loader: Loader, arguments: Mapping[str, Any]) -> list[DerivedPath]:
    """Every adapter's places where ``result`` holds a path its library derived from one of the call's
    ``arguments``, in hook order."""
    return [place for part in _run("overmind_derived_paths", result=result, loader=loader, arguments=arguments)
            for place in part]


def before_unpickle(metadata: Mapping[str, Any]) -> None:
    """Let every adapter ready this process to unpickle an entry written with ``metadata``."""
    _run("overmind_before_unpickle", metadata=metadata)


def after_unpickle(result: Any, metadata: Mapping[str, Any]) -> Any:
    """``result`` as every adapter's ``overmind_after_unpickle`` leaves it, each given the previous one's."""
    return _run("overmind_after_unpickle", result=result, metadata=metadata)


def key_for_value(value: Any) -> Any:
    """A keyable stand-in for ``value`` from the first adapter that knows it, or ``None``."""
    return _run("overmind_key_for_value", value=value)


def key_parts(loader: Loader, arguments: dict[str, Any]) -> list[Any]:
    """Every adapter's extra key parts for this call (``arguments`` may be normalised in place)."""
    return _run("overmind_key_parts", loader=loader, arguments=arguments)


# -- how each kind is called -------------------------------------------------------------------------------

def _run(name: str, **kwargs: Any) -> Any:
    """Call hook ``name`` as its spec's kind says."""
    spec = SPECS[name]
    if spec.kind is Kind.FIRST:
        return _first(name, kwargs)
    if spec.kind is Kind.CHAINED:
        chained = spec.args[0]
        return _chain(name, chained, kwargs.pop(chained), kwargs)
    return _all(name, kwargs)  # ALL, MERGED, ENTERED: the caller merges or enters the results

def _hook(name: str) -> Any:
    return getattr(discovery.get_manager().hook, name)


def _impls(name: str) -> list:
    # pluggy calls the last registered implementation first; keep that order (tryfirst/trylast honoured)
    impls = reversed(_hook(name).get_hookimpls())
    if SPECS[name].when is When.ALWAYS:
        return list(impls)
    live = discovery.live_names()
    return [i for i in impls if i.plugin_name in live]


def _call_one(impl: Any, name: str, kwargs: dict) -> Any:
    """Call one adapter's hook; a failure is named and skipped (raised under OVERMIND_STRICT=1)."""
    try:
        return impl.function(**{a: kwargs[a] for a in impl.argnames})
    except Unkeyable:
        raise  # an adapter's way to say "do not cache this call": load() then calls the loader directly
    except Exception as e:
        interrupts.raise_users(e)
        if fallback.strict():
            raise
        fallback.step_aside(  # one warning per user call, at the user's line
            f"overmind: adapter {impl.plugin_name} failed in {name}: {type(e).__name__}: {e}; "
            f"continuing without it. Skip it with OVERMIND_DISABLED_ADAPTERS={impl.plugin_name}.", e)
        return None


def _all(name: str, kwargs: dict) -> list[Any]:
    """Each adapter's result that is not None, in hook order."""
    results = [_call_one(impl, name, kwargs) for impl in _impls(name)]
    return [r for r in results if r is not None]


def _chain(name: str, arg: str, value: Any, kwargs: dict) -> Any:
    """Pass ``value`` (as argument ``arg``) through each adapter's hook in turn; ``None`` keeps it."""
    for impl in _impls(name):
        result = _call_one(impl, name, {**kwargs, arg: value})
        if result is not None:
            value = result
    return value


def _first(name: str, kwargs: dict) -> Any:
    """The first result that is not None; the adapters after it are not called."""
    for impl in _impls(name):
        r = _call_one(impl, name, kwargs)
        if r is not None:
            return r
    return None
