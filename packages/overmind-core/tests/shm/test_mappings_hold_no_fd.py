"""A loaded object's mapping holds no fd. A process holding 2,000 loaded objects
under ``ulimit -n 256`` still opens files, and its fd count stays small (on both zero-copy implementations).
"""
from __future__ import annotations

from _support import fault_procs
from overmind.client.launcher import ensure_server

HOLDER = """
import os, resource, warnings, torch, overmind
from _support import fault_loaders as L
from overmind.fallback import OvermindWarning
from overmind.shm import mappings
from overmind.testing import report, overmind_mapped
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
before = len(os.listdir("/proc/self/fd"))
held, wrong = [], 0
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(2000):
        obj = overmind.load(L.build, i % 10)  # every load maps its entry afresh (copy-on-write)
        wrong += not torch.equal(obj, L.expected(i % 10))
        held.append(obj)
after = len(os.listdir("/proc/self/fd"))
opened = []
try:
    for _ in range(100):
        opened.append(open("/dev/null"))
    opens = "ok"
except OSError as e:
    opens = str(e)
for f in opened:
    f.close()
report({"before": before, "after": after, "opens": opens, "wrong": wrong,
        "mapped": sum(overmind_mapped(o.data_ptr()) for o in held[::100]), "live": mappings.live_count(),
        "warned": sorted({str(w.message)[:160] for w in caught if issubclass(w.category, OvermindWarning)})})
"""


def test_2000_loaded_objects_under_ulimit_256(overmind_runtime, impl):
    ensure_server()  # the server starts here, outside the child's fd limit
    seen = fault_procs.run(HOLDER, {"OVERMIND_ZEROCOPY": impl}, timeout=120)
    assert seen.get("opens") == "ok", seen
    assert seen["wrong"] == 0 and seen["warned"] == [], seen
    assert seen["mapped"] == 20 and seen["live"] >= 2000, seen
    assert seen["after"] <= seen["before"] + 8, seen
