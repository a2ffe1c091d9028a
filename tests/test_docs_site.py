"""The docs site builds with warnings as errors: ``mkdocs build --strict``, whose generated pages
list every declared setting and every command's --help."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from overmind import settings

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_site_builds_strict_with_every_setting_and_command(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is pinned in scripts/requirements.txt; run scripts/setup")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]  # a broken link or anchor, a page left out of nav, ...
    page = (tmp_path / "site" / "settings" / "index.html").read_text()
    for s in settings.DECLARED:
        assert s.name in page, s.name
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    for command in ("overmind ls", "overmind evict", "--dry-run", "--sort", "overmind doctor"):
        assert command in cli, command
    assert not (tmp_path / "site" / "hooks").exists()


def test_the_checked_in_generated_blocks_are_current():
    """docs/settings.md, docs/cli.md, docs/compatibility.md, docs/architecture.md (the wire ops, the modules) and
    README.md hold the generated tables too (readable without the site): they must be what docs/hooks/generated.py
    makes now. Refresh with: python docs/hooks/generated.py"""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_generated", ROOT / "docs" / "hooks" / "generated.py")
    generated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generated)
    for page in ("docs/settings.md", "docs/cli.md", "docs/compatibility.md", "docs/architecture.md", "README.md"):
        text = (ROOT / page).read_text()
        assert "<!-- /generated -->" in text
        assert generated.fill(text) == text, f"{page} is stale: run python docs/hooks/generated.py"
