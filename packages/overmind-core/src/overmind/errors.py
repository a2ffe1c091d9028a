"""The exception tree: :class:`OvermindError` at its root, and the errors several parts raise or catch
(``Unkeyable``, ``PicklingFailed``, ``ServerUnavailable``, ...).

Every exception Overmind raises on purpose derives from :class:`OvermindError` (``except
OvermindError`` catches them all); one that also means a builtin category keeps it as a second base
(``PatchError`` is a ``RuntimeError`` too). ``Unkeyable`` lives here because the key's walk (canon),
the file fingerprints and the hooks all raise or catch it (an adapter raises it as
``overmind.adapter.Uncacheable``); ``PicklingFailed`` because the adapters catch it too;
``NotCacheable`` and ``NotCachedByDesign`` because adapters raise them and the fallback reads them.
The others live beside what raises them: ``PatchError`` (adapters.patching), ``AdapterError``
(adapters.discovery), ``CacheBypassed`` (fallback), ``LayoutError`` (shm.layout),
``ArgumentMismatch`` (entries.arguments_ref), ``ExtensionUnavailable`` (native.zerocopy),
``StoreError`` and ``NotSealed`` (server). The public ones are exported from ``overmind``.

Every message says what happened, why, and what to do, because these reach the user's terminal through
``overmind.load`` warnings and the ``overmind`` command.
"""
from __future__ import annotations


class OvermindError(Exception):
    """Base class of every error Overmind raises on purpose."""


class ServerUnavailable(OvermindError, ConnectionError):
    """The server cannot be reached or started (nothing listens, it died, or it failed to start)."""


class ServerError(OvermindError):
    """The server answered a request with ``ok: false``; the message is the server's sentence.

    ``reason`` carries the short machine-readable cause when the server gave one (e.g. ``"not sealed"``,
    ``"dep missing"``, ``"budget"``), so callers can branch without parsing text.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class ProtocolMismatch(OvermindError):
    """Client and server speak different protocol versions (usually an old server still running)."""


class RuntimeDirError(OvermindError):
    """The runtime directory is unsafe (wrong owner or permissions) or cannot be created."""


class Unkeyable(OvermindError):
    """An argument (or the loader) cannot be turned into a stable key; the message says which and why."""


class PicklingFailed(OvermindError):
    """Neither pickle nor dill could pickle the result; the message names the object and both errors."""

    has_fix = True  # the message says what to do (a reducer); the fallback adds no advice of its own

    def __init__(self, obj: object, dill_error: Exception, pickle_error: Exception):
        super().__init__(
            f"cannot pickle {type(obj).__module__}.{type(obj).__qualname__}: pickle said "
            f"{type(pickle_error).__name__}: {pickle_error}; dill said {type(dill_error).__name__}: {dill_error}. "
            f"An adapter can add a reducer for the offending type (hook overmind_reducers)."
        )


class NotCacheable(OvermindError, RuntimeError):
    """An adapter's word that the loaded object cannot be cached, raised while a result is readied
    for pickling: the user keeps the object, and the message, which says why and what to do, is the
    one warning."""

    has_fix = True  # the core adds no generic advice after this message


class NotCachedByDesign(NotCacheable):
    """The loaded object is one the adapter never caches, by design (a model dispatched over devices
    with disk offload): the call is logged at INFO with the message, never warned, even under
    ``OVERMIND_STRICT=1``. A warning is for a fault the user can act on; a refusal by design is not.

    >>> raise NotCachedByDesign(f"{label('mylib')}: {loader.name} returned a model offloaded to disk")
    """

    by_design = True  # what overmind.fallback reads
