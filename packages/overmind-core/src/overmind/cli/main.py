"""The ``overmind`` command's entry: ``run`` goes straight to the launcher (``runner/client.py``), the other
commands to ``cli/commands.py``.

Inspection commands never start a server: ``status`` and ``ls`` on a machine where none runs say so. Every
command but ``warm`` takes ``--json``: ``serve --json`` prints one JSON line per event on stdout (``listening``,
``template``, ``exited``: :func:`cmd_serve`); ``run --json`` writes one JSON line on stderr once the program
ended (its stdout is the program's: ``overmind.runner.commands.run_report``). The module imports only the
standard library and the light parts of overmind (no torch) until ``doctor`` checks the zero-copy
implementation.

    $ overmind status
    server    pid 4121, up 2h 03m, overmind 0.1.0, protocol 6
    entries   3
    memory    1.6 GiB used of 31.2 GiB budget (5%)
    hits      12 of 15 gets (80%), 4.1 GiB served; 3 published, 0 evicted
    clients   2 connected, 0 loading, 0 waiting

Exit status (``EXIT_CODES``): 0 done; 1 failed (no server running for status/ls/evict, a prefix that names
no entry or several, an entry refused, a doctor check failed, any Overmind error); 2 usage error (``serve``:
also a bad setting); 3 ``serve``: a server already serves this runtime directory; 130 interrupted (Ctrl-C);
141 the output was closed early (``overmind ls --json | head``: no traceback). ``run`` exits as its program
did, and so does ``warm`` (it runs its program with ``OVERMIND_ADMIT=first``).
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # (not typing's, nor collections.abc at run time: ~3 ms the launcher does without)
if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status (:data:`overmind.cli.commands.EXIT_CODES`)."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (``| head``): say nothing more, and let the interpreter's last flush hit /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: Sequence[str] | None) -> int:
    from ..runner.client import split_run

    words = list(sys.argv[1:] if argv is None else argv)
    run = split_run(words)
    if run is not None and run[1][:1] not in (["--help"], ["-h"], ["--json"]):
        # the launcher alone: this process only hands the program to a template (runner/client.py)
        from ..runner.client import main as run_main

        return run_main(run[1], run[0])
    from .commands import dispatch

    return dispatch(words, run)


if __name__ == "__main__":
    sys.exit(main())
