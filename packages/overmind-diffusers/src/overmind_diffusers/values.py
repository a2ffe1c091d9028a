"""Key stand-ins for diffusers objects users pass to a pipeline's ``from_pretrained``.

- A scheduler is keyed by class, config (``DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)``
  is the usual way to swap one in) and every other attribute it holds (its tables and, after
  ``set_timesteps``, its timestep state): two schedulers a loader could tell apart never share a key.
- A ``MultiControlNetModel`` built by hand is keyed by its ControlNets, each of which must itself come from
  the cache (the core keys those by their entry).
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def key_for_value(value: Any) -> Any:
    """A keyable stand-in for ``value``, or ``None`` if this adapter does not know it."""
    schedulers = sys.modules.get("diffusers.schedulers.scheduling_utils")
    scheduler_base = getattr(schedulers, "SchedulerMixin", None)
    if scheduler_base is not None and isinstance(value, scheduler_base):
        config = getattr(value, "config", None)
        if isinstance(config, dict):
            config = dict(config)
            # diffusers fills this list from a set: its order differs between processes, its content does not.
            if isinstance(config.get("_use_default_values"), list):
                config["_use_default_values"] = sorted(map(str, config["_use_default_values"]))
            state = {k: v for k, v in vars(value).items() if k != "_internal_dict"}
            return ("scheduler", config, state)
        return None
    for module_name, class_name in (
            ("diffusers.models.controlnets.multicontrolnet", "MultiControlNetModel"),
            ("diffusers.models.controlnets.multicontrolnet_union", "MultiControlNetUnionModel")):
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is not None and type(value) is cls:
            return ("multi-controlnet", list(value.nets))
    return None
