"""deep_recursion.call: the pickler runs where the C stack holds the recursion limit (this thread, else a helper thread),
and the user's recursion limit is left as it was (see overmind.entries.deep_recursion)."""
from __future__ import annotations

import pickle
import resource
import subprocess
import sys
import threading

import pytest

from overmind.entries import deep_recursion
from overmind.native import zerocopy


@pytest.fixture
def limit():
    before = sys.getrecursionlimit()
    yield
    sys.setrecursionlimit(before)


def _where(fn=lambda: None):
    return deep_recursion.call(lambda: (threading.current_thread().name, sys.getrecursionlimit(), fn()))


def test_runs_in_this_thread_where_its_stack_holds_the_limit(impl, limit):
    # The main thread's stack (RLIMIT_STACK, 8 MiB here) holds the default limit's levels: known with the
    # extension, which reads the thread's bounds; the Python twin knows nothing of them and uses a helper.
    room = zerocopy.stack_room()
    assert (room is not None and room > 4 << 20) == (impl == "c")
    sys.setrecursionlimit(1000)
    assert _where()[:2] == (("MainThread" if impl == "c" else "overmind-pickler"), 1000)
    with pytest.raises(KeyError, match="boom"):
        deep_recursion.call(lambda: {}["boom"])


_LOWERED_LIMIT = r"""
import resource, sys, threading
from overmind.native import zerocopy
before = zerocopy.stack_room()
resource.setrlimit(resource.RLIMIT_STACK, (2 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))
after = zerocopy.stack_room()
seen = []
threading.stack_size(1 << 20)
small = threading.Thread(target=lambda: seen.append(zerocopy.stack_room()))
small.start()
small.join()
print(before, after, seen[0])
"""


def test_the_room_follows_a_stack_limit_lowered_after_it_was_asked():
    # The extension asks glibc for a thread's bounds once (for the first thread that reads /proc/self/maps) and
    # keeps them while the soft RLIMIT_STACK they were derived from stays the same; a thread started later has
    # bounds of its own.
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if soft == resource.RLIM_INFINITY or soft < 4 << 20:
        pytest.skip(f"needs a soft stack limit of 4 MiB or more (here {soft})")
    if zerocopy.stack_room() is None:
        pytest.skip("the compiled extension does not serve this process")
    out = subprocess.run([sys.executable, "-c", _LOWERED_LIMIT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after, thread = map(int, out.stdout.split())
    assert before > 3 << 20
    assert 0 < after < 2 << 20
    assert 0 < thread < 1 << 20


def test_a_limit_beyond_this_stack_runs_on_a_helper_thread(impl, limit):
    sys.setrecursionlimit(50_000)  # 50 MiB at BYTES_PER_LEVEL: more than the main thread's stack
    assert _where()[:2] == ("overmind-pickler", 50_000)
    assert sys.getrecursionlimit() == 50_000


def test_a_thread_with_a_small_stack_uses_a_helper_thread(impl, limit):
    sys.setrecursionlimit(1000)
    seen = []
    previous = threading.stack_size(1 << 20)  # 1 MiB: less than the default limit's levels and the reserve
    try:
        small = threading.Thread(target=lambda: seen.append((zerocopy.stack_room(), _where())), name="small")
        small.start()
    finally:
        threading.stack_size(previous)
    small.join()
    (room, where), = seen
    assert room is None or room < 1 << 20
    assert where[:2] == ("overmind-pickler", 1000)


def test_a_deep_graph_pickles_in_this_thread_up_to_the_limit(impl, limit):
    sys.setrecursionlimit(1000)
    deep: list = []
    for _ in range(400):  # the C pickler counts two levels of the limit per list: near it (pytest is ~100 deep)
        deep = [deep]
    name, _, out = _where(lambda: pickle.loads(pickle.dumps(deep)))
    assert name == ("MainThread" if impl == "c" else "overmind-pickler")
    depth = 0
    while out:
        out, depth = out[0], depth + 1
    assert depth == 400


def test_a_limit_beyond_the_largest_stack_is_capped_only_while_it_runs(limit):
    huge = 10 * deep_recursion.stack_for(10**9)[1]
    sys.setrecursionlimit(huge)
    during = deep_recursion.call(sys.getrecursionlimit)
    assert during == deep_recursion.stack_for(huge)[1] < huge
    assert sys.getrecursionlimit() == huge


def test_overlapping_calls_from_two_threads_put_the_users_limit_back(limit):
    huge = 10 * deep_recursion.stack_for(10**9)[1]
    sys.setrecursionlimit(huge)
    inside, release = threading.Barrier(2), threading.Event()

    def slow():
        inside.wait(timeout=30)
        release.wait(timeout=30)

    other = threading.Thread(target=deep_recursion.call, args=(slow,))
    other.start()
    inside.wait(timeout=30)  # the other call holds the cap now
    assert deep_recursion.call(sys.getrecursionlimit) < huge
    assert sys.getrecursionlimit() < huge, "the cap was lifted while another pickling still runs"
    release.set()
    other.join(timeout=30)
    assert sys.getrecursionlimit() == huge


def test_a_limit_the_user_sets_meanwhile_is_kept(limit):
    huge = 10 * deep_recursion.stack_for(10**9)[1]
    sys.setrecursionlimit(huge)
    deep_recursion.call(sys.setrecursionlimit, 5000)
    assert sys.getrecursionlimit() == 5000
