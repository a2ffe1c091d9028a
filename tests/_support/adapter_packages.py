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


def adapters_with_their_libraries() -> set[str]:
    """The adapters whose ``instruments`` libraries this environment has installed: the ones ``activate()`` loads
    here. (The timm lane's venv has timm but not transformers; the other lanes the reverse.)"""
    from importlib import metadata

    from packaging.requirements import Requirement

    def installed(line: str) -> bool:
        try:
            metadata.version(Requirement(line).name)
        except metadata.PackageNotFoundError:
            return False
        return True

    return {name for name, pyproject in adapter_pyprojects().items()
            if all(installed(line) for line in pyproject["project"]["optional-dependencies"]["instruments"])}
