"""The process's global random generators (torch, CUDA, ``random``, NumPy) before and after a miss's loader: a call
that drew is published as the variant of their states before it, with their states after it, which a hit restores;
where the program has not seeded torch's, as the variant every unseeded process shares.

A plain call that draws (a head the checkpoint lacks, initialised at random; a user's ``Net()`` built at random and
then overwritten by ``load_state_dict``; a loader that seeds and samples) returns values that may depend on where it
found the generators, and leaves them further on. Its result is a function of the call's key *and* of the
generators' states before the call, and the generators' states after the call are a function of the same. So
the entry varies with them (:mod:`.vary`): the call's key holds a marker naming the generators the loader moved,
and the result is published as the variant of those generators' states before the call (:func:`states_for`), with
their states after it (:func:`encode_after`). A hit digests the process's current states, finds the variant made
from the same states, and sets the generators to the recorded after-states (:func:`restore`): the result is
what the plain call returns from there, and the process is exactly where the plain call would leave it. A script
that seeds (``torch.manual_seed``, ``random.seed``, ``numpy.random.seed``) before it loads reaches the same states
in every run, so these loaders hit from the next process on, draws made between the seed and the load included.

torch seeds its default generator from the OS at start-up (``torch.initial_seed()`` is then a 64-bit number no
script chooses): a call that draws from it before any seed was set starts from a state no other process has, and a
variant made from it would never be served. Where the program has not seeded torch's generator since torch was
imported (:mod:`.draws.seeding`), that state is random, and so is where the plain call leaves it: a result that
keeps no drawn value (:mod:`.draws.tracker` follows the draws during the miss) is the same in every such process,
and its variant is the one of the state :data:`UNSEEDED`, which every unseeded process computes; a hit leaves the
generator as it is (:attr:`Movement.unseeded`). A result that keeps drawn values, or a call whose draws could not be
followed, is not published (:attr:`Movement.unrepeatable`, logged); the loader runs as plain. Otherwise a seed of
2**32 or more is taken for the OS's, and such a call is not published either.

The generators looked at are those a loader reaches without being given one: torch's default CPU generator,
each initialised CUDA device's default generator (CUDA is never initialised here), Python's ``random`` module
and NumPy's legacy global ``numpy.random`` state. An explicit ``torch.Generator`` argument is not a global one;
the key refuses it (``Unkeyable``).

A generator imported during the call is compared with where it starts (:func:`movement`):

- torch: with the state its import seeded (``torch.initial_seed()``), as a hit in a process without torch computes
  it; drawn from, that state is the OS's (above);
- ``random`` and NumPy seed theirs from the OS at import and keep no seed: the generator's position in its
  Mersenne Twister block and its cached Gaussian are compared with a new generator's. A loader that is the first
  to import one of them and draws from it starts from a state no other process has: not cached
  (:attr:`Movement.unrepeatable`). A draw of exactly a multiple of the block (624 words) right after the import is
  not seen (``random`` is imported by the standard library's own modules long before a loader runs; NumPy by
  torch's import);
- a CUDA device initialised during the call starts from torch's seed; a draw there moves it from that state, and
  such a call is not cached (a hit process may not have the device initialised to digest it).
"""
from __future__ import annotations

import base64
import sys
from typing import Any, NamedTuple

from .._util import interrupts
from .draws import seeding

AFTER = "random_after"  # entry meta of a variant: the generators' states after the call (encode_after)
_SEED = "torch.initial_seed"  # in a snapshot beside the generators: the seed torch's generator was last given
_UNSEEDED = "torch.unseeded"  # in a snapshot: whether the program has not seeded torch's generator, and the count
# of seeding calls (seeding.seedings) then
UNSEEDED = "unseeded"  # the state a variant's key gives torch's generator where the program has not seeded it
_EXTRA = (_SEED, _UNSEEDED)
OS_SEED_FLOOR = 2**32  # torch's own seeds are 64-bit draws from the OS; a script's are small numbers


def snapshot() -> dict[str, Any]:
    """``{generator name: its state}`` for every global generator the process has now (see the module doc)."""
    states: dict[str, Any] = {}
    rand = sys.modules.get("random")
    if rand is not None:
        states["random"] = rand.getstate()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):  # not halfway through its import
        states["torch"] = bytes(torch.get_rng_state().numpy())
        states[_SEED] = torch.initial_seed()
        states[_UNSEEDED] = (seeding.unseeded(), seeding.seedings())
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            for i in range(cuda.device_count()):
                states[f"torch.cuda:{i}"] = bytes(cuda.get_rng_state(i).numpy())
    np_random = sys.modules.get("numpy.random")
    if np_random is not None and hasattr(np_random, "get_state"):
        name, keys, pos, has_gauss, gauss = np_random.get_state()
        states["numpy.random"] = (name, keys.tobytes(), pos, has_gauss, gauss)
    return states


def unseeded_in(states: dict[str, Any]) -> bool:
    """Whether a :func:`snapshot` was taken with torch imported and its generator not seeded by the program."""
    return bool(states.get(_UNSEEDED, (False,))[0])


class Movement(NamedTuple):
    """What a call did to the generators: ``names`` it moved (sorted); those among them whose state before the
    call no other process can have (``unrepeatable``: torch's generator as its start-up seeded it, ``random`` or
    NumPy seeded from the OS during the call, a CUDA device started); and ``unseeded``: torch's, moved where the
    program had not seeded it before the call and still has not after it (the variant of :data:`UNSEEDED`, valid
    only for a result that keeps no drawn value)."""

    names: list[str]
    unrepeatable: list[str]
    unseeded: list[str] = []


def movement(before: dict[str, Any]) -> Movement:
    """Compare the generators now with ``before`` (a :func:`snapshot` taken before the call)."""
    after = snapshot()
    seed = before.get(_SEED, after.get(_SEED))
    unseeded = "torch" in before and before.get(_UNSEEDED) == (True, seeding.seedings()) and seeding.unseeded()
    before = _with_torch_start(before, after)
    moved = [name for name, state in before.items() if name not in _EXTRA and after.get(name, state) != state]
    new = [name for name, state in after.items()
           if name not in before and name not in _EXTRA and not _as_started(name, state)]
    if unseeded and "torch" in moved:
        return Movement(sorted(moved + new), sorted(new), ["torch"])
    os_seeded = ["torch"] if "torch" in moved and seed is not None and seed >= OS_SEED_FLOOR else []
    return Movement(sorted(moved + new), sorted(new + os_seeded))


def moved(before: dict[str, Any]) -> list[str]:
    """The names of the generators that moved since ``before`` (:func:`movement`'s ``names``)."""
    return movement(before).names


def states_for(names: list[str], states: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``names`` generators' states in ``states`` (a :func:`snapshot` taken before a call; default: now), as a
    variant's key digests them (:mod:`.vary`). torch not imported yet counts as the state its import starts from,
    as the plain call that imports it would find it; another generator absent counts as absent (``None``). torch's
    generator where the program has not seeded it counts as :data:`UNSEEDED`."""
    states = snapshot() if states is None else states
    if "torch" in names and (unseeded_in(states) or ("torch" not in states and seeding.watching())):
        return {name: UNSEEDED if name == "torch" else states.get(name) for name in names}
    states = _with_torch_start(states, {"torch": None} if "torch" in names else {})
    return {name: states.get(name) for name in names}


def encode_after(names: list[str]) -> dict[str, Any]:
    """The ``names`` generators' states now, as JSON for an entry's meta (:func:`restore` sets them back)."""
    now = snapshot()
    out: dict[str, Any] = {}
    for name in names:
        state: Any = now[name]  # a generator the call moved exists after it
        if name == "random":
            out[name] = [state[0], list(state[1]), state[2]]
        elif name == "numpy.random":
            kind, keys, pos, has_gauss, gauss = state
            out[name] = [kind, base64.b64encode(keys).decode(), pos, has_gauss, gauss]
        else:  # torch, torch.cuda:N: the state tensor's bytes
            out[name] = base64.b64encode(state).decode()
    return out


def restore(encoded: dict[str, Any]) -> None:
    """Set each generator named in ``encoded`` (:func:`encode_after`) to its recorded state."""
    for name, value in encoded.items():
        if name == "random":
            import random

            random.setstate((value[0], tuple(value[1]), value[2]))
        elif name == "numpy.random":
            import numpy

            keys = numpy.frombuffer(base64.b64decode(value[1]), dtype=numpy.uint32).copy()
            numpy.random.set_state((value[0], keys, value[2], value[3], value[4]))
        else:
            import torch

            state = torch.frombuffer(bytearray(base64.b64decode(value)), dtype=torch.uint8)
            if name == "torch":  # the generator's own method: no seeding of the program's (draws/seeding.py)
                torch.default_generator.set_state(state)
            else:
                torch.cuda.set_rng_state(state, int(name.rsplit(":", 1)[1]))


def _with_torch_start(states: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``states`` with torch's starting state filled in where torch is in ``after`` but was not imported in
    ``states``."""
    if "torch" not in after or "torch" in states:
        return states
    import torch

    start = torch.Generator()
    start.manual_seed(torch.initial_seed())
    return dict(states, torch=bytes(start.get_state().numpy()), **{_SEED: torch.initial_seed()})


def _as_started(name: str, state: Any) -> bool:
    """Whether a generator that appeared during the call still stands where it starts: ``random``'s or NumPy's
    where a generator seeded from the OS stands (its keys are the OS's, unknown; its position and cached Gaussian
    are not); a CUDA device's where a generator given torch's seed for it stands."""
    if name == "random":
        new = sys.modules["random"].Random().getstate()
        return bool(state[1][-1] == new[1][-1] and state[2] == new[2])
    if name == "numpy.random":
        _, _, pos, has_gauss, gauss = sys.modules["numpy.random"].RandomState().get_state()
        return bool(state[2:] == (pos, has_gauss, gauss))
    if name.startswith("torch.cuda:"):
        try:
            torch = sys.modules["torch"]
            index = int(name.rsplit(":", 1)[1])
            start = torch.Generator(device=f"cuda:{index}")
            start.manual_seed(torch.cuda.default_generators[index].initial_seed())
            return bool(bytes(start.get_state().numpy()) == state)
        except Exception as exc:  # cannot tell: counted as moved, and as unrepeatable
            interrupts.raise_users(exc)
            return False
    return True
