"""A progress bar for a long publish, the way Hugging Face downloads show one.

>>> with track(total_bytes, "unet") as advance:
...     for chunk in chunks:
...         write(chunk); advance(len(chunk))

Nothing shows for a publish that ends within ``OVERMIND_PROGRESS_DELAY`` seconds (default 3), when stderr is
not a terminal, when ``HF_HUB_DISABLE_PROGRESS_BARS`` (or ``OVERMIND_PROGRESS=0``) says so, or when tqdm is
not installed. The bar writes to stderr only, and is closed (left on screen) when the publish ends.
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
            import shutil

            # A terminal that reports no size (0 columns) would get an empty bar: fall back to 100 columns.
            bar = state["bar"] = tqdm(total=total, initial=state["done"], unit="B", unit_scale=True,
                                      unit_divisor=1024, desc=f"overmind: publishing {desc}", file=sys.stderr,
                                      leave=True, ncols=shutil.get_terminal_size((100, 24)).columns)
            return
        if bar:
            bar.update(n)

    try:
        yield advance
    finally:
        if state["bar"]:
            state["bar"].close()
