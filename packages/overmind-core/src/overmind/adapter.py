"""The adapter kit: what an Overmind adapter needs, in one import, whatever library it instruments.

An adapter is a module of ``overmind_*`` hooks registered under the entry-point group ``overmind.adapters``
(see :mod:`overmind.adapters.hookspecs` and ``docs/adapters.md``). This module gives it:

- :data:`hookimpl`, the marker for its hooks, and :class:`PatchTarget`, what ``overmind_patch_targets`` returns;
- :class:`SelfCheck`, what ``overmind_self_check`` returns: how the adapter proves itself on a library version
  newer than its ``tested`` extra (the parameters its loaders must take, a tiny sample for the entry codec);
- :class:`DerivedPath`, what ``overmind_derived_paths`` returns: a place where a result holds a path its library
  derived from the call's argument, written as each hit's caller spells that argument;
- :class:`Spec`, :class:`Function`, :func:`resolve`, :func:`collect` and :func:`owns`: loaders named as
  ``"module:Class"`` specs (each class's own loader plus every imported subclass that overrides it) or as
  ``"module:function"`` specs (the function where it is defined and everywhere its package re-exports it),
  resolved to patch targets, and whether a :class:`overmind.keys.key.Loader` is one of them;
- :func:`label` and :func:`warn`: warnings that name the adapter, its version, the library and its version;
- :class:`Uncacheable` (raise it from a key hook to leave one call uncached) and :class:`NotCacheable` (raise
  it while a result is readied for pickling: the message says why and what to do); :class:`PicklingFailed`, what
  the core raises for a result neither pickle nor dill can pickle;
- :func:`raise_users`: in an ``except`` that swallows errors, let the user's interrupt through (a signal
  handler's exception, Ctrl-C);
- :func:`patch_now`, :func:`is_patched`, :func:`get_original`: a replacement an adapter installs while it runs,
  and the registry of the originals every patch keeps;
- :func:`fingerprint` (a file or folder as keys describe it), :func:`load_memo` (work a reducer reuses within one
  load), :func:`logger` (a logger that imports :mod:`logging` when it first logs);
- :func:`in_cache_mapping` and :func:`pages_untouched`: whether memory lies in a cache entry this process maps,
  and whether its pages are still as mapped; :func:`reduce_script_module`, the core's reduce of TorchScript.

Example (``overmind_mylib/plugin.py``)::

    from overmind.adapter import Spec, collect, hookimpl

    @hookimpl
    def overmind_patch_targets():
        return collect("mylib", [Spec("mylib.models:Model")])

Importing this module imports no library and no torch.
"""
from __future__ import annotations

import collections
import importlib
import sys
from functools import cache

from ._util import interrupts
from ._util.interrupts import raise_users
from ._util.lazy_logger import logger
from .adapters import patching
from .adapters.derived_paths import DerivedPath
from .adapters.hookspecs import hookimpl
from .adapters.patching import PatchTarget, get_original, is_patched
from .adapters.self_check import SelfCheck
from .errors import OvermindError, PicklingFailed
from .errors import Unkeyable as Uncacheable  # key.Unkeyable: importing key costs activation its hashing

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, NamedTuple

__all__ = ["hookimpl", "PatchTarget", "SelfCheck", "DerivedPath", "Spec", "Function", "resolve", "resolve_roots",
           "collect", "waiting_modules", "owns", "label", "warn",
           "version_of", "dist_of", "Uncacheable", "uncacheable", "NotCacheable", "NotCachedByDesign",
           "meta_intended", "code_keyed_by_adapter", "PicklingFailed", "raise_users", "patch_now", "is_patched",
           "get_original", "fingerprint", "load_memo", "logger", "in_cache_mapping", "pages_untouched",
           "reduce_script_module"]


# --- what an adapter says when it cannot do its job ------------------------------------------------------

class NotCacheable(OvermindError, RuntimeError):
    """The loaded object cannot be cached; the message says why and what to do (the user keeps the object)."""

    has_fix = True  # the core adds no generic advice after this message


class NotCachedByDesign(NotCacheable):
    """The loaded object is one the adapter never caches, by design (a model dispatched over devices with disk
    offload): the call is logged at INFO with the message, never warned, even under ``OVERMIND_STRICT=1``. A
    warning is for a fault the user can act on; a refusal by design is not one.

    >>> raise NotCachedByDesign(f"{label('mylib')}: {loader.name} returned a model offloaded to disk")
    """

    by_design = True  # what overmind.fallback reads (it does not import the kit)


def meta_intended() -> None:
    """Say, inside an ``overmind_prepare_result`` context, that the meta tensors of the result being readied are
    meant: a model offloaded to disk whose hooks load those weights at call time, carried by the adapter. Without
    it, a result holding meta tensors is published only when its key says the call was made to produce them
    (``init_empty_weights``, a meta default device); otherwise it is returned unpublished, with an INFO line.
    """
    from .entries.codec import intend_meta  # at call time: the entry codec imports torch

    intend_meta()


def code_keyed_by_adapter(*prefixes: str) -> None:
    """Say that modules under these names (``"transformers_modules"``) hold code this adapter keys itself and
    carries in its entries (a library's copies of a model folder's code): the core then does not make an entry
    vary with their files (a loader's user modules do, see ``overmind/loading/code_deps.py``).

    >>> code_keyed_by_adapter("transformers_modules", "diffusers_modules")
    """
    from .adapters import discovery

    discovery.code_keyed_prefixes.update(prefixes)


def uncacheable(reason: str) -> Uncacheable:
    """The exception a key hook raises to leave one call uncached (the loader runs directly, debug log only):
    ``raise uncacheable("a state dict, not a file")``."""
    return Uncacheable(reason)


@cache
def version_of(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``"not installed"``."""
    from ._util import distributions  # what importlib.metadata finds, without its email parser (~2 ms a call)

    return distributions.version(dist) or "not installed"


def dist_of(adapter: str) -> str:
    """The distribution that ships adapter ``adapter``: ``overmind-<adapter>`` by convention."""
    return f"overmind-{adapter}"


def label(adapter: str, library: str | None = None) -> str:
    """``adapter transformers (overmind-transformers 0.1.0, transformers 5.24.0)``; the library is the
    adapter's namesake unless named."""
    dist, library = dist_of(adapter), library or adapter
    return f"adapter {adapter} ({dist} {version_of(dist)}, {library} {version_of(library)})"


def warn(message: str, stacklevel: int = 3) -> None:
    """One :class:`overmind.fallback.OvermindWarning` (an error under ``OVERMIND_STRICT=1``)."""
    from . import fallback

    fallback.step_aside(message, stacklevel=stacklevel + 1)


# --- what the core does that an adapter may ask of it ------------------------------------------------------

def patch_now(target: PatchTarget) -> bool:
    """Install ``target``, a ``kind="replace"`` patch, at once: for a replacement an adapter decides on while it
    runs (a conversion it takes over the first time it is met) rather than one it lists in
    ``overmind_patch_targets``. The original is kept in the one registry (:func:`get_original`); returns False
    where ``target`` is patched already."""
    return patching.apply(target)


def fingerprint(path: str) -> tuple:
    """What a key holds of the file or folder ``path``: size, mtime, ctime, inode and device of each file (a
    folder's files in order); a change of any of them makes another key. Raises :class:`Uncacheable` for a folder
    of more files than a key describes."""
    from .keys.fingerprint import fingerprint as _fingerprint  # at call time: activate() imports the kit

    return _fingerprint(path)


def load_memo(name: str) -> dict:
    """The memo called ``name`` while a load runs in this process (its nested loads included), emptied when the
    last load returns; outside a load, a new empty dict each time. A reducer keeps work there that another reduce
    in the same load may reuse, after checking itself that it fits: the memo decides nothing about keys."""
    from .loading import scope

    return scope.memo(name)


def in_cache_mapping(address: int) -> bool:
    """Whether ``address`` lies in a cache entry (or a checkpoint file) this process maps for a hit."""
    from .shm import mappings

    return mappings.contains(address)


def pages_untouched(ranges: list[tuple[int, int]]) -> bool:
    """Whether every ``(address, nbytes)`` range of a cache mapping still holds the bytes it was mapped with: no
    page of it written since (``/proc/self/pagemap``); False where that cannot be told."""
    from .shm import pagemap

    return pagemap.all_pristine(ranges)


def reduce_script_module(module: Any) -> tuple:
    """The core's reduce of a TorchScript module, ``(rebuild, args)``: its archive as one storage, rebuilt
    without a copy. For an adapter whose objects hold TorchScript modules the pickler does not meet as such."""
    from .entries import torchscript

    return torchscript.reduce_script_module(module)


# --- loaders named by spec -------------------------------------------------------------------------------

if TYPE_CHECKING:
    class _SpecFields(NamedTuple):
        where: str
        attr: str = "from_pretrained"
        subclasses: bool = True
        lazy: bool = False
else:  # the same tuple, made by collections (no typing at run time: see overmind/__init__.py)
    _SpecFields = collections.namedtuple("Spec", ("where", "attr", "subclasses", "lazy"),
                                         defaults=("from_pretrained", True, False))


class Spec(_SpecFields):
    """``where`` is ``"package.module:Class"``; ``attr`` the loader; ``subclasses``: also patch overriders.

    Subclasses matter because Python resolves ``Sub.from_pretrained`` to ``Sub``'s own override first:
    patching the base alone would miss ``AutoModelForCausalLM.from_pretrained`` (transformers copies the
    method into every Auto class). Subclasses imported after ``activate()`` are not patched; when their
    override calls ``super().from_pretrained``, the inner load is still cached.

    ``lazy``: patch it only once the user imports its module, never import that module for the patch (diffusers'
    ``auto_pipeline`` imports every pipeline module: 0.7 s and 21 MiB in every process that never uses it).
    :func:`collect` leaves a lazy spec whose module is not imported out; :func:`waiting_modules` names those
    modules, for the adapter's ``overmind_patch_later`` hook.
    """

    __slots__ = ()

    @property
    def module(self) -> str:
        return self.where.partition(":")[0]

    def waiting(self) -> bool:
        """Lazy, and its module not imported yet: nothing to patch until it is."""
        return self.lazy and self.module not in sys.modules


if TYPE_CHECKING:
    class _FunctionFields(NamedTuple):
        where: str
        lazy: bool = False
else:
    _FunctionFields = collections.namedtuple("Function", ("where", "lazy"), defaults=(False,))


class Function(_FunctionFields):
    """A module-level loader: ``where`` is ``"package.module:function"``, the module that defines it.

    Libraries re-export their loaders (``timm.create_model``, ``timm.models.create_model`` and
    ``timm.models._factory.create_model`` are one function): :func:`collect` patches the function in its own
    module and in every imported module of its top-level package that holds it, under whatever name, and all
    of them route to the one original, so they share one key. A module that imported the function before
    ``activate()`` (``from timm import create_model`` at the top of a user's script) keeps the unpatched one:
    activate first. ``lazy``, as for :class:`Spec`.
    """

    __slots__ = ()

    @property
    def module(self) -> str:
        return self.where.partition(":")[0]

    @property
    def name(self) -> str:
        return self.where.partition(":")[2]

    def waiting(self) -> bool:
        return self.lazy and self.module not in sys.modules


def resolve(where: str) -> Any:
    """Import ``"package.module:Qual.Name"`` and return the object."""
    module_name, _, qualname = where.partition(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_roots(specs: Iterable[Spec | Function]) -> tuple[type, ...]:
    """The classes ``specs`` name that resolve; the others are skipped (:func:`collect` reports them), and so
    are lazy ones whose module is not imported (resolving them would import it) and :class:`Function` specs."""
    out = []
    for spec in specs:
        if isinstance(spec, Function) or spec.waiting():
            continue
        try:
            out.append(resolve(spec.where))
        except (ImportError, AttributeError):
            pass
    return tuple(out)


def owns(loader: Any, specs: Iterable[Spec | Function | type]) -> bool:
    """Whether ``loader`` (an :class:`overmind.keys.key.Loader`) is one of the loaders ``specs`` name.

    A :class:`Spec` owns its attribute, exactly: ``Sub.from_pretrained`` for a ``Spec("lib:Base")`` where ``Sub``
    derives from ``Base`` and its ``from_pretrained`` is the one ``Base`` names or an override of it; another
    classmethod of the same class (``Sub.from_config``) is not owned, nor is the loader of another library that
    a class of ``lib`` happens to mix in. A :class:`Function` owns that function, however it was reached. A
    class (the older form, ``owns(loader, resolve_roots(SPECS))``) owns every classmethod of its subclasses.

    It never imports: a spec whose module is not imported yet owns nothing (no loader of it can have run), so a
    key hook, which runs in every process, may call it before the library is imported.
    """
    owner = getattr(loader, "owner", None)
    func = getattr(loader, "func", None)
    for spec in specs:
        if isinstance(spec, type):
            if isinstance(owner, type) and issubclass(owner, spec):
                return True
        elif isinstance(spec, Function):
            if owner is None and func is not None and func is _imported_function(spec):
                return True
        elif isinstance(owner, type) and func is not None:
            root = _imported(spec.where)
            if isinstance(root, type) and issubclass(owner, root) and _defines(owner, spec.attr, func):
                return True
    return False


def _imported(where: str) -> Any:
    """The object ``"module:Qual.Name"`` names if its module is imported, else None (never imports)."""
    module_name, _, qualname = where.partition(":")
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _imported_function(spec: Function) -> Any:
    """The original function ``spec`` names (not its patch), if its module is imported."""
    module = sys.modules.get(spec.module)
    if module is None or not hasattr(module, spec.name):
        return None
    return get_original(module, spec.name)


def _defines(owner: type, attr: str, func: Any) -> bool:
    """Whether ``func`` is ``attr`` as a class of ``owner``'s MRO defines it, unpatched: the override Python
    resolves ``owner.attr`` to, or one it reaches through ``super()`` (a loader then bound to ``owner``)."""
    for cls in owner.__mro__:
        if attr in vars(cls):
            found = get_original(cls, attr)
            if getattr(found, "__func__", found) is func:
                return True
    return False


def _subclasses(root: type) -> list[type]:
    seen: set[type] = set()
    out: list[type] = []
    todo: list[type] = [root]
    while todo:
        cls = todo.pop()
        subs: list[type] = cls.__subclasses__()
        for sub in subs:
            if sub not in seen:
                seen.add(sub)
                out.append(sub)
                todo.append(sub)
    return out


def _own_classmethod(cls: type, attr: str) -> bool:
    return isinstance(vars(cls).get(attr), classmethod)


def _undefined(where: str, attr: str) -> str | None:
    """Why the installed library does not define ``where``'s ``attr`` (its module, class or attribute is
    absent), or ``None`` when it does. Errors raised while importing a module that exists propagate."""
    module_name, _, qualname = where.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            return f"no module {e.name}"
        raise  # the module exists but imports something that does not: a fault, not a version difference
    for part in qualname.split("."):
        if not hasattr(obj, part):
            return f"no {part} in {getattr(obj, '__name__', type(obj).__name__)}"
        obj = getattr(obj, part)
    from inspect import getattr_static  # late, as below: plugin modules import this one at activate()

    try:
        getattr_static(obj, attr)
    except AttributeError:
        return f"no {attr} on {getattr(obj, '__qualname__', obj)}"
    return None


_log = logger("overmind")


class _Label:
    """``label(adapter)`` for a debug record, read when the record is formatted: the versions it names are read from
    the installed metadata, and a debug record is mostly dropped (a spec this version does not define is
    collected again on each later module's import)."""

    __slots__ = ("adapter",)

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter

    def __str__(self) -> str:
        return label(self.adapter)


def waiting_modules(specs: Iterable[Spec | Function]) -> list[str]:
    """The modules of the lazy ``specs`` not imported yet, each once: what ``overmind_patch_later`` returns."""
    return list(dict.fromkeys(spec.module for spec in specs if spec.waiting()))


def collect(adapter: str, specs: Iterable[Spec | Function]) -> list[PatchTarget]:
    """The patch targets of ``specs``, in a stable order, each (owner, attr) once: a :class:`Spec`'s class and
    its overriding subclasses (``kind="classmethod"``), a :class:`Function`'s module and the modules of its
    package that re-export it (``kind="function"``).

    A spec the installed library version does not define (its module, class or loader is absent: a newer
    class, or one a version dropped) is skipped with one debug line on the ``overmind`` logger. A spec that
    exists but cannot be patched (its module fails to import, or the loader is no classmethod) is skipped
    with one warning naming the adapter, the target and both versions. The others still apply.
    """
    targets: dict[tuple[int, str], PatchTarget] = {}
    specs = list(specs)
    waiting = [spec for spec in specs if spec.waiting()]
    for spec in specs:
        if spec in waiting:
            continue  # lazy, its module not imported: patched once it is (waiting_modules)
        _collect_one(adapter, spec, targets)
    # a lazy spec whose module another spec's import brought in: waiting_modules no longer names it
    for spec in waiting:
        if not spec.waiting():
            _collect_one(adapter, spec, targets)
    return list(targets.values())


def _collect_one(adapter: str, spec: Spec | Function, targets: dict[tuple[int, str], PatchTarget]) -> None:
    """Add the targets of one spec to ``targets`` (as :func:`collect` says)."""
    if isinstance(spec, Function):
        for target in _function_targets(adapter, spec):
            targets.setdefault((id(target.owner), target.name), target)
        return
    name = f"{spec.where.replace(':', '.')}.{spec.attr}"
    try:
        missing = _undefined(spec.where, spec.attr)
        if missing:
            _log.debug("%s: %s is not defined in this version (%s); nothing to patch there",
                       _Label(adapter), name, missing)
            return
        root = resolve(spec.where)
        from inspect import getattr_static  # late: activate() imports this module, and inspect costs ~10 ms

        found = getattr_static(root, spec.attr)
    except Exception as e:
        interrupts.raise_users(e)
        warn(f"overmind: {label(adapter)} cannot patch {name}: {type(e).__name__}: {e}. Those loads run "
             f"without the cache; upgrade {dist_of(adapter)} or pin {adapter} to a version it supports.")
        return
    if not isinstance(found, classmethod):
        warn(f"overmind: {label(adapter)} cannot patch {name}: it is a "
             f"{type(found).__name__}, not a classmethod. Those loads run without the cache; upgrade the adapter.")
        return
    classes = [root] + (sorted(_subclasses(root), key=lambda c: (c.__module__, c.__qualname__))
                        if spec.subclasses else [])
    for cls in classes:
        if _own_classmethod(cls, spec.attr) and (id(cls), spec.attr) not in targets:
            targets[(id(cls), spec.attr)] = PatchTarget(cls, spec.attr, kind="classmethod", adapter=adapter)


def _function_targets(adapter: str, spec: Function) -> list[PatchTarget]:
    """The function's own module and every imported module of its top-level package holding it, in name order;
    nothing, with the same debug line or warning as a class spec, where the installed version lacks it or it is
    no function."""
    import types

    name = spec.where.replace(":", ".")
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as e:
        if e.name and (spec.module == e.name or spec.module.startswith(e.name + ".")):
            _log.debug("%s: %s is not defined in this version (no module %s); nothing to patch there",
                       _Label(adapter), name, e.name)
            return []
        interrupts.raise_users(e)
        warn(f"overmind: {label(adapter)} cannot patch {name}: {type(e).__name__}: {e}. Those loads run without the "
             f"cache; upgrade {dist_of(adapter)} or pin {adapter} to a version it supports.")
        return []
    except Exception as e:
        interrupts.raise_users(e)
        warn(f"overmind: {label(adapter)} cannot patch {name}: {type(e).__name__}: {e}. Those loads run without the "
             f"cache; upgrade {dist_of(adapter)} or pin {adapter} to a version it supports.")
        return []
    if not hasattr(module, spec.name):
        _log.debug("%s: %s is not defined in this version (no %s in %s); nothing to patch there",
                   _Label(adapter), name, spec.name, spec.module)
        return []
    func = get_original(module, spec.name)
    if not isinstance(func, types.FunctionType):
        warn(f"overmind: {label(adapter)} cannot patch {name}: it is a {type(func).__name__}, not a function. "
             f"Those loads run without the cache; upgrade the adapter.")
        return []
    top = spec.module.partition(".")[0]
    found = [(spec.module, spec.name)]
    for module_name, other in sorted(sys.modules.copy().items()):
        if other is None or other is module or not (module_name == top or module_name.startswith(top + ".")):
            continue
        for attr, value in list(vars(other).items()):
            if value is func or (is_patched(other, attr) and get_original(other, attr) is func):
                found.append((module_name, attr))
    return [PatchTarget(sys.modules[module_name], attr, kind="function", adapter=adapter)
            for module_name, attr in found]
