"""One exception tree: every exception class the core defines derives from ``OvermindError``,
so ``except OvermindError`` catches whatever Overmind raises on purpose."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import overmind
from overmind.errors import OvermindError


def core_exceptions() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(overmind.__path__, "overmind."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and not issubclass(obj, Warning)
                    and obj.__module__ == info.name and not name.startswith("_")):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_exception_of_the_core_is_an_overmind_error():
    found = core_exceptions()
    assert {"overmind.errors.Unkeyable", "overmind.errors.PicklingFailed", "overmind.adapters.patching.PatchError"} <= set(found)
    outside = sorted(n for n, cls in found.items() if not issubclass(cls, OvermindError))
    assert not outside, f"not under OvermindError: {outside}"


def test_builtin_categories_are_kept():
    from overmind.adapters.patching import PatchError
    from overmind.fallback import CacheBypassed
    from overmind.shm.layout import LayoutError

    assert issubclass(CacheBypassed, RuntimeError) and issubclass(PatchError, RuntimeError)
    assert issubclass(LayoutError, ValueError)
