"""The user's interrupt is not Overmind's failure: an exception a signal handler raised (a SIGALRM deadline's
``TimeoutError``, the user's own ``Exception``) is told from Overmind's and the OS's by the handler's frame in its
traceback, and propagates from every ``except`` of the load path (:func:`raise_users`, :func:`suppress`).

A Python signal handler runs between two bytecodes of whatever the main thread executes, Overmind's own code
included, and what it raises surfaces there: a SIGALRM handler's ``TimeoutError`` (an ``OSError``) comes out of a
``connect`` whose ``OSError`` Overmind answers with "no server", a user's ``Exception`` subclass comes out of a step
whose failure Overmind answers with the plain loader. Such an exception is the user's deadline: it must reach the
user at once, unchanged, never be taken for a syscall's error or a reason to step aside.

An exception raised by a handler (or by a function it calls) has the handler's frame in its traceback; none of
Overmind's own errors has. :func:`users_exception` looks for one in an exception and in the exceptions it was
raised from or while handling (``raise ServerUnavailable(...) from e``). Every ``except`` in the code a load runs
that catches ``OSError`` or ``Exception`` and does not re-raise begins with :func:`raise_users` (a test holds
the package to it), and :func:`suppress` replaces ``contextlib.suppress`` there.

``KeyboardInterrupt`` (``signal.default_int_handler``, a C function) is no ``Exception``: nothing here catches it.
"""
from __future__ import annotations

import _signal  # signal's C half: signal.getsignal converts every answer to an enum (~0.4 ms a call)
from types import CodeType, FunctionType, MethodType, TracebackType

# (Neither contextlib nor functools nor collections.abc at import: the launcher of ``overmind run`` imports this
# module, and those cost it ~3 ms.)


def _code_of(handler: object) -> CodeType | None:
    """The code object a Python-level signal handler runs, through methods, partials and callable objects."""
    import functools

    for _ in range(8):
        if isinstance(handler, functools.partial):
            handler = handler.func
        elif isinstance(handler, MethodType):
            handler = handler.__func__
        elif isinstance(handler, FunctionType):
            return handler.__code__
        elif callable(handler) and isinstance(type(handler).__call__, FunctionType):  # an object with __call__
            handler = type(handler).__call__
        else:  # SIG_DFL, SIG_IGN, None, or a C function such as signal.default_int_handler
            return None
    return None


def _handler_codes() -> set[CodeType]:
    codes = set()
    for sig in _signal.valid_signals():
        try:
            handler = _signal.getsignal(sig)
        except (ValueError, OSError):  # a signal this platform lists but Python does not handle
            continue
        code = _code_of(handler) if callable(handler) else None
        if code is not None:
            codes.add(code)
    return codes


def _raised_in(tb: TracebackType | None, codes: set[CodeType]) -> bool:
    tb = tb.tb_next if tb is not None else None  # the first entry is the frame that caught it: never the handler
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def users_exception(exc: BaseException | None) -> BaseException | None:
    """The exception a signal handler of this process raised, if ``exc`` is one or was raised from (or while
    handling) one; None for Overmind's own failures, the OS's and the libraries'."""
    if exc is None:
        return None
    codes = None
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        # One entry: raised and caught in the same frame (a syscall's error), so no handler ran below it. That is
        # every expected failure (a file that is not there), and it asks nothing of the signal module.
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is not None:
            if codes is None:
                codes = _handler_codes()
                if not codes:  # no Python handler installed: nothing here can be one's
                    return None
            if _raised_in(tb, codes):
                return exc
        exc = exc.__cause__ or exc.__context__
    return None


def raise_users(exc: BaseException) -> None:
    """Raise the user's signal-handler exception that ``exc`` is or carries; return when there is none. The first
    statement of an ``except`` that would otherwise swallow ``exc`` or answer it with a fallback."""
    users = users_exception(exc)
    if users is exc:
        raise users
    if users is not None:  # carried by Overmind's own error: the user sees theirs, with their cause, not ours
        raise users from users.__cause__


class suppress:
    """``contextlib.suppress(*types)``, except for a signal handler's exception, which propagates."""

    def __init__(self, *types: type[BaseException]) -> None:
        self._types = types

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None or not issubclass(kind, self._types):  # type: ignore[arg-type]
            return False
        raise_users(exc)
        return True
