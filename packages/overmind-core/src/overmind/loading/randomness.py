"""The process's global random generators: a loader that draws from them is not cached.

A plain call that draws (a head the checkpoint lacks, initialised at random; a user's ``Net()`` built at random and
then overwritten by ``load_state_dict``; a loader that seeds and samples) leaves the
generator further on than it found it, and may return values that depend on where it found it. A hit would do
neither: it would return the first call's values and leave the generator where it is, so every later
``torch.randn`` of the user's would differ from the plain run's. Overmind therefore looks at the generators
before and after a miss's loader runs, and a call that moved any of them is returned as the loader made it and
not published (slow, never wrong). A hit cannot draw: an entry exists only for a call that drew nothing.

The generators looked at are those a loader reaches without being given one: torch's default CPU generator,
each initialised CUDA device's default generator (CUDA is never initialised here), Python's ``random`` module
and NumPy's legacy global ``numpy.random`` state. torch seeds its generator at import with a seed it keeps
(``torch.initial_seed()``), so a loader that imports torch itself and draws is caught too (the state is compared
with a generator given that seed; one that only seeds it is not). ``random`` and NumPy seed theirs from the OS
at import and keep no seed; for a loader that is the first to import one of them, the generator's position in its
Mersenne Twister block and its cached Gaussian are compared with a new generator's: any draw moves them, except
a draw of exactly a multiple of the block (624 words) right after the import, which is not caught (``random`` is
imported by the standard library's own modules long before a loader runs; NumPy by torch's import). An explicit
``torch.Generator`` argument is not a global one; the key refuses it (``Unkeyable``).
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def snapshot() -> dict[str, Any]:
    """``{generator name: its state}`` for every global generator the process has now (see the module doc)."""
    states: dict[str, Any] = {}
    rand = sys.modules.get("random")
    if rand is not None:
        states["random"] = rand.getstate()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):  # not halfway through its import
        states["torch"] = bytes(torch.get_rng_state().numpy())
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            for i in range(cuda.device_count()):
                states[f"torch.cuda:{i}"] = bytes(cuda.get_rng_state(i).numpy())
    np_random = sys.modules.get("numpy.random")
    if np_random is not None and hasattr(np_random, "get_state"):
        name, keys, pos, has_gauss, gauss = np_random.get_state()
        states["numpy.random"] = (name, keys.tobytes(), pos, has_gauss, gauss)
    return states


def moved(before: dict[str, Any]) -> list[str]:
    """The names of the generators whose state differs from ``before`` (a :func:`snapshot`). torch imported
    meanwhile is compared with the state it starts from; ``random`` and NumPy imported meanwhile with the position
    a generator seeded from the OS has (:func:`_as_seeded`)."""
    after = snapshot()
    if "torch" in after and "torch" not in before:
        torch = sys.modules["torch"]
        start = torch.Generator()
        start.manual_seed(torch.initial_seed())
        before = dict(before, torch=bytes(start.get_state().numpy()))
    drew = [name for name, state in before.items() if after.get(name, state) != state]
    return drew + [name for name, state in after.items() if name not in before and not _as_seeded(name, state)]


def _as_seeded(name: str, state: Any) -> bool:
    """Whether ``random``'s or NumPy's global generator, imported meanwhile, still stands where a generator seeded
    from the OS stands (its keys are the OS's, unknown; its position and cached Gaussian are not)."""
    if name == "random":
        new = sys.modules["random"].Random().getstate()
        return bool(state[1][-1] == new[1][-1] and state[2] == new[2])
    if name == "numpy.random":
        _, _, pos, has_gauss, gauss = sys.modules["numpy.random"].RandomState().get_state()
        return bool(state[2:] == (pos, has_gauss, gauss))
    return True  # a CUDA device initialised meanwhile: its generator is seeded as torch's
