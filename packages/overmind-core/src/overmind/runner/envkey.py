"""Which template may run a program: the key of the interpreter and its installed packages, and the
environment a template's imports depended on.

A template serves a program only if a fresh ``python`` would have imported the same code the same way:

* the **base key** (:func:`base_key`): the interpreter (``sys.executable``, version, ``sys.flags``,
  ``-X`` options), ``sys.path`` after its first entry (the script's folder, which differs per program),
  the installed distributions (every ``*.dist-info``/``*.egg-info``/``.pth``/``.egg-link`` on that path, with
  its modification time, so a reinstall counts) and the preload list. It names the template's files.
* the **environment** the template's imports read: every variable the preloaded libraries looked up
  through ``os.environ`` while importing (:class:`EnvRecorder`; ``HF_HOME``, ``TRANSFORMERS_OFFLINE``,
  ``OVERMIND_*``...) and every variable that native libraries and the interpreter read at start-up
  (``NATIVE_PREFIXES``: ``PYTHON*``, ``LD_*``, ``OMP_*``, ``MKL_*``, ``LC_*``...). A program whose value of any
  of these differs (set, unset or changed) gets another template. ``IGNORED`` names change with every
  shell command and say nothing about imports.

>>> key = base_key(["@default"]); key_id(key)
'3f2a9c0d51e4b7a8'
"""
from __future__ import annotations

import os
import sys

from .._util import json_accel

IGNORED = frozenset({"PWD", "OLDPWD", "_", "SHLVL", "COLUMNS", "LINES", "OVERMIND_PRELOAD", "OVERMIND_RUNTIME_DIR"})
NATIVE_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO_", "MALLOC_", "LC_")
NATIVE_NAMES = frozenset({"GLIBC_TUNABLES", "LANG", "LANGUAGE"})
# sys.path is part of the base key already; PYTHONPATH's value says nothing more.
NATIVE_EXCLUDED = frozenset({"PYTHONPATH"})
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".pth", ".egg-link")


def interpreter_options(orig_argv: list[str] | None = None) -> list[str]:
    """The interpreter's own options in ``sys.orig_argv`` (``python -X dev -m overmind run`` -> ``['-X', 'dev']``)."""
    argv = list(sys.orig_argv if orig_argv is None else orig_argv)
    out, i = [], 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "-c", "-") or not arg.startswith("-"):
            break
        if arg in ("-X", "-W", "--check-hash-based-pycs"):
            out.extend(argv[i:i + 2])
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def distributions_fingerprint(path: list[str]) -> list[list]:
    """``[[folder, name, mtime_ns], ...]`` for the package metadata on ``path`` (cheap: a listdir and a stat
    per distribution, no metadata parsing)."""
    out = []
    for folder in path:
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for name in names:
            if name.endswith(_METADATA_SUFFIXES):
                try:
                    mtime = os.stat(os.path.join(folder, name)).st_mtime_ns
                except OSError:
                    continue
                out.append([folder, name, mtime])
    return out


def has_path0() -> bool:
    """Whether this interpreter put a program-dependent first entry on ``sys.path`` (not with -P or -I)."""
    return not (getattr(sys.flags, "safe_path", False) or sys.flags.isolated)  # safe_path (-P): Python 3.11+


def path_tail() -> list[str]:
    """``sys.path`` without the program-dependent first entry (the script's folder, the cwd, '')."""
    return sys.path[1:] if has_path0() else list(sys.path)


def base_key(preload: list[str], path_tail: list[str] | None = None) -> dict:
    """The base key of this interpreter for the preload list ``preload``."""
    from .. import _version

    tail = list(globals()["path_tail"]() if path_tail is None else path_tail)
    return {
        "python": sys.executable,
        "version": sys.version,
        "flags": list(sys.flags),
        "xoptions": sorted(f"{k}={v}" for k, v in sys._xoptions.items()),
        "options": interpreter_options(),
        "warnoptions": list(sys.warnoptions),
        "path": tail,
        "distributions": distributions_fingerprint(tail),
        "preload": list(preload),
        "overmind": [_version.__version__, os.path.dirname(os.path.abspath(_version.__file__))],
    }


def key_id(key: dict) -> str:
    """A short stable name for ``key`` (16 hex digits of its SHA-256)."""
    return _sha256(json_accel.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(data: bytes):
    try:  # CPython's own SHA-256: the launcher computes this key without loading OpenSSL (hashlib: 2 ms)
        from _sha256 import sha256  # Python 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # 3.12 on
        except ImportError:
            from hashlib import sha256
    return sha256(data)


def native_environment(environ: dict[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that the interpreter and native libraries read when they start."""
    return {k: v for k, v in environ.items()
            if (k.startswith(NATIVE_PREFIXES) or k in NATIVE_NAMES) and k not in NATIVE_EXCLUDED}


def environment_mismatch(template: dict, environ: dict[str, str]) -> str | None:
    """Why a template that recorded ``template`` (``{"read": {name: value|None}, "native": {...}}``) cannot
    serve a program with ``environ``, or None when it can."""
    for name, value in sorted(template.get("read", {}).items()):
        if environ.get(name) != value:
            return f"{name} is {_show(environ.get(name))} here but was {_show(value)} when the template imported"
    native = native_environment(environ)
    recorded = template.get("native", {})
    for name in sorted(set(native) | set(recorded)):
        if native.get(name) != recorded.get(name):
            return f"{name} is {_show(native.get(name))} here but {_show(recorded.get(name))} in the template"
    return None


def _show(value: str | None) -> str:
    return "unset" if value is None else repr(value)


class EnvRecorder:
    """Record the variables read through ``os.environ`` (``[]``, ``get``, ``in``, ``os.getenv``) while active.

    A place in the code that reads more than ``SCAN_SITE_KEYS`` different variables is copying or scanning
    the environment (``dict(os.environ)``, ``for k in os.environ``), not depending on each of them: its
    reads are not recorded (a library that scans for a prefix, such as tqdm's ``TQDM_*``, is the one case
    this misses; see docs/run.md).

    >>> with EnvRecorder() as rec:
    ...     import diffusers
    >>> rec.read   # {'HF_HOME': None, 'DIFFUSERS_VERBOSITY': 'error', ...}: the values when first read
    """

    SCAN_SITE_KEYS = 16

    def __init__(self) -> None:
        self._reads: dict[str, tuple[str | None, set]] = {}
        self._sites: dict[tuple, set] = {}
        self._original = None

    @property
    def read(self) -> dict[str, str | None]:
        scans = {site for site, keys in self._sites.items() if len(keys) > self.SCAN_SITE_KEYS}
        return {k: value for k, (value, sites) in self._reads.items() if sites - scans}

    def __enter__(self) -> EnvRecorder:
        environ_type = type(os.environ)
        original = self._original = environ_type.__getitem__
        reads, sites = self._reads, self._sites

        plumbing = {os.__file__, getattr(sys.modules.get("_collections_abc"), "__file__", None), "<frozen os>",
                    "<frozen _collections_abc>"}

        def note(key, value) -> None:
            frame = sys._getframe(2)
            while frame.f_back is not None and frame.f_code.co_filename in plumbing:
                frame = frame.f_back  # os.getenv, Mapping.get/__contains__: the site is their caller
            site = (frame.f_code, frame.f_lineno)
            sites.setdefault(site, set()).add(key)
            reads.setdefault(key, (value, set()))[1].add(site)

        def recording_getitem(environ, key):
            try:
                value = original(environ, key)
            except KeyError:
                if environ is os.environ and isinstance(key, str) and key not in IGNORED:
                    note(key, None)
                raise
            if environ is os.environ and isinstance(key, str) and key not in IGNORED:
                note(key, value)
            return value

        environ_type.__getitem__ = recording_getitem
        return self

    def __exit__(self, *exc) -> None:
        type(os.environ).__getitem__ = self._original
