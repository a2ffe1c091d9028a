"""``overmind._util.interrupts``: a signal handler's exception is told from every other, whatever form the handler takes
and however deep Overmind's own errors wrap it; ``suppress`` lets it through and swallows the rest."""
from __future__ import annotations

import contextlib
import functools
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overmind._util import interrupts


class Deadline(Exception):
    pass


def _raise_deadline(*_):
    raise Deadline("the user's")


class _Handler:
    def __call__(self, signum, frame):
        raise Deadline("the user's")

    def method(self, signum, frame):
        raise Deadline("the user's")


def _calls_helper(signum, frame):
    _raise_deadline()  # raised one call below the handler: still the handler's


FORMS = {
    "function": lambda: _raise_deadline,
    "calls a helper": lambda: _calls_helper,
    "bound method": lambda: _Handler().method,
    "partial": lambda: functools.partial(_raise_deadline, "bound"),
    "callable object": lambda: _Handler(),
    "lambda": lambda: (lambda s, f: _raise_deadline()),
}


@contextlib.contextmanager
def usr1_handled_by(handler):
    before = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, before)


def _wrapped(exc: BaseException, depth: int, how: str) -> BaseException:
    """``exc`` as Overmind's own errors carry it ``depth`` levels deep (``raise X from e`` or in its except)."""
    for level in range(depth):
        try:
            try:
                raise exc
            except BaseException as e:
                if how == "from None":
                    raise OSError(f"level {level}") from None
                if how == "from":
                    raise OSError(f"level {level}") from e
                raise OSError(f"level {level}")  # noqa: B904 - the context is what is tested
        except OSError as outer:
            exc = outer
    return exc


@settings(max_examples=60, deadline=None)
@given(form=st.sampled_from(sorted(FORMS)), depth=st.integers(0, 3), how=st.sampled_from(["from", "from None", "in"]))
def test_a_handlers_exception_is_found_however_it_is_carried(form, depth, how):
    with usr1_handled_by(FORMS[form]()):
        try:
            signal.raise_signal(signal.SIGUSR1)
        except Deadline as e:
            users = e
        else:
            pytest.fail("the handler did not raise")
        _check_found(users, _wrapped(users, depth, how))


def _check_found(users: BaseException, carried: BaseException) -> None:
    assert interrupts.users_exception(carried) is users
    with pytest.raises(Deadline) as got:
        interrupts.raise_users(carried)
    assert got.value is users
    with pytest.raises(Deadline) as got, interrupts.suppress(OSError, Deadline):
        raise carried
    assert got.value is users


@settings(max_examples=30, deadline=None)
@given(form=st.sampled_from(sorted(FORMS)), depth=st.integers(0, 3), how=st.sampled_from(["from", "from None", "in"]))
def test_other_exceptions_are_not_the_users(form, depth, how):
    with usr1_handled_by(FORMS[form]()):  # a handler is installed, but it raised none of these
        for exc in (TimeoutError("a socket's own timeout"), Deadline("a plain call's"), OSError(9, "EBADF")):
            try:
                _raise(exc)
            except (Deadline, OSError) as e:
                carried = _wrapped(e, depth, how)
            assert interrupts.users_exception(carried) is None
            interrupts.raise_users(carried)  # returns
            with interrupts.suppress(OSError, Deadline):
                raise carried


def _raise(exc):
    raise exc


def test_no_python_handler_means_nothing_is_the_users():
    with usr1_handled_by(signal.SIG_IGN):
        try:
            _raise(TimeoutError("x"))
        except TimeoutError as e:
            assert interrupts.users_exception(e) is None
    assert interrupts.users_exception(None) is None


def test_an_error_raised_and_caught_in_one_frame_asks_nothing_of_the_signal_module(monkeypatch):
    """The expected failures of the load path (a metadata file that is not there: ~70 of them in activate()) are
    raised by a call in the frame that catches them: no handler ran below, so no handler is looked up."""
    asked = []
    monkeypatch.setattr(interrupts, "_handler_codes", lambda: asked.append(1) or set())
    try:
        open("/nonexistent/overmind-test")
    except OSError as e:
        interrupts.raise_users(e)
    assert asked == []
    try:
        _raise(OSError("one frame below"))
    except OSError as e:
        interrupts.raise_users(e)
    assert asked == [1]


def test_suppress_swallows_only_the_types_it_names_as_contextlib_suppress_does():
    with interrupts.suppress(OSError):
        raise FileNotFoundError("a subclass of a named type: swallowed")
    with interrupts.suppress(OSError, KeyError):
        pass  # nothing raised: nothing to do
    with pytest.raises(ValueError), interrupts.suppress(OSError, KeyError):
        raise ValueError("not named: propagates")
    with pytest.raises(KeyboardInterrupt), interrupts.suppress(Exception):
        raise KeyboardInterrupt
