"""packages/_template, the adapter one copies to write a new one, kept working: installed as a user
installs an adapter (``pip install``, into a folder of its own, as scripts/setup installs the
test-only adapters) beside a stand-in for the library it instruments
(tests/adapter_template_mylib), its own tests pass against it; and it imports nothing of Overmind
but the public kit."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _support import pythonpath_env

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "packages" / "_template"
LIBRARY = Path(__file__).resolve().parent / "adapter_template_mylib"
PUBLIC = {"overmind", "overmind.adapter", "overmind.testing"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The folder the template and its library are installed into, on ``PYTHONPATH`` only for
    the processes that run the template's tests. Built from copies: the checkout gets no build
    output."""
    base = tmp_path_factory.mktemp("template")
    copies = []
    for source in (TEMPLATE, LIBRARY):
        copy = base / source.name
        ignored = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
        shutil.copytree(source, copy, ignore=ignored)
        copies.append(str(copy))
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install",
                    "--no-build-isolation", "--no-deps", "--no-compile",
                    "--target", str(base / "site"), *copies],
                   check=True, capture_output=True, text=True)
    return base / "site"


@pytest.mark.long(60)  # seconds on a CI machine: conftest.py runs it early
def test_its_tests_pass_with_it_installed(installed):
    # a pytest of its own: not this run's xdist worker
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), pythonpath_env()])
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", str(TEMPLATE / "tests")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, f"{run.stdout[-8000:]}\n{run.stderr[-4000:]}"
    assert "passed" in summary and "skipped" not in summary, summary


def test_it_imports_nothing_of_overmind_but_the_public_kit():
    files = sorted((TEMPLATE / "src").rglob("*.py")) + sorted((TEMPLATE / "tests").rglob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            private = [n for n in names if n.split(".")[0] == "overmind" and n not in PUBLIC]
            assert not private, (f"{path.relative_to(ROOT)} imports {private}: an adapter "
                                 f"imports only {sorted(PUBLIC)}")
