"""Helpers of the overmind-sfast tests, importable by this name (the package's ``tests/`` folder is
on pytest's ``pythonpath``, see the root ``pyproject.toml``): :mod:`.pipelines` (the compiled
pipeline builder, imported by name in the processes a test starts), :mod:`.modules` (traced modules
with dataclass outputs) and :mod:`.roundtrip` (the cache's parts in one process)."""
