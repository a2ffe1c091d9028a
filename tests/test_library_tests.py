"""benchmarks/library_tests.py --per-file: each file's runs add up to the library's, the warm run's server counts
are its own, its hits on the cold run's entries are counted, and the report lists every file."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _library_tests():
    spec = importlib.util.spec_from_file_location("library_tests", ROOT / "benchmarks" / "library_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(outcomes: dict[str, str], wall: float, server: dict | None = None) -> dict:
    run = {"wall_s": wall, "returncode": 0, "active_adapters": ["transformers"],
           "tests": {i: {"outcome": o, "duration": 0.1, **({"message": "boom"} if o == "failed" else {})}
                     for i, o in outcomes.items()}}
    if server is not None:
        run["server"] = server
    return run


def _server(gets: int, hits: int, publishes: int, **more) -> dict:
    return {"running": True, "gets": gets, "hits": hits, "publishes": publishes, "evictions": 0, "entries": 3,
            "bytes": 10, **more}


def test_by_file_groups_node_ids_under_their_file():
    lt = _library_tests()
    assert lt.by_file(["a.py", "b.py::T::test_x", "b.py::T::test_y"]) == {
        "a.py": ["a.py"], "b.py": ["b.py::T::test_x", "b.py::T::test_y"]}


def test_per_file_runs_add_up_and_the_report_lists_each_file():
    lt = _library_tests()
    per_file = {
        "tests/a.py": {
            "plain": _run({"tests/a.py::t1": "passed", "tests/a.py::t2": "skipped"}, 2.0),
            "cold": _run({"tests/a.py::t1": "passed", "tests/a.py::t2": "skipped"}, 3.0, _server(4, 1, 3)),
            "warm": _run({"tests/a.py::t1": "passed", "tests/a.py::t2": "skipped"}, 2.5,
                         _server(8, 4, 4, hits_on_earlier_entries=2,
                                 earlier_entries_hit_by_loader={"BertModel.from_pretrained": 2},
                                 earlier_entries_hit={"BertModel.from_pretrained None": 2}))},
        "tests/b.py": {
            "plain": _run({"tests/b.py::t3": "passed"}, 1.0),
            "cold": _run({"tests/b.py::t3": "passed"}, 1.5, _server(2, 0, 2)),
            "warm": _run({"tests/b.py::t3": "failed"}, 1.5,
                         _server(4, 1, 3, hits_on_earlier_entries=1,
                                 earlier_entries_hit_by_loader={"BertModel.from_pretrained": 1},
                                 earlier_entries_hit={"BertModel.from_pretrained None": 1}))},
    }
    runs = lt.combine(per_file)
    assert set(runs["warm"]["tests"]) == {"tests/a.py::t1", "tests/a.py::t2", "tests/b.py::t3"}
    assert runs["plain"]["wall_s"] == 3.0 and "server" not in runs["plain"]
    warm = runs["warm"]["server"]
    assert (warm["gets"], warm["hits"], warm["hits_on_earlier_entries"]) == (12, 5, 3)
    assert warm["earlier_entries_hit_by_loader"] == {"BertModel.from_pretrained": 3}
    assert warm["earlier_entries_hit"] == {"BertModel.from_pretrained None": 3}  # the same call in both files
    # the warm run's own share: the servers' counts after it, less theirs after the cold run
    assert lt._server_cells(runs, "warm") == ["6", "4", "2", "3"]
    assert lt._server_cells(runs, "cold") == ["6", "1", "5", "-"]
    assert lt._server_cells(runs, "plain") == ["-"] * 4
    assert lt.differing(lt.outcomes(runs), "warm") == ["tests/b.py::t3"]

    meta = {"installed": "5.25.0", "header": ["a header line"]}
    report = lt.render("transformers", meta, runs, per_file)
    assert "| transformers | overmind warm | 3 | 1 | 1 | 1 | 0 | 1 | 6 | 4 | 2 | 3 | 0 | 4 |" in report
    assert "## Per file" in report
    assert "| `tests/a.py` | overmind warm | 2 | 1 | 0 | 1 | 0 | 0 | 4 | 3 | 1 | 2 | 0 | 2 |" in report
    assert "| `tests/b.py` | overmind warm | 1 | 0 | 1 | 0 | 0 | 1 | 2 | 1 | 1 | 1 | 0 | 2 |" in report
    assert "BertModel.from_pretrained 3" in report
    assert "## Outcomes that differ from plain (1)" in report and "`tests/b.py::t3`" in report


def test_a_file_whose_server_did_not_run_shows_no_server_in_the_sums():
    lt = _library_tests()
    per_file = {name: {"plain": _run({f"{name}::t": "passed"}, 1.0),
                       "cold": _run({f"{name}::t": "passed"}, 1.0, server),
                       "warm": _run({f"{name}::t": "passed"}, 1.0, server)}
                for name, server in (("a.py", _server(1, 0, 1)), ("b.py", {"running": False}))}
    runs = lt.combine(per_file)
    assert lt._server_cells(runs, "warm") == ["no server"] * 4
