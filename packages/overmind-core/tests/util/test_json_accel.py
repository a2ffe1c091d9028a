"""overmind._util.json_accel writes and reads exactly what json does (it is json's own C accelerator, set up as
json.dumps and json.loads set it up, for the launcher of ``overmind run``, which must not import json)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overmind._util import json_accel

_scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text())
_keys = st.text() | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False)
values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=6) | st.tuples(children, children)
    | st.dictionaries(_keys, children, max_size=6),
    max_leaves=40,
)
_OPTIONS = [{}, {"sort_keys": True}, {"separators": (",", ":")}, {"separators": (",", ":"), "sort_keys": True}]


def _same(a, b) -> bool:
    """Equal, with NaN equal to NaN and each value of the same type as the other."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from(_OPTIONS))
def test_dumps_writes_the_text_json_writes(value, options):
    try:
        expected = json.dumps(value, **options)
    except TypeError as exc:  # sort_keys over keys of mixed types
        with pytest.raises(TypeError) as got:
            json_accel.dumps(value, **options)
        assert str(got.value) == str(exc)
        return
    assert json_accel.dumps(value, **options) == expected


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from([" ", "\n", "\t \r\n", ""]), st.sampled_from(_OPTIONS))
def test_loads_reads_what_json_reads(value, space, options):
    try:
        text = space + json.dumps(value, **options) + space
    except TypeError:
        return
    assert _same(json_accel.loads(text), json.loads(text))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='{}[]",:0123456789.eE+-tfnrualsINaiy \\\n\ufeff', max_size=30))
def test_a_text_that_is_not_json_fails_as_json_fails(text):
    try:
        expected = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(json.JSONDecodeError) as got:
            json_accel.loads(text)
        assert (got.value.msg, got.value.pos) == (exc.msg, exc.pos)
        return
    assert _same(json_accel.loads(text), expected)


def test_what_json_cannot_write_is_refused_as_json_refuses_it():
    for bad in ({"a": object()}, [b"bytes"], {(1, 2): 3}):
        with pytest.raises(TypeError) as expected:
            json.dumps(bad)
        with pytest.raises(TypeError) as got:
            json_accel.dumps(bad)
        assert str(got.value) == str(expected.value)
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        json_accel.dumps(loop)
    assert json_accel.dumps([1, 2]) == "[1, 2]", "a failed call leaves nothing behind for the next"
    with pytest.raises(TypeError):
        json_accel.loads(b"{}")  # the launcher decodes first; bytes are a caller's mistake


def test_importing_it_imports_neither_json_nor_re():
    code = ("import sys; from overmind._util import json_accel; json_accel.loads(json_accel.dumps({'a': [1.5]}));"
            "print(sorted({'json', 're', 'enum', 'typing'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
