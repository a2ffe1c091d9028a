"""Pickle an object graph with every torch storage left out of band, and rebuild it zero-copy.

Storages become persistent ids (as in ``torch.save``): ``("storage", where, offset, nbytes, dtype,
device)``. ``where`` is ``None`` for bytes this entry holds, or the entry_id of an earlier entry whose
mapping already holds them (referenced, not copied). Tensors, ``nn.Parameter`` and tensor subclasses go
through torch's own reduce, so dtype, shape, strides, offset, ``requires_grad`` and type survive, and views
of one storage still share one storage.

The C pickler is tried first (fast); objects it cannot handle (lambdas, local classes) send the whole
graph through dill. Unpickling always uses the C unpickler.
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import dill
import torch

from .shm import mappings
from .shm.layout import STORAGE_ALIGN, align

_MISSING = object()


@dataclass
class Pickled:
    """The result of :func:`dumps`: what the writer needs to build an entry."""

    skeleton: bytes
    storages: list[tuple[torch.UntypedStorage, int]]  # (storage, offset in the data region)
    data_len: int
    deps: set[str] = field(default_factory=set)
    pickler: str = "pickle"


class _StorageTable:
    """Assigns each distinct storage met during pickling its place, once."""

    def __init__(self, reference_mapped: bool):
        self.reference_mapped = reference_mapped
        self.storages: list[tuple[torch.UntypedStorage, int]] = []
        self.seen: dict[tuple, tuple] = {}
        self.cursor = 0
        self.deps: set[str] = set()

    def persistent_id(self, obj: Any):
        if isinstance(obj, torch.UntypedStorage):
            # Comes back as TypedStorage(uint8), as from torch.load: tensor rebuilds (_rebuild_tensor_v3)
            # expect that wrapper.
            untyped, dtype = obj, torch.uint8
        elif isinstance(obj, torch.storage.TypedStorage):
            untyped, dtype = obj._untyped_storage, obj.dtype
        else:
            return None
        device = untyped.device
        nbytes = untyped.nbytes()
        if device.type == "meta":
            return ("meta", nbytes, dtype)
        ident = (str(device), untyped.data_ptr(), nbytes)
        place = self.seen.get(ident) if nbytes else None
        if place is None:
            place = self._place(untyped, device, nbytes)
            if nbytes:
                self.seen[ident] = place
        where, offset = place
        return ("storage", where, offset, nbytes, dtype, None if device.type == "cpu" else str(device))

    def _place(self, untyped: torch.UntypedStorage, device: torch.device, nbytes: int) -> tuple:
        if self.reference_mapped and device.type == "cpu":
            loc = mappings.locate(untyped.data_ptr(), nbytes)
            if loc is not None:
                self.deps.add(loc.entry_id)
                return (loc.entry_id, loc.offset)
        offset = align(self.cursor, STORAGE_ALIGN)
        self.cursor = offset + nbytes
        self.storages.append((untyped, offset))
        return (None, offset)


class _Reducers:
    """Adapter reducers, looked up along the MRO so a reducer for a base class covers subclasses.

    A type may have several reducers (two adapters, or one adapter's reducer for a base class and another's
    for a subclass): the most specific are tried first, and a reducer that answers ``NotImplemented``
    passes the object on to the next one, then to the default pickling.
    """

    def __init__(self, table: Mapping[type, Any]):
        self.table = {t: tuple(r) if isinstance(r, (list, tuple)) else (r,) for t, r in dict(table).items()}
        self.cache: dict[type, tuple] = {}

    def reduce(self, obj: Any):
        t = type(obj)
        chain = self.cache.get(t)
        if chain is None:
            chain = self.cache[t] = tuple(r for b in t.__mro__ for r in self.table.get(b, ()))
        for r in chain:
            out = r(obj)
            if out is not NotImplemented:
                return out
        return NotImplemented


def _pickler_class(base: type) -> type:
    class OvermindPickler(base):
        def __init__(self, file, table: _StorageTable, reducers: _Reducers):
            super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
            self._table = table
            self._reducers = reducers

        def persistent_id(self, obj):
            return self._table.persistent_id(obj)

        def reducer_override(self, obj):
            return self._reducers.reduce(obj)

    OvermindPickler.__name__ = f"Overmind{base.__module__.split('.')[0].title()}Pickler"
    return OvermindPickler


_CPickler = _pickler_class(pickle.Pickler)
_DillPickler = _pickler_class(dill.Pickler)


def dumps(obj: Any, reducers: Mapping[type, Any] = (), reference_mapped: bool = True) -> Pickled:
    """Pickle ``obj`` with its storages out of band.

    ``reducers`` maps types to a ``__reduce__``-style function, or a list of them tried in turn
    (adapters' ``overmind_reducers``, merged by ``plugins.reducers()``).
    ``reference_mapped=False`` copies every storage even if it already lives in an entry mapping.
    """
    reducer_table = _Reducers(dict(reducers))
    first_error: Exception | None = None
    for name, cls in (("pickle", _CPickler), ("dill", _DillPickler)):
        table = _StorageTable(reference_mapped)
        buf = io.BytesIO()
        try:
            cls(buf, table, reducer_table).dump(obj)
        except RecursionError:
            raise
        except Exception as e:  # pickle raises PicklingError, TypeError, AttributeError...
            first_error = first_error or e
            if name == "dill":
                raise PicklingFailed(obj, e, first_error) from e
            continue
        return Pickled(buf.getvalue(), table.storages, table.cursor, table.deps, name)
    raise AssertionError("unreachable")


class PicklingFailed(Exception):
    """Neither pickle nor dill could pickle the result; the message names the object and both errors."""

    def __init__(self, obj: Any, dill_error: Exception, pickle_error: Exception):
        super().__init__(
            f"cannot pickle {type(obj).__module__}.{type(obj).__qualname__}: pickle said "
            f"{type(pickle_error).__name__}: {pickle_error}; dill said {type(dill_error).__name__}: {dill_error}. "
            f"An adapter can add a reducer for the offending type (hook overmind_reducers)."
        )


class _StorageLoader:
    """Answers persistent ids with storages, building each distinct one once (views keep sharing)."""

    def __init__(self, storage_source: Callable[[Any, int, int], torch.UntypedStorage]):
        self._source = storage_source
        self._built: dict[tuple, torch.UntypedStorage] = {}

    def __call__(self, pid):
        kind = pid[0]
        if kind == "meta":
            _, nbytes, dtype = pid
            return _wrap(torch.UntypedStorage(nbytes, device="meta"), dtype)
        if kind != "storage":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r} (entry written by another Overmind?)")
        _, where, offset, nbytes, dtype, device = pid
        ident = (where, offset, nbytes, device)
        untyped = self._built.get(ident)
        if untyped is None:
            untyped = self._source(where, offset, nbytes)
            if device is not None:
                untyped = torch.empty(0, dtype=torch.uint8).set_(untyped).to(device).untyped_storage()
            self._built[ident] = untyped
        return _wrap(untyped, dtype)


def _wrap(untyped: torch.UntypedStorage, dtype):
    if dtype is None:
        return untyped
    return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def _unpickler_class(base: type) -> type:
    class OvermindUnpickler(base):
        def __init__(self, file, loader: _StorageLoader):
            super().__init__(file)
            self.persistent_load = loader

    return OvermindUnpickler


_CUnpickler = _unpickler_class(pickle.Unpickler)
_DillUnpickler = _unpickler_class(dill.Unpickler)


def loads(skeleton, storage_source: Callable[[Any, int, int], torch.UntypedStorage], pickler: str = "pickle") -> Any:
    """Rebuild an object from ``skeleton``; ``storage_source(where, offset, nbytes)`` gives each storage.

    ``pickler`` is :attr:`Pickled.pickler` of the dump: a dill dump is read with dill's unpickler, which
    resolves the classes dill pickled by value.
    """
    cls = _DillUnpickler if pickler == "dill" else _CUnpickler
    return cls(io.BytesIO(skeleton), _StorageLoader(storage_source)).load()
