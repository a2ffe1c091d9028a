"""Pickling the closures stable-fast installs on a compiled pipeline, and rebuilding them ready to run.

``sfast.compilers.diffusion_pipeline_compiler.compile`` leaves its state in nested functions, which pickle
cannot name (``Can't pickle local object 'ModuleJITHook.__init__.<locals>.compiled_call_impl'``) and dill
would copy by value with their locks. Each kind is recognised by its code object (``functools.wraps`` has
renamed the function itself) and reduced to what it is made of:

============================================  ==========================================================
closure (where stable-fast installs it)        rebuilt as
============================================  ==========================================================
``lazy_trace`` ``wrapper``                     ``lazy_trace(original, ts_compiler=..., **kwargs)`` with the
(``unet.forward``, ``text_encoder.forward``)   traces made so far put back in its cache: no re-tracing
``ModuleJITHook`` ``compiled_call_impl``       the same function over the rebuilt hook
(``vae.*._call_impl``)
``AutoTraceCompiler`` ``functionalized``       the same function over the same traced module
(values of a hook's ``compiled_cache``)
``make_dynamic_graphed_callable``              a new graphed callable around the same function; CUDA graphs
(``enable_cuda_graph=True``)                   are not serializable and are captured again on first call
image processor ``pt_to_numpy``/``pt_to_pil``  the module's function, by name
============================================  ==========================================================

Bound methods inside these closures are kept as ``(function, instance)``, not re-read with ``getattr``:
by the time an instance is rebuilt its ``forward``/``_call_impl`` may already be the wrapper itself.
"""
from __future__ import annotations

import functools
import os
import threading
import types
from typing import Any, Callable

__all__ = ["reduce_function", "reduce_method", "closure_kinds", "bound_method"]

_kinds: dict[types.CodeType, Callable[[Any], tuple]] | None = None
_kinds_lock = threading.Lock()


def _nested_code(outer: Callable, name: str) -> types.CodeType:
    """The code object of the function ``name`` defined inside ``outer`` (what its closures run)."""
    for const in outer.__code__.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == name:
            return const
    import sfast

    raise LookupError(f"overmind-sfast: {outer.__module__}.{outer.__qualname__} defines no function {name!r} in "
                      f"stable-fast {sfast.__version__}, so its compiled pipelines cannot be cached; overmind-sfast "
                      f"0.1.0 was written for stable-fast 1.0.5. Install that version, or skip the adapter with "
                      f"OVERMIND_DISABLED_ADAPTERS=sfast.")


def _cells(fn: types.FunctionType) -> dict[str, Any]:
    """A closure's free variables by name."""
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))


def _as_spec(obj: Any) -> Any:
    """A bound method becomes ``_Bound(function, instance)``; anything else is kept as it is."""
    if isinstance(obj, types.MethodType):
        return _Bound(obj.__func__, obj.__self__)
    return obj


def bound_method(func: Any, instance: Any) -> types.MethodType:
    """``func`` bound to ``instance`` (``types.MethodType`` itself cannot be named by pickle)."""
    return types.MethodType(func, instance)


class _Bound:
    """A bound method to rebuild with ``types.MethodType`` (never with ``getattr``: see the module doc)."""

    __slots__ = ("func", "instance")

    def __init__(self, func: Any, instance: Any):
        self.func, self.instance = func, instance

    def __reduce__(self):
        return _Bound, (self.func, self.instance)

    def get(self) -> Any:
        return bound_method(self.func, self.instance)


def _from_spec(spec: Any) -> Any:
    return spec.get() if isinstance(spec, _Bound) else spec


# ------------------------------------------------------------------------------------------- lazy_trace
def _reduce_lazy_trace(fn: types.FunctionType) -> tuple:
    cells = _cells(fn)
    # lazy_trace(module) and lazy_trace(module.forward) make the same wrapper (both trace forward through
    # a FuncModule), so the wrapped callable is all that is needed to make it again.
    return rebuild_lazy_trace, (_as_spec(fn.__wrapped__), cells["ts_compiler"], dict(cells["kwargs_"]),
                                dict(cells["traced_modules"]))


def rebuild_lazy_trace(wrapped: Any, ts_compiler: Any, kwargs: dict, traced: dict) -> Callable:
    """A stable-fast ``lazy_trace`` wrapper around ``wrapped`` whose cache already holds ``traced``."""
    from sfast.jit.trace_helper import lazy_trace

    wrapper = lazy_trace(_from_spec(wrapped), ts_compiler=ts_compiler, **kwargs)
    wrapper._cached.update(traced)
    return wrapper


# -------------------------------------------------------------------------------------- ModuleJITHook
def _reduce_compiled_call_impl(fn: types.FunctionType) -> tuple:
    return rebuild_compiled_call_impl, (_cells(fn)["self"], fn.__self__)


def rebuild_compiled_call_impl(hook: Any, module: Any) -> Callable:
    """The ``_call_impl`` replacement ``ModuleJITHook.__init__`` installs, over ``hook``."""
    from sfast.hooks.module_jit_hook import ModuleJITHook

    code = _nested_code(ModuleJITHook.__init__, "compiled_call_impl")
    fn = types.FunctionType(code, ModuleJITHook.__init__.__globals__, code.co_name, None, (types.CellType(hook),))
    fn.__self__ = module
    return fn


def reduce_module_jit_hook(hook: Any) -> tuple:
    """``ModuleJITHook``: its state without the lock; ``call_impl`` (the module's own bound
    ``_call_impl``) kept as function and instance."""
    state = {k: v for k, v in vars(hook).items() if k not in ("lock", "call_impl")}
    return new_module_jit_hook, (), (state, _as_spec(hook.call_impl)), None, None, set_module_jit_hook_state


def new_module_jit_hook() -> Any:
    from sfast.hooks.module_jit_hook import ModuleJITHook

    hook = ModuleJITHook.__new__(ModuleJITHook)
    hook.lock = threading.Lock()
    return hook


def set_module_jit_hook_state(hook: Any, state: tuple) -> None:
    attrs, call_impl = state
    vars(hook).update(attrs)
    hook.call_impl = _from_spec(call_impl)


# --------------------------------------------------------------------------------- AutoTraceCompiler
def _reduce_functionalized(fn: types.FunctionType) -> tuple:
    return rebuild_functionalized, (_cells(fn)["traced_module"], _as_spec(fn.__wrapped__), fn.__self__)


def rebuild_functionalized(traced_module: Any, wrapped: Any, owner: Any) -> Callable:
    """The function ``AutoTraceCompiler.compile`` returns: calls ``traced_module``, looks like ``wrapped``."""
    from sfast.jit.trace_helper import AutoTraceCompiler

    code = _nested_code(AutoTraceCompiler.compile, "functionalized")
    fn = types.FunctionType(code, AutoTraceCompiler.compile.__globals__, code.co_name, None,
                            (types.CellType(traced_module),))
    functools.update_wrapper(fn, _from_spec(wrapped))
    fn.__self__ = owner
    return fn


def reduce_auto_trace_compiler(compiler: Any) -> tuple:
    """``AutoTraceCompiler``: its state without the thread-local "compiling now" flag."""
    return new_auto_trace_compiler, (), {k: v for k, v in vars(compiler).items() if k != "_is_compiling"}


def new_auto_trace_compiler() -> Any:
    from sfast.jit.trace_helper import AutoTraceCompiler

    compiler = AutoTraceCompiler.__new__(AutoTraceCompiler)
    compiler._is_compiling = threading.local()
    return compiler


# ------------------------------------------------------------------------------------------ CUDA graphs
def _reduce_graphed(fn: types.FunctionType) -> tuple:
    return rebuild_graphed, (_as_spec(_cells(fn)["func"]),)


def rebuild_graphed(func: Any) -> Callable:
    """A new ``make_dynamic_graphed_callable`` wrapper: graphs are captured again on the first call."""
    from sfast.cuda.graphs import make_dynamic_graphed_callable

    return make_dynamic_graphed_callable(_from_spec(func))


# ------------------------------------------------------------------------------------- image processor
def _reduce_module_static(name: str) -> Callable[[Any], tuple]:
    def reduce(fn: types.FunctionType) -> tuple:
        return module_static_function, ("sfast.libs.diffusers.image_processor", name)

    return reduce


def module_static_function(module: str, name: str) -> Callable:
    """The function behind the module-level ``staticmethod`` ``module.name`` (what stable-fast binds)."""
    import importlib

    return getattr(importlib.import_module(module), name).__func__


# ------------------------------------------------------------------------------------------- dispatch
def closure_kinds() -> dict[types.CodeType, Callable[[Any], tuple]]:
    """``{code object: reducer}`` for every stable-fast closure this module knows (computed once)."""
    global _kinds
    if _kinds is not None:  # the pickler asks for every function it meets: no lock once computed
        return _kinds
    with _kinds_lock:
        if _kinds is None:
            from sfast.hooks.module_jit_hook import ModuleJITHook
            from sfast.jit.trace_helper import AutoTraceCompiler, lazy_trace

            kinds = {
                _nested_code(lazy_trace, "wrapper"): _reduce_lazy_trace,
                _nested_code(ModuleJITHook.__init__, "compiled_call_impl"): _reduce_compiled_call_impl,
                _nested_code(AutoTraceCompiler.compile, "functionalized"): _reduce_functionalized,
            }
            try:  # imports torch.cuda helpers only; present in every build of stable-fast
                from sfast.cuda.graphs import make_dynamic_graphed_callable

                kinds[_nested_code(make_dynamic_graphed_callable, "dynamic_graphed_callable")] = _reduce_graphed
            except ImportError:
                pass
            try:  # needs diffusers, which a stable-fast user without pipelines may not have
                from sfast.libs.diffusers import image_processor

                for name in ("pt_to_numpy", "pt_to_pil"):
                    kinds[getattr(image_processor, name).__func__.__code__] = _reduce_module_static(name)
            except ImportError:
                pass
            _kinds = kinds
        return _kinds


_SFAST_DIR = f"{os.sep}sfast{os.sep}"


def reduce_function(fn: types.FunctionType) -> Any:
    """Reducer for ``types.FunctionType``: stable-fast closures are rebuilt; other functions are left to
    the default pickling (``NotImplemented``)."""
    code = getattr(fn, "__code__", None)
    if code is None or _SFAST_DIR not in code.co_filename:
        # Every closure we rebuild is stable-fast's own code (its __module__ may say otherwise: wraps()
        # copies it): skip the lookup, and the first lookup's imports (diffusers), for everybody else's.
        return NotImplemented
    reducer = closure_kinds().get(code)
    return NotImplemented if reducer is None else reducer(fn)


def reduce_method(method: types.MethodType) -> Any:
    """Reducer for bound methods of stable-fast's own functions (the image processor's ``postprocess``,
    a hook's ``ready_to_compile``): rebuilt with ``MethodType``; other methods get the default pickling."""
    func = method.__func__
    if (getattr(func, "__module__", None) or "").startswith("sfast."):
        return bound_method, (func, method.__self__)
    return NotImplemented
