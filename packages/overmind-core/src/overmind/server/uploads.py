"""Uploads to the fleet's store (``overmind.fleet``), in a thread of the server, never on a caller's
path: an entry published with a portable key (its meta's ``fleet``, written by a client whose
``OVERMIND_FLEET`` is set) is queued with duplicates of its fd and of every entry and checkpoint file
it depends on, and the thread uploads what the store lacks, then the signed reference
(``fleet/transfer.py``). The server's own ``OVERMIND_FLEET`` and ``OVERMIND_FLEET_KEY_FILE`` choose the
store and the key; without them, nothing is uploaded.

An eviction closes only the server's own fds, so an entry evicted while it waits still uploads.
A failure (store down, full, refused) is logged and counted for ``overmind status``; the entry stays
local, and the next node that lacks it runs its loader.
"""
from __future__ import annotations

import os
import queue
import sys
import threading

from .._util import quiet_threads
from ..ipc.protocol import is_file_entry
from .log import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .entry import Entry

FLEET_META = "fleet"  # an entry's meta: {"portable_key", "stack"} where its publisher keyed it so
MAX_PENDING = 256  # uploads waiting at once; more are dropped (logged), the entries stay local


class Uploader:
    """The upload queue and its thread (started with the first upload)."""

    def __init__(self) -> None:
        self.counters = {"fleet_uploads": 0, "fleet_upload_bytes": 0, "fleet_upload_failures": 0}
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._fleet: Any = None
        self._configured: bool | None = None

    def pending(self) -> int:
        """Entries waiting to upload (the one uploading included)."""
        return self._queue.unfinished_tasks

    def on_publish(self, entry: Entry, closure: list[Entry]) -> None:
        """Queue ``entry`` (with ``closure``, the entries it depends on) if its publisher keyed it
        for the fleet and this server has one."""
        about = entry.meta.get(FLEET_META)
        if not isinstance(about, dict) or not self._has_fleet():
            return
        if self._queue.unfinished_tasks >= MAX_PENDING:
            log.warning("fleet: %d uploads wait already; %s stays local", MAX_PENDING, entry.entry_id)
            self.counters["fleet_upload_failures"] += 1
            return
        fds: list[int] = []
        try:
            fds.append(os.dup(entry.fd))
            deps = []
            for dep in closure:
                fds.append(os.dup(dep.fd))
                deps.append((dep.entry_id, fds[-1],
                             "file" if is_file_entry(dep.entry_id) else "entry"))
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            log.warning("fleet: cannot queue %s for upload (%s)", entry.entry_id, exc.strerror)
            self.counters["fleet_upload_failures"] += 1
            return
        meta = {k: v for k, v in entry.meta.items() if k != FLEET_META}
        self._queue.put((entry.entry_id, about, meta, fds[0], deps))
        if self._thread is None:
            self._thread = quiet_threads.start(threading.Thread(
                target=self._work, name="overmind-fleet-upload", daemon=True))

    def _has_fleet(self) -> bool:
        if self._configured is None:
            from ..fleet import config

            if sys.flags.no_site:
                # A server started on demand runs without site (client/launcher.py); the store's
                # client library (boto3) lies in the environment's site-packages.
                import site

                site.main()

            try:
                self._fleet = config.fleet()
            except Exception as exc:  # a fleet set but unusable (key file): said once, uploads off
                log.warning("fleet: uploads off: %s", exc)
                self._fleet = None
            self._configured = self._fleet is not None
            if self._fleet is not None:
                log.info("fleet: uploading published entries to %s", self._fleet.url)
        return bool(self._configured)

    def _work(self) -> None:
        from ..fleet import transfer

        while True:
            entry_id, about, meta, main_fd, deps = self._queue.get()
            try:
                sent = transfer.upload(self._fleet.store, self._fleet.key, about["portable_key"],
                                       about["stack"], entry_id, meta, main_fd, deps)
                self.counters["fleet_uploads"] += 1
                self.counters["fleet_upload_bytes"] += sent
                log.info("fleet: uploaded %s (%d new bytes) as %s", entry_id, sent,
                         str(about.get("portable_key"))[:16])
            except Exception as exc:
                self.counters["fleet_upload_failures"] += 1
                log.warning("fleet: upload of %s failed (%s: %s); it stays on this node", entry_id,
                            type(exc).__name__, exc)
            finally:
                for fd in [main_fd, *(d[1] for d in deps)]:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                self._queue.task_done()
