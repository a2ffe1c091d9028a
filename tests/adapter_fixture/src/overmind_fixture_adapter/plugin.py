"""The fixture library's adapter: one patch target, one reducer, entry metadata.

Written as a third party would, against the adapter kit alone (``overmind.adapter``).
"""
from __future__ import annotations

import os

from overmind.adapter import PatchTarget, hookimpl


@hookimpl
def overmind_patch_targets():
    from . import lib

    return [PatchTarget(lib.Model, "from_pretrained", kind="classmethod")]


def _rebuild_handle(name):
    from .lib import Handle

    return Handle(name)


@hookimpl
def overmind_reducers():
    from .lib import Handle

    return {Handle: lambda h: (_rebuild_handle, (h.name,))}


@hookimpl
def overmind_entry_metadata(result, loader):
    return {"fixture_loader": loader.name}


@hookimpl
def overmind_before_unpickle(metadata):
    log = os.environ.get("FIXTURE_UNPICKLE_LOG")
    if log and "fixture_loader" in metadata:
        with open(log, "a") as f:
            f.write(metadata["fixture_loader"] + "\n")
