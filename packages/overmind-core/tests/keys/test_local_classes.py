"""A class that is not importable by name comes back as the live class of that identity (``keys/local_classes.py``).

Generated: pairs of classes defined in a function body with drawn class attributes (equal or not, so one code
identity or two), each passed to a cached loader in a drawn order; every result is an instance of the very class
its call was given, as the plain call's is; a fresh process that defines the same class gets its own class object
from the entry the first process published.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overmind
from _support import TESTS_DIR
from _support.local_class_loaders import build, define
from overmind.client.connection import get_client
from overmind.errors import OvermindError
from overmind.keys import local_classes
from overmind.testing import run_fresh


def test_a_local_class_is_neither_importable_nor_left_to_the_pickler_and_a_module_class_is():
    assert not local_classes.importable(define("a", 1))
    assert local_classes.reduce_class(define("a", 1)) is not NotImplemented
    assert local_classes.reduce_class(OvermindError) is NotImplemented
    assert local_classes.reduce_class(int) is NotImplemented


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(tags=st.tuples(st.sampled_from(["x", "y"]), st.sampled_from(["x", "y"])),
       sizes=st.tuples(st.integers(0, 3), st.integers(0, 3)),
       order=st.lists(st.integers(0, 1), min_size=2, max_size=6))
def test_every_result_is_an_instance_of_the_class_its_call_was_given(overmind_runtime, tags, sizes, order):
    classes = [define(tags[0], sizes[0]), define(tags[1], sizes[1])]
    for i in order:
        got = overmind.load(build, classes[i])
        assert type(got) is classes[i]
        assert got.values == list(range(sizes[i])) and got.TAG == tags[i]


def test_the_first_call_is_published_and_the_second_served_as_the_same_class(overmind_runtime):
    cls = define("z", 2)
    first, second = overmind.load(build, cls), overmind.load(build, cls)
    assert type(first) is cls and type(second) is cls
    assert [e["hits"] for e in get_client().ls() if e["meta"]["loader"].endswith("build")] == [1]


ANOTHER_PROCESS = '''
import overmind
from _support.local_class_loaders import build, define
from overmind.client.connection import get_client
from overmind.testing import report

cls = define("z", 2)
got = overmind.load(build, cls)
report({"is": type(got) is cls, "name": type(got).__qualname__, "double": got.double(), "TAG": got.TAG,
        "hits": sum(e["hits"] for e in get_client().ls())})
'''


def test_another_process_with_the_same_class_gets_its_own_class(overmind_runtime):
    cls = define("z", 2)
    overmind.load(build, cls)
    got = run_fresh(ANOTHER_PROCESS, env={"PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert got == {"is": True, "name": "define.<locals>.Local", "double": [0, 2], "TAG": "z", "hits": 1}
