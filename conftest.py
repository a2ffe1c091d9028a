"""Repository-wide test set-up: no test reaches the Hub, and the test-only adapters reach every test process.
(Shared helpers live in tests/_support, importable through pytest's ``pythonpath`` option in pyproject.toml.)

scripts/setup installs the adapters of ``tests/adapter_fixture*`` (``fixture``, ``fixture_broken``, ``future``)
into ``.test-plugins`` (``pip --target``), not into the venv, where they would be live in a user's code. pytest
itself has the folder on ``sys.path`` (``pythonpath`` in pyproject.toml); this puts it in front of ``PYTHONPATH``
too, so a fresh process a test starts (``overmind.testing.run_fresh``, an ``overmind`` CLI call, a server, an
``overmind run`` child) discovers the same adapters. A test that wants a user's view of the venv starts its
process with ``_support.without_test_plugins()``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from _support import TEST_PLUGINS_DIR
from _support.seaweed import s3_url, seaweed  # noqa: F401  (fixtures: a real S3 store for the fleet tests)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

_rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != TEST_PLUGINS_DIR]
os.environ["PYTHONPATH"] = os.pathsep.join([TEST_PLUGINS_DIR, *_rest])


@pytest.fixture(autouse=True, scope="session")
def _session_runtime():
    """A runtime directory private to this test session (one per xdist worker) for the tests that do not take their
    own (``overmind_runtime``): a test never starts a server in, or reads the cache of, the user's default directory
    (``/tmp/overmind-<uid>``). Its server is stopped at the end of the session."""
    from overmind.testing import isolated_runtime

    with isolated_runtime() as path:
        yield path


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "long(seconds): a test that takes about that long on a CI machine (the "
                                       "--durations list); its file runs first, the longest first")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one (run them with pytest -m gpu "
                                       "on a GPU machine, or benchmarks/gpu/run_all.sh)")
    _hypothesis_outside_the_checkout()
    stale = _stale_test_plugins()
    if stale:
        raise pytest.UsageError(f"the test-only adapters in {TEST_PLUGINS_DIR} are missing or older than their "
                                f"sources ({stale}): run scripts/setup")


def _hypothesis_outside_the_checkout() -> None:
    """Hypothesis keeps its files (the examples that failed, to try them first next time; its caches) in the
    user's cache, not in a .hypothesis/ folder of the checkout: tests leave nothing there. The variable reaches
    the processes the tests start too."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    home = os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(base, "overmind", "hypothesis"))
    try:
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:
        return
    set_hypothesis_home_dir(home)


def pytest_report_header(config: pytest.Config) -> str:
    """The library releases this run tests (in the newest-releases lane, the ones the index had today): a failure
    reads against them."""
    from importlib import metadata

    names = [line.strip() for line in (Path(__file__).parent / "scripts" / "latest-libraries.txt").read_text()
             .splitlines() if line.strip() and not line.startswith("#")]
    found = []
    for name in ["torch", *names]:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return "libraries: " + ", ".join(found)


def _stale_test_plugins() -> str | None:
    """The first source of a test-only adapter whose copy in :data:`TEST_PLUGINS_DIR` is missing or differs
    (scripts/setup copies them: an edit shows only after it runs), or None."""
    root = os.path.dirname(os.path.abspath(__file__))
    for project in ("adapter_fixture", "adapter_fixture_future"):
        src = os.path.join(root, "tests", project, "src")
        for folder, dirs, files in os.walk(src):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info")]
            for name in files:
                if not name.endswith(".py"):
                    continue
                source = os.path.join(folder, name)
                copy = os.path.join(TEST_PLUGINS_DIR, os.path.relpath(source, src))
                try:
                    with open(source, "rb") as a, open(copy, "rb") as b:
                        if a.read() == b.read():
                            continue
                except FileNotFoundError:
                    pass
                return os.path.relpath(source, root)
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of tests marked ``long`` first, the longest first; every file's tests stay together and in order.

    pytest-xdist's worksteal hands each worker a run of the collection and lets an idle worker take the back half
    of another's queue. A five-minute test collected late started when the other worker had little left, which
    then idled for most of it (the newest lane's last five minutes, measured). Started first, it runs beside the
    short tests, which the other worker takes over as it goes.
    """
    longest: dict[Path, float] = {}
    for item in items:
        mark = item.get_closest_marker("long")
        if mark is not None:
            seconds = mark.args[0] if mark.args else mark.kwargs.get("seconds")
            if not isinstance(seconds, (int, float)):
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.long takes the seconds the test runs on a CI "
                                        f"machine (its --durations line), e.g. @pytest.mark.long(60)")
            longest[item.path] = max(longest.get(item.path, 0.0), float(seconds))
    order = {path: rank for rank, path in enumerate(sorted(longest, key=lambda p: -longest[p]))}
    items.sort(key=lambda item: order.get(item.path, len(order)))  # stable: the rest keep their order
    _skip_gpu_tests_without_cuda(items)


def _skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (pytest -m gpu on a GPU machine: benchmarks/gpu/run_all.sh)")
    for item in gpu:
        item.add_marker(skip)
