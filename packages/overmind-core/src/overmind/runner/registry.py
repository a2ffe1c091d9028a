"""Where templates live and how ``overmind run`` finds, starts and stops them.

Each template has two files in ``<runtime dir>/templates/`` (mode 0700, like the runtime directory):
``<id>.sock``, where it accepts ``run`` requests, and ``<id>.json``, what it is (pid, key, the environment
its imports read, what it preloaded, when it started). ``<id>`` is ``<base key id>-<environment id>``. A
client lists the ``<base key id>-*.json`` files, takes the first whose environment matches its own, and
otherwise starts a template itself: under ``<base key id>.lock`` (a flock), so that sixteen ``run``s at
once start one template, not sixteen. Output of the templates (the preloaded libraries' import-time
warnings among it) goes to ``templates.log``.
"""
from __future__ import annotations

import _signal  # not signal nor socket: the launcher imports this module (see ipc/protocol.py)
import _socket
import errno
import fcntl
import os
import sys
import time

from .._util import json_accel  # (not json: see ipc/protocol.py)
from .._util.process_state import alive
from ..errors import OvermindError
from ..ipc import runtime
from . import envkey

ENV_START_TIMEOUT = "OVERMIND_TEMPLATE_START_TIMEOUT"
DEFAULT_START_TIMEOUT = 600.0
TEMPLATE_ENTRY = "import overmind.runner.template as t; t.main()"
TITLE_ROOM = 4096  # spaces on the template's command line, which each child overwrites with the user's own


class TemplateUnavailable(OvermindError):
    """No template can serve this program (it could not be started, found or asked); says why."""


def templates_dir(runtime_dir: str | None = None) -> str:
    """``<runtime dir>/templates``, created with mode 0700 and checked like the runtime directory."""
    path = os.path.join(runtime.runtime_dir(runtime_dir), "templates")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    runtime.check_runtime_dir(path)
    return path


def log_path(runtime_dir: str | None = None) -> str:
    return os.path.join(templates_dir(runtime_dir), "templates.log")


def templates(runtime_dir: str | None = None, prefix: str = "") -> list[dict]:
    """The info of every live template (its pid runs and its socket is there), oldest first."""
    directory = templates_dir(runtime_dir)
    found = []
    for name in sorted(os.listdir(directory)):
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        info = read_info(os.path.join(directory, name))
        if info is not None and alive(info.get("pid")) and os.path.exists(info.get("socket", "")):
            found.append(info)
    return sorted(found, key=lambda i: i.get("started", 0))


def read_info(path: str) -> dict | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            info = json_accel.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def write_info(path: str, info: dict) -> None:
    """Write ``info`` to ``path`` atomically (a reader sees the old file or the whole new one)."""
    import json  # (a template writes its info; the launcher only reads it)

    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def find(runtime_dir: str | None, base_id: str, environ: dict[str, str]) -> tuple[dict | None, list[str]]:
    """The first live template of ``base_id`` whose recorded environment matches ``environ``, and why each
    other one did not."""
    reasons = []
    for info in templates(runtime_dir, prefix=base_id + "-"):
        why = envkey.environment_mismatch(info.get("environment", {}), environ)
        if why is None:
            return info, reasons
        reasons.append(f"template {info['pid']}: {why}")
    return None, reasons


class start_lock:
    """``with start_lock(runtime_dir, base_id, timeout)``: hold ``<base id>.lock`` (so only one client starts a
    template of this key at a time). (A class, not contextlib's generator: the launcher does without contextlib.)"""

    def __init__(self, runtime_dir: str | None, base_id: str, timeout: float) -> None:
        self._path = os.path.join(templates_dir(runtime_dir), base_id + ".lock")
        self._timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + self._timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                if time.monotonic() >= deadline:
                    raise TemplateUnavailable(
                        f"another process has been starting a template for {self._timeout:g} s")
                time.sleep(0.05)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def __exit__(self, *exc_info: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def start_timeout() -> float:
    value = os.environ.get(ENV_START_TIMEOUT)
    if not value:
        return DEFAULT_START_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        raise TemplateUnavailable(f"{ENV_START_TIMEOUT}={value!r} is not a number of seconds") from None
    return seconds if seconds > 0 else DEFAULT_START_TIMEOUT


def spawn(runtime_dir: str, preload: list[str], options: list[str], environ: dict[str, str],
          timeout: float) -> dict:
    """Start a template (detached, in its own session) and wait until it serves; returns its info."""
    directory = templates_dir(runtime_dir)
    log_fd = os.open(os.path.join(directory, "templates.log"),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    command = [sys.executable, *options, "-c", TEMPLATE_ENTRY, "--runtime-dir", runtime_dir,
               "--preload", json_accel.dumps(preload), "--ready-fd", str(write_end),
               "--room", " " * TITLE_ROOM]
    import subprocess  # (here: the launcher that finds a running template does without it)

    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, cwd="/",
                                env=environ, start_new_session=True, pass_fds=(write_end,))
    except OSError as exc:
        os.close(read_end)
        raise TemplateUnavailable(f"cannot run {sys.executable}: {exc.strerror}") from None
    finally:
        os.close(write_end)
        os.close(log_fd)
    try:
        line = _read_line(read_end, timeout)
    finally:
        os.close(read_end)
    if not line:
        code = proc.poll()
        if code is None:
            proc.kill()
        proc.wait()
        what = f"exited with status {code}" if code is not None else f"did not start within {timeout:g} s"
        raise TemplateUnavailable(f"the template process {what}; see {os.path.join(directory, 'templates.log')}")
    status, _, payload = line.partition(" ")
    if status != "ready":
        proc.wait()
        raise TemplateUnavailable(payload or "the template failed to start")
    # The template runs on; reap it when it ends so it is no zombie of this process.
    import threading

    from .._util import quiet_threads

    quiet_threads.start(threading.Thread(target=proc.wait, name="overmind-template-reaper", daemon=True))
    return json_accel.loads(payload)


def _read_line(fd: int, timeout: float) -> str:
    import select  # only when this process starts a template

    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return ""
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return ""
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def connect(info: dict, timeout: float = 10.0) -> _socket.socket:
    """A connection to the template of ``info``, after checking that it runs as this user."""
    from ..ipc.peer import check_peer, check_socket_file

    path = info["socket"]
    check_socket_file(path)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        check_peer(sock, path)
    except BaseException:
        sock.close()
        raise
    return sock


def stop_all(runtime_dir: str | None = None, timeout: float = 10.0) -> list[int]:
    """Ask every template of ``runtime_dir`` to stop (SIGTERM) and return their pids.

    A template stops taking requests at once and exits when its running programs have ended, which may be
    much later: that is not waited for. One still taking requests after ``timeout`` seconds (wedged) is
    killed. One still importing has no SIGTERM handler yet: the signal ends it."""
    serving = {int(info["pid"]) for info in templates(runtime_dir)}
    pids = sorted(serving | set(template_pids(runtime.runtime_dir(runtime_dir))))
    for pid in pids:
        try:
            os.kill(pid, _signal.SIGTERM)
        except ProcessLookupError:
            pass

    def still_serving() -> list[int]:
        listening = {int(info["pid"]) for info in templates(runtime_dir)}
        return [p for p in pids if alive(p) and p in listening]

    deadline = time.monotonic() + timeout
    while still_serving() and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = still_serving()
    for pid in killed:
        try:
            os.kill(pid, _signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0  # SIGKILL is delivered asynchronously: listed no more once it has been
    while any(alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids


def template_pids(runtime_dir: str) -> list[int]:
    """Pids of this user's template processes for ``runtime_dir`` (from their command lines)."""
    pids = []
    want = os.fsencode(runtime_dir)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != os.getuid():
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if TEMPLATE_ENTRY.encode() in argv and want in argv:
            pids.append(int(name))
    return pids


