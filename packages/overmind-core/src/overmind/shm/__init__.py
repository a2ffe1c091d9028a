"""Shared memory for entries: one sealed memfd per entry (layout), written once (writer), mapped copy-on-write by
every reader (reader), with a registry of the live mappings of this process (mappings), checkpoint files referenced
in place, and the GPU twins.

The two functions here are what an adapter asks of this process's mappings (the kit, ``overmind.adapter``, hands
them on); they import the modules that answer when called.
"""
from __future__ import annotations


def in_cache_mapping(address: int) -> bool:
    """Whether ``address`` lies in a cache entry (or a checkpoint file) this process maps for a hit."""
    from . import mappings

    return mappings.contains(address)


def pages_untouched(ranges: list[tuple[int, int]]) -> bool:
    """Whether every ``(address, nbytes)`` range of a cache mapping still holds the bytes it was
    mapped with: no page of it written since (``/proc/self/pagemap``); False where that cannot be
    told."""
    from . import pagemap

    return pagemap.all_pristine(ranges)
