"""deepstack.call: the pickler's helper thread, and the user's recursion limit left as it was (see overmind.deepstack)."""
from __future__ import annotations

import sys
import threading

import pytest

from overmind import deepstack


@pytest.fixture
def limit():
    before = sys.getrecursionlimit()
    yield
    sys.setrecursionlimit(before)


def test_runs_on_a_helper_thread_and_raises_its_errors_here(limit):
    seen = deepstack.call(lambda: (threading.current_thread().name, sys.getrecursionlimit()))
    assert seen == ("overmind-pickler", sys.getrecursionlimit())
    with pytest.raises(KeyError, match="boom"):
        deepstack.call(lambda: {}["boom"])


def test_a_limit_beyond_the_largest_stack_is_capped_only_while_it_runs(limit):
    huge = 10 * deepstack.stack_for(10**9)[1]
    sys.setrecursionlimit(huge)
    during = deepstack.call(sys.getrecursionlimit)
    assert during == deepstack.stack_for(huge)[1] < huge
    assert sys.getrecursionlimit() == huge


def test_overlapping_calls_from_two_threads_put_the_users_limit_back(limit):
    huge = 10 * deepstack.stack_for(10**9)[1]
    sys.setrecursionlimit(huge)
    inside, release = threading.Barrier(2), threading.Event()

    def slow():
        inside.wait(timeout=30)
        release.wait(timeout=30)

    other = threading.Thread(target=deepstack.call, args=(slow,))
    other.start()
    inside.wait(timeout=30)  # the other call holds the cap now
    assert deepstack.call(sys.getrecursionlimit) < huge
    assert sys.getrecursionlimit() < huge, "the cap was lifted while another pickling still runs"
    release.set()
    other.join(timeout=30)
    assert sys.getrecursionlimit() == huge


def test_a_limit_the_user_sets_meanwhile_is_kept(limit):
    huge = 10 * deepstack.stack_for(10**9)[1]
    sys.setrecursionlimit(huge)
    deepstack.call(sys.setrecursionlimit, 5000)
    assert sys.getrecursionlimit() == 5000
