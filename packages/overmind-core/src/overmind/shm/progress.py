"""A progress bar for a long publish, the way Hugging Face downloads show one.

>>> with track(total_bytes, "unet") as advance:
...     for chunk in chunks:
...         write(chunk); advance(len(chunk))

Nothing shows for a publish that ends within ``OVERMIND_PROGRESS_DELAY`` seconds (default 3), when stderr is
not a terminal, when ``HF_HUB_DISABLE_PROGRESS_BARS`` (or ``OVERMIND_PROGRESS=0``) says so, or when tqdm is
not installed. The bar writes to stderr only, and is closed (left on screen) when the publish ends.

It fits the terminal: the loader's short name (``LlamaForCausalLM.from_pretrained``, cut at its end where the
terminal is narrower still), the percentage, the bar, bytes done of the total and the time left, in that order,
within the terminal's width (80 columns included).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Callable, Iterator

from .._util import interrupts


def enabled() -> bool:
    from ..settings import current, parse_bool

    if not current().progress:
        return False
    hf = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "")
    try:
        if hf.strip() and parse_bool(hf):
            return False
    except ValueError:
        pass
    stream = sys.stderr
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


# percentage, bar, "1.20G/3.00G", time left: 26 columns and the bar's own (tqdm fills ncols with the bar)
BAR_FORMAT = "{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {remaining}"
_STATS = 26
_MIN_BAR = 10


def _columns() -> int:
    """The width of the terminal the bar is drawn on (stderr's; ``COLUMNS`` first, as ``shutil`` reads it);
    100 where it reports none (0 columns would give an empty bar)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.stderr.fileno()).columns
        except (OSError, ValueError, AttributeError) as exc:
            interrupts.raise_users(exc)
            columns = 0
    return columns if columns > 0 else 100


def describe(loader: str, width: int) -> str:
    """``overmind: publishing Class.method``, shortened so that the bar's numbers and 10 columns of bar fit:
    ``overmind: Class.method`` where that fits, else that cut at its end."""
    short = ".".join(loader.split(".")[-2:])
    room = max(12, width - _STATS - _MIN_BAR)
    for text in (f"overmind: publishing {short}", f"overmind: {short}"):
        if len(text) <= room:
            return text
    return text[:room - 1] + "…"


@contextlib.contextmanager
def track(total: int, desc: str) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(nbytes)``; a tqdm bar appears once the work has taken longer than the delay."""
    from ..settings import current

    if total <= 0 or not enabled():
        yield lambda n: None
        return
    delay = current().progress_delay
    start = time.monotonic()
    state: dict[str, Any] = {"done": 0, "bar": None}

    def advance(n: int) -> None:
        state["done"] += n
        bar = state["bar"]
        if bar is None:
            if time.monotonic() - start < delay:
                return
            try:
                from tqdm.auto import tqdm
            except Exception as exc:  # noqa: BLE001 - no tqdm: no bar
                interrupts.raise_users(exc)
                state["bar"] = False
                return
            # A terminal that reports no size (0 columns) would get an empty bar: fall back to 100 columns.
            width = _columns()
            bar = state["bar"] = tqdm(total=total, initial=state["done"], unit="B", unit_scale=True,
                                      unit_divisor=1024, desc=describe(desc, width), file=sys.stderr,
                                      leave=True, ncols=width, bar_format=BAR_FORMAT)
            return
        if bar:
            bar.update(n)

    try:
        yield advance
    finally:
        if state["bar"]:
            state["bar"].close()
