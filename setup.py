"""Build hook of the ``overmind`` metapackage: one extra per adapter of ``packages/``, found there, not listed.

An adapter is a folder ``packages/overmind-<name>`` whose ``pyproject.toml`` declares an ``overmind.adapters``
entry point. Its extra ``<name>`` installs what that file's ``[tool.overmind] extra`` names (by default the adapter
with its ``instruments`` extra, the library versions it is tested with), each at this metapackage's version;
``all`` is every extra. Metadata lives in pyproject.toml; this file only adds the extras.
"""
from __future__ import annotations

import glob
import os
import re

from setuptools import setup

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the build requires tomli there (pyproject.toml)
    import tomli as tomllib  # type: ignore[no-redef]

HERE = os.path.dirname(os.path.abspath(__file__))
GROUP = "overmind.adapters"


def _toml(path: str) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def adapter_extras() -> dict[str, list[str]]:
    """``{name: [requirement, ...]}`` of every adapter under packages/, and ``all``."""
    version = _toml(os.path.join(HERE, "pyproject.toml"))["project"]["version"]
    extras: dict[str, list[str]] = {}
    for path in sorted(glob.glob(os.path.join(HERE, "packages", "overmind-*", "pyproject.toml"))):
        pyproject = _toml(path)
        project = pyproject["project"]
        if GROUP not in project.get("entry-points", {}):
            continue  # the core, or a library the adapters share (overmind-hf)
        name = project["name"]
        wanted = pyproject.get("tool", {}).get("overmind", {}).get("extra", [f"{name}[instruments]"])
        extras[name.removeprefix("overmind-")] = [f"{req}=={version}" for req in wanted]
    assert all(re.fullmatch(r"overmind-[\w-]+(\[[\w,]+\])?==[\w.]+", r) for reqs in extras.values() for r in reqs)
    extras["all"] = [f"overmind[{','.join(sorted(extras))}]"]
    return extras


setup(extras_require=adapter_extras())
