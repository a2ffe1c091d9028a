"""The ``overmind`` command's parts about templates: ``run``, and what ``status``, ``stop`` and ``serve``
add (``cli/main.py`` registers these).

    $ overmind run train.py --epochs 3        # also: overmind run -m pkg.tool, overmind run -c CODE
    $ overmind status
    ...
    template  pid 5120, up 12m 03s, 9 preloaded (torch, diffusers, ...), python /venv/bin/python

``overmind run --json PROGRAM`` runs the program the same way and, once it ended, writes one line of JSON on
stderr (stdout stays the program's), :func:`run_report`, before exiting as the program did:

    {"exit_code": 0, "fallback": null, "pid": 5133, "signal": null, "start_s": 0.21, "via": "template",
     "wall_s": 3.02}
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from .._util import quiet_threads

ENV_SERVE_TEMPLATE = "OVERMIND_SERVE_TEMPLATE"


def add_parser(sub) -> None:
    """The ``run`` entry of ``overmind --help`` (the command itself is dispatched by
    :func:`overmind.runner.client.split_run`)."""
    run = sub.add_parser("run", help="run a Python program in a process forked from a template that has "
                                     "already imported torch and the model libraries",
                         description="overmind run [--json] [python options] [--] script.py [args] | -m module "
                                     "[args] | -c code [args]: as python would run it (python's options, such as "
                                     "-X importtime or -u, go before the script), in a process forked from a "
                                     "template that has already imported the libraries; plain python where no "
                                     "template can serve, with one warning")
    run.add_argument("--json", action="store_true", help="once the program ended, write its exit status, pid, "
                     "timings and whether a template ran it as one JSON line on stderr (only right after 'run')")
    run.add_argument("program", nargs=argparse.REMAINDER)
    run.set_defaults(func=lambda args: cmd_run(args.runtime_dir, (["--json"] if args.json else []) + args.program))


def cmd_run(runtime_dir: str | None, argv: list[str]) -> int:
    """``overmind run [--json] PROGRAM``: ``--json`` counts only as the first word (after it, every word is the
    program's)."""
    if argv[:1] == ["--json"]:
        return run_reporting(runtime_dir, argv[1:])
    from .client import main

    return main(argv, runtime_dir)  # exits (or execs): it returns only on an argument error


def run_reporting(runtime_dir: str | None, argv: list[str]) -> int:
    """``overmind run --json``: as ``overmind run`` (a template's child, or else plain python, with the same one
    warning), but this process outlives the program to write :func:`run_report` on stderr, then exits with the
    program's status (or dies of its signal). The plain-python fallback is a child here, not an ``exec``."""
    from . import client

    began = time.monotonic()
    inherited = client._inherited_signals()
    program = client.parse(argv)
    fallback = None
    if program is None:
        fallback = "plain python runs this program itself (no program, an interpreter option, a directory or zip)"
    elif os.environ.get(client.ENV_DISABLE) == "1":
        fallback = f"{client.ENV_DISABLE}=1"
    else:
        try:
            conn, pidfd, pid = client.start(program, inherited, runtime_dir)
        except client.Fallback as exc:
            fallback = str(exc) or "an interactive interpreter option (-i)"
            if str(exc):
                client._warn(str(exc))
        except Exception as exc:  # whatever else fails on Overmind's side, as client.main
            fallback = f"{type(exc).__name__}: {exc}"
            client._warn(fallback)
    if fallback is None:
        started = time.monotonic()
        status = client.relay_until_end(conn, pidfd, pid)
    else:
        pid, started, status = _run_plain(argv)
    _write_report(run_report(status, pid=pid, via="template" if fallback is None else "python", fallback=fallback,
                             start_s=started - began, wall_s=time.monotonic() - began))
    if status is None:
        os._exit(1)
    client.exit_like(status)
    return 1


def run_report(status: int | None, *, pid: int, via: str, fallback: str | None, start_s: float,
               wall_s: float) -> dict[str, Any]:
    """What ``overmind run --json`` reports: ``exit_code`` (None when a signal ended the program, or when its
    status was lost with its template), ``signal`` (the name of the signal that killed it), ``pid`` (the
    program's process), ``via`` (``template``: forked from one; ``python``: plain python, ``fallback`` saying
    why), ``start_s`` (from ``overmind run``'s start to the program's) and ``wall_s`` (to its end), in seconds."""
    code = None if status is None else os.waitstatus_to_exitcode(status)
    return {"exit_code": code if code is not None and code >= 0 else None,
            "signal": signal.Signals(-code).name if code is not None and code < 0 else None,
            "pid": pid, "via": via, "fallback": fallback, "start_s": round(start_s, 6), "wall_s": round(wall_s, 6)}


def _write_report(report: dict[str, Any]) -> None:
    try:
        sys.stderr.write(json.dumps(report, sort_keys=True) + "\n")
        sys.stderr.flush()
    except Exception:
        pass


# Sent to this process alone (kill PID), so passed on; a terminal's SIGINT, SIGQUIT, SIGTSTP and SIGWINCH reach
# the program itself (the same process group), so this process only ignores SIGINT and SIGQUIT while it waits.
_PASSED_TO_PLAIN_CHILD = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM")


def _run_plain(argv: list[str]) -> tuple[int, float, int]:
    """Run ``python [its options] <argv>`` as a child, as the user would have run it, passing on its descriptors
    and the signals sent to this process; ``(pid, start time, wait status)``."""
    from .client import _options, release_signals

    args = argv[1:] if argv[:1] == ["--"] else list(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    children: list = []
    early: list[int] = []  # sent before the child existed: passed on once it does

    def forward(signum, _frame):
        if not children:
            early.append(signum)
            return
        try:
            children[0].send_signal(signum)
        except OSError:
            pass

    # In place before the child can run (a signal sent to this process right after it starts is passed on, not
    # this process's death); the child starts with the caller's mask and default handlers (exec resets them).
    for name in _PASSED_TO_PLAIN_CHILD:
        signal.signal(getattr(signal, name), forward)
    release_signals()
    proc = subprocess.Popen([sys.orig_argv[0] if sys.orig_argv else sys.executable, *_options(), *args],
                            executable=sys.executable, close_fds=False)
    started = time.monotonic()
    children.append(proc)
    for signum in early:
        forward(signum, None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    code = proc.wait()
    return proc.pid, started, (-code if code < 0 else code << 8)


def print_templates(args: argparse.Namespace) -> None:
    """``overmind status``'s template lines (nothing with ``--json``, whose output stays the server's)."""
    if getattr(args, "json", False):
        return
    from .registry import templates

    try:
        found = templates(args.runtime_dir)
    except Exception as exc:
        print(f"templates: cannot list them: {exc}", file=sys.stderr)
        return
    from .._util.humanize import human_duration

    if not found:
        print("templates none running (the first 'overmind run' starts one)")
        return
    for info in found:
        preloaded = info.get("preloaded", [])
        names = ", ".join(p for p in preloaded if ":" not in p)
        failed = f", {len(info['failed'])} failed" if info.get("failed") else ""
        print(f"template  pid {info['pid']}, up {human_duration(time.time() - info.get('started', time.time()))}, "
              f"{len(preloaded)} preloaded ({names or 'nothing'}){failed}, python {info.get('python')}")


def stop_templates(args: argparse.Namespace) -> None:
    from .registry import stop_all

    for pid in stop_all(args.runtime_dir):
        print(f"stopped template pid {pid}")


def start_template_for_serve(args: argparse.Namespace,
                             announce: Callable[[dict[str, Any]], None] | None = None) -> None:
    """For ``overmind serve``: start this interpreter's template in the background once this process's
    server accepts (so a failed or second server starts none). ``--no-template`` or
    ``OVERMIND_SERVE_TEMPLATE=0`` skip it. ``announce`` (``serve --json``) gets a ``template`` event: the
    template's pid and preloaded modules, or the error that kept it from starting."""
    if getattr(args, "no_template", False) or os.environ.get(ENV_SERVE_TEMPLATE) == "0":
        return

    def start() -> None:
        from ..client.connection import Client
        from ..client.launcher import wait_accepting
        from ..ipc import runtime
        from . import envkey, preload, registry

        try:
            directory = runtime.runtime_dir(args.runtime_dir)
            sock = runtime.socket_path(directory)
            if not wait_accepting(sock, 30, poll=0.05):
                return
            if Client(directory, autostart=False).status().get("pid") != os.getpid():
                return
            environ = dict(os.environ)
            entries = preload.resolve(os.getcwd(), environ)
            base_id = envkey.key_id(envkey.base_key(entries))
            with registry.start_lock(directory, base_id, registry.start_timeout()):
                if registry.find(directory, base_id, environ)[0] is None:
                    info = registry.spawn(directory, entries, envkey.interpreter_options(), environ,
                                          registry.start_timeout())
                    print(f"overmind serve: template pid {info['pid']} ready ({len(info['preloaded'])} preloaded)",
                          file=sys.stderr, flush=True)
                    if announce is not None:
                        announce({"event": "template", "pid": info["pid"], "preloaded": info["preloaded"]})
        except Exception as exc:
            print(f"overmind serve: no template started: {exc}", file=sys.stderr, flush=True)
            if announce is not None:
                announce({"event": "template", "pid": None, "error": str(exc)})

    quiet_threads.start(threading.Thread(target=start, name="overmind-template-start", daemon=True))
