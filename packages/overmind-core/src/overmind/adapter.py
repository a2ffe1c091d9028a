"""The adapter kit: what an Overmind adapter needs of the core, in one import, whatever library it
instruments. This module is a face: each name lives in the part of the core it belongs to.

An adapter is an object whose methods are its ``overmind_*`` hooks, or a module of hook functions,
named by an entry point of the group ``overmind.adapters`` (see :mod:`overmind.adapters.hookspecs`
and ``docs/adapters.md``; ``packages/_template`` is one to copy). The kit gives it:

- :data:`hookimpl`, the marker for its hooks; :class:`PatchTarget`, what ``overmind_patch_targets``
  returns; :class:`SelfCheck`, what ``overmind_self_check`` returns (how the adapter proves itself on a
  library version newer than its ``tested`` extra); :class:`DerivedPath`, what
  ``overmind_derived_paths`` returns (a place where a result holds a path its library derived from an
  argument);
- :class:`Spec`, :class:`Function`, :func:`resolve`, :func:`resolve_roots`, :func:`collect`,
  :func:`waiting_modules` and :func:`owns` (``overmind/adapters/specs.py``): loaders named as
  ``"module:Class"`` or ``"module:function"`` specs, resolved to patch targets, and whether a loader is
  one of them;
- :func:`label`, :func:`version_of` and :func:`warn` (``overmind/adapters/labels.py``): messages that
  name the adapter, the library and their versions;
- :class:`Uncacheable` (raise it from a key hook: this one call runs uncached, logged at debug),
  :class:`NotCacheable` (raise it while a result is readied for pickling: the user keeps the result,
  the message is the one warning) and :class:`NotCachedByDesign` (the same, logged at INFO instead of
  warned); :class:`PicklingFailed`, what the core raises for a result neither pickle nor dill can
  pickle (``overmind/errors.py``);
- :func:`raise_users`: in an ``except`` that swallows errors, let the user's interrupt through;
- :func:`patch_now`, :func:`is_patched`, :func:`get_original` (``overmind/adapters/patching.py``): a
  replacement an adapter installs while it runs, and the registry of the originals every patch keeps;
- :func:`code_keyed_by_adapter`: modules whose code the adapter keys and carries itself;
- :func:`fingerprint` (a file or folder as keys describe it), :func:`load_memo` (work a reducer reuses
  within one load), :func:`logger` (a logger that imports :mod:`logging` when it first logs);
- :func:`in_cache_mapping` and :func:`pages_untouched`: whether memory lies in a cache entry this
  process maps, and whether its pages are still as mapped; :func:`meta_intended` and
  :func:`reduce_script_module`, what an adapter asks of the entry codec.

Example (``overmind_mylib/plugin.py``)::

    from overmind.adapter import Spec, collect, hookimpl

    @hookimpl
    def overmind_patch_targets():
        return collect("mylib", [Spec("mylib.models:Model")])

Importing this module imports no library and no torch.
"""
from __future__ import annotations

from ._util.interrupts import raise_users
from ._util.lazy_logger import logger
from .adapters.derived_paths import DerivedPath
from .adapters.discovery import code_keyed_by_adapter
from .adapters.hookspecs import hookimpl
from .adapters.labels import label, version_of, warn
from .adapters.patching import PatchTarget, get_original, is_patched, patch_now
from .adapters.self_check import SelfCheck
from .adapters.specs import Function, Spec, collect, owns, resolve, resolve_roots, waiting_modules
from .entries import meta_intended, reduce_script_module
from .errors import NotCacheable, NotCachedByDesign, PicklingFailed
from .errors import Unkeyable as Uncacheable
from .keys.fingerprint import fingerprint
from .loading import load_memo
from .shm import in_cache_mapping, pages_untouched

__all__ = [
    # the hooks' records
    "hookimpl", "PatchTarget", "SelfCheck", "DerivedPath",
    # loaders named by spec
    "Spec", "Function", "resolve", "resolve_roots", "collect", "waiting_modules", "owns",
    # what an adapter says
    "label", "version_of", "warn", "Uncacheable", "NotCacheable", "NotCachedByDesign",
    "PicklingFailed", "raise_users",
    # what an adapter asks of the core
    "patch_now", "is_patched", "get_original", "code_keyed_by_adapter", "fingerprint", "load_memo",
    "logger", "in_cache_mapping", "pages_untouched", "meta_intended", "reduce_script_module",
]
