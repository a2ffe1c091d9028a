"""``_util/quiet_warnings.quiet`` drops the warnings of the thread inside it and no other's, raises none that an
"error" filter names, notes none in a registry, and leaves ``warnings.filters`` as it found them."""
from __future__ import annotations

import threading
import warnings

import pytest

from overmind._util import quiet_warnings


def test_only_the_thread_inside_is_quiet():
    inside, warned = threading.Event(), threading.Event()

    def other():
        inside.wait(10)
        warnings.warn("another thread's", UserWarning, stacklevel=1)
        warned.set()

    thread = threading.Thread(target=other)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        thread.start()
        with quiet_warnings.quiet():
            with quiet_warnings.quiet():  # nests
                inside.set()
                assert warned.wait(10)
                warnings.warn("Overmind's own", UserWarning, stacklevel=1)
            warnings.warn("Overmind's own, outer block", UserWarning, stacklevel=1)
            assert quiet_warnings.active()
        thread.join()
        assert not quiet_warnings.active()
        assert list(warnings.filters) == before
        warnings.warn("the user's own", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another thread's", "the user's own"]


def test_an_error_filter_raises_nothing_inside_and_no_registry_notes_it():
    registry = globals().setdefault("__warningregistry__", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with quiet_warnings.quiet():
            warnings.warn("inside", UserWarning, stacklevel=1)
        assert not [k for k in registry if k != "version"]
        with pytest.raises(UserWarning, match="outside"):
            warnings.warn("outside", UserWarning, stacklevel=1)


def test_the_python_twin_leaves_the_registries_as_they_were(monkeypatch):
    """A storage over a read-only buffer (torch warns that it is not writable, every time) forgets no warning a
    "default" filter already showed once."""
    from overmind.native import zerocopy

    monkeypatch.setenv(zerocopy.ENV, "python")
    zerocopy._select()
    shown = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = lambda message, *rest, **kw: shown.append(str(message))
            for _ in range(2):
                warnings.warn("once at this line", UserWarning, stacklevel=1)
                storage = zerocopy.storage_from_buffer(b"read-only bytes")
        assert shown == ["once at this line"]
        assert bytes(storage) == b"read-only bytes"
    finally:
        monkeypatch.undo()
        zerocopy._select()
