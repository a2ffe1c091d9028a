"""The overmind-sfast adapter: hook implementations registered under the entry point ``overmind.adapters``.

What it does, once ``overmind.activate()`` has run:

* patches stable-fast so that what it traces can be saved: dataclass outputs keep their class by name
  (:mod:`overmind_sfast.flattening`), clean-up hooks live beside the module, not in it
  (:mod:`overmind_sfast.clear_hooks`); ``overmind.deactivate()`` puts the identical originals back;
* teaches the pickler stable-fast's wrappers (:mod:`overmind_sfast.reducers`), so a compiled and warmed-up
  pipeline, cached as a whole with ``overmind.load(build, ckpt)``, comes back in any process ready to run,
  with every trace made so far and without tracing again.

It patches no loader: there is nothing to route through the cache, the user's builder is the loader.
The versions it needs (``stable-fast>=1.0.5``, ``torch>=2.1``) are the ``instruments`` extra of the
distribution; the core checks them before importing this module and skips the adapter with one line of why
when stable-fast is missing.
"""
from __future__ import annotations

import overmind

from . import clear_hooks, flattening

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence


def patch_targets() -> list:
    """Every behavioural patch overmind-sfast applies while active (``PatchTarget(kind="replace")``)."""
    return flattening.patch_targets() + clear_hooks.patch_targets()


@overmind.hookimpl
def overmind_patch_targets() -> Sequence[Any]:
    return patch_targets()


@overmind.hookimpl
def overmind_reducers() -> Mapping[type, Callable[[Any], Any]]:
    from .reducers import reducers  # late: activate() imports this plugin, and the reducers need pickle

    return reducers()
