"""Helpers shared by the test suites of every package (not tests themselves; pytest does not collect them).

The test-only adapters live in :data:`TEST_PLUGINS_DIR`, outside the venv (see there).

The root ``pyproject.toml`` puts ``tests/`` on ``sys.path`` (pytest's ``pythonpath`` option), so every suite
imports them as ``from _support import tiny_models``; no conftest edits ``sys.path``. A fresh process a test
starts gets the same with :func:`pythonpath_env` (``PYTHONPATH`` with ``tests/`` in front), so a helper module
(a loader in :mod:`_support.fault_loaders`, a builder in :mod:`_support.sfast_pipelines`) has the same name,
hence the same cache key, in the test and in every process it starts.

* :mod:`_support.tiny_models`: tiny HF models, pipelines and tokenizers built locally (no Hub).
* :mod:`_support.adapter_testlib`: the fresh-process runner and fixtures of the adapter packages' suites.
* :mod:`_support.adapter_packages`: the repository's adapters, found under ``packages/`` as the build finds them.
* :mod:`_support.fault_procs`, :mod:`_support.fault_loaders`: background processes and gated loaders of the
  core's fault tests.
* :mod:`_support.ldm_checkpoint`: the tiny SD pipeline written as one original-format (LDM) checkpoint.
* :mod:`_support.bnb_testlib`: overmind-bnb's tiny quantizable Llama and round trips.
* :mod:`_support.sfast_pipelines`, :mod:`_support.sfast_modules`, :mod:`_support.sfast_roundtrip`:
  overmind-sfast's compiled pipeline builder, traced modules and in-process round trip.
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


def pythonpath_env(env: dict[str, str] | None = None) -> str:
    """``PYTHONPATH`` for a fresh process: :data:`TESTS_DIR` and :data:`TEST_PLUGINS_DIR` in front of ``env``'s
    (default: ours), each once."""
    rest = _paths((os.environ if env is None else env).get("PYTHONPATH"))
    return os.pathsep.join([TESTS_DIR, TEST_PLUGINS_DIR, *(p for p in rest if p not in (TESTS_DIR, TEST_PLUGINS_DIR))])


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
