"""What must not be cached as it is: results dispatched by accelerate across devices or offloaded.

A model loaded with a ``device_map`` spanning several devices, or with CPU/disk offload, carries accelerate
hooks (``_hf_hook``) that move weights at call time and may point at an offload folder or at weights that are
not in the model's tensors. Pickling them would either fail or cache something that does not run. Such a
result is refused with a message naming the adapter, the loader and the fix; the user keeps the plain
result. A ``device_map`` onto one device attaches no hooks and is cached (it comes back on that device).

The same context manager turns a pickling failure into a message that names the adapter and the versions.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .support import label


class NotCacheable(RuntimeError):
    """The loaded object cannot be cached; the message says why and what to do."""

    has_fix = True  # the core adds no generic advice after this message


def modules_of(result: Any) -> Iterator[Any]:
    """Every ``torch.nn.Module`` reachable as ``result`` itself or as a pipeline component (one level)."""
    import torch

    if isinstance(result, torch.nn.Module):
        yield from result.modules()
        return
    components = getattr(result, "components", None)
    if isinstance(components, dict):
        for value in components.values():
            if isinstance(value, torch.nn.Module):
                yield from value.modules()


def _hooked(result: Any) -> str | None:
    for m in modules_of(result):
        hook = getattr(m, "_hf_hook", None)
        if hook is not None:
            return f"{type(m).__name__} carries an accelerate {type(hook).__name__}"
    return None


@contextlib.contextmanager
def guard(adapter: str, result: Any, loader: Any) -> Iterator[None]:
    """Refuse dispatched results; re-raise pickling failures with the adapter and versions named."""
    why = _hooked(result)
    if why:
        raise NotCacheable(
            f"{label(adapter)}: {loader.name} returned a model dispatched by accelerate ({why}: a device_map over "
            f"several devices, or offloading). It is not cached. Load onto one device (device_map='cuda:0' or "
            f"'cpu') to cache it.")
    try:
        yield
    except Exception as e:
        from overmind.pickling import PicklingFailed

        if isinstance(e, PicklingFailed) and not isinstance(e, NotCacheable):
            raise NotCacheable(f"{label(adapter)}: cannot pickle what {loader.name} returned: {e}") from e
        raise
