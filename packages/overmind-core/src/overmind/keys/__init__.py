"""Cache keys: the canonical form of a value, the identity of code, file fingerprints, torch's process-wide state,
classes not importable by name, and the provenance of loaded objects.
"""
