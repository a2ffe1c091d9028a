"""The public test kit, registered as the pytest plugin ``overmind``: the ``overmind_runtime`` fixture,
:func:`run_fresh`, the conformance checks every adapter should pass, and the core's parts as an adapter's tests
reach them (an adapter's tests import nothing else of the core but ``overmind`` and ``overmind.adapter``).

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

The core's parts as an adapter's tests reach them (each imports its part when called):

* adapters: :func:`forget_adapters`, :func:`adapter_state`, :func:`plugin_manager`,
  :func:`hookspec_manager`, :func:`adapter_reducers`, :func:`patched_targets`, :func:`unpatch`;
* entries: :func:`roundtrip` (an object through the entry codec and a sealed memfd, as a hit
  rebuilds it), :func:`entry_skeleton`, :func:`mapped_entry`;
* keys: :func:`canonical_form`, :func:`origin_of`;
* loads: :func:`load_scope`, :func:`load_running`, :func:`stop_recording_writes`,
  :func:`set_thresholds` (a tiny model takes the path a full-size one takes).

An adapter's tests import nothing of ``overmind`` but ``overmind``, ``overmind.adapter`` and this
module (``packages/overmind-core/tests/house/test_import_graph.py`` holds them to it): a name they need goes
here, in ``__all__``.
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
from typing import Any, Iterator, Mapping

import pytest

from .client.launcher import server_pids

__all__ = [
    # a private server, fresh processes and what they report
    "overmind_runtime", "isolated_runtime", "stop_servers", "server_pids", "run_fresh", "report",
    "RESULT_MARK", "record_call", "recorded_calls", "clear_calls", "overmind_mapped", "mapped_path",
    # conformance checks
    "check_cached_like_plain", "check_claims_only_its_own", "check_targets_resolve", "check_patch_symmetry",
    # the core's parts as an adapter's tests reach them
    "forget_adapters", "adapter_state", "plugin_manager", "hookspec_manager", "adapter_reducers",
    "patched_targets", "unpatch", "roundtrip", "entry_skeleton", "mapped_entry", "canonical_form", "origin_of",
    "load_scope", "load_running", "stop_recording_writes", "set_thresholds",
]

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


# --- the core's parts, as an adapter's tests reach them ---------------------------------------------------

def forget_adapters() -> None:
    """Deactivate and forget every adapter: the next ``overmind.activate()`` or load discovers them
    again (with the ``OVERMIND_DISABLED_ADAPTERS`` of that moment)."""
    from . import activation

    activation.reset()


def adapter_state(name: str) -> Any:
    """What discovery and activation know of adapter ``name``: ``status`` (``"loaded"``,
    ``"skipped"``, ``"disabled"``, ``"failed"``), ``reason``, ``dist``, ``targets``; KeyError for a
    name discovery did not see."""
    from .adapters import discovery

    return discovery.states()[name]


def plugin_manager() -> Any:
    """The pluggy plugin manager the core calls the hooks through, every discovered adapter registered
    in discovery order (made now if no hook was called yet)."""
    from .adapters import discovery

    return discovery.get_manager()


def hookspec_manager() -> Any:
    """A new pluggy plugin manager that holds Overmind's hook specifications and no adapter: register
    a plugin module there and ``check_pending()`` checks its hooks against the specifications."""
    from .adapters import discovery

    return discovery.new_manager()


def adapter_reducers() -> Mapping[type, list]:
    """The live adapters' ``overmind_reducers``, merged as the pickler takes them:
    ``{type: [reducer, ...]}`` in hook order."""
    from .adapters import hooks

    return hooks.reducers()


def patched_targets() -> list:
    """Every :class:`overmind.adapter.PatchTarget` patched in this process now, in patch order."""
    from .adapters import patching

    return patching.patched_targets()


def unpatch(target: Any) -> bool:
    """Put back what ``target`` replaced, by identity (what ``deactivate()`` does for each target);
    False where it was not patched."""
    from .adapters import patching

    return patching.restore(target)


def roundtrip(obj: Any, reducers: Any = None, *, storages: bool = True) -> Any:
    """``obj`` pickled as an entry is (its storages out of band) and rebuilt as a hit rebuilds it.

    ``reducers`` maps types to a reducer or a list of them (default: :func:`adapter_reducers`). The
    storages are written into a sealed memfd, and the copy's tensors lie in a private copy-on-write
    mapping of it (:func:`overmind_mapped` is true of their addresses): what ``overmind.load`` does,
    without the server. ``storages=False``: ``obj`` must pickle without a storage out of band (a
    tokenizer); nothing is written or mapped.
    """
    from .entries import pickling

    pickled = pickling.dumps(obj, adapter_reducers() if reducers is None else reducers,
                             reference_mapped=False)
    if not storages:
        assert pickled.storages == [], f"{len(pickled.storages)} storages were pickled out of band"

        def no_storages(where: Any, offset: int, nbytes: int) -> Any:
            raise AssertionError("the object was pickled without storages")

        return pickling.loads(pickled.skeleton, no_storages, pickled.pickler)
    from .shm.reader import EntryMapping
    from .shm.writer import write_entry

    fd = write_entry(pickled.skeleton, pickled.storages, pickled.data_len, name="overmind:roundtrip")
    try:
        entry = EntryMapping("roundtrip", fd)
    finally:
        os.close(fd)
    return pickling.loads(entry.skeleton(), lambda where, offset, nbytes: entry.storage(offset, nbytes),
                          pickled.pickler)


def entry_skeleton(key: str) -> bytes:
    """The skeleton of the entry under ``key`` on this test's server (the pickle of its object graph,
    storages left out), read from a private mapping; reading it is no use of the entry."""
    from .client.connection import get_client
    from .shm.reader import EntryMapping

    res = get_client().get(key, claim=False, wait=False, quiet=True)
    assert res.status == "hit" and res.entry is not None, f"no entry under {key}: {res.status}"
    entry_id = res.entry["entry_id"]
    try:
        return bytes(EntryMapping(entry_id, res.fds[entry_id]).skeleton())
    finally:
        for fd in res.fds.values():
            os.close(fd)


def mapped_entry(address: int, nbytes: int) -> str | None:
    """The id of the entry whose mapping in this process holds ``[address, address + nbytes)`` with
    its pages still as mapped, else None (a private copy, or no entry's memory)."""
    from .shm import mappings

    where = mappings.locate(address, nbytes)
    return None if where is None else where.entry_id


def canonical_form(value: Any, key_for_value: Any = None) -> Any:
    """What a cache key holds of argument ``value``: its canonical form, with ``key_for_value`` (an
    adapter's ``overmind_key_for_value``) asked first for each value met; raises
    :class:`overmind.Uncacheable` for a value that cannot be described."""
    from .keys import key

    return key.canon(value, key_for_value)


def origin_of(obj: Any) -> str | None:
    """The key of the entry (or first load) ``obj`` provably still is, which keys it when it is passed
    to a later load; None where it is keyed by its content."""
    from .keys import provenance

    return provenance.origin_of(obj)


def load_scope() -> Any:
    """A context manager that opens a load's scope in this process, as ``overmind.load`` does around
    a call: ``overmind.adapter.load_memo`` keeps what is put there until the outermost scope ends."""
    from .loading import scope

    return scope.scope()


def load_running() -> bool:
    """Whether a load's scope is open in this process (:func:`load_scope`)."""
    from .loading import scope

    return scope.active()


def stop_recording_writes() -> None:
    """Turn off, in this process, the core's recording of what a miss's loader writes outside its
    result (registries, class attributes, module globals): a hit then makes only the writes an adapter
    declares. For a test of such a declaration."""
    from .loading.writes import changes, recording

    recording.start = lambda: None
    recording.finish = lambda before: changes.Found()


def set_thresholds(*, arena: int | None = None, own_bytes_digested: int | None = None) -> None:
    """Lower the core's size thresholds in this process, so that a tiny model takes the path a
    full-size one takes: ``arena``, the size from which a miss's allocations go to its load arena
    (1 MiB); ``own_bytes_digested``, the bytes of its own a first load's result may hold and still be
    keyed by its call, checked by a digest (16 MiB)."""
    if arena is not None:
        from .shm import arena as load_arena

        load_arena.THRESHOLD = arena
    if own_bytes_digested is not None:
        from .keys import provenance

        provenance.OWN_BYTES_DIGESTED = own_bytes_digested
