"""The adapters of this repository, found as the build finds them: every ``packages/overmind-*`` folder whose
``pyproject.toml`` declares an ``overmind.adapters`` entry point (setup.py, scripts/setup and scripts/test look
the same way). A new adapter is its folder; no test lists it."""
from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def adapter_pyprojects() -> dict[str, dict]:
    """``{adapter name: its parsed pyproject.toml}``, the name being the entry point's (``transformers``)."""
    found = {}
    for path in sorted(ROOT.glob("packages/overmind-*/pyproject.toml")):
        pyproject = tomllib.loads(path.read_text())
        for name in pyproject["project"].get("entry-points", {}).get("overmind.adapters", {}):
            found[name] = pyproject
    return found


def adapter_names() -> set[str]:
    """The names the repository's adapters register under (``{"bnb", "diffusers", ...}``)."""
    return set(adapter_pyprojects())
