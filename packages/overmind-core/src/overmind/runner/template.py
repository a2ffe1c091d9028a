"""The template process: import the heavy libraries once, then fork a fresh process for every ``run``.

Started detached by :func:`overmind.runner.registry.spawn` (``python -c 'import overmind.runner.template as
t; t.main()' --runtime-dir D --preload JSON --ready-fd N``). It imports ``overmind`` and calls
``overmind.activate()``, imports the preload list with the script's folder off ``sys.path``, freezes the
garbage collector's view of everything imported (``gc.freeze()``: a child's collections then never walk,
and never copy, the libraries' heap), writes its info file, binds its socket and tells its starter. Before the
freeze, and again whenever it has been quiet a moment, it rebuilds the objects of the entries its children use
most, which a child's hit then takes ready-made (:mod:`overmind.runner.prebuild`).

It imports only. It never initialises CUDA and never runs a thread: before every fork it counts
``/proc/self/task`` and refuses, saying which threads there are, if there is more than one (a fork copies
only the forking thread, so a lock another thread held stays locked forever in the child). OpenBLAS starts
its worker threads when numpy loads it, so the template runs with ``OPENBLAS_NUM_THREADS=1`` (numpy may load as a
library is preloaded or as an object built ahead imports its model's module) and each child sets the thread count
a fresh process would have had (:mod:`overmind.runner.threads`).

A ``run`` is handed to the spare, a child forked ahead of the request (:mod:`overmind.runner.spare`), or where
there is none, to a child forked on the request. The loop is one thread with a selector: the listening socket,
each connection waiting for its request, the spare's pidfd (readable if it dies), and for each running child its
pidfd (readable when the child exits: the status goes to its ``run``) and
its connection (closed when ``run`` died: the child's process group gets SIGKILL). SIGTERM (``overmind
stop``) stops accepting; the template exits once its children have. It exits by itself after
``OVERMIND_TEMPLATE_IDLE`` seconds (default 3600) without a run, when its socket or runtime directory goes
away, and it stops serving once a module it imported changes on disk (:mod:`overmind.runner.sources`).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

from .._util import process_state
from ..ipc import ops
from ..ipc.protocol import close_fds
from .fork_safety import fork_problem

if TYPE_CHECKING:
    from .spare import Spare

ENV_IDLE = "OVERMIND_TEMPLATE_IDLE"
DEFAULT_IDLE_S = 3600.0
_TICK_S = 2.0
_QUIET_S = 1.0  # a template builds objects ahead only after this long without a request or a child's end
_SPARE_PAUSE_S = 10.0  # after a spare died by itself, the next is forked no sooner than this
# While a program runs, the next spare waits this long after the handover (or until no program runs): its fork and
# warm-up would take a core from the program as it starts
_SPARE_AFTER_S = 1.0


class Job:
    """What a forked child takes from the template: its connection, the request and the descriptors;
    ``from_spare``: the child was the spare (spare.py), which closed the template's descriptors and took its own
    state before the request."""

    def __init__(self, conn: socket.socket, request: dict, fds: list[int], template: Template,
                 from_spare: bool = False) -> None:
        self.conn, self.request, self.fds, self.template = conn, request, fds, template
        self.from_spare = from_spare


class Template:
    def __init__(self, runtime_dir: str, preload: list[str]) -> None:
        from . import envkey, registry

        self.runtime_dir = runtime_dir
        self.preload_spec = preload
        self.directory = registry.templates_dir(runtime_dir)
        self.started = time.time()
        environ = dict(os.environ)
        self.native = envkey.native_environment(environ)
        self.base = envkey.base_key(preload)
        self.base_id = envkey.key_id(self.base)
        self.sel = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
        self.spare: Spare | None = None  # the child forked ahead for the next run (spare.py)
        self.no_spare_until = 0.0  # after a spare died by itself: no other for a while
        self.handed_at = 0.0  # when the last spare took a run
        self.generation = 0  # bumped whenever the objects built ahead change (page_copies.py)
        self.stopping = False
        self.last_active = time.monotonic()
        self.idle_s = _idle_seconds()

    # ---- start-up ----------------------------------------------------------------------------------------
    def prepare(self) -> dict:
        """Import everything, bind, write the info file; returns the info."""
        from . import envkey, preload, registry

        if not any(k in os.environ for k in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS")):
            os.environ["OPENBLAS_NUM_THREADS"] = "1"  # for the template's life: its children set their own
        # '' (python -c): the template's cwd, not a library; with -P or -I there is no such entry
        first = sys.path.pop(0) if sys.path and envkey.has_path0() else None
        try:
            with envkey.EnvRecorder() as recorder:
                from .. import activation

                adapters = activation.activate()
                entries = preload.expand(self.preload_spec)
                done, failed, seconds = preload.import_all(entries)
        finally:
            if first is not None:
                sys.path.insert(0, first)
        from ..adapter import version_of
        from ..client import launcher  # noqa: F401  (a child's first load asks it whether a server runs)
        from ..keys import code_identity
        from .prebuild import Builder
        from .sources import SourceWatch
        from .threads import find_setters

        find_setters()
        self.sources = SourceWatch()  # after the imports: watches the files of every module imported
        self.sel.register(self.sources, selectors.EVENT_READ, ("sources", None))
        for dist in code_identity.read_imported():  # what a load's key asks of the installed distributions, once
            version_of(dist)
        self.builder = Builder(self.runtime_dir)
        self._build_ahead()  # before the freeze below: the children never walk these objects either
        recorded = {k: v for k, v in recorder.read.items() if k not in ("OPENBLAS_NUM_THREADS",)}
        recorded.update(self.builder.environment)  # what the objects built ahead read (prebuild.py)
        environment = {"read": recorded, "native": self.native}
        env_id = envkey.key_id(environment)[:8]
        self.id = f"{self.base_id}-{env_id}"
        self.socket_path = os.path.join(self.directory, self.id + ".sock")
        self.info_path = os.path.join(self.directory, self.id + ".json")
        self._settle()  # before the first fork
        self.info = {
            "id": self.id, "base": self.base_id, "pid": os.getpid(), "socket": self.socket_path,
            "started": self.started, "ready_s": time.time() - self.started, "import_s": seconds,
            "preload": self.preload_spec, "preloaded": done, "failed": failed, "adapters": adapters,
            "environment": environment, "key": self.base, "threads": thread_count(),
            "python": sys.executable, "top_level": top_level_modules(),
        }
        existing = registry.read_info(self.info_path)
        if existing is not None and process_state.alive(existing.get("pid")) and _accepts(self.socket_path):
            return existing  # an identical template won a race; this one leaves
        from . import page_copies

        page_copies.forget(self.directory, self.id)  # a dead template's records name pages of its own
        self._bind()
        registry.write_info(self.info_path, self.info)
        return self.info

    def _bind(self) -> None:
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            listener.bind(self.socket_path)
        finally:
            os.umask(old)
        listener.listen(128)
        listener.setblocking(False)
        self.socket_identity = _identity(self.socket_path)
        self.listener = listener
        self.sel.register(listener, selectors.EVENT_READ, ("listener", None))

    # ---- serving -----------------------------------------------------------------------------------------
    def serve(self) -> Job | None:
        """Serve until stopped (returns None) or, in a forked child, return that child's :class:`Job`."""
        signal.signal(signal.SIGTERM, lambda *_: self._stop("SIGTERM"))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        next_tick = time.monotonic() + _TICK_S
        while not (self.stopping and not self.children):
            timeout = _TICK_S
            if self.spare is None:
                wait = 0.0 if not self.children else self.handed_at + _SPARE_AFTER_S - time.monotonic()
                if wait <= 0:
                    job = self._fork_spare()
                    if job is not None:
                        return job
                else:
                    timeout = min(timeout, wait)
            for key, _mask in self.sel.select(timeout=timeout):
                kind, data = key.data
                if kind == "listener":
                    self._accept()
                elif kind == "request":
                    job = self._request(key.fileobj)
                    if job is not None:
                        return job
                elif kind == "child":
                    self._child_exited(data)
                elif kind == "client":
                    self._client_event(key.fileobj, data)
                elif kind == "sources":
                    self._check_sources()
                elif kind == "spare":
                    self._spare_died()
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + _TICK_S
                self._tick()
        return None

    def _accept(self) -> None:
        from ..ipc.peer import peer_credentials

        while self.listener is not None:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                _pid, uid, _gid = peer_credentials(conn)
            except OSError:
                conn.close()
                continue
            if uid != os.getuid():
                conn.close()  # another user: not a byte read or sent
                continue
            conn.setblocking(False)
            self.sel.register(conn, selectors.EVENT_READ, ("request", None))

    def _request(self, conn: socket.socket) -> Job | None:
        """Read one request from ``conn`` and serve it (``ipc/ops.py``: the ops a template serves);
        in a forked child, that child's :class:`Job`."""
        from ..ipc import protocol

        self.sel.unregister(conn)
        self.last_active = time.monotonic()
        conn.settimeout(10.0)
        try:
            request, fds = protocol.recv_message(conn)
        except (OSError, ValueError, protocol.ConnectionClosed):
            conn.close()
            return None
        try:
            op = ops.check(request, ops.TEMPLATE)
        except ops.RequestError as exc:
            self._reply_and_close(conn, ops.error(str(exc)), fds)
            return None
        if op.fds_in is None:
            close_fds(fds)
            fds = []
        return _HANDLERS[op.name](self, conn, request, fds)

    # ---- ops (ipc/ops.py): each takes the connection, the request and its fds; a run's child
    # returns its Job
    def _op_info(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        self._reply_and_close(conn, ops.ok(info=self.info), fds)

    def _op_run(self, conn: socket.socket, request: dict, fds: list[int]) -> Job | None:
        if self.stopping:
            self._reply_and_close(conn, ops.error("the template is stopping"), fds)
            return None
        stale = self._check_sources()
        if stale:
            self._reply_and_close(conn, ops.error(stale, stale=True), fds)
            return None
        if self.spare is not None and self._hand_to_spare(conn, request, fds):
            return None
        problem = fork_problem()
        if problem:
            self._reply_and_close(conn, ops.error(f"template pid {os.getpid()} {problem}"), fds)
            return None
        try:
            pid = os.fork()
        except OSError as exc:
            why = f"template pid {os.getpid()} cannot fork: {exc.strerror}"
            self._reply_and_close(conn, ops.error(why), fds)
            return None
        if pid == 0:
            return Job(conn, request, fds, self)
        close_fds(fds)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
        if pidfd is None:  # cannot happen on Linux >= 5.3; never leave a child unwatched
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            conn.close()
            return None
        self._watch(pid, pidfd, conn)
        return None

    def _watch(self, pid: int, pidfd: int, conn: socket.socket) -> None:
        """Follow a child that runs a program: its exit (the pidfd) and its ``run`` (the connection)."""
        self.children[pidfd] = (pid, conn)
        self.sel.register(pidfd, selectors.EVENT_READ, ("child", pidfd))
        conn.setblocking(False)
        self.sel.register(conn, selectors.EVENT_READ, ("client", pidfd))

    # ---- the spare (spare.py) ----------------------------------------------------------------------------
    def _fork_spare(self) -> Job | None:
        """Fork the next spare, unless this template cannot or should not; in the spare, its :class:`Job` once a
        request arrives."""
        from . import spare

        if self.stopping or self.listener is None or time.monotonic() < self.no_spare_until or fork_problem():
            return None
        ours, theirs = spare.pair()
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return None
        if pid == 0:
            ours.close()
            conn, request, fds = spare.wait_for_job(self, theirs)
            return Job(conn, request, fds, self, from_spare=True)
        theirs.close()
        try:
            self.spare = spare.Spare(pid, ours)
        except OSError:  # no pidfd (Linux < 5.3): never leave a child unwatched
            ours.close()
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self.no_spare_until = float("inf")
            return None
        self.sel.register(self.spare.pidfd, selectors.EVENT_READ, ("spare", None))
        return None

    def _hand_to_spare(self, conn: socket.socket, request: dict, fds: list[int]) -> bool:
        """Give a ``run`` to the spare, which becomes its child; False (the spare retired) if it is gone."""
        spare, self.spare = self.spare, None
        self.sel.unregister(spare.pidfd)
        try:
            spare.hand_over(conn, request, fds)
        except OSError:
            spare.retire()
            return False
        for fd in fds:
            os.close(fd)
        self._watch(spare.pid, spare.pidfd, conn)
        self.handed_at = time.monotonic()
        return True

    def pages_path(self) -> str:
        """Where this generation's first program records the pages its loads copied (page_copies.py)."""
        return os.path.join(self.directory, f"{self.id}.{self.generation}.pages")

    def _new_generation(self) -> None:
        """The objects built ahead changed: the pages programs copy are other pages now."""
        from . import page_copies

        self.generation += 1
        if getattr(self, "id", None) is not None:
            page_copies.forget(self.directory, self.id)

    def _retire_spare(self) -> None:
        if self.spare is not None:
            spare, self.spare = self.spare, None
            self.sel.unregister(spare.pidfd)
            spare.retire()

    def _spare_died(self) -> None:
        """The spare ended by itself (killed from outside, or it failed): reaped; the next one in a while."""
        self._retire_spare()  # the kill finds it gone; the reap collects its status
        self.no_spare_until = time.monotonic() + _SPARE_PAUSE_S

    def _build_ahead(self) -> bool:
        """Bring the objects built ahead for the children in line with the server's entries (prebuild.py); whether
        anything changed."""
        changes = self.builder.refresh()
        built = any(not change.startswith("left out") for change in changes)
        if built:
            self._retire_spare()  # it holds the objects as they were: the next spare is forked with these
            self._new_generation()
        if any(change.startswith("dropped") for change in changes):
            # what was dropped may hold reference cycles, which a frozen collector never frees: one full
            # collection (the caller freezes again)
            gc.unfreeze()
            gc.collect()
        if built:  # what the rebuilds imported is watched, and shadowing checked, like the preloaded modules
            self.sources.watch_imported()
            if getattr(self, "info", None) is not None and self.info.get("pid") == os.getpid():
                from . import registry

                self.info["top_level"] = top_level_modules()
                self.info["environment"]["read"].update(self.builder.environment)
                registry.write_info(self.info_path, self.info)
        for change in changes:
            print(f"overmind template {os.getpid()}: objects built ahead: {change}", file=sys.stderr, flush=True)
        return built

    def _settle(self) -> None:
        """Ready the template's memory for the children forked from it: everything imported and built so far out of
        the collector's sight (``gc.freeze()``: a child's collections never walk it), and its dense private memory
        in huge pages (huge_pages.py: every child's fork and exit take down fewer page-table entries)."""
        from . import huge_pages

        gc.collect()
        gc.freeze()
        huge_pages.collapse()

    def _check_sources(self) -> str | None:
        """Why this template must not serve any more (a module it imported changed on disk), or None."""
        changed = self.sources.changed()
        if changed is None:
            return None
        why = f"{changed} changed on disk after template pid {os.getpid()} imported it"
        self._stop(why)
        return why

    def _reply_and_close(self, conn: socket.socket, message: dict, fds: list[int]) -> None:
        from ..ipc import protocol

        close_fds(fds)
        try:
            protocol.send_message(conn, message)
        except OSError:
            pass
        conn.close()

    def _child_exited(self, pidfd: int) -> None:
        from ..ipc import protocol

        pid, conn = self.children.pop(pidfd)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = None
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        try:
            conn.setblocking(True)
            conn.settimeout(5.0)
            protocol.send_message(conn, ops.ok(exit=status))  # the run's second reply
        except OSError:
            pass
        conn.close()
        self.last_active = time.monotonic()

    def _client_event(self, conn: socket.socket, pidfd: int) -> None:
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            return  # a client says nothing after its request; ignore it
        # The run command is gone (killed): its program goes with it, and so does the program's process group.
        pid, _ = self.children[pidfd]
        self.sel.unregister(conn)
        for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: signal.pidfd_send_signal(pidfd, signal.SIGKILL)):
            try:
                kill()
            except OSError:
                pass

    def _tick(self) -> None:
        from ..ipc import runtime

        if not self.children and not self.stopping and time.monotonic() - self.last_active > self.idle_s:
            self._stop(f"idle for {self.idle_s:g} s")
        if not self.stopping and time.monotonic() - self.last_active >= _QUIET_S and self._build_ahead():
            self._settle()  # what was built anew (the next spare is forked after this)
        try:
            runtime.check_runtime_dir(self.directory)
            gone = _identity(self.socket_path) != self.socket_identity
        except Exception:
            gone = True
        if gone and not self.stopping:
            self._stop(f"its socket {self.socket_path} was removed or replaced")

    def _stop(self, why: str) -> None:
        if self.stopping:
            return
        print(f"overmind template {os.getpid()}: stopping: {why}", file=sys.stderr, flush=True)
        self.stopping = True
        self._retire_spare()
        self._close_listener()

    def _close_listener(self) -> None:
        if self.listener is None:
            return
        try:
            self.sel.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()
        self.listener = None
        if _identity(self.socket_path) == getattr(self, "socket_identity", None):
            for path in (self.socket_path, self.info_path):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            from . import page_copies

            page_copies.forget(self.directory, self.id)

    def shutdown(self) -> None:
        self._retire_spare()
        self._close_listener()

    def close_in_child(self, keep: socket.socket) -> None:
        """In a forked child: close everything of the template's but the child's own connection."""
        for key in list(self.sel.get_map().values()):
            obj = key.fileobj
            if obj is keep:
                continue
            if isinstance(obj, int):
                os.close(obj)
            else:
                obj.close()
        self.sel.close()
        if self.listener is not None:
            self.listener.close()  # not unlink: the template still serves there
        for _pid, conn in self.children.values():
            conn.close()


_HANDLERS = ops.handlers(Template, ops.TEMPLATE)


def top_level_modules() -> list[str]:
    """Top-level modules imported from files (a same-named file next to a script would shadow them)."""
    names = set()
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if "." in name or spec is None or spec.origin in (None, "built-in", "frozen"):
            continue
        names.add(name)
    return sorted(names)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def _accepts(path: str) -> bool:
    from ..client.launcher import accepts

    return accepts(path)


def _identity(path: str):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _idle_seconds() -> float:
    try:
        value = float(os.environ.get(ENV_IDLE) or DEFAULT_IDLE_S)
    except ValueError:
        value = DEFAULT_IDLE_S
    return value if value > 0 else DEFAULT_IDLE_S


def main(argv: list[str] | None = None) -> None:
    """The template's entry point; in a forked child it becomes the user's program and never returns."""
    parser = argparse.ArgumentParser(prog="overmind template")
    parser.add_argument("--runtime-dir", required=True)
    parser.add_argument("--preload", required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--room", default="")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    ready = os.fdopen(args.ready_fd, "w")
    try:
        template = Template(args.runtime_dir, json.loads(args.preload))
        info = template.prepare()
    except BaseException as exc:
        ready.write(f"failed the template could not start: {type(exc).__name__}: {exc}\n")
        ready.close()
        raise
    ready.write("ready " + json.dumps(info) + "\n")
    ready.close()
    if info.get("pid") != os.getpid():
        return  # another template of the same key and environment serves
    print(f"overmind template {os.getpid()}: serving {template.socket_path} ({len(info['preloaded'])} preloaded "
          f"in {info['import_s']:.1f} s; failed: {info['failed'] or 'none'})", file=sys.stderr, flush=True)
    from .child import run_job  # imported here, once, rather than in every child

    job = template.serve()
    if job is None:
        template.shutdown()
        return
    run_job(job)  # raises SystemExit (or ends the process) with the program's status
