"""Loaders named by spec and resolved to patch targets, and whether a loader is one of them.

A classmethod loader is named as ``"module:Class"`` (:class:`Spec`: the class's own loader and
every imported subclass that overrides it), a module-level one as ``"module:function"``
(:class:`Function`: where it is defined and everywhere its package re-exports it). :func:`collect`
resolves specs to patch targets; :func:`owns` tells whether an :class:`overmind.keys.key.Loader` is
one they name, and never imports.

>>> specs = [Spec("mylib.models:Model"), Function("mylib.models._factory:create_model")]
>>> targets = collect("mylib", specs)

Importing this module imports no library: ``activate()`` imports it with the adapters' plugins.
"""
from __future__ import annotations

import collections
import importlib
import sys

from .._util import interrupts
from .._util.lazy_logger import logger
from .labels import LazyLabel, dist_of, label, warn
from .patching import PatchTarget, get_original, is_patched

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, NamedTuple

_log = logger("overmind")

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
    """``where`` is ``"package.module:Class"``; ``attr`` the loader; ``subclasses``: also patch
    overriders.

    Subclasses matter because Python resolves ``Sub.from_pretrained`` to ``Sub``'s own override
    first: patching the base alone would miss ``AutoModelForCausalLM.from_pretrained``
    (transformers copies the method into every Auto class). Subclasses imported after
    ``activate()`` are not patched; when their override calls ``super().from_pretrained``, the
    inner load is still cached.

    ``lazy``: patch it only once the user imports its module, never import that module for the
    patch (diffusers' ``auto_pipeline`` imports every pipeline module: 0.7 s and 21 MiB in every
    process that never uses it). :func:`collect` leaves a lazy spec whose module is not imported
    out; :func:`waiting_modules` names those modules, for the adapter's ``overmind_patch_later``.
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
    """A module-level loader: ``where`` is ``"package.module:function"``, the module defining it.

    Libraries re-export their loaders (``timm.create_model``, ``timm.models.create_model`` and
    ``timm.models._factory.create_model`` are one function): :func:`collect` patches the function
    in its own module and in every imported module of its top-level package that holds it, under
    whatever name, and all of them route to the one original, so they share one key. A module that
    imported the function before ``activate()`` (``from timm import create_model`` at the top of a
    user's script) keeps the unpatched one: activate first. ``lazy``, as for :class:`Spec`.
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
    """The classes ``specs`` name that resolve; the others are skipped (:func:`collect` reports
    them), and so are lazy ones whose module is not imported (resolving them would import it) and
    :class:`Function` specs."""
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
    """Whether ``loader`` (an :class:`overmind.keys.key.Loader`) is one that ``specs`` name.

    A :class:`Spec` owns its attribute, exactly: ``Sub.from_pretrained`` for a ``Spec("lib:Base")``
    where ``Sub`` derives from ``Base`` and its ``from_pretrained`` is the one ``Base`` names or an
    override of it; another classmethod of the same class (``Sub.from_config``) is not owned, nor is
    the loader of another library that a class of ``lib`` happens to mix in. A :class:`Function`
    owns that function, however it was reached. A class (the older form,
    ``owns(loader, resolve_roots(SPECS))``) owns every classmethod of its subclasses.

    It never imports: a spec whose module is not imported yet owns nothing (no loader of it can have
    run), so a key hook, which runs in every process, may call it before the library is imported.
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
            if (isinstance(root, type) and issubclass(owner, root)
                    and _defines(owner, spec.attr, func)):
                return True
    return False


def _imported(where: str) -> Any:
    """The object ``"module:Qual.Name"`` names if its module is imported, else None (never
    imports)."""
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
    """Whether ``func`` is ``attr`` as a class of ``owner``'s MRO defines it, unpatched: the
    override Python resolves ``owner.attr`` to, or one it reaches through ``super()`` (a loader then
    bound to ``owner``)."""
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
    """Why the installed library does not define ``where``'s ``attr`` (its module, class or
    attribute is absent), or ``None`` when it does. Errors raised while importing a module that
    exists propagate."""
    module_name, _, qualname = where.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            return f"no module {e.name}"
        raise  # the module exists but imports one that does not: a fault, not a version difference
    for part in qualname.split("."):
        if not hasattr(obj, part):
            return f"no {part} in {getattr(obj, '__name__', type(obj).__name__)}"
        obj = getattr(obj, part)
    from inspect import getattr_static  # late, as below: plugins import this one at activate()

    try:
        getattr_static(obj, attr)
    except AttributeError:
        return f"no {attr} on {getattr(obj, '__qualname__', obj)}"
    return None


def waiting_modules(specs: Iterable[Spec | Function]) -> list[str]:
    """The modules of the lazy ``specs`` not imported yet, each once: what ``overmind_patch_later``
    returns."""
    return list(dict.fromkeys(spec.module for spec in specs if spec.waiting()))


def collect(adapter: str, specs: Iterable[Spec | Function]) -> list[PatchTarget]:
    """The patch targets of ``specs``, in a stable order, each (owner, attr) once: a :class:`Spec`'s
    class and its overriding subclasses (``kind="classmethod"``), a :class:`Function`'s module and
    the modules of its package that re-export it (``kind="function"``).

    A spec the installed library version does not define (its module, class or loader is absent: a
    newer class, or one a version dropped) is skipped with one debug line on the ``overmind``
    logger. A spec that exists but cannot be patched (its module fails to import, or the loader is
    no classmethod) is skipped with one warning naming the adapter, the target and both versions.
    The others still apply.
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


def _cannot_patch(adapter: str, name: str, e: Exception) -> None:
    """The one warning for a target that exists but whose module or loader failed to load."""
    interrupts.raise_users(e)
    warn(f"overmind: {label(adapter)} cannot patch {name}: {type(e).__name__}: {e}. Those loads "
         f"run without the cache; upgrade {dist_of(adapter)} or pin {adapter} to a version it "
         f"supports.")


def _not_defined(adapter: str, name: str, why: str) -> None:
    _log.debug("%s: %s is not defined in this version (%s); nothing to patch there",
               LazyLabel(adapter), name, why)


def _collect_one(adapter: str, spec: Spec | Function,
                 targets: dict[tuple[int, str], PatchTarget]) -> None:
    """Add the targets of one spec to ``targets`` (as :func:`collect` says)."""
    if isinstance(spec, Function):
        for target in _function_targets(adapter, spec):
            targets.setdefault((id(target.owner), target.name), target)
        return
    name = f"{spec.where.replace(':', '.')}.{spec.attr}"
    try:
        missing = _undefined(spec.where, spec.attr)
        if missing:
            _not_defined(adapter, name, missing)
            return
        root = resolve(spec.where)
        from inspect import getattr_static  # late: activate() imports this module; inspect: ~10 ms

        found = getattr_static(root, spec.attr)
    except Exception as e:
        interrupts.raise_users(e)
        _cannot_patch(adapter, name, e)
        return
    if not isinstance(found, classmethod):
        warn(f"overmind: {label(adapter)} cannot patch {name}: it is a "
             f"{type(found).__name__}, not a classmethod. Those loads run without the cache; "
             f"upgrade the adapter.")
        return
    classes = [root] + (sorted(_subclasses(root), key=lambda c: (c.__module__, c.__qualname__))
                        if spec.subclasses else [])
    for cls in classes:
        if _own_classmethod(cls, spec.attr) and (id(cls), spec.attr) not in targets:
            targets[(id(cls), spec.attr)] = PatchTarget(cls, spec.attr, kind="classmethod",
                                                        adapter=adapter)


def _function_targets(adapter: str, spec: Function) -> list[PatchTarget]:
    """The function's own module and every imported module of its top-level package holding it, in
    name order; nothing, with the same debug line or warning as a class spec, where the installed
    version lacks it or it is no function."""
    import types

    name = spec.where.replace(":", ".")
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as e:
        if e.name and (spec.module == e.name or spec.module.startswith(e.name + ".")):
            _not_defined(adapter, name, f"no module {e.name}")
            return []
        _cannot_patch(adapter, name, e)
        return []
    except Exception as e:
        interrupts.raise_users(e)
        _cannot_patch(adapter, name, e)
        return []
    if not hasattr(module, spec.name):
        _not_defined(adapter, name, f"no {spec.name} in {spec.module}")
        return []
    func = get_original(module, spec.name)
    if not isinstance(func, types.FunctionType):
        warn(f"overmind: {label(adapter)} cannot patch {name}: it is a {type(func).__name__}, "
             f"not a function. Those loads run without the cache; upgrade the adapter.")
        return []
    top = spec.module.partition(".")[0]
    found = [(spec.module, spec.name)]
    for module_name, other in sorted(sys.modules.copy().items()):
        if other is None or other is module:
            continue
        if not (module_name == top or module_name.startswith(top + ".")):
            continue
        for attr, value in list(vars(other).items()):
            if value is func or (is_patched(other, attr) and get_original(other, attr) is func):
                found.append((module_name, attr))
    return [PatchTarget(sys.modules[module_name], attr, kind="function", adapter=adapter)
            for module_name, attr in found]
