"""What a loader changed in the modules it was given (a submodule swapped for a layer that holds it, gradient flags,
attributes, hooks), as writes a hit can make to the caller's modules; a tensor whose values changed in place makes
the call uncached.

PEFT's ``PeftModel.from_pretrained(base, lora)`` returns a model that wraps ``base`` and changes ``base`` itself: its
attention projections are replaced by LoRA layers that hold the original ones, its parameters stop requiring
gradients. The plain call leaves the caller's ``base`` so; a hit must leave it so too. Before the loader runs,
:func:`before` copies, for every module reachable from a module argument, its ``__dict__``, each dict and set it
holds (``_modules``, ``_parameters``, ``_buffers``, hooks), and each of its tensors' gradient flag and what says
their values changed (version counter, data pointer, dtype, shape, device). :func:`since` turns the differences into
writes (``entries/writes.Held``):

- an attribute added, rebound or deleted: a write to the module's ``__dict__``;
- an item added, replaced or deleted in a dict it holds (a submodule swapped for a LoRA layer): a write to that
  dict, provided the order of its keys after the replay is the order the loader left;
- an item added to a set it holds;
- a tensor's ``requires_grad`` changed.

A tensor whose values, dtype, shape or device changed in place, or a set that lost an item, cannot be replayed:
:func:`since` says which, and the call is not cached. The writes are pickled with the result, the caller's module
and its parts by where the caller passed them (``entries/arguments_ref.py``), so a hit changes the caller's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...entries.writes import ABSENT, DELETED, Held
from .changes import Write


@dataclass
class _Module:
    path: str
    module: Any
    attrs: dict[str, Any]
    containers: dict[str, Any]  # attribute -> a copy of the dict (its items) or set it holds


@dataclass
class _Tensor:
    path: str
    tensor: Any
    requires_grad: bool
    values: tuple


class Before:
    """The module arguments' state as the loader starts."""

    def __init__(self, modules: list[_Module], tensors: list[_Tensor]) -> None:
        self.modules, self.tensors = modules, tensors


def before(arguments: dict | None) -> Before | None:
    """The state of every module reachable from a module among ``arguments``; None when none is a module."""
    import torch

    roots = [(name, value) for name, value in (arguments or {}).items() if isinstance(value, torch.nn.Module)]
    if not roots:
        return None
    modules: list[_Module] = []
    tensors: list[_Tensor] = []
    seen: set[int] = set()
    for name, root in roots:
        for path, module in root.named_modules(prefix=name):
            if id(module) in seen:
                continue
            seen.add(id(module))
            attrs = dict(module.__dict__)
            containers = {k: (dict(v) if isinstance(v, dict) else set(v)) for k, v in attrs.items()
                          if isinstance(v, dict) or type(v) is set}
            modules.append(_Module(path, module, attrs, containers))
            for kind in ("_parameters", "_buffers"):
                for tname, t in attrs.get(kind, {}).items():
                    if t is not None and id(t) not in seen:
                        seen.add(id(t))
                        tensors.append(_Tensor(f"{path}.{tname}", t, t.requires_grad, _values(t)))
    return Before(modules, tensors)


def _values(t: Any) -> tuple:
    return (t._version, t.data_ptr() if t.device.type != "meta" else 0, t.dtype, tuple(t.shape), str(t.device))


@dataclass
class Found:
    """The writes a loader made to its module arguments, or why they cannot be replayed."""

    writes: list[Write]
    unreplayable: str | None = None


def since(state: Before | None) -> Found:
    """What changed in the module arguments since ``state`` (:func:`before`), as writes in replay order."""
    if state is None:
        return Found([])
    writes: list[Write] = []
    for t in state.tensors:
        if _values(t.tensor) != t.values:
            return Found([], f"the values, dtype, shape or device of argument tensor {t.path} in place")
        if t.tensor.requires_grad != t.requires_grad:
            writes.append(Write(Held("requires_grad", t.tensor), None, t.tensor.requires_grad, t.requires_grad))
    for m in state.modules:
        now = m.module.__dict__
        for key in [k for k in m.attrs if k not in now]:
            writes.append(Write(Held("attrs", m.module), key, DELETED, m.attrs[key]))
        for key, value in now.items():
            old = m.attrs.get(key, ABSENT)
            if value is not old:
                writes.append(Write(Held("attrs", m.module), key, value, old))
            elif key in m.containers:
                why = _container(m, key, value, writes)
                if why is not None:
                    return Found([], why)
    return Found(writes)


def _container(m: _Module, name: str, now: Any, writes: list[Write]) -> str | None:
    """The writes that turn the copy of ``m``'s container ``name`` into ``now``; why they cannot, if so."""
    was = m.containers[name]
    if isinstance(was, set):
        if not was <= now:
            return f"items removed from {name} of argument module {m.path}"
        writes.extend(Write(Held("set", m.module, name), None, item) for item in now - was)
        return None
    order = [k for k in was if k in now] + [k for k in now if k not in was]
    if order != list(now):
        return f"the order of {name} of argument module {m.path}"
    for key in was:
        if key not in now:
            writes.append(Write(Held("dict", m.module, name), key, DELETED, was[key]))
    for key, value in now.items():
        old = was.get(key, ABSENT)
        if value is not old:
            writes.append(Write(Held("dict", m.module, name), key, value, old))
    return None
