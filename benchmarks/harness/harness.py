"""Run scenario scripts in fresh processes against private Overmind servers, and collect what they report.

Each repetition gets its own runtime directory (so its own server, started by the first Overmind process), and
the server is stopped afterwards, so repetitions are independent. Overmind admits an entry by reuse
(``OVERMIND_ADMIT=reuse``, the default): on a fresh server the first process's load is a *first* load (the loader
runs, nothing is published), the second process's load publishes (*cold*), and later ones hit (*warm*). A process
that only has to leave an entry behind for others passes ``env=ADMIT_FIRST``, which publishes on the first load.
Plain and Overmind processes alternate within a repetition, and the order flips every repetition, so a
slow drift of the machine (other jobs, page cache) lands on both sides alike.

>>> h = Harness(results_dir)
>>> with h.runtime() as rt:
...     plain = h.run_child(script, argv, mode="plain")
...     first = h.run_child(script, argv, mode="overmind", runtime_dir=rt)   # loads, publishes nothing
...     cold = h.run_child(script, argv, mode="overmind", runtime_dir=rt)    # publishes
...     warm = h.run_child(script, argv, mode="overmind", runtime_dir=rt)    # hits
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Iterator

from overmind.client.launcher import server_pids

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_MARK = "BENCH-RESULT:"
ADMIT_FIRST = {"OVERMIND_ADMIT": "first"}  # env= of a process whose first load must publish (a priming run)


class ChildFailed(RuntimeError):
    """A scenario process exited non-zero or reported nothing; the message holds the tail of its stderr."""


class Harness:
    """Spawns scenario processes; logs each one's stderr under ``results_dir/logs``."""

    def __init__(self, results_dir: str, via: str = "activate", timeout: float = 900.0):
        self.results_dir = results_dir
        self.logs = os.path.join(results_dir, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.via = via
        self.timeout = timeout
        self.count = 0

    @contextlib.contextmanager
    def runtime(self) -> Iterator[str]:
        """A fresh runtime directory (short: Unix socket paths are limited); its server is stopped after."""
        path = tempfile.mkdtemp(prefix="om-bench-", dir="/tmp")
        try:
            yield path
        finally:
            stop_server(path)
            shutil.rmtree(path, ignore_errors=True)

    def _env(self, mode: str, runtime_dir: str | None, extra: dict | None) -> dict:
        # The test suite's fixture adapters live in .test-plugins, on the test processes' path only: the venv holds
        # the adapters a user has. Bytecode is written and used as in a user's process (this workplace's shells set
        # PYTHONDONTWRITEBYTECODE, which recompiles every module in every process).
        # Admission is the default a user gets (reuse) unless ``extra`` says otherwise, whatever the calling shell
        # has set (the test suite's runtime fixture sets OVERMIND_ADMIT=first).
        env = {**os.environ, "BENCH_MODE": mode, "BENCH_VIA": self.via, "HF_HUB_OFFLINE": "1",
               "PYTHONUNBUFFERED": "1", "OVERMIND_ADMIT": "reuse", **(extra or {})}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if runtime_dir:
            env["OVERMIND_RUNTIME_DIR"] = runtime_dir
        else:
            env.pop("OVERMIND_RUNTIME_DIR", None)
        return env

    def _log_path(self, label: str) -> str:
        self.count += 1
        return os.path.join(self.logs, f"{self.count:03d}-{label}.log")

    def run_child(self, script: str, argv: list[str], mode: str, label: str, runtime_dir: str | None = None,
                  env: dict | None = None) -> dict:
        """Run ``script argv`` to completion; returns its report plus ``process_s`` (spawn to exit, seconds)."""
        log = self._log_path(label)
        with open(log, "w") as err:
            read0 = disk_read_bytes()
            cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t_spawn = time.time()
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, script, *argv], stdout=subprocess.PIPE, stderr=err, text=True,
                                  env=self._env(mode, runtime_dir, {"BENCH_T0": repr(t_spawn), **(env or {})}),
                                  timeout=self.timeout, stdin=subprocess.DEVNULL)
            process_s = time.perf_counter() - t0
            cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            read1 = disk_read_bytes()
        report = _parse(proc.stdout)
        if proc.returncode != 0 or report is None:
            raise ChildFailed(f"{label}: {script} exited {proc.returncode} with{'out' if report is None else ''} a "
                              f"report; stderr tail ({log}):\n{_tail(log)}")
        report["process_s"] = process_s
        # CPU time of the process (children reaped meanwhile: only this one; the server it may start is detached).
        # More system time for the same work and page faults is the kernel's page work costing more (docs).
        report["user_s"] = cpu1.ru_utime - cpu0.ru_utime
        report["sys_s"] = cpu1.ru_stime - cpu0.ru_stime
        if read0 is not None and read1 is not None:
            report["disk_read_bytes"] = read1 - read0  # the whole machine's, while this process ran
        report["label"] = label
        calls = (report.get("breakdown") or {}).get("calls")
        if isinstance(calls, dict):  # how many loads of this process published (breakdown.py's timers)
            report["published"] = calls.get("publish", 0)
        return report

    def start_holder(self, script: str, argv: list[str], mode: str, label: str, runtime_dir: str | None = None,
                     env: dict | None = None) -> tuple[subprocess.Popen, dict]:
        """Start ``script`` (which must end in ``child.wait_for_release()``), wait for its report, and return
        the still-running process with the report. Close ``proc.stdin`` to let it exit."""
        log = self._log_path(label)
        err = open(log, "w")
        proc = subprocess.Popen([sys.executable, script, *argv], stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.PIPE, text=True,
                                env=self._env(mode, runtime_dir, {"BENCH_T0": repr(time.time()), **(env or {})}))
        err.close()
        deadline = time.monotonic() + self.timeout
        for line in proc.stdout:
            if line.startswith(RESULT_MARK):
                report = json.loads(line[len(RESULT_MARK):])
                report["label"] = label
                return proc, report
            if time.monotonic() > deadline:
                break
        proc.kill()
        proc.wait()
        raise ChildFailed(f"{label}: {script} exited {proc.returncode} without a report; stderr tail ({log}):\n"
                          f"{_tail(log)}")


def release(proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Let a holder process exit (closes its stdin) and reap it."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _parse(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_MARK)]
    return json.loads(lines[-1][len(RESULT_MARK):]) if lines else None


def _tail(path: str, n: int = 3000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def stop_server(runtime_dir: str) -> None:
    """Ask the server of ``runtime_dir`` to stop; kill it (by pid) if it is still there after 10 s."""
    if os.path.exists(os.path.join(runtime_dir, "server.sock")):
        subprocess.run([sys.executable, "-m", "overmind", "stop"], env={**os.environ, "OVERMIND_RUNTIME_DIR": runtime_dir},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    deadline = time.monotonic() + 10
    while server_pids(runtime_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in server_pids(runtime_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def disk_read_bytes() -> int | None:
    """Bytes this machine has read from block devices since boot (``pgpgin`` of ``/proc/vmstat``, KiB), or None.

    A process timed while this grows read files from disk, not from the page cache: on a machine that pages out
    memory left untouched for a while (this VM runs DAMON with a ``pageout`` scheme, docs/benchmarks.md), the
    first process after a long one may read back the libraries' files, and its time says so only with this."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("pgpgin "):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def smaps_rollup(pid: int) -> dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` as bytes per field (Rss, Pss, Pss_Anon, Pss_File, Pss_Shmem, ...)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def machine() -> dict:
    """The facts a table needs: cores, memory, Python and library versions, date."""
    import platform
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "-"

    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    try:
        commit = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "-"
    return {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "nproc": os.cpu_count(), "cpu": cpu, "commit": commit,
            "mem_gib": round(mem_kb / 2**20, 1), "python": platform.python_version(),
            "load_avg": os.getloadavg(),
            **{n: version(n) for n in ("torch", "diffusers", "transformers", "safetensors", "bitsandbytes",
                                        "stable-fast", "overmind-core")}}
