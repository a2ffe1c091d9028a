"""Lines that scripts for fresh processes share, pasted into their text (the process imports nothing of the tests).

``SAID``: the ``overmind`` logger's INFO records of the process, collected as messages in the list ``said``, so a
script can report which calls hit, missed or were taken ready-made (``hit ...``, ``published ...``).
"""
from __future__ import annotations

SAID = """
import logging
said = []
class _Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("overmind").addHandler(_Said())
logging.getLogger("overmind").setLevel(logging.INFO)
"""
