"""stable-fast's clean-up hooks, kept beside a traced module instead of inside it, so the module can be saved.

stable-fast traces each module into its own TorchScript class type and, so that the type (and the constants
its frozen graph holds, weights among them) is dropped from the compilation unit when the module dies, it
registers a ``ScriptModuleClearHook`` on the module and on every submodule as a TorchScript attribute of
type ``PyObject``. TorchScript cannot serialize a ``PyObject`` attribute (``torch.jit.save`` and the
torch.package serializer both fail with "Unknown IValue type for pickling: PyObject"), and an attribute
cannot be removed from a class type once registered.

While ``overmind-sfast`` is active, :func:`attach_script_module_clear_hook` replaces stable-fast's: it makes
the same hooks for the module and its submodules but holds them in a registry tied to the lifetime of the
module's C++ handle (``weakref.finalize``), so they run, as before, when the traced module goes away, and
the module itself stays serializable.
"""
from __future__ import annotations

import functools
import threading
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterator

__all__ = ["ATTRIBUTE", "attach_script_module_clear_hook", "carries_hook_attribute", "held_hooks", "patch_targets"]

# The attribute name stable-fast 1.0.5 registers (sfast.jit.utils.attach_script_module_clear_hook).
ATTRIBUTE = "_sfast_module_registration_clear_hook"

_lock = threading.Lock()
_held: dict[int, tuple[weakref.ref, list[Any]]] = {}  # id(handle) -> (a weak reference to it, its hooks)


def _walk(module_c: Any) -> Iterator[Any]:
    """The C++ module and all its submodules, depth first."""
    import torch

    yield module_c
    for _, child in torch._C._jit_debug_module_iterators(module_c)["named_children"]:
        yield from _walk(child)


def attach_script_module_clear_hook(script_module: Any, attr_name: str = ATTRIBUTE) -> None:
    """Replacement for ``sfast.jit.utils.attach_script_module_clear_hook`` (same signature).

    ``script_module`` is the C++ handle (``ScriptModule._c``) stable-fast passes; ``attr_name`` is accepted
    for compatibility and unused: nothing is registered on the module.
    """
    from sfast.jit.utils import ScriptModuleClearHook

    hooks = [ScriptModuleClearHook(c) for c in _walk(script_module)]
    key = id(script_module)
    # The handle is what the Python module object holds as ``_c``; when it goes, the hooks go, and their
    # __del__ clears the class type registrations exactly as stable-fast's attribute would have. The callback is
    # C (dict.pop, the weak reference as its ignored default), not weakref.finalize's Python: no code of
    # Overmind's runs when the module dies, where a signal handler's exception would be lost (see the kit's
    # raise_users).
    ref = weakref.ref(script_module, functools.partial(_held.pop, key))
    with _lock:
        _held[key] = (ref, hooks)


def held_hooks(script_module: Any) -> list[Any]:
    """The hooks held for the C++ handle ``script_module`` (empty if none): for tests and diagnostics."""
    with _lock:
        held = _held.get(id(script_module))
    return list(held[1]) if held is not None and held[0]() is script_module else []


def carries_hook_attribute(module: Any) -> bool:
    """Whether a ``torch.jit.ScriptModule`` (or any submodule) holds stable-fast's ``PyObject`` hook
    attribute, i.e. it was traced while overmind-sfast was not active and cannot be serialized."""
    return any(c.hasattr(ATTRIBUTE) for c in _walk(module._c))


def patch_targets() -> list:
    """The replacement, as ``overmind.adapter.PatchTarget(kind="replace")``."""
    from sfast.jit import utils

    from overmind.adapter import PatchTarget

    return [PatchTarget(utils, "attach_script_module_clear_hook", kind="replace",
                        replacement=attach_script_module_clear_hook)]
