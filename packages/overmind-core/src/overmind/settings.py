"""Every ``OVERMIND_*`` environment variable, declared once, parsed once, validated in one place.

>>> from overmind import settings
>>> settings.current().wait_timeout          # OVERMIND_WAIT_TIMEOUT, or its default
900.0
>>> [s.name for s in settings.DECLARED][:2]
['OVERMIND_RUNTIME_DIR', 'OVERMIND_MAX_BYTES']

A value Overmind cannot use is never an error: it gets ONE :class:`~overmind.fallback.OvermindWarning`
(per process and value) naming the variable, the value and the accepted form, and the default is used.
Booleans accept ``1/0``, ``true/false``, ``yes/no``, ``on/off`` in any case; an empty value means unset.

:func:`current` re-parses only when one of the declared variables changed in ``os.environ`` since the last
call (a test's ``monkeypatch.setenv`` takes effect at once; a process that never changes its environment
parses it once). :func:`reload` forgets the parsed values and the warnings already given. This module imports
only the standard library: the server imports it too, and must stay torch-free.
"""
from __future__ import annotations

import _thread  # not threading: the launcher of ``overmind run`` reads settings, and threading costs it 1 ms
import math
import os

from ._util.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

__all__ = ["Setting", "Settings", "DECLARED", "current", "reload", "describe", "problems", "clean_env",
           "parse_bool", "parse_seconds", "parse_size", "parse_store_url"]


# ---- parsers: each returns the value or raises ValueError ------------------------------------------------
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(text)


def parse_seconds(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(text)
    return value


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$"


def parse_size(text: str) -> int:
    """``"1048576"``, ``"512K"``, ``"1.5G"``, ``"2GiB"`` (binary units) -> bytes (more than 0)."""
    import re  # (here: the launcher of ``overmind run`` reads settings and parses no size; re costs it ~2 ms)

    match = re.match(_SIZE, text, re.IGNORECASE)
    if not match:
        raise ValueError(text)
    number, unit = match.groups()
    value = int(float(number) * _UNITS[unit.upper()])
    if value <= 0:
        raise ValueError(text)
    return value


def _size_or_zero(text: str) -> int:
    """:func:`parse_size`, or 0 for ``"0"`` (none at all)."""
    return 0 if text.strip() == "0" else parse_size(text)


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in options:
            raise ValueError(text)
        return low
    return parse


def _names(text: str) -> frozenset:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def _path(text: str) -> str:
    return os.path.abspath(os.path.expanduser(text))


def parse_store_url(text: str) -> tuple[str, str, str]:
    """A fleet store's URL -> ``("s3", bucket, prefix)`` or ``("file", "", absolute directory)``."""
    import re
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(text.strip())
    if parts.query or parts.fragment:
        raise ValueError(text)
    if parts.scheme == "s3" and re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", parts.netloc):
        return "s3", parts.netloc, parts.path.strip("/")
    if parts.scheme == "file" and parts.netloc in ("", "localhost") and parts.path.startswith("/"):
        return "file", "", os.path.normpath(unquote(parts.path))
    raise ValueError(text)


def _store_url(text: str) -> str:
    """The canonical spelling of a fleet store's URL: ``s3://bucket/prefix`` or ``file:///dir``."""
    scheme, bucket, path = parse_store_url(text)
    return f"s3://{bucket}/{path}".rstrip("/") if scheme == "s3" else "file://" + path


# ---- the table -------------------------------------------------------------------------------------------
class Setting(Frozen):
    """One environment variable: its field on :class:`Settings`, its default and what it accepts.

    ``bad_example`` is a value the parser refuses (None where every string is accepted); the test suite
    sets each one and checks the warning and the default, so a new setting is covered by declaring it.
    ``default_text`` is how the default reads where it is computed (e.g. "half of RAM")."""

    name: str
    attr: str
    default: Any
    accepted: str
    help: str
    parse: Callable[[str], Any]
    bad_example: str | None
    default_text: str
    __slots__ = _fields = _compared = ("name", "attr", "default", "accepted", "help", "parse", "bad_example",
                                       "default_text")
    _hidden = ("parse",)

    def __init__(self, name: str, attr: str, default: Any, accepted: str, help: str, parse: Callable[[str], Any],
                 bad_example: str | None = None, default_text: str = ""):
        for f, v in zip(self._fields, (name, attr, default, accepted, help, parse, bad_example, default_text)):
            object.__setattr__(self, f, v)

    def default_display(self) -> str:
        return self.default_text or ("unset" if self.default is None else _display(self.default))


_SECONDS = "a positive number of seconds, e.g. {name}={default:g}"
_BOOL = "1/0, true/false, yes/no or on/off"

DECLARED: tuple[Setting, ...] = (
    Setting("OVERMIND_RUNTIME_DIR", "runtime_dir", None, "a directory path",
            "the server's directory (socket, lock, log); default $XDG_RUNTIME_DIR/overmind or /tmp/overmind-<uid>",
            _path, default_text="$XDG_RUNTIME_DIR/overmind or /tmp/overmind-<uid>"),
    Setting("OVERMIND_MAX_BYTES", "max_bytes", None, "a size in bytes with an optional K, M, G or T suffix, "
            "e.g. OVERMIND_MAX_BYTES=8G", "the server's memory budget for entries", parse_size, "lots",
            default_text="half of RAM"),
    Setting("OVERMIND_REPLY_TIMEOUT", "reply_timeout", 10.0, _SECONDS.format(name="OVERMIND_REPLY_TIMEOUT", default=10),
            "how long a client waits for any one answer of the server", parse_seconds, "abc"),
    Setting("OVERMIND_CONTROL_TIMEOUT", "control_timeout", 2.0,
            _SECONDS.format(name="OVERMIND_CONTROL_TIMEOUT", default=2),
            "how long the overmind command (status, ls, evict, stop, doctor) waits for an answer of the server",
            parse_seconds, "soon"),
    Setting("OVERMIND_WAIT_TIMEOUT", "wait_timeout", 900.0, _SECONDS.format(name="OVERMIND_WAIT_TIMEOUT", default=900),
            "how long a load waits on another process loading the same thing", parse_seconds, "abc"),
    Setting("OVERMIND_SERVER_START_TIMEOUT", "server_start_timeout", 15.0,
            _SECONDS.format(name="OVERMIND_SERVER_START_TIMEOUT", default=15),
            "how long the launcher waits for a new server to accept connections", parse_seconds, "-1"),
    Setting("OVERMIND_HELLO_TIMEOUT", "hello_timeout", 10.0, _SECONDS.format(name="OVERMIND_HELLO_TIMEOUT", default=10),
            "server: a connection must say hello this soon", parse_seconds, "0"),
    Setting("OVERMIND_IDLE_TIMEOUT", "idle_timeout", 600.0, _SECONDS.format(name="OVERMIND_IDLE_TIMEOUT", default=600),
            "server: an idle connection is closed after this long", parse_seconds, "soon"),
    Setting("OVERMIND_FRAME_TIMEOUT", "frame_timeout", 30.0, _SECONDS.format(name="OVERMIND_FRAME_TIMEOUT", default=30),
            "server: a request begun must be complete this soon", parse_seconds, "inf"),
    Setting("OVERMIND_STRICT", "strict", False, _BOOL,
            "raise CacheBypassed instead of warning when a load cannot be cached (tests, debugging)",
            parse_bool, "maybe"),
    Setting("OVERMIND_DISABLE", "disable", False, _BOOL, "make every load a plain call and activate() a no-op",
            parse_bool, "sometimes"),
    Setting("OVERMIND_DISABLED_ADAPTERS", "disabled_adapters", frozenset(), "adapter names separated by commas",
            "adapters not to activate", _names),
    Setting("OVERMIND_ZEROCOPY", "zerocopy", "auto", "c, python or auto",
            "the buffer-to-storage implementation: the compiled extension, its pure-Python twin, or the first "
            "that imports", _choice("auto", "c", "python"), "fortran"),
    Setting("OVERMIND_PROGRESS", "progress", True, _BOOL,
            "show a progress bar on a terminal for a publish longer than OVERMIND_PROGRESS_DELAY "
            "(HF_HUB_DISABLE_PROGRESS_BARS=1 turns it off too)", parse_bool, "loud"),
    Setting("OVERMIND_PROGRESS_DELAY", "progress_delay", 3.0,
            _SECONDS.format(name="OVERMIND_PROGRESS_DELAY", default=3),
            "how long a publish runs before its progress bar shows", parse_seconds, "later"),
    Setting("OVERMIND_FILE_REFERENCES", "file_references", True, _BOOL,
            "a storage that is an untouched private mapping of a checkpoint file (a lazy safetensors load) is "
            "referenced in that file, not copied into shared memory", parse_bool, "maybe"),
    Setting("OVERMIND_PINNED_COPIES", "pinned_copies", False, _BOOL,
            "with a CUDA build of torch, copy a hit's weights to a GPU (module.to('cuda'), a cached GPU load) from a "
            "read-only shared mapping of the entry pinned with the driver: pinned rate, no private copy; off by "
            "default: registration's cost varies by machine (docs/benchmarks.md, On a GPU)", parse_bool, "fast"),
    Setting("OVERMIND_DEDUP", "dedup", True, _BOOL,
            "a storage of 64 KiB or more whose bytes an entry already holds is referenced there, not written again "
            "(found by a sampled hash, confirmed by a byte compare)", parse_bool, "twice"),
    Setting("OVERMIND_WRITE_ONCE", "write_once", True, _BOOL,
            "a miss's CPU allocations of 1 MiB or more (an fp32 checkpoint's tensors converted to fp16) are made in "
            "the memory that becomes its entry, so they are written once instead of copied (needs overmind.native._C)",
            parse_bool, "never"),
    Setting("OVERMIND_ADMIT", "admit", "reuse", "reuse or first",
            "when a load publishes its entry: reuse (the first load of a key in the server's life returns the plain "
            "result and leaves a mark; the next load, or one that waited on the first, publishes) or first (every "
            "miss publishes; 'overmind warm' runs a program so)", _choice("reuse", "first"), "always"),
    Setting("OVERMIND_LOG_MAX_BYTES", "log_max_bytes", 16 << 20, "a size in bytes with an optional K, M, G or T "
            "suffix, e.g. OVERMIND_LOG_MAX_BYTES=16M", "server: the log rotates at this size (3 old logs kept)",
            parse_size, "big", default_text="16M"),
    # overmind run (overmind.runner): the warm interpreter templates.
    Setting("OVERMIND_RUN_DISABLE", "run_disable", False, _BOOL, "make 'overmind run' start a plain interpreter",
            parse_bool, "perhaps"),
    Setting("OVERMIND_PRELOAD", "preload", None, "module names separated by commas ('+a,b' adds to the defaults)",
            "what 'overmind run' templates import ahead of the program", str),
    Setting("OVERMIND_TEMPLATE_START_TIMEOUT", "template_start_timeout", 600.0,
            _SECONDS.format(name="OVERMIND_TEMPLATE_START_TIMEOUT", default=600),
            "how long 'overmind run' waits for a new template", parse_seconds, "slow"),
    Setting("OVERMIND_TEMPLATE_IDLE", "template_idle", 3600.0,
            _SECONDS.format(name="OVERMIND_TEMPLATE_IDLE", default=3600),
            "a template unused this long exits", parse_seconds, "forever"),
    Setting("OVERMIND_TEMPLATE_OBJECTS", "template_objects", 256 << 20, "a size in bytes with an optional K, M, G "
            "or T suffix, e.g. OVERMIND_TEMPLATE_OBJECTS=512M; 0 builds none",
            "how much of the entries its children use an 'overmind run' template rebuilds ahead (skeleton bytes)",
            _size_or_zero, "plenty"),
    Setting("OVERMIND_SERVE_TEMPLATE", "serve_template", True, _BOOL,
            "'overmind serve' also starts this interpreter's 'overmind run' template", parse_bool, "sure"),
    # the fleet (overmind.fleet): nodes sharing entries through a store.
    Setting("OVERMIND_FLEET", "fleet", None, "s3://bucket/prefix or file:///absolute/directory",
            "the fleet store: a local miss imports the entry from it, a publish uploads the entry to it (needs "
            "OVERMIND_FLEET_KEY_FILE; S3 credentials and endpoint come from boto3's chain: AWS_ACCESS_KEY_ID, "
            "AWS_ENDPOINT_URL, ...)", _store_url, "ftp://example.com/fleet"),
    Setting("OVERMIND_FLEET_KEY_FILE", "fleet_key_file", None, "a file path",
            "the file holding the fleet key (16 bytes or more) that signs and verifies the fleet's entries: whoever "
            "holds it can run code on every node", _path),
    Setting("OVERMIND_FLEET_TIMEOUT", "fleet_timeout", 30.0, _SECONDS.format(name="OVERMIND_FLEET_TIMEOUT", default=30),
            "how long a request to the fleet store may take to connect, and to each read of its answer",
            parse_seconds, "never"),
)
_BY_NAME = {s.name: s for s in DECLARED}


class Settings(Frozen):
    """The parsed values of :data:`DECLARED` (defaults where unset or bad): one attribute per setting, named by
    its ``attr``, and ``sources``, each variable's name -> where its value came from: "env" or "default"
    ("default (bad value)" when the env's was refused). ``Settings()`` holds every default. Equal when every
    value is (``sources`` aside)."""

    runtime_dir: str | None
    max_bytes: int | None
    reply_timeout: float
    control_timeout: float
    wait_timeout: float
    server_start_timeout: float
    hello_timeout: float
    idle_timeout: float
    frame_timeout: float
    strict: bool
    disable: bool
    disabled_adapters: frozenset
    zerocopy: str
    progress: bool
    progress_delay: float
    file_references: bool
    pinned_copies: bool
    dedup: bool
    write_once: bool
    admit: str
    log_max_bytes: int
    run_disable: bool
    preload: str | None
    template_start_timeout: float
    template_idle: float
    template_objects: int
    serve_template: bool
    fleet: str | None
    fleet_key_file: str | None
    fleet_timeout: float
    sources: Mapping[str, str]
    _compared = tuple(s.attr for s in DECLARED)
    __slots__ = _fields = (*_compared, "sources")
    _hidden = ("sources",)

    def __init__(self, sources: Mapping[str, str] | None = None, **values: Any):
        unknown = set(values) - set(self._compared)
        if unknown:
            raise TypeError(f"Settings() got unexpected keyword arguments {sorted(unknown)}")
        for s in DECLARED:
            object.__setattr__(self, s.attr, values.get(s.attr, s.default))
        object.__setattr__(self, "sources", {} if sources is None else sources)


class Problem(Frozen):
    """A declared variable whose value was refused."""

    name: str
    value: str
    accepted: str
    __slots__ = _fields = _compared = ("name", "value", "accepted")

    def __init__(self, name: str, value: str, accepted: str):
        for f, v in zip(self._fields, (name, value, accepted)):
            object.__setattr__(self, f, v)

    def sentence(self) -> str:
        s = _BY_NAME[self.name]
        return (f"overmind: {self.name}={self.value!r} is not {s.accepted}; using the default "
                f"({s.default_display()}). Fix or unset {self.name}.")


# ---- reading ---------------------------------------------------------------------------------------------
_lock = _thread.allocate_lock()
_snapshot: tuple | None = None
_parsed: Settings | None = None
_problems: tuple[Problem, ...] = ()
_warned: set[tuple[str, str]] = set()
_quiet = _thread._local()


# The declared names as ``os.environ`` keys its own mapping (bytes, fsencoded, on POSIX). :func:`current` runs at
# every load: its check for a change reads those with one dict lookup each (~2 us for all of them), not through
# the decoding ``os.environ.get`` (~40 us).
_ENV_KEYS = tuple(os.fsencode(s.name) for s in DECLARED) if os.name == "posix" else ()


def _raw(env: Mapping[str, str]) -> tuple:
    """The declared variables' values in ``env``, as a tuple that changes exactly when one of them does."""
    data = getattr(env, "_data", None) if env is os.environ and _ENV_KEYS else None
    if type(data) is dict:
        return tuple(map(data.get, _ENV_KEYS))
    return tuple(env.get(s.name) for s in DECLARED)


def parse(env: Mapping[str, str]) -> tuple[Settings, tuple[Problem, ...]]:
    """The settings in ``env`` and the values refused (no warning: :func:`current` warns)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    bad: list[Problem] = []
    for s in DECLARED:
        raw = env.get(s.name)
        if raw is None or not raw.strip():
            values[s.attr], sources[s.name] = s.default, "default"
            continue
        try:
            values[s.attr], sources[s.name] = s.parse(raw.strip()), "env"
        except (ValueError, OverflowError):
            values[s.attr], sources[s.name] = s.default, "default (bad value)"
            bad.append(Problem(s.name, raw, s.accepted))
    return Settings(**values, sources=sources), tuple(bad)


def current() -> Settings:
    """This process's settings; warns once for each refused value (see the module docstring)."""
    global _snapshot, _parsed, _problems
    snap = _raw(os.environ)
    if snap != _snapshot or _parsed is None:
        with _lock:
            _parsed, _problems = parse(os.environ)
            _snapshot = snap
    if _problems and not getattr(_quiet, "on", False):
        for p in _problems:
            if (p.name, p.value) not in _warned:
                _warned.add((p.name, p.value))
                _warn(p.sentence())
    return _parsed


class quiet:
    """``with quiet()``: read the settings without warning about them (``overmind doctor`` reports them as checks);
    the warning then comes at the first read outside this block. (A class, not contextlib's generator: the launcher
    reads settings and does without contextlib.)"""

    def __enter__(self) -> None:
        self._before = getattr(_quiet, "on", False)
        _quiet.on = True

    def __exit__(self, *exc_info: object) -> None:
        _quiet.on = self._before


def _warn(message: str) -> None:
    from ._util.user_frame import OvermindWarning, warn_at_user_line

    warn_at_user_line(OvermindWarning(message))


def reload() -> Settings:
    """Forget what was parsed and warned; parse the environment again (for tests)."""
    global _snapshot, _parsed
    with _lock:
        _snapshot, _parsed = None, None
        _warned.clear()
    return current()


def problems() -> tuple[Problem, ...]:
    """The values of the current environment that were refused (read quietly: no warning)."""
    with quiet():
        current()
    return _problems


def describe() -> list[dict[str, Any]]:
    """One row per declared setting: name, value (as text), source, default, accepted form, help."""
    with quiet():
        st = current()
    rows = []
    for s in DECLARED:
        value = getattr(st, s.attr)
        rows.append({"name": s.name, "value": _display(value) if value is not None else s.default_display(),
                     "raw": os.environ.get(s.name), "source": st.sources.get(s.name, "default"),
                     "default": s.default_display(), "accepted": s.accepted, "help": s.help})
    return rows


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the declared variables whose values are refused (a server started with it uses the
    defaults the client already warned about, instead of failing on them)."""
    _, bad = parse(env)
    refused = {p.name for p in bad}
    return {k: v for k, v in env.items() if k not in refused}


def _display(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, frozenset):
        return ",".join(sorted(value)) or "none"
    return str(value)


def _check_table() -> None:
    names = set(Settings.__annotations__) - {"sources"}  # what type checkers know of Settings' attributes
    attrs = {s.attr for s in DECLARED}
    assert names == attrs, f"Settings' annotations and DECLARED differ: {names ^ attrs}"


_check_table()
