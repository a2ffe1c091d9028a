"""Whether this process can fork a child that works: one thread and no CUDA (asked by the template before each
child, and of the trial of an object built ahead, after it).

A fork copies only the calling thread, so a lock another thread holds stays locked in the child forever, and a
forked child cannot use a CUDA context its parent initialised. The template checks before it forks each child,
and the objects built ahead are tried in a throwaway fork that must leave the template fit to fork.
"""
from __future__ import annotations

import os
import sys


def fork_problem() -> str | None:
    """Why this process must not fork now (more than one thread, CUDA initialised), or None."""
    tasks = os.listdir("/proc/self/task")
    if len(tasks) > 1:
        names = []
        for tid in sorted(tasks, key=int):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f"{tid} {f.read().strip()}")
            except OSError:
                names.append(tid)
        return (f"has {len(tasks)} threads ({', '.join(names)}); a fork would copy only one of them and any "
                f"lock the others hold would stay locked in the program. A preloaded library started a "
                f"thread when imported: take it off the preload list (OVERMIND_PRELOAD, [tool.overmind] preload "
                f"in pyproject.toml), then run 'overmind stop'")
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return ("has initialised CUDA, which a forked child cannot use; a preloaded library called into CUDA "
                "when imported: take it off the preload list")
    return None
