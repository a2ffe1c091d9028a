"""The hooks an Overmind adapter implements, each declared once (``SPECS``): what it takes, what it returns, how the
results of several adapters combine (its :class:`Kind`: all results, merged, chained, entered, first result) and in
which processes it runs (its :class:`When`); the ``hookimpl``/``hookspec`` markers.

An adapter is a module (or object) registered under the entry-point group ``overmind.adapters``; it
implements any of the hooks below with ``@overmind.hookimpl``. Example (``overmind_mylib/plugin.py``)::

    from overmind.adapter import PatchTarget, hookimpl

    @hookimpl
    def overmind_patch_targets():
        import mylib
        return [PatchTarget(mylib.Model, "load", kind="classmethod")]

Every hook runs in the user's process; none runs in the server. The core calls them through
:mod:`overmind.adapters.hooks`, one function per hook, which reads the kind and the "when" from :data:`SPECS`.
"""
from __future__ import annotations

import enum

from .._util.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, ContextManager, Mapping, Sequence

if TYPE_CHECKING:
    from ..keys.key import Loader
    from .derived_paths import DerivedPath
    from .patching import PatchTarget
    from .self_check import SelfCheck

PROJECT = "overmind"


# The markers write what pluggy's HookspecMarker/HookimplMarker("overmind") write (an "overmind_spec" or
# "overmind_impl" attribute holding the options dict its plugin manager reads), without importing pluggy:
# activate() imports this module through every adapter, and pluggy (with inspect and its TypedDicts) cost it
# ~17 ms. pluggy itself is imported when the first hook is called (discovery.get_manager).
class HookspecMarker:
    """``pluggy.HookspecMarker(project_name)``, the same attribute and options."""

    __slots__ = ("project_name",)

    def __init__(self, project_name: str) -> None:
        self.project_name = project_name

    def __call__(self, function: Callable | None = None, firstresult: bool = False, historic: bool = False,
                 warn_on_impl: Warning | None = None, warn_on_impl_args: Mapping[str, Warning] | None = None) -> Any:
        def mark(func: Callable) -> Callable:
            if historic and firstresult:
                raise ValueError("cannot have a historic firstresult hook")
            setattr(func, self.project_name + "_spec", {"firstresult": firstresult, "historic": historic,
                                                         "warn_on_impl": warn_on_impl,
                                                         "warn_on_impl_args": warn_on_impl_args})
            return func

        return mark if function is None else mark(function)


class HookimplMarker:
    """``pluggy.HookimplMarker(project_name)``: ``@overmind.hookimpl`` or ``@overmind.hookimpl(tryfirst=True)``,
    the same attribute and options."""

    __slots__ = ("project_name",)

    def __init__(self, project_name: str) -> None:
        self.project_name = project_name

    def __call__(self, function: Callable | None = None, hookwrapper: bool = False, optionalhook: bool = False,
                 tryfirst: bool = False, trylast: bool = False, specname: str | None = None,
                 wrapper: bool = False) -> Any:
        def mark(func: Callable) -> Callable:
            setattr(func, self.project_name + "_impl", {"wrapper": wrapper, "hookwrapper": hookwrapper,
                                                         "optionalhook": optionalhook, "tryfirst": tryfirst,
                                                         "trylast": trylast, "specname": specname})
            return func

        return mark if function is None else mark(function)


hookspec = HookspecMarker(PROJECT)
hookimpl = HookimplMarker(PROJECT)


class Kind(str, enum.Enum):
    """How the results of the adapters implementing one hook combine. Each adapter's hook is called on its
    own (a failing adapter is named and skipped), the last registered first, as pluggy orders them."""

    ALL = "all results"  # every adapter's result that is not None, in hook order
    MERGED = "merged"  # every adapter's mapping, merged into one
    CHAINED = "chained"  # one value passed through each adapter in turn; None keeps it
    ENTERED = "entered"  # every adapter's context manager, entered together around one step
    FIRST = "first result"  # the first result that is not None; the adapters after it are not called


class When(str, enum.Enum):
    """In which processes an adapter's hook runs."""

    # Once the adapter's libraries are imported in this process: before that no object of theirs can exist.
    LIVE = "once its library is imported"
    # In every process, whatever it imported: an entry being unpickled needs its adapters before the library
    # is imported (the unpickling imports it), and a value reaches a key before the load imports its library
    # (a BitsAndBytesConfig before bitsandbytes). These hooks look values up in sys.modules, never import.
    ALWAYS = "in every process"


class HookSpec(Frozen):
    """One hook: its name, how results combine, where it runs, and its parameters (a CHAINED hook passes its
    first one on)."""

    name: str
    kind: Kind
    when: When
    args: tuple[str, ...]
    __slots__ = _fields = _compared = ("name", "kind", "when", "args")

    def __init__(self, name: str, kind: Kind, when: When, args: tuple[str, ...]):
        for f, v in zip(self._fields, (name, kind, when, args)):
            object.__setattr__(self, f, v)


SPECS: dict[str, HookSpec] = {}


def _declare(kind: Kind, when: When) -> Callable[[Callable], Callable]:
    def declare(fn: Callable) -> Callable:
        code = fn.__code__
        assert not code.co_flags & 0x0C, f"hookspec {fn.__name__}: no *args or **kwargs"  # CO_VARARGS | CO_VARKEYWORDS
        args = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]  # its parameters, in order
        SPECS[fn.__name__] = HookSpec(fn.__name__, kind, when, args)
        return hookspec(firstresult=kind is Kind.FIRST)(fn)

    return declare


@_declare(Kind.ALL, When.LIVE)
def overmind_patch_targets() -> Sequence[PatchTarget]:
    """Return the loaders this adapter caches, as a list of :class:`overmind.adapter.PatchTarget`.

    Called by ``overmind.activate()``, for each adapter on its own, once its library is imported. Each
    target's attribute is replaced by a wrapper that routes the call through ``overmind.load``;
    ``overmind.deactivate()`` puts the identical original object back. Import the library inside the hook:
    an ``ImportError`` here skips the adapter with one warning.
    """


@_declare(Kind.ALL, When.LIVE)
def overmind_patch_later() -> Sequence[str]:
    """Return the modules whose loaders this adapter patches only once the user imports them.

    For a module too costly to import for every process that never uses it (diffusers' ``auto_pipeline``
    imports every pipeline). Called right after ``overmind_patch_targets``, for each adapter on its own; when
    one of these modules is imported, ``activate()`` calls ``overmind_patch_targets`` again and patches what
    it returns that is not patched yet. ``overmind.adapter.waiting_modules`` answers it for lazy ``Spec`` entries.
    """


@_declare(Kind.ALL, When.LIVE)
def overmind_self_check() -> SelfCheck | None:
    """Return what proves this adapter on a library version outside its ``tested`` range, as an
    :class:`overmind.adapter.SelfCheck`, or ``None``.

    Called by ``overmind.activate()``, for this adapter alone, once its library is imported and only where an
    installed version lies outside the adapter's ``tested`` extra. The core then checks that every patch target
    still takes the parameters ``relies_on`` names, and (once per environment, remembered) that the object
    ``sample()`` builds comes back from the entry codec equal to itself. A failure leaves the adapter off, with
    one warning naming the library, its version and what failed.
    """


@_declare(Kind.MERGED, When.LIVE)
def overmind_reducers() -> Mapping[type, Callable[[Any], tuple]]:
    """Return ``{type: reducer}`` for objects the default pickling cannot handle or handles slowly.

    A reducer takes the object and returns a ``__reduce__``-style tuple ``(callable, args[, state, ...])``.
    It applies to instances of the type and of its subclasses: the most specific registered type is tried
    first, and a reducer may return ``NotImplemented`` to pass the object on (to another adapter's reducer
    for the same or a base type, then to the default pickling). The tables of all adapters are merged: where
    two claim one type, both are kept, in hook order.
    Tensors and storages inside ``args`` are stored out of band, zero-copy, as everywhere else. Example::

        @overmind.hookimpl
        def overmind_reducers():
            return {Params4bit: reduce_params4bit}
    """


@_declare(Kind.ENTERED, When.LIVE)
def overmind_prepare_result(result: Any, loader: Loader) -> ContextManager | None:
    """Return a context manager that readies ``result`` for pickling, or ``None``.

    Entered just before ``result`` is pickled and exited right after, whether pickling worked or not: strip
    what cannot or should not be pickled (accelerate hooks, device guards) in ``__enter__`` and put it back in
    ``__exit__``, so the loading process keeps a working object even when caching fails. ``loader`` is the
    :class:`overmind.keys.key.Loader` being cached.
    """


@_declare(Kind.MERGED, When.LIVE)
def overmind_entry_metadata(result: Any, loader: Loader) -> Mapping[str, Any] | None:
    """Return JSON-serialisable facts the client needs before unpickling this entry (for example the folder
    of a dynamic module), or ``None``. The dicts of all adapters are merged and stored with the entry; they
    come back to :func:`overmind_before_unpickle` and :func:`overmind_after_unpickle` in every later process.
    """


@_declare(Kind.ALL, When.LIVE)
def overmind_derived_paths(result: Any, loader: Loader,
                           arguments: Mapping[str, Any]) -> Sequence[DerivedPath] | None:
    """Return where ``result`` holds a path the library derived from one of the call's ``arguments``, as
    :class:`overmind.adapter.DerivedPath` records, or ``None``.

    Calls that name one folder by different spellings (``m``, ``./m``, ``/abs/m/``) share an entry, since their
    keys describe the folder; plain keeps each caller's own spelling where the library derives a string from it
    (``model.config._name_or_path``, a pipeline component's ``<path>/unet``). Called when a result is written as
    an entry. The core keeps the places whose value is the argument, ``str()`` of a ``pathlib`` argument, or
    ``os.path.join`` of it and a tail, and a hit writes there what its own argument gives. Name only places the
    library fills from the argument: a string that merely equals it (a ``model_type`` of the folder's name) must
    stay as it is.
    """


@_declare(Kind.ALL, When.ALWAYS)
def overmind_before_unpickle(metadata: Mapping[str, Any]) -> None:
    """Prepare this process to unpickle an entry (for example register ``transformers_modules``).

    ``metadata`` is the merged result of :func:`overmind_entry_metadata` when the entry was written.
    """


@_declare(Kind.CHAINED, When.ALWAYS)
def overmind_after_unpickle(result: Any, metadata: Mapping[str, Any]) -> Any:
    """Finish an object rebuilt from the cache (for example re-attach device guards).

    Every adapter gets its turn, in hook order: each one receives the object as the previous one left it
    and returns a replacement, or ``None`` to keep it. A miss whose result holds no storage returns the
    loader's own object, which is not rebuilt and so not passed here.
    """


@_declare(Kind.FIRST, When.ALWAYS)
def overmind_key_for_value(value: Any) -> Any:
    """Return a keyable stand-in for an argument value the core does not know, or ``None``.

    The stand-in must be built from ``None``, bools, numbers, strings, bytes, tuples, lists and dicts of
    those. Example: ``BitsAndBytesConfig`` -> ``("BitsAndBytesConfig", config.to_dict())``. A value nobody can
    key makes ``load`` call the loader directly, uncached.
    """


@_declare(Kind.ALL, When.ALWAYS)
def overmind_key_parts(loader: Loader, arguments: dict[str, Any]) -> Sequence[Any] | None:
    """Return extra key parts for this call, or ``None``; may also normalise ``arguments`` in place.

    ``arguments`` maps parameter names to values after binding to the loader's signature with defaults
    applied (``**kwargs`` flattened into it). Use it to add what the arguments do not show, for example the
    resolved revision of a Hub snapshot, or to fold aliases (``torch_dtype=`` into ``dtype=``). Raise
    :class:`overmind.adapter.Uncacheable` to leave this one call uncached (the loader runs directly, debug
    log only).
    """
