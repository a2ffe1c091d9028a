"""Test helpers shared by the adapter packages' suites (overmind-diffusers, overmind-transformers).

Each package's conftest.py imports what it needs from here (tests/ is on sys.path: see ``_support``):

>>> from _support.adapter_testlib import PRELUDE, active, fresh_runner   # in packages/overmind-xxx/tests/conftest.py
>>> @pytest.fixture
... def fresh(overmind_runtime, tiny, tmp_path):
...     return fresh_runner(PRELUDE + MY_PRELUDE, tiny, tmp_path)

* :data:`PRELUDE`: the head of every fresh-process script: imports, ``P`` (the ``tiny`` folders), and
  ``server_state()`` / ``counted_load(fn)`` to count the entries and hits one load makes.
* :func:`fresh_runner`: runs such scripts in fresh interpreters against the test's private server.
* ``active``: a fixture that activates this install's real adapters (not strict) for one test.
* :func:`overmind_warnings`: the messages of the OvermindWarnings among recorded warnings.
"""
from __future__ import annotations

import itertools
import json
import textwrap
from typing import Any, Callable

import pytest

from . import TESTS_DIR

# Test-fixture adapters of the core's own suite are installed in the dev venv; they are not part of a user's setup.
OTHER_ADAPTERS_OFF = "fixture,fixture_broken,future"

PRELUDE = '''
import hashlib, json, os, sys, warnings
import torch
import overmind
from overmind.testing import overmind_mapped, report
from _support import tiny_models as tm

P = json.loads(os.environ["TINY"])


def server_state():
    entries = overmind.cache_info(processes=False).entries
    return {"entries": len(entries), "hits": sum(e.hits for e in entries)}


def counted_load(fn):
    """(object, new entries on the server, new hits) for one load."""
    before = server_state()
    obj = fn()
    after = server_state()
    return obj, after["entries"] - before["entries"], after["hits"] - before["hits"]
'''


def fresh_runner(prelude: str, tiny: dict[str, str], tmp_path) -> Callable[..., Any]:
    """``run(script, **env)``: run ``script`` after ``prelude`` in a new interpreter against the current
    server; returns what it ``report``-ed. ``tiny`` reaches the script as ``P``. Every run gets its own empty
    ``HF_MODULES_CACHE`` under ``tmp_path`` unless given one, so no run can import remote code another run
    left on disk. ``OVERMIND_STRICT=1``: any fallback fails the run."""
    counter = itertools.count()

    def run(script: str, **env: str):
        from overmind.testing import run_fresh

        full_env = {
            "PYTHONPATH": TESTS_DIR, "OVERMIND_STRICT": "1", "HF_HUB_OFFLINE": "1",
            "OVERMIND_DISABLED_ADAPTERS": OTHER_ADAPTERS_OFF, "TINY": json.dumps(tiny),
            "HF_MODULES_CACHE": str(tmp_path / f"modules-{next(counter)}"), "TOKENIZERS_PARALLELISM": "false",
        }
        full_env.update(env)
        return run_fresh(prelude + textwrap.dedent(script), env=full_env, timeout=600)

    return run


@pytest.fixture
def active(overmind_runtime, monkeypatch):
    """The installed adapters (not the core suite's fixture adapters) activated for one test, against a
    private server, with ``OVERMIND_STRICT`` unset so a fallback warns instead of raising."""
    import overmind
    from overmind.testing import forget_adapters

    monkeypatch.setenv("OVERMIND_DISABLED_ADAPTERS", OTHER_ADAPTERS_OFF)
    monkeypatch.delenv("OVERMIND_STRICT", raising=False)
    forget_adapters()
    overmind.activate()
    yield
    forget_adapters()


def overmind_warnings(caught) -> list[str]:
    """The messages of the OvermindWarnings in ``caught`` (from ``warnings.catch_warnings(record=True)``)."""
    from overmind import OvermindWarning

    return [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]
