"""The accelerate rule: a result dispatched by accelerate is refused, unless an adapter can carry its hooks.

A model loaded with a ``device_map`` spanning several devices, or with CPU/disk offload, carries accelerate
hooks (``_hf_hook``) that move weights at call time and may point at an offload folder or at weights that are
not in the model's tensors. Pickling them would either fail or cache something that does not run. Such a
result is not cached by design: one INFO log line names the adapter, the loader and the fix, no warning; the
user keeps the plain result. A ``device_map`` onto one device attaches no hooks and is cached (it comes back on
that device).

An adapter that can strip a model's hooks for pickling and re-attach them on the cached copy (overmind-bnb
does, for the quantized models it owns) says so once, with :func:`carries_hooks`; the modules of a model it
claims are not held against the result, whichever adapter's hooks run first.

The same context manager turns a pickling failure into a message that names the adapter and the versions.
"""
from __future__ import annotations

import contextlib
import threading

from overmind.adapter import NotCacheable, NotCachedByDesign, PicklingFailed, label, meta_intended

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator

_claims: dict[str, Callable[[Any], bool]] = {}
_lock = threading.Lock()


def carries_hooks(adapter: str, claims: Callable[[Any], bool]) -> None:
    """Declare that adapter ``adapter`` strips and re-attaches the accelerate hooks of every root module for
    which ``claims(module)`` is true (a model, or one pipeline component). Idempotent per adapter.

    >>> dispatch.carries_hooks("bnb", lambda m: is_quantized(m) and has_dispatch_state(m))
    """
    with _lock:
        _claims[adapter] = claims


def roots_of(result: Any) -> Iterator[Any]:
    """``result`` if it is a ``torch.nn.Module``, else its pipeline components that are (one level)."""
    import torch

    if isinstance(result, torch.nn.Module):
        yield result
        return
    components = getattr(result, "components", None)
    if isinstance(components, dict):
        for value in components.values():
            if isinstance(value, torch.nn.Module):
                yield value


def _claimed(root: Any) -> bool:
    return any(claims(root) for claims in list(_claims.values()))


_HOOK = "_hf_hook"
_plain_lookup: dict[type, bool] = {}  # module type -> whether getattr(m, _HOOK) reads only m's dicts (below)


def _hook_of(m: Any) -> Any:
    """``getattr(m, "_hf_hook", None)``, read from the module's dicts where that is what getattr reads: for a type
    whose classes define no ``_hf_hook`` and whose ``__getattr__`` is ``torch.nn.Module``'s, the attribute is the
    instance's own (where accelerate's ``add_hook_to_module`` puts it) or else a parameter, buffer or submodule of
    that name. A pipeline's modules number thousands, and a failed getattr raises and catches an AttributeError in
    ``Module.__getattr__`` for each. Any other module is asked with getattr."""
    t = type(m)
    plain = _plain_lookup.get(t)
    if plain is None:
        import torch

        plain = _plain_lookup[t] = (not any(_HOOK in vars(b) for b in t.__mro__)
                                    and getattr(t, "__getattribute__", None) is object.__getattribute__
                                    and getattr(t, "__getattr__", None) is torch.nn.Module.__getattr__)
    d = getattr(m, "__dict__", None) if plain else None
    if type(d) is not dict:
        return getattr(m, _HOOK, None)
    if _HOOK in d:
        return d[_HOOK]
    for name in ("_parameters", "_buffers", "_modules"):  # Module.__getattr__'s reads, in its order
        if name in d:
            inner = d[name]
            if _HOOK in inner:
                return inner[_HOOK]
    return None


def _hooked(result: Any) -> str | None:
    for root in roots_of(result):
        for m in root.modules():
            hook = _hook_of(m)
            if hook is not None:
                if _claimed(root):
                    # an adapter takes this model's hooks off for pickling and puts them back; the weights its
                    # hooks load from the offload folder stay on the meta device, as in the plain result
                    meta_intended()
                    break
                return f"{type(m).__name__} carries an accelerate {type(hook).__name__}"
    return None


@contextlib.contextmanager
def guard(adapter: str, result: Any, loader: Any) -> Iterator[None]:
    """Refuse dispatched results; re-raise pickling failures with the adapter and versions named."""
    why = _hooked(result)
    if why:
        raise NotCachedByDesign(
            f"{label(adapter)}: {loader.name} returned a model dispatched by accelerate ({why}: a device_map over "
            f"several devices, or offloading). It is not cached. Load onto one device (device_map='cuda:0' or "
            f"'cpu') to cache it.")
    try:
        yield
    except Exception as e:
        if isinstance(e, PicklingFailed) and not isinstance(e, NotCacheable):
            raise NotCacheable(f"{label(adapter)}: cannot pickle what {loader.name} returned: {e}") from e
        raise
