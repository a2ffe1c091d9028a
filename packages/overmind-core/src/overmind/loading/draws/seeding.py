"""Whether the program has seeded torch's global generator since torch was imported: torch's seeding functions
counted, its import's seed kept.

torch seeds its default CPU generator from the OS when it is imported. Until the program seeds it, the state it is
in is random, and where a loader leaves it is random too: a process that has not seeded cannot tell a generator
that moved from one that did not, so a hit whose result keeps no drawn value may leave it as it is
(:mod:`..randomness`). Once the program seeds, the generator's states are reproducible, and a hit must leave it
exactly where the plain call leaves it.

The watch starts when ``overmind`` is imported (:func:`watch`): torch's import is seen if it comes later, and the
seed torch's import drew is kept. From then on the generator counts as seeded when

- ``torch.manual_seed``, ``torch.seed``, ``torch.set_rng_state`` or ``torch.random.fork_rng`` was called
  (wrapped, under both of their names in ``torch`` and ``torch.random``), or
- ``torch.initial_seed()`` is no longer the seed torch's import drew (the generator's own ``manual_seed``,
  ``seed`` or ``set_state`` with another stream's state, however reached).

torch imported before ``overmind`` counts as seeded for good: what the program did with the generator before the
watch (a 64-bit seed of its own, a saved state set back) cannot be told from torch's own start. The generator's own
``set_state`` with a state saved from the same stream, called directly on ``torch.default_generator``, is not seen.

``import overmind`` runs :func:`watch`, and ``overmind run``'s launcher imports ``overmind``: this module imports
only :mod:`sys` and the post-import hooks (``adapters/importwatch.py``, as light), and ``functools`` once torch is
imported.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

# torch.random's functions that seed or set the CPU generator; torch re-exports each under its own name
SEEDING = ("manual_seed", "seed", "set_rng_state", "fork_rng")
_HOMES = ("torch", "torch.random")


class _State:
    """The watch's knowledge: ``import_seed`` is the seed torch's import drew (None: torch was imported before the
    watch, or not yet), ``seedings`` counts the program's calls to the wrapped functions, ``wrapped`` maps
    ``(module name, attribute)`` to the original function."""

    watching = False
    import_seed: int | None = None
    seedings = 0
    wrapped: dict[tuple[str, str], Any] = {}


def watch() -> None:
    """Watch torch's generator from torch's import on (idempotent). Without torch yet, wait for its import."""
    if _State.watching:
        return
    _State.watching = True
    if "torch" in sys.modules:  # imported before the watch: what happened to its generator is unknown
        _wrap(sys.modules["torch"], seen_import=False)
        return
    from ...adapters import importwatch

    importwatch.when_imported("torch", _on_torch_import)


def unwatch() -> None:
    """Put every wrapped function back and forget the import's seed (tests)."""
    from ...adapters import importwatch

    importwatch.cancel(_on_torch_import)
    for (module_name, name), original in _State.wrapped.items():
        module = sys.modules.get(module_name)
        if module is not None and getattr(getattr(module, name, None), "_overmind_seeding", False):
            setattr(module, name, original)
    _State.wrapped = {}
    _State.watching = False
    _State.import_seed = None


def unseeded() -> bool:
    """Whether torch's generator is known to stand where the OS's seed put it, moved only by draws: the watch saw
    torch's import, no seeding call since, and the same seed as the import drew."""
    if _State.import_seed is None or _State.seedings:
        return False
    torch = sys.modules.get("torch")
    return torch is not None and torch.initial_seed() == _State.import_seed


def watching() -> bool:
    """Whether the watch runs (a torch imported later will be seen from its import on)."""
    return _State.watching


def seedings() -> int:
    """How many times the program called a wrapped seeding function (a load compares the count before and after
    its loader: a loader that seeds leaves the process seeded)."""
    return _State.seedings


def seeded_from_os() -> None:
    """Seed torch's generator from the OS, as its import does in a fresh process, and count the program as not
    having seeded it where the watch saw torch's import (a program forked from an ``overmind run`` template starts
    so)."""
    torch = sys.modules["torch"]
    seed = _State.wrapped.get(("torch.random", "seed"), torch.random.seed)
    seed()
    if _State.import_seed is not None:
        _State.import_seed = torch.initial_seed()
        _State.seedings = 0


def _on_torch_import(torch: ModuleType) -> None:
    _wrap(torch, seen_import=True)


def _wrap(torch: ModuleType, seen_import: bool) -> None:
    random = getattr(torch, "random", None)
    if random is None or not hasattr(torch, "initial_seed"):
        return
    _State.import_seed = torch.initial_seed() if seen_import else None
    for name in SEEDING:
        original = getattr(random, name, None)
        if original is None or getattr(original, "_overmind_seeding", False):
            continue
        wrapper = _counting(original)
        for home in _HOMES:
            module = sys.modules.get(home)
            if module is not None and getattr(module, name, None) is original:
                _State.wrapped[(home, name)] = original
                setattr(module, name, wrapper)


def _counting(original: Callable) -> Callable:
    import functools

    @functools.wraps(original)
    def seeding(*args: Any, **kwargs: Any) -> Any:
        _State.seedings += 1
        return original(*args, **kwargs)

    seeding._overmind_seeding = True  # type: ignore[attr-defined]
    return seeding
