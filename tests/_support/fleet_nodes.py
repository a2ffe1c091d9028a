"""Two nodes of a fleet on one machine, for tests: each node is a runtime directory of its own (its
own server), with the fleet's settings (``OVERMIND_FLEET``, ``OVERMIND_FLEET_KEY_FILE``) in the
environment of the processes it runs, and its own copy of the model files (another path, another
mtime, another inode), so that only a portable key can find the other node's entry.

>>> a, b = Node.pair(tmp_path, "file://" + str(tmp_path / "store"))   # doctest: +SKIP
>>> a.run(script); a.wait_uploads(1); b.run(script)                    # doctest: +SKIP
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from overmind.testing import run_fresh, stop_servers


def write_fleet_key(folder: str | os.PathLike) -> str:
    """A fresh fleet key (32 random bytes, hex) in a file readable only by its owner."""
    path = os.path.join(folder, f"fleet-{secrets.token_hex(4)}.key")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def copy_model(source: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """``source``'s files at ``dest``, every mtime another than the source's (a node's own copy)."""
    dest = Path(dest)
    shutil.copytree(source, dest, symlinks=False)
    when = time.time() - 86400 * (1 + secrets.randbelow(300))
    for root, _, files in os.walk(dest):
        for name in files:
            os.utime(os.path.join(root, name), (when, when))
    return dest


class Node:
    """One node: ``runtime`` (its server's folder) and ``env`` (the fleet's settings and the store's
    credentials for its processes)."""

    def __init__(self, name: str, fleet_url: str, key_file: str, store_env: dict | None = None):
        self.name = name
        self.runtime = tempfile.mkdtemp(prefix=f"om-{name}-", dir="/tmp")  # a short socket path
        self.env = {"OVERMIND_RUNTIME_DIR": self.runtime, "OVERMIND_FLEET": fleet_url,
                    "OVERMIND_FLEET_KEY_FILE": key_file, "HF_HUB_OFFLINE": "1", **(store_env or {})}

    @classmethod
    def pair(cls, folder: str | os.PathLike, fleet_url: str, store_env: dict | None = None,
             key_file: str | None = None) -> tuple[Node, Node]:
        """Nodes ``a`` and ``b`` of one fleet (one key)."""
        key_file = key_file or write_fleet_key(folder)
        return cls("a", fleet_url, key_file, store_env), cls("b", fleet_url, key_file, store_env)

    def run(self, script: str, env: dict | None = None, timeout: float = 600) -> Any:
        """``script`` in a fresh process of this node; what it reported."""
        return run_fresh(script, env={**self.env, **(env or {})}, timeout=timeout)

    def run_plain(self, script: str, timeout: float = 600) -> Any:
        """``script`` in a fresh process with Overmind off (the reference)."""
        return run_fresh(script, env={**self.env, "OVERMIND_DISABLE": "1"}, timeout=timeout)

    def status(self) -> dict:
        """The node's server status (``{}`` when none runs)."""
        import overmind

        return dict(overmind.cache_info(self.runtime, processes=False).status)

    def wait_uploads(self, count: int, timeout: float = 120) -> dict:
        """The status once ``count`` uploads are done and none pend; fails on an upload failure."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            assert not st.get("fleet_upload_failures"), f"node {self.name}: an upload failed: {st}"
            if st.get("fleet_uploads", 0) >= count and not st.get("fleet_uploads_pending"):
                return st
            assert time.monotonic() < deadline, f"node {self.name}: {count} uploads not done: {st}"
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the node's server and remove its folder."""
        stop_servers(self.runtime)
        shutil.rmtree(self.runtime, ignore_errors=True)
