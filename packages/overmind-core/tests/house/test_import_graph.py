"""The modules of ``overmind`` import each other without a cycle, and its parts stand in layers: read from their
source with ``ast``, counting every import, at import time, inside a function (a late import is still a
dependency: it only moves the cycle to the first call) or under ``if TYPE_CHECKING:`` (a type is a dependency
too). No module is exempt."""
from __future__ import annotations

import ast
import importlib
import re
import textwrap
from pathlib import Path

import overmind

ROOT = Path(overmind.__file__).parent


def module_name(path: Path) -> str:
    parts = ("overmind",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def import_statements(body: list[ast.stmt]):
    """Every import statement: in the module body and in any block, function or class inside it."""
    for node in body:
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                yield sub


def imports_of(name: str) -> set[str]:
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in import_statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule; `from mod import name` imports the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        found |= {t for t in targets if t in MODULES and t != name}
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_reader_sees_the_imports():
    assert "overmind.adapters.hooks" in imports_of("overmind.loading.flow")
    assert "overmind.errors" in imports_of("overmind.adapters.patching")
    assert "overmind.loading.flow" in imports_of("overmind.activation")  # inside a function: counted
    assert "overmind.keys.canon_torch" in imports_of("overmind.keys.canon")  # inside a method: counted
    assert "overmind.keys.key" in imports_of("overmind.adapters.hookspecs")  # under TYPE_CHECKING: counted
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_in_overmind():
    graph = {name: imports_of(name) for name in MODULES}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_patching_knows_nothing_of_the_load_path():
    assert imports_of("overmind.adapters.patching") <= {"overmind.errors", "overmind._util.frozen",
                                                        "overmind._util.user_frame"}
    assert imports_of("overmind._util.frozen") == set()  # a leaf: the frozen record base
    assert "import api" not in MODULES["overmind.adapters.patching"].read_text()


# The parts of the core from the ground up: a part imports only parts on lower floors (and itself). A top-level
# module is a part of its own; a folder is one part.
FLOORS = [
    ["_version", "errors", "_util"],
    ["settings"],
    ["fallback", "ipc", "native"],
    ["client", "shm"],
    ["fleet"],
    ["keys", "server", "inspection"],
    ["adapters"],
    ["entries"],
    ["loading"],
    ["activation", "adapter"],
    ["__init__", "testing", "runner"],
    ["cli"],
    ["__main__"],
]


def part_of(name: str) -> str:
    parts = name.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_the_parts_stand_in_floors():
    floor = {part: i for i, parts in enumerate(FLOORS) for part in parts}
    assert {part_of(m) for m in MODULES} == set(floor), "a part of the core is missing from FLOORS (or gone)"
    upward = sorted(f"{name} -> {target}" for name in MODULES for target in imports_of(name)
                    if part_of(target) != part_of(name) and floor[part_of(target)] >= floor[part_of(name)])
    assert not upward, "imports of a part on the same floor or above: " + ", ".join(upward)


def test_the_fixture_adapter_needs_nothing_of_overmind_but_the_kit():
    """tests/adapter_fixture is written as a third party would, against ``overmind.adapter`` alone; with that
    it passes the conformance checks (test_discovery.py::test_conformance_checks_pass_for_the_fixture_adapter)."""
    fixture = Path(__file__).resolve().parents[4] / "tests" / "adapter_fixture" / "src" / "overmind_fixture_adapter"
    used = set()
    for path in fixture.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                used |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                used.add(node.module or "")
    assert "overmind.adapter" in used
    assert {m for m in used if m.split(".")[0] == "overmind"} == {"overmind.adapter"}, sorted(used)


PUBLIC = ("overmind", "overmind.adapter", "overmind.testing")
# an import line in a script a test hands to a fresh process (a string): `from overmind.x import a, b`
# or `import overmind.x`
_FROM_LINE = re.compile(r"^[ \t]*from\s+(overmind(?:\.\w+)*)\s+import\s+(\([^)]*\)?|[^\n]*)", re.M)
_IMPORT_LINE = re.compile(r"^[ \t]*import\s+(overmind(?:\.\w+)*)", re.M)


def public_names(module: str) -> set[str]:
    """What ``module`` (one of :data:`PUBLIC`) offers: its ``__all__``, and for ``overmind`` the other
    public modules."""
    names = set(importlib.import_module(module).__all__)
    return names | {"adapter", "testing"} if module == "overmind" else names


def _imports_in_code(tree: ast.AST) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.module or "", [a.name for a in node.names]))
    return found


def _strings(tree: ast.AST) -> list[str]:
    """The text of every string in ``tree``, an f-string's fields left as ``{}``."""
    out = []
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
    return out


def _names(imported: str) -> list[str]:
    """The names of ``a, b as c`` or ``(a,\n b)``, comments and f-string fields left out."""
    text = " ".join(line.partition("#")[0] for line in imported.strip("()").splitlines())
    return [n.split()[0] for n in text.split(",") if n.strip() and n.split()[0].isidentifier()]


def _imports_in_text(text: str) -> list[tuple[str, list[str]]]:
    found = [(m[1], _names(m[2])) for m in _FROM_LINE.finditer(text)]
    return found + [(m[1], []) for m in _IMPORT_LINE.finditer(text)]


def imports_in(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every import in ``path``'s code and in the scripts its strings hold (a
    file that does not parse, a template, is read as one script)."""
    text = path.read_text()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return _imports_in_text(text)
    return _imports_in_code(tree) + [i for s in _strings(tree) for i in _imports_in_text(s)]


def private_uses(path: Path) -> list[str]:
    """What ``path`` imports of ``overmind`` beyond the public kit: a module other than
    :data:`PUBLIC` (``from overmind import shm`` names one), or a name one of them does not list in
    ``__all__``."""
    out = []
    for module, names in imports_in(path):
        if module.split(".")[0] != "overmind":
            continue
        if module not in PUBLIC:
            out.append(module)
            continue
        out += [f"{module}.{name}" for name in names if name not in public_names(module)]
    return out


def support_helpers(paths: list[Path]) -> list[Path]:
    """The modules of ``tests/_support`` (helpers several suites share) that ``paths`` import."""
    support = Path(__file__).resolve().parents[4] / "tests" / "_support"
    found = set()
    for path in paths:
        for module, names in imports_in(path):
            if module == "_support":
                found |= {support / "__init__.py"} | {support / f"{n}.py" for n in names}
            elif module.startswith("_support."):
                found.add(support / f"{module.split('.')[1]}.py")
    return sorted(p for p in found if p.exists())


def test_the_adapters_and_their_tests_import_only_the_public_kit():
    """Every adapter (``packages/*`` but the core) and its tests, the scripts they run in fresh
    processes and the helpers of ``tests/_support`` they import included, are written against
    ``overmind``, ``overmind.adapter`` and ``overmind.testing`` alone: what an adapter or its tests
    need of the core is kit API, named in those modules' ``__all__``."""
    packages = Path(__file__).resolve().parents[3]
    core = packages / "overmind-core"
    paths = sorted(packages.glob("overmind-*/src/**/*.py")) + sorted(packages.glob("*/tests/**/*.py"))
    paths = [p for p in paths if not p.is_relative_to(core)]
    helpers = support_helpers([p for p in paths if "tests" in p.relative_to(packages).parts])
    assert any(p.name == "adapter_testlib.py" for p in helpers), helpers
    used: dict[str, list[str]] = {}
    for path in paths + helpers:
        for name in private_uses(path):
            used.setdefault(name, []).append(path.relative_to(packages.parent).as_posix())
    assert len(list(packages.glob("overmind-*/src"))) > 2 and len(list(packages.glob("*/tests"))) > 2
    assert not used, (f"adapters or their tests import what the kit does not offer: {used}. Use a "
                      f"public name (overmind.adapter, overmind.testing, overmind), or give the "
                      f"thing one there (docs/architecture.md, 'Where to make a change').")


def test_private_uses_finds_code_and_scripts(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text(textwrap.dedent('''
        from overmind import activation, testing
        from overmind.testing import _reported, run_fresh
        import overmind.adapter

        SCRIPT = """
        from overmind.shm import mappings
        import overmind.keys.key
        """
        LATER = f"""
        from overmind.testing import (report,
                                      {"x"})
        from overmind.loading import scope
        """
    '''))
    assert sorted(private_uses(path)) == ["overmind.activation", "overmind.keys.key", "overmind.loading",
                                          "overmind.shm", "overmind.testing._reported"]
    path.write_text("from overmind.client.connection import get_client\n{{ a template }}\n")
    assert private_uses(path) == ["overmind.client.connection"]
