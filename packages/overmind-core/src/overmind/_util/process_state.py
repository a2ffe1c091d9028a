"""A process's state letter from ``/proc/<pid>/stat``: whether it runs, is stopped, is a zombie or is gone (the
template registry, ``overmind stop``)."""
from __future__ import annotations

from . import interrupts


def state(pid: object) -> str | None:
    """The state letter of ``pid`` (``R``, ``S``, ``T`` for stopped, ``Z`` for a zombie, ...), None where no such
    process is (or ``pid`` is no positive int)."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError) as exc:
        interrupts.raise_users(exc)
        return None


def alive(pid: object) -> bool:
    """Whether ``pid`` runs and is no zombie."""
    return state(pid) not in (None, "Z", "X")
