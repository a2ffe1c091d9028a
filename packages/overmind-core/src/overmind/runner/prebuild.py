"""What an ``overmind run`` template builds ahead for its children: the objects of the entries they hit most, each
after a trial in a throwaway fork.

A warm hit in a fresh process maps the entry and unpickles its skeleton; for the blog's pipeline that is most
of the hit (a CLIP tokenizer alone unpickles in tens of milliseconds). A template can do that work once: it
rebuilds the objects of the entries its children use and holds them (:mod:`overmind.entries.prebuilt`), and a
child forked from it takes its own copy-on-write copy at its hit, everything else of the hit unchanged (the
server's answer for the key, random generators, warnings and log records replayed, provenance).

Which entries: the server's listing, most recently used first, within a budget of skeleton bytes
(``OVERMIND_TEMPLATE_OBJECTS``, default 256M; ``0`` builds none). Left out: markers (no object), entries
whose class travels by value (``dill``: a child maps it to its own live class), and whatever fails its trial.

The trial: each entry is first rebuilt in a throwaway fork of the template, and left out if that rebuild needs
anything a child could not take ready-made: an argument of the call held where the call's own object cannot be
put back (``pipe.vae is vae``: the rebuild holds a placeholder for it, ``entries/prebuilt.py``), a module of the
user's own code (an installed package's module is imported into the template, watched like the preloaded ones,
:mod:`.sources`, and listed for the launcher's shadowing check), a draw from a global random generator, any
output (a warning, a log record: a fresh rebuild in the child shows it), or a thread or CUDA (the template could
not fork any more). What the rebuild read of the environment (a module it imported reads its configuration) is
recorded: the object is taken only by a child that has the same values, and the template's recorded environment
grows by them, so that a program with other values gets another template. A trial's verdict is remembered for
its entry.

When: once the template has imported its preload list (before it freezes the collector's view, so children never
walk these objects), then on its tick after a quiet moment: objects whose entry left the server or was replaced
are dropped, entries newly in use are built, and the view is frozen again. What a child takes is always checked
against the server's answer for its key (``prebuilt.take``), so a held object is never served stale.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from typing import NamedTuple

from .. import settings
from .fork_safety import fork_problem

log = logging.getLogger("overmind")


def budget() -> int:
    """The skeleton bytes a template may hold rebuilt (``OVERMIND_TEMPLATE_OBJECTS``; 0: none)."""
    return int(settings.current().template_objects)


class Builder:
    """The template's side: :meth:`refresh` brings the held objects in line with the server's entries."""

    def __init__(self, runtime_dir: str) -> None:
        self.runtime_dir = runtime_dir
        self.budget = budget()
        self.left_out: dict[str, str] = {}  # entry_id -> why its trial failed
        self.sizes: dict[str, int] = {}  # key -> skeleton bytes of the object held
        self._seen: tuple | None = None  # the server's counts when its entries were last read
        # the variables the rebuilds read (and the modules they imported, at their import): the template serves
        # only programs that have the same values (runner/template.py adds them to its recorded environment)
        self.environment: dict[str, str | None] = {}

    def refresh(self) -> list[str]:
        """Drop what no longer matches the server, build what is newly in use; what was done, in words (built,
        dropped, left out and why; empty when nothing changed). Never raises: a template serves without objects
        built ahead."""
        if self.budget <= 0 or "torch" not in sys.modules:
            return []  # an entry's objects are torch's: a template that did not preload torch builds none ahead
        from ..client.connection import Client
        from ..entries import prebuilt

        changes: list[str] = []
        try:
            client = Client(self.runtime_dir, autostart=False)
        except Exception as exc:
            return self._drop_all(f"no server ({type(exc).__name__})")
        try:
            try:
                status = client.status()
                seen = tuple(status.get(k) for k in ("pid", "started", "publishes", "evictions", "entries", "bytes"))
                if seen == self._seen:
                    return []  # nothing published, evicted or dropped since: the entries are those read last
                listing = client.ls()
            except Exception as exc:
                self._seen = None
                return self._drop_all(f"no server ({type(exc).__name__})")
            self._seen = seen
            wanted, left_out = _candidates(listing)
            loaders = {e["key"]: (e.get("meta") or {}).get("loader", "a loader") for e in listing}
            for entry_id, why in left_out.items():
                if entry_id not in self.left_out:
                    self.left_out[entry_id] = why
                    changes.append(f"left out {entry_id}: {why}")
            for key, entry_id in prebuilt.held().items():
                if wanted.get(key) != entry_id:
                    prebuilt.drop(key)
                    self.sizes.pop(key, None)
                    changes.append(f"dropped {key[:12]} ({loaders.get(key, 'no longer on the server')})")
            used = sum(self.sizes.values())
            for key, entry_id in wanted.items():
                if used >= self.budget:
                    break
                if key in self.sizes or entry_id in self.left_out:
                    continue
                size = self._build(client, key)
                if size:
                    used += size
                    changes.append(f"built {key[:12]} ({loaders[key]}, {size} bytes)")
                elif entry_id in self.left_out:
                    changes.append(f"left out {key[:12]}: {self.left_out[entry_id]}")
        finally:
            client.close()
        return changes

    def _drop_all(self, why: str) -> list[str]:
        from ..entries import prebuilt

        held = list(prebuilt.held())
        for key in held:
            prebuilt.drop(key)
        self.sizes.clear()
        return [f"dropped {len(held)}: {why}"] if held else []

    def _build(self, client, key: str) -> int:
        """Build and hold the object of ``key``'s entry if its trial passes; its skeleton bytes, or 0."""
        from ..entries import codec, prebuilt

        try:
            res = client.get(key, claim=False, wait=False, quiet=True)
        except Exception as exc:
            log.debug("template: cannot build %s ahead: %s", key[:12], exc)
            return 0
        if res.status != "hit" or res.entry is None:
            res.close()
            return 0
        entry_id = res.entry["entry_id"]
        try:
            verdict = trial(res.entry, res.fds)
        except BaseException:
            res.close()
            raise
        if verdict.why is not None:
            res.close()
            self.left_out[entry_id] = verdict.why
            return 0
        placeholders: list = []
        try:
            obj, size = codec.decode_sized(res.entry, res.fds, placeholders=placeholders)  # closes the fds
            meta = res.entry.get("meta") or {}
            prebuilt.hold(key, entry_id, obj, placeholders, meta.get("argument_aliases"), verdict.environment,
                          meta.get("spellings"))
            self.environment.update(verdict.environment)
        except Exception as exc:  # the trial passed; a second rebuild should too
            self.left_out[entry_id] = f"{type(exc).__name__}: {exc}"
            return 0
        self.sizes[key] = size
        return size


def _candidates(listing: list[dict]) -> tuple[dict[str, str], dict[str, str]]:
    """``{key: entry_id}`` of the entries worth building, most recently used first, and ``{entry_id: why}`` of
    those that the listing already shows a child could not take ready-made."""
    from ..loading import vary

    found, left_out = {}, {}
    for entry in sorted(listing, key=lambda e: e.get("last_used") or 0, reverse=True):
        meta = entry.get("meta") or {}
        if vary.MARKER in meta:
            continue  # a marker: no object
        if meta.get("pickler") == "dill":
            left_out[entry["entry_id"]] = "a class of it travels by value, which a child maps to its own live class"
        else:
            found[entry["key"]] = entry["entry_id"]
    return found, left_out


class Verdict(NamedTuple):
    """A trial's outcome: why a child could not take the entry's object ready-made (None: it can), and the
    environment variables the rebuild read, with their values (the object is taken only where they are the same)."""

    why: str | None
    environment: dict


def trial(entry: dict, fds: dict[str, int]) -> Verdict:
    """Rebuild ``entry`` in a throwaway fork of this process and judge it; the fds stay open here."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the trial: report on the pipe, then end without running anything of the template's
        os.close(read_end)
        try:
            verdict = _trial_in_child(entry, fds)
        except BaseException as exc:
            verdict = Verdict(f"the rebuild failed ({type(exc).__name__}: {exc})", {})
        try:
            os.write(write_end, json.dumps(verdict._asdict()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data = b""
        while True:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    try:
        return Verdict(**json.loads(data))
    except (ValueError, TypeError):
        return Verdict("the trial rebuild ended without a verdict", {})


def _trial_in_child(entry: dict, fds: dict[str, int]) -> Verdict:
    import tempfile

    from ..entries import codec, prebuilt
    from ..loading import randomness
    from .envkey import EnvRecorder

    modules, generators = set(sys.modules), randomness.snapshot()
    placeholders: list = []
    with tempfile.TemporaryFile() as output, EnvRecorder() as environment:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                obj, _size = codec.decode_sized(entry, dict(fds), placeholders=placeholders)
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        printed = os.fstat(output.fileno()).st_size
    # what the rebuild read of the environment (Overmind's own variables say how it rebuilds, not what)
    read = {k: v for k, v in environment.read.items() if not k.startswith("OVERMIND_")}
    places = prebuilt.places(obj, placeholders)
    if isinstance(places, str):
        return Verdict(places, read)
    own = sorted(name for name in set(sys.modules) - modules
                 if not (name.startswith("overmind") or _installed(sys.modules[name])))  # (an editable install of
    # overmind is no user code)
    if own:
        return Verdict(f"its rebuild imports {', '.join(own[:3])}{' ...' if len(own) > 3 else ''}, code of the "
                       f"user's own rather than an installed package", read)
    moved = randomness.moved(generators)
    if moved:
        return Verdict(f"its rebuild draws from {', '.join(moved)}", read)
    if caught:
        return Verdict(f"its rebuild warns ({caught[0].category.__name__}: {caught[0].message})", read)
    if printed:
        return Verdict("its rebuild writes output (a log record)", read)
    return Verdict(fork_problem(), read)


def _installed(module) -> bool:
    """Whether ``module`` is the standard library's or an installed distribution's (not the user's own code)."""
    from ..keys.code_identity import under_installed_root

    path = getattr(module, "__file__", None)
    return not isinstance(path, str) or under_installed_root(path)
