"""The hooks an Overmind adapter implements.

An adapter is a module (or object) registered under the entry-point group ``overmind.adapters``; it
implements any of the hooks below with ``@overmind.hookimpl``. Example (``overmind_mylib/plugin.py``)::

    import overmind
    from overmind.patching import PatchTarget

    @overmind.hookimpl
    def overmind_patch_targets():
        import mylib
        return [PatchTarget(mylib.Model, "load", kind="classmethod")]

Every hook runs in the user's process; none runs in the server.
"""
from __future__ import annotations

from typing import Any, Callable, ContextManager, Mapping, Sequence

import pluggy

PROJECT = "overmind"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def overmind_patch_targets() -> Sequence[Any]:
    """Return the loaders this adapter caches, as a list of :class:`overmind.patching.PatchTarget`.

    Called by ``overmind.activate()``. Each target's attribute is replaced by a wrapper that routes the call
    through ``overmind.load``; ``overmind.deactivate()`` puts the identical original object back. Import the
    library inside the hook: an ``ImportError`` here skips the adapter with one warning.
    """


@hookspec
def overmind_reducers() -> Mapping[type, Callable[[Any], tuple]]:
    """Return ``{type: reducer}`` for objects the default pickling cannot handle or handles slowly.

    A reducer takes the object and returns a ``__reduce__``-style tuple ``(callable, args[, state, ...])``.
    It applies to instances of the type and of its subclasses: the most specific registered type is tried
    first, and a reducer may return ``NotImplemented`` to pass the object on (to another adapter's reducer
    for the same or a base type, then to the default pickling).
    Tensors and storages inside ``args`` are stored out of band, zero-copy, as everywhere else. Example::

        @overmind.hookimpl
        def overmind_reducers():
            return {Params4bit: reduce_params4bit}
    """


@hookspec
def overmind_prepare_result(result: Any, loader: Any) -> ContextManager | None:
    """Return a context manager that readies ``result`` for pickling, or ``None``.

    Entered just before ``result`` is pickled and exited right after, whether pickling worked or not: strip
    what cannot or should not be pickled (accelerate hooks, device guards) in ``__enter__`` and put it back in
    ``__exit__``, so the loading process keeps a working object even when caching fails. ``loader`` is the
    :class:`overmind.key.Loader` being cached.
    """


@hookspec
def overmind_entry_metadata(result: Any, loader: Any) -> Mapping[str, Any] | None:
    """Return JSON-serialisable facts the client needs before unpickling this entry (for example the folder
    of a dynamic module), or ``None``. The dicts of all adapters are merged and stored with the entry; they
    come back to :func:`overmind_before_unpickle` and :func:`overmind_after_unpickle` in every later process.
    """


@hookspec
def overmind_before_unpickle(metadata: Mapping[str, Any]) -> None:
    """Prepare this process to unpickle an entry (for example register ``transformers_modules``).

    ``metadata`` is the merged result of :func:`overmind_entry_metadata` when the entry was written.
    """


@hookspec
def overmind_after_unpickle(result: Any, metadata: Mapping[str, Any]) -> Any:
    """Finish an object rebuilt from the cache (for example re-attach device guards).

    Every adapter gets its turn, in hook order: each one receives the object as the previous one left it
    and returns a replacement, or ``None`` to keep it.
    """


@hookspec(firstresult=True)
def overmind_key_for_value(value: Any) -> Any:
    """Return a keyable stand-in for an argument value the core does not know, or ``None``.

    The stand-in must be built from ``None``, bools, numbers, strings, bytes, tuples, lists and dicts of
    those. Example: ``BitsAndBytesConfig`` -> ``("BitsAndBytesConfig", config.to_dict())``. A value nobody can
    key makes ``load`` call the loader directly, uncached.
    """


@hookspec
def overmind_key_parts(loader: Any, arguments: dict[str, Any]) -> Sequence[Any] | None:
    """Return extra key parts for this call, or ``None``; may also normalise ``arguments`` in place.

    ``arguments`` maps parameter names to values after binding to the loader's signature with defaults
    applied (``**kwargs`` flattened into it). Use it to add what the arguments do not show, for example the
    resolved revision of a Hub snapshot, or to fold aliases (``torch_dtype=`` into ``dtype=``). Raise
    :class:`overmind.key.Unkeyable` to leave this one call uncached (the loader runs directly, debug log only).
    """
