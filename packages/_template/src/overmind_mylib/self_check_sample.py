"""The self-check's sample: a tiny mylib model, built in memory (no file read, no network). On a
release outside ``tested`` it goes through the entry codec once per environment and must come back
equal (its class, config and every tensor's bytes)."""
from __future__ import annotations

from typing import Any


def sample() -> Any:
    import mylib  # late: this module is imported with the plugin, before mylib may be

    return mylib.Model(hidden=4, classes=2)
