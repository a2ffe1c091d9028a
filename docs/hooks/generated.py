"""mkdocs hook: the pages' generated parts, from the code itself, so they cannot drift from it.

Between ``<!-- generated:settings -->`` and ``<!-- /generated -->``: the table of every setting
``overmind.settings`` declares; ``generated:cli``: the ``--help`` of ``overmind`` and of each of its commands.
The checked-in pages hold the blocks too (readable on GitHub); ``python docs/hooks/generated.py`` refreshes
them, and tests/test_docs_site.py fails when they are stale.
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

    from overmind.cli.main import _parser

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
    from overmind.cli.main import _parser

    parser = _parser()
    commands = [a for a in parser._subparsers._group_actions[0].choices]  # noqa: SLF001 - argparse's own table
    parts = [f"### overmind\n\n```text\n{_help([])}\n```"]
    for name in commands:
        parts.append(f"### overmind {name}\n\n```text\n{_help([name])}\n```")
    return "\n\n".join(parts)


GENERATORS = {"settings": _settings_table, "cli": _cli}
_BLOCK = re.compile(r"(<!-- generated:(\w+) -->\n).*?(<!-- /generated -->)", re.S)


def fill(markdown: str) -> str:
    """``markdown`` with every generated block (between ``<!-- generated:NAME -->`` and ``<!-- /generated -->``)
    made anew."""
    return _BLOCK.sub(lambda m: f"{m.group(1)}{GENERATORS[m.group(2)]()}\n{m.group(3)}", markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - mkdocs' signature
    return fill(markdown)


if __name__ == "__main__":  # python docs/hooks/generated.py: refresh the blocks in the checked-in pages
    import pathlib

    for page in pathlib.Path(__file__).resolve().parents[1].glob("*.md"):
        text = page.read_text()
        if fill(text) != text:
            page.write_text(fill(text))
            print(f"updated {page}")
