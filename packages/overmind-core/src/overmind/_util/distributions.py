"""The installed distributions (entry points, versions, requirements, files), read straight from the ``*.dist-info``
folders on ``sys.path`` as :mod:`importlib.metadata` finds them, without importing it.

``overmind.activate()`` needs the entry points of one group, a few distributions' versions, requirements and
top-level modules. :mod:`importlib.metadata` finds the same things, but importing it (with :mod:`email`,
:mod:`zipfile` and :mod:`pathlib`) costs about as much as everything else activation does. This module reads
the same folders the same way: the ``sys.path`` entries in order, each folder's ``*.dist-info`` and
``*.egg-info`` children in the order the file system lists them, the first distribution of a normalized name
winning. Where that reading could differ from :mod:`importlib.metadata` (a zip or ``.egg`` on ``sys.path``, a
meta path finder of its own that finds distributions, an ``egg-info`` distribution's requirements or files),
it asks :mod:`importlib.metadata` instead.

>>> [ep.name for ep in entry_points("overmind.adapters")][:2]
['bnb', 'transformers']
>>> version("torch")
'2.13.0+cpu'
"""
from __future__ import annotations

import collections
import os
import re
import sys
import threading

from . import interrupts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, NamedTuple

_INFO_SUFFIXES = (".dist-info", ".egg-info")
_lock = threading.Lock()
_cached: tuple[Any, dict[str, list[str]] | None] = (None, None)


def normalize(name: str) -> str:
    """PEP 503 normalization with dashes as underscores, as :mod:`importlib.metadata` keys distributions."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


class Distribution:
    """One installed distribution: the texts of its metadata folder, and what activation reads from them."""

    def __init__(self, path: str | None, read_text: Callable[[str], str | None], meta: Any = None):
        self.path = path  # the metadata folder (None when importlib.metadata found it elsewhere)
        self._read = read_text
        self._meta = meta  # the importlib.metadata distribution, when it found this one
        self._headers: dict[str, list[str]] | None = None

    def read_text(self, filename: str) -> str | None:
        return self._read(filename)

    def _header(self, key: str) -> list[str]:
        if self._headers is None:
            text = self.read_text("METADATA") or self.read_text("PKG-INFO") or self.read_text("") or ""
            self._headers = _parse_headers(text)
        return self._headers.get(key.lower(), [])

    @property
    def name(self) -> str | None:
        return next(iter(self._header("Name")), None)

    @property
    def version(self) -> str | None:
        return next(iter(self._header("Version")), None)

    @property
    def requires(self) -> list[str] | None:
        """The requirement lines (``Requires-Dist``), as ``importlib.metadata.Distribution.requires``."""
        reqs = self._header("Requires-Dist")
        if reqs:
            return reqs
        if self.read_text("requires.txt") is None:
            return None
        return self._importlib().requires  # an egg-info's sections: importlib.metadata's translation

    def file_parts(self) -> list[tuple[str, ...]] | None:
        """Each installed file's path parts (``RECORD``), as ``importlib.metadata``'s ``files`` gives them."""
        record = self.read_text("RECORD")
        if record is None:
            files = self._importlib().files
            return None if files is None else [tuple(f.parts) for f in files]
        import csv

        return [_parts(row[0]) for row in csv.reader(record.splitlines()) if row]

    def entry_points(self, group: str) -> list[tuple[str, str]]:
        """``(name, value)`` of each entry point of ``group`` (``entry_points.txt``), in file order."""
        text = self.read_text("entry_points.txt")
        if not text:
            return []
        found, section = [], None
        for line in map(str.strip, text.splitlines()):
            if not line or line.startswith("#"):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line.strip("[]")
            elif section == group and "=" in line:
                name, value = line.split("=", 1)
                found.append((name.strip(), value.strip()))
        return found

    def _importlib(self) -> Any:
        if self._meta is None:
            from importlib import metadata
            from pathlib import Path

            self._meta = metadata.PathDistribution(Path(self.path or "."))
        return self._meta


if TYPE_CHECKING:
    class _EntryPointFields(NamedTuple):
        name: str
        value: str
        dist: Distribution
else:
    _EntryPointFields = collections.namedtuple("EntryPoint", ("name", "value", "dist"))


class EntryPoint(_EntryPointFields):
    """One entry point: its name, its value (``module:attr``) and the distribution that declares it."""

    __slots__ = ()

    def load(self) -> Any:
        """Import the module the value names and return the object, as ``importlib.metadata``'s ``load``."""
        import importlib

        match = re.match(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$", self.value)
        if match is None:
            raise ValueError(f"entry point {self.name} = {self.value!r} names no module")
        obj = importlib.import_module(match.group("module"))
        for attr in filter(None, (match.group("attr") or "").split(".")):
            obj = getattr(obj, attr)
        return obj


_HEADER_LINE = re.compile(r"From |[\041-\071\073-\176]*:|[\t ]")  # what email.feedparser takes for a header line
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def _parse_headers(text: str) -> dict[str, list[str]]:
    """The header fields of a core metadata file, by lower name, each value as :mod:`email` (``compat32``, what
    ``importlib.metadata`` reads with) gives it: continuation lines kept, trailing line break dropped."""
    headers: dict[str, list[list[str]]] = {}
    last: list[str] | None = None
    for found in _LINES.finditer(text):  # lazily: the body after the headers can be 100 KB of README
        line = found.group()
        if not _HEADER_LINE.match(line):
            break  # the blank line before the body (or a body with no blank line before it)
        if line[0] in " \t":
            if last is not None:
                last.append(line)
            continue
        if line.startswith("From "):
            last = None  # an mbox "From " line, not a field
            continue
        name, _, value = line.partition(":")
        if not name:
            last = None
            continue
        last = [value.lstrip(" \t")]
        headers.setdefault(name.lower(), []).append(last)
    return {key: ["".join(parts).rstrip("\r\n") for parts in values] for key, values in headers.items()}


def _parts(name: str) -> tuple[str, ...]:
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    return ("/", *parts) if name.startswith("/") else parts


def _reader(folder: str) -> Callable[[str], str | None]:
    def read_text(filename: str) -> str | None:
        try:  # "": the folder itself, an egg-info that is a file (as importlib.metadata reads it)
            with open(os.path.join(folder, filename) if filename else folder, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            interrupts.raise_users(exc)
            return None

    return read_text


def _at(folder: str) -> Distribution:
    return Distribution(folder, _reader(folder))


def _own_scan_is_faithful() -> bool:
    """Whether reading ``sys.path``'s folders finds exactly what ``importlib.metadata`` would."""
    from importlib.machinery import PathFinder

    for finder in sys.meta_path:
        if finder is not PathFinder and getattr(finder, "find_distributions", None) is not None:
            return False
    for entry in sys.path:
        if not isinstance(entry, str) or entry.lower().endswith(".egg") or os.path.isfile(entry):
            return False
    return True


def _stamp(entry: Any) -> tuple | None:
    try:
        st = os.stat(entry or ".")
    except (OSError, TypeError, ValueError) as exc:
        interrupts.raise_users(exc)
        return None
    return st.st_ino, st.st_mtime_ns, st.st_nlink


def _index() -> dict[str, list[str]] | None:
    """Every distribution's metadata folder on ``sys.path`` by normalized name, in ``importlib.metadata``'s
    order; None when only ``importlib.metadata`` can say. The listing is kept until ``sys.path``, the meta path
    or a folder on ``sys.path`` changes: installing or removing a package adds or removes a folder there, which
    changes that folder's mtime and link count (``importlib.metadata`` keys its own listing on the mtime
    alone). The files inside are read afresh on each lookup.

    Each folder's scan is kept on its own, and the listing is the same object while the folders that hold
    distributions are the same: a process given another ``sys.path[0]`` (an ``overmind run`` child, forked from
    a template that read the listing) scans only that folder, and what was derived from the listing
    (``keys/code_identity.py``) stays valid."""
    global _cached, _merged
    path = tuple(sys.path)
    stamps = tuple(map(_stamp, path))
    stamp = (path, stamps, tuple(map(id, sys.meta_path)))
    with _lock:
        if _cached[0] == stamp:
            return _cached[1]
    index: dict[str, list[str]] | None = None
    if _own_scan_is_faithful():
        holding = tuple((entry, entry_stamp, found) for entry, entry_stamp in zip(path, stamps)
                        for found in [_scan(entry, entry_stamp)] if found)
        token = (tuple((entry, entry_stamp) for entry, entry_stamp, _found in holding), stamp[2])
        with _lock:
            if _merged[0] == token:
                index = _merged[1]
        if index is None:
            index = {}
            for _entry, _entry_stamp, found in holding:
                for key, folders in found.items():
                    index.setdefault(key, []).extend(folders)
            with _lock:
                _merged = (token, index)
    with _lock:
        _cached = (stamp, index)
    return index


_scans: dict[str, tuple] = {}  # sys.path entry -> (its stamp, {normalized name: [metadata folders]}) of its scan
_merged: tuple[Any, dict[str, list[str]] | None] = (None, None)  # (the folders holding distributions, the listing)


def _scan(entry: str, entry_stamp: tuple | None) -> dict[str, list[str]]:
    """The distributions in one ``sys.path`` folder, by normalized name (kept while the folder's stamp holds)."""
    with _lock:
        known = _scans.get(entry)
    if known is not None and entry_stamp is not None and known[0] == entry_stamp:
        return known[1]
    found: dict[str, list[str]] = {}
    try:
        children = os.listdir(entry or ".")
    except OSError as exc:
        interrupts.raise_users(exc)
        children = []
    for child in children:
        low = child.lower()
        if low.endswith(_INFO_SUFFIXES):
            key = normalize(low.rpartition(".")[0].partition("-")[0])
            found.setdefault(key, []).append(os.path.join(entry, child))
    with _lock:
        _scans[entry] = (entry_stamp, found)
    return found


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group`` of every installed distribution, the first of each name only."""
    index = _index()
    if index is None:
        from importlib import metadata

        eps = metadata.entry_points(group=group)
        wrapped: dict[int, Distribution] = {}
        out = []
        for ep in eps:
            d = getattr(ep, "dist", None)
            dist = wrapped.setdefault(id(d), Distribution(None, d.read_text if d else lambda _: None, d))
            out.append(EntryPoint(ep.name, ep.value, dist))
        return out
    out = []
    for folders in index.values():
        dist = _at(folders[0])
        out.extend(EntryPoint(name, value, dist) for name, value in dist.entry_points(group))
    return out


def distribution(name: str) -> Distribution | None:
    """The installed distribution ``name`` (any spelling PEP 503 equates), or None."""
    index = _index()
    if index is None:
        from importlib import metadata

        try:
            d = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return None
        return Distribution(None, d.read_text, d)
    folders = index.get(normalize(name))
    return _at(folders[0]) if folders else None


def version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None when it is not installed."""
    dist = distribution(name)
    return None if dist is None else dist.version
