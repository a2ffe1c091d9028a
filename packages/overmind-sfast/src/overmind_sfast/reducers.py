"""The reducer table overmind-sfast gives the core pickler (hook ``overmind_reducers``).

The traced modules themselves are TorchScript and go through the core's TorchScript reducer
(``overmind.adapter.reduce_script_module``). This table adds everything stable-fast wraps around them (see
:mod:`overmind_sfast.closures`) and ``TracedPosArgOnlyModuleWrapper``, the call helper around each traced
module: it is checked when pickled, so that a module that cannot come back fails now, in the process
that built it, with a message saying why; stored as an archive plus weights stored once with the eager
modules' (:mod:`overmind_sfast.sharing`); and rebuilt with its dataclass class tags restored
(:func:`overmind_sfast.flattening.restore_class_tags`).
"""
from __future__ import annotations

import pickle
import types
from typing import Any, Callable

from . import clear_hooks, closures, flattening, sharing

__all__ = ["reducers", "reduce_traced_wrapper", "rebuild_traced_wrapper"]


def _cannot_save(why: str) -> pickle.PicklingError:
    import sfast

    return pickle.PicklingError(
        f"overmind-sfast: cannot cache a module traced by stable-fast {sfast.__version__}: {why}")


def reduce_traced_wrapper(wrapper: Any) -> Any:
    """``TracedPosArgOnlyModuleWrapper`` -> ``(rebuild_traced_wrapper, (archive rebuild, its arguments,
    weights, training, wrapper structure))``: the traced module as a TorchScript archive without its
    weights, the weights as tensors (stored once with the eager module's), and the shape of its Python
    wrapper (see :mod:`overmind_sfast.sharing`)."""
    module = wrapper.module
    if not isinstance(module, _script_module_type()):
        return NotImplemented  # not traced (yet): an ordinary nn.Module
    if clear_hooks.carries_hook_attribute(module):
        raise _cannot_save(
            f"it carries stable-fast's PyObject clean-up attribute ({clear_hooks.ATTRIBUTE}), which TorchScript "
            f"cannot save, because it was traced while overmind-sfast was not active. Call overmind.activate() "
            f"before compiling the pipeline (at the top of the script that calls overmind.load(build, ...)).")
    for _, path in flattening.tagged_constants(module):
        if path.startswith("?"):
            raise _cannot_save(
                f"it returns a dataclass of class {path[1:]!r}, defined inside a function, which another "
                f"process cannot import. Define the class at module level.")
    fn, args, weights = sharing.split(module)
    return rebuild_traced_wrapper, (fn, args, weights, wrapper.training, sharing.wrapper_structure(module))


def rebuild_traced_wrapper(fn: Callable[..., Any], args: tuple, weights: list, training: bool,
                           structure: tuple | None = None) -> Any:
    """stable-fast's call helper around the module ``fn(*args)`` rebuilds, with its weights set back, its
    Python wrapper shaped as the original's (``structure``, see :func:`overmind_sfast.sharing.rewrap`) and
    its dataclass class tags pointing at live classes."""
    from sfast.jit.trace_helper import TracedPosArgOnlyModuleWrapper

    module = fn(*args)
    if structure is not None:
        module = sharing.rewrap(module._c, structure)
    sharing.put_back(module, weights)
    flattening.restore_class_tags(module)
    return TracedPosArgOnlyModuleWrapper(module, training=training)


def _script_module_type() -> type:
    import torch

    return torch.jit.ScriptModule


def reducers() -> dict[type, Callable[[Any], Any]]:
    """``{type: reducer}``. The ``FunctionType`` and ``MethodType`` reducers answer ``NotImplemented``
    for anything that is not stable-fast's, which leaves it to the default pickling."""
    from sfast.hooks.module_jit_hook import ModuleJITHook
    from sfast.jit.trace_helper import AutoTraceCompiler, TracedPosArgOnlyModuleWrapper

    return {
        types.FunctionType: closures.reduce_function,
        types.MethodType: closures.reduce_method,
        ModuleJITHook: closures.reduce_module_jit_hook,
        AutoTraceCompiler: closures.reduce_auto_trace_compiler,
        TracedPosArgOnlyModuleWrapper: reduce_traced_wrapper,
    }
