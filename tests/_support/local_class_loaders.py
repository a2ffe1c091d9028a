"""Loaders and a class factory for the local-class tests, in a module pytest does not rewrite: a test module's
code is rewritten for its asserts, so a fresh process importing it would see other code (another key)."""
from __future__ import annotations


def define(tag, size):
    """A class defined in a function body: not importable by name."""
    class Local:
        TAG = tag

        def __init__(self):
            self.values = list(range(size))

        def double(self):
            return [2 * v for v in self.values]

    return Local


def build(cls):
    return cls()
