"""Helpers shared by the test suites of every package (not tests themselves; pytest does not collect them).

The test-only adapters live in :data:`TEST_PLUGINS_DIR`, outside the venv (see there).

The root ``pyproject.toml`` puts ``tests/`` on ``sys.path`` (pytest's ``pythonpath`` option), so every suite
imports them as ``from _support import tiny_models``; no conftest edits ``sys.path``. A fresh process a test
starts gets the same with :func:`pythonpath_env` (``PYTHONPATH`` with the folders of that option in front), so a
helper module (a loader in :mod:`_support.fault_loaders`, a builder in ``overmind_sfast_testlib.pipelines``) has
the same name, hence the same cache key, in the test and in every process it starts.

* :mod:`_support.tiny_models`: tiny HF models, pipelines and tokenizers built locally (no Hub).
* :mod:`_support.adapter_testlib`: the fresh-process runner and fixtures of the adapter packages' suites.
* :mod:`_support.adapter_packages`: the repository's adapters, found under ``packages/`` as the build finds them.
* :mod:`_support.fault_procs`, :mod:`_support.fault_loaders`: background processes and gated loaders of the
  core's fault tests.

What one adapter's tests alone use lives in that package's ``tests/`` folder, as a module or package named
``overmind_<lib>_testlib`` (``overmind_bnb_testlib``: unique across packages, since every such folder is on the
same ``sys.path``), that folder being on pytest's ``pythonpath`` too.
"""
from __future__ import annotations

import os

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository's ``tests/`` folder: the one ``sys.path`` entry that makes ``_support`` importable."""

TEST_PLUGINS_DIR = os.path.join(os.path.dirname(TESTS_DIR), ".test-plugins")
"""Where scripts/setup installs the test-only adapters (``tests/adapter_fixture*``: ``fixture``,
``fixture_broken``, ``future``) with ``pip --target``: on ``sys.path`` only in pytest (its ``pythonpath``) and,
through ``PYTHONPATH`` (the root ``conftest.py`` exports it), in the processes a test starts. The venv itself has
no test-only adapter, so a user's code and the demo never see one."""


def _paths(value: str | None) -> list[str]:
    return [p for p in (value or "").split(os.pathsep) if p]


def pytest_pythonpath() -> list[str]:
    """The folders of pytest's ``pythonpath`` option (the root ``pyproject.toml``), absolute, in its order:
    :data:`TESTS_DIR`, :data:`TEST_PLUGINS_DIR` and the adapters' test folders that hold helpers."""
    import tomllib

    root = os.path.dirname(TESTS_DIR)
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        listed = tomllib.load(f)["tool"]["pytest"]["ini_options"]["pythonpath"]
    return [os.path.join(root, p) for p in listed]


def pythonpath_env(env: dict[str, str] | None = None) -> str:
    """``PYTHONPATH`` for a fresh process: the folders of :func:`pytest_pythonpath` in front of ``env``'s (default:
    ours), each once."""
    front = pytest_pythonpath()
    rest = _paths((os.environ if env is None else env).get("PYTHONPATH"))
    return os.pathsep.join([*front, *(p for p in rest if p not in front)])


def without_test_plugins(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: ours) whose ``PYTHONPATH`` lacks :data:`TEST_PLUGINS_DIR`: a process started
    with it sees the venv as a user does, without the test-only adapters."""
    out = dict(os.environ if env is None else env)
    rest = [p for p in _paths(out.get("PYTHONPATH")) if os.path.abspath(p) != TEST_PLUGINS_DIR]
    if rest:
        out["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        out.pop("PYTHONPATH", None)
    return out
