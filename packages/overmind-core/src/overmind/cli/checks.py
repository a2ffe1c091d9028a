"""What one ``overmind doctor`` check found: a state (``ok``, ``warn`` or ``fail``), one line of detail and,
when not ok, what to do. A leaf module, so the modules contributing checks (:mod:`.compatibility`) and the
doctor that runs them need not import each other."""
from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass
class Check:
    """The outcome of one check."""

    name: str
    state: str
    detail: str
    fix: str = ""
