"""Helpers of the ``overmind run`` tests (packages/overmind-core/tests/runner/test_run_*.py): start ``run`` as a
real process against a private runtime directory, with a light preload list so templates start fast, and
stop every template of that directory afterwards.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time

OVERMIND = os.path.join(os.path.dirname(sys.executable), "overmind")
LIGHT_PRELOAD = "json"  # a template with this list imports overmind (and activates) and json, nothing else


def env(runtime_dir: str, **extra: str) -> dict[str, str]:
    """The test's environment for ``run``: its private runtime dir and the light preload list."""
    out = {**os.environ, "OVERMIND_RUNTIME_DIR": runtime_dir, "OVERMIND_PRELOAD": LIGHT_PRELOAD}
    out.pop("OVERMIND_RUN_DISABLE", None)
    out.update(extra)
    return out


def write(folder: str, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    return path


def run(args: list[str], runtime_dir: str, *, env_extra: dict | None = None, timeout: float = 240,
        **kwargs) -> subprocess.CompletedProcess:
    """``overmind run ARGS`` to completion (stdout/stderr captured as text unless given)."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run([OVERMIND, "run", *args], env=env(runtime_dir, **(env_extra or {})), timeout=timeout,
                          **kwargs)


def start(args: list[str], runtime_dir: str, *, env_extra: dict | None = None, **kwargs) -> subprocess.Popen:
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    kwargs.setdefault("text", True)
    return subprocess.Popen([OVERMIND, "run", *args], env=env(runtime_dir, **(env_extra or {})), **kwargs)


def templates(runtime_dir: str) -> list[dict]:
    from overmind.runner.registry import templates as listed

    return listed(runtime_dir)


def stop_templates(runtime_dir: str) -> None:
    from overmind.runner.registry import stop_all

    with contextlib.suppress(Exception):
        stop_all(runtime_dir)


def wait_for(predicate, timeout: float = 120.0, what: str = "a condition") -> None:
    """Poll ``predicate`` until it holds (an event to wait for, not a timing claim)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def read_line(stream, timeout: float = 120.0) -> str:
    """The next line of a child's pipe, or fail after ``timeout`` seconds."""
    import select

    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        raise AssertionError("no output from the program")
    return stream.readline()


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, parent pid, ...), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` (R, S, T, Z...), or None once it is gone."""
    fields = _stat_fields(pid)
    return fields[0].decode() if fields else None


def gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("overmind run:")]


@contextlib.contextmanager
def shared_runtime():
    """A private runtime directory for a whole test module (so its tests share one template); its templates
    and server are stopped and the directory removed afterwards."""
    from overmind.testing import isolated_runtime

    with isolated_runtime() as path:
        try:
            yield path
        finally:
            stop_templates(path)


def template_pids(runtime_dir: str) -> list[int]:
    from overmind.runner.registry import template_pids as pids

    return pids(runtime_dir)


def wait_asleep(pid: int, timeout: float = 120.0) -> None:
    """Wait until the main thread of ``pid`` is blocked in ``time.sleep``.

    A signal that arrives after a program printed that it is ready but before its sleep began interrupts nothing:
    CPython runs the handler when the sleep ends, in plain Python as under Overmind. A test that interrupts a
    sleep sends its signal once the sleep is under way.
    """
    def asleep() -> bool:
        try:
            with open(f"/proc/{pid}/task/{pid}/wchan") as f:
                wchan = f.read()
            with open(f"/proc/{pid}/task/{pid}/syscall") as f:
                call = f.read().split()[0]
        except (OSError, IndexError):
            return False
        return "sleep" in wchan or call in _SLEEP_CALLS

    wait_for(asleep, timeout=timeout, what=f"process {pid} to sleep")


# nanosleep and clock_nanosleep on x86_64 and on aarch64
_SLEEP_CALLS = {"35", "230"} if os.uname().machine == "x86_64" else {"101", "115"}
# recvmsg on x86_64 and on aarch64
_RECVMSG = "47" if os.uname().machine == "x86_64" else "212"


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    out = []
    for name in os.listdir("/proc"):
        fields = _stat_fields(int(name)) if name.isdigit() else None
        if fields and int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
            out.append(int(name))
    return out


def wait_for_spare(runtime_dir: str, timeout: float = 120.0) -> int:
    """Wait until a template of ``runtime_dir`` has a spare that waits for a request (``runner/spare.py``): a child
    of the template blocked in ``recvmsg`` on its end of the pair, its warm-up and page copies done. Its pid.

    A request that arrives earlier is served all the same (the spare stops copying, or the template forks a child
    there and then); a test that asserts what a ready spare did sends its request once one is ready."""
    found: list[int] = []

    def waiting() -> bool:
        for template in template_pids(runtime_dir):
            for pid in children(template):
                try:
                    with open(f"/proc/{pid}/task/{pid}/syscall") as f:
                        call = f.read().split()[0]
                except (OSError, IndexError):
                    continue
                if call == _RECVMSG:
                    found.append(pid)
                    return True
        return False

    wait_for(waiting, timeout=timeout, what="a spare that waits for a request")
    return found[0]
