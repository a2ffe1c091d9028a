"""Round trip through the real cache parts, in one process: pickle out of band, a sealed memfd, a
copy-on-write mapping, unpickle over it. What ``overmind.load`` does, minus the server."""
from __future__ import annotations

from typing import Any, Mapping


def roundtrip(obj: Any, table: Mapping[type, Any]) -> Any:
    """``obj`` pickled with the reducer ``table`` into a sealed memfd and rebuilt from a private
    mapping."""
    from overmind import testing

    return testing.roundtrip(obj, table)
