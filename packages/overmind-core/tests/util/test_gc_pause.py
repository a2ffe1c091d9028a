"""No automatic garbage collection inside a load, and the user's collector as it was.

The scripts run in fresh processes, each with its own collector state. ``gc.freeze(); gc.collect()`` at their
start makes the imported libraries' heap invisible to the collector, so that a full collection comes due as
soon as a few thousand new objects survive (as it does in a blog process after its imports), and thresholds
as small as (50, 2, 2) make the collector fire often.
"""
from __future__ import annotations

import gc
import threading

import pytest

from overmind._util import gc_pause
from overmind.testing import run_fresh

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

PRELUDE = '''
import gc, threading, warnings, weakref, torch, overmind
from overmind._util import gc_pause
from overmind.testing import report

def build(n):
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(n)])

def explode(n):
    raise ValueError("loader failed")

def with_lock(n):
    return {"lock": threading.Lock(), "n": n}

class Node:
    pass

def garbage_cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

events = []  # (where, generation, pauses in progress) of every collection that starts
where = ["outside"]
gc.callbacks.append(lambda phase, info: phase == "start" and events.append(
    (where[0], info["generation"], gc_pause.depth())))

def loading(fn, *args):
    where[0] = "load"
    try:
        return overmind.load(fn, *args)
    finally:
        where[0] = "outside"

def in_load():
    return [e for e in events if e[0] == "load"]

gc.freeze()
gc.collect()
'''


def test_a_load_runs_no_full_collection_and_leaves_the_collector_as_it_was(overmind_runtime):
    out = run_fresh(PRELUDE + '''
gc.set_threshold(50, 2, 2)
miss = loading(build, 2000)
miss_events = in_load()
del events[:]
hit = loading(build, 2000)
report({"miss_in_load": miss_events, "hit_in_load": in_load(), "enabled": gc.isenabled(),
        "thresholds": gc.get_threshold(), "same": all(torch.equal(a.weight, b.weight) for a, b in zip(miss, hit)),
        "depth": gc_pause.depth()})
''')
    # The collections inside the load are the ones its own pause-end runs (young only, none of them full) and
    # the user's loader's own on the miss (it runs with the collector on, as without Overmind).
    assert not [e for e in out["hit_in_load"] if e[2] > 0], out["hit_in_load"]
    assert not [e for e in out["hit_in_load"] if e[1] == 2], out["hit_in_load"]
    assert not [e for e in out["miss_in_load"] if e[1] == 2 and e[2] > 0], out["miss_in_load"]
    assert out["enabled"] and out["thresholds"] == [50, 2, 2] and out["same"] and out["depth"] == 0, out


def test_the_users_cycles_are_still_collected_after_loads(overmind_runtime):
    out = run_fresh(PRELUDE + '''
gc.set_threshold(50, 2, 2)
young = garbage_cycle()        # garbage before the load, never seen by a collection
holder = [garbage_cycle()]
old_ref = holder[0]
gc.collect()                   # an old one: its cycle survives into the oldest generation while held...
keep = old_ref()               # (held by a strong reference made before the collection)
del holder
loading(build, 2000)
loading(build, 2000)
young_freed_after_loads = young() is None
del keep                       # ...and becomes garbage now, in the oldest generation
junk = []
for i in range(200000):        # ordinary allocations outside any load drive the automatic collections
    junk.append([i])
    if old_ref() is None:
        break
report({"young": young_freed_after_loads, "old": old_ref() is None, "allocations": i,
        "full_outside": any(e[1] == 2 and e[0] == "outside" for e in events),
        "full_in_load": [e for e in in_load() if e[1] == 2 and e[2] > 0]})
''')
    assert out["young"] and out["old"] and out["full_outside"], out
    assert out["full_in_load"] == [], out


@pytest.mark.parametrize("case", ["loader raises", "result refused", "disabled by the user"])
def test_the_collector_setting_survives_a_failing_load(overmind_runtime, case):
    out = run_fresh(PRELUDE + '''
import sys
case = CASE
gc.set_threshold(123, 7, 9)
if case == "disabled by the user":
    gc.disable()
    loading(build, 300)
    loading(build, 300)
elif case == "loader raises":
    try:
        loading(explode, 1)
    except ValueError:
        pass
else:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loading(with_lock, 1)
    assert len(caught) == 1, [str(w.message) for w in caught]
report({"enabled": gc.isenabled(), "thresholds": gc.get_threshold(), "depth": gc_pause.depth(),
        "collections_in_load": in_load() if case == "disabled by the user" else []})
'''.replace("CASE", repr(case)))
    assert out["enabled"] == (case != "disabled by the user"), out
    assert out["thresholds"] == [123, 7, 9] and out["depth"] == 0, out
    assert out["collections_in_load"] == [], out  # a collector the user turned off stays off: no pause-end pass


def test_paused_restores_on_exception_nests_and_leaves_a_disabled_collector_off():
    was = gc.isenabled()
    try:
        gc.enable()
        with pytest.raises(KeyError):
            with gc_pause.paused():
                with gc_pause.paused():
                    assert not gc.isenabled() and gc_pause.depth() == 2
                assert not gc.isenabled() and gc_pause.depth() == 1
                raise KeyError("x")
        assert gc.isenabled() and gc_pause.depth() == 0
        gc.disable()
        with gc_pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_concurrent_pauses_end_with_the_last_one():
    was = gc.isenabled()
    gc.enable()
    first_in, second_in, release_first = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with gc_pause.paused():
            first_in.set()
            release_first.wait(10)
        seen["after_first"] = gc.isenabled()  # the second pause is still on

    try:
        t = threading.Thread(target=first)
        t.start()
        assert first_in.wait(10)
        with gc_pause.paused():
            second_in.set()
            release_first.set()
            t.join(10)
            assert not gc.isenabled()
        assert gc.isenabled() and seen == {"after_first": False}
    finally:
        release_first.set()
        (gc.enable if was else gc.disable)()


def test_a_child_forked_while_another_thread_pauses_gets_its_collector_back():
    out = run_fresh('''
import gc, os, threading, json
from overmind._util import gc_pause
from overmind.testing import report

inside, leave = threading.Event(), threading.Event()

def pauser():
    with gc_pause.paused():
        inside.set()
        leave.wait(30)

gc.enable()
t = threading.Thread(target=pauser)
t.start()
inside.wait(30)
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # only this thread lives on here: the other thread's pause is gone
    state = {"enabled": gc.isenabled(), "depth": gc_pause.depth()}
    with gc_pause.paused():
        state["paused_again"] = not gc.isenabled()
    with gc_pause.paused():
        inner = os.fork()
        if inner == 0:  # forked from inside this thread's own pause: it ends here as usual
            still = not gc.isenabled()
            os._exit(0 if still else 3)
        _, code = os.waitpid(inner, 0)
    state["inner_child_ok"] = os.waitstatus_to_exitcode(code) == 0
    state["enabled_after"] = gc.isenabled()
    os.write(w, json.dumps(state).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 4096))
parent_during = gc.isenabled()
leave.set()
t.join(30)
report({"child": child, "parent_during": parent_during, "parent_after": gc.isenabled()})
''')
    assert out["child"] == {"enabled": True, "depth": 0, "paused_again": True, "inner_child_ok": True,
                            "enabled_after": True}, out
    assert out["parent_during"] is False and out["parent_after"] is True, out
