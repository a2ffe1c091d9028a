"""Overmind: load a model once per machine, then map it, zero-copy, into every process that asks. The public face
(``load``, ``activate``, ``deactivate``, ``cache_info``, ``evict``, ``hookimpl``, and every exception and warning a
program or an adapter meets: ``OvermindError``, ``OvermindWarning``, ``Uncacheable``, the evict errors, ...),
importing nothing heavy: the server imports this package and must never import torch.

>>> import overmind
>>> overmind.activate()                      # patch the installed adapters' loaders
>>> model = overmind.load(torch.load, path)  # or cache any loader call directly
>>> overmind.cache_info().entries            # what the cache holds (overmind ls), typed
>>> overmind.evict("63ef86")                 # drop an entry by any unique prefix (overmind evict)

This module imports nothing heavy: the server process imports the ``overmind`` package and must never
import torch. The public functions import their machinery on first use.

The modules the server or ``activate()`` import do not import :mod:`typing` either (the server starts without it;
what it costs: docs/architecture.md, "Measured costs"): they write ``TYPE_CHECKING = False`` and import their
annotations' names under ``if TYPE_CHECKING:``, which mypy reads as typing's own ``TYPE_CHECKING``.
"""
from __future__ import annotations

from ._util.user_frame import OvermindWarning
from ._version import __version__
from .errors import (
    NotCacheable,
    NotCachedByDesign,
    OvermindError,
    PicklingFailed,
    ProtocolMismatch,
    RuntimeDirError,
    ServerError,
    ServerUnavailable,
)
from .errors import Unkeyable as Uncacheable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, ContextManager, ParamSpec, TypeVar

    from .adapters.discovery import AdapterError
    from .adapters.hookspecs import hookimpl
    from .adapters.patching import PatchError
    from .fallback import CacheBypassed
    from .inspection import AmbiguousPrefix, CacheInfo, EvictResult, EvictUsage, NoSuchEntry, PrefixError

    P = ParamSpec("P")
    R = TypeVar("R")

def _watch_seeding() -> None:
    # From here on, torch's import is seen and whether the program seeds its generator (loading/draws/seeding.py)
    from .loading.draws import seeding

    seeding.watch()


_watch_seeding()

__all__ = [
    "load", "admitting", "activate", "deactivate", "cache_info", "evict", "hookimpl", "__version__",
    # every exception and warning a program or an adapter meets, the root first
    "OvermindError", "OvermindWarning", "CacheBypassed", "ServerUnavailable", "ServerError",
    "ProtocolMismatch", "RuntimeDirError", "AdapterError", "PatchError", "Uncacheable", "NotCacheable",
    "NotCachedByDesign", "PicklingFailed", "PrefixError", "NoSuchEntry", "AmbiguousPrefix", "EvictUsage",
]

# Exported names whose modules are imported when first asked for: the server imports this package, and
# inspection (dataclasses), discovery and patching are no part of what it needs.
_LATER = {
    "hookimpl": "adapters.hookspecs", "CacheBypassed": "fallback", "AdapterError": "adapters.discovery",
    "PatchError": "adapters.patching", "PrefixError": "inspection", "NoSuchEntry": "inspection",
    "AmbiguousPrefix": "inspection", "EvictUsage": "inspection",
}


def load(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Return ``fn(*args, **kwargs)``, served from the machine-wide cache when possible.

    Typed as ``fn`` is: a type checker takes the arguments ``fn`` takes, and the result for what ``fn`` returns.

    The first call of a key in the server's life runs ``fn`` plainly and leaves a mark; the next call, in this or
    any other process of the same user, runs ``fn`` and publishes the result (so does a call that arrives while
    another process is loading it); later calls get an equal, independent object whose tensors are mapped
    copy-on-write from shared memory. ``admit="first"`` publishes on the first call already (as
    ``OVERMIND_ADMIT=first`` and :func:`admitting` do); ``admit="reuse"`` keeps the default whatever that setting
    says. ``admit`` is Overmind's, never passed to ``fn``: a loader that takes an ``admit`` argument itself gets it
    through :func:`functools.partial`, and a type checker, which reads ``load`` as ``fn``, takes
    ``with overmind.admitting("first"):`` instead. Any failure of the cache gives the plain result with one
    warning. ``fn`` is a function, a classmethod, or a class, whose construction is then the load.

    >>> unet = overmind.load(UNet2DConditionModel.from_pretrained, ckpt, subfolder="unet")
    >>> st = overmind.load(SentenceTransformer, path, admit="first")
    """
    from .loading import flow

    admit = kwargs.pop("admit", None)
    if admit is None:
        return flow.load(fn, *args, **kwargs)
    with flow.admitting(admit):  # type: ignore[arg-type]  # (a bad value is the ValueError that names the fix)
        return flow.load(fn, *args, **kwargs)


def admitting(policy: str) -> ContextManager[None]:
    """Loads in this block (``overmind.load`` and the patched loaders, nested loads included) publish their entries
    by ``policy``: ``"first"`` on their first load, ``"reuse"`` once reused (the default, ``OVERMIND_ADMIT``).

    >>> with overmind.admitting("first"):
    ...     pipe = StableDiffusionPipeline.from_pretrained(path)   # published now: the next process hits
    """
    from .loading import admission_by_reuse

    return admission_by_reuse.admitting(policy)


def activate(*, strict: bool = False) -> list[str]:
    """Discover the installed adapters (entry points ``overmind.adapters``) and patch their loaders.

    Returns the names of the active adapters. Idempotent. An adapter that fails to import or patch is
    skipped with one warning, or raises with ``strict=True``.
    """
    from .activation import activate as _activate

    return _activate(strict=strict)


def deactivate() -> None:
    """Restore every patched attribute to its exact original object."""
    from .activation import deactivate as _deactivate

    _deactivate()


def cache_info(runtime_dir: str | None = None, *, processes: bool = True) -> CacheInfo:
    """The running server's status and entries (:class:`overmind.inspection.CacheInfo`, ``running=False`` when
    none runs); never starts a server. ``processes=False`` leaves out which processes map each entry (found
    by reading each process's ``/proc/<pid>/maps``): ``mapped_by`` is then None."""
    from .inspection import cache_info as _cache_info

    return _cache_info(runtime_dir, processes=processes)


def evict(*prefixes: str, all: bool = False, dry_run: bool = False, with_deps: bool = False,
          runtime_dir: str | None = None) -> EvictResult:
    """Evict entries by unique prefixes of their keys or entry ids (or ``all=True``); ``dry_run`` only says
    what would go and how many bytes it would free; ``with_deps`` also evicts what only they reference. Raises
    :class:`overmind.NoSuchEntry` for a prefix naming none (an empty one included),
    :class:`overmind.AmbiguousPrefix` for one naming several, and
    :class:`overmind.EvictUsage` for no prefix without ``all``, or prefixes with it (each a
    :class:`overmind.OvermindError`)."""
    from .inspection import evict as _evict

    return _evict(*prefixes, all=all, dry_run=dry_run, with_deps=with_deps, runtime_dir=runtime_dir)


def __getattr__(name: str) -> Any:
    module = _LATER.get(name)
    if module is None:
        raise AttributeError(f"module 'overmind' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
