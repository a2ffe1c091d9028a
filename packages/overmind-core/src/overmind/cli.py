"""The ``overmind`` command: ``serve | status | ls | evict KEY|--all | stop | doctor [--brief]``.

Inspection commands never start a server: ``status`` and ``ls`` on a machine where none runs say so. The
module imports only the standard library and the light parts of overmind (no torch) until ``doctor``
checks the zero-copy implementation.

    $ overmind status
    server    pid 4121, up 2h 03m, overmind 0.1.0, protocol 1
    entries   3
    memory    1.6 GiB used of 31.2 GiB budget (5%)
    clients   2 connected, 0 loading, 0 waiting
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Sequence

from .errors import OvermindError, ServerUnavailable


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    from .runner.commands import cmd_run, split_run

    run = split_run(list(sys.argv[1:] if argv is None else argv))
    if run is not None:  # 'run' takes the rest of the line verbatim: the program's own options
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
    parser = argparse.ArgumentParser(prog="overmind", description="Inspect and control the Overmind cache server.")
    parser.add_argument("--runtime-dir", help="runtime directory (default: $OVERMIND_RUNTIME_DIR, "
                        "$XDG_RUNTIME_DIR/overmind or /tmp/overmind-<uid>)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the server in the foreground (it normally starts on demand)")
    serve.add_argument("--max-bytes", help="memory budget, e.g. 8G (default: $OVERMIND_MAX_BYTES or half of RAM)")
    serve.add_argument("--no-template", action="store_true", help="do not start the 'overmind run' template")
    serve.set_defaults(func=cmd_serve)

    status = sub.add_parser("status", help="show the server's pid, uptime, entries, memory and clients")
    status.add_argument("--json", action="store_true", help="print the raw status as JSON")
    status.set_defaults(func=cmd_status)

    ls = sub.add_parser("ls", help="list cached entries: loader, arguments, size, hits, last use")
    ls.add_argument("--json", action="store_true", help="print the raw entries as JSON")
    ls.set_defaults(func=cmd_ls)

    evict = sub.add_parser("evict", help="drop an entry (by key or entry id) or all of them")
    target = evict.add_mutually_exclusive_group(required=True)
    target.add_argument("key", nargs="?", help="the entry's key or entry id (see 'overmind ls')")
    target.add_argument("--all", action="store_true", help="evict every entry")
    evict.set_defaults(func=cmd_evict)

    stop = sub.add_parser("stop", help="stop the server (processes keep what they already mapped)")
    stop.set_defaults(func=cmd_stop)

    doctor = sub.add_parser("doctor", help="check that this machine can run Overmind, and what to fix")
    doctor.add_argument("--brief", action="store_true", help="one line per check")
    doctor.add_argument("--json", action="store_true", help="print the checks and the settings as JSON")
    doctor.set_defaults(func=cmd_doctor)

    from .runner.commands import add_parser as add_run_parser

    add_run_parser(sub)
    return parser


# ---- commands ------------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    """Run the server in this process, logging to the terminal as well as the log file."""
    from .server.__main__ import main as server_main

    argv = ["--foreground"]
    if args.runtime_dir:
        argv += ["--runtime-dir", args.runtime_dir]
    if args.max_bytes:
        argv += ["--max-bytes", args.max_bytes]
    from .runner.commands import start_template_for_serve

    start_template_for_serve(args)
    return server_main(argv)


def cmd_status(args: argparse.Namespace) -> int:
    from .runner.commands import print_templates

    code = _ask_and_print(args, lambda client: client.status(), _print_status)
    print_templates(args)
    return code


def cmd_ls(args: argparse.Namespace) -> int:
    return _ask_and_print(args, lambda client: client.ls(), _print_entries)


def _print_status(st: dict[str, Any]) -> None:
    share = f" ({100 * st['bytes'] / st['max_bytes']:.0f}%)" if st["max_bytes"] else ""
    rows = [
        ("server", f"pid {st['pid']}, up {human_duration(st['uptime'])}, overmind {st['version']}, "
                   f"protocol {st['protocol']}"),
        ("entries", str(st["entries"])),
        ("memory", f"{human_bytes(st['bytes'])} used of {human_bytes(st['max_bytes'])} budget{share}"),
        # The status request itself is one of the connections; don't count it as a client.
        ("clients", f"{max(0, st['clients'] - 1)} connected, {st.get('claims', 0)} loading, "
                    f"{st.get('waiting', 0)} waiting"),
        ("runtime", st["runtime_dir"]),
        ("log", st.get("log", "")),
    ]
    _print_rows(rows)


def _print_entries(entries: list[dict[str, Any]]) -> None:
    if not entries:
        print("no entries cached")
        return
    now = time.time()
    table = [("ENTRY", "SIZE", "HITS", "LAST USE", "LOADER", "ARGUMENTS")]
    for e in sorted(entries, key=lambda e: e["last_used"], reverse=True):
        meta = e.get("meta") or {}
        table.append((e["entry_id"], human_bytes(e["nbytes"]), str(e["hits"]),
                      human_duration(now - e["last_used"]) + " ago", str(meta.get("loader", "?")),
                      _shorten(str(meta.get("summary", "")), 60)))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    total = sum(e["nbytes"] for e in entries)
    print(f"{len(entries)} entries, {human_bytes(total)}")


def cmd_evict(args: argparse.Namespace) -> int:
    client = _client_or_none(args)
    if client is None:
        return 1
    if args.all:
        out = client.evict(all=True)
    else:
        # Users copy entry ids from 'overmind ls'; keys are long hashes. Accept either.
        key = next((e["key"] for e in client.ls() if e["entry_id"] == args.key), args.key)
        out = client.evict(key)
    for key in out["evicted"]:
        print(f"evicted {key}")
    if args.all and not out["evicted"]:
        print("nothing to evict")
    for refused in out["refused"]:
        print(f"not evicted {refused['key']}: {refused['reason']}", file=sys.stderr)
    return 1 if out["refused"] else 0


def cmd_stop(args: argparse.Namespace) -> int:
    from .client import Client

    try:
        out = Client(args.runtime_dir, autostart=False).stop()
    except ServerUnavailable:
        print("no server is running")
        out = None
    if out is not None:
        print(f"stopped server pid {out.get('pid')}")
    from .runner.commands import stop_templates

    stop_templates(args)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import run_checks

    return run_checks(args.runtime_dir, brief=args.brief, as_json=args.json)


# ---- helpers -------------------------------------------------------------------------------------------
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
    from .client import Client
    from .launcher import accepts

    client = Client(args.runtime_dir, autostart=False)
    if not accepts(client.socket_path):
        print(f"no server is running for {client.runtime_dir}; it starts on the first overmind.load, or run "
              f"'overmind serve'", file=sys.stderr)
        return None
    return client


def _print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def human_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def human_duration(seconds: Any) -> str:
    """``3725 -> '1h 02m'``, ``42.3 -> '42s'``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


if __name__ == "__main__":
    sys.exit(main())
