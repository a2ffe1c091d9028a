"""Shared fixtures for overmind-core tests: a private runtime directory (and its server), sealed memfds.

``runtime_dir`` gives each test its own short directory under /tmp (Unix socket paths are limited to 108
bytes), exported as ``OVERMIND_RUNTIME_DIR`` so every client and server the test starts uses it. At
teardown the directory's server is stopped, and any server process still running for it is killed.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile

import pytest

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK


@pytest.fixture
def runtime_dir(monkeypatch):
    """A fresh runtime directory, set as ``OVERMIND_RUNTIME_DIR``; its server is stopped afterwards."""
    path = tempfile.mkdtemp(prefix="om-", dir="/tmp")
    monkeypatch.setenv("OVERMIND_RUNTIME_DIR", path)
    try:
        yield path
    finally:
        _stop_servers(path)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sealed_memfd():
    """Factory: ``sealed_memfd(data, seal=True) -> fd`` of a memfd holding ``data``; closed at teardown."""
    fds: list[int] = []

    def make(data: bytes, seal: bool = True, seals: int = SEALS) -> int:
        fd = os.memfd_create("overmind-test", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        fds.append(fd)
        os.write(fd, data)
        if seal:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        return fd

    yield make
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _stop_servers(path: str) -> None:
    from overmind.testing import stop_servers

    stop_servers(path)
