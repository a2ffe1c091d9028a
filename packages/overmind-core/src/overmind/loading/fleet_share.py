"""The fleet on a load (``overmind.fleet``, ``OVERMIND_FLEET``): a local miss asks the fleet's store
for the call's entry before its loader runs, and a publish carries the call's portable key, by
which the server uploads the entry for the other nodes (``server/uploads.py``).

A portable key (``keys/portable.py``) describes the call by content (a file by its digest, not its
path or inode) and by the software stack, so it is the same on every node that would build the same
entry. Found in the store, the entry is verified (its signature with the fleet key, every blob's
digest) before anything of it is unpickled, streamed into sealed memfds and handed to the server
(op ``adopt``), which then serves it under this node's own key: the call is a hit. Anything that
goes wrong on the way (the store down or slow, an entry refused) says so once and the loader runs,
as on any miss. With a fleet, a first load publishes at once: another node is the reuse.
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from .. import fallback
from .._util import interrupts
from ..adapters import hooks
from ..errors import OvermindError
from ..keys import key, portable_entries

if TYPE_CHECKING:
    from ..client.connection import Client, GetResult

log = logging.getLogger("overmind")

# local key -> (portable key, stack) of the calls this process asked the fleet for, until published
_portable: dict[str, tuple[str, dict]] = {}
_MAX_REMEMBERED = 1024
_unusable: list[str] = []  # the fleet's configuration error, said once a process
REST_S = 60.0  # how long a process leaves a store that failed alone
_resting_until = [0.0]  # monotonic time until which the store is not asked
_warned_store: list[str] = []  # a store failure was warned about in this process


def fleet() -> Any:
    """This process's fleet (``fleet.config.Fleet``), or None: none set, or unusable (said once)."""
    if _unusable:
        return None
    from ..fleet import config

    try:
        return config.fleet()
    except OvermindError as e:
        _unusable.append(str(e))
        fallback.step_aside(f"overmind: the fleet is off for this process: {e}", e)
        return None


def enabled() -> bool:
    """Whether ``OVERMIND_FLEET`` names a usable fleet."""
    from .. import settings

    return settings.current().fleet is not None and fleet() is not None


def serve_from_fleet(client: Client, loader: key.Loader, local_key: str, arguments: dict,
                     value_hook: Callable[[Any], Any]) -> GetResult | None:
    """A hit on the fleet's entry for this call, imported under ``local_key`` (claimed by this
    call), or None: no fleet, no entry there, or it could not be had (said once)."""
    found = fleet()
    if found is None or time.monotonic() < _resting_until[0]:
        return None
    from ..fleet import errors, transfer
    from ..keys import content_digest, portable

    try:
        stack = portable.stack()
        portable_key = portable.portable_key(loader, arguments,
                                             lambda: hooks.key_parts(loader, arguments),
                                             value_hook)
    except key.Unkeyable as e:
        log.debug("not asking the fleet for %s: %s", loader.name, e)
        return None
    _remember(local_key, portable_key, stack)
    try:
        imported = transfer.download(found.store, found.key, portable_key, stack,
                                     local=content_digest.local_file)
    except errors.Refused as e:
        fallback.step_aside(f"overmind: refused the fleet's entry for {loader.name} from "
                            f"{found.url} ({e}); loaded it with its loader.", e)
        return None
    except Exception as e:
        interrupts.raise_users(e)
        _store_failed(found.url, loader.name, e)
        return None
    if imported is None:
        log.debug("the fleet has no entry for %s (%s)", loader.name, portable_key[:16])
        return None
    _portable.pop(local_key, None)  # imported: nothing to upload
    portable_entries.remember(local_key, portable_key)
    return _adopt(client, local_key, imported, portable_key, stack)


def _adopt(client: Client, local_key: str, imported: Any, portable_key: str,
           stack: dict) -> GetResult:
    """Hand the imported entry to the server; its meta keeps its portable key (``overmind export``
    writes it out again). A checkpoint file this node holds itself goes as a file the entry
    references, described as a publish describes one (the server checks it is that file)."""
    from ..fleet import transfer
    from ..ipc.protocol import file_entry_id, file_identity

    manifest = imported.manifest
    digests = {d["entry_id"]: d["digest"] for d in manifest["deps"]}
    parts = []
    for eid, fd, kind in imported.deps:
        about: dict[str, Any] = {"entry_id": eid, "kind": "file" if kind == transfer.LOCAL else kind,
                                 "digest": digests[eid]}
        if kind == transfer.LOCAL:
            identity = file_identity(os.fstat(fd))
            about["file"] = {"entry_id": file_entry_id(identity), "path": os.readlink(f"/proc/self/fd/{fd}"),
                             **identity}
        parts.append((about, fd))
    fds = [imported.main[1], *(fd for _, fd in parts)]
    try:
        meta = dict(manifest["meta"], fleet={"portable_key": portable_key, "stack": stack})
        return client.adopt(local_key, imported.main[1], meta, parts)
    finally:
        for fd in fds:
            os.close(fd)


def note_hit(local_key: str, meta: dict) -> None:
    """A hit on ``local_key``'s entry: its portable key, where its meta has one, stands for it in
    the portable keys of later loads given its objects."""
    about = meta.get("fleet")
    if isinstance(about, dict) and isinstance(about.get("portable_key"), str):
        portable_entries.remember(local_key, about["portable_key"])


def _store_failed(url: str, name: str, e: BaseException) -> None:
    """A store that failed (down, stalled, refusing) is not asked again for :data:`REST_S`: every
    load meanwhile would wait for it. Said with a warning once a process, logged after that."""
    _resting_until[0] = time.monotonic() + REST_S
    message = (f"overmind: cannot read the fleet's store {url} ({type(e).__name__}: "
               f"{fallback.brief(e)}); loaded {name} with its loader, and this process asks the "
               f"store again in {REST_S:.0f} s. Run 'overmind doctor'.")
    if _warned_store:
        log.info("%s", message)
        return
    _warned_store.append(url)
    fallback.step_aside(message, e)


def publish_meta(local_key: str) -> dict:
    """The meta that makes the server upload the entry of ``local_key`` (its portable key and
    stack), where this process asked the fleet for it; ``{}`` otherwise."""
    known = _portable.pop(local_key, None)
    if known is None:
        return {}
    portable_entries.remember(local_key, known[0])
    return {"fleet": {"portable_key": known[0], "stack": known[1]}}


def _remember(local_key: str, portable_key: str, stack: dict) -> None:
    if len(_portable) >= _MAX_REMEMBERED:
        del _portable[next(iter(_portable))]
    _portable[local_key] = (portable_key, stack)
