"""A claimed load's publish: whether the server admits the result's entry under its budget, the
entry written and published with the loader's warnings, log records and writes in its meta, the
marker that sends the call's hits to its variants, and the result returned rebuilt from the entry,
or as the loader made it where a rebuild gains nothing.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Protocol

from .. import fallback
from .._util import interrupts
from ..entries import arguments_ref, codec, pickling
from ..entries.writes import held
from ..errors import OvermindError, ServerError
from ..keys import key, provenance, torch_state
from ..shm import arena
from . import vary as vary_mod
from .writes import replay as writes_replay

if TYPE_CHECKING:
    from ..client.connection import Client

log = logging.getLogger("overmind")
_COPY_INSTEAD = ("dep missing", "file changed")


class Recheck(Protocol):
    """Recomputes a call's key after its loader ran (``flow._Recheck``)."""

    def changes(self, ck: key.CacheKey) -> str | None:
        """What the loader changed of what ``ck`` describes, in words; None where the key is still
        ``ck``'s."""


class BudgetRefused(OvermindError):
    """The server cannot admit the result's entry under its budget (``server/admission.py``); the
    message says how large it is, the budget, and what to change."""

    has_fix = True  # the message carries its advice


class KeyChanged(OvermindError):
    """The call's key is not what it was before the loader ran: the result is returned, not
    published."""


class WritesNotKept(OvermindError):
    """The result pickles, but a value its loader wrote outside it does not: a hit could not write
    it."""


def admission(client: Client, ck: key.CacheKey, result: Any, room: int | None) -> str | None:
    """Why the server will not admit ``result``'s entry (None: it will, or it cannot be told before
    writing). Only a result larger than the ``room`` the claim reported is estimated exactly and
    asked about."""
    from ..entries import estimate

    try:
        found = estimate.storages(result)
        if found is None or (room is not None and estimate.total(found) <= room):
            return None
        need = estimate.entry_bytes(found)
        if need == 0:
            return None
        verdict = client.admit(ck.key, need)
    except Exception as e:  # an older server, or no answer: the publish's own check still holds
        interrupts.raise_users(e)
        log.debug("admission of %s not asked: %s", ck.key[:12], e)
        return None
    if verdict.get("admitted", True):
        return None
    return str(verdict.get("message") or "refused by the budget")


def publish(client: Client, loader: key.Loader, ck: key.CacheKey, result: Any,
            arguments: dict | None = None, recheck: Recheck | None = None,
            load_arena: arena.Arena | None = None, warned: list | None = None,
            logged: dict | None = None, extra_meta: dict | None = None,
            writes: list | None = None) -> Any:
    """Write ``result`` as an entry, publish it under ``ck`` and return it rebuilt from there, or
    ``result`` itself where a rebuild would gain nothing (:func:`_plain_result_will_do`).

    The publish reply is a hit on the entry, so the result comes back from the cache's bytes in one
    round trip. ``recheck`` runs once the result is pickled (so an adapter's refusal, which says
    why, comes first) and before anything is written: a key that changed raises
    :class:`KeyChanged`. ``load_arena``: the loader's closed arena, whose memfd becomes the entry
    (``shm/arena.py``). ``warned``: the loader's warnings, which a hit issues again
    (``loader_warnings.Recording.records``); ``logged``: its log records and the logging answers it
    got (``loader_logs.Recording.for_entry``). ``extra_meta``: more of the entry's meta (a
    variant's generator states after the call). ``writes``: what the loader wrote outside its
    result (``writes/changes.Write``), kept in the entry and replayed on every hit; the key is
    checked with them taken back, as the call found the state.
    """
    def before_write() -> None:
        what = None
        if recheck is not None:
            if writes:
                with writes_replay.taken_back(writes):
                    what = recheck.changes(ck)
            else:
                what = recheck.changes(ck)
        if what is not None:
            raise KeyChanged(f"{loader.name} changed {what} while it loaded; a hit cannot make "
                             f"that change to the objects of another call, so this call runs "
                             f"plain each time")

    expect_meta = torch_state.makes_meta(ck.ambient)
    kept = writes_replay.for_entry(writes, result) if writes else None
    changes_arguments = any(held(w.place) for w in writes or ())
    index = None
    if changes_arguments:  # its module arguments' parts by where they were as it found them
        with writes_replay.taken_back(writes or []):
            index = arguments_ref.ArgumentIndex(arguments, into_modules=True)
    try:
        try:
            encoded = codec.encode(result, loader, ck.summary, arguments,
                                   before_write=before_write, arena=load_arena,
                                   expect_meta=expect_meta, writes=kept, argument_index=index)
        except pickling.PicklingFailed as e:
            if kept and _pickles_alone(result, loader, ck, arguments):
                raise WritesNotKept(f"{loader.name} wrote a value outside its result that cannot "
                                    f"be kept for a hit ({fallback.brief(e)}), so this call runs "
                                    f"plain each time") from e
            raise
        res = _publish(client, ck, encoded, warned, logged, extra_meta)
    except (ServerError, codec.FileChanged) as e:
        if e.reason not in _COPY_INSTEAD:
            raise
        # An entry this one references was evicted meanwhile, or a checkpoint file it references
        # changed: write the bytes themselves instead.
        encoded = codec.encode(result, loader, ck.summary, arguments, reference_mapped=False,
                               expect_meta=expect_meta, writes=kept, argument_index=index)
        res = _publish(client, ck, encoded, warned, logged, extra_meta)
    if changes_arguments or _plain_result_will_do(result, encoded):
        # (a call that changed its module arguments returns its own result: the caller's modules
        # hold its parts)
        for fd in res.fds.values():
            os.close(fd)
        return result
    replace = (lambda: writes_replay.take_back(writes)) if writes else None
    return codec.decode(res.entry, res.fds, arguments, replace_writes=replace)


def publish_marker(client: Client, loader: key.Loader, ck: key.CacheKey, names: list[str]) -> None:
    """Publish under the call's key the marker that sends hits to the variant of the state they
    vary with (``vary.py``)."""
    encoded = codec.encode(None, loader, ck.summary)
    encoded.meta[vary_mod.MARKER] = list(names)
    _publish(client, ck, encoded).close()


def _pickles_alone(result: Any, loader: key.Loader, ck: key.CacheKey,
                   arguments: dict | None) -> bool:
    """Whether ``result`` pickles without its loader's writes (asked only after the two failed
    together)."""
    try:
        encoded = codec.encode(result, loader, ck.summary, arguments, reference_mapped=False)
    except Exception as e:
        interrupts.raise_users(e)
        return False
    os.close(encoded.fd)
    for _, fd in encoded.files:
        os.close(fd)
    return True


def _plain_result_will_do(result: Any, encoded: codec.Encoded) -> bool:
    """Whether the miss returns the loader's own result rather than its rebuild from the entry just
    published.

    Rebuilding serves two ends: the process then shares the result's weights with the others (the
    loader's heap copies are freed), and a module or tensor rebuilt from an entry is keyed by that
    entry when it is passed to a later load (``keys/provenance.py``). A result that gains neither is
    returned as the loader made it, the plain call's own object: one that is not a module or tensor,
    and whose storages (if any) all lie where this process already shares them with the others, in
    the pages of an entry it maps or of a checkpoint file. That is a tokenizer, a scheduler or a
    config (no storage), and a pipeline whose components came from nested loads (their entries'
    pages). A result with any storage of its own in the entry, however small, is rebuilt.
    """
    return not encoded.owns_storages and not provenance.tracked(result)


def _publish(client: Client, ck: key.CacheKey, encoded: codec.Encoded, warned: list | None = None,
             logged: dict | None = None, extra_meta: dict | None = None) -> Any:
    """Publish ``encoded`` under ``ck``, with the loader's warnings, log records and more meta; the
    reply is a hit on the entry. The entry's fds are closed here."""
    if extra_meta:
        encoded.meta.update(extra_meta)
    if warned:
        encoded.meta["warnings"] = warned
    if logged:
        encoded.meta["logs"] = logged
    try:
        return client.publish_hit(ck.key, encoded.fd, deps=encoded.deps, meta=encoded.meta,
                                  files=encoded.files)
    finally:
        os.close(encoded.fd)
        for _, fd in encoded.files:
            os.close(fd)
