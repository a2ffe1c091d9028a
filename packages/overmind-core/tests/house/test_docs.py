"""The documents a newcomer reads first say what the code does: docs/architecture.md lists every module of
overmind-core, and docs/adapters.md's hook table is the one declared in ``overmind.adapters.hookspecs.SPECS`` (each
hook's signature with its types, its kind and when it runs)."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import overmind
from overmind.adapters import hookspecs

DOCS = Path(__file__).resolve().parents[4] / "docs"
PACKAGE = Path(overmind.__file__).parent


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row of ``text`` (header and ruler rows left out)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append(cells)
    return rows


def test_architecture_lists_every_module_of_the_core():
    listed = section((DOCS / "architecture.md").read_text(), "## Modules of `overmind`")
    names = {cell for row in table_rows(listed) for cell in re.findall(r"`([^`]+)`", row[0])}
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
               if p.suffix in (".py", ".cpp", ".h") and "__pycache__" not in p.parts}
    assert modules, PACKAGE
    assert not sorted(modules - names), f"modules missing from docs/architecture.md: {sorted(modules - names)}"
    assert not sorted(names - modules), f"docs/architecture.md lists modules that do not exist: {sorted(names - modules)}"


def test_adapters_doc_has_the_hook_table_of_hookspecs():
    rows = {row[0].strip("`"): row for row in table_rows(section((DOCS / "adapters.md").read_text(), "## Hooks"))
            if row[0].startswith("`overmind_")}
    assert set(rows) == set(hookspecs.SPECS), "docs/adapters.md's hook table and hookspecs.SPECS differ"
    for name, spec in hookspecs.SPECS.items():
        _, signature, kind, runs = rows[name][:4]
        declared = str(inspect.signature(getattr(hookspecs, name))).replace("'", "")
        assert signature.strip("`") == declared, (name, signature, declared)
        assert kind.startswith(spec.kind.value), (name, kind, spec.kind.value)
        assert runs == spec.when.value, (name, runs, spec.when.value)
