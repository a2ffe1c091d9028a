"""How the previous server of a runtime directory ended (``server.state``: started, ended in order or not), and when
the cache was last lost: a server that finds the last one killed logs that its entries were lost, and ``status``
shows when.

Each server writes ``server.state`` (JSON, replaced atomically) when it starts, ``{"pid", "started", "ended":
null, "last_lost"}``, and sets ``"ended": "clean"`` when it stops in order. A server that finds the previous
record without a clean end knows that server was killed or crashed (or its machine went down) and its entries
were lost: it logs so, and carries ``last_lost`` (when that was noticed, and the lost server's pid) in its own
record, which ``overmind status`` shows. A directory never served before has no record.
"""
from __future__ import annotations

import json
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STATE_FILE = "server.state"


def state_path(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, STATE_FILE)


def read(runtime_dir: str) -> dict[str, Any] | None:
    """The record in ``runtime_dir``, or None where there is none (or it is unreadable)."""
    try:
        fd = os.open(state_path(runtime_dir), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            value = json.loads(f.read(4096) or b"null")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write(runtime_dir: str, record: dict[str, Any]) -> None:
    tmp = state_path(runtime_dir) + f".{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, state_path(runtime_dir))


def started(runtime_dir: str, pid: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Record this server's start (it holds the directory's lock). Returns ``(previous, lost)``: the previous
    server's record, and ``last_lost`` as this server carries it (new where the previous server did not end
    cleanly)."""
    previous = read(runtime_dir)
    lost = previous.get("last_lost") if previous else None
    if previous and previous.get("ended") != "clean":
        lost = {"pid": previous.get("pid"), "started": previous.get("started"), "noticed": time.time()}
    _write(runtime_dir, {"pid": pid, "started": time.time(), "ended": None, "last_lost": lost})
    return previous, lost


def stopped(runtime_dir: str) -> None:
    """Mark this server's record as ended in order (before it lets go of the lock)."""
    record = read(runtime_dir)
    if record is not None and record.get("pid") == os.getpid():
        record["ended"] = "clean"
        _write(runtime_dir, record)


def describe_previous(previous: dict[str, Any] | None) -> str | None:
    """The log line about the previous server, or None where there was none."""
    if not previous:
        return None
    if previous.get("ended") == "clean":
        return f"the previous server (pid {previous.get('pid')}) stopped in order"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(previous.get("started") or 0))
    return (f"the previous server (pid {previous.get('pid')}, started {when}) ended without stopping (killed, "
            f"crashed or its machine went down): the entries it held were lost")
