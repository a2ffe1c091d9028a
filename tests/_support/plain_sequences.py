"""Run one sequence of fresh processes twice, plain and with Overmind, and compare what each process saw.

A sequence is a list of steps: a script (a string, run in a fresh interpreter) or a callable (run in the test's
own process between two scripts: an edit of a file on disk). Each script runs after :data:`PRELUDE`, which
activates Overmind only in the cached run (``ON``), and hands back with ``report(seen, through)``:

* ``seen``: what the user's code observes (values, classes, devices, warnings); it must be equal, step by step,
  in the plain and the cached run;
* ``through``: what Overmind did (new entries, hits), ``None`` in the plain run; the test asserts on it so that
  a sequence that never caches cannot pass as "equal to plain".

>>> plain, cached = compare_with_plain(fresh, [LOAD_INSIDE, LOAD_OUTSIDE, LOAD_INSIDE], setup=build_fixture)

``setup(run_name)`` is called before each run and returns what the scripts get as ``S`` (a fixture built anew
per run, so that an edit in the plain run does not leak into the cached one); ``S["env"]`` is put in the
environment before anything is imported.
"""
from __future__ import annotations

import json
import textwrap
from typing import Any, Callable, Sequence

PRELUDE = '''
import os, warnings
ON = os.environ.get("OVERMIND_ON") == "1"
S = json.loads(os.environ.get("SEQUENCE", "{}"))
os.environ.update(S.get("env", {}))  # before activate(), which may import the libraries that read it
if ON:
    overmind.activate()


def load(fn):
    """(object, warnings as (category, message), what Overmind did or None) for one load."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if ON:
            obj, new_entries, hits = counted_load(fn)
            through = {"new_entries": new_entries, "hits": hits}
        else:
            obj, through = fn(), None
    said = [(w.category.__name__, str(w.message)) for w in caught]
    return obj, said, through


def done(seen, through):
    report({"seen": seen, "through": through})
'''


def compare_with_plain(fresh: Callable[..., Any], steps: Sequence[Any],
                       setup: Callable[[str], dict] | None = None) -> tuple[list, list]:
    """Run ``steps`` plain, then with Overmind; return ``(plain, cached)``, the reports of the scripts in order.

    Asserts that every script saw the same thing in both runs (``seen``)."""
    runs = {}
    for name in ("plain", "cached"):
        extra = setup(name) if setup else {}
        reports = []
        for step in steps:
            if callable(step):
                step(extra)
                continue
            reports.append(fresh(PRELUDE + textwrap.dedent(step), OVERMIND_ON="1" if name == "cached" else "0",
                                 SEQUENCE=json.dumps(extra)))
        runs[name] = reports
    plain, cached = runs["plain"], runs["cached"]
    for i, (p, c) in enumerate(zip(plain, cached)):
        assert c["seen"] == p["seen"], f"process {i + 1} of the sequence differs from plain:\n" \
                                       f"plain:  {p['seen']}\ncached: {c['seen']}"
    return plain, cached
