"""Patch targets from a list of ``"module:Class"`` specs: each class's own ``from_pretrained`` (or another
loader name), plus every imported subclass that overrides it.

Subclasses matter because Python resolves ``Sub.from_pretrained`` to ``Sub``'s own override first: patching the
base alone would miss ``AutoModelForCausalLM.from_pretrained`` (transformers copies the method into every
Auto class) or ``MultiControlNetModel.from_pretrained``. Subclasses imported after ``activate()`` are not
patched; when their override calls ``super().from_pretrained``, the inner load is still cached.

A spec that no longer resolves (the library moved the class or turned the loader into something else) is
skipped with one warning naming the adapter, the target and both versions; the other targets still apply.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Iterable, NamedTuple

from overmind.patching import PatchTarget

from .support import ADAPTER_DISTS, label, warn


class Spec(NamedTuple):
    """``where`` is ``"package.module:Class"``; ``attr`` the loader; ``subclasses``: also patch overriders."""

    where: str
    attr: str = "from_pretrained"
    subclasses: bool = True


def resolve(where: str):
    """Import ``"package.module:Qual.Name"`` and return the object."""
    module_name, _, qualname = where.partition(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _subclasses(root: type) -> list[type]:
    seen, out, todo = set(), [], [root]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                out.append(sub)
                todo.append(sub)
    return out


def _own_classmethod(cls: type, attr: str) -> bool:
    return isinstance(vars(cls).get(attr), classmethod)


def collect(adapter: str, specs: Iterable[Spec]) -> list[PatchTarget]:
    """The patch targets of ``specs``, in a stable order, each (owner, attr) once; broken specs warn."""
    targets: dict[tuple[int, str], PatchTarget] = {}
    for spec in specs:
        try:
            root = resolve(spec.where)
            found = inspect.getattr_static(root, spec.attr)
        except (ImportError, AttributeError) as e:
            warn(f"overmind: {label(adapter)} cannot patch {spec.where.replace(':', '.')}.{spec.attr}: "
                 f"{type(e).__name__}: {e}. Those loads run without the cache; upgrade "
                 f"{ADAPTER_DISTS.get(adapter, adapter)} or pin {adapter} to a version it supports.")
            continue
        if not isinstance(found, classmethod):
            warn(f"overmind: {label(adapter)} cannot patch {spec.where.replace(':', '.')}.{spec.attr}: it is a "
                 f"{type(found).__name__}, not a classmethod. Those loads run without the cache; upgrade the adapter.")
            continue
        classes = [root] + (sorted(_subclasses(root), key=lambda c: (c.__module__, c.__qualname__))
                            if spec.subclasses else [])
        for cls in classes:
            if _own_classmethod(cls, spec.attr) and (id(cls), spec.attr) not in targets:
                targets[(id(cls), spec.attr)] = PatchTarget(cls, spec.attr, kind="classmethod", adapter=adapter)
    return list(targets.values())
