"""Round trip through the real cache parts, in one process: pickle out of band, a sealed memfd, a
copy-on-write mapping, unpickle over it. What ``overmind.load`` does, minus the server."""
from __future__ import annotations

import os
from typing import Any, Mapping


def roundtrip(obj: Any, table: Mapping[type, Any]) -> Any:
    """``obj`` pickled with the reducer ``table`` into a sealed memfd and rebuilt from a private mapping."""
    from overmind.entries import pickling
    from overmind.shm.reader import EntryMapping
    from overmind.shm.writer import write_entry

    pickled = pickling.dumps(obj, table, reference_mapped=False)
    fd = write_entry(pickled.skeleton, pickled.storages, pickled.data_len, name="overmind:sfast-test")
    try:
        entry = EntryMapping("sfast-test", fd)
    finally:
        os.close(fd)
    return pickling.loads(entry.skeleton(), lambda where, offset, nbytes: entry.storage(offset, nbytes),
                          pickled.pickler)
