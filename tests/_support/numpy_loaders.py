"""A loader that is the first to import NumPy (this module imports nothing else), for fresh-process tests."""
from __future__ import annotations


def first_numpy_draw():
    """Imports NumPy itself (seeded from the OS) and draws: no other process starts from that state."""
    import numpy

    return float(numpy.random.rand())
