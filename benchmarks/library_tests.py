"""The libraries' own test suites, plain and with Overmind: does activating Overmind change any outcome?

    python benchmarks/library_tests.py diffusers --git-dir ~/src/diffusers/.git --ref v0.42.1
    python benchmarks/library_tests.py diffusers --tests ~/src/diffusers          # a checkout (its tests/)
    python benchmarks/library_tests.py transformers --tests ~/src/transformers    # a checkout at tag v5.24.0
    python benchmarks/library_tests.py diffusers --sdist                          # the released sdist's tests/
    python benchmarks/library_tests.py transformers --tests ~/src/transformers --per-file
    ... [-k EXPR] [--select PATH ...] [-n 2] [--per-file] [-- extra pytest arguments]

Overmind patches the libraries' ``from_pretrained``; the libraries' test suites are the widest description of
what those loaders must do (save and reload, dtypes, offload, configs, variants, ...). The selection runs three
times: plain (no Overmind), with Overmind against a fresh private server (cold: every load publishes,
``OVERMIND_ADMIT=first``), and again
against the same server (warm: loads are served from it). Overmind activates through a pytest plugin this
script writes to a temporary folder, which calls ``overmind.activate()`` at ``pytest_configure``; another plugin
records each test's outcome in every run. The runs set ``HF_HUB_OFFLINE=1``: tests that need the Hub fail alike
in all three, and what counts is that each test ends the same way with Overmind as without.

``--per-file``: the hit way, file by file. Each selected test file runs plain, then in two fresh pytest processes
against one fresh private server of its own (cold, then warm), so the warm process starts with nothing built in it
and takes from the server what the cold one published, as a user's second process does. The tests also construct
models directly, which fills the libraries' process registries in either run; a file run alone keeps what the
other files construct out of its processes, where one process over the whole selection mixes them. The report
gives each file's three runs and their sums. A path is keyed by its file identity (inode, size, mtime, ctime), so
a checkpoint a test writes into a new temporary folder is a new key in every run: the warm run's loads of such
folders publish again, and what the warm run takes from the cold one shows in its hits on the entries the cold
run left (the column "warm hits on cold's entries"; the JSON names those entries' loaders and calls).

Printed and written to ``benchmarks/results/library-tests-<library>-<UTC time>.{md,json}``: per run the counts
of outcomes, the tests whose outcome differs from plain (listed by node id, with each run's error), the server's
gets, hits and publishes in the cold and the warm run, the warm run's hits on entries the cold run published, and
the wall time (with ``--per-file`` per file and in total). The JSON holds every test's outcome in each run.
Exit status 1 when an outcome differs from plain, 2 when the tests cannot be found or run.

Where the test files come from. The model and pipeline tests live only in the libraries' repositories: the
transformers sdist ships the common mixins (tests/test_modeling_common.py, ...) without tests/models/, the
diffusers sdist ships tests/testing_utils.py alone; ``--sdist`` fetches them (``pip download --no-binary :all:``)
and says which files of the selection are missing. A checkout (``--tests``) or a git repository and a tag
(``--git-dir``/``--ref``, exported with ``git archive``) gives the whole suite. Only its ``tests/`` (and
``utils/``) are copied to a staging folder, so the installed library is tested (the repositories' conftest puts
their ``src/`` first on sys.path; transformers' mixins import ``src/transformers`` by path, so the staged
``src/transformers`` links to the installed package). Tests of another version than the installed one fail in
places where the library changed; the table's header says so, and those failures count only where Overmind
changes them. The test code is fetched at run time and never stored here. Missing test requirements (``parameterized``,
``requests-mock``) are installed into the work folder (``pip install --target``), not into the environment.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
KEYWORDS = "save or load or pretrained or dtype or offload or config"
SELECTIONS = {
    "diffusers": [
        "tests/models/autoencoders/test_models_autoencoder_kl.py",
        "tests/models/autoencoders/test_models_asymmetric_autoencoder_kl.py",
        "tests/models/autoencoders/test_models_autoencoder_tiny.py",
        "tests/models/autoencoders/test_models_vq.py",
        "tests/models/unets/test_models_unet_2d_condition.py",
        "tests/pipelines/controlnet/test_controlnet.py",
        "tests/pipelines/stable_diffusion/test_stable_diffusion.py",
        "tests/pipelines/test_pipelines.py",
    ],
    "transformers": [
        "tests/models/bert/test_modeling_bert.py",
        "tests/models/gpt2/test_modeling_gpt2.py",
        "tests/models/llama/test_modeling_llama.py",
        "tests/models/clip/test_modeling_clip.py",
    ],
}
SDIST_CARRIES = {
    "diffusers": "tests/testing_utils.py alone",
    "transformers": "the common mixins (tests/test_modeling_common.py, ...) without tests/models/",
}
# module -> distribution: what the selected test files import beyond the library and pytest
TEST_DEPS = {
    "diffusers": {"parameterized": "parameterized", "requests_mock": "requests-mock"},
    "transformers": {"parameterized": "parameterized"},
}
RUN_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OVERMIND_DISABLED_ADAPTERS": "fixture,fixture_broken,future",  # the project's test-only adapters
    "OVERMIND_ADMIT": "first",  # every load publishes: the cold run leaves each entry for the warm one
}
RUNS = ("plain", "cold", "warm")
COUNTED = ("passed", "failed", "skipped", "error")
SERVER_COUNTERS = ("gets", "hits", "publishes")
FOLDED = {"xpassed": "passed", "xfailed": "skipped"}  # counted with these in the table, kept apart in the JSON

RECORD_PLUGIN = '''
"""Writes each test's outcome to $OVERMIND_LIBTESTS_OUT (benchmarks/library_tests.py)."""
import json
import os

_tests = {}


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr or "")


def _outcome(report):
    xfail = hasattr(report, "wasxfail")
    if report.failed:
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "xfailed" if xfail else "skipped"
    return "xpassed" if xfail else "passed"


def pytest_runtest_logreport(report):
    test = _tests.setdefault(report.nodeid, {"outcome": "unknown", "duration": 0.0})
    test["duration"] += report.duration
    if report.when == "call" or not report.passed:
        if report.when == "teardown" and test["outcome"] in ("failed", "error"):
            return
        test["outcome"] = _outcome(report)
        if test["outcome"] != "passed":
            test["message"] = _message(report)[:600]


def pytest_collectreport(report):
    if report.failed:
        _tests[report.nodeid] = {"outcome": "error", "duration": 0.0, "message": _message(report)[:600]}


def pytest_warning_recorded(warning_message, when, nodeid, location):
    if warning_message.category.__module__.startswith("overmind"):
        text = str(warning_message.message)[:300]
        _tests.setdefault(nodeid, {"outcome": "unknown", "duration": 0.0}).setdefault("overmind_warnings", [])
        _tests[nodeid]["overmind_warnings"].append(text)


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller has every report
        return
    active = os.environ.get("OVERMIND_LIBTESTS_ACTIVE")
    with open(os.environ["OVERMIND_LIBTESTS_OUT"], "w") as f:
        json.dump({"tests": _tests, "active_adapters": active.split(",") if active else None}, f)
'''

ACTIVATE_PLUGIN = '''
"""Activates Overmind for the test session (benchmarks/library_tests.py)."""
import os

import overmind


def pytest_configure(config):
    os.environ["OVERMIND_LIBTESTS_ACTIVE"] = ",".join(overmind.activate())
'''


class Unavailable(Exception):
    """The tests cannot be found or run (exit status 2)."""


def _installed(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _checkout_hint(library: str) -> str:
    tag = f"v{_installed(library)}"
    return (f"The {library} sdist carries {SDIST_CARRIES[library]}: the model tests come from a checkout "
            f"of the repository, at the installed version's tag {tag}:\n"
            f"  git clone --depth 1 --branch {tag} https://github.com/huggingface/{library} && "
            f"python {sys.argv[0]} {library} --tests {library}\n"
            f"or, from a git repository of it: --git-dir REPO --ref {tag}.")


# ---- the test files ---------------------------------------------------------------------------------------------

def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / "pytest.ini").write_text("[pytest]\n")  # the rootdir; no configuration of a parent folder applies
    return path


def _stage_checkout(checkout: Path, stage: Path) -> None:
    if not (checkout / "tests").is_dir():
        raise Unavailable(f"{checkout} has no tests/ folder: --tests names the repository's root.")
    for name in ("tests", "utils"):
        if (checkout / name).is_dir():
            shutil.copytree(checkout / name, stage / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _stage_git(git_dir: str, ref: str, stage: Path) -> None:
    git = ["git", "--git-dir", git_dir]
    names = [n for n in ("tests", "utils")
             if subprocess.run([*git, "cat-file", "-e", f"{ref}:{n}"], capture_output=True).returncode == 0]
    if "tests" not in names:
        raise Unavailable(f"{git_dir} has no tests/ at {ref}.")
    archive = subprocess.Popen([*git, "archive", "--format=tar", ref, *names], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
        _extract(tar, stage)
    if archive.wait() != 0:
        raise Unavailable(f"git archive {ref} failed in {git_dir}.")


def _extract(tar: tarfile.TarFile, dest: Path, members=None) -> None:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members=members, filter="data")
    else:
        tar.extractall(dest, members=members)


def _stage_sdist(library: str, work: Path, stage: Path) -> None:
    version = _installed(library)
    downloads = work / "sdist"
    downloads.mkdir(exist_ok=True)
    tarball = downloads / f"{library}-{version}.tar.gz"
    if not tarball.exists():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
               "--no-build-isolation", "-d", str(downloads), f"{library}=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if not tarball.exists():
            raise Unavailable(f"pip download of the {library} {version} sdist failed:\n{done.stderr[-2000:]}")
    with tarfile.open(tarball) as tar:
        top = f"{library}-{version}/"
        members = []
        for m in tar.getmembers():
            if m.name.startswith((top + "tests/", top + "utils/")):
                m.name = m.name[len(top):]
                members.append(m)
        _extract(tar, stage, members)


def _tests_version(args: argparse.Namespace, library: str) -> str:
    if args.git_dir:
        return args.ref
    if args.sdist:
        return f"{_installed(library)} (sdist)"
    init = Path(args.tests) / "src" / library / "__init__.py"
    if init.exists():
        found = re.search(r'__version__\s*=\s*"([^"]+)"', init.read_text())
        if found:
            return found.group(1)
    described = subprocess.run(["git", "-C", args.tests, "describe", "--tags", "--always"],
                               capture_output=True, text=True)
    return described.stdout.strip() or "unknown"


def _link_installed_src(library: str, stage: Path) -> None:
    """``stage/src/<library>``: a link to the installed package. The transformers mixins import the package by
    path from the repository layout (tests/test_pipeline_mixin.py: ``direct_transformers_import(
    <root>/src/transformers)``); staged without ``src/``, every model test fails to collect. The link keeps
    the installed library the one tested."""
    spec = importlib.util.find_spec(library)
    if spec is None or not spec.submodule_search_locations:
        return
    (stage / "src").mkdir(exist_ok=True)
    (stage / "src" / library).symlink_to(Path(list(spec.submodule_search_locations)[0]).resolve())


def stage_tests(args: argparse.Namespace, library: str, work: Path) -> tuple[Path, str]:
    """Copy the library's tests/ (and utils/) to a staging folder; return it and a line saying where from."""
    stage = _fresh(work / f"{library}-tests")
    if library == "transformers":
        _link_installed_src(library, stage)
    if args.git_dir:
        _stage_git(args.git_dir, args.ref, stage)
        return stage, f"`git archive {args.ref}` of {args.git_dir}"
    if args.tests:
        _stage_checkout(Path(args.tests).resolve(), stage)
        return stage, f"checkout {Path(args.tests).resolve()}"
    if args.sdist:
        _stage_sdist(library, work, stage)
        return stage, f"the {library} {_installed(library)} sdist (pip download --no-binary :all:)"
    hint = f"--tests must name a {library} checkout at tag v{_installed(library)}" if library == "transformers" \
        else "give --tests CHECKOUT, --git-dir REPO --ref TAG, or --sdist"
    raise Unavailable(f"{library}: no test files: {hint}.\n{_checkout_hint(library)}")


def check_selection(stage: Path, library: str, selection: list[str], source: str) -> None:
    missing = [p for p in selection if not (stage / p.split("::")[0]).exists()]
    if missing:
        listed = "\n".join(f"  {p}" for p in missing)
        raise Unavailable(f"{library}: the selection's test files are missing from {source}:\n{listed}\n"
                          f"{_checkout_hint(library)}")


def install_test_deps(library: str, work: Path) -> Path:
    """Install the test requirements the environment lacks into ``work/deps`` (put on PYTHONPATH)."""
    deps = work / "deps"
    deps.mkdir(exist_ok=True)
    sys.path.insert(0, str(deps))
    wanted = [dist for module, dist in TEST_DEPS[library].items() if importlib.util.find_spec(module) is None]
    sys.path.remove(str(deps))
    if wanted:
        print(f"installing the test requirements {', '.join(wanted)} into {deps}", flush=True)
        # --no-deps: their own requirements come from the environment, never a second copy that would shadow it
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(deps), *wanted],
                       check=True)
    return deps


# ---- the runs -----------------------------------------------------------------------------------------------

def _environment(plugins: Path, deps: Path, runtime_dir: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERMIND_")}  # no OVERMIND_STRICT, no other server
    env.update(RUN_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugins), str(deps), os.environ.get("PYTHONPATH")]))
    if runtime_dir:
        env["OVERMIND_RUNTIME_DIR"] = runtime_dir
    return env


def run_pytest(name: str, stage: Path, pytest_args: list[str], env: dict[str, str], logs: Path,
               label: str = "") -> dict:
    """One run of the selection (``label``: of one file of it): its outcomes, wall time and log."""
    out = logs / f"{label}{name}.json"
    log = logs / f"{label}{name}.log"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "overmind_libtests_record"]
    if name != "plain":
        cmd += ["-p", "overmind_libtests_activate"]
    cmd += ["--continue-on-collection-errors", "-q", "-rfE", *pytest_args]
    print(f"{label}{name}: {shlex.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    with open(log, "w") as f:
        done = subprocess.run(cmd, cwd=stage, env={**env, "OVERMIND_LIBTESTS_OUT": str(out)},
                              stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    if not out.exists():
        tail = log.read_text()[-3000:]
        raise Unavailable(f"{name}: pytest exited with {done.returncode} and recorded nothing; {log} ends:\n{tail}")
    recorded = json.loads(out.read_text())
    print(f"{label}{name}: {len(recorded['tests'])} tests in {wall:.0f} s, exit status {done.returncode} "
          f"(log: {log})", flush=True)
    return {"wall_s": round(wall, 1), "returncode": done.returncode, "log": str(log), **recorded}


def server_counters(runtime_dir: str, before: dict | None = None) -> dict:
    """The server's counters (since it started) and each entry's hits. ``before``: what this function said after
    an earlier run against the same server; then also the hits of this run on the entries that run left
    (``hits_on_earlier_entries``), by loader and by entry (its loader and the call's arguments, shortened)."""
    import overmind

    info = overmind.cache_info(runtime_dir)
    if not info.running:
        return {"running": False}
    counters = {k: info.status.get(k, 0) for k in ("gets", "hits", "publishes", "evictions")}
    server = {"running": True, **counters, "entries": len(info.entries), "bytes": info.size_on_server,
              "entry_hits": {e.entry_id: e.hits for e in info.entries}}
    if before is not None and before.get("running"):
        earlier = before["entry_hits"]
        loaders: dict[str, int] = {}
        hit: dict[str, int] = {}
        for e in info.entries:
            if e.hits > earlier.get(e.entry_id, e.hits):
                loaders[e.short_loader] = loaders.get(e.short_loader, 0) + e.hits - earlier[e.entry_id]
                call = f"{e.short_loader} {e.summary}"[:300]
                hit[call] = hit.get(call, 0) + e.hits - earlier[e.entry_id]
        server["hits_on_earlier_entries"] = sum(loaders.values())
        server["earlier_entries_hit_by_loader"] = dict(sorted(loaders.items(), key=lambda kv: -kv[1]))
        server["earlier_entries_hit"] = hit
    return server


def _write_plugins(work: Path) -> Path:
    plugins = work / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "overmind_libtests_record.py").write_text(RECORD_PLUGIN.lstrip())
    (plugins / "overmind_libtests_activate.py").write_text(ACTIVATE_PLUGIN.lstrip())
    return plugins


def _cold_and_warm(stage: Path, pytest_args: list[str], plugins: Path, deps: Path, logs: Path,
                   label: str = "") -> dict[str, dict]:
    """The cold and the warm run against one fresh private server (stopped and removed at the end)."""
    from overmind.testing import stop_servers

    runs: dict[str, dict] = {}
    runtime_dir = tempfile.mkdtemp(prefix="om-", dir="/tmp")  # short: Unix socket paths are limited to 108 bytes
    try:
        env = _environment(plugins, deps, runtime_dir)
        for name in ("cold", "warm"):
            runs[name] = run_pytest(name, stage, pytest_args, env, logs, label)
            runs[name]["server"] = server_counters(runtime_dir, runs["cold"].get("server"))
    finally:
        stop_servers(runtime_dir)
        shutil.rmtree(runtime_dir, ignore_errors=True)
    for run in runs.values():
        run["server"].pop("entry_hits", None)
    return runs


def run_all(stage: Path, pytest_args: list[str], deps: Path, work: Path) -> dict[str, dict]:
    """Plain, then cold and warm against one fresh private server, each one pytest process over the selection."""
    plugins = _write_plugins(work)
    logs = Path(tempfile.mkdtemp(prefix="logs-", dir=work))
    runs = {"plain": run_pytest("plain", stage, pytest_args, _environment(plugins, deps, None), logs)}
    runs.update(_cold_and_warm(stage, pytest_args, plugins, deps, logs))
    return runs


def by_file(selection: list[str]) -> dict[str, list[str]]:
    """The selection's items (files or node ids) grouped by test file, in the selection's order."""
    files: dict[str, list[str]] = {}
    for item in selection:
        files.setdefault(item.split("::")[0], []).append(item)
    return files


def run_per_file(stage: Path, selection: list[str], more_args: list[str], deps: Path,
                 work: Path) -> dict[str, dict[str, dict]]:
    """Each test file: plain, then cold and warm against a fresh private server of its own; each run a fresh
    pytest process over that file alone."""
    plugins = _write_plugins(work)
    logs = Path(tempfile.mkdtemp(prefix="logs-", dir=work))
    per_file = {}
    for path, items in by_file(selection).items():
        label = re.sub(r"\W+", "_", Path(path).stem) + "."
        pytest_args = [*items, *more_args]
        runs = {"plain": run_pytest("plain", stage, pytest_args, _environment(plugins, deps, None), logs, label)}
        runs.update(_cold_and_warm(stage, pytest_args, plugins, deps, logs, label))
        per_file[path] = runs
    return per_file


def _summed_server(servers: list[dict]) -> dict:
    """The servers of several files as one: counters, entries and hits on earlier entries added up."""
    if not all(s.get("running") for s in servers):
        return {"running": False}
    total: dict = {"running": True}
    for key in (*SERVER_COUNTERS, "evictions", "entries", "bytes", "hits_on_earlier_entries"):
        if any(key in s for s in servers):
            total[key] = sum(s.get(key, 0) for s in servers)
    for key in ("earlier_entries_hit_by_loader", "earlier_entries_hit"):
        if any(key in s for s in servers):
            added: dict[str, int] = {}
            for s in servers:
                for name, n in s.get(key, {}).items():
                    added[name] = added.get(name, 0) + n
            total[key] = dict(sorted(added.items(), key=lambda kv: -kv[1]))
    return total


def combine(per_file: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """The runs of every file as one run each (plain, cold, warm): tests together, wall times and server
    counters added up (each file's server counts from zero, so the warm run's share is still warm minus cold)."""
    runs = {}
    for name in RUNS:
        parts = [file_runs[name] for file_runs in per_file.values()]
        run = {"wall_s": round(sum(p["wall_s"] for p in parts), 1),
               "returncode": max((p["returncode"] for p in parts), key=abs, default=0),
               "active_adapters": next((p["active_adapters"] for p in parts if p.get("active_adapters")), None),
               "tests": {i: t for p in parts for i, t in p["tests"].items()}}
        if name != "plain":
            run["server"] = _summed_server([p["server"] for p in parts])
        runs[name] = run
    return runs


# ---- the report -------------------------------------------------------------------------------------------------

def outcomes(runs: dict[str, dict]) -> dict[str, dict[str, str]]:
    ids = sorted(set().union(*(r["tests"] for r in runs.values())))
    return {i: {name: r["tests"].get(i, {}).get("outcome", "absent") for name, r in runs.items()} for i in ids}


def differing(table: dict[str, dict[str, str]], run: str) -> list[str]:
    return [i for i, o in table.items() if o[run] != o["plain"]]


def _error_text(run: dict, test_id: str) -> str:
    """A failure's message without what differs from run to run anyway (temporary paths, object addresses)."""
    message = run["tests"].get(test_id, {}).get("message", "")
    return re.sub(rf"{re.escape(tempfile.gettempdir())}/\S+|0x[0-9a-fA-F]+", "...", message)


def other_errors(runs: dict[str, dict], table: dict[str, dict[str, str]], run: str) -> list[str]:
    """Tests failing or erroring in plain and ``run`` alike, but with another error text."""
    return [i for i, o in table.items() if o["plain"] == o[run] and o[run] in ("failed", "error")
            and _error_text(runs["plain"], i) != _error_text(runs[run], i)]


def _counts(run: dict) -> dict[str, int]:
    counts = dict.fromkeys(COUNTED, 0)
    for test in run["tests"].values():
        outcome = FOLDED.get(test["outcome"], test["outcome"])
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def _server_cells(runs: dict[str, dict], name: str) -> list[str]:
    """The server's gets, hits and publishes during run ``name`` (its counters grow across the cold and the warm
    run), and the warm run's hits on the entries the cold run left."""
    server = runs[name].get("server")
    if not server:
        return ["-"] * (len(SERVER_COUNTERS) + 1)
    if not server["running"]:
        return ["no server"] * (len(SERVER_COUNTERS) + 1)
    before = runs["cold"]["server"] if name == "warm" and runs["cold"]["server"].get("running") else {}
    return [*(str(server[k] - before.get(k, 0)) for k in SERVER_COUNTERS),
            str(server["hits_on_earlier_entries"]) if "hits_on_earlier_entries" in server else "-"]


def _warned(run: dict) -> int:
    return sum(1 for test in run["tests"].values() if test.get("overmind_warnings"))


def _table(first: str, groups: dict[str, dict[str, dict]]) -> list[str]:
    """The outcome table: three rows (plain, cold, warm) for each group of runs (the library's, or each file's)."""
    lines = [f"| {first} | run | tests | passed | failed | skipped | errors | differ from plain | server gets | "
             "server hits | server publishes | warm hits on cold's entries | tests with Overmind warnings | wall s |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for group, runs in groups.items():
        table = outcomes(runs)
        for name, run in runs.items():
            counts = _counts(run)
            diff = "-" if name == "plain" else str(len(differing(table, name)))
            extra = sum(v for k, v in counts.items() if k not in COUNTED)  # "unknown": a test cut short
            tests = f"{len(run['tests'])}" + (f" ({extra} unknown)" if extra else "")
            cells = [group, "plain" if name == "plain" else f"overmind {name}", tests,
                     *(str(counts[k]) for k in COUNTED), diff, *_server_cells(runs, name),
                     "-" if name == "plain" else str(_warned(run)), f"{run['wall_s']:.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(library: str, meta: dict, runs: dict[str, dict],
           per_file: dict[str, dict[str, dict]] | None = None) -> str:
    """The report; ``per_file`` (``--per-file``): each file's runs, of which ``runs`` are the sums."""
    table = outcomes(runs)
    lines = [f"# {library} {meta['installed']}: its own tests, plain and with Overmind", ""]
    lines += [f"- {line}" for line in meta["header"]]
    lines += ["", *_table("library", {library: runs})]
    entries = runs["warm"].get("server", {}).get("entries", "?")
    if per_file is None:
        server = ("the server is fresh before the cold run and kept for the warm one; entries cached after the warm "
                  f"run: {entries}")
    else:
        lines += ["", "## Per file", "", *_table("file", {f"`{path}`": file_runs for path, file_runs in
                                                         per_file.items()})]
        server = ("each file has a fresh server of its own, kept from its cold run to its warm one; the library's "
                  f"rows add the files' up; entries cached after the warm runs: {entries}")
    loaders = runs["warm"].get("server", {}).get("earlier_entries_hit_by_loader") or {}
    lines += ["", "Skipped counts xfailed tests, passed counts xpassed ones (the JSON tells them apart). Server gets, "
              f"hits and publishes: those of that run ({server}). Warm hits on cold's entries: the warm run's hits "
              "on the entries the cold run left, the loads a second process takes from the first one"
              + (" (" + ", ".join(f"{loader} {n}" for loader, n in loaders.items()) + ")" if loaders else "")
              + ". Overmind warnings: its fallbacks to the plain load (the JSON has their text). Error texts are "
              "compared with temporary paths and object addresses left out."]
    lines += _differences(runs, table)
    return "\n".join(lines) + "\n"


def _differences(runs: dict[str, dict], table: dict[str, dict[str, str]]) -> list[str]:
    lines = []
    for title, find in (("Outcomes that differ from plain", differing),
                        ("Same failure, another error text than in plain", lambda t, r: other_errors(runs, t, r))):
        ids = sorted(set(find(table, "cold")) | set(find(table, "warm")))
        lines += ["", f"## {title} ({len(ids)})", ""]
        lines += _listed(runs, table, ids) if ids else ["None."]
    return lines


def _listed(runs: dict[str, dict], table: dict[str, dict[str, str]], ids: list[str]) -> list[str]:
    lines = []
    for i in ids:
        lines.append(f"- `{i}`")
        for name in RUNS:
            test = runs[name]["tests"].get(i, {})
            message = " ".join(test.get("message", "").split())[:300]
            lines.append(f"  - {name}: {table[i][name]}" + (f": `{message}`" if message else ""))
            for warning in sorted(set(test.get("overmind_warnings", ())))[:3]:
                lines.append(f"    - Overmind warning: `{' '.join(warning.split())[:300]}`")
    return lines


def header(library: str, source: str, tests_version: str, selection: list[str], pytest_args: list[str],
           runs: dict[str, dict], per_file: bool = False) -> list[str]:
    installed = _installed(library)
    lines = [f"tests from {source}, version {tests_version}"]
    if tests_version.lstrip("v").split(" ")[0] != installed:
        known = "of an unknown version" if tests_version == "unknown" else f"of {tests_version}"
        lines.append(f"**version mismatch**: tests {known} run against the installed {library} "
                     f"{installed}; tests failing in plain are expected, only a change of outcome with Overmind "
                     "counts")
    servers = ("per test file (`--per-file`): the file plain, then cold and warm, each a fresh pytest process over "
               "that file alone, against one fresh private server of the file's own" if per_file else
               "one pytest process over the selection a run; one fresh private server, cold run first, warm run second")
    lines += [f"selection: {' '.join(f'`{p}`' for p in selection)}; more pytest arguments: `{shlex.join(pytest_args)}`",
              f"Overmind runs: a pytest plugin calls `overmind.activate()` at `pytest_configure` (active adapters: "
              f"{', '.join(runs['cold'].get('active_adapters') or ['none'])}); {servers}",
              "environment: " + ", ".join(f"`{k}={v}`" for k, v in RUN_ENV.items()),
              f"python {platform.python_version()}, "
              + ", ".join(f"{d} {_installed(d)}" for d in ("torch", "transformers", "diffusers", "accelerate"))
              + f", overmind {_installed('overmind-core')}; {os.cpu_count()} CPUs; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"]
    return lines


def write_results(library: str, markdown: str, record: dict) -> list[Path]:
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"library-tests-{library}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    md, js = stem.with_suffix(".md"), stem.with_suffix(".json")
    md.write_text(markdown)
    js.write_text(json.dumps(record, indent=1) + "\n")
    return [md, js]


# ---- main -------------------------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=textwrap.indent(__doc__.split("\n\n", 1)[1], "  "))
    p.add_argument("library", choices=sorted(SELECTIONS))
    source = p.add_mutually_exclusive_group()
    source.add_argument("--tests", metavar="CHECKOUT", help="the root of a checkout of the library's repository")
    source.add_argument("--git-dir", metavar="REPO", help="a git repository of the library (bare or not); with --ref")
    source.add_argument("--sdist", action="store_true", help="the tests/ of the installed version's sdist")
    p.add_argument("--ref", help="the tag or commit of --git-dir to export (say v0.42.1)")
    p.add_argument("--select", nargs="+", metavar="PATH", help="test files or node ids, relative to the root "
                   "(default: the library's selection)")
    p.add_argument("-k", dest="keywords", default=KEYWORDS, help=f"pytest -k expression ('' for none; default: "
                   f"{KEYWORDS!r})")
    p.add_argument("-n", dest="workers", help="pytest-xdist workers (default: none, one process)")
    p.add_argument("--per-file", action="store_true", help="each test file in processes of its own: plain, then cold "
                   "and warm against a fresh server of its own (see above)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "overmind-library-tests"),
                   help="folder for the staged tests, downloads, test requirements and logs (default: %(default)s)")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = p.parse_args(argv)
    if args.git_dir and not args.ref:
        p.error("--git-dir needs --ref")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    library = args.library
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    selection = args.select or SELECTIONS[library]
    more_args = [*(["-k", args.keywords] if args.keywords else []), *(["-n", args.workers] if args.workers else []),
                 *args.pytest_args]
    pytest_args = [*selection, *more_args]
    per_file = None
    try:
        stage, source = stage_tests(args, library, work)
        check_selection(stage, library, selection, source)
        deps = install_test_deps(library, work)
        tests_version = _tests_version(args, library)
        if args.per_file:
            per_file = run_per_file(stage, selection, more_args, deps, work)
            runs = combine(per_file)
        else:
            runs = run_all(stage, pytest_args, deps, work)
    except Unavailable as e:
        print(e, file=sys.stderr)
        return 2
    meta = {"installed": _installed(library),
            "header": header(library, source, tests_version, selection, more_args, runs, per_file is not None)}
    markdown = render(library, meta, runs, per_file)
    table = outcomes(runs)
    diffs = sorted(set(differing(table, "cold")) | set(differing(table, "warm")))
    texts = sorted(set(other_errors(runs, table, "cold")) | set(other_errors(runs, table, "warm")))
    record = {"library": library, "installed": meta["installed"], "tests_source": source,
              "tests_version": tests_version, "selection": selection, "pytest_args": pytest_args,
              "env": RUN_ENV, "header": meta["header"], "differing": diffs, "other_error_text": texts,
              "outcomes": table, "runs": runs, "mode": "per-file" if per_file else "selection"}
    if per_file:  # each file's runs without their tests (``runs`` holds every test)
        record["files"] = {path: {name: {k: v for k, v in run.items() if k != "tests"}
                                  for name, run in file_runs.items()} for path, file_runs in per_file.items()}
    print("\n" + markdown)
    for path in write_results(library, markdown, record):
        print(f"wrote {path.relative_to(HERE.parent)}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
