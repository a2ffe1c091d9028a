"""Pickling an entry and rebuilding it warn nothing of their own, and leave torch's warn-once flag as it was.

A plain call neither pickles its result nor rebuilds it, so what torch warns there (``TypedStorage is
deprecated`` where a quantized tensor's rebuild reads its storage's device, the beta notices of sparse and
quantized constructors) is no warning of the call's: :class:`~overmind._util.quiet_warnings.quiet` drops it, in
the pickling or rebuilding thread only. The loader's own warnings are another matter: recorded on the miss and
issued again on a hit (``loading/replay/loader_warnings.py``).

torch's ``TypedStorage`` deprecation also remembers in a flag of its own (``has_warned`` on
``torch.storage._warn_typed_storage_removal``) that it warned once: set by a silenced rebuild, it would keep the
user's first ``tensor.storage()`` afterwards silent where plain warns. It is put back as it was.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from .._util.quiet_warnings import quiet

_ABSENT = object()


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """``with silenced():`` around Overmind's pickling or rebuilding, in the thread doing it."""
    holder = _flag_holder()
    before = _ABSENT if holder is None else holder.get("has_warned", _ABSENT)
    with quiet():
        try:
            yield
        finally:
            if holder is not None:
                if before is _ABSENT:
                    holder.pop("has_warned", None)
                else:
                    holder["has_warned"] = before


def _flag_holder() -> dict[str, Any] | None:
    """The ``__dict__`` torch keeps its ``TypedStorage`` warn-once flag in (None where this torch has none)."""
    warn = getattr(sys.modules.get("torch.storage"), "_warn_typed_storage_removal", None)
    holder = getattr(warn, "__dict__", None)
    return holder if isinstance(holder, dict) else None
