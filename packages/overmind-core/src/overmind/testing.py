"""pytest helpers for Overmind and for adapter authors, registered as the pytest plugin ``overmind``: the
``overmind_runtime`` fixture, :func:`run_fresh` and the conformance checks every adapter should pass.

Fixtures:

* ``overmind_runtime``: a private runtime directory (so a private server) for one test, stopped after, with
  ``OVERMIND_ADMIT=first``: a test's first load publishes, so loading twice is a miss then a hit. A test of
  admission by reuse (the default a user gets) sets ``OVERMIND_ADMIT=reuse`` itself.

Functions:

* :func:`server_pids` (from ``overmind.client.launcher``) lists a runtime dir's server processes.
* :func:`run_fresh` runs a script in a fresh interpreter (spawned, never forked) against the same server
  and returns what the script passed to :func:`report`.
* :func:`overmind_mapped` tells whether an address lies in an Overmind memfd mapping (``/proc/self/maps``).
* :func:`record_call`, :func:`recorded_calls` and :func:`clear_calls` count a loader's runs. A loader that
  appends to a list of its own module's reads that list, so the list is part of its key (and, changing with
  every run, keeps the loader uncached); these keep the count inside Overmind, which keys never read.
* :func:`check_targets_resolve` and :func:`check_patch_symmetry` are the conformance checks every adapter
  should pass::

      from overmind.testing import check_patch_symmetry, check_targets_resolve

      def test_conformance(overmind_runtime):
          check_targets_resolve("mylib")
          check_patch_symmetry("mylib")
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from typing import Any, Iterator

import pytest

from .client.launcher import server_pids  # noqa: F401  (re-exported for tests)

RESULT_MARK = "OVERMIND-RESULT:"
_CALLS: dict[str, list] = {}


def record_call(value: Any, log: str = "calls") -> None:
    """Note that a loader ran (with ``value``); see :func:`recorded_calls`."""
    _CALLS.setdefault(log, []).append(value)


def recorded_calls(log: str = "calls") -> list:
    """The values :func:`record_call` noted in this process, oldest first (a copy)."""
    return list(_CALLS.get(log, ()))


def clear_calls(log: str = "calls") -> None:
    _CALLS.pop(log, None)


@contextlib.contextmanager
def isolated_runtime(admit: str = "first") -> Iterator[str]:
    """Point ``OVERMIND_RUNTIME_DIR`` at a fresh short folder, with ``OVERMIND_ADMIT=admit`` (``first``: every
    miss publishes); stop its server and remove it afterwards, and put both variables back."""
    path = tempfile.mkdtemp(prefix="om-", dir="/tmp")  # Unix socket paths are limited to 108 bytes
    old = {name: os.environ.get(name) for name in ("OVERMIND_RUNTIME_DIR", "OVERMIND_ADMIT")}
    os.environ["OVERMIND_RUNTIME_DIR"] = path
    os.environ["OVERMIND_ADMIT"] = admit
    try:
        yield path
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        stop_servers(path)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def overmind_runtime() -> Iterator[str]:
    """A private runtime directory and server for one test."""
    with isolated_runtime() as path:
        yield path


def stop_servers(path: str) -> None:
    """Stop the server of runtime dir ``path`` politely, then SIGKILL any server process left for it."""
    from .client import connection as client_mod
    from .client.launcher import accepts
    from .errors import OvermindError

    cached = client_mod._clients.pop(path, None)
    if cached is not None:
        cached.close()
    for client in list(client_mod._all_clients):  # the test's own Client(...) objects too: no socket left to the GC
        if client.runtime_dir == path:
            client.close()
    if accepts(os.path.join(path, "server.sock")):
        try:
            client_mod.Client(path, autostart=False).stop()
        except (OvermindError, OSError):
            pass
    for pid in server_pids(path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


_reported: list = []  # what report() handed back in this process (check_cached_like_plain's trailer reads it)


def report(value: Any) -> None:
    """In a script run by :func:`run_fresh`: hand ``value`` (JSON-serialisable) back to the test."""
    _reported.append(value)
    print(RESULT_MARK + json.dumps(value), flush=True)


def _draws_after() -> dict:
    """The next draws of every global random generator this process has imported: where a cached call must
    leave them exactly as the plain call does."""
    draws: dict[str, Any] = {"random": __import__("random").random()}
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        draws["torch"] = torch.randn(8, dtype=torch.float64).tolist()
    if "numpy" in sys.modules:
        draws["numpy"] = sys.modules["numpy"].random.random(3).tolist()
    return draws


_TRAILER = """

import overmind.testing as _overmind_testing
_overmind_testing.report({"reported": _overmind_testing._reported[:], "draws": _overmind_testing._draws_after()})
"""


def check_cached_like_plain(script: str, *, env: dict[str, str] | None = None, timeout: float = 300) -> list:
    """The behavioural conformance check: ``script`` (dedented) activates Overmind, loads as a user would and
    :func:`report`-s what must match (values, dtypes, classes, digests of the weights). It runs in fresh
    processes against this test's server (use the ``overmind_runtime`` fixture): twice plain
    (``OVERMIND_DISABLE=1``), then with Overmind twice, the first publishing and the second served from the
    cache. Each run with Overmind must report what the plain runs reported and leave every global random
    generator the plain runs leave alike (``random``, torch, NumPy: their next draws are compared; one the
    script does not seed starts from the OS in each process, plain or not, and is not compared) where plain
    leaves it, and the server must count a hit during the last run. Returns the reports (plain, miss, hit).
    """
    from .inspection import cache_info

    text = textwrap.dedent(script) + _TRAILER
    plain_env = {**(env or {}), "OVERMIND_DISABLE": "1"}
    plain, again = run_fresh(text, env=plain_env, timeout=timeout), run_fresh(text, env=plain_env, timeout=timeout)
    assert plain["reported"] == again["reported"], (
        f"two plain runs of the script reported different values ({plain['reported']!r}, {again['reported']!r}): "
        f"report what a load determines")
    repeatable = sorted(name for name, draws in plain["draws"].items() if again["draws"].get(name) == draws)
    miss = run_fresh(text, env=env, timeout=timeout)
    hits_before = sum(entry.hits for entry in cache_info(processes=False).entries)
    hit = run_fresh(text, env=env, timeout=timeout)
    hits_after = sum(entry.hits for entry in cache_info(processes=False).entries)
    for name, run in (("the first run with Overmind (a miss)", miss), ("the second run with Overmind (a hit)", hit)):
        assert run["reported"] == plain["reported"], (
            f"{name} reported {run['reported']!r}, the plain run {plain['reported']!r}")
        for generator in repeatable:
            assert run["draws"].get(generator) == plain["draws"][generator], (
                f"{name} left the {generator} generator elsewhere than the plain run: next draws "
                f"{run['draws'].get(generator)!r}, plain {plain['draws'][generator]!r}")
    assert hits_after > hits_before, "the second run with Overmind was not served from the cache (no hit counted)"
    return [plain, miss, hit]


def check_claims_only_its_own(name: str) -> list:
    """No patch target of adapter ``name`` is another live adapter's (two adapters routing one loader would
    each key and refuse it by their own rules). Returns ``name``'s targets."""
    from .adapters import discovery, hooks

    mine = _adapter_targets(name)
    slots = {(id(t.owner), t.name): t for t in mine}
    for other, state in discovery.states().items():
        if other == name or state.status != "loaded" or not state.live():
            continue
        for target in hooks.patch_targets(other):
            clash = slots.get((id(target.owner), target.name))
            assert clash is None, (f"adapter {name!r} patches {clash.describe()}, which adapter {other!r} "
                                   f"patches too: narrow one of the specs")
    return mine


def run_fresh(script: str, *, env: dict[str, str] | None = None, timeout: float = 300, check: bool = True) -> Any:
    """Run ``script`` (dedented) in a fresh Python process and return the value it :func:`report`-ed.

    The child inherits the environment (so the same ``OVERMIND_RUNTIME_DIR``) plus ``env``. With
    ``check=True`` a non-zero exit or a missing report fails the test with the child's output.
    """
    full_env = {**os.environ, **(env or {})}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(script))
        path = f.name
    os.chmod(path, 0o644)
    try:
        proc = subprocess.run([sys.executable, path], env=full_env, capture_output=True, text=True,
                              timeout=timeout)
    finally:
        os.unlink(path)
    reports = [line[len(RESULT_MARK):] for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if check and (proc.returncode != 0 or not reports):
        pytest.fail(f"fresh process failed (exit {proc.returncode}):\n--- stdout\n{proc.stdout[-4000:]}\n"
                    f"--- stderr\n{proc.stderr[-6000:]}", pytrace=False)
    return json.loads(reports[-1]) if reports else {"returncode": proc.returncode, "stderr": proc.stderr}


def overmind_mapped(address: int) -> bool:
    """Whether ``address`` lies in a mapping of an Overmind memfd in this process (``/proc/self/maps``), or in
    a checkpoint file mapped for a file entry of a hit (the registry of ``overmind.shm.mappings``)."""
    from .shm import mappings

    if mappings.contains(address):
        return True
    name = mapped_path(address)
    return name is not None and name.startswith("/memfd:overmind")


def mapped_path(address: int) -> str | None:
    """What the mapping holding ``address`` maps (``/proc/self/maps``): a path, ``/memfd:...``, ``""`` for
    anonymous memory, or None where nothing is mapped."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    return None


def _adapter_targets(name: str) -> list:
    from .adapters import discovery, hooks

    plugin = discovery.get_manager().get_plugin(name)
    state = discovery.states().get(name)
    if plugin is None:
        why = (f" ({state.status}: {state.reason})" if state
               else " (no entry point of that name in group overmind.adapters)")
        raise AssertionError(f"adapter {name!r} is not loaded{why}")
    for module in hooks.patch_later(name):  # the lazy targets too: a check must see every target
        importlib.import_module(module)
    from .adapters import self_check

    # less the loaders activation leaves plain (they do not take what the adapter reads)
    return self_check.fit(hooks.patch_targets(name), hooks.self_check(name))[0]


def check_targets_resolve(name: str) -> list:
    """Every patch target of adapter ``name`` exists, and has the kind the adapter declares."""
    targets = _adapter_targets(name)
    for t in targets:
        found = inspect.getattr_static(t.owner, t.name)  # raises AttributeError if it moved
        if t.kind == "classmethod":
            assert isinstance(found, classmethod), f"{t.describe()} is {type(found).__name__}, not a classmethod"
        elif t.kind in ("function", "staticmethod"):
            fn = found.__func__ if isinstance(found, staticmethod) else found
            assert callable(fn), f"{t.describe()} is not callable"
    return targets


def check_patch_symmetry(name: str) -> list:
    """``activate()`` patches every target of adapter ``name`` (twice is a no-op) and ``deactivate()`` puts
    back the identical original objects, leaving no attribute behind that was not there before."""
    from . import activation
    from .adapters import patching

    targets = _adapter_targets(name)
    assert targets, f"adapter {name!r} declares no patch targets"
    before = {(id(t.owner), t.name): (t.name in vars(t.owner), vars(t.owner).get(t.name)) for t in targets}
    activation.deactivate()
    try:
        activation.activate(strict=True)
        first = {(id(t.owner), t.name): vars(t.owner).get(t.name) for t in targets}
        for t in targets:
            assert patching.is_patched(t.owner, t.name), f"{t.describe()} was not patched by activate()"
            assert vars(t.owner).get(t.name) is not before[(id(t.owner), t.name)][1], f"{t.describe()} unchanged"
        activation.activate(strict=True)
        for t in targets:
            assert vars(t.owner).get(t.name) is first[(id(t.owner), t.name)], f"{t.describe()} re-patched"
    finally:
        activation.deactivate()
    for t in targets:
        had, original = before[(id(t.owner), t.name)]
        assert (t.name in vars(t.owner)) == had, f"deactivate() left {t.describe()} behind"
        if had:
            assert vars(t.owner)[t.name] is original, f"deactivate() did not restore {t.describe()} by identity"
        assert not patching.is_patched(t.owner, t.name)
    return targets
