"""``python -m overmind.server [--runtime-dir D] [--foreground] [--max-bytes SIZE] [--claim KEY --claim-pid PID]``:
run the Overmind server (a hand parser: argparse and its imports would weigh on the start).

Normally started by ``overmind.client.launcher`` (detached, output appended to the log) or by ``overmind serve``.
``--foreground`` also logs to stderr, for running it in a terminal. ``--claim KEY --claim-pid PID``: the launcher's
process loads ``KEY`` while the server starts, and the server holds that claim for it (``handoff.py``).

The options are read by :func:`parse_args`, not ``argparse``: the server starts before a process's first load can go
on, and argparse with what it imports (gettext, locale, shutil) would weigh on that start and on a process that
lives for hours (docs/architecture.md, "Measured costs"). ``overmind serve`` (``cli/main.py``) is the command with
help text and checked options.
"""
from __future__ import annotations

import sys

from ..errors import OvermindError
from ..ipc import runtime
from .budget import ENV_MAX_BYTES, max_bytes_from_env, parse_size
from .daemon import AlreadyRunning, Server
from .limits import Limits
from .log import log

USAGE = ("usage: python -m overmind.server [--runtime-dir D] [--foreground] [--max-bytes SIZE]\n"
         "  --runtime-dir D   runtime directory (default: $OVERMIND_RUNTIME_DIR, $XDG_RUNTIME_DIR/overmind or "
         "/tmp/overmind-<uid>)\n"
         "  --foreground      also log to stderr\n"
         f"  --max-bytes SIZE  memory budget, e.g. 8G (default: ${ENV_MAX_BYTES} or half of RAM)\n"
         "  --claim KEY --claim-pid PID\n"
         "                    hold KEY claimed for PID, the process starting this server (the launcher's)\n")


class UsageError(ValueError):
    """A command line :func:`parse_args` does not accept."""


def parse_args(argv: list[str]) -> dict:
    """``{"runtime_dir", "foreground", "max_bytes", "claim", "claim_pid"}`` from ``argv``; ``--opt VALUE`` and
    ``--opt=VALUE`` both work. Raises :class:`UsageError` naming the argument it refuses."""
    opts: dict = {"runtime_dir": None, "foreground": False, "max_bytes": None, "claim": None, "claim_pid": None}
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if name == "--foreground" and not eq:
            opts["foreground"] = True
        elif name in ("--runtime-dir", "--max-bytes", "--claim", "--claim-pid"):
            if not eq:
                if not rest or rest[0].startswith("--"):
                    raise UsageError(f"{name} needs a value")
                value = rest.pop(0)
            opts[name[2:].replace("-", "_")] = value
        else:
            raise UsageError(f"unrecognized argument: {arg}")
    if (opts["claim"] is None) != (opts["claim_pid"] is None):
        raise UsageError("--claim and --claim-pid go together")
    if opts["claim_pid"] is not None:
        if not opts["claim_pid"].isdigit() or int(opts["claim_pid"]) <= 0:
            raise UsageError(f"--claim-pid needs a process id, got {opts['claim_pid']!r}")
        opts["claim_pid"] = int(opts["claim_pid"])
    return opts


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, set up logging, serve; returns the process exit status."""
    args = sys.argv[1:] if argv is None else argv
    if "-h" in args or "--help" in args:
        sys.stdout.write(USAGE)
        return 0
    try:
        opts = parse_args(args)
    except UsageError as exc:
        sys.stderr.write(f"{USAGE}python -m overmind.server: error: {exc}\n")
        return 2
    try:
        directory = runtime.runtime_dir(opts["runtime_dir"])
        max_bytes = parse_size(opts["max_bytes"]) if opts["max_bytes"] else max_bytes_from_env()
        limits = Limits.from_env()
    except (OvermindError, ValueError) as exc:
        print(f"overmind server: {exc}", file=sys.stderr)
        return 2
    _setup_logging(runtime.log_path(directory), opts["foreground"])
    try:
        claim = (opts["claim"], opts["claim_pid"]) if opts["claim"] is not None else None
        Server(directory, max_bytes, limits, spawner_claim=claim).serve_forever()
    except AlreadyRunning as exc:
        print(exc, file=sys.stderr)
        return runtime.EXIT_ALREADY_RUNNING
    except OvermindError as exc:
        log.error("%s", exc)
        print(f"overmind server: {exc}", file=sys.stderr)
        return 2
    return 0


def _setup_logging(path: str, foreground: bool) -> None:
    # Rotated at OVERMIND_LOG_MAX_BYTES, and reopened when a tmp cleaner removes it (server/log.py).
    from ..settings import current

    log.open(path, current().log_max_bytes, foreground)


if __name__ == "__main__":
    sys.exit(main())
