"""What a piece of code is, for a cache key: installed code by its distribution, the user's code by itself (what a
code object is).

- Code inside an installed distribution (site-packages) or the standard library is identified by the
  distribution's name and version: its source does not change while that version is installed.
- Anything else (``__main__``, a script's folder, an editable install: code the user edits) is identified by
  its compiled code, recursively through nested code objects: bytecode, constants, names, flags, arguments.

This module only answers "where does this code come from" and "what is this code object"; the values a
function carries (defaults, closure cells, the globals it reads) are described by :mod:`overmind.keys.canon`.
"""
from __future__ import annotations

import functools
import hashlib
import os
import struct
import sys
import sysconfig
import threading
import types
from typing import Any, Mapping

from .._util import distributions, interrupts


def _installed_roots() -> tuple[str, ...]:
    roots = set()
    for name in ("purelib", "platlib", "stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            roots.add(os.path.realpath(path))
    try:
        import site

        roots.update(os.path.realpath(p) for p in site.getsitepackages())
        user = site.getusersitepackages()
        if isinstance(user, str):
            roots.add(os.path.realpath(user))
    except Exception as exc:
        interrupts.raise_users(exc)
        pass  # a trimmed interpreter without site: the sysconfig paths above still hold
    return tuple(sorted(roots))


_ROOTS = _installed_roots()
_STDLIB = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)


def under_installed_root(path: str) -> bool:
    """Whether ``path`` lies in the standard library or an installed distribution's folder (not the user's code)."""
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + os.sep) for r in _ROOTS)


@functools.cache
def _packages_distributions() -> Mapping[str, list[str]]:
    from importlib.metadata import packages_distributions

    return packages_distributions()


def _distributions_providing(top: str) -> list[str]:
    """The distributions that install the top-level module ``top``.

    The usual case (``diffusers`` from the distribution ``diffusers``) is checked directly against that
    distribution's own record of its top-level modules: the names its ``top_level.txt`` declares, or, where it
    declares none (a wheel built by maturin, such as ``tokenizers``), a package of that name among its installed
    files (``RECORD``), which ``importlib.metadata`` infers a top-level module from in the same case. Only
    otherwise is every installed distribution's record read (``packages_distributions``, ~80 ms, which neither a
    warm load nor a cold one, pickling ``tokenizers``' classes, can afford). The distribution's own record is read
    through :mod:`overmind._util.distributions`, which finds what :mod:`importlib.metadata` finds without its
    ``email`` parser (~1.5 ms a distribution, paid in every warm process).
    """
    guess = distributions.distribution(top)
    if guess is not None and guess.name:
        declared = (guess.read_text("top_level.txt") or "").split()
        if top in declared or (not declared and _installs_package(guess, top)):
            return [guess.name]
    return sorted(set(_packages_distributions().get(top, ())))


def _installs_package(dist: distributions.Distribution, top: str) -> bool:
    """Whether ``dist``'s installed files hold a Python file of package ``top`` (``top/.../*.py``): then
    ``importlib.metadata`` infers ``top`` as one of its top-level modules, in every Python version."""
    parts = dist.file_parts() or []
    return any(len(p) > 1 and p[0] == top and p[-1].endswith(".py") for p in parts)


@functools.lru_cache(maxsize=4096)
def distribution_of(module_name: str) -> tuple | None:
    """``(distribution, version)`` of the installed code that defines ``module_name``, or ``None`` for the
    user's own code (then it is keyed by its code). The standard library is ``("python", version)``.

    A module name is bounded by what is imported, so the cache cannot grow without limit.
    """
    if not module_name:
        return None
    top = module_name.split(".")[0]
    if top in _STDLIB and top != "__main__":
        return ("python", sys.version)
    if top == "overmind" or top.startswith("overmind_"):
        # The cache's own machinery (even as an editable install): a loader calling overmind.load reads
        # nothing of it that shapes its result, and its module state changes with every load.
        from .._version import __version__

        return (("overmind", __version__),)
    module = sys.modules.get(module_name) or sys.modules.get(top)
    path = getattr(module, "__file__", None)
    if not path or not under_installed_root(path):
        return None
    return _versions_providing(top) or None  # none: a loose file dropped into site-packages, key its code


_providing: dict[str, tuple] = {}  # top-level module -> (the installed listing read under, its distributions)
_providing_lock = threading.Lock()


def _versions_providing(top: str) -> tuple:
    """``((distribution, version), ...)`` installing ``top``, remembered while nothing is installed or removed.

    A pipeline's loaders live in several modules of one library (``diffusers.models.autoencoders...``,
    ``diffusers.pipelines...``): each is a miss of :func:`distribution_of`, and reading the distribution's
    records again for each cost ~0.5 ms in every warm process. The answer is kept with the listing of installed
    distributions it was read under (:func:`distributions._index`, kept until a folder on ``sys.path`` changes, which
    installing or removing a package does), so a change on disk is read afresh as before.
    """
    listing = distributions._index()
    with _providing_lock:
        known = _providing.get(top)
    if known is not None and listing is not None and known[0] is listing:
        return known[1]
    found = tuple((d, distributions.version(d)) for d in _distributions_providing(top))
    with _providing_lock:
        _providing[top] = (listing, found)
    return found


def read_imported() -> list[str]:
    """Read, for every top-level package imported now, the distributions that install it (what
    :func:`distribution_of` asks on a load's key). An ``overmind run`` template calls this once its imports are
    done, so its children find the answers read (valid while nothing is installed or removed); returns the
    distributions' names."""
    names: dict[str, None] = {}
    for name, module in list(sys.modules.items()):
        if "." in name or name in _STDLIB or name.startswith("overmind"):
            continue
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and under_installed_root(path):
            names.update(dict.fromkeys(dist for dist, _version in _versions_providing(name)))
    return list(names)


def code_digest(code: types.CodeType) -> str:
    """A digest of everything in ``code`` that decides what it does (not its file name or line numbers)."""
    h = hashlib.sha256()
    _feed_code(code, h)
    return h.hexdigest()[:32]


def _feed_code(code: types.CodeType, h) -> None:
    h.update(b"code")
    h.update(code.co_code)
    h.update(struct.pack("<6q", code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                         code.co_nlocals, code.co_flags, len(code.co_consts)))
    for names in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        h.update(repr(names).encode("utf-8", "surrogatepass"))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed_code(const, h)
        else:
            h.update(_const_bytes(const))


def _const_bytes(const: Any) -> bytes:
    """Constants as bytes that tell ``0.0`` from ``-0.0``, ``1`` from ``True`` and NaN payloads apart."""
    t = type(const)
    if t is float:
        return b"f" + struct.pack("<d", const)
    if t is complex:
        return b"c" + struct.pack("<dd", const.real, const.imag)
    if t in (tuple, frozenset):
        items = [_const_bytes(c) for c in const]
        if t is frozenset:
            items.sort()
        return t.__name__.encode() + b"(" + b",".join(items) + b")"
    return t.__name__.encode() + b":" + repr(const).encode("utf-8", "surrogatepass")


def global_names(code: types.CodeType) -> tuple[str, ...]:
    """Every name the code (and the code nested in it) may look up in its globals or as an attribute."""
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return tuple(sorted(names))
