"""The user's modules a call's result depends on beyond its key (imported by the call, or named by a local import in
the loader's code) and the digest of their files: what its entry varies with besides the generators. A file changed
after this process could have imported it is never vouched for.

The key describes the loader's own code and what it reads through module-level names (:mod:`.code_identity`,
:mod:`.canon`). A loader can also reach the user's code that no such name shows: a local import
(``def load(): import helper; return helper.build()``), ``importlib.import_module``, a module imported by a module
it imports. Edited between two runs, such a module changes the plain call's result while the key stays the same.

So a miss records them (:func:`dependencies`): every module of the user's (a ``.py`` file outside installed
distributions and the standard library) that the call imported, and every one a local import in the loader's own
code names (resolved among the imported modules, or found without running it). Not seen: a module this process had
imported before the call and that the call reaches other than through the loader's own local imports or its
module-level names (``importlib.import_module`` of an imported module, a local import inside another function). Each
becomes a name ``code:<path>`` its entry varies with, as the random generators do (:mod:`.vary`): the entry is a
variant selected by the digest of those files, and a hit digests them again (:func:`state`, by content; the stat of
an unchanged file is remembered). An edit of a dependency is a miss in the next process, never a stale object.

A module this process imported before its file changed runs the old code: the plain call would give the old
code's result, and neither the new file's variant nor a new entry describes it. A dependency whose file changed
since this process started (mtime) is therefore not published (:func:`dependencies` says why), and a hit that
finds one (:func:`state` returns ``None``) runs the loader plainly.
"""
from __future__ import annotations

import dis
import hashlib
import importlib.util
import os
import sys
import threading
import types
from typing import Any, Callable

from .._util import interrupts
from ..adapters import discovery
from ..keys import code_identity

PREFIX = "code:"
_lock = threading.Lock()

_digests: dict[str, tuple[tuple, str]] = {}  # path -> (stat identity, content digest)


def _process_start_ns() -> int:
    """When this process started (``/proc/self/stat``), in ns since the epoch; 0 where it cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return int((boot + ticks / os.sysconf("SC_CLK_TCK")) * 1e9)
    except Exception as exc:
        interrupts.raise_users(exc)
        return 0


PROCESS_START_NS = _process_start_ns()


def modules_now() -> frozenset[str]:
    """The names of the imported modules (a miss takes this before its loader runs)."""
    return frozenset(sys.modules)


def dependencies(fn: Callable, modules_before: frozenset[str], call_start_ns: int) -> tuple[list[str], str | None]:
    """``(["code:<path>", ...], None)``: the user's modules the call imported or the loader's code imports locally;
    or ``([], reason)`` when one of them changed on disk while this process could have run the older code."""
    files: dict[str, str] = {}  # path -> module name
    for name in set(sys.modules) - modules_before:
        path = _user_file(sys.modules.get(name))
        if path:
            files[path] = name
    user_loader = code_identity.distribution_of(getattr(fn, "__module__", "") or "") is None
    for name in _local_imports(fn) if user_loader else ():  # an installed loader's imports name installed code
        path = _user_file(sys.modules.get(name)) or _unimported_user_file(name)
        if path:
            files.setdefault(path, name)
    names = []
    for path, module in sorted(files.items()):
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError as exc:
            interrupts.raise_users(exc)
            return [], f"the file of module {module} ({path}) is gone"
        imported_during_call = module not in modules_before
        if mtime >= (call_start_ns if imported_during_call else PROCESS_START_NS):
            return [], (f"module {module} ({path}) changed on disk after this process "
                        f"{'began the call' if imported_during_call else 'started'}: it may run older code")
        names.append(PREFIX + path)
    return names, None


def state(name: str) -> str | None:
    """The digest of the file of ``name`` (``code:<path>``); ``"absent"`` when it is gone; ``None`` when this process
    imported that module and the file changed since it started (its code may be the older one)."""
    path = name[len(PREFIX):]
    try:
        st = os.stat(path)
    except OSError as exc:
        interrupts.raise_users(exc)
        return "absent"
    if st.st_mtime_ns >= PROCESS_START_NS and _imported_from(path):
        return None
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        known = _digests.get(path)
    if known is not None and known[0] == identity:
        return known[1]
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError as exc:
        interrupts.raise_users(exc)
        return "absent"
    with _lock:
        _digests[path] = (identity, digest)
    return digest


def _imported_from(path: str) -> bool:
    return any(getattr(m, "__file__", None) == path for m in list(sys.modules.values()))


def _user_file(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    name = getattr(module, "__name__", "") or ""
    if name == "__main__" or code_identity.distribution_of(name) is not None or _is_keyed_elsewhere(name):
        return None
    return os.path.realpath(path)


def _is_keyed_elsewhere(name: str) -> bool:
    """Whether an adapter keys and carries the code of module ``name`` itself (``overmind.adapter.
    code_keyed_by_adapter``: a library's copies of a model folder's code, keyed with the folder)."""
    return any(name == p or name.startswith(p + ".") for p in discovery.code_keyed_prefixes)


def _unimported_user_file(name: str) -> str | None:
    """The file of a module not imported yet, found without running it (a top-level name, or one whose parent is
    imported)."""
    if ("." in name and name.rsplit(".", 1)[0] not in sys.modules) or _is_keyed_elsewhere(name):
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    except Exception as exc:
        interrupts.raise_users(exc)
        return None
    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str) or not origin.endswith(".py") or code_identity.distribution_of(name.split(".")[0]):
        return None
    return None if code_identity.under_installed_root(origin) else os.path.realpath(origin)


def _local_imports(fn: Callable) -> set[str]:
    """The module names the import statements inside ``fn``'s code (nested functions included) name."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return set()
    package = getattr(sys.modules.get(getattr(fn, "__module__", "") or ""), "__package__", None) or ""
    out: set[str] = set()
    stack = [code]
    while stack:
        co = stack.pop()
        stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
        recent: list[Any] = [None, None]  # the last two constants loaded: an import's level and fromlist
        for ins in dis.get_instructions(co):
            if ins.opname == "LOAD_CONST":
                recent = [recent[1], ins.argval]
            elif ins.opname == "IMPORT_NAME":
                level = recent[0] if isinstance(recent[0], int) else 0
                fromlist = recent[1] if isinstance(recent[1], tuple) else ()
                base = ins.argval
                try:
                    if level:
                        base = importlib.util.resolve_name("." * level + base, package)
                except (ImportError, ValueError):
                    continue
                if base:
                    out.add(base)
                for item in fromlist:
                    if isinstance(item, str) and item != "*":
                        out.add(f"{base}.{item}" if base else item)
    return out
