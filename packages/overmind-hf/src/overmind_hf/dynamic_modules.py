"""Remote code: make ``transformers_modules.*`` / ``diffusers_modules.*`` importable before unpickling.

A model loaded with ``trust_remote_code=True`` (or a diffusers ``custom_pipeline=``) is an instance of a class
that lives in a module the library created at load time under ``HF_MODULES_CACHE``. A fresh process that
never ran that load cannot import it, and unpickling would fail. So, when an entry is written,
:func:`record` lists the dynamic modules the result's classes come from (with their package siblings, which
relative imports need) together with their source; before an entry is unpickled, :func:`register` installs
a finder that serves exactly those modules from the recorded source. The modules keep their names and
``__file__``, so the library's own later imports of the same code find them in ``sys.modules``.

Executing the recorded source is no new trust: it was recorded by a process of the same user that ran it
with ``trust_remote_code=True``, and the cache key of that load includes the code's folder fingerprint.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
from typing import Any, Iterable

from overmind.adapter import raise_users

from .hub import DYNAMIC_MODULE_PREFIXES as PREFIXES

_MAX_WALK = 200_000  # objects visited when looking for classes; a pipeline of SD size is ~20k


def _is_dynamic(module_name: str, prefixes: Iterable[str]) -> bool:
    return any(module_name == p or module_name.startswith(p + ".") for p in prefixes)


def any_imported(prefixes: Iterable[str] = PREFIXES) -> bool:
    """Whether ``sys.modules`` holds a dynamic module (or package) of ``prefixes``.

    One substring search over the joined names (~0.7 ms for 4k modules); testing each name in Python took ~5 ms,
    and this runs for every entry written (twice: once per adapter).
    """
    names = "\n" + "\n".join(list(sys.modules)) + "\n"
    return any(f"\n{p}\n" in names or f"\n{p}." in names for p in prefixes)


def referenced_modules(result: Any, prefixes: Iterable[str] = PREFIXES) -> set[str]:
    """Names of dynamic modules whose classes appear in ``result``'s object graph (instances or class values).

    A breadth-first walk over ``__dict__``s and containers; cheap next to a load, and it runs only when some
    dynamic module is imported at all.
    """
    prefixes = tuple(prefixes)
    if not any_imported(prefixes):
        return set()
    import torch

    found: set[str] = set()
    seen: set[int] = set()
    todo = [result]
    while todo and len(seen) < _MAX_WALK:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, torch.Tensor, torch.UntypedStorage)):
            continue
        seen.add(id(obj))
        cls = obj if isinstance(obj, type) else type(obj)
        for c in cls.__mro__ if isinstance(obj, type) else (cls,):
            if _is_dynamic(c.__module__, prefixes):
                found.add(c.__module__)
        if isinstance(obj, type):
            continue
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            todo.extend(d.values())
    return found


def record(result: Any, prefixes: Iterable[str] = PREFIXES) -> list[dict[str, Any]]:
    """JSON-ready records (name, file, source, package path, hash attribute) of the dynamic modules ``result``
    needs: the referenced ones, their sibling modules (relative imports) and their parent packages."""
    names = referenced_modules(result, prefixes)
    if not names:
        return []
    parents = {n.rpartition(".")[0] for n in names}
    wanted = set(names)
    for name in list(sys.modules):
        if name.rpartition(".")[0] in parents and _is_dynamic(name, prefixes):
            wanted.add(name)
    for name in list(wanted):  # every enclosing package, up to transformers_modules itself
        while "." in name:
            name = name.rpartition(".")[0]
            wanted.add(name)
    # The library imports the leaf modules by file location and never imports their parent packages, so a
    # parent is usually absent from sys.modules: it is recorded as a package whose folder holds its children.
    folders: dict[str, str] = {}
    for name in wanted:
        file = getattr(sys.modules.get(name), "__file__", None)
        parts = name.split(".")
        if file and not hasattr(sys.modules.get(name), "__path__"):
            folder = os.path.dirname(file)
            for depth in range(len(parts) - 1, 0, -1):
                folders.setdefault(".".join(parts[:depth]), folder)
                folder = os.path.dirname(folder)
    records = []
    for name in sorted(wanted):
        mod = sys.modules.get(name)
        package = name in folders or hasattr(mod, "__path__")
        path = list(getattr(mod, "__path__", None) or ([folders[name]] if name in folders else []))
        rec = {"name": name, "file": getattr(mod, "__file__", None), "package": package, "path": path,
               "source": "", "attrs": {}}
        if rec["file"] and not package:
            try:
                with open(rec["file"], encoding="utf-8") as f:
                    rec["source"] = f.read()
            except OSError as exc:
                raise_users(exc)
                continue  # gone from disk: it cannot be recorded, and the entry will fail to rebuild loudly
        elif package and rec["file"] is None and path:
            rec["file"] = os.path.join(path[0], "__init__.py")
        h = getattr(mod, "__transformers_module_hash__", None)
        if isinstance(h, str):
            rec["attrs"]["__transformers_module_hash__"] = h
        records.append(rec)
    return records


class _RecordedSourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves recorded dynamic modules (and their packages) by name, from their recorded source."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}

    def find_spec(self, fullname, path=None, target=None):
        rec = self.records.get(fullname)
        if rec is None:
            return None
        spec = importlib.util.spec_from_loader(fullname, self, origin=rec.get("file"), is_package=rec["package"])
        if rec["package"]:
            spec.submodule_search_locations = list(rec.get("path") or [])
        spec.has_location = bool(rec.get("file"))
        return spec

    def create_module(self, spec):
        return None  # the default module object

    def get_source(self, fullname):
        """The recorded source: tracebacks and ``inspect.getsource`` work even where the file is gone."""
        return self.records[fullname].get("source") or ""

    def is_package(self, fullname):
        return bool(self.records[fullname]["package"])

    def exec_module(self, module) -> None:
        rec = self.records[module.__name__]
        code = compile(rec.get("source") or "", rec.get("file") or f"<overmind:{module.__name__}>", "exec")
        exec(code, module.__dict__)  # noqa: S102 - recorded from this user's trust_remote_code load; see module doc
        for k, v in (rec.get("attrs") or {}).items():
            setattr(module, k, v)


_finder = _RecordedSourceFinder()
_lock = threading.Lock()


def register(records: Iterable[dict[str, Any]]) -> None:
    """Make every recorded module importable by name (already imported ones are left as they are)."""
    records = [r for r in records if r.get("name") and r["name"] not in sys.modules]
    if not records:
        return
    with _lock:
        for rec in records:
            _finder.records.setdefault(rec["name"], rec)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    importlib.invalidate_caches()
