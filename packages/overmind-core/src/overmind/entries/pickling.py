"""Pickle an object graph with every torch storage left out of band, and rebuild it zero-copy: storages as
persistent ids (their places asked of ``shm.placer``), the reducer table (the adapters', then the core's: tensors,
classes not importable by name, TorchScript), and the call's own objects (``controlnet=[a, b]``) referenced, not
copied.

Storages become persistent ids (as in ``torch.save``): ``("storage", where, offset, nbytes, dtype,
device)``. ``where`` is ``None`` for bytes this entry holds, or the entry_id of an earlier entry whose
mapping already holds them (referenced, not copied); their ``dtype`` is ``None`` for a plain tensor's storage
(:mod:`.tensors`' reduce, which rebuilds from the ``UntypedStorage`` itself). Plain tensors and ``nn.Parameter``
take that cheaper reduce, other tensors and subclasses torch's own; either way dtype, shape, strides, offset,
``requires_grad`` and type survive, and views of one storage still share one storage.

Objects the call was given (``vae=vae``) become ``("arg", path, type)`` persistent ids and are the
caller's objects again on rebuild (see :mod:`.arguments_ref`). Open files, sockets, threads, locks and the
like are refused (see :mod:`.resources`). Pickling runs on a helper thread whose C stack fits the
recursion limit (see :mod:`.deepstack`), so a deep graph falls back instead of crashing.

The C pickler is tried first (fast), without a ``persistent_id`` method: that method is called for every object,
strings and ints included (hundreds of thousands for a 49k-entry tokenizer vocabulary), while ``reducer_override``
is never asked about atoms and plain containers. Storages, arguments and resources are never of those types, so
``reducer_override`` answers them with the reduce ``_persistent(pid)``, which :func:`loads` resolves to its
storage loader. An argument that is itself a plain container (``controlnet=[a, b]``) is never shown to
``reducer_override``, but the C pickler looks every object up in its memo before it saves it: the containers the
call was given are put in the memo before the dump (indexes 0..k-1), so where the result holds one, the skeleton
holds a memo reference to it (``BINGET i``); the skeleton's first opcodes fill those memo indexes with this
call's objects at the same paths on rebuild (:func:`_memo_prefix`, ``Pickled.argument_memo``). Only an argument
of a type the pickler does not memoize (a ``PickleBuffer``) takes the ``persistent_id`` pickler. Objects the C
pickler cannot handle (lambdas, local classes) send the whole graph through dill, with ``persistent_id``. A dill
dump is read with dill's unpickler, any other with the C unpickler.
"""
from __future__ import annotations

import io
import pickle
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import dill
import torch

from .._util import interrupts
from ..errors import PicklingFailed
from ..keys import local_classes
from ..native import tensors, zerocopy
from ..native.tensors import UntypedStorageArg
from ..shm import gpu_copies
from ..shm.placer import Placer
from . import arguments_ref, deep_recursion, external_resources
from .own_warnings import silenced

if TYPE_CHECKING:
    from ..shm.arena import Arena

_MISSING = object()


@dataclass
class Pickled:
    """The result of :func:`dumps`: what the writer needs to build an entry."""

    skeleton: bytes
    storages: list[tuple[torch.UntypedStorage, int]]  # (storage, offset in the data region)
    data_len: int
    deps: set[str] = field(default_factory=set)
    pickler: str = "pickle"
    # Paths of objects passed more than once to the call (``[a, a]``) that the skeleton refers to; a rebuild
    # checks they are one object again (see arguments_ref.check_aliases).
    argument_aliases: list = field(default_factory=list)
    # Offsets (in the data region) of the storages already in the load arena's memfd (shm/arena.py): placed,
    # never written.
    in_place: set[int] = field(default_factory=set)
    # The container arguments put in the pickler's memo before the dump, in memo order: [path, type name, whether
    # the skeleton may refer to it]; loads() puts this call's objects there (JSON-ready, for the entry's meta).
    argument_memo: list = field(default_factory=list)
    # whether the object holds a tensor on the meta device (no data: what init_empty_weights makes)
    holds_meta: bool = False


class _StorageTable:
    """Asks the placer where each storage met during pickling goes; names the call's arguments and refuses
    system resources (the pickler asks it about every object it meets)."""

    def __init__(self, placer: Placer, arguments: arguments_ref.ArgumentIndex | None = None):
        self.placer = placer
        self.arguments = arguments if arguments else None
        self._argument_ids = arguments.ids if arguments else {}
        self._refused = external_resources.verdicts

    def persistent_id(self, obj: Any):
        # Called for every object pickled: two dict lookups in the common case.
        if id(obj) in self._argument_ids:
            return self.arguments.reference(obj)  # type: ignore[union-attr]  # ids only come with arguments
        if type(obj) is UntypedStorageArg:
            # A plain tensor's storage (tensors.reduce_tensor): comes back as the UntypedStorage itself.
            untyped, dtype = obj.storage, None
        elif (refused := self._refused.get(type(obj))) or (
                refused is None and external_resources.is_refused(type(obj))):
            raise _Refused(obj)
        elif isinstance(obj, torch.UntypedStorage):
            # Comes back as TypedStorage(uint8), as from torch.load: tensor rebuilds (_rebuild_tensor_v3)
            # expect that wrapper.
            untyped, dtype = obj, torch.uint8
        elif isinstance(obj, torch.storage.TypedStorage):
            untyped, dtype = obj._untyped_storage, obj.dtype
        else:
            return None
        return self.storage_id(untyped, dtype)

    def storage_id(self, untyped: torch.UntypedStorage, dtype) -> tuple:
        """The persistent id of ``untyped`` (placed by the placer); ``dtype`` None: rebuilt as UntypedStorage."""
        device = untyped.device
        nbytes = untyped.nbytes()
        if device.type == "meta":
            tensors.met.meta = True
            return ("meta", nbytes, dtype)
        where, offset = self.placer.place(untyped)
        return ("storage", where, offset, nbytes, dtype, None if device.type == "cpu" else str(device))


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
        takes_containers = False  # persistent_id names them

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

# Types the C pickler saves itself, asking reducer_override nothing (CPython 3.11 _pickle.c ``save``: None,
# bools, exact int, float, bytes, str, dict, set, frozenset, list, tuple, bytearray, PickleBuffer). Only
# persistent_id sees them.
_NOT_OVERRIDDEN = frozenset({type(None), bool, int, float, bytes, str, dict, set, frozenset, list, tuple,
                             bytearray, pickle.PickleBuffer})
# Of those, the ones an argument can be (arguments_ref indexes no atoms) that _pickle.c ``save`` looks up in the memo
# before saving (all but None, bools, ints and floats): put there first, such an argument is written as a memo
# reference. Any other (a PickleBuffer) takes the persistent_id pickler.
_MEMO_LOOKED_UP = frozenset({dict, list, tuple, set, frozenset, bytearray})

_PLAIN, _UNTYPED, _TYPED, _REFUSED = 0, 1, 2, 3  # what _FastPickler does with a type (cached per type)


def _persistent(pid):
    """Named in skeletons as the callable of a reduce whose argument is a persistent id (see _FastPickler);
    the unpickler in :func:`loads` resolves this name to its storage loader."""
    raise pickle.UnpicklingError(
        "an Overmind skeleton refers to storages: read it with overmind.entries.pickling.loads")


class _FastPickler(pickle.Pickler):
    """The C pickler without ``persistent_id``, so atoms and plain containers cost no Python call.

    What :class:`_StorageTable.persistent_id` answers is answered in ``reducer_override`` instead (storages,
    arguments and refused resources are never of the :data:`_NOT_OVERRIDDEN` types), as the reduce
    ``_persistent(pid)``; the pickler memoizes it, so a storage met again costs a memo lookup. An argument of a
    :data:`_NOT_OVERRIDDEN` type, which reducer_override never sees, is put in its memo before the dump
    (:func:`_dumps`); only one of a type :data:`_MEMO_LOOKED_UP` leaves out needs the persistent_id pickler.
    """

    takes_containers = True  # the call's plain containers go into its memo before the dump (see the module doc)

    def __init__(self, file, table: _StorageTable, reducers: _Reducers):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._table = table
        self._argument_ids = table._argument_ids
        self._reducer_chains = reducers.cache
        self._reducers = reducers
        self._kinds: dict[type, int] = {}

    def reducer_override(self, obj):
        # Called for every object but atoms and plain containers, once each (the memo answers repeats).
        t = type(obj)
        if t is UntypedStorageArg:
            return _persistent, (self._table.storage_id(obj.storage, None),)
        if self._argument_ids and id(obj) in self._argument_ids:
            return _persistent, (self._table.arguments.reference(obj),)
        kind = self._kinds.get(t)
        if kind is None:
            kind = self._kinds[t] = _kind_of(t)
        if kind == _PLAIN:
            out = NotImplemented if self._reducer_chains.get(t) == () else self._reducers.reduce(obj)
            if out is NotImplemented and t is OrderedDict:
                return _ordered_dict_reduce(obj)
            return out
        if kind == _UNTYPED:
            return _persistent, (self._table.storage_id(obj, torch.uint8),)
        if kind == _TYPED:
            return _persistent, (self._table.storage_id(obj._untyped_storage, obj.dtype),)
        raise _Refused(obj)


def _ordered_dict_reduce(od: OrderedDict) -> tuple:
    """What ``OrderedDict.__reduce__`` returns for an exact ``OrderedDict`` (the same pickle, byte for byte), without
    its trip through ``copyreg._slotnames``: OrderedDict is a static type, where the slot names cannot be cached on
    the class, so the default asks again for every instance (~3 us each; a module holds ~10 OrderedDicts, the blog's
    cold load ~25,000)."""
    return OrderedDict, (), vars(od) or None, None, iter(od.items())


def _kind_of(t: type) -> int:
    if external_resources.is_refused(t):
        return _REFUSED
    if issubclass(t, torch.UntypedStorage):
        return _UNTYPED
    if issubclass(t, torch.storage.TypedStorage):
        return _TYPED
    return _PLAIN


_table: tuple[Mapping, Mapping[type, list[Callable]]] | None = None  # (the adapters' table, with the core's)


def reducer_table(adapters: Mapping[type, list[Callable]]) -> Mapping[type, list[Callable]]:
    """The reducers an entry is pickled with: ``adapters`` (the live adapters' ``overmind_reducers``, from
    :func:`overmind.adapters.hooks.reducers`), then the core's own: plain tensors and parameters
    (:mod:`overmind.native.tensors`), classes not importable by name (:mod:`overmind.keys.local_classes`) and
    TorchScript modules (:mod:`.torchscript`). Where several claim one type they are tried in that order."""
    global _table
    if _table is not None and _table[0] is adapters:
        return _table[1]
    table = {t: list(rs) for t, rs in adapters.items()}
    for part in _core_reducers():
        for t, r in part.items():
            table.setdefault(t, []).append(r)
    _table = (adapters, table)
    return table


def _core_reducers() -> list[Mapping[type, Callable]]:
    parts: list[Mapping[type, Callable]] = [tensors.reducers(), local_classes.reducers()]
    try:
        from . import torchscript

        parts.append(torchscript.reducers())
    except ImportError:
        pass
    return parts


def dumps(obj: Any, reducers: Mapping[type, Any] | tuple[()] = (), reference_mapped: bool = True,
          arguments: Mapping[str, Any] | None = None, arena: Arena | None = None,
          index: arguments_ref.ArgumentIndex | None = None) -> Pickled:
    """Pickle ``obj`` with its storages out of band.

    ``reducers`` maps types to a ``__reduce__``-style function, or a list of them tried in turn
    (:func:`reducer_table` gives the one an entry is pickled with).
    Each storage's place comes from a :class:`~overmind.shm.placer.Placer`; ``reference_mapped=False`` copies
    every storage even if it already lives in an entry mapping.
    ``arguments`` are the call's bound arguments: an object passed there is recorded as a reference to the
    argument, not pickled; pass the same call's arguments to :func:`loads`. ``index``: the arguments' index, made
    by the caller (one that reaches into module arguments, made as the call found them: ``arguments_ref.py``).
    ``arena``: the miss's closed load arena; a storage in one of its ranges is placed where it already is
    (``Pickled.in_place``).

    Raises :class:`PicklingFailed` (or its subclasses :class:`ResourceRefused`, :class:`TooDeep`).
    """
    reducer_table = _Reducers(dict(reducers))
    if index is None:
        index = arguments_ref.ArgumentIndex(dict(arguments) if arguments else None)
    try:
        return deep_recursion.call(_dumps, obj, reducer_table, reference_mapped, index, arena)
    except RecursionError as e:
        raise TooDeep(obj, e) from e


def _dumps(obj: Any, reducer_table: _Reducers, reference_mapped: bool,
           index: arguments_ref.ArgumentIndex, arena: Arena | None) -> Pickled:
    first_error: Exception | None = None
    containers = [o for o in index._objects if type(o) in _NOT_OVERRIDDEN]  # reducer_override never sees these
    fast = all(type(o) in _MEMO_LOOKED_UP for o in containers)
    picklers: list[tuple[str, Any]] = [("pickle", _FastPickler if fast else _CPickler), ("dill", _DillPickler)]
    for name, cls in picklers:
        index.used = set()
        tensors.met.meta = False
        placer = Placer(reference_mapped, arena)
        table = _StorageTable(placer, index)
        buf = io.BytesIO()
        try:
            pickler = cls(buf, table, reducer_table)
            if cls.takes_containers and containers:
                # memo indexes 0..k-1 (see the module doc); the skeleton's first opcodes fill them on rebuild
                buf.write(_memo_prefix(len(containers)))
                pickler.memo = {id(c): (i, c) for i, c in enumerate(containers)}
            with silenced():  # in the thread that pickles (deep_recursion may hand the dump to a helper)
                pickler.dump(obj)
        except RecursionError:
            raise  # dill recurses deeper still
        except _Refused as e:
            raise ResourceRefused(e.obj, external_resources.find_path(obj, e.obj)) from None
        except Exception as e:  # pickle raises PicklingError, TypeError, AttributeError...
            interrupts.raise_users(e)
            first_error = first_error or e
            if name == "dill":
                raise PicklingFailed(obj, e, first_error) from e
            continue
        skeleton = buf.getvalue()
        memo = _argument_memo(skeleton, containers, index) if cls.takes_containers else []
        return Pickled(skeleton, placer.storages, placer.data_len, placer.deps, name, index.alias_groups(),
                       placer.in_place, memo, tensors.met.meta)
    raise AssertionError("unreachable")


def _argument_memo(skeleton: bytes, containers: list, index: arguments_ref.ArgumentIndex) -> list:
    """``Pickled.argument_memo`` for the containers put in the fast pickler's memo. Whether the skeleton refers to
    memo index i is read off its bytes: the pickler writes ``BINGET i`` (i < 256) or ``LONG_BINGET i``; those bytes
    may also occur inside other data, so "may refer" errs towards yes (a referred one is checked on rebuild, and
    is one of the paths the entry uses)."""
    out = []
    for i, c in enumerate(containers):
        get = (pickle.BINGET + bytes([i])) if i < 256 else (pickle.LONG_BINGET + i.to_bytes(4, "little"))
        used = get in skeleton
        path = index.path_of(c)
        if used:
            index.used.add(path)  # type: ignore[arg-type]  # every container here was indexed, so has a path
        out.append([list(path), arguments_ref.type_name(c), used])  # type: ignore[arg-type]
    return out


class _Refused(Exception):
    def __init__(self, obj: Any):
        super().__init__(type(obj).__qualname__)
        self.obj = obj


class ResourceRefused(PicklingFailed):
    """The result holds an open file, socket, thread, lock or the like (see :mod:`.resources`); not cached."""

    has_fix = True

    def __init__(self, obj: Any, where: str | None):
        Exception.__init__(self, external_resources.refusal(obj, where))
        self.type_name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        self.where = where


class TooDeep(PicklingFailed):
    """The result's object graph nests deeper than the recursion limit lets the pickler go; not cached."""

    has_fix = True

    def __init__(self, obj: Any, error: RecursionError):
        Exception.__init__(
            self, f"the {type(obj).__module__}.{type(obj).__qualname__} result nests too deep to pickle within the "
                  f"recursion limit ({sys.getrecursionlimit()}): {error}. Raise sys.setrecursionlimit() to cache it "
                  f"(Overmind pickles on a thread with a C stack sized for the limit, up to "
                  f"{deep_recursion.stack_for(10**9)[1]} levels).")


class _StorageLoader:
    """Answers persistent ids with storages, building each distinct one once (views keep sharing), and
    argument references with the current call's objects."""

    def __init__(self, storage_source: Callable[[Any, int, int], torch.UntypedStorage],
                 arguments: Mapping[str, Any] | None = None, memo_arguments: list | tuple[()] = (),
                 placeholders: list | None = None):
        self._source = storage_source
        self._built: dict[tuple, torch.UntypedStorage] = {}
        self._arguments = arguments
        self._memo_arguments = memo_arguments  # what _memo_prefix's (i,) ids stand for
        self._placeholders = placeholders  # a rebuild ahead of the call: arguments become placeholders here

    def __call__(self, pid):
        # Called once per storage of the entry (~1,800 for a pipeline): the common kind first.
        if pid[0] == "storage":
            _, where, offset, nbytes, dtype, device = pid
            ident = (where, offset, nbytes, device)
            untyped = self._built.get(ident)
            if untyped is None:
                untyped = self._source(where, offset, nbytes)
                if device is not None:
                    untyped = gpu_copies.to_device(untyped, device)
                self._built[ident] = untyped
            return untyped if dtype is None else _wrap(untyped, dtype)
        kind = pid[0]
        if type(kind) is int:
            if kind >= len(self._memo_arguments):
                raise pickle.UnpicklingError("the skeleton refers to a container argument: pass its argument_memo")
            return self._memo_arguments[kind]
        if kind == "arg":
            _, path, type_name = pid
            if self._placeholders is not None:
                self._placeholders.append(arguments_ref.Placeholder(path, type_name))
                return self._placeholders[-1]
            return arguments_ref.resolve(self._arguments, path, type_name)
        if kind == "meta":
            _, nbytes, dtype = pid
            return _wrap(torch.UntypedStorage(nbytes, device="meta"), dtype)
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r} (entry written by another Overmind?)")


def _wrap(untyped: torch.UntypedStorage, dtype):
    if dtype is None:
        return untyped
    return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def _unpickler_class(base: type) -> type:
    class OvermindUnpickler(base):
        def __init__(self, file, loader: _StorageLoader):
            super().__init__(file)
            self.persistent_load = loader
            self._loader = loader

        def find_class(self, module, name):
            # Once per distinct global of a skeleton (the pickler memoizes them).
            if name == "_persistent" and module == __name__:
                return self._loader
            if name == "rebuild_from_untyped" and module == "overmind.native.tensors":
                return zerocopy.tensor_rebuild()  # ~2,700 tensors in a pipeline: the compiled twin when built
            return super().find_class(module, name)

    return OvermindUnpickler


_CUnpickler = _unpickler_class(pickle.Unpickler)
_DillUnpickler = _unpickler_class(dill.Unpickler)


def loads(skeleton, storage_source: Callable[[Any, int, int], torch.UntypedStorage], pickler: str = "pickle",
          arguments: Mapping[str, Any] | None = None, argument_aliases: list | tuple[()] = (),
          argument_memo: list | tuple[()] = (), placeholders: list | None = None) -> Any:
    """Rebuild an object from ``skeleton``; ``storage_source(where, offset, nbytes)`` gives each storage.

    ``pickler`` is :attr:`Pickled.pickler` of the dump: a dill dump is read with dill's unpickler, which
    resolves the classes dill pickled by value. ``arguments`` are this call's bound arguments, and
    ``argument_aliases`` and ``argument_memo`` the dump's :attr:`Pickled.argument_aliases` and
    :attr:`Pickled.argument_memo`: the objects the skeleton names as arguments are taken from there
    (:class:`~overmind.entries.arguments_ref.ArgumentMismatch` if they do not fit). ``placeholders``: a rebuild
    ahead of the call (``entries/prebuilt.py``); each argument becomes an
    :class:`~overmind.entries.arguments_ref.Placeholder`, appended to this list.
    """
    cls = _DillUnpickler if pickler == "dill" else _CUnpickler
    if placeholders is not None:
        memo_arguments: list = []
        for path, type_name, used in argument_memo:
            if used:
                placeholders.append(arguments_ref.Placeholder(path, type_name))
            memo_arguments.append(placeholders[-1] if used else None)
        return _rebuild(cls, skeleton, _StorageLoader(storage_source, None, memo_arguments, placeholders))
    arguments_ref.check_aliases(arguments, argument_aliases)
    # this call's containers for the memo indexes the dump gave the first call's (one the skeleton cannot refer to
    # is a placeholder that keeps the numbering)
    memo_arguments = [arguments_ref.resolve(arguments, path, type_name) if used else None
                      for path, type_name, used in argument_memo]
    return _rebuild(cls, skeleton, _StorageLoader(storage_source, arguments, memo_arguments))


def _rebuild(cls: type, skeleton, loader: _StorageLoader) -> Any:
    with silenced():  # what the libraries' rebuild functions warn is no warning of the call's (own_warnings.py)
        return cls(io.BytesIO(skeleton), loader).load()


def _memo_prefix(count: int) -> bytes:
    """The skeleton's first opcodes where ``count`` containers were put in the pickler's memo: they fill the
    unpickler's memo at indexes 0..count-1, each through the persistent id ``(i,)`` (:class:`_StorageLoader` answers
    it with this call's container), so the skeleton is one whole pickle stream. (The C unpickler's ``memo`` setter
    would be the direct way, but CPython 3.11's drops what it is given: the values go into the memo it then
    replaces.)"""
    return b"".join(pickle.BININT + i.to_bytes(4, "little", signed=True) + pickle.TUPLE1 + pickle.BINPERSID
                    + pickle.MEMOIZE + pickle.POP for i in range(count))
