"""In a child forked from the template: become the caller's process, then run the caller's program.

:func:`become` makes the process look, to the program and to tools, like the ``python`` the user would
have started: the caller's stdin/stdout/stderr (the descriptors themselves, so a terminal stays a
terminal), working directory, environment (``os.environ`` and the C library's), umask, resource limits,
CPU affinity, niceness, signal dispositions and mask, command line (``/proc/<pid>/cmdline``, ``ps``),
``sys.argv``/``sys.orig_argv``/``sys.path``, a fresh ``__main__``, new ``sys.std*`` streams made as the
interpreter makes them, OpenBLAS's thread count and fresh random state (``random``, numpy's global
generator, torch's default generators). Then it tells ``run`` its pid (with a pidfd, so signals can never
reach a recycled pid) and closes the connection: from here on, the process is the user's.

:func:`execute` runs the program as ``python`` does (the script in ``__main__``; ``-m`` through
``runpy._run_module_as_main``; ``-c`` as ``<string>``), and ends it as ``python`` does (:func:`finish`):
``SystemExit``'s code, an uncaught exception printed by ``sys.excepthook`` (without this module's frames)
and status 1, an uncaught ``KeyboardInterrupt`` printed and then death by SIGINT, so the shell sees 130.
"""
from __future__ import annotations

import atexit
import builtins
import ctypes
import importlib
import importlib.machinery
import io
import os
import resource
import signal
import sys
import time
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
_UNTOUCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def run_job(job) -> None:
    """Everything the child does; never returns."""
    from ..ipc import ops, protocol

    conn = job.conn
    try:
        os.setpgid(0, 0)  # its own process group in the template's session: job control works, and
        # 'run' dying kills the group
        if not job.from_spare:
            job.template.close_in_child(keep=conn)
        conn.setblocking(True)
        conn = _above(conn, _targets(job.request["fds"]))
        program = become(job.request, job.fds, take_own_state=not job.from_spare)
        pidfd = os.pidfd_open(os.getpid())
        protocol.send_message(conn, ops.ok(started=os.getpid()), [pidfd])  # the run's first reply
        os.close(pidfd)
        conn.close()
    except BaseException as exc:
        try:
            protocol.send_message(conn, ops.error(f"{type(exc).__name__}: {exc}"))
        except BaseException:
            pass
        os._exit(70)
    from . import page_copies

    page_copies.arm(job.template.pages_path())  # the generation's first program records its page copies at its end
    execute(program)


def become(request: dict, fds: list[int], take_own_state: bool = True) -> dict:
    """Take on the caller's process state from ``request`` and the descriptors ``fds``; ``take_own_state=False``:
    the spare this process was did :func:`own_state` already."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # nothing of the template's may reach the program's output
        except Exception:
            pass
    _place_descriptors(request["fds"], fds)
    os.umask(request["umask"])
    for name, (soft, hard) in request["rlimits"].items():
        which = getattr(resource, name, None)
        if which is not None and resource.getrlimit(which) != (soft, hard):
            resource.setrlimit(which, (soft, hard))
    if request.get("affinity"):
        os.sched_setaffinity(0, request["affinity"])
    if "nice" in request:
        os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
    environ = request["env"]
    os.environ.clear()
    os.environ.update(environ)
    time.tzset()
    _signals(request["signals"])
    set_cmdline(request["orig_argv"])
    program = request["program"]
    sys.orig_argv = list(request["orig_argv"])
    sys.argv = list(program["argv"])
    from .envkey import path_tail

    sys.path[:] = ([request["path0"]] if request["path0"] is not None else []) + path_tail()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    main.__dict__["__annotations__"] = {}
    sys.modules["__main__"] = main
    _stdio()
    from .threads import restore_openblas

    restore_openblas(environ)
    if take_own_state:
        own_state()
    _warnings_again()
    return program


def own_state() -> None:
    """What makes a forked child a process of its own, whoever its caller will be: fresh random state, the
    template's finalizers left to the template, and the collector's view of everything so far frozen (the
    program's collections, and its exit's, walk only what the program makes)."""
    import gc

    from .._util import heap_aside

    _reseed()
    _template_finalizers_stay()
    gc.collect()
    gc.freeze()
    heap_aside.leave_alone()  # the program's loads leave the frozen heap as it is, without walking it


def _targets(names: list[str]) -> list[int]:
    """The descriptor numbers the program gets: 0-2 and the caller's other inherited ones (``fd:N``)."""
    return [0, 1, 2] + [int(n[3:]) for n in names if n.startswith("fd:")]


def _above(conn, targets: list[int]):
    """``conn`` moved above every number the program will own, so placing them cannot close it."""
    import fcntl
    import socket

    high = fcntl.fcntl(conn.fileno(), fcntl.F_DUPFD_CLOEXEC, max(targets) + 1)
    conn.close()
    return socket.socket(fileno=high)


def _place_descriptors(names: list[str], fds: list[int]) -> None:
    """dup2 the caller's stdio onto 0, 1, 2 (closing those the caller had closed) and its other inherited
    descriptors onto their numbers, and chdir to its cwd."""
    import fcntl

    from ..ipc import protocol

    targets = _targets(names)
    floor = max(targets) + 1
    moved = []
    for fd in fds:  # first above every target, so that no placement closes a descriptor still to be placed
        moved.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor))
        os.close(fd)
    received = dict(zip(names, moved))
    for name in names:
        if name.startswith("fd:") and protocol.is_open(int(name[3:])):
            raise RuntimeError(f"the template holds descriptor {name[3:]}, which the program inherits from the "
                               f"caller")
    for target, name in enumerate(("stdin", "stdout", "stderr")):
        fd = received.get(name)
        if fd is None:
            try:
                os.close(target)
            except OSError:
                pass
        else:
            os.dup2(fd, target)
    for name, fd in received.items():
        if name.startswith("fd:"):
            os.dup2(fd, int(name[3:]))
    if "cwd" in received:
        os.fchdir(received["cwd"])
    for fd in received.values():
        os.close(fd)


def _signals(caller: dict) -> None:
    """The dispositions a fresh interpreter started by the caller would have, and the caller's mask."""
    ignored = set(caller.get("ignored", ()))
    for sig in signal.valid_signals():
        if sig in _UNTOUCHABLE or not 0 < sig < signal.SIGRTMIN:
            continue
        current = signal.getsignal(sig)
        if sig in ignored or sig in (signal.SIGPIPE, signal.SIGXFSZ):  # CPython ignores these two itself
            want = signal.SIG_IGN
        elif sig == signal.SIGINT:
            want = signal.default_int_handler
        elif current is None:
            continue  # a C-level handler (faulthandler's): the fresh process installs the same
        else:
            want = signal.SIG_DFL
        if current is not want:
            signal.signal(sig, want)
    signal.pthread_sigmask(signal.SIG_SETMASK, caller.get("blocked", ()))


def set_cmdline(argv: list[str]) -> None:
    """Write ``argv`` over this process's command line (what ``ps`` and ``/proc/<pid>/cmdline`` show).

    The template was started with room to spare (``--room``); a longer command line is cut there."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49 of stat(5))
    except (OSError, IndexError, ValueError):
        return
    size = end - start
    data = b"\0".join(os.fsencode(a) for a in argv) + b"\0"
    data = data[:size - 1] + b"\0" if len(data) > size else data
    data = data + b"\0" * (size - len(data))
    ctypes.memmove(start, data, size)


def _stdio() -> None:
    """New ``sys.stdin/stdout/stderr`` for fds 0-2, made the way the interpreter makes them at start-up
    (encoding, errors and buffering from this interpreter's settings, line buffering where a terminal is)."""
    old = {"stdin": sys.__stdin__ or sys.stdin, "stdout": sys.__stdout__ or sys.stdout,
           "stderr": sys.__stderr__ or sys.stderr}
    unbuffered = bool(getattr(old["stdout"], "write_through", False))
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        like = old[name]
        stream = None
        try:
            os.fstat(fd)
        except OSError:
            pass  # closed in the caller: like python, sys.<name> is None
        else:
            write = fd != 0
            raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)
            raw.name = f"<{name}>"
            buffered = not (unbuffered and write)
            buf = (io.BufferedWriter(raw) if write else io.BufferedReader(raw)) if buffered else raw
            line_buffering = buffered and (raw.isatty() or fd == 2)
            stream = io.TextIOWrapper(buf, encoding=getattr(like, "encoding", None),
                                      errors=getattr(like, "errors", None), newline="\n",
                                      line_buffering=line_buffering, write_through=not buffered)
            stream.mode = "w" if write else "r"
            if write and like is not None and hasattr(like, "reconfigure"):
                try:  # a library may hold the template's stream (a logging handler): it writes to the same fd
                    like.reconfigure(line_buffering=line_buffering, write_through=not buffered)
                except Exception:
                    pass
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reseed() -> None:
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:
            pass
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "seed"):
        from ..loading.draws import seeding

        seeding.seeded_from_os()  # as torch's import seeds it in a fresh process: the program has not seeded


def _template_finalizers_stay() -> None:
    """The template's ``weakref.finalize`` callbacks do not run at this process's exit.

    They belong to what the template created while importing (torch registers 300, deregistering operator
    libraries, 70 ms of copy-on-write faults at every exit): state that dies with this process anyway, or
    resources the template still owns (a temporary directory a library made at import), which a child must
    not remove from under the template and its other children. Finalizers the program registers run."""
    import weakref

    for info in list(weakref.finalize._registry.values()):
        info.atexit = False


def _warnings_again() -> None:
    """Warnings the template's imports already showed once are shown again in the program."""
    warnings = sys.modules.get("warnings")
    if warnings is not None and hasattr(warnings, "_filters_mutated"):
        warnings._filters_mutated()


def execute(program: dict) -> None:
    """Run the program in ``__main__`` and end the process as the interpreter would."""
    main = sys.modules["__main__"]
    before = NewModules()
    try:
        kind = program["kind"]
        if kind == "script":
            path = program["path"]
            main.__file__ = path
            main.__cached__ = None
            main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
            with open(path, "rb") as f:
                source = f.read()
            code = compile(source, path, "exec", dont_inherit=True)
            exec(code, main.__dict__)
        elif kind == "module":
            import runpy

            runpy._run_module_as_main(program["module"], alter_argv=True)
        else:
            main.__loader__ = importlib.machinery.BuiltinImporter
            code = compile(program["code"], "<string>", "exec", dont_inherit=True)
            exec(code, main.__dict__)
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        _print_uncaught(exc)
        del exc
        if interrupted:  # CPython ends an uncaught Ctrl-C by SIGINT, so the shell sees 130
            finish(before, 130, by_signal=signal.SIGINT)
        status = 1
    else:
        status = 0
    finish(before, status)


def _exit_status(exc: SystemExit) -> int:
    """The exit status CPython derives from ``SystemExit`` (printing a non-integer code, as it does)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except BaseException:
        pass
    return 1


def _print_uncaught(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and os.path.dirname(os.path.abspath(tb.tb_frame.f_code.co_filename)) == _HERE:
        tb = tb.tb_next
    exc.__traceback__ = tb  # the interpreter's excepthook prints the exception's own traceback
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException:
        pass


class NewModules:
    """Marks ``sys.modules`` now, to find later the modules imported since without walking the template's: a walk
    over thousands of modules touches each one's reference count, a copy-on-write page fault apiece (~8 ms).
    ``sys.modules`` keeps insertion order, so what the program imports comes after the mark."""

    def __init__(self) -> None:
        self.last = next(reversed(sys.modules), None)  # the name imported last before the program

    def since(self) -> list:
        """The modules imported after the mark, newest first; none when the program removed the marked name (which
        ones are its own is then unknown)."""
        if self.last is not None and self.last not in sys.modules:
            return []
        found = []
        for name in reversed(sys.modules):
            if name is self.last or name == self.last:
                break
            module = sys.modules.get(name)
            if module is not None:  # (None: an import blocked on purpose)
                found.append(module)
        return found


def finish(before: NewModules, status: int, by_signal: int | None = None) -> None:
    """End the process as ``Py_FinalizeEx`` would, minus tearing down the template's modules.

    Joins non-daemon threads, runs the atexit callbacks, frees the program's own objects (``__main__`` and
    the modules it imported, newest first: their ``__del__`` runs and their open files are flushed), flushes
    the std streams, then ``_exit``. The preloaded libraries are not torn down: their pages are shared with
    the template, and freeing them would copy every page of their heap (seconds) for nothing. First, the
    generation's first program that took objects built ahead records the pages it copied (``page_copies.py``), before
    the end's own writes.
    """
    from . import page_copies

    page_copies.record_at_end()
    try:
        import threading

        threading._shutdown()
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    try:
        mine = [m for m in before.since() if m.__name__ != "__main__"]
        main = sys.modules.get("__main__")
        for module in ([main] if main is not None else []) + mine:
            module.__dict__.clear()
        del mine, main
        import gc

        gc.collect()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass
    if by_signal is not None:
        signal.signal(by_signal, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [by_signal])
        os.kill(os.getpid(), by_signal)
    os._exit(status)
