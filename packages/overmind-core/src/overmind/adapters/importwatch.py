"""Post-import hooks: run a callback right after a module (top-level or a submodule) has finished importing.

``overmind.activate()`` must not import every library an installed adapter supports (diffusers alone
takes seconds to import): an adapter whose library is not imported yet is applied the moment it is. Nor may
it import a costly submodule the user never imports (diffusers' ``auto_pipeline`` imports every pipeline):
such loaders are patched the moment the user imports their module.

>>> when_imported("diffusers", lambda module: print("patch", module.__name__))
>>> when_imported("diffusers.pipelines.auto_pipeline", lambda module: print("patch", module.__name__))

``import overmind`` waits on torch's import here (``loading/draws/seeding.py``), and ``overmind run``'s launcher
imports ``overmind``: so this module imports neither ``threading`` nor ``importlib.util`` (with what they import,
milliseconds of a launch); ``_thread``'s lock and the other finders on ``sys.meta_path`` do their work.
"""
from __future__ import annotations

import _thread
import sys
from types import ModuleType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

_lock = _thread.RLock()
_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
_busy: set[str] = set()


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once module ``name`` is imported (now, if it already is). A submodule's
    callback runs when its own import finishes, however it is reached (``import a.b``, ``from a import b``, a
    library's lazy ``__getattr__`` that imports it)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _callbacks.setdefault(name, []).append(callback)
            if not any(isinstance(f, _Finder) for f in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    callback(module)


def pending() -> dict[str, int]:
    """How many callbacks wait on each module name."""
    with _lock:
        return {name: len(cbs) for name, cbs in _callbacks.items()}


def cancel(callback: Callable[[ModuleType], None] | None = None) -> None:
    """Forget ``callback`` (every callback when None) wherever it waits."""
    with _lock:
        for name in list(_callbacks):
            kept = [] if callback is None else [c for c in _callbacks[name] if c is not callback]
            if kept:
                _callbacks[name] = kept
            else:
                del _callbacks[name]


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _callbacks.pop(name, [])
    for cb in callbacks:
        cb(module)


class _Finder:
    """Finds nothing itself: for a watched name it asks the other finders and wraps the loader they give.
    (A plain class: the import system needs only ``find_spec``, and ``importlib.abc`` costs activation 8 ms.)"""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _callbacks or fullname in _busy:
            return None
        _busy.add(fullname)
        try:
            # the other finders, as the import system asks them (for a submodule, ``path`` is its parent's __path__)
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            _busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _NotifyingLoader(spec.loader, fullname)
        return spec


class _NotifyingLoader:
    def __init__(self, inner, name: str):
        self._inner = inner
        self._name = name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        # Put the real loader back first: nothing after the import should see this wrapper.
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        _fire(self._name, sys.modules.get(self._name, module))

    def __getattr__(self, attr):
        return getattr(self._inner, attr)
