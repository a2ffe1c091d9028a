"""A miss's large CPU allocations made in the memfd that becomes its entry: converted tensors written once. While a
miss's loader runs, its allocations of 1 MiB or more are ranges of that memfd; closed, they are remapped private,
and detached where dedup found their bytes elsewhere (``OVERMIND_WRITE_ONCE``).

An fp32 checkpoint loaded with ``torch_dtype=torch.float16`` converts every tensor. Plain allocates the fp16 tensors
in the heap; copying them from there into a fresh memfd would cost a miss well over plain's own time per GiB
(docs/benchmarks-more.md, "Smaller measurements": ``convert_path.py``). So while a miss's loader runs,
:func:`open_arena` routes this thread's CPU allocations of :data:`THRESHOLD` bytes or more to page-aligned ranges of
one memfd, mapped shared, after the entry's header page (torch's CPU allocator is the extension's placing one while
any arena is open; ``csrc/load_arena.cpp``). The conversion writes the bytes there, once.

When the loader returns, :meth:`Arena.close` stops placing and remaps every live range private: the same
pages, copy-on-write, so the loader's tensors stay valid, a later write of this process lands in a page of its
own, and no writable shared mapping stands in the way of the seal. The placer then places a storage that
starts at a live range at that range's offset, with nothing to write (:meth:`Arena.locate`); the writer puts
the other storages, the skeleton and the header into the same memfd and seals it (``shm.writer``).

- A temporary the loader freed while it ran is punched out of the memfd (a hole, no page).
- A range whose bytes dedup found in another entry is detached (:meth:`Arena.detach`): its tensor gets an
  anonymous copy at the same address, and the range is punched out.
- Arenas nest per thread (a pipeline's component loads): the innermost one receives, and a forked child's
  allocations are its own. Another thread's allocation of the threshold or more (a loader's pool thread:
  transformers 5 converts in one) is not placed (the allocator cannot tell a thread working for this load from
  one of the user's doing something else meanwhile): it gets a private anonymous mapping of its own, unmapped
  when freed. From the heap it would come from that thread's malloc arena, and once the miss frees the loader's
  result (rebuilt from the entry), glibc keeps that freed memory resident: ``malloc_trim`` trims the main arena
  only. Measured in the cold fp32 blog process: 1.5-24 MiB resident in thread arenas, under 0.5 MiB with own
  mappings (docs/benchmarks.md).
- If the entry is not published (the result cannot be pickled, the server is gone), the loader's tensors
  simply stay private mappings of the memfd, which lives as long as they do.

Without the compiled extension (or with ``OVERMIND_ZEROCOPY=python``), with ``OVERMIND_WRITE_ONCE=0``, or
when torch has another CPU allocator of higher priority installed, there is no arena and every storage is
copied as before.

>>> arena = open_arena()                 # None when unavailable
>>> result = loader()
>>> arena.close()
>>> arena.locate(storage.data_ptr(), storage.nbytes())   # offset in the memfd, or None
"""
from __future__ import annotations

import importlib
import logging
from typing import Any

from .. import settings
from .._util import interrupts
from .layout import DATA_FIRST_OFFSET

log = logging.getLogger("overmind")

THRESHOLD = 1 << 20  # smaller allocations stay in the heap: one mapping each would cost more than the copy


def _extension() -> Any | None:
    from ..native import zerocopy

    if zerocopy.IMPLEMENTATION != "c":
        return None
    ext = importlib.import_module("overmind.native._C")
    return ext if hasattr(ext, "arena_open") else None


def available() -> str | None:
    """None when a miss gets an arena; else why not (for ``overmind doctor`` and the tests)."""
    if not settings.current().write_once:
        return "OVERMIND_WRITE_ONCE=0"
    if _extension() is None:
        return "the compiled extension overmind.native._C is not in use"
    return None


def open_arena(threshold: int | None = None) -> Arena | None:
    """Open an arena on this thread for allocations of ``threshold`` bytes or more (default
    :data:`THRESHOLD`), or return None (unavailable, or it could not be opened: logged)."""
    ext = _extension() if settings.current().write_once else None
    if ext is None:
        return None
    try:
        return Arena(ext, ext.arena_open(THRESHOLD if threshold is None else threshold))
    except Exception as exc:  # noqa: BLE001 - no arena is always a correct answer: the storages are copied
        interrupts.raise_users(exc)
        log.debug("no load arena (%s: %s); storages are copied", type(exc).__name__, exc)
        return None


class Arena:
    """One open (then closed) arena. Close it on the thread that opened it, right after the loader; release
    it once the entry is written (or given up)."""

    def __init__(self, ext: Any, handle: int) -> None:
        self._ext = ext
        self._handle = handle
        self.closed = False
        self.usable = False  # closed, every live range remapped private: storages may be placed in it
        self.ranges: dict[int, tuple[int, int]] = {}  # address -> (size, offset in the memfd) of live ranges

    def close(self) -> None:
        """Stop placing and remap the live ranges private. Never raises: on failure the arena is not used
        (its ranges are copied like any storage)."""
        if self.closed:
            return
        self.closed = True
        try:
            live = self._ext.arena_close(self._handle)
        except Exception as exc:  # noqa: BLE001
            interrupts.raise_users(exc)
            log.debug("closing the load arena failed (%s: %s); its storages are copied",
                      type(exc).__name__, exc)
            return
        self.ranges = {address: (size, offset) for address, size, offset in live}
        self.usable = all(offset >= DATA_FIRST_OFFSET for _size, offset in self.ranges.values())

    @property
    def data_end(self) -> int:
        """The memfd offset just past the last live range (the header's end when there is none)."""
        return max((offset + size for size, offset in self.ranges.values()), default=DATA_FIRST_OFFSET)

    def locate(self, address: int, nbytes: int) -> int | None:
        """The memfd offset of a storage of ``nbytes`` at ``address`` if it starts a live range and fits in it."""
        got = self.ranges.get(address) if self.usable else None
        if got is None or nbytes > got[0]:
            return None
        return got[1]

    def detach(self, address: int) -> None:
        """The live range at ``address`` is not to be kept in the entry: copy it out for its tensor, punch it."""
        self._ext.arena_detach(self._handle, address)
        del self.ranges[address]

    def fd(self) -> int:
        """The arena's memfd, borrowed (valid until :meth:`release`)."""
        return self._ext.arena_fd(self._handle)

    def release(self) -> None:
        """Forget the arena and close its memfd (the entry written into it has its own fd by then)."""
        self.usable = False
        self._ext.arena_release(self._handle)


def live_ranges() -> int:
    """Live arena ranges in this process (0 without the extension)."""
    ext = _extension()
    return int(ext.arena_live_ranges()) if ext is not None else 0
