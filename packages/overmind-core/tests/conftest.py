"""Shared fixtures for overmind-core tests: sealed memfds and the zero-copy implementation switch (``impl``:
every test that takes it runs on ``overmind.native._C`` and on the pure-Python twin; the compiled run is skipped only
when the extension does not import here).

A private runtime directory and its server is the one fixture every suite uses, ``overmind_runtime`` (from the
pytest plugin ``overmind.testing``, which adapter authors use too): a short directory under /tmp (Unix socket
paths are limited to 108 bytes), exported as ``OVERMIND_RUNTIME_DIR`` so every client and server the test
starts uses it; at teardown its server is stopped and any server process still running for it is killed.
"""
from __future__ import annotations

import fcntl
import os

import pytest

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK


@pytest.fixture
def sealed_memfd():
    """Factory: ``sealed_memfd(data, seal=True) -> fd`` of a memfd holding ``data``, sealed (by default
    against writes and resizing) as the cache writer leaves entries; closed at teardown unless the test
    closed it first."""
    made: list[tuple[int, tuple[int, int]]] = []

    def make(data: bytes, seal: bool = True, seals: int = SEALS) -> int:
        fd = os.memfd_create("overmind-test", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        st = os.fstat(fd)
        made.append((fd, (st.st_dev, st.st_ino)))
        os.write(fd, data)
        if seal:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & seals == seals
        return fd

    yield make
    for fd, identity in made:
        # A test may close its memfd early; the number may since name another file, which is not ours to close.
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == identity:
            os.close(fd)


@pytest.fixture(scope="session")
def compiled_function():
    """``compiled_function(name)``: that function of ``overmind.native._C``; skips the test when the extension does not
    import here, or was built before it had ``name``."""
    def get(name: str):
        problem = _extension_problem()
        if problem:
            pytest.skip(f"overmind.native._C does not import here ({problem})")
        from overmind.native import _C

        if not hasattr(_C, name):
            pytest.skip(f"overmind.native._C predates {name}: rebuild it with scripts/setup")
        return getattr(_C, name)

    return get


def _extension_problem() -> str | None:
    try:
        import overmind.native._C  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.fixture
def extension_problem() -> str | None:
    """Why ``overmind.native._C`` does not import here (``"ImportError: ..."``), or None when it does."""
    return _extension_problem()


@pytest.fixture(params=["c", "python"])
def impl(request, monkeypatch):
    """Select one implementation through OVERMIND_ZEROCOPY, as a user would; restore the default after."""
    from overmind.native import zerocopy

    problem = _extension_problem() if request.param == "c" else None
    if problem:
        pytest.skip(f"overmind.native._C does not import here ({problem})")
    monkeypatch.setenv(zerocopy.ENV, request.param)
    assert zerocopy._select() == request.param
    yield request.param
    monkeypatch.undo()
    zerocopy._select()
