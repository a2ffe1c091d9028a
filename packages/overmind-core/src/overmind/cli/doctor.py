"""``overmind doctor``: check the machine and the setup, and say what to fix.

Each check returns a ``Check`` with a state (``ok``, ``warn`` or ``fail``), one line of detail and, when
not ok, what to do. Only failures make the command exit non-zero. The doctor never starts a server. After the
checks it lists every setting (:mod:`.settings`) with its value and where the value came from.
"""
from __future__ import annotations

import fcntl
import json
import mmap
import os
import re
import stat
import sys
from dataclasses import asdict

from .. import settings
from .._util import interrupts
from .._version import __version__
from ..ipc import runtime
from ..ipc.protocol import PROTOCOL_VERSION
from ..shm import seals as entry_seals
from . import compatibility
from .checks import FAIL, OK, WARN, Check  # noqa: F401 - re-exported: doctor.Check, doctor.OK, ...
from .fleet_check import check_fleet


def all_checks(runtime_dir: str | None = None) -> list[Check]:
    """Every check's outcome, in the order the report prints them."""
    with settings.quiet():  # a bad setting is a check here, not a warning
        return [check_memfd(), check_runtime_dir(runtime_dir), check_budget(runtime_dir), *check_settings(),
                check_server(runtime_dir), *check_fleet(), check_zerocopy(), *check_adapters(),
                *compatibility.checks()]


def run_checks(runtime_dir: str | None = None, *, brief: bool = False, as_json: bool = False) -> int:
    """Run every check and print the results (and the settings); returns 1 if any failed, else 0."""
    checks = all_checks(runtime_dir)
    failed = [c.name for c in checks if c.state == FAIL]
    if as_json:
        print(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks], "settings": settings.describe(),
                          "version": __version__}, indent=2))
        return 1 if failed else 0
    width = max(len(c.name) for c in checks)
    for c in checks:
        if brief:
            line = f"{c.state:<4}  {c.name.ljust(width)}  {c.detail}"
            print(line + (f" -> {c.fix}" if c.fix else ""))
        else:
            print(f"[{c.state}] {c.name}: {c.detail}")
            if c.fix:
                print(f"       fix: {c.fix}")
    if not brief:
        print("all checks passed" if not failed else f"{len(failed)} check(s) failed: {', '.join(failed)}")
        print_settings()
    return 1 if failed else 0


def print_settings() -> None:
    """The settings table: name, value, source (env or default)."""
    rows = settings.describe()
    table = [("SETTING", "VALUE", "SOURCE")] + [(r["name"], r["value"], r["source"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(2)]
    print()
    for name, value, source in table:
        print(f"{name.ljust(widths[0])}  {value.ljust(widths[1])}  {source}")


def check_settings() -> list[Check]:
    """One warning per refused setting (each reads as its default)."""
    return [Check("setting", WARN, p.sentence().removeprefix("overmind: "), f"fix or unset {p.name}")
            for p in settings.problems()]


def check_memfd() -> Check:
    """A sealed memfd can be created and mapped copy-on-write, and private writes stay private."""
    name = "memfd"
    seals = entry_seals.APPLIED
    try:
        fd = os.memfd_create("overmind-doctor", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    except (AttributeError, OSError) as exc:
        return Check(name, FAIL, f"memfd_create failed ({exc})",
                     "Overmind needs Linux >= 3.17 with memfd_create; no cache can work without it")
    try:
        os.write(fd, b"overmind" * 512)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & seals != seals:
            return Check(name, FAIL, "seals did not stick", "report this kernel; sealing is required")
        with mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE) as m:
            m[:8] = b"PRIVATE!"
        if os.pread(fd, 8, 0) != b"overmind":
            return Check(name, FAIL, "a private write reached the sealed memfd", "report this kernel")
    except OSError as exc:
        return Check(name, FAIL, f"sealing or mapping a memfd failed ({exc})",
                     "check seccomp/container policies that block fcntl F_ADD_SEALS or mmap")
    finally:
        os.close(fd)
    return Check(name, OK, "sealed memfd + copy-on-write (MAP_PRIVATE) mapping work")


def check_runtime_dir(path: str | None) -> Check:
    """The runtime directory exists (or can be made), is ours and is mode 0700, and the launcher can create
    its lock and log files there (plain files: no directory or symlink in their place)."""
    from ..client.launcher import preflight

    try:
        directory = runtime.runtime_dir(path)
        runtime.socket_path(directory)
        problems = [p for p in preflight(directory) if directory in p]  # the settings are the server check's
    except Exception as exc:  # noqa: BLE001 - every failure here is reported, not raised
        return Check("runtime dir", FAIL, str(exc).removeprefix("overmind: "),
                     "see the message; or set OVERMIND_RUNTIME_DIR to a private directory")
    if problems:
        return Check("runtime dir", FAIL, problems[0], "see the message; overmind.load runs uncached until then")
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    if not os.access(directory, os.W_OK | os.X_OK):
        return Check("runtime dir", FAIL, f"{directory} (mode {mode:04o}, yours, not writable: no server can "
                     f"create its socket there)", f"chmod 700 {directory}")
    return Check("runtime dir", OK, f"{directory} (mode {mode:04o}, yours, writable)")


def check_budget(path: str | None = None) -> Check:
    """The running server's memory budget, or the one a server started now would have (``OVERMIND_MAX_BYTES`` or
    half of RAM)."""
    from ..server.budget import ENV_MAX_BYTES, max_bytes_from_env

    running = _running_status(path)
    if running and running.get("max_bytes"):
        return Check("budget", OK, f"{running['max_bytes'] / (1 << 30):.1f} GiB (the running server's, pid "
                                   f"{running.get('pid')})")
    budget = max_bytes_from_env()
    source = ENV_MAX_BYTES if settings.current().sources.get(ENV_MAX_BYTES) == "env" else "half of RAM"
    return Check("budget", OK, f"{budget / (1 << 30):.1f} GiB ({source})")


def _running_status(path: str | None) -> dict | None:
    """The running server's status, or None (none runs, or it does not answer within the control timeout)."""
    from ..client.connection import Client
    from ..client.launcher import accepts

    try:
        client = Client(path, autostart=False, control=True)
        if not accepts(client.socket_path):
            return None
        try:
            return client.status()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - the server check reports what is wrong
        interrupts.raise_users(exc)
        return None


def check_server(path: str | None) -> Check:
    """If a server runs: reachable, same protocol and version, torch-free. Never starts one."""
    from ..client.connection import Client
    from ..client.launcher import accepts

    name = "server"
    try:
        client = Client(path, autostart=False, control=True)
    except Exception as exc:  # noqa: BLE001
        return Check(name, FAIL, f"cannot check: {exc}", "fix the runtime directory first")
    if not accepts(client.socket_path):
        cannot = _start_problem()
        if cannot:
            return Check(name, FAIL, f"cannot start one: {cannot}", "overmind.load runs uncached until then")
        return Check(name, OK, "not running (it starts on the first overmind.load)")
    try:
        st = client.status()
    except Exception as exc:  # noqa: BLE001
        return Check(name, FAIL, f"running but not answering properly: {exc}",
                     f"run 'overmind stop' (or kill it) and see {client.log_path}")
    finally:
        client.close()
    if st.get("protocol") != PROTOCOL_VERSION:
        return Check(name, FAIL, f"pid {st['pid']} speaks protocol {st.get('protocol')}, this client "
                     f"{PROTOCOL_VERSION}", "run 'overmind stop'; a matching server starts on demand")
    if st.get("torch_imported"):
        return Check(name, WARN, f"pid {st['pid']} has imported torch (it should never)",
                     f"report a bug with {client.log_path}")
    if st.get("version") != __version__:
        return Check(name, WARN, f"pid {st['pid']} runs overmind {st.get('version')}, this is {__version__}",
                     "run 'overmind stop' when convenient so the new version serves")
    return Check(name, OK, f"pid {st['pid']}, protocol {PROTOCOL_VERSION}, overmind {__version__}, "
                           f"{st['entries']} entries")


def _start_problem() -> str | None:
    """Why the launcher could not start a server here: the interpreter does not run or cannot import the
    server (checked by running it, with the server's own environment)."""
    import subprocess

    from ..client.launcher import interpreter_problem, server_env

    problem = interpreter_problem()
    if problem:
        return problem
    try:
        proc = subprocess.run([sys.executable, "-c", "import overmind.server.daemon"], env=server_env(),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, cwd="/")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run {sys.executable} (sys.executable): {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{sys.executable} cannot import overmind.server ({last})"
    return None


def check_zerocopy() -> Check:
    """Which buffer-to-storage implementation is active (compiled extension or pure-Python twin)."""
    name = "zero-copy"
    try:
        from ..native import zerocopy

        info = zerocopy.describe()
    except Exception as exc:  # noqa: BLE001 - torch missing or the module broken: report, don't crash
        return Check(name, WARN, f"not available ({type(exc).__name__}: {exc})",
                     f"install torch into {sys.prefix} (overmind caches torch objects)")
    active, reason = info.get("active"), info.get("reason", "")
    if active == "c":
        from ..shm import arena

        why_not = arena.available()
        once = "; a miss's converted tensors are written once" if why_not is None else f"; write-once off ({why_not})"
        return Check(name, OK, (f"compiled extension overmind.native._C ({reason})" if reason else
                                "compiled extension overmind.native._C") + once)
    return Check(name, WARN, f"{active} implementation: {reason}",
                 "run 'overmind build-native' for faster warm loads (the cache works without it)")


def check_adapters() -> list[Check]:
    """One line per installed adapter: ok only when it is loaded on the library versions it is tested with. Loaded
    on a newer, untested version: a warning with its self-check's result (run here, remembered per environment).
    Skipped, failed or disabled: a warning that says why and what to do."""
    try:
        from ..adapters import discovery

        states = discovery.states()
    except Exception as exc:  # noqa: BLE001 - report, don't crash
        return [Check("adapters", WARN, f"cannot list adapters ({type(exc).__name__}: {exc})")]
    checks = []
    for name, st in sorted(states.items()):
        label = f"adapter {name}"
        if st.status == "loaded" and st.untested:
            checks.append(_untested_adapter(label, st))
        elif st.status == "loaded":
            checks.append(Check(label, OK, f"{st.dist or 'registered directly'}: loaded"))
        elif st.status == "failed":
            fix = f"reinstall {st.dist} or set OVERMIND_DISABLED_ADAPTERS={name}"
            checks.append(Check(label, WARN, st.reason, fix))
        elif st.status == "disabled":
            checks.append(Check(label, WARN, f"{st.dist}: disabled ({_plain_reason(name, st.reason)})",
                                f"remove {name} from OVERMIND_DISABLED_ADAPTERS to cache its loads"))
        else:
            checks.append(Check(label, WARN, f"{st.dist}: skipped ({_plain_reason(name, st.reason)})",
                                f"install what it needs, or uninstall {st.dist} if you do not use that library"))
    return checks or [Check("adapters", OK, "none installed")]


def _untested_adapter(label: str, st) -> Check:
    """An adapter loaded on a library version outside its tested range: its self-check, run now if no process
    has run it here (it imports the library)."""
    versions = ", ".join(f"{lib} {have} (tested: {tested})" for lib, have, tested in st.untested)
    outcome = st.self_check
    if outcome is None:
        try:
            from ..loading import adapter_check

            outcome = adapter_check.check_installed(st.name)
        except Exception as exc:  # noqa: BLE001 - report, don't crash
            result = f"self-check could not run ({type(exc).__name__}: {exc})"
    if outcome is not None:
        result = f"self-check {'passed' if outcome.passed else 'failed'}: {outcome.detail}"
    state = "active" if outcome is not None and outcome.passed else "off"
    lib, _, tested = st.untested[0]
    return Check(label, WARN, f"{st.dist}: {state} on untested {versions}; {result}",
                 f'pip install "{lib}{tested}" for a tested set, or report what fails with this version')


_MARKER = re.compile(r"""\s*;\s*extra\s*==\s*["'][^"']*["']""")


def _plain_reason(name: str, reason: str) -> str:
    """An adapter state's reason without what the doctor's line already says (``overmind: adapter X skipped:``)
    and without the requirement's raw environment marker (``; extra == "instruments"``)."""
    text = re.sub(rf"^overmind:\s*adapter {re.escape(name)}\s*(skipped|disabled)?:?\s*", "", reason.strip())
    return _MARKER.sub("", text).rstrip(".")
