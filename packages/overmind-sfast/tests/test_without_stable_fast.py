"""Without stable-fast installed, activate() skips overmind-sfast with one line saying why.

Runs whether or not stable-fast is installed here: a fresh process sees this environment's packages
through a folder of links that leaves stable-fast out (its package and its dist-info), as on a machine
where it was never installed.
"""
from __future__ import annotations

import os
import sysconfig

from overmind.testing import run_fresh

SCRIPT = """
import logging, os, site, sys
real = os.path.realpath({site_dir!r})
sys.path[:] = [p for p in sys.path if os.path.realpath(p) != real]
site.addsitedir({view!r})  # the same packages, editable installs included, minus stable-fast

lines = []
class Collect(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("overmind").addHandler(Collect())
logging.getLogger("overmind").setLevel(logging.INFO)

import overmind
from overmind.testing import adapter_state, report
try:
    import sfast
    has_sfast = True
except ImportError:
    has_sfast = False
active = overmind.activate()
state = adapter_state("sfast")
report({{"has_sfast": has_sfast, "active": active, "status": state.status,
         "lines": [l for l in lines if "sfast" in l],
         "imported": "overmind_sfast.plugin" in sys.modules}})
"""


def test_activate_skips_the_adapter_when_stable_fast_is_missing(tmp_path):
    site_dir = sysconfig.get_paths()["purelib"]
    view = tmp_path / "site-packages"
    view.mkdir()
    for name in os.listdir(site_dir):
        if name == "sfast" or name.lower().startswith(("stable_fast", "stable-fast")):
            continue
        (view / name).symlink_to(os.path.join(site_dir, name))

    got = run_fresh(SCRIPT.format(site_dir=site_dir, view=str(view)), timeout=300)
    assert got["has_sfast"] is False
    assert "sfast" not in got["active"]
    assert got["status"] == "skipped"
    assert got["imported"] is False  # the plugin module is not even imported
    (line,) = got["lines"]
    assert line.startswith("adapter sfast skipped") and "stable-fast" in line and ">=1.0.5" in line
    assert "\n" not in line
