"""The ``overmind`` command's parser and its commands but ``run`` (``cli/main.py`` dispatches; ``run`` goes
straight to the launcher, :mod:`overmind.runner.client`, without importing this module)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any, Callable

from .._util import quiet_threads
from .._util.humanize import human_bytes, human_duration
from .._version import __version__
from ..errors import OvermindError

EXIT_CODES = {0: "done", 1: "failed (see the message)", 2: "usage error", 3: "a server already serves (serve)",
              130: "interrupted", 141: "output closed early (a pipe's reader exited)"}


def dispatch(argv: list[str], run: tuple[str | None, list[str]] | None) -> int:
    """Run the command of ``argv`` (``run --help`` and ``run --json`` included: ``run`` is the launcher's
    otherwise); returns its exit status."""
    if run is not None and run[1] in (["--help"], ["-h"]):  # Overmind's help, not python's
        try:
            _parser().parse_args(["run", "--help"])
        except SystemExit as exit:
            return int(exit.code or 0)
    if run is not None:  # 'run' takes the rest of the line verbatim: the program's own options
        from ..runner.commands import cmd_run

        return cmd_run(*run)
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        return args.func(args)
    except OvermindError as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="overmind", description="Inspect and control the Overmind cache server.",
        epilog="exit status: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()))
    parser.add_argument("--version", action="version", version=f"overmind {__version__}")
    parser.add_argument("--runtime-dir", help="runtime directory (default: $OVERMIND_RUNTIME_DIR, "
                        "$XDG_RUNTIME_DIR/overmind or /tmp/overmind-<uid>)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the server in the foreground (it normally starts on demand)")
    serve.add_argument("--max-bytes", help="memory budget, e.g. 8G (default: $OVERMIND_MAX_BYTES or half of RAM)")
    serve.add_argument("--no-template", action="store_true", help="do not start the 'overmind run' template")
    serve.add_argument("--json", action="store_true", help="print one JSON line per event on stdout: listening "
                       "(pid, socket, runtime dir, log, budget), template (its pid), exited (exit code)")
    serve.set_defaults(func=cmd_serve)

    status = sub.add_parser("status", help="show the server's pid, uptime, entries, memory and clients")
    status.add_argument("--json", action="store_true", help="print the raw status as JSON")
    status.set_defaults(func=cmd_status)

    from .listing import SORTS

    ls = sub.add_parser("ls", help="list cached entries: size, referenced bytes, hits, last use, processes, "
                                   "loader, arguments")
    ls.add_argument("--sort", choices=sorted(SORTS), default="last-use", help="order of the rows (default last-use)")
    ls.add_argument("--loader", metavar="TEXT", help="only entries whose loader's name contains TEXT")
    ls.add_argument("--json", action="store_true", help="print the entries as one JSON document (a list)")
    ls.add_argument("--jsonl", action="store_true", help="print one JSON object per entry, one per line")
    ls.set_defaults(func=cmd_ls)

    evict = sub.add_parser("evict", help="drop entries, named by any unique prefix of their key or entry id")
    evict.add_argument("prefixes", nargs="*", metavar="PREFIX", help="the entry's key or entry id, or a unique "
                       "prefix of either (the ENTRY column of 'overmind ls')")
    evict.add_argument("--all", action="store_true", help="evict every entry")
    evict.add_argument("--dry-run", action="store_true", help="say what would be evicted and freed, evict nothing")
    evict.add_argument("--with-deps", action="store_true",
                       help="also evict the entries they reference that no other entry references")
    evict.add_argument("--json", action="store_true", help="print what was evicted and refused as JSON")
    evict.set_defaults(func=cmd_evict)

    stop = sub.add_parser("stop", help="stop the server (processes keep what they already mapped)")
    stop.add_argument("--json", action="store_true", help="print what was stopped, and how, as JSON")
    stop.add_argument("--force", action="store_true",
                      help="a server that does not answer is killed at once (SIGKILL), not sent SIGTERM first")
    stop.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                      help="how long a server that does not answer gets after SIGTERM before SIGKILL (default 5)")
    stop.set_defaults(func=cmd_stop)

    doctor = sub.add_parser("doctor", help="check that this machine can run Overmind, and what to fix")
    doctor.add_argument("--brief", action="store_true", help="one line per check")
    doctor.add_argument("--json", action="store_true", help="print the checks and the settings as JSON")
    doctor.set_defaults(func=cmd_doctor)

    warm = sub.add_parser("warm", help="run a program whose loads publish on their first load (OVERMIND_ADMIT=first), "
                                       "so that the next process hits: overmind warm -- python serve.py")
    warm.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM [ARGS...]",
                      help="the command line to run, after '--'; it exits as the program does")
    warm.set_defaults(func=cmd_warm)

    build = sub.add_parser("build-native", help="compile overmind.native._C for the installed torch (about a "
                                                "minute; for a torch other than the one it was installed with)")
    build.add_argument("--force", action="store_true", help="compile even if an extension for this torch serves")
    build.set_defaults(func=cmd_build_native)

    from .fleet_commands import add_parsers as add_fleet_parsers

    add_fleet_parsers(sub)

    from ..runner.commands import add_parser as add_run_parser

    add_run_parser(sub)
    return parser


# ---- commands ------------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    """Run the server in this process, logging to the terminal (stderr) as well as the log file.

    With ``--json``, stdout carries one JSON object per line, one per event: ``listening`` once this process's
    server accepts connections (``pid``, ``socket``, ``runtime_dir``, ``log``, ``max_bytes``, ``version``,
    ``protocol``), ``template`` when the ``overmind run`` template started (``pid``, ``preloaded``; or
    ``pid`` null and ``error``), and last ``exited`` (``pid``, ``exit_code``: 0 after ``overmind stop``, 3
    when another server already served the directory, so no ``listening`` came)."""
    from ..server.__main__ import main as server_main

    argv = ["--foreground"]
    if args.runtime_dir:
        argv += ["--runtime-dir", args.runtime_dir]
    if args.max_bytes:
        argv += ["--max-bytes", args.max_bytes]
    from ..runner.commands import start_template_for_serve

    announce = _event_printer() if args.json else None
    if announce is not None:
        _announce_listening(args.runtime_dir, announce)
    start_template_for_serve(args, announce)
    code = server_main(argv)
    if announce is not None:
        announce({"event": "exited", "pid": os.getpid(), "exit_code": code})
    return code


def cmd_status(args: argparse.Namespace) -> int:
    from ..runner.commands import print_templates

    code = _ask_and_print(args, lambda client: client.status(), _print_status)
    print_templates(args)
    return code


def cmd_ls(args: argparse.Namespace) -> int:
    from ..inspection import cache_info
    from .listing import SORTS, render, render_marks

    info = cache_info(args.runtime_dir, control=True)
    if not info.running:
        return _no_server(info.runtime_dir)
    entries = [e for e in info.entries if not args.loader or args.loader.lower() in e.loader.lower()]
    entries.sort(key=SORTS[args.sort])
    if args.json:
        print(json.dumps([e.to_json() for e in entries], indent=2, sort_keys=True))
        return 0
    if args.jsonl:
        for e in entries:
            print(json.dumps(e.to_json(), sort_keys=True))
        return 0
    for line in render(entries, sort=args.sort):
        print(line)
    marks = [m for m in info.marks if not args.loader or args.loader.lower() in m.loader.lower()]
    if marks:
        print()
        for line in render_marks(marks):
            print(line)
    return 0


def _print_status(st: dict[str, Any]) -> None:
    share = f" ({100 * st['bytes'] / st['max_bytes']:.0f}%)" if st["max_bytes"] else ""
    rows = [
        ("server", f"pid {st['pid']}, up {human_duration(st['uptime'])}, overmind {st['version']}, "
                   f"protocol {st['protocol']}"),
        ("entries", str(st["entries"])),
        *([("lost", f"the cache was last lost {human_duration(time.time() - st['last_lost']['noticed'])} ago "
                    f"(server pid {st['last_lost'].get('pid')} ended without stopping)")]
          if st.get("last_lost") else []),
        ("memory", f"{human_bytes(st['bytes'])} used of {human_bytes(st['max_bytes'])} budget{share}"),
        # Referenced checkpoint files are page cache, outside the budget (docs/architecture.md, file entries).
        *([("files", f"{st['files']} checkpoint file(s) referenced, {human_bytes(st.get('file_bytes', 0))} "
                     f"(page cache, outside the budget)")] if st.get("files") else []),
        *([("hits", f"{st['hits']} of {st['gets']} gets ({_percent(st['hits'], st['gets'])}), "
                    f"{human_bytes(st.get('bytes_served', 0))} served; {st.get('publishes', 0)} published, "
                    f"{st.get('evictions', 0)} evicted")] if "gets" in st else []),
        *([("marks", f"{st['marks']} key{'s' if st['marks'] != 1 else ''} loaded once, not cached "
                     f"({human_bytes(st.get('marked_bytes', 0))}): the next load of each publishes it")]
          if st.get("marks") else []),
        *([("fleet", _fleet_line(st))] if any(st.get(k) for k in _FLEET_COUNTS) else []),
        *([("refused", f"{st['refused_keys']} key{'s' if st['refused_keys'] != 1 else ''} larger than the budget, "
                       f"loaded plainly (OVERMIND_MAX_BYTES)")] if st.get("refused_keys") else []),
        # The status request itself is one of the connections; don't count it as a client.
        ("clients", f"{max(0, st['clients'] - 1)} connected, {st.get('claims', 0)} loading, "
                    f"{st.get('waiting', 0)} waiting"),
        ("runtime", st["runtime_dir"]),
        ("log", st.get("log", "")),
    ]
    _print_rows(rows)


_FLEET_COUNTS = ("fleet_imports", "fleet_uploads", "fleet_upload_failures", "fleet_uploads_pending")


def _fleet_line(st: dict[str, Any]) -> str:
    """The fleet's counters (overmind.fleet): entries imported from its store, uploaded to it."""
    line = (f"{st.get('fleet_imports', 0)} imported from the store (store hits), "
            f"{st.get('fleet_uploads', 0)} uploaded ({human_bytes(st.get('fleet_upload_bytes', 0))})")
    if st.get("fleet_uploads_pending"):
        line += f", {st['fleet_uploads_pending']} uploading"
    if st.get("fleet_upload_failures"):
        line += f", {st['fleet_upload_failures']} failed (see the log)"
    return line


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def cmd_evict(args: argparse.Namespace) -> int:
    from ..client.launcher import accepts
    from ..inspection import evict
    from ..ipc.runtime import socket_path

    if not args.prefixes and not args.all:
        print("overmind evict: name entries to evict (a unique prefix of an ENTRY in 'overmind ls'), or give --all",
              file=sys.stderr)
        return 2
    if args.prefixes and args.all:
        print(f"overmind evict: {' '.join(args.prefixes)} names entries and --all asks for every one: give the "
              f"prefixes or --all, not both", file=sys.stderr)
        return 2
    if not accepts(socket_path(args.runtime_dir)):
        from ..ipc.runtime import runtime_dir

        return _no_server(runtime_dir(args.runtime_dir))
    out = evict(*args.prefixes, all=args.all, dry_run=args.dry_run, with_deps=args.with_deps,
                runtime_dir=args.runtime_dir, control=True)
    if args.json:
        print(json.dumps(out.to_json(), indent=2, sort_keys=True))
        return 1 if out.refused else 0
    verb = "would evict" if out.dry_run else "evicted"
    for key in out.evicted:
        print(f"{verb} {key}")
    if out.evicted:
        count = f"{len(out.evicted)} entr{'y' if len(out.evicted) == 1 else 'ies'}"
        print(f"{'would free' if out.dry_run else 'freed'} {human_bytes(out.freed_bytes)} of shared memory "
              f"({count})")
    if not out.evicted and not out.refused:
        print("nothing to evict")
    for refused in out.refused:
        print(f"not evicted {refused['key']}: {refused['reason']}", file=sys.stderr)
    return 1 if out.refused else 0


def cmd_stop(args: argparse.Namespace) -> int:
    from ..client.stopping import stop_server

    out = stop_server(args.runtime_dir, force=args.force, grace=args.grace)
    if args.json:
        print(json.dumps(out))
    else:
        if out["note"]:
            print(f"overmind stop: {out['note']}", file=sys.stderr)
        if out["how"] is None:
            print("no server is running")
        elif not out["stopped"]:
            print(f"server pid {out['pid']} is still running after SIGKILL", file=sys.stderr)
        else:
            print({"asked": f"stopped server pid {out['pid']}",
                   "terminated": f"stopped server pid {out['pid']} (SIGTERM)",
                   "killed": f"killed server pid {out['pid']} (SIGKILL): its entries are lost"}[out["how"]])
    from ..runner.commands import stop_templates

    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        stop_templates(args)
    return 0 if out["stopped"] or out["how"] is None else 1


def cmd_warm(args: argparse.Namespace) -> int:
    """Replace this process with the program, its environment saying ``OVERMIND_ADMIT=first``."""
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        print("overmind warm: name the program to run after '--', e.g. overmind warm -- python serve.py",
              file=sys.stderr)
        return 2
    env = dict(os.environ, OVERMIND_ADMIT="first")
    if args.runtime_dir:
        env["OVERMIND_RUNTIME_DIR"] = args.runtime_dir
    sys.stdout.flush()
    try:
        os.execvpe(program[0], program, env)
    except OSError as exc:
        print(f"overmind warm: cannot run {program[0]!r}: {exc.strerror}; give a command on PATH or a path to an "
              f"executable", file=sys.stderr)
        return 1
    return 0  # not reached: exec replaced this process


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import run_checks

    return run_checks(args.runtime_dir, brief=args.brief, as_json=args.json)


def cmd_build_native(args: argparse.Namespace) -> int:
    from ..native import build, extension

    module, how = extension.load()
    if module is not None and not args.force:
        print(f"overmind: nothing to build: {how}")
        return 0
    print(f"overmind: compiling overmind.native._C for torch {extension.torch_release()} into "
          f"{extension.cache_dir()} (about a minute) ...", flush=True)
    try:
        path, seconds = build.build()
    except build.BuildFailed as e:
        print(f"overmind: {e}", file=sys.stderr)
        return 1
    print(f"overmind: built {path} in {seconds:.0f} s; new processes use it (overmind doctor: zero-copy)")
    return 0


# ---- helpers -------------------------------------------------------------------------------------------
def _event_printer() -> Callable[[dict[str, Any]], None]:
    """``serve --json``'s output: each event one JSON line on stdout, whole lines from any thread."""
    import threading

    lock = threading.Lock()

    def announce(event: dict[str, Any]) -> None:
        with lock, contextlib.suppress(OSError, ValueError):  # a closed stdout must not stop the server
            sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
            sys.stdout.flush()

    return announce


def _announce_listening(runtime_dir: str | None, announce: Callable[[dict[str, Any]], None]) -> None:
    """In the background: once this process's server accepts, announce the ``listening`` event (nothing if
    another process's server answers, or none within a minute)."""
    import threading

    def wait() -> None:
        from ..client.connection import Client
        from ..client.launcher import wait_accepting
        from ..ipc import runtime

        try:
            directory = runtime.runtime_dir(runtime_dir)
            sock = runtime.socket_path(directory)
            if not wait_accepting(sock, 60, poll=0.02):
                return
            st = Client(directory, autostart=False).status()
        except Exception:
            return
        if st.get("pid") == os.getpid():
            announce({"event": "listening", "pid": st["pid"], "socket": sock, "runtime_dir": st.get("runtime_dir"),
                      "log": st.get("log"), "max_bytes": st.get("max_bytes"), "version": st.get("version"),
                      "protocol": st.get("protocol")})

    quiet_threads.start(threading.Thread(target=wait, name="overmind-serve-listening", daemon=True))


def _ask_and_print(args: argparse.Namespace, ask: Callable[[Any], Any], render: Callable[[Any], None]) -> int:
    """Ask the running server (``ask(client)``) and print its answer: as JSON with ``--json``, else with
    ``render``. Exit status 1, after saying so, when no server runs."""
    client = _client_or_none(args)
    if client is None:
        return 1
    answer = ask(client)
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
    else:
        render(answer)
    return 0


def _client_or_none(args: argparse.Namespace):
    """A client of the running server, or None (after saying so) when none runs; never starts one."""
    from ..client.connection import Client
    from ..client.launcher import accepts

    client = Client(args.runtime_dir, autostart=False, control=True)
    if not accepts(client.socket_path):
        _no_server(client.runtime_dir)
        return None
    return client


def _no_server(directory: str) -> int:
    print(f"no server is running for {directory}; it starts on the first overmind.load, or run "
          f"'overmind serve'", file=sys.stderr)
    return 1


def _print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")

