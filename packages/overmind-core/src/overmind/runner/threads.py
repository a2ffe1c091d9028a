"""OpenBLAS's worker threads: none in the template, as many in each child as a fresh process would have.

numpy's OpenBLAS starts ``n - 1`` worker threads the moment it is loaded, and a template must have one
thread when it forks. So the template loads it with ``OPENBLAS_NUM_THREADS=1`` and the child, once it has
the caller's environment and CPU affinity, asks OpenBLAS for the count OpenBLAS itself would have chosen
(``OPENBLAS_NUM_THREADS``, else ``GOTO_NUM_THREADS``, else ``OMP_NUM_THREADS``, else the CPUs this process
may run on, never more than those).

Setting the count starts the workers, and a new OpenBLAS worker spins on its CPU for a while before it sleeps
(docs/architecture.md, "Measured costs"): two libraries' workers (numpy's and scipy's) then take both CPUs of a
small machine at the program's start. So the child stops the pool again at once (``blas_thread_shutdown_``, what
OpenBLAS's own fork handler does in every forked process): the count stays, and OpenBLAS starts the workers at the
program's first threaded BLAS call, as it does in any child of a process whose pool ran.
"""
from __future__ import annotations

import ctypes
import os

_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads")


def openblas_thread_count(environ: dict[str, str]) -> int:
    """The thread count OpenBLAS picks at load time for ``environ`` and this process's CPU affinity."""
    cpus = len(os.sched_getaffinity(0)) or 1
    for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        try:
            value = int((environ.get(name) or "").split(",")[0])
        except ValueError:
            continue
        if value > 0:
            return min(value, cpus)
    return cpus


def loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process."""
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and "openblas" in os.path.basename(parts[5]).lower():
                    path = parts[5].strip()
                    if path not in paths:
                        paths.append(path)
    except OSError:
        pass
    return paths


# (setter, pool shutdown or None) of each OpenBLAS, found once, in the template (reading /proc/self/maps there,
# not in every child)
_setters: list | None = None


def find_setters() -> list:
    """The thread-count setter and pool shutdown of every OpenBLAS loaded now (the template calls this after its
    imports)."""
    global _setters
    _setters = []
    for path in loaded_openblas():
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                _setters.append((setter, getattr(lib, "blas_thread_shutdown_", None)))
                break
    return _setters


def restore_openblas(environ: dict[str, str]) -> None:
    """Give every loaded OpenBLAS the thread count a fresh process with ``environ`` would have; its workers start
    at its first threaded call."""
    setters = find_setters() if _setters is None else _setters
    if setters:
        from .._util import quiet_threads

        count = openblas_thread_count(environ)
        # The workers the setter starts inherit this thread's signal mask: none of them, while it winds down,
        # can take a signal meant for the program's main thread (a Ctrl-C lost).
        with quiet_threads.blocked():
            for setter, shutdown in setters:
                setter(count)
                if shutdown is not None and count > 1:
                    shutdown()
