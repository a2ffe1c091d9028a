"""Which importable modules an adapter's libraries provide, and whether they are imported yet.

An adapter declares its libraries as requirements with ``extra == "instruments"`` (distribution names,
``stable-fast``); its hooks need the modules those distributions install (``sfast``). An adapter is *live*
in a process once every one of its libraries is imported there: only then can objects of that library exist,
so only then do its patches, reducers and key hooks have anything to do.
"""
from __future__ import annotations

import sys
from functools import cache

from .._util import distributions
from . import requirements


def instruments_requirements(dist: distributions.Distribution | None) -> list[requirements.Requirement]:
    """The requirements an adapter distribution declares under its ``instruments`` extra only."""
    if dist is None:
        return []
    return requirements.instruments_only(dist.requires or [])


def tested_requirements(dist: distributions.Distribution | None) -> list[requirements.Requirement]:
    """The library versions an adapter distribution's test lanes run, under its ``tested`` extra: activation does
    not require them; outside them the adapter checks itself (:mod:`overmind.loading.adapter_check`)."""
    if dist is None:
        return []
    return requirements.extra_only(dist.requires or [], "tested")


def untested(dist: distributions.Distribution | None) -> list[tuple[str, str, str]]:
    """``(library, installed version, tested range)`` for each library of ``dist``'s ``tested`` extra whose
    installed version lies outside that range (a library not installed is not listed)."""
    out = []
    for req in tested_requirements(dist):
        have = distributions.version(req.name)
        if have is not None and req.specifier and not req.satisfied_by(have):
            out.append((req.name, have, ",".join(sorted(req.specifier, key=lambda c: not c.startswith(">")))))
    return out


def instrumented_distributions(dist: distributions.Distribution | None) -> list[str]:
    """The distribution names an adapter distribution declares under its ``instruments`` extra."""
    return [r.name for r in instruments_requirements(dist)]


@cache
def top_level_modules(dist_name: str) -> tuple[str, ...]:
    """The top-level modules distribution ``dist_name`` installs (``stable-fast`` -> ``("sfast",)``)."""
    fallback = (dist_name.replace("-", "_").lower(),)
    dist = distributions.distribution(dist_name)
    if dist is None:
        return fallback
    text = dist.read_text("top_level.txt")
    if text:
        names = tuple(n.strip() for n in text.split() if n.strip() and not n.startswith("_"))
        if names:
            return names
    found = set()
    for parts in dist.file_parts() or ():
        if len(parts) >= 2 and parts[1] == "__init__.py" and not parts[0].endswith((".dist-info", ".data")):
            found.add(parts[0])
        elif len(parts) == 1 and parts[0].endswith(".py") and not parts[0].startswith("_"):
            found.add(parts[0][:-3])
    return tuple(sorted(found)) or fallback


def module_groups(dist: distributions.Distribution | None) -> tuple[tuple[str, ...], ...]:
    """For each instrumented library, the modules any one of which shows it is imported."""
    return tuple(top_level_modules(name) for name in instrumented_distributions(dist))


def missing_module(groups: tuple[tuple[str, ...], ...]) -> str | None:
    """A module to wait for before the adapter is live, or None if it is live now."""
    for group in groups:
        if not any(m in sys.modules for m in group):
            return group[0]
    return None
