"""``overmind run``: run a Python program in a process forked from a template, or else with plain python.

:func:`main` reads the program (``[--] script.py args``, ``-m module args``, ``-c code args``), finds or
starts the template for this interpreter, installed packages, preload list and environment, and sends it
the request with this process's stdin/stdout/stderr and working directory as descriptors. Once the child
says it started, this process only relays: it forwards the signals a terminal or supervisor sends
(SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH, SIGTSTP/SIGCONT, SIGUSR1/2, SIGALRM) to the child through a
pidfd, stops itself when the child is stopped by SIGTSTP, and when the template reports the child's end it
exits the same way: the same status, or killed by the same signal. If this process dies, the template kills
the child's process group.

Anything that goes wrong on Overmind's side before the child starts (no template, a template that refuses
to fork, a file next to the script that would shadow a preloaded module, a broken connection) ends in one
warning on stderr and ``os.execv`` of this same interpreter with the program's arguments: ``overmind run``
never fails where ``python`` would have worked. What plain ``python`` handles specially (no program: the
REPL; ``-`` or a directory or zip file as the script; interpreter options such as ``-i``) is exec'd at once.
"""
from __future__ import annotations

import _signal as signal  # signal's C half: the launcher sends and masks signals by number, with no enums (0.6 ms)
import os
import resource
import sys
import time

from ..errors import OvermindError

FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGWINCH", "SIGCONT", "SIGUSR1", "SIGUSR2", "SIGALRM")
ENV_DISABLE = "OVERMIND_RUN_DISABLE"
_mask_before_hold: set | None = None  # this thread's signal mask before hold_signals(), while they are held


class Fallback(OvermindError):
    """Run the program with plain python; the message (if any) is the one warning."""


def main(argv: list[str], runtime_dir: str | None = None) -> int:
    """The ``overmind run`` command. Exits the process (or execs) in every case but argument errors."""
    inherited = _inherited_signals()  # before anything changes them
    program = parse(argv)
    if program is None or os.environ.get(ENV_DISABLE) == "1":
        plain_exec(argv)
    try:
        conn, pidfd, pid = start(program, inherited, runtime_dir)
    except Fallback as exc:
        if str(exc):
            _warn(str(exc))
        plain_exec(argv)
    except Exception as exc:  # whatever else fails on Overmind's side
        _warn(f"{type(exc).__name__}: {exc}")
        plain_exec(argv)
    relay(conn, pidfd, pid)


def split_run(argv: list[str]) -> tuple[str | None, list[str]] | None:
    """``(runtime_dir, program args)`` when ``argv`` is a ``run`` command line, else None. ``run`` takes the
    rest of the line verbatim (its options are the program's), so argparse never sees it."""
    runtime_dir = None
    i = 0
    if argv[:1] and argv[0].startswith("--runtime-dir="):
        runtime_dir, i = argv[0].split("=", 1)[1], 1
    elif argv[:1] == ["--runtime-dir"] and len(argv) > 1:
        runtime_dir, i = argv[1], 2
    if argv[i:i + 1] == ["run"]:
        return runtime_dir, argv[i + 1:]
    return None


def parse(argv: list[str]) -> dict | None:
    """The program of ``argv`` (``run``'s arguments), or None when only plain python can run it."""
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        return None
    first = args[0]
    if first in ("-m", "-c"):
        if len(args) < 2:
            return None
        if first == "-m":
            return {"kind": "module", "module": args[1], "argv": ["-m", *args[2:]], "args": args}
        return {"kind": "code", "code": args[1], "argv": ["-c", *args[2:]], "args": args}
    if first.startswith("-"):
        return None  # an interpreter option (-i, -u, -X ...): python itself
    if first.endswith((".pyc", ".pyo")) or not os.path.isfile(first) or not os.access(first, os.R_OK):
        return None  # python reports a missing file; a directory or .pyc is python's to run
    import zipimport

    try:
        zipimport.zipimporter(first)
        return None  # a zip application
    except zipimport.ZipImportError:
        pass
    path = first if os.path.isabs(first) else os.path.join(os.getcwd(), first)  # as CPython: joined, not normalised
    return {"kind": "script", "path": path, "argv": args, "args": args}


def path0(program: dict) -> str | None:
    """What a fresh python puts first on ``sys.path`` for ``program`` (None with -P or -I)."""
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:  # safe_path (-P): Python 3.11+
        return None
    if program["kind"] == "script":
        return os.path.dirname(os.path.realpath(program["path"])) or "/"
    if program["kind"] == "module":
        return os.getcwd()
    return ""


def start(program: dict, inherited: dict, runtime_dir: str | None):
    """Find or start the template and have it fork the program; returns (connection, pidfd, pid).

    A template that refuses because a module it imported changed on disk has stopped serving: once, a new
    one is found or started instead."""
    try:
        return _start(program, inherited, runtime_dir)
    except Stale:
        release_signals()  # a template started now must not inherit the held mask
        return _start(program, inherited, runtime_dir)


class Stale(Fallback):
    """The template's imported code changed on disk; it stopped serving."""


def _start(program: dict, inherited: dict, runtime_dir: str | None):
    from ..ipc import protocol
    from . import envkey, preload, registry

    if sys.flags.inspect or sys.flags.interactive:
        raise Fallback("")
    first = path0(program)
    start_dir = os.path.dirname(program["path"]) if program["kind"] == "script" else os.getcwd()
    environ = dict(os.environ)
    entries = preload.resolve(start_dir, environ)
    base_id = envkey.key_id(envkey.base_key(entries))
    info, _why = registry.find(runtime_dir, base_id, environ)
    if info is None:
        timeout = registry.start_timeout()
        with registry.start_lock(runtime_dir, base_id, timeout):
            info, why = registry.find(runtime_dir, base_id, environ)
            if info is None:
                from ..ipc import runtime

                said = _say_starting(entries)
                started = time.monotonic()
                info = registry.spawn(runtime.runtime_dir(runtime_dir), entries, envkey.interpreter_options(),
                                      environ, timeout)
                if said:
                    _say(f"template ready in {time.monotonic() - started:.1f} s")
                if info.get("base") != base_id:
                    raise Fallback(f"the template started for this interpreter has another key than this process "
                                   f"({info.get('base')} vs {base_id}): its sys.path or packages differ")
                mismatch = envkey.environment_mismatch(info.get("environment", {}), environ)
                if mismatch:
                    raise Fallback(f"the template cannot serve this environment: {mismatch}")
    shadow = shadowing(first, info.get("top_level", ()))
    if shadow:
        raise Fallback(f"{shadow} would be imported instead of the module the template preloaded")
    conn = registry.connect(info)
    names, fds = [], []
    try:
        for fd, name in enumerate(("stdin", "stdout", "stderr")):
            if protocol.is_open(fd):
                names.append(name)
                fds.append(fd)
        for fd in inherited_descriptors():
            names.append(f"fd:{fd}")
            fds.append(fd)
        if len(fds) >= protocol.MAX_FDS_PER_FRAME:
            raise Fallback(f"the program inherits {len(fds)} open descriptors, more than one request can pass")
        cwd_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        names.append("cwd")
        fds.append(cwd_fd)
        try:
            # From here the program may run before this process relays: hold what relay_until_end forwards. (Not
            # earlier: a template this process starts would inherit the mask.)
            hold_signals()
            protocol.send_message(conn, request(program, first, inherited, names), fds)
        finally:
            os.close(cwd_fd)
        conn.settimeout(None)  # the child may take its time to start on a busy machine
        message, got = protocol.recv_message(conn)
    except (OSError, ValueError, protocol.ConnectionClosed) as exc:
        conn.close()
        raise Fallback(f"the template {info.get('pid')} did not start the program ({exc})") from None
    if message.get("ok") is not True or "started" not in message or not got:
        for fd in got:
            os.close(fd)
        conn.close()
        why = message.get("error") or f"unexpected answer {message}"
        if message.get("stale"):
            raise Stale(f"the template could not run the program: {why}")
        raise Fallback(f"the template could not run the program: {why}")
    return conn, got[0], int(message["started"])


def request(program: dict, first: str | None, inherited: dict, names: list[str]) -> dict:
    """The ``run`` request: everything of this process the child takes on."""
    from ..ipc import ops

    umask = os.umask(0)
    os.umask(umask)
    rlimits = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            try:
                rlimits[name] = list(resource.getrlimit(getattr(resource, name)))
            except (OSError, ValueError):
                pass
    interpreter = [sys.orig_argv[0] if sys.orig_argv else sys.executable, *_options()]
    return ops.request(
        "run", program={k: v for k, v in program.items() if k != "args"}, path0=first,
        orig_argv=interpreter + program["args"], env=dict(os.environ), fds=names, umask=umask,
        rlimits=rlimits, affinity=sorted(os.sched_getaffinity(0)),
        nice=os.getpriority(os.PRIO_PROCESS, 0), signals=inherited)


def shadowing(first: str | None, top_level) -> str | None:
    """A file in ``first`` (the program's sys.path[0]) named like a module the template imported, or None."""
    if first is None:
        return None
    folder = first or "."
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    wanted = set(top_level)
    for name in names:
        base, dot, ext = name.partition(".")
        if base not in wanted:
            continue
        full = os.path.join(folder, name)
        if (dot and ext.rsplit(".", 1)[-1] in ("py", "pyc", "so", "pyw")) or \
                (not dot and os.path.isfile(os.path.join(full, "__init__.py"))):
            return os.path.join(first, name)
    return None


def hold_signals() -> None:
    """Block the signals :func:`relay_until_end` forwards (and SIGTSTP) until its handlers are in place. The
    program may run, and a supervisor signal it, before this process can forward: held, such a signal reaches the
    program once the relay starts, instead of ending this process by its default action. The program's own mask
    is the caller's (``_inherited_signals``, read before); every path on is :func:`relay_until_end` or
    :func:`plain_exec` (or ``commands._run_plain``), which release them."""
    global _mask_before_hold
    if _mask_before_hold is None:
        _mask_before_hold = signal.pthread_sigmask(
            signal.SIG_BLOCK, [getattr(signal, name) for name in (*FORWARDED, "SIGTSTP")])


def release_signals() -> None:
    """Undo :func:`hold_signals`: what was held is delivered now, to whatever handles it by then."""
    global _mask_before_hold
    if _mask_before_hold is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_hold)
        _mask_before_hold = None


def relay(conn, pidfd: int, pid: int) -> None:
    """Forward signals to the child until the template reports its end; then end as it did."""
    status = relay_until_end(conn, pidfd, pid)
    if status is None:
        os._exit(1)
    exit_like(status)


def relay_until_end(conn, pidfd: int, pid: int) -> int | None:
    """Forward signals to the child until the template reports its end; its wait status, or None (after a
    warning, once the child ended) when the template died first and took the status with it."""
    from ..ipc import protocol

    continued = []

    def forward(signum, _frame):
        if signum == signal.SIGCONT:
            continued.append(True)
        try:
            signal.pidfd_send_signal(pidfd, signum)
        except OSError:
            pass

    def stop(signum, _frame):
        forward(signum, _frame)
        del continued[:]
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here until SIGCONT, which 'forward' passes on
        signal.signal(signal.SIGTSTP, stop)
        if not continued:
            # This process did not stop: the kernel drops SIGTSTP in an orphaned process group, so plain python
            # would not have stopped either; let the program go on too.
            forward(signal.SIGCONT, None)

    for name in FORWARDED:
        signal.signal(getattr(signal, name), forward)
    signal.signal(signal.SIGTSTP, stop)
    release_signals()  # what arrived since the program started is forwarded now
    try:
        message, fds = protocol.recv_message(conn)
        for fd in fds:
            os.close(fd)
        status = message.get("exit")
    except (OSError, ValueError, protocol.ConnectionClosed):
        status = None
    if status is None:
        _warn(f"the template died while the program (pid {pid}) ran, so its exit status is unknown; waiting "
              f"for it to end")
        import select

        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():
            pass
    return status


def exit_like(status: int) -> None:
    """Exit with the wait status ``status``: its exit code, or death by its signal."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    sig = -code
    for name in FORWARDED + ("SIGTSTP",):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    if sig in (signal.SIGQUIT, signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
        # the child dumped, if anyone
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def plain_exec(argv: list[str]) -> None:
    """Replace this process with ``python [its options] <argv>``, as the user would have run it."""
    release_signals()  # an exec keeps the mask: python starts with the caller's, and gets what was held
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.orig_argv[0] if sys.orig_argv else sys.executable, *_options(), *args])


def _options() -> list[str]:
    from .envkey import interpreter_options

    return interpreter_options()


def _inherited_signals() -> dict:
    """The signals ignored and blocked when this process started (from /proc/self/status); CPython ignores
    SIGPIPE and SIGXFSZ itself, so those two say nothing about the caller."""
    masks = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("SigIgn", "SigBlk"):
                    masks[key] = int(value.strip(), 16)
    except (OSError, ValueError):
        pass

    def signals(mask: int) -> list[int]:
        return [n for n in range(1, 65) if mask >> (n - 1) & 1]

    ignored = [n for n in signals(masks.get("SigIgn", 0)) if n not in (signal.SIGPIPE, signal.SIGXFSZ)]
    return {"ignored": ignored, "blocked": signals(masks.get("SigBlk", 0))}


def inherited_descriptors() -> list[int]:
    """Descriptors above 2 this process was given by its caller (``3>file``, systemd's LISTEN_FDS, a make
    jobserver): those without close-on-exec, since Python opens every descriptor of its own with it."""
    import fcntl

    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            if not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                found.append(fd)
        except OSError:
            continue  # the listing's own descriptor, closed by now
    return sorted(found)


def _say_starting(entries: list) -> bool:
    """On a terminal, say once that a template is being started, what it imports, and that it is a first run's
    cost (starting one takes seconds: torch, diffusers, transformers). Elsewhere (a pipe, a log) say nothing."""
    try:
        if not os.isatty(2):
            return False
    except OSError:
        return False
    from .preload import DEFAULT

    names = list(dict.fromkeys("torch and the adapters' libraries" if e == DEFAULT else e.partition(":")[0]
                               for e in entries))
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    _say(f"starting a template that imports {shown or 'nothing'} (once; later runs fork from it in a fraction "
         f"of a second) ...")
    return True


def _say(message: str) -> None:
    """One line on stderr, as ``overmind run``'s own; a stderr that cannot take it is left as it is."""
    try:
        sys.stderr.write(f"overmind run: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _warn(message: str) -> None:
    _say(f"{message}; running the program with plain python instead")
