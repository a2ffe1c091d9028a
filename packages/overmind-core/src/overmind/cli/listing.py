"""The ``overmind ls`` table: one row per entry, fitted to the terminal's width, then the keys loaded once and not
published (marks: their next load publishes).

Each row shows the part of an entry's arguments that tells it apart from the others: the directory prefix
every listed path shares is shown as ``…/``, whitespace (a multi-line repr) is folded into single spaces, and
what still does not fit is cut from the middle, so the tail of a path (its model folder) stays visible.
Entries are named by the shortest prefix of their keys (at least 8 characters) that is unique among them,
which ``overmind evict`` accepts.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from typing import Iterable, Sequence

from .._util.humanize import human_bytes, human_duration
from ..inspection import CacheEntry, CacheMark

SORTS = {"last-use": lambda e: -e.last_used, "size": lambda e: -(e.nbytes + e.referenced_nbytes),
         "hits": lambda e: -e.hits}
_PATH = re.compile(r"""(['"])(/[^'"]*)\1""")
_GAP = "  "


def terminal_width() -> int | None:
    """The terminal's width when stdout is one (or ``$COLUMNS``); None (no limit) for a pipe or file, so
    ``overmind ls | grep`` sees whole rows."""
    import sys

    if not os.environ.get("COLUMNS") and not (sys.stdout and sys.stdout.isatty()):
        return None
    return max(40, shutil.get_terminal_size((120, 24)).columns)


def unique_prefixes(keys: Sequence[str], shortest: int = 8) -> int:
    """The shortest prefix length (>= ``shortest``) at which every key differs."""
    n = shortest
    while n < max((len(k) for k in keys), default=shortest) and len({k[:n] for k in keys}) < len(set(keys)):
        n += 1
    return n


def one_line(text: str) -> str:
    return " ".join(text.split())


_PART = re.compile(r", (?=\w+=)")
_EMPTY = {"None", "False", "()", "[]", "{}", "''"}


def _informative(summary: str) -> str:
    """``summary`` without arguments left at nothing (``=None``, ``=False``, ``=()``...), and a path argument
    shown as its value alone (``'/models/unet'``, not ``pretrained_model_name_or_path='/models/unet'``)."""
    parts = []
    for part in _PART.split(one_line(summary)):
        name, eq, value = part.partition("=")
        if eq and value in _EMPTY:
            continue
        parts.append(value if eq and _PATH.fullmatch(value) else part)
    return ", ".join(parts)


def distinguishing(summaries: Sequence[str]) -> list[str]:
    """Each summary on one line and without empty arguments, with the directory prefix that all their paths
    share shown as ``…/``."""
    flat = [_informative(s) for s in summaries]
    paths = sorted({m.group(2) for s in flat for m in _PATH.finditer(s)})
    if not paths:
        return flat
    if len(paths) == 1:
        common = os.path.dirname(os.path.dirname(paths[0].rstrip("/")))
    else:
        common = os.path.commonpath(paths)
        if common in paths:  # one path is the parent of the others: keep its last part
            common = os.path.dirname(common)
    if len(common) <= 1:
        return flat
    return [re.sub(r"""(['"])""" + re.escape(common.rstrip("/")) + "/", r"\1…/", s) for s in flat]


def fit(text: str, width: int) -> str:
    """``text`` cut from the middle to ``width`` characters (its start and end kept)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def fit_loader(name: str, width: int) -> str:
    """A loader's short name (``Class.method``) in ``width`` characters: the method is cut first, then the
    class's end; the class's start, which tells loaders apart, stays."""
    if len(name) <= width:
        return name
    owner, dot, method = name.rpartition(".")
    if owner and len(owner) + 2 < width:
        return owner + dot + method[:width - len(owner) - 2] + "…"
    return (owner or name)[:width - 1] + "…"


def _cut_end(text: str, width: int) -> str:
    # The shared prefix is gone already, so what tells entries apart comes first: keep the start.
    return text if len(text) <= width else text[:width - 1] + "…"


def render(entries: Iterable[CacheEntry], width: int | None = None, *, sort: str = "last-use",
           now: float | None = None) -> list[str]:
    """The table's lines (header first, total last), each at most ``width`` characters."""
    rows = sorted(entries, key=SORTS[sort])
    if not rows:
        return ["no entries cached"]
    width = width or terminal_width() or 1 << 20
    now = time.time() if now is None else now
    n = unique_prefixes([e.key for e in rows])
    args = distinguishing([e.summary for e in rows])
    known = any(e.mapped_by is not None for e in rows)
    head = ("ENTRY", "SIZE", "REFS", "FILES", "HITS", "LAST USE", "PIDS", "LOADER", "ARGUMENTS")
    cells = []
    for e, a in zip(rows, args):
        pids = ("?" if e.mapped_by is None else ",".join(map(str, e.mapped_by)) or "-")
        cells.append([e.key[:n], human_bytes(e.nbytes), human_bytes(e.referenced_nbytes) if e.referenced_nbytes
                      else "-", human_bytes(e.file_nbytes) if e.files else "-", str(e.hits),
                      human_duration(now - e.last_used) + " ago", fit(pids, 16), e.short_loader, a])
    table = [list(head)] + cells
    keep = list(range(len(head)))
    want = min(32, max(len(a) for a in args))

    def room_left() -> int:
        return width - sum(max(len(r[i]) for r in table) + len(_GAP) for i in keep[:-1])

    # A narrow terminal: the arguments keep up to 32 columns; PIDS, REFS, FILES and LAST USE give way, then the
    # loader (its method before its class).
    for drop in (6, 2, 3, 5):
        if room_left() < want:
            keep.remove(drop)
    fixed = [max(len(r[i]) for r in table) for i in keep[:-1]]
    room = room_left()
    if room < want:
        loader_w = max(12, fixed[-1] - (want - room))
        room += fixed[-1] - loader_w
        # then back to the loader, while the arguments keep 26 columns, until its longest class name fits
        classes = max(len(r[7].rpartition(".")[0] or r[7]) for r in cells) + 2
        give = min(max(0, room - 26), max(0, min(classes, fixed[-1]) - loader_w))
        loader_w, room = loader_w + give, room - give
        fixed[-1] = loader_w
    room = max(room, 8)
    lines = []
    for r in table:
        parts = [(fit_loader(r[i], w) if i == 7 else fit(r[i], w)).ljust(w) for i, w in zip(keep[:-1], fixed)]
        parts.append(_cut_end(r[-1], room))
        lines.append(_GAP.join(parts).rstrip()[:width])
    lines.append(fit(total_line(rows, known), width))
    return lines


def render_marks(marks: Sequence[CacheMark], width: int | None = None, *, now: float | None = None) -> list[str]:
    """The keys loaded once and not published, most recent first, under a line that says what they are."""
    if not marks:
        return []
    width = width or terminal_width() or 1 << 20
    now = time.time() if now is None else now
    rows = sorted(marks, key=lambda m: -m.last_load)
    n = unique_prefixes([m.key for m in rows])
    args = distinguishing([m.summary for m in rows])
    table = [["KEY", "SIZE", "LOADS", "LAST LOAD", "LOADER", "ARGUMENTS"]]
    table += [[m.key[:n], human_bytes(m.nbytes) if m.nbytes else "?", str(m.loads),
               human_duration(now - m.last_load) + " ago", m.short_loader, a] for m, a in zip(rows, args)]
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    room = max(8, width - sum(w + len(_GAP) for w in widths))
    count = f"{len(rows)} key{'s' if len(rows) != 1 else ''}"
    lines = [fit(f"loaded once, not cached ({count}): the next load of each publishes it", width)]
    for r in table:
        lines.append(_GAP.join([c.ljust(w) for c, w in zip(r, widths)] + [_cut_end(r[5], room)]).rstrip()[:width])
    return lines


def total_line(rows: Sequence[CacheEntry], known: bool = True) -> str:
    """What the SIZE column adds up to (shared memory, the budget's), and the checkpoint files referenced, each
    file once however many entries reference it (page cache, outside the budget)."""
    count = f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'}"
    text = f"{count}: {human_bytes(sum(e.nbytes for e in rows))} in shared memory"
    files = {f.entry_id: f.nbytes for e in rows for f in e.files}
    if files:  # referenced where they lie, not copied: page cache, outside the budget
        text += (f"; {human_bytes(sum(files.values()))} in {len(files)} checkpoint file{'s' if len(files) > 1 else ''}"
                 f" referenced (page cache)")
    if not known:
        text += "; PIDS ?: this server does not say which processes map its entries"
    return text
