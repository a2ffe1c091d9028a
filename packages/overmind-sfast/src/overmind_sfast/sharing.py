"""One copy of the weights: a traced module's tensors travel beside its archive, not inside it.

stable-fast traces the pipeline's own modules, so in the process that built it the traced UNet's weights
are the eager UNet's tensors (same storages; ``preserve_parameters=True``, the default, keeps them as
attributes even after freezing). A TorchScript archive holds its own copy of every tensor attribute, so a
pipeline cached as it is would hold every weight twice, in the cache and in each process that maps it.

:func:`split` serializes a copy of the module whose tensor attributes are replaced by empty tensors, and
returns those tensors separately; the pickler stores them out of band like any other tensor, once per
storage, so a weight shared with an eager module is stored once and, rebuilt, shared again.
:func:`put_back` sets them on the module rebuilt from the archive. Tensors a frozen graph holds as
constants (``preserve_parameters=False``) stay in the archive: they are not attributes.

The archive holds the C++ module; the Python wrapper around it is made anew on import. stable-fast's
freeze wraps the frozen module bare (``RecursiveScriptModule(cpp)`` then ``_finalize_scriptmodule``:
no Python-side submodules, so ``parameters()`` and ``named_modules()`` see only the top level), where the
import wraps every C++ submodule (``wrap_cpp_module``). :func:`wrapper_structure` records which Python-side
submodules each wrapper lists and whether it was made by ``wrap_cpp_module``'s initializer, and
:func:`rewrap` wraps the imported C++ module the same way; the C++ module, its graphs and its weights are
the imported ones either way.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["tensor_attributes", "split", "put_back", "wrapper_structure", "rewrap"]


def _children(module_c: Any) -> list[tuple[str, Any]]:
    import torch

    return list(torch._C._jit_debug_module_iterators(module_c)["named_children"])


def tensor_attributes(module_c: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(dotted path, tensor)`` for every tensor attribute (parameters and buffers included) of the C++
    module ``module_c`` and its submodules."""
    import torch

    attributes = torch._C._jit_debug_module_iterators(module_c)["named_attributes"]
    found = [(prefix + name, value) for name, value in attributes if isinstance(value, torch.Tensor)]
    for name, child in _children(module_c):
        found.extend(tensor_attributes(child, f"{prefix}{name}."))
    return found


def _owner(module_c: Any, path: str) -> tuple[Any, str]:
    *parents, name = path.split(".")
    for part in parents:
        module_c = module_c.getattr(part)
    return module_c, name


def _replica(module_c: Any) -> Any:
    """A copy of ``module_c`` and of each submodule, whose attribute slots can be changed without touching
    the original (the slots' values, tensors and graphs, are shared; torch 2.x has no public clone)."""
    replica = module_c._replicate_for_data_parallel()  # this object only: its children are still shared
    for name, child in _children(module_c):
        replica.setattr(name, _replica(child))
    return replica


def split(module: Any) -> tuple[Callable[..., Any], tuple, list[tuple[str, Any]]]:
    """``(rebuild function, its arguments, weights)``: the core's TorchScript reduction of a copy of
    ``module`` without its tensor attributes, and those tensors by path. ``module`` itself is untouched
    (the copy shares its graphs and tensors; only the copy's attribute slots are emptied)."""
    import torch

    from overmind.adapter import reduce_script_module

    weights = tensor_attributes(module._c)
    copy = torch.jit._recursive.wrap_cpp_module(_replica(module._c))
    for path, tensor in weights:
        owner, name = _owner(copy._c, path)
        owner.setattr(name, torch.empty(0, dtype=tensor.dtype, device=tensor.device))
    fn, args = reduce_script_module(copy)[:2]
    return fn, args, weights


def put_back(module: Any, weights: list[tuple[str, Any]]) -> None:
    """Set each ``(path, tensor)`` of :func:`split` on ``module`` (rebuilt from its archive)."""
    for path, tensor in weights:
        owner, name = _owner(module._c, path)
        owner.setattr(name, tensor)


def wrapper_structure(module: Any) -> tuple:
    """``(made by wrap_cpp_module, ((name, structure), ...))`` of the Python wrapper ``module``: whether it
    carries the concrete type ``wrap_cpp_module``'s initializer sets, and the script submodules its
    ``_modules`` lists (the C++ module may hold more), each recursively."""
    import torch

    children = tuple((name, wrapper_structure(child)) for name, child in module._modules.items()
                     if isinstance(child, torch.jit.ScriptModule))
    return "_concrete_type" in vars(module), children


def rewrap(module_c: Any, structure: tuple) -> Any:
    """A ``RecursiveScriptModule`` around the C++ module ``module_c`` shaped as :func:`wrapper_structure`
    recorded: built by ``RecursiveScriptModule._construct`` with ``wrap_cpp_module``'s initializer where
    the original had it, with no initializer where it had none, listing only the recorded submodules."""
    import torch

    made_by_wrap, children = structure

    def init(script_module: Any) -> None:
        submodules = torch._C.ModuleDict(script_module._c)
        for name, child in children:
            setattr(script_module, name, rewrap(submodules.getattr(name), child))
        if made_by_wrap:  # as torch.jit._recursive.wrap_cpp_module's init_fn
            script_module._concrete_type = torch._C.ConcreteModuleType.from_jit_type(script_module._c._type())
            for idx, fn in enumerate(script_module._c._get_forward_pre_hooks()):
                script_module._forward_pre_hooks[idx] = fn
            for idx, fn in enumerate(script_module._c._get_forward_hooks()):
                script_module._forward_hooks[idx] = fn

    return torch.jit.RecursiveScriptModule._construct(module_c, init)
