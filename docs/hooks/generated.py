"""mkdocs hook: the pages' generated parts, from the code itself, so they cannot drift from it.

Between ``<!-- generated:settings -->`` and ``<!-- /generated -->``: the table of every setting
``overmind.settings`` declares; ``generated:cli``: the ``--help`` of ``overmind`` and of each of its commands;
``generated:packages`` and ``generated:tested-ranges``: the packages of ``packages/`` and each adapter's tested
library ranges, read from their ``pyproject.toml`` (a new adapter appears by its folder alone); ``generated:wire-ops``:
the protocol version and the ops of ``overmind/ipc/ops.py``, one table per daemon; ``generated:modules``: the
module table of docs/architecture.md, each module's docstring's first paragraph. The checked-in pages
and README.md hold the blocks too (readable on GitHub); ``python docs/hooks/generated.py`` refreshes them, and
tests/test_docs_site.py fails when they are stale.
"""
from __future__ import annotations

import contextlib
import io
import re


def _settings_table() -> str:
    from overmind import settings

    rows = ["| variable | default | accepts | what it does |", "|---|---|---|---|"]
    for s in settings.DECLARED:
        cells = [f"`{s.name}`", s.default_display(), s.accepted, s.help]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def _help(argv: list[str]) -> str:
    import os

    from overmind.cli.commands import _parser

    out = io.StringIO()
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the same text wherever it is built
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            _parser().parse_args([*argv, "--help"])
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return out.getvalue().rstrip()


def _cli() -> str:
    from overmind.cli.commands import _parser

    parser = _parser()
    commands = [a for a in parser._subparsers._group_actions[0].choices]  # noqa: SLF001 - argparse's own table
    parts = [f"### overmind\n\n```text\n{_help([])}\n```"]
    for name in commands:
        parts.append(f"### overmind {name}\n\n```text\n{_help([name])}\n```")
    return "\n\n".join(parts)


PARTS = ("loading", "keys", "entries", "native", "shm", "client", "ipc", "adapters", "server", "runner", "cli",
         "_util")  # the module table's order of overmind's folders (one not named here comes after them)


def _summary(path) -> str:
    """The first paragraph of a module's docstring (of a C++ file's opening ``//`` comment) on one line, as
    Markdown: reST's double backticks and ``:role:`target``` become code spans."""
    import ast

    text = path.read_text()
    if path.suffix == ".py":
        first = (ast.get_docstring(ast.parse(text)) or "").split("\n\n")[0]
    else:
        lines = []
        for line in text.splitlines():
            if not line.startswith("//") or not line[2:].strip():
                break
            lines.append(line[2:])
        first = "\n".join(lines)
    first = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", first).replace("``", "`")
    return " ".join(first.split()).replace("|", "\\|")


def _modules() -> str:
    """docs/architecture.md's module table: every module of overmind-core (and every source file of its
    extension) with the first paragraph of its docstring, by folder, each folder titled by its ``__init__``'s."""
    import pathlib

    import overmind

    package = pathlib.Path(overmind.__file__).parent
    names = [p.relative_to(package).as_posix() for p in package.rglob("*")
             if p.suffix in (".py", ".cpp", ".h") and "__pycache__" not in p.parts]
    folders: dict[str, list[str]] = {}
    for name in names:
        folders.setdefault(name.split("/")[0] if "/" in name else "", []).append(name)
    order = ["", *[f for f in PARTS if f in folders], *sorted(set(folders) - {"", *PARTS})]
    groups = []
    for folder in order:
        if folder:
            title = _summary(package / folder / "__init__.py").split(": ", 1)[0].rstrip(".")
            word = title.split(" ", 1)[0]
            title = title[0].lower() + title[1:] if word[:1].isupper() and word[1:] == word[1:].lower() else title
            heading = f"**`{folder}/`: {title}**"
        else:
            heading = "**Top level: the public face and what every part reads**"
        rows = [heading, "", "| module | job |", "|---|---|"]
        for name in sorted(folders[folder], key=lambda n: ["" if s == "__init__.py" else s for s in n.split("/")]):
            rows.append(f"| `{name}` | {_summary(package / name)} |")
        groups.append("\n".join(rows))
    return "\n\n".join(groups)


def _pyprojects() -> list[dict]:
    """Every package of packages/, in name order (the core first): found, not listed."""
    import pathlib

    import tomllib

    root = pathlib.Path(__file__).resolve().parents[2]
    found = [tomllib.loads(p.read_text()) for p in sorted(root.glob("packages/overmind-*/pyproject.toml"))]
    return sorted(found, key=lambda p: (p["project"]["name"] != "overmind-core", p["project"]["name"]))


def _packages() -> str:
    """The packages of the repository: folder, import name, what it holds (its pyproject's description) and, for
    an adapter, the library versions it is tested with (its ``tested`` extra); last, the adapter to copy
    (``packages/_template``, whose library is a stand-in: no tested versions)."""
    import pathlib

    import tomllib

    rows = ["| package | import | what | tested with |", "|---|---|---|---|"]
    for pyproject in _pyprojects():
        name = pyproject["project"]["name"]
        module = "overmind" if name == "overmind-core" else name.replace("-", "_")
        tested = pyproject["project"].get("optional-dependencies", {}).get("tested", [])
        rows.append(f"| `packages/{name}` | `{module}` | {pyproject['project']['description']} | "
                    f"{', '.join(f'`{line}`' for line in tested)} |")
    template = pathlib.Path(__file__).resolve().parents[2] / "packages" / "_template" / "pyproject.toml"
    if template.exists():
        module = tomllib.loads(template.read_text())["project"]["name"].replace("-", "_")
        rows.append(f"| `packages/_template` | `{module}` | The adapter to copy to write one (docs/adapters.md, "
                    f"\"Write your own adapter\"), for a stand-in library |  |")
    return "\n".join(rows)


def _tested_ranges() -> str:
    """Each adapter's ``tested`` ranges (the libraries its lanes run) beside its ``instruments`` (what activation
    needs), then the companion libraries'."""
    from overmind.cli.compatibility import COMPANIONS

    def split(lines: list[str]) -> tuple[list[str], list[str]]:
        names = [re.split(r"[<>=!~ ;\[]", line, maxsplit=1)[0] for line in lines]
        return names, [f"`{line[len(name):].strip()}`" for name, line in zip(names, lines)]

    rows = ["| library | tested range | needs | declared by |", "|---|---|---|---|"]
    for pyproject in _pyprojects():
        project = pyproject["project"]
        if "overmind.adapters" not in project.get("entry-points", {}):
            continue
        extras = project.get("optional-dependencies", {})
        names, tested = split(extras.get("tested", []))
        needs = dict(zip(*split(extras.get("instruments", []))))
        rows.append(f"| {', '.join(names)} | {', '.join(tested)} | {', '.join(needs.get(n, '-') for n in names)} | "
                    f"{project['name']} |")
    rows.append(f"| {', '.join(COMPANIONS)} | see `overmind/cli/compatibility.py` | - | companions (doctor only: a "
                f"version outside is a warning, nothing is skipped) |")
    return "\n".join(rows)


def _wire_ops() -> str:
    """The protocol version this code speaks, then every op of ``overmind/ipc/ops.py``: one table
    for the server's, one for the template's."""
    from overmind.ipc import ops
    from overmind.ipc.protocol import PROTOCOL_VERSION

    def fields(declared, fds: str | None) -> str:
        cells = [f"`{f.name}`{'?' if f.optional else ''}{f' ({f.about})' if f.about else ''}"
                 for f in declared]
        return "; ".join(cells + ([f"fds: {fds}"] if fds else [])) or "-"

    parts = [f"This code speaks protocol version {PROTOCOL_VERSION} (`PROTOCOL_VERSION` in "
             f"`ipc/protocol.py`). A field marked `?` may be left out (a reply's is in some replies "
             f"only); `since`: the protocol version that introduced the op."]
    daemons = {ops.SERVER: "The server's ops (`server/connection.py`)",
               ops.TEMPLATE: "A template's ops (`runner/template.py`)"}
    for daemon, title in daemons.items():
        rows = ["| op | since | request | reply | what it does |", "|---|---|---|---|---|"]
        for op in ops.served_by(daemon):
            cells = [f"`{op.name}`", str(op.since), fields(op.request, op.fds_in),
                     fields(op.reply, op.fds_out), op.about]
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        parts.append(f"{title}:\n\n" + "\n".join(rows))
    return "\n\n".join(parts)


GENERATORS = {"settings": _settings_table, "cli": _cli, "packages": _packages,
              "tested-ranges": _tested_ranges, "wire-ops": _wire_ops, "modules": _modules}
_BLOCK = re.compile(r"(<!-- generated:([\w-]+) -->\n).*?(<!-- /generated -->)", re.S)


def fill(markdown: str) -> str:
    """``markdown`` with every generated block (between ``<!-- generated:NAME -->`` and ``<!-- /generated -->``)
    made anew."""
    return _BLOCK.sub(lambda m: f"{m.group(1)}{GENERATORS[m.group(2)]()}\n{m.group(3)}", markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - mkdocs' signature
    return fill(markdown)


if __name__ == "__main__":  # python docs/hooks/generated.py: refresh the blocks in the checked-in pages
    import pathlib

    docs = pathlib.Path(__file__).resolve().parents[1]
    for page in [*docs.glob("*.md"), docs.parent / "README.md"]:
        text = page.read_text()
        if fill(text) != text:
            page.write_text(fill(text))
            print(f"updated {page}")
