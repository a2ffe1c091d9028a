"""The heap that exists when a load begins is out of the collector's walks while the load runs, and back after.

Fresh processes, each with its own collector (``_util/heap_aside.py``): inside a load, the loader's own
collections walk only what the load made, so its garbage goes as the plain call's does; after it, nothing of
the process stays frozen; a program that froze its heap itself keeps it frozen; a forked child gets its heap
back.
"""
from __future__ import annotations

from overmind.testing import run_fresh

PRELUDE = '''
import gc, os, threading, weakref, torch, overmind
from overmind.testing import report

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

seen = {}

def build(n):
    mine = cycle()  # the loader's own garbage: a full collection inside the load frees it
    gc.collect()
    seen["own_freed"] = mine() is None
    seen["frozen_inside"] = gc.get_freeze_count()
    return torch.nn.Linear(n, n)
'''


def test_a_load_sets_the_older_heap_aside_and_gives_it_back(overmind_runtime):
    out = run_fresh(PRELUDE + '''
older = cycle()  # garbage from before the load: freed by a collection before the load or the first after it
overmind.load(build, 3)
frozen_after = gc.get_freeze_count()
gc.collect()
report({**seen, "older_after_collect": older() is None,
        "frozen_after": frozen_after, "enabled": gc.isenabled()})
''')
    assert out["own_freed"] and out["frozen_inside"] > 0, out
    assert out["frozen_after"] == 0 and out["older_after_collect"] and out["enabled"], out


def test_a_program_that_froze_its_heap_keeps_it_frozen(overmind_runtime):
    out = run_fresh(PRELUDE + '''
gc.collect()
gc.freeze()
before = gc.get_freeze_count()
overmind.load(build, 3)
overmind.load(build, 3)
report({**seen, "before": before, "after": gc.get_freeze_count()})
''')
    # frozen objects that die leave the count; an unfrozen heap would read 0
    assert out["own_freed"] and out["after"] > out["before"] // 2 > 0, out


def test_concurrent_loads_give_the_heap_back_once_all_end(overmind_runtime):
    out = run_fresh(PRELUDE + '''
inside = threading.Barrier(2)

def slow(n):
    inside.wait(timeout=60)  # both loads are in progress here
    return torch.nn.Linear(n, n)

threads = [threading.Thread(target=overmind.load, args=(slow, n)) for n in (4, 5)]
for t in threads:
    t.start()
for t in threads:
    t.join()
report({"frozen_after": gc.get_freeze_count()})
''')
    assert out["frozen_after"] == 0, out


def test_a_child_forked_inside_a_load_has_its_heap_back(overmind_runtime):
    out = run_fresh(PRELUDE + '''
def forks(n):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, str(gc.get_freeze_count()).encode())
        os._exit(0)
    os.close(w)
    seen["child_frozen"] = int(os.read(r, 64).decode())
    os.waitpid(pid, 0)
    seen["parent_frozen"] = gc.get_freeze_count()
    return torch.nn.Linear(n, n)

overmind.load(forks, 3)
report({**seen, "after": gc.get_freeze_count()})
''')
    assert out["child_frozen"] == 0 and out["parent_frozen"] > 0 and out["after"] == 0, out

