"""The logger activation holds: a DEBUG or INFO record in a process that has not imported ``logging`` is dropped
without importing it (no handler or level can exist yet: logging would drop it too); once the program has set up
logging, every record reaches its handlers as a plain logger's would."""
from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from overmind._util.lazy_logger import logger
log = logger("overmind")
log.info("before %s", "logging")
log.debug("before")
print("imported after info and debug:", "logging" in sys.modules)
log.warning("a warning reaches logging's last resort")
print("imported after a warning:", "logging" in sys.modules)
import logging
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s", stream=sys.stdout)
log.info("after %s", "basicConfig")
log.debug("debug after")
"""


def test_records_below_warning_import_nothing_before_logging_is_set_up_and_reach_handlers_after():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["imported after info and debug: False", "imported after a warning: True",
                                       "INFO overmind after basicConfig", "DEBUG overmind debug after"]
    assert out.stderr == "a warning reaches logging's last resort\n"
