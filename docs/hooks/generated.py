"""mkdocs hook: the pages' generated parts, from the code itself, so they cannot drift from it.

``<!-- generated:settings -->`` becomes the table of every setting ``overmind.settings`` declares;
``<!-- generated:cli -->`` the ``--help`` of ``overmind`` and of each of its commands.
"""
from __future__ import annotations

import contextlib
import io


def _settings_table() -> str:
    from overmind import settings

    rows = ["| variable | default | accepts | what it does |", "|---|---|---|---|"]
    for s in settings.DECLARED:
        cells = [f"`{s.name}`", s.default_display(), s.accepted, s.help]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def _help(argv: list[str]) -> str:
    from overmind.cli import _parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        _parser().parse_args([*argv, "--help"])
    return out.getvalue().rstrip()


def _cli() -> str:
    from overmind.cli import _parser

    parser = _parser()
    commands = [a for a in parser._subparsers._group_actions[0].choices]  # noqa: SLF001 - argparse's own table
    parts = [f"### overmind\n\n```text\n{_help([])}\n```"]
    for name in commands:
        parts.append(f"### overmind {name}\n\n```text\n{_help([name])}\n```")
    return "\n\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - mkdocs' signature
    if "<!-- generated:settings -->" in markdown:
        markdown = markdown.replace("<!-- generated:settings -->", _settings_table())
    if "<!-- generated:cli -->" in markdown:
        markdown = markdown.replace("<!-- generated:cli -->", _cli())
    return markdown
