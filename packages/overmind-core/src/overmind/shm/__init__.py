"""Shared memory for entries: one sealed memfd per entry (layout), written once (writer), mapped copy-on-write by
every reader (reader), with a registry of the live mappings of this process (mappings), checkpoint files referenced
in place, and the GPU twins."""
