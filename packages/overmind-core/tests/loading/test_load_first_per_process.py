"""One first load per process: threads that race the first load of a key while no server runs load it once.

The thread that starts the server holds the key's claim for the process; the process's other threads wait for
its publish and are served from it, as they are once a server runs.
"""
from __future__ import annotations

from _support import pythonpath_env
from overmind.testing import run_fresh

SCRIPT = '''
import threading
import overmind
from overmind.testing import recorded_calls, report
from _support.thread_loaders import slow_build
barrier = threading.Barrier(8)
results = [None] * 8
def worker(i):
    barrier.wait()
    results[i] = overmind.load(slow_build, 3)
threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
report({"calls": len(recorded_calls()), "values": sorted({float(r.sum()) for r in results})})
'''


def test_eight_threads_load_a_key_once_while_no_server_runs(tmp_path):
    env = {"PYTHONPATH": pythonpath_env(), "OVERMIND_RUNTIME_DIR": str(tmp_path / "rt")}
    try:
        out = run_fresh(SCRIPT, env=env)
    finally:
        from overmind.testing import stop_servers

        stop_servers(str(tmp_path / "rt"))
    assert out == {"calls": 1, "values": [6.0]}
