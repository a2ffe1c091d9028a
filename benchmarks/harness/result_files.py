"""The files of benchmarks/results/: which scenario each result holds, which result a page shows, and which files
no longer belong there.

A result of ``run.py`` is ``<scenario>-<scale>-<stamp>.json`` with the table it printed beside it (``.md``); a
library test run is ``library-tests-<library>-<stamp>.json``, a ``variants.py`` run ``variants-<stamp>.json`` (one
scenario per loader it holds), a GPU summary ``gpu-<stamp>.json``. The folder keeps the newest result of each
scenario, the one the pages show (:func:`current`); ``run.py`` replaces a scenario's older result as it writes a
new one (:func:`supersede`), and :func:`stale` names what else is left over.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import NamedTuple

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCHMARKS)
RESULTS = os.path.join(BENCHMARKS, "results")
MIN_REPS = 3  # a run with fewer repetitions is a quick check: shown only when no fuller run exists

NAME = re.compile(r"^(?P<scenario>.+?)-(?P<scale>full|small)-(?P<stamp>\d{8}-\d{4,6})\.json$")
LIBRARY = re.compile(r"^library-tests-(?P<library>[\w-]+?)-(?P<stamp>\d{8}-\d{4,6})\.json$")
GPU = re.compile(r"^gpu-(?P<stamp>[\d-]+)\.json$")
VARIANTS = re.compile(r"^variants-(?P<stamp>\d{8}-\d{4,6})\.json$")
STAMPED = re.compile(r"^(?P<name>.+?)-(?P<stamp>\d{8}-\d{4,6})(?:-[^.]+)?\.\w+$")  # any result file, by its name


class Result(NamedTuple):
    scenario: str
    scale: str
    stamp: str
    file: str  # the name under benchmarks/results/
    data: dict

    @property
    def reps(self) -> int:
        groups = self.data.get("groups") or {}
        if self.scenario == "run":
            groups = groups.get("blog") or {}
        return min((len(v) for v in groups.values() if isinstance(v, list)), default=0)


def _stamp_key(stamp: str) -> str:
    return re.sub(r"\D", "", stamp).ljust(14, "0")


def read_results(folder: str = RESULTS) -> dict[str, list[Result]]:
    """Every result file of ``folder`` by scenario, oldest first. Library test runs are ``library-tests-<lib>``
    (scale ``-``); a GPU summary is ``gpu-summary``; each loader of a ``benchmarks/variants.py`` result with its
    seeded and not seeded forms is ``variants <loader>``, so that the newest result of each loader is shown."""
    found: dict[str, list[Result]] = {}
    for path in glob.glob(os.path.join(folder, "*.json")):
        name = os.path.basename(path)
        var = VARIANTS.match(name)
        if var:
            with open(path) as f:
                data = json.load(f)
            if "modes" not in data:  # a result without the not seeded form
                continue
            for loader in dict.fromkeys(r["loader"] for r in data["rows"]):
                mine = {**data, "rows": [r for r in data["rows"] if r["loader"] == loader]}
                found.setdefault(f"variants {loader}", []).append(Result(f"variants {loader}", "-", var["stamp"],
                                                                         name, mine))
            continue
        m, lib, gpu = NAME.match(name), LIBRARY.match(name), GPU.match(name)
        if m:
            scenario, scale, stamp = m["scenario"], m["scale"], m["stamp"]
        elif lib:
            scenario, scale, stamp = f"library-tests-{lib['library']}", "-", lib["stamp"]
        elif gpu:
            scenario, scale, stamp = "gpu-summary", "-", gpu["stamp"]
        else:
            continue
        with open(path) as f:
            data = json.load(f)
        if scenario == "gpu-summary" and not ("bandwidth" in data and "checks" in data):
            continue
        found.setdefault(scenario, []).append(Result(scenario, scale, stamp, name, data))
    for results in found.values():
        results.sort(key=lambda r: (_stamp_key(r.stamp), r.file))
    return found


def pick(results: list[Result]) -> Result:
    """The result to show: full scale over small, then a run of :data:`MIN_REPS` repetitions or more over a
    quicker one, then the newest."""
    return max(results, key=lambda r: (r.scale != "small", r.reps >= MIN_REPS or r.scale == "-",
                                       _stamp_key(r.stamp), r.file))


def current(found: dict[str, list[Result]]) -> dict[str, Result]:
    return {scenario: pick(results) for scenario, results in found.items()}


def _stem(name: str) -> str:
    return name.split(".", 1)[0]


def _files_of(folder: str, name: str) -> list[str]:
    """The files of one result: ``name`` and its siblings of the same stem (the ``.md`` beside a ``.json``)."""
    return sorted(glob.glob(os.path.join(glob.escape(folder), glob.escape(_stem(name)) + ".*")))


def supersede(folder: str, new: Result) -> str:
    """The folder ``new``'s files go to, its scenario's older results removed from ``folder`` when it replaces
    them: ``folder`` when the pages would show ``new`` over every older one, or ``folder/logs/<stamp>`` (never
    shown, git-ignored) when an older one is a fuller run (full scale over small, :data:`MIN_REPS` repetitions
    over fewer), which stays."""
    older = read_results(folder).get(new.scenario, [])
    if pick([*older, new]) is not new:
        return os.path.join(folder, "logs", new.stamp)
    for r in older:
        for path in _files_of(folder, r.file):
            os.remove(path)
    return folder


def _citing_pages() -> str:
    pages = [*glob.glob(os.path.join(ROOT, "docs", "*.md")), os.path.join(ROOT, "README.md"),
             *glob.glob(os.path.join(ROOT, "packages", "*", "README.md"))]
    text = []
    for page in pages:
        with open(page) as f:
            text.append(f.read())
    return "\n".join(text)


def stale(folder: str = RESULTS) -> list[str]:
    """The files of ``folder`` that no longer belong there, by name. A file stays when its result is one the pages
    show (:func:`current`), when a page names it (docs/compatibility.md quotes runs of a library's whole test
    selection; the GPU section names its logs), or, for a table no page reads (a probe's, an ``ab_trees.py``
    comparison: ``<name>-<stamp>.md``), when it is the newest of its name. The rest are older results of a
    scenario whose newer result is there."""
    shown = {_stem(r.file) for r in current(read_results(folder)).values()}
    cited = _citing_pages()
    names = [n for n in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, n))
             and not n.endswith(".tmp")]
    newest: dict[str, str] = {}  # a name without its stamp -> the newest stamp of that name
    for name in names:
        m = STAMPED.match(name)
        if m:
            newest[m["name"]] = max(newest.get(m["name"], ""), _stamp_key(m["stamp"]))
    out = []
    for name in names:
        stem, m = _stem(name), STAMPED.match(name)
        if stem in shown or f"{stem}." in cited:
            continue
        read = os.path.exists(os.path.join(folder, stem + ".json")) \
            and any(pattern.match(stem + ".json") for pattern in (NAME, LIBRARY, GPU, VARIANTS))
        if read or (m and _stamp_key(m["stamp"]) < newest[m["name"]]):
            out.append(name)  # a result the pages read but do not show, or an older table
    return out
