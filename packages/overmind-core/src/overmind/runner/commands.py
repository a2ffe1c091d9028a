"""The ``overmind`` command's parts about templates: ``run``, and what ``status``, ``stop`` and ``serve``
add (``cli.py`` registers these).

    $ overmind run train.py --epochs 3        # also: overmind run -m pkg.tool, overmind run -c CODE
    $ overmind status
    ...
    template  pid 5120, up 12m 03s, 9 preloaded (torch, diffusers, ...), python /venv/bin/python
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

ENV_SERVE_TEMPLATE = "OVERMIND_SERVE_TEMPLATE"


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


def add_parser(sub) -> None:
    """The ``run`` entry of ``overmind --help`` (the command itself is dispatched by :func:`split_run`)."""
    run = sub.add_parser("run", help="run a Python program in a process forked from a template that has "
                                     "already imported torch and the model libraries",
                         description="overmind run [--] script.py [args] | -m module [args] | -c code [args]")
    run.add_argument("program", nargs=argparse.REMAINDER)
    run.set_defaults(func=lambda args: cmd_run(args.runtime_dir, args.program))


def cmd_run(runtime_dir: str | None, argv: list[str]) -> int:
    from .client import main

    return main(argv, runtime_dir)


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
    from ..humanize import human_duration

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


def start_template_for_serve(args: argparse.Namespace) -> None:
    """For ``overmind serve``: start this interpreter's template in the background once this process's
    server accepts (so a failed or second server starts none). ``--no-template`` or
    ``OVERMIND_SERVE_TEMPLATE=0`` skip it."""
    if getattr(args, "no_template", False) or os.environ.get(ENV_SERVE_TEMPLATE) == "0":
        return

    def start() -> None:
        from .. import runtime
        from ..client import Client
        from ..launcher import accepts
        from . import envkey, preload, registry

        try:
            directory = runtime.runtime_dir(args.runtime_dir)
            sock = runtime.socket_path(directory)
            deadline = time.monotonic() + 30
            while not accepts(sock):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)
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
        except Exception as exc:
            print(f"overmind serve: no template started: {exc}", file=sys.stderr, flush=True)

    threading.Thread(target=start, name="overmind-template-start", daemon=True).start()
