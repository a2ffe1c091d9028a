"""``overmind export`` and ``overmind import``: a node's entries as an OCI image layout, and a layout's
entries into this node's fleet store (``overmind.fleet``).

``export (KEY... | --all) DIR`` writes each named entry that has a portable key (published by a
process whose ``OVERMIND_FLEET`` was set) with every entry and checkpoint file it depends on, signed
with the fleet key (``OVERMIND_FLEET_KEY_FILE``), as an OCI image layout that is also a ``file://``
store: a registry client, Dragonfly or an image volume carries it to other nodes. ``import DIR``
verifies each entry of the layout (its signature, this node's stack, every blob's digest) and copies
it into the store ``OVERMIND_FLEET`` names, from which this node's loads import it.

    $ overmind export --all /srv/layout
    exported 3 entries (1.9 GiB) to /srv/layout
    $ OVERMIND_FLEET=file:///var/lib/overmind/fleet overmind import /srv/layout
    imported 3 entries (1.9 GiB) into file:///var/lib/overmind/fleet
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .._util.humanize import human_bytes
from ..errors import OvermindError
from ..server.uploads import FLEET_META  # an entry's meta: its portable key and stack


class FleetUsage(OvermindError, ValueError):
    """An export or import that cannot start: the message says what to set or name."""


def add_parsers(sub: Any) -> None:
    """The ``export`` and ``import`` commands of the ``overmind`` parser."""
    export = sub.add_parser("export", help="write entries, with what they depend on, as an OCI image "
                                           "layout signed with the fleet key")
    export.add_argument("prefixes", nargs="*", metavar="KEY",
                        help="the entries (a unique prefix of an ENTRY of 'overmind ls')")
    export.add_argument("--all", action="store_true", help="every entry that has a portable key")
    export.add_argument("dir", metavar="DIR", help="the layout's folder (created, or added to)")
    export.add_argument("--json", action="store_true", help="print what was exported as JSON")
    export.set_defaults(func=cmd_export)
    imp = sub.add_parser("import", help="verify a layout's entries and copy them into this node's "
                                        "fleet store (OVERMIND_FLEET)")
    imp.add_argument("dir", metavar="DIR", help="an OCI image layout 'overmind export' wrote")
    imp.add_argument("--json", action="store_true", help="print what was imported and refused as JSON")
    imp.set_defaults(func=cmd_import)


def cmd_export(args: argparse.Namespace) -> int:
    from ..client.connection import Client
    from ..client.launcher import accepts
    from ..fleet import oci, transfer
    from ..fleet.dir_store import DirStore
    from ..inspection import resolve
    from ..ipc.protocol import is_file_entry

    if bool(args.prefixes) == bool(args.all):
        print("overmind export: name entries (unique prefixes of an ENTRY of 'overmind ls') or give "
              "--all, not both", file=sys.stderr)
        return 2
    key = _fleet_key()
    client = Client(args.runtime_dir, autostart=False, control=True)
    if not accepts(client.socket_path):
        print(f"no server is running for {client.runtime_dir}: nothing to export", file=sys.stderr)
        return 1
    listing = client.ls_all()
    entries = {e["entry_id"]: e for e in listing["entries"]}
    if args.all:
        chosen = [e for e in entries.values() if isinstance((e.get("meta") or {}).get(FLEET_META), dict)]
    else:
        from ..inspection import cache_info

        known = cache_info(args.runtime_dir, processes=False, control=True).entries
        chosen = [entries[resolve(p, known).entry_id] for p in args.prefixes]
        lacking = [e["key"][:12] for e in chosen if not isinstance(e["meta"].get(FLEET_META), dict)]
        if lacking:
            raise FleetUsage(f"overmind export: {', '.join(lacking)} ha{'s' if len(lacking) == 1 else 've'} no "
                             f"portable key: an entry gets one when the process that publishes it has "
                             f"OVERMIND_FLEET set (a file:// folder will do). Load it again so.")
    store, sent = DirStore(os.path.abspath(args.dir)), 0
    for entry in chosen:
        about = entry["meta"][FLEET_META]
        closure = _closure(entry["entry_id"], entries)
        fds = client.fds([entry["entry_id"], *closure])
        try:
            deps = [(eid, fds[eid], "file" if is_file_entry(eid) else "entry") for eid in closure]
            meta = {k: v for k, v in entry["meta"].items() if k != FLEET_META}
            sent += transfer.upload(store, key, about["portable_key"], about["stack"], entry["entry_id"],
                                    meta, fds[entry["entry_id"]], deps)
        finally:
            for fd in fds.values():
                os.close(fd)
    listed = oci.write_layout(store.root)
    if args.json:
        print(json.dumps({"exported": [e["meta"][FLEET_META]["portable_key"] for e in chosen],
                          "bytes": sent, "layout": store.root, "layout_holds": listed}, indent=2))
    else:
        print(f"exported {len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'} "
              f"({human_bytes(sent)} new) to {store.root}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from ..fleet import config, copying
    from ..fleet.dir_store import DirStore
    from ..fleet.errors import Refused
    from ..keys import portable

    if not os.path.isdir(os.path.join(args.dir, "refs")):
        raise FleetUsage(f"overmind import: {args.dir} is not a layout 'overmind export' wrote (it has no "
                         f"refs/ folder)")
    fleet = config.fleet()
    if fleet is None:
        raise FleetUsage("overmind import: OVERMIND_FLEET is not set; set it to the store this node's loads "
                         "import from (e.g. file:///var/lib/overmind/fleet), or point it at the layout "
                         "itself (file://" + os.path.abspath(args.dir) + ")")
    source, stack = DirStore(os.path.abspath(args.dir)), portable.stack()
    imported: list[str] = []
    refused: list[dict] = []
    copied = 0
    for portable_key in source.refs():
        try:
            copied += copying.copy_entry(source, fleet.store, fleet.key, portable_key, stack)
            imported.append(portable_key)
        except Refused as e:
            refused.append({"portable_key": portable_key, "reason": e.reason, "message": str(e)})
            if not args.json:
                print(f"refused {portable_key[:16]}: {e}", file=sys.stderr)
    if args.json:
        print(json.dumps({"imported": imported, "refused": refused, "bytes": copied,
                          "store": fleet.url}, indent=2))
    else:
        print(f"imported {len(imported)} entr{'y' if len(imported) == 1 else 'ies'} "
              f"({human_bytes(copied)} copied) into {fleet.url}"
              + (f"; refused {len(refused)}" if refused else ""))
    return 1 if refused else 0


def _fleet_key() -> bytes:
    from .. import settings
    from ..fleet import config

    path = settings.current().fleet_key_file
    if path is None:
        raise FleetUsage("overmind export: OVERMIND_FLEET_KEY_FILE is not set; entries are signed with the "
                         "fleet key: set it to the file every node of the fleet reads")
    return config.read_key(path)


def _closure(entry_id: str, entries: dict[str, dict]) -> list[str]:
    """The entries and checkpoint files ``entry_id`` depends on, transitively, each once."""
    order: list[str] = []
    todo = list((entries.get(entry_id) or {}).get("deps") or ())
    while todo:
        eid = todo.pop(0)
        if eid in order:
            continue
        order.append(eid)
        todo.extend((entries.get(eid) or {}).get("deps") or ())
    return order
