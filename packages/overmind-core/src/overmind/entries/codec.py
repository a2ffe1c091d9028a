"""The entry codec: a load's result <-> one sealed memfd (and the entries it references) with its meta.
:func:`encode` (result -> sealed memfd, deps, meta) and :func:`decode` (entry, fds, the call's arguments -> object),
with the adapters' prepare, metadata and unpickle hooks around them.

:func:`encode` readies the result (adapters' ``overmind_prepare_result``), pickles it with its storages out of
band (each placed by ``shm.placer``: copied into this entry, or referenced in an entry this process maps),
writes skeleton and bytes into a sealed memfd (``shm.writer``) and returns that fd with the entries it
references (``deps``) and the ``meta`` the server keeps beside it. :func:`decode` maps an entry's memfds
copy-on-write (``shm.reader``) and rebuilds the object, storages zero-copy over the mappings, objects the
call was given as the caller's own (``pipe.vae is vae``, see :mod:`.arguments_ref`), paths derived from its
arguments as the caller spelled them (``./m`` or ``/abs/m``, see :mod:`.path_spellings`).

>>> encoded = encode(result, loader, ck.summary, arguments)      # the caller publishes, then closes .fd
>>> obj = decode(res.entry, res.fds, arguments)                  # a hit; closes the fds
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .._util import gc_pause, heap_trim
from ..adapters import hooks
from ..errors import OvermindError
from ..keys import canon, provenance
from ..shm import filemaps, reader, writer
from ..shm.filemaps import FileChanged  # noqa: F401 - loading/publish.py copies everything on it
from . import arguments_ref, dedup, path_spellings, pickling
from . import writes as recorded_writes

if TYPE_CHECKING:
    from ..keys.key import Loader
    from ..shm.arena import Arena


@dataclass
class Encoded:
    """A written entry not yet published: the caller owns ``fd`` and closes it."""

    fd: int
    deps: list[str]  # ids of the entries whose bytes this one references
    meta: dict[str, Any]
    # (description, read-only fd) of each checkpoint file whose pages the entry references (``shm.filemaps``);
    # the caller closes the fds too
    files: list[tuple[dict[str, Any], int]] = field(default_factory=list)
    # whether any storage of the result has its bytes in this entry's own data region (written, in place, or
    # deduplicated into another entry), rather than referenced where this process already maps them (an entry's
    # or a checkpoint file's pages)
    owns_storages: bool = True


_meta = threading.local()  # _meta.intended: an adapter said the result's meta tensors are meant (intend_meta)


def intend_meta() -> None:
    """Called while a result is readied for pickling (an adapter's ``overmind_prepare_result``): its meta tensors
    are meant (a model offloaded to disk, whose hooks load those weights), whatever the key says."""
    _meta.intended = True


class UnexpectedMeta(OvermindError):
    """The result holds tensors on the meta device (no data) though the call was not made to produce them: some
    process state the key does not describe made them. It is returned, not published."""


def encode(result: Any, loader: Loader, summary: str, arguments: dict | None = None, *,
           reference_mapped: bool = True, before_write: Callable[[], None] | None = None,
           arena: Arena | None = None, expect_meta: bool = True, writes: list | None = None,
           argument_index: arguments_ref.ArgumentIndex | None = None) -> Encoded:
    """Write ``result`` into a sealed memfd.

    Objects of the call's bound ``arguments`` that the result holds are recorded as references to those
    arguments (neither pickled nor copied). ``reference_mapped=False`` copies every storage, even one that
    lives in an entry already mapped here or in a checkpoint file. ``arena`` is the miss's closed load arena
    (``shm/arena.py``): the entry is written into its memfd, where the loader's large tensors already are; it
    is used once (an entry written into it is sealed). ``before_write`` runs once the result is
    pickled (so an adapter's refusal, which says why, comes first) and before anything is written; what it raises
    propagates.
    ``expect_meta=False``: the key says the call was not made to produce meta tensors (``torch_state.makes_meta``);
    a result holding some raises :class:`UnexpectedMeta` before anything is written, unless an adapter readying it
    said they are meant (:func:`intend_meta`).
    ``writes``: what the loader wrote outside its result (``loading/writes/replay.for_entry``), pickled in one
    stream with the result and made again by :func:`decode` (:mod:`.writes`). ``argument_index``: where the call's
    arguments and their parts were as the call found them (a call that changed its module arguments).
    Raises :class:`~overmind.entries.pickling.PicklingFailed` for a result that cannot be pickled.
    """
    if arena is not None and not (arena.usable and reference_mapped):
        arena = None
    with gc_pause.paused():  # no collection over the user's heap inside a load (see _util/gc_pause.py)
        adapters_meta = hooks.entry_metadata(result, loader)
        places = hooks.derived_paths(result, loader, arguments) if arguments else []
        _meta.intended = False
        pickled = _pickle(result, loader, reference_mapped, arguments, arena, writes, argument_index)
    if not pickled.in_place:
        arena = None  # nothing of the result is in it (an fp16 checkpoint's tensors are file mappings)
    if pickled.holds_meta and not expect_meta and not getattr(_meta, "intended", False):
        raise UnexpectedMeta(f"{loader.name} returned tensors on the meta device, though the call was not made "
                             f"under init_empty_weights() or a meta default device")
    if before_write is not None:
        before_write()
    meta = {"loader": loader.name, "summary": summary, "pickler": pickled.pickler, "pid": os.getpid(),
            "adapters": adapters_meta}
    if pickled.argument_aliases:
        meta["argument_aliases"] = pickled.argument_aliases
    if pickled.argument_memo:
        meta["argument_memo"] = pickled.argument_memo
    spellings = path_spellings.record(result, places, arguments)  # where a hit writes its own spelling of a path
    if spellings:
        meta["spellings"] = spellings
    # Storages whose bytes an entry already holds are referenced there, not written (entries/dedup.py).
    shared = dedup.plan(pickled.storages) if reference_mapped else dedup.Plan(list(pickled.storages))
    meta.update(shared.meta)
    to_write = shared.written
    if arena is not None:
        to_write = _use_arena(arena, pickled, shared)
        # bytes the loader wrote into the entry itself (benchmarks and tests read it)
        meta["written_once"] = sum(s.nbytes() for s, o in pickled.storages if o in pickled.in_place)
    files = filemaps.open_referenced(pickled.deps)  # raises FileChanged: the caller copies everything then
    try:
        fd = writer.write_entry(pickled.skeleton, to_write, pickled.data_len,
                                name=f"overmind:{loader.name}"[:240], arena=arena)
    except BaseException:
        for _, file_fd in files:
            os.close(file_fd)
        raise
    deps = sorted(pickled.deps | shared.deps)
    return Encoded(fd, deps, meta, files, bool(pickled.storages))


def _use_arena(arena: Arena, pickled: pickling.Pickled, shared: dedup.Plan) -> list:
    """The storages to write besides those already in ``arena``; ranges dedup found elsewhere are detached."""
    kept = {offset for _s, offset in shared.written}
    for storage, offset in pickled.storages:
        if offset in pickled.in_place and offset not in kept:
            arena.detach(storage.data_ptr())  # its bytes are referenced in another entry (or earlier in this one)
            pickled.in_place.discard(offset)
    return [(s, o) for s, o in shared.written if o not in pickled.in_place]


def _pickle(result: Any, loader: Loader, reference_mapped: bool, arguments: dict | None,
            arena: Arena | None = None, writes: list | None = None,
            argument_index: arguments_ref.ArgumentIndex | None = None) -> pickling.Pickled:
    with contextlib.ExitStack() as stack:
        stack.enter_context(hooks.prepare_result(result, loader))
        table = pickling.reducer_table(hooks.reducers())
        root = recorded_writes.Recorded(result, writes) if writes else result
        return pickling.dumps(root, table, reference_mapped=reference_mapped, arguments=arguments, arena=arena,
                              index=argument_index)


def decode(entry: dict[str, Any], fds: dict[str, int], arguments: dict | None = None,
           replace_writes: Callable[[], None] | None = None) -> Any:
    """Rebuild the object of ``entry`` (a hit's ``{entry_id, key, meta, ...}``) from ``fds`` (its memfd and
    those of the entries it depends on, by entry_id), mapped copy-on-write; closes the fds.

    ``arguments`` are this call's bound arguments: where the entry records an argument, the result gets this
    caller's object, and where it records a path derived from an argument, this caller's spelling of it; one that
    does not fit raises :class:`~overmind.entries.arguments_ref.ArgumentMismatch`. The object is remembered as
    coming from ``entry["key"]`` (see :mod:`.provenance`). The collector is paused throughout: the skeleton is a
    large graph of new objects, and a collection over it finds nothing to free.

    ``replace_writes``: on the miss, takes back the writes its loader made with the objects it returned, before the
    entry's writes are made with the rebuilt ones.

    Every tensor comes back with the inference flag it had when the loader returned it, whatever the caller's
    mode: transformers returns ordinary tensors under ``torch.inference_mode()``, diffusers inference tensors,
    and the entry records which (``tensors.INFERENCE``); the rest are rebuilt outside inference mode.
    """
    return decode_sized(entry, fds, arguments, replace_writes=replace_writes)[0]


def decode_sized(entry: dict[str, Any], fds: dict[str, int], arguments: dict | None = None,
                 placeholders: list | None = None, replace_writes: Callable[[], None] | None = None) -> tuple[Any, int]:
    """:func:`decode`, and the size of the entry's skeleton in bytes (what the rebuilt objects weigh, roughly).
    ``placeholders``: a rebuild ahead of the call, without its arguments (``entries/prebuilt.py``)."""
    with gc_pause.paused(), _outside_inference_mode():
        obj, skeleton_bytes = _decode(entry, fds, arguments, placeholders, replace_writes)
    if skeleton_bytes >= heap_trim.TRIM_AFTER_BYTES:
        heap_trim.trim()  # the rebuild's temporaries (a tokenizer's vocabulary) back to the system
    return obj, skeleton_bytes


def _outside_inference_mode() -> contextlib.AbstractContextManager:
    import torch

    return torch.inference_mode(False) if torch.is_inference_mode_enabled() else contextlib.nullcontext()


def _decode(entry: dict[str, Any], fds: dict[str, int], arguments: dict | None,
            placeholders: list | None = None, replace_writes: Callable[[], None] | None = None) -> tuple[Any, int]:
    try:
        maps = {entry_id: reader.map_entry(entry_id, fd) for entry_id, fd in fds.items()}
        redirects = dedup.Redirects(entry, fds)  # storages whose bytes another entry holds (entries/dedup.py)
    finally:
        for fd in fds.values():
            os.close(fd)
    own = maps[entry["entry_id"]]
    assert isinstance(own, reader.EntryMapping)  # the entry itself is a memfd; only its deps may be files
    meta = entry.get("meta") or {}
    adapters_meta = meta.get("adapters") or {}
    hooks.before_unpickle(adapters_meta)

    # an entry imported from the fleet names its dependencies by its publisher's ids
    # (server/imports.py)
    fleet_ids = meta.get("fleet_ids") or {}

    def storage_source(where, offset, nbytes):
        return (own if where is None else maps[fleet_ids.get(where, where)]).storage(offset, nbytes)

    skeleton = own.skeleton()
    obj = pickling.loads(skeleton, redirects.wrap(storage_source), meta.get("pickler", "pickle"), arguments,
                         list(meta.get("argument_aliases") or ()), list(meta.get("argument_memo") or ()),
                         placeholders)
    writes = None
    if isinstance(obj, recorded_writes.Recorded):
        obj, writes = obj.result, obj.writes
    obj = hooks.after_unpickle(obj, adapters_meta)
    if placeholders is None:  # a rebuild ahead of the call gets the call's spellings as it is taken (prebuilt.py)
        path_spellings.respell(obj, meta.get("spellings"), arguments)
    if writes:  # what the loader wrote outside its result, with the rebuilt objects, before anyone sees the result
        if placeholders is not None and any(recorded_writes.held(place) for place, _, _ in writes):
            raise NotAhead("its call changes a module it is given: the change is made to the caller's module, "
                           "when the call is made")
        if replace_writes is not None:
            replace_writes()  # the miss: its loader's own writes (with the objects it returned) are taken back first
        recorded_writes.apply(writes)
    if not isinstance(obj, arguments_ref.Placeholder):
        remember_origin(obj, entry["key"], arguments)
    return obj, len(skeleton)


class NotAhead(OvermindError):
    """The entry cannot be rebuilt ahead of its call (an ``overmind run`` template's build): the message says why."""


def remember_origin(obj: Any, key: str, arguments: dict | None, *, in_files: bool = False) -> None:
    """Remember ``obj`` as the object of ``key``'s entry (see :mod:`.provenance`), unless it is one of the call's
    ``arguments`` returned as it was (which keeps its own origin). ``in_files``: ``obj`` is the loader's own result
    of a first load, remembered only where its storages all lie untouched in checkpoint files."""
    if arguments_ref.ArgumentIndex(arguments).path_of(obj) is None:
        provenance.remember_origin(obj, key, _config_form, in_files=in_files)


def _config_form(config: Any) -> str:
    """A module config as its key describes it: provenance compares it to tell the module's config unedited."""
    return repr(canon.canon(config, hooks.key_for_value))
