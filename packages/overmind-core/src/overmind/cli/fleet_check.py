"""``overmind doctor``'s fleet line: whether ``OVERMIND_FLEET`` names a store this process can use
(the key file read, the store answering), checked by asking the store for a reference no entry has.
"""
from __future__ import annotations

from .checks import FAIL, OK, Check

_PROBE = "0" * 64  # a portable key no entry has: the store answers "none", or fails


def check_fleet() -> list[Check]:
    """The fleet's check; none when no fleet is set."""
    from .. import settings
    from ..fleet import config
    from ..fleet.errors import FleetError

    if settings.current().fleet is None:
        return []
    try:
        fleet = config.fleet()
        assert fleet is not None
        fleet.store.get_ref(_PROBE)
    except FleetError as exc:
        return [Check("fleet", FAIL, str(exc).removeprefix("overmind: "),
                      "fix the store or the key; loads run with their loaders (no import, no upload) "
                      "until then")]
    return [Check("fleet", OK, f"{fleet.url} answers; entries signed with the key in "
                               f"{settings.current().fleet_key_file} ({len(fleet.key)} bytes)")]
