"""Entries that vary with state outside the call's key, as HTTP caches honour ``Vary``: the marker under the call's
key names that state, and the variant's key adds a digest of it (generator states, file contents).

Some calls return what their key alone does not decide: a loader that draws from the global random generators
(:mod:`.randomness`), one that reaches the user's modules through a local import (:mod:`.code_deps`). A miss
records what the call depended on as *names* (``torch``, ``random``, ``numpy.random``, ``torch.cuda:N``,
``code:<path>``). The entry under the call's key is then a marker whose meta names them (:data:`MARKER`), and the
result is published under :func:`variant_key`: the call's key, :data:`SEP`, and a digest of each name's state (a
generator's state before the call; a file's content). A hit on the marker computes the same digest from this
process's states and asks for that variant; a state not seen yet runs the loader once and adds its variant.
"""
from __future__ import annotations

import hashlib
from typing import Any

from . import code_deps, randomness

MARKER = "vary"  # entry meta of a marker: the names the call's variants vary with
SEP = "~vary:"


def variant_key(key: str, names: list[str], generator_states: dict[str, Any] | None = None) -> str | None:
    """``key`` extended by the digest of the ``names``' states: generators' from ``generator_states`` (a snapshot
    taken before a call; default: now), files' from their content. ``None`` when a file's state cannot stand for
    this process's code (:func:`code_deps.state`): the call is then the loader's, plainly."""
    code = [n for n in names if n.startswith(code_deps.PREFIX)]
    states: dict[str, Any] = randomness.states_for([n for n in names if n not in code], generator_states)
    for name in code:
        state = code_deps.state(name)
        if state is None:
            return None
        states[name] = state
    h = hashlib.sha256()
    for name in sorted(states):
        h.update(repr((name, states[name])).encode())
    return f"{key}{SEP}{h.hexdigest()[:32]}"


def base_key(key: str) -> str:
    """The call's key of a variant's key (a key that is no variant's: itself)."""
    return key.split(SEP, 1)[0]
