"""Hub kernels (transformers >= 5.25): what a model load does with them, as a key part and a refusal.

Since 5.25 ``from_pretrained`` kernelizes the model it loads (``use_kernels`` defaults to on, the environment
variable ``USE_HUB_KERNELS`` turns it off): it sets ``model.use_kernels`` and may replace layers' ``forward`` with
kernels the ``kernels`` package fetches from the Hub. So two calls with the same arguments return different
models under another ``USE_HUB_KERNELS``: :func:`key_part` keys every model load by the flag the load resolves
(the argument, else the environment) and by the ``kernels`` version. A model whose layers were replaced holds
code from the Hub cache, which another process may not have: :func:`refusal` says so, and it is not cached.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def key_part(arguments: dict[str, Any]) -> tuple | None:
    """``("use_kernels", resolved, kernels version)`` where this transformers kernelizes; else None."""
    hub = sys.modules.get("transformers.integrations.hub_kernels")
    enabled = getattr(hub, "_kernels_enabled", None)
    if enabled is None:
        return None  # before 5.25: a load never kernelizes unless asked, and the argument is keyed as it is
    wanted = arguments.get("use_kernels")
    # as from_pretrained resolves it: USE_HUB_KERNELS=0 turns it off whatever is asked; else the argument, on if None
    resolved = bool(enabled()) and (wanted is None or bool(wanted))
    if not resolved:
        return ("use_kernels", False)
    from overmind.adapter import version_of

    return ("use_kernels", True, version_of("kernels"))


def refusal(result: Any) -> str | None:
    """Why ``result`` is not cached: the layers whose ``forward`` kernelize replaced, or None."""
    named = getattr(result, "named_modules", None)
    if named is None or not getattr(result, "use_kernels", False):
        return None
    # kernelize marks a layer whose forward it replaced with a Hub kernel by its repository (``_kernel_repo``);
    # a layer left on its own forward (no kernel for this device, or none could be fetched) has none
    replaced = [name or type(m).__name__ for name, m in named() if vars(m).get("_kernel_repo") is not None]
    if not replaced:
        return None
    shown = ", ".join(replaced[:3]) + (f" and {len(replaced) - 3} more" if len(replaced) > 3 else "")
    return (f"its layers run Hub kernels ({shown}), code the kernels package fetched into this machine's Hub "
            f"cache; pass use_kernels=False (or set USE_HUB_KERNELS=0) to cache it")
