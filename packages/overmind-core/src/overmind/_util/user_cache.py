"""The user's Overmind cache folder, ``$XDG_CACHE_HOME/overmind`` (default ``~/.cache/overmind``): files that
outlive a server and belong to one user (the adapters' remembered self-checks, extensions built for another torch).
A leaf module.

>>> path("native", "torch-2.15.0-cpython-311")
'/home/me/.cache/overmind/native/torch-2.15.0-cpython-311'
"""
from __future__ import annotations

import os


def path(*parts: str) -> str:
    """``parts`` under the user's Overmind cache folder (nothing is created)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "overmind", *parts)
