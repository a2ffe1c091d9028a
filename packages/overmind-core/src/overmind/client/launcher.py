"""Start the server on demand: ``ensure_server()`` returns a socket path that accepts connections (one spawner under
a lock, a detached ``python -S`` process with overmind on ``PYTHONPATH``); ``start_holding``: with no server
running, a load spawns one holding its key and runs its loader at once.

Clients race to start the server; a flock on ``spawn.lock`` makes exactly one of them spawn it, and the
server's own flock on ``server.lock`` guards against everything else (a manual ``overmind serve``). The
server runs detached (its own session) so it outlives the process that started it.

Whatever stands in the way (an interpreter that does not run, a directory at ``spawn.lock``, a runtime
directory this user cannot write, a bad setting) raises ``ServerUnavailable`` saying what and what to do,
never a bare ``OSError``: ``overmind.load`` then runs uncached with one warning. ``preflight`` lists the
same problems without starting anything, for ``overmind doctor``. Files in the runtime directory are opened
with ``O_NOFOLLOW``: a symlink planted there is refused, never followed.

``start_holding(key)`` is a process's first load when no server runs: that load is a miss (a new server holds
nothing), so it spawns the server with ``key`` claimed for this process (``server/handoff.py``) and returns at once;
the loader runs while the server starts, and a helper thread waits for the server and frees the spawn lock. The
``ensure_server`` of the load's publish then waits for that start instead of polling the spawn lock. A server that
fails to start is reported there, by the load's one warning.

>>> path = ensure_server()
>>> start_holding(key)  # True: spawned, key claimed for this process; False: a server runs or is starting
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import subprocess
import sys
import threading
import time

from .._util import interrupts, quiet_threads
from ..errors import ServerUnavailable
from ..ipc import runtime
from . import timeouts

ENV_START_TIMEOUT = timeouts.ENV_START
DEFAULT_START_TIMEOUT = timeouts.DEFAULTS[ENV_START_TIMEOUT]
_POLL_S = 0.02
_START_POLL_S = 0.005  # while a server we spawned starts (~0.1 s): a connect() every 5 ms is nothing to the CPU
_PROBE_S = 1.0


def accepts(path: str) -> bool:
    """Whether a server listens on the Unix socket ``path`` right now (never blocks: a stopped server's full
    connection queue counts as listening, so nobody spawns a second server beside it)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.setblocking(False)
    try:
        probe.connect(path)
        return True
    except BlockingIOError:
        return True
    except OSError as exc:
        interrupts.raise_users(exc)
        return False
    finally:
        probe.close()


def wait_accepting(path: str, timeout: float, poll: float = _POLL_S) -> bool:
    """Wait until a server listens on ``path`` (see :func:`accepts`); False if none does within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not accepts(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def ensure_server(runtime_dir: str | None = None, timeout: float | None = None) -> str:
    """Return the socket path of a running server for ``runtime_dir``, spawning one if none accepts.

    Raises ``ServerUnavailable`` (with the log's tail and what to do) if none is up within ``timeout``
    seconds (default ``$OVERMIND_SERVER_START_TIMEOUT`` or 15).
    """
    directory = runtime.runtime_dir(runtime_dir)
    path = runtime.socket_path(directory)
    if accepts(path):
        return path
    if timeout is None:
        timeout = timeouts.start_timeout()
    deadline = time.monotonic() + timeout
    starting = _starting.get(directory)
    if starting is not None and starting is not threading.current_thread():
        starting.join(timeout)  # this process's start in flight: its end, not a poll of the spawn lock
        if accepts(path):
            return path
    lock_fd = _open_private(runtime.spawn_lock_path(directory), os.O_RDWR)
    _held.add(lock_fd)
    try:
        if not _lock_until(lock_fd, deadline):
            if accepts(path):
                return path
            raise _unavailable(directory, f"another process has been starting the server for {timeout:g} s")
        return _start_and_wait(directory, path, deadline, timeout)
    finally:
        _unlock(lock_fd)


# runtime directory -> this process's start of its server, in flight. Set only by the thread holding the spawn lock
# (a second start_holding, of any thread, fails to take it), so a plain dict assignment needs no lock of its own.
_starting: dict[str, threading.Thread] = {}
_held: set[int] = set()  # spawn-lock fds open in this process (a forked child closes its copies)


def start_holding(runtime_dir: str | None, key: str) -> bool:
    """Spawn the server of ``runtime_dir`` with ``key`` claimed for this process, unless a server accepts or some
    process (this one included) is starting one; True when it spawned it. Returns at once: a helper thread waits
    until the server accepts, holding the spawn lock meanwhile so that nobody spawns a second one.

    True means the key is this process's to load now: the server takes the claim before it listens, so any other
    process asking for the key waits for this one's publish. Raises ``ServerUnavailable`` when the server cannot
    be spawned at all (the directory, the interpreter); a server that starts and then fails is reported by the
    next ``ensure_server``."""
    directory = runtime.runtime_dir(runtime_dir)
    path = runtime.socket_path(directory)
    if accepts(path):
        return False
    lock_fd = _open_private(runtime.spawn_lock_path(directory), os.O_RDWR)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:  # another process (or thread of this one) is starting the server: ask it, as usual
        interrupts.raise_users(exc)
        os.close(lock_fd)
        return False
    _held.add(lock_fd)
    try:
        proc = None if accepts(path) or not server_lock_free(directory) else _spawn(directory, claim=key)
    except BaseException:
        _unlock(lock_fd)
        raise
    if proc is None:  # a server runs or is on its way after all
        _unlock(lock_fd)
        return False
    helper = threading.Thread(target=_finish_start, args=(directory, path, lock_fd, proc, timeouts.start_timeout()),
                              name="overmind-server-start", daemon=True)
    _starting[directory] = helper
    quiet_threads.start(helper)
    return True


def _unlock(lock_fd: int) -> None:
    _held.discard(lock_fd)
    # Not under suppress(OSError): closing our own fd does not fail, and a TimeoutError that the user's SIGALRM handler
    # raises here is an OSError too, which must reach the user.
    os.close(lock_fd)  # releases the flock


def _finish_start(directory: str, path: str, lock_fd: int, proc: subprocess.Popen, timeout: float) -> None:
    """On the helper thread: wait until the server spawned by ``start_holding`` accepts (or the one that was already
    starting, if it found one), then free the spawn lock and reap it. Silent: the next ``ensure_server`` tries again
    and reports a failure."""
    try:
        _start_and_wait(directory, path, time.monotonic() + timeout, timeout, proc)
    except Exception as exc:  # noqa: BLE001  (the load's publish calls ensure_server, which tries again and reports it)
        interrupts.raise_users(exc)
    finally:
        _unlock(lock_fd)


def _after_fork_in_child() -> None:
    # The child has none of the parent's threads: no start is in flight here, and a spawn lock the parent
    # held is one the child holds too (the flock lives on the open file) until this copy is closed.
    _starting.clear()
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError as exc:
            interrupts.raise_users(exc)
    _held.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _start_and_wait(directory: str, path: str, deadline: float, timeout: float,
                    proc: subprocess.Popen | None = None) -> str:
    """With the spawn lock held: spawn a server unless one is up or on its way (``proc``: one this process spawned
    already), then wait until it accepts."""
    try:
        while time.monotonic() < deadline:
            if accepts(path):
                return path
            if proc is not None and proc.poll() is not None:
                if proc.returncode != runtime.EXIT_ALREADY_RUNNING:
                    raise _unavailable(directory, f"the server process exited with status {proc.returncode}")
                proc = None  # another server holds the lock: wait for it to accept, or to finish stopping
            # A server that holds its lock but does not accept is starting or stopping: wait, don't spawn.
            if proc is None and server_lock_free(directory):
                proc = _spawn(directory)
            time.sleep(_START_POLL_S if proc is not None else _POLL_S)
        raise _unavailable(directory, f"the server did not accept connections within {timeout:g} s "
                                      f"(raise {ENV_START_TIMEOUT} if the machine is very busy)")
    finally:
        if proc is not None:
            # Reap the server when it eventually exits so it does not linger as a zombie of this process.
            quiet_threads.start(threading.Thread(target=proc.wait, name="overmind-server-reaper", daemon=True))


def server_lock_free(runtime_dir: str | None = None) -> bool:
    """Whether no server process holds the runtime directory's server lock (none running or starting)."""
    fd = _open_private(runtime.server_lock_path(runtime_dir), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _lock_until(fd: int, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            interrupts.raise_users(exc)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def server_command(directory: str, claim: str | None = None) -> list[str]:
    """The command line that runs the server of ``directory``.

    ``-S``: no ``site``. The server imports the standard library and overmind alone, and :func:`server_env` names
    overmind's folder on ``PYTHONPATH``; site's work (every ``.pth`` of the environment, an editable install's
    import finder, ``sitecustomize``) is start-up time (~35 ms of the ~0.1 s a first load waits for the server)
    and memory in a process that lives for hours. ``claim``: the key this process loads while the server starts,
    which the server holds for it (``server/handoff.py``)."""
    command = [sys.executable, "-S", "-m", "overmind.server", "--runtime-dir", directory]
    if claim is not None:
        command += ["--claim", claim, "--claim-pid", str(os.getpid())]
    return command


def server_env() -> dict[str, str]:
    """The server's environment: this one, with this overmind first on its path (the server must import
    the same overmind as this client, even one found via sys.path tweaks rather than installed into
    sys.executable's environment). A setting the client refused (and warned about) is left out, so the server
    uses its default as the client does, instead of failing to start on it. ``NOTIFY_SOCKET`` is left out too: a
    server started on demand is not the main process of the service its client may run in, and must not report
    that service ready (``server/daemon.py``'s ``_notify_ready``)."""
    from .. import _version
    from ..settings import clean_env

    env = clean_env(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(_version.__file__)))  # the folder holding overmind/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def interpreter_problem() -> str | None:
    """Why ``sys.executable`` cannot run the server, or None (a cheap look, no process started)."""
    exe = sys.executable
    if not exe:
        return ("sys.executable is empty (an embedded interpreter?): there is no Python to run the server "
                "with; start one yourself with 'overmind serve'")
    if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        why = "does not exist" if not os.path.exists(exe) else "is not an executable file"
        return f"{exe} (sys.executable) {why}; start the server with 'overmind serve' from a working Python"
    return None


def preflight(runtime_dir: str | None = None) -> list[str]:
    """What would stop ``ensure_server`` from starting a server in ``runtime_dir``, one sentence each (empty
    when nothing would). Creates the lock and log files, as a start would; starts nothing."""
    problems: list[str] = []
    directory = runtime.runtime_dir(runtime_dir)
    for path, flags in ((runtime.spawn_lock_path(directory), os.O_RDWR),
                        (runtime.server_lock_path(directory), os.O_RDONLY),
                        (runtime.log_path(directory), os.O_WRONLY | os.O_APPEND)):
        try:
            os.close(_open_private(path, flags))
        except ServerUnavailable as exc:
            problems.append(str(exc).removeprefix("overmind: "))
    return problems


def _open_private(path: str, flags: int) -> int:
    """Open (creating, mode 0600) a regular file of the runtime directory, or raise ``ServerUnavailable``."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        interrupts.raise_users(exc)
        if exc.errno in (errno.EISDIR, errno.ELOOP) or os.path.lexists(path) and not os.path.isfile(path):
            kind = "a directory" if os.path.isdir(path) and not os.path.islink(path) else "not a regular file"
            raise ServerUnavailable(f"overmind: {path} is {kind}; the launcher needs a plain file there. "
                                    f"Remove it ('rm -r {path}'), then load again.") from None
        raise ServerUnavailable(f"overmind: cannot create {path}: {exc.strerror}; the launcher writes its "
                                f"lock and log there. Make {os.path.dirname(path)} writable for you, or set "
                                f"{runtime.ENV_RUNTIME_DIR} to a writable directory of yours.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ServerUnavailable(f"overmind: {path} is not a regular file; remove it, then load again.")
    return fd


def _spawn(directory: str, claim: str | None = None) -> subprocess.Popen:
    problem = interpreter_problem()
    if problem:
        raise _unavailable(directory, problem)
    log_fd = _open_private(runtime.log_path(directory), os.O_WRONLY | os.O_APPEND)
    try:
        return subprocess.Popen(
            server_command(directory, claim), stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
            start_new_session=True, close_fds=True, env=server_env(), cwd="/",
        )
    except OSError as exc:
        interrupts.raise_users(exc)
        raise _unavailable(directory, f"cannot run {sys.executable} (sys.executable): {exc.strerror}; start "
                                      f"the server with 'overmind serve' from a working Python") from None
    finally:
        os.close(log_fd)


def _unavailable(directory: str, why: str) -> ServerUnavailable:
    log_file = runtime.log_path(directory)
    return ServerUnavailable(
        f"overmind: could not start the server for {directory}: {why}.\n"
        f"Last lines of {log_file}:\n{log_tail(log_file)}\n"
        f"Run 'overmind serve' in a terminal to see the error, or 'overmind doctor' to check the setup."
    )


def log_tail(path: str, lines: int = 20) -> str:
    """The last ``lines`` lines of ``path`` (indented), or a note that it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        interrupts.raise_users(exc)
        return f"  (cannot read the log: {exc.strerror})"
    tail = text.splitlines()[-lines:]
    return "\n".join("  " + line for line in tail) if tail else "  (the log is empty)"


def server_pids(runtime_dir: str) -> list[int]:
    """Pids of live ``overmind.server`` processes whose command line names exactly ``runtime_dir``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError as exc:
            interrupts.raise_users(exc)
            continue
        if b"overmind.server" in argv and os.fsencode(runtime_dir) in argv:
            pids.append(int(name))
    return pids
