"""What every scenario script uses inside its own (fresh) process: the mode, timers, touching, reporting.

The harness starts each scenario script with ``BENCH_MODE`` (``plain`` or ``overmind``), ``BENCH_T0`` (the
wall-clock time just before it spawned the process) and ``BENCH_VIA``. A script calls :func:`start` first
thing, times its steps with :class:`Stopwatch`, and ends with :func:`emit`, which prints one line the
harness parses. This module imports nothing heavy, so importing it does not distort the import timings.
"""
from __future__ import annotations

import json
import os
import sys
import time

RESULT_MARK = "BENCH-RESULT:"
T0 = float(os.environ.get("BENCH_T0") or time.time())
MODE = os.environ.get("BENCH_MODE", "plain")
# "activate": overmind.activate() patches the libraries (the product). "load": this file wraps the
# scenario's loader calls in overmind.load() itself (for when an adapter is missing; says so in the result).
VIA = os.environ.get("BENCH_VIA", "activate")


class Stopwatch:
    """Named wall-clock durations, in seconds, in the order they were taken.

    >>> sw = Stopwatch()
    >>> with sw("vae"):
    ...     vae = AutoencoderKL.from_pretrained(...)
    """

    def __init__(self):
        self.times: dict[str, float] = {}

    def __call__(self, name: str):
        return _Lap(self, name)


class Window:
    """What the machine did while a timed block ran, to tell a slow run's own work from the host's.

    >>> with Window() as w:
    ...     pipe = Pipeline.from_pretrained(...)
    >>> w.result  # {"minflt": ..., "runqueue_ms": ..., "steal_ms": ..., "others_cpu_ms": ...}

    ``start()``/``stop()`` do the same around code that cannot be indented (the blog's calls, kept as written).

    ``minflt``/``majflt``: this process's page faults; ``runqueue_ms``: the calling thread's time runnable but
    waiting for a CPU (``/proc/thread-self/schedstat``; the loads run on it); ``oncpu_ms``: the CPU time of all
    the process's threads (``/proc/self/stat``: a loader's worker threads too, ended ones included);
    ``steal_ms``: CPU time the hypervisor took from this VM's CPUs, all of them (``/proc/stat``);
    ``others_cpu_ms``: busy CPU time of the whole machine minus this process's own. These three count in ticks
    (10 ms here), so they are that coarse, and ``others_cpu_ms`` can come out a tick below zero. Linux only; a
    missing file leaves its fields out.
    """

    def start(self) -> Window:
        self._start = _window_sample()
        return self

    def stop(self) -> dict:
        end = _window_sample()
        self.result = {k: end[k] - self._start[k] for k in end if k in self._start}
        if "busy_ms" in self.result and "oncpu_ms" in self.result:
            self.result["others_cpu_ms"] = self.result.pop("busy_ms") - self.result["oncpu_ms"]
        self.result.pop("busy_ms", None)
        return self.result

    def __enter__(self) -> Window:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _window_sample() -> dict:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    out = {"minflt": ru.ru_minflt, "majflt": ru.ru_majflt}
    tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
    try:
        with open("/proc/thread-self/schedstat") as f:
            out["runqueue_ms"] = int(f.read().split()[1]) / 1e6
        with open("/proc/self/stat") as f:  # utime and stime: every thread's, those that ended too
            fields_after_name = f.read().rsplit(")", 1)[1].split()
        out["oncpu_ms"] = (int(fields_after_name[11]) + int(fields_after_name[12])) * tick_ms
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
        out["steal_ms"] = fields[7] * tick_ms
        out["busy_ms"] = (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) * tick_ms
    except (OSError, ValueError, IndexError):
        pass
    return out


class _Lap:
    def __init__(self, sw: Stopwatch, name: str):
        self.sw, self.name = sw, name

    def __enter__(self):
        self.t = time.perf_counter()

    def __exit__(self, *exc):
        self.sw.times[self.name] = self.sw.times.get(self.name, 0.0) + time.perf_counter() - self.t


def start(wrap: dict | None = None, breakdown_now: bool = True) -> dict:
    """Set the process up for ``MODE``; returns facts for the result (adapters active, how Overmind is used).

    ``wrap`` maps ``"module:Class"`` to the attribute to route through ``overmind.load`` when
    ``BENCH_VIA=load`` (e.g. ``{"diffusers:AutoencoderKL": "from_pretrained"}``). ``breakdown_now=False``
    leaves the step timers to :func:`install_breakdown` (a script that activates before its imports calls it
    after them: the timers import the load path, which imports torch).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    facts: dict = {"mode": MODE, "pid": os.getpid(), "spawn_to_start_s": time.time() - T0}
    if MODE == "plain":
        return facts
    import overmind

    if breakdown_now:
        install_breakdown()
    if VIA == "activate":
        t = time.perf_counter()
        facts["adapters"] = overmind.activate()
        facts["activate_s"] = time.perf_counter() - t
    else:
        facts["adapters"] = []
        facts["wrapped"] = _wrap_loaders(overmind, wrap or {})
    facts["via"] = VIA
    return facts


def install_breakdown() -> None:
    """Time Overmind's steps (see breakdown.py) unless ``BENCH_BREAKDOWN=0``; in Overmind mode only."""
    if MODE != "plain" and os.environ.get("BENCH_BREAKDOWN", "1") == "1":
        import breakdown

        breakdown.install()


def _wrap_loaders(overmind, wrap: dict) -> list[str]:
    """Route each named classmethod through ``overmind.load`` (a stand-in for an adapter's patch)."""
    import functools
    import importlib

    done = []
    for target, attr in wrap.items():
        mod, cls_name = target.split(":")
        cls = getattr(importlib.import_module(mod), cls_name)
        original = getattr(cls, attr)  # bound to cls

        def patched(*args, _original=original, **kwargs):
            return overmind.load(_original, *args, **kwargs)

        setattr(cls, attr, staticmethod(functools.wraps(original)(patched)))
        done.append(f"{target}.{attr}")
    return done


def storages(*objs) -> list:
    """The distinct tensor storages of ``objs`` (modules, pipelines: every ``nn.Module`` attribute)."""
    import torch

    seen: dict[tuple, object] = {}
    for obj in objs:
        for module in modules_of(obj):
            for t in list(module.parameters()) + list(module.buffers()):
                s = t.untyped_storage()
                seen.setdefault((s.data_ptr(), s.nbytes()), s)
    return [s for s in seen.values() if isinstance(s, torch.UntypedStorage)]


def modules_of(obj) -> list:
    """``obj`` if it is an ``nn.Module``, else the modules among its attributes (a diffusers pipeline)."""
    import torch

    if isinstance(obj, torch.nn.Module):
        return [obj]
    components = getattr(obj, "components", None)
    values = components.values() if isinstance(components, dict) else vars(obj).values()
    found = []
    for v in values:
        if isinstance(v, torch.nn.Module):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, torch.nn.Module))
    return found


def touch(*objs) -> int:
    """Read every byte of every weight of ``objs`` (a CPU stand-in for ``.to('cuda')``); returns the bytes.

    ``max`` over a byte view reads each byte once, vectorised, without allocating anything large. It runs on
    one thread: a copy to a GPU is one stream of reads too, and on a busy 2-core machine a 2-thread parallel
    region per tensor waits for a descheduled thread (touch times then vary 100x between identical runs).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    total = 0
    try:
        for s in storages(*objs):
            n = s.nbytes()
            if n and s.device.type == "cpu":
                torch.empty(0, dtype=torch.uint8).set_(s).max()
                total += n
    finally:
        torch.set_num_threads(threads)
    return total


def weight_bytes(*objs) -> int:
    """Bytes of the distinct storages of ``objs``."""
    return sum(s.nbytes() for s in storages(*objs))


_ready: dict[str, float] = {}


def ready() -> None:
    """Mark the model ready (loaded and usable): :func:`emit` reports ``spawn_to_ready_s``, the wall time from
    just before the process was spawned to here."""
    _ready.setdefault("spawn_to_ready_s", time.time() - T0)


def emit(**result) -> None:
    """Print the result line for the harness (JSON), with the time since spawn (and to :func:`ready`, where the
    script marked it) and, in Overmind mode, the breakdown of its loads."""
    result.setdefault("spawn_to_emit_s", time.time() - T0)
    for name, value in _ready.items():
        result.setdefault(name, value)
    if "breakdown" in sys.modules:
        result.setdefault("breakdown", sys.modules["breakdown"].result())
    print(RESULT_MARK + json.dumps(result), flush=True)


def wait_for_release() -> None:
    """Block until the harness closes our stdin (the memory scenario holds processes alive)."""
    sys.stdin.read()
