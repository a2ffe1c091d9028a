"""How Overmind steps aside: one warning per user call (:class:`LoaderRun`) naming the cause and the fix
(:func:`fix_for`), or an exception in strict mode; the strict and disable switches.

``OVERMIND_STRICT=1`` turns every fallback into an error (tests, debugging); ``OVERMIND_DISABLE=1`` makes
``load`` a plain call (both read through :mod:`.settings`, so ``yes``/``true``/``on`` work too).

One user call warns once: everything a patched ``from_pretrained`` does, the loads nested in it included (a
pipeline loading its components, an Auto class calling the concrete class), is one :func:`user_call`; its
first fallback warns, the later ones go to the ``overmind`` logger. A load nested in another that could not
be cached warns, and the outer load failing for the same cause does not warn again (:class:`LoaderRun`).

Every warning points at the user's own line (:func:`warn_at_user_line`): the first frame outside Overmind,
its adapters and the libraries they patched, so ``python -W error`` and warning filters by module work as
they do for the library's own warnings.
"""
from __future__ import annotations

import contextlib
import threading

from ._util import interrupts
from ._util.lazy_logger import logger
from ._util.user_frame import OvermindWarning, warn_at_user_line  # noqa: F401 - re-exported: fallback.OvermindWarning
from .errors import OvermindError, ServerError, ServerUnavailable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator

log = logger("overmind")  # imports logging when it first logs: activate() imports this module
_local = threading.local()


class CacheBypassed(OvermindError, RuntimeError):
    """Raised instead of :class:`OvermindWarning` when ``OVERMIND_STRICT=1``."""


def strict() -> bool:
    from .settings import current

    return current().strict


def disabled() -> bool:
    from .settings import current

    return current().disable


@contextlib.contextmanager
def user_call() -> Iterator[None]:
    """The extent of one call of the user's into Overmind (nested loads included): it warns at most once."""
    depth = getattr(_local, "depth", 0)
    if depth == 0:
        _local.warned = False
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def step_aside(message: str, cause: BaseException | None = None, stacklevel: int = 3) -> None:
    """Warn once for this user call (or raise under ``OVERMIND_STRICT=1``); ``stacklevel`` is ignored: the
    warning points at the user's line (:func:`warn_at_user_line`). A ``cause`` that is (or carries) the exception
    of the user's signal handler is raised instead: the user's deadline is never a reason to step aside
    (:mod:`.interrupts`)."""
    if cause is not None:
        interrupts.raise_users(cause)
    if strict():
        raise CacheBypassed(message) from cause
    log.info("fallback: %s", message.removeprefix("overmind: "))
    if getattr(_local, "depth", 0) and getattr(_local, "warned", False):
        log.info("%s (this call already warned once)", message.removeprefix("overmind: "))
        return
    _local.warned = True
    warn_at_user_line(OvermindWarning(message))


def brief(e: BaseException) -> str:
    """``e``'s first line without the ``overmind:`` prefix, for a one-line warning that quotes it."""
    text = str(e).strip()
    return (text.splitlines() or [""])[0].removeprefix("overmind: ")


def server_unavailable(name: str, e: BaseException) -> None:
    """Say that ``name`` loaded without the cache because no server answered (``e`` says why), or raise when
    strict: the same words whether the load found no server before its loader ran or only at its publish."""
    step_aside(f"overmind: the server is unavailable ({brief(e)}); loaded {name} without the cache. "
               f"Run 'overmind doctor'.", e)


def fix_for(e: BaseException) -> str:
    """The advice a "could not cache" warning ends with; empty where the error's own message already says
    what to do (an exception with ``has_fix``, such as every ``PicklingFailed``; the server's budget refusal,
    which names ``OVERMIND_MAX_BYTES`` and ``overmind evict``)."""
    if getattr(e, "has_fix", False):
        return ""
    if isinstance(e, ServerError) and e.reason == "budget":
        return ""
    return " Run 'overmind doctor'."


class LoaderRun:
    """One loader run under this thread's claim, for the one-warning-per-user-call rule.

    >>> run = LoaderRun(outermost=not stack)
    >>> result = fn(*args, **kwargs)     # nested loads may warn meanwhile
    >>> run.finished()
    >>> run.not_cached(loader.name, e)   # warns, unless a nested load already warned about type(e)
    """

    def __init__(self, outermost: bool) -> None:
        if outermost or getattr(_local, "causes", None) is None:
            _local.causes = set()  # exception types this thread's loads warned about in this user call
        self._causes: set = _local.causes
        self._before = set(self._causes)
        self._inner: set = set()

    def finished(self) -> None:
        """The loader returned: the causes its nested loads warned about are now known."""
        self._inner = self._causes - self._before

    def not_cached(self, name: str, cause: Exception) -> None:
        """Say that ``name``'s result could not be cached because of ``cause`` (or raise when strict, or raise
        ``cause`` itself where it is the user's signal handler's exception)."""
        interrupts.raise_users(cause)
        if getattr(cause, "by_design", False):  # the adapter never caches such a result: a log line, no warning
            log.info("not caching %s: %s", name, str(cause).removeprefix("overmind: "))
            return
        if type(cause) in self._inner and not strict():
            log.debug("not caching %s either: %s", name, cause)
            return
        self._causes.add(type(cause))
        if isinstance(cause, ServerUnavailable):  # the server this load started for its publish did not come up
            server_unavailable(name, cause)
            return
        step_aside(f"overmind: could not cache {name} ({type(cause).__name__}: {cause}); returned the plain "
                   f"result.{fix_for(cause)}", cause)
