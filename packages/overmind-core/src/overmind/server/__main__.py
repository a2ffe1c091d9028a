"""``python -m overmind.server [--runtime-dir D] [--foreground]``: run the Overmind server.

Normally started by ``overmind.launcher.ensure_server`` (detached, output appended to the log) or
by ``overmind serve``. ``--foreground`` also logs to stderr, for running it in a terminal.
"""
from __future__ import annotations

import argparse
import logging
import logging.handlers
import sys

from .. import runtime
from ..errors import OvermindError
from .budget import ENV_MAX_BYTES, max_bytes_from_env, parse_size
from .daemon import AlreadyRunning, Server
from .limits import Limits


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, set up logging, serve; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m overmind.server", description=__doc__.splitlines()[0])
    parser.add_argument("--runtime-dir", help="runtime directory (default: $OVERMIND_RUNTIME_DIR, "
                        "$XDG_RUNTIME_DIR/overmind or /tmp/overmind-<uid>)")
    parser.add_argument("--foreground", action="store_true", help="also log to stderr")
    parser.add_argument("--max-bytes", help=f"memory budget, e.g. 8G (default: ${ENV_MAX_BYTES} or half of RAM)")
    args = parser.parse_args(argv)
    try:
        directory = runtime.runtime_dir(args.runtime_dir)
        max_bytes = parse_size(args.max_bytes) if args.max_bytes else max_bytes_from_env()
        limits = Limits.from_env()
    except (OvermindError, ValueError) as exc:
        print(f"overmind server: {exc}", file=sys.stderr)
        return 2
    _setup_logging(runtime.log_path(directory), args.foreground)
    try:
        Server(directory, max_bytes, limits).serve_forever()
    except AlreadyRunning as exc:
        print(exc, file=sys.stderr)
        return runtime.EXIT_ALREADY_RUNNING
    except OvermindError as exc:
        logging.getLogger("overmind.server").error("%s", exc)
        print(f"overmind server: {exc}", file=sys.stderr)
        return 2
    return 0


def _setup_logging(path: str, foreground: bool) -> None:
    fmt = logging.Formatter("%(asctime)s pid %(process)d %(threadName)s %(levelname)s %(message)s")
    logger = logging.getLogger("overmind.server")
    logger.setLevel(logging.INFO)
    # Rotated at OVERMIND_LOG_MAX_BYTES, and reopened when a tmp cleaner removes it (server/logfile.py).
    from ..settings import current
    from .logfile import ServerLogHandler

    handler = ServerLogHandler(path, current().log_max_bytes)
    handler.setFormatter(fmt)
    logger.addHandler(handler)
    if foreground:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(fmt)
        logger.addHandler(console)


if __name__ == "__main__":
    sys.exit(main())
