"""The spawner's claim: the key that the process which started this server loads while the server starts, held for
that process (its parent only) until one of its connections names the key, dropped when it exits (a pidfd).

A process that finds no server running knows its first load is a miss: a new server holds nothing. So it starts the
server with ``--claim KEY --claim-pid PID`` and runs its loader at once, instead of waiting for the server to start
and accept its ``get`` (docs/architecture.md, "Measured costs") (``launcher.start_holding``). The server takes that
claim before it listens, so every other process that asks for the key finds it claimed and waits for the publish, as
for any claim: the loader still runs once however many processes start together.

- Only the server's parent may hold such a claim: ``take`` refuses any other pid (a claim named on an
  ``overmind serve`` command line, a parent that is gone already), and the claim is then simply not taken.
- The spawner's connection takes the claim over when it first names the key (``Store.adopt``: its publish, or its
  release when the loader failed); from there it ends with that connection, like any other.
- If the spawner ends before that, the claim goes with it: a pidfd in the server's selector turns readable when the
  process exits, and the server releases what the process still held, so the waiters go on at once.
"""
from __future__ import annotations

import os

from .log import log


class SpawnerClaim:
    """A claim on ``key`` held for process ``pid``, the server's parent; ``fileno()`` is a pidfd of that process,
    readable once it has exited."""

    def __init__(self, key: str, pid: int, pidfd: int) -> None:
        self.key, self.pid, self._pidfd = key, pid, pidfd

    @classmethod
    def take(cls, key: str, pid: int) -> SpawnerClaim | None:
        """The claim for ``pid`` on ``key``, or None (logged) when ``pid`` is not this server's parent or cannot
        be watched; no claim is then held, and the spawner's load publishes like a process that raced."""
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError) as exc:  # no pidfd_open (Linux < 5.3), or the process is gone
            log.info("not holding key %s for pid %d: cannot watch that process (%s)", key[:12], pid, exc)
            return None
        # After the pidfd is open, the pid cannot name another process for as long as the pidfd is ours: if the
        # parent is still that pid now, the pidfd watches the spawner.
        if os.getppid() != pid:
            os.close(pidfd)
            log.info("not holding key %s for pid %d: only the process that started the server may name its own "
                     "key (this server's parent is pid %d)", key[:12], pid, os.getppid())
            return None
        return cls(key, pid, pidfd)

    def fileno(self) -> int:
        return self._pidfd

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
