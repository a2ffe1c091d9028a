"""The fleet's errors: the store failed (:class:`StoreError`), a blob is absent (:class:`NotInStore`), an entry
was refused (:class:`Refused`, with a short ``reason`` to branch on) or the fleet settings cannot be used
(:class:`FleetConfigError`). Each message names the store and says what to do: they reach the server's log and
the user's warning.
"""
from __future__ import annotations

from ..errors import OvermindError


class FleetError(OvermindError):
    """Base of the fleet's errors."""


class FleetConfigError(FleetError):
    """``OVERMIND_FLEET`` is set but the fleet cannot be used (no key, a key too short, a store that cannot
    be opened); the message names the setting to fix."""


class StoreError(FleetError):
    """The store could not be read or written (down, slow past the timeout, full, no permission)."""

    def __init__(self, url: str, message: str):
        super().__init__(f"fleet store {url}: {message}")
        self.url = url


class NotInStore(FleetError, LookupError):
    """The blob asked for is not in the store."""

    def __init__(self, url: str, name: str):
        super().__init__(f"fleet store {url}: {name} is not in the store")
        self.url = url
        self.name = name


class Refused(FleetError):
    """An entry of the store that must not be imported. ``reason``: ``"malformed"`` (not a manifest),
    ``"unsigned"``, ``"signature"`` (another fleet key, or tampered), ``"foreign"`` (another portable key or
    software stack), ``"digest"`` (a blob's bytes are not what the manifest names), ``"truncated"`` (a blob is
    shorter or longer than the manifest says), ``"missing"`` (a blob the manifest names is not in the store)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
