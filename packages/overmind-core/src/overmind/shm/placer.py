"""Where each storage of a new entry goes: an aligned offset in its data region (one place per storage), a place in
an entry already mapped (a dep), or where it already lies in the load arena.

The pickler meets storages one by one and asks :meth:`Placer.place`; only this module knows the data region's
alignment (``layout.STORAGE_ALIGN``) and how bytes are shared. A storage met twice (views of one storage, a tied
weight) gets one place. A CPU storage that lies, untouched, in an entry mapping of this process (``vae=vae``) is
referenced there instead of copied (see :mod:`.mappings`), and that entry becomes a dependency of the new one.
A CPU storage that is an untouched private mapping of a checkpoint file (a lazy safetensors load) is referenced
in that file (see :mod:`.filemaps`): its place is ``(file entry id, offset in the file)``, and the file entry
is a dependency like any other (``OVERMIND_FILE_REFERENCES=0`` copies such storages instead).
A storage that starts a live range of the miss's load arena (``shm/arena.py``) is already in the memfd that
becomes the entry: it is placed at that range's offset (``in_place``), and the other storages after the ranges.

>>> placer = Placer()
>>> placer.place(tensor.untyped_storage())      # (None, 0): this entry, offset 0
>>> placer.storages, placer.data_len, placer.deps  # what the writer copies, and the entries referenced
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import settings
from . import filemaps, mappings, pagemap
from .layout import DATA_FIRST_OFFSET, STORAGE_ALIGN, align

if TYPE_CHECKING:
    import torch

    from .arena import Arena


class Placer:
    """Assigns each distinct storage its place once; ``reference_mapped=False`` copies every storage."""

    def __init__(self, reference_mapped: bool = True, arena: Arena | None = None) -> None:
        self.reference_mapped = reference_mapped
        self.storages: list[tuple[torch.UntypedStorage, int]] = []  # (storage, offset in the data region)
        self.arena = arena if arena is not None and arena.usable else None
        # With an arena the data region starts at the memfd's second page, where its ranges already are.
        self.data_len = self.arena.data_end - DATA_FIRST_OFFSET if self.arena is not None else 0
        self.in_place: set[int] = set()  # offsets of the storages already in the arena
        self.deps: set[str] = set()
        self._seen: dict[tuple, tuple[str | None, int]] = {}
        self._pages = pagemap.PageSnapshot()  # one encode's look at which pages were written (see pagemap.py)
        self._files = (filemaps.FileMaps(self._pages) if reference_mapped and settings.current().file_references
                       else None)

    def place(self, untyped: torch.UntypedStorage) -> tuple[str | None, int]:
        """``(where, offset)``: ``where`` is ``None`` for this entry's data region, or the entry_id of the
        mapped entry whose data region holds the bytes at ``offset`` (or the file entry of the checkpoint file
        that holds them at file offset ``offset``)."""
        device, nbytes = untyped.device, untyped.nbytes()
        ident = (str(device), untyped.data_ptr(), nbytes)
        place = self._seen.get(ident) if nbytes else None
        if place is None:
            place = self._new_place(untyped, device, nbytes)
            if nbytes:
                self._seen[ident] = place
        return place

    def _new_place(self, untyped: torch.UntypedStorage, device, nbytes: int) -> tuple[str | None, int]:
        if self.arena is not None and device.type == "cpu" and nbytes:
            there = self.arena.locate(untyped.data_ptr(), nbytes)
            if there is not None:
                offset = there - DATA_FIRST_OFFSET
                self.storages.append((untyped, offset))
                self.in_place.add(offset)
                return (None, offset)
        if self.reference_mapped and device.type == "cpu":
            loc = mappings.locate(untyped.data_ptr(), nbytes, self._pages)
            if loc is not None:
                self.deps.add(loc.entry_id)
                return (loc.entry_id, loc.offset)
            found = self._files.locate(untyped.data_ptr(), nbytes) if self._files is not None else None
            if found is not None:
                self.deps.add(found.file_id)
                return (found.file_id, found.offset)
        # The copy keeps the storage's address modulo STORAGE_ALIGN (the data region is page aligned): CPU kernels
        # round differently on differently aligned data, so a copy aligned unlike the plain load's storage (a view
        # into a safetensors mapping is aligned only to its element size) would compute different last bits.
        skew = untyped.data_ptr() % STORAGE_ALIGN if device.type == "cpu" else 0
        offset = align(self.data_len, STORAGE_ALIGN) + skew
        self.data_len = offset + nbytes
        self.storages.append((untyped, offset))
        return (None, offset)
