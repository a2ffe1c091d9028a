"""The fleet this process belongs to, from its settings: ``OVERMIND_FLEET`` (the store),
``OVERMIND_FLEET_KEY_FILE`` (the key) and ``OVERMIND_FLEET_TIMEOUT``; and :func:`open_store`, a store by its URL.

>>> f = fleet()                 # None: OVERMIND_FLEET is unset (or not a store URL, which warned)
>>> f.url, f.store.refs()[:1]
('s3://models/fleet', ['3f2a...'])
>>> open_store("file:///srv/exported", timeout=30).refs()     # an exported layout, for 'overmind import'

A fleet without a usable key is refused (:class:`~overmind.fleet.errors.FleetConfigError`) rather than run
unsigned: the key is what keeps a node from unpickling what anyone with write access to the store put there.
The fleet is built once per combination of settings and key file (opening an S3 store costs boto3's import and
a client, ~0.1 s); a changed key file is read again.
"""
from __future__ import annotations

import os
import threading
from typing import NamedTuple

from .. import settings
from .._util import interrupts
from .errors import FleetConfigError, StoreError
from .stores import Store

MIN_KEY_BYTES = 16


class Fleet(NamedTuple):
    """``url``: the store's URL as configured; ``store``: the open store; ``key``: the fleet key's bytes."""

    url: str
    store: Store
    key: bytes


_lock = threading.Lock()
_cached: tuple[tuple, Fleet] | None = None


def fleet() -> Fleet | None:
    """This process's fleet, or None when ``OVERMIND_FLEET`` is unset. Raises
    :class:`~overmind.fleet.errors.FleetConfigError` when it is set but has no usable key."""
    global _cached
    st = settings.current()
    if st.fleet is None:
        return None
    key_file = st.fleet_key_file
    if key_file is None:
        raise FleetConfigError(f"overmind: OVERMIND_FLEET={st.fleet} is set but OVERMIND_FLEET_KEY_FILE is not; "
                               "set it to a file holding the fleet key (the same on every node, 16 bytes or more, "
                               "e.g. made with 'head -c 32 /dev/urandom > FILE'). The fleet is off until then.")
    try:
        stat = os.stat(key_file)
    except OSError as exc:
        interrupts.raise_users(exc)
        raise _unreadable(st.fleet, key_file, exc) from exc
    identity = (st.fleet, key_file, st.fleet_timeout, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _lock:
        if _cached is not None and _cached[0] == identity:
            return _cached[1]
        key = read_key(key_file, st.fleet)
        try:
            built = Fleet(st.fleet, open_store(st.fleet, st.fleet_timeout), key)
        except StoreError as exc:
            raise FleetConfigError(f"overmind: {exc}. The fleet is off until then.") from exc
        _cached = (identity, built)
        return built


def read_key(path: str, url: str = "the fleet") -> bytes:
    """The fleet key in the file ``path``: its bytes, without surrounding whitespace (an editor's newline)."""
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as exc:
        interrupts.raise_users(exc)
        raise _unreadable(url, path, exc) from exc
    if len(key) < MIN_KEY_BYTES:
        raise FleetConfigError(f"overmind: the fleet key in OVERMIND_FLEET_KEY_FILE={path} has {len(key)} bytes; "
                               f"it needs {MIN_KEY_BYTES} or more (e.g. 'head -c 32 /dev/urandom > {path}'). "
                               f"The fleet {url} is off until then.")
    return key


def open_store(url: str, timeout: float) -> Store:
    """The store at ``url`` (``s3://bucket/prefix`` or ``file:///dir``); ``timeout``: seconds to connect and
    for each read of an S3 store. Opening contacts nothing; the first operation does."""
    try:
        scheme, bucket, path = settings.parse_store_url(url)
    except ValueError:
        raise ValueError(f"{url!r} is not a fleet store URL: s3://bucket/prefix or "
                         "file:///absolute/directory") from None
    if scheme == "file":
        from .dir_store import DirStore

        return DirStore(path)
    from .s3_store import S3Store

    try:
        return S3Store(bucket, path, timeout)
    except ImportError as exc:
        raise StoreError(url, f"boto3 does not import ({exc}); install it: pip install boto3") from exc


def _unreadable(url: str, path: str, exc: OSError) -> FleetConfigError:
    return FleetConfigError(f"overmind: cannot read the fleet key OVERMIND_FLEET_KEY_FILE={path} "
                            f"({exc.strerror or exc}); make it readable by this user. The fleet {url} is off "
                            "until then.")
