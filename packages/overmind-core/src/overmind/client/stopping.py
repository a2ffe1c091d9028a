"""Stop the server of a runtime directory, whether or not it answers: asked to exit, or, holding the lock without
answering within ``OVERMIND_CONTROL_TIMEOUT``, found by the pid in ``server.lock``, sent SIGTERM and SIGCONT, then
SIGKILL after a grace period (``overmind stop [--force] [--grace S]``).

A server that answers is asked to exit (``op: stop``) and exits cleanly. One that holds the directory's lock
but does not answer within ``OVERMIND_CONTROL_TIMEOUT`` (stopped with ``kill -STOP``, Ctrl-Z on ``overmind
serve``, a debugger, wedged) is found by the pid it wrote into ``server.lock``, checked to be an Overmind server
of this directory, sent ``SIGTERM`` (and ``SIGCONT``, so a stopped one runs its handler and exits cleanly), and
after a grace period, or at once with ``force``, ``SIGKILL``. "No server is running" is said only when no
process holds the lock.
"""
from __future__ import annotations

import os
import signal
import time

from .._util import interrupts
from .._util.process_state import alive
from .._util.process_state import state as process_state
from ..errors import ServerUnavailable
from ..ipc import runtime
from . import launcher

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

GRACE_S = 5.0


def stop_server(runtime_dir: str | None = None, *, force: bool = False, grace: float = GRACE_S) -> dict[str, Any]:
    """Stop the server; what happened: ``stopped`` (bool), ``pid``, ``how`` (``"asked"``, ``"terminated"``,
    ``"killed"`` or None when none ran) and ``note`` (why it was not asked, where it was not)."""
    from .connection import Client

    directory = runtime.runtime_dir(runtime_dir)
    try:
        reply = Client(directory, autostart=False, control=True).stop()
        return {"stopped": True, "pid": reply.get("pid"), "how": "asked", "note": ""}
    except ServerUnavailable as exc:
        unanswered = str(exc)
    pid = holder(directory)
    if pid is None:
        return {"stopped": False, "pid": None, "how": None, "note": ""}
    state = process_state(pid)
    note = (f"the server (pid {pid}{', stopped' if state == 'T' else ''}) did not answer: "
            f"{unanswered.removeprefix('overmind: ')}")
    if force:
        _signal(pid, signal.SIGKILL)
        return {"stopped": _gone(directory, pid, 10.0), "pid": pid, "how": "killed", "note": note}
    _signal(pid, signal.SIGTERM)
    _signal(pid, signal.SIGCONT)  # a stopped process runs its SIGTERM handler only once it continues
    if _gone(directory, pid, grace):
        return {"stopped": True, "pid": pid, "how": "terminated", "note": note}
    _signal(pid, signal.SIGKILL)
    return {"stopped": _gone(directory, pid, 10.0), "pid": pid, "how": "killed",
            "note": note + f"; it did not exit within {grace:g} s of SIGTERM"}


def holder(runtime_dir: str) -> int | None:
    """The pid of the Overmind server holding ``runtime_dir``'s lock, or None where none holds it."""
    if launcher.server_lock_free(runtime_dir):
        return None
    try:
        with open(runtime.server_lock_path(runtime_dir), "rb") as f:
            written = f.read(32).decode(errors="replace").strip()
    except OSError as exc:
        interrupts.raise_users(exc)
        written = ""
    servers = launcher.server_pids(runtime_dir)
    if written.isdigit() and int(written) in servers:
        return int(written)
    return servers[0] if len(servers) == 1 else None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _gone(runtime_dir: str, pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if not alive(pid) and launcher.server_lock_free(runtime_dir):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
