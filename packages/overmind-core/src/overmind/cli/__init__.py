"""The ``overmind`` command: serve, status, ls, evict, stop, run, doctor.
"""
