"""The modules of ``overmind`` import each other without a cycle, and its parts stand in layers: read from their
source with ``ast``, counting every import, at import time, inside a function (a late import is still a
dependency: it only moves the cycle to the first call) or under ``if TYPE_CHECKING:`` (a type is a dependency
too). No module is exempt."""
from __future__ import annotations

import ast
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
    fixture = Path(__file__).resolve().parents[3] / "tests" / "adapter_fixture" / "src" / "overmind_fixture_adapter"
    used = set()
    for path in fixture.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                used |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                used.add(node.module or "")
    assert "overmind.adapter" in used
    assert {m for m in used if m.split(".")[0] == "overmind"} == {"overmind.adapter"}, sorted(used)


def test_the_adapters_import_only_the_public_kit():
    """Every adapter (``packages/overmind-*`` but the core) is written against ``overmind``, ``overmind.adapter``
    and ``overmind.testing`` alone: what it needs of the core is kit API."""
    packages = Path(__file__).resolve().parents[2]
    public = {"overmind", "overmind.adapter", "overmind.testing"}
    used = {}
    for path in sorted(packages.glob("overmind-*/src/**/*.py")):
        if path.is_relative_to(packages / "overmind-core"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:  # `from overmind import shm` names a module
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names
                                               if f"{node.module}.{a.name}" in MODULES]
            for name in names:
                if name.split(".")[0] == "overmind" and name not in public:
                    used.setdefault(name, []).append(path.relative_to(packages).as_posix())
    assert len(list(packages.glob("overmind-*/src"))) > 2
    assert not used, f"adapters import private modules of the core: {used}"
