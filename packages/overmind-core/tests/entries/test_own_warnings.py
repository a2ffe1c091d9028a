"""Pickling an entry and rebuilding it warn nothing of their own (``entries/own_warnings.py``): the miss shows the
loader's warnings and no more, a hit shows those it recorded and no more, torch's ``TypedStorage`` warn-once flag
is left as plain leaves it, and a user's "error" filter raises the loader's warning as plain raises it.

Fresh processes, plain then cached (``_support/plain_sequences.py``), loading a sparse CSR tensor and a qint8 one
(``warning_loaders.exotic_tensors``): torch warns as the loader makes them, and again where its reduce and rebuild
functions meet them.
"""
from __future__ import annotations

import pytest

from _support.adapter_testlib import PRELUDE, fresh_runner
from _support.plain_sequences import compare_with_plain

LOAD = '''
from _support import warning_loaders as wl
obj, said, through = load(lambda: overmind.load(wl.exotic_tensors) if ON else wl.exotic_tensors())
with warnings.catch_warnings(record=True) as after:
    warnings.simplefilter("always")
    torch.zeros(2).storage()  # warns once a process, unless the flag says it already did
csr, q = obj["csr"], obj["q"]
done({"said": said, "storage_after": [str(w.message)[:40] for w in after],
      "csr": [str(csr.layout), csr.to_dense().tolist()],
      "q": [str(q.dtype), q.q_scale(), q.q_zero_point(), q.int_repr().tolist()]}, through)
'''

UNDER_ERROR = '''
from _support import warning_loaders as wl
warnings.simplefilter("error")  # the user's
before = server_state() if ON else None
try:
    overmind.load(wl.exotic_tensors) if ON else wl.exotic_tensors()
    raised = None
except Warning as e:
    raised = [type(e).__name__, str(e)]
warnings.resetwarnings()
after = server_state() if ON else None
done({"raised": raised}, after and {k: after[k] - before[k] for k in after})
'''


@pytest.fixture
def fresh(overmind_runtime, tmp_path):
    return fresh_runner(PRELUDE, {}, tmp_path)


def test_miss_and_hits_warn_what_plain_warns(fresh):
    plain, cached = compare_with_plain(fresh, [LOAD, LOAD, LOAD])
    assert plain[0]["seen"]["said"], "torch warns as it makes these tensors: the comparison would be empty"
    assert [r["through"] for r in cached] == [{"new_entries": 1, "hits": 0},
                                              {"new_entries": 0, "hits": 1}, {"new_entries": 0, "hits": 1}]


def test_an_error_filter_raises_the_loaders_warning_as_plain(fresh):
    plain, cached = compare_with_plain(fresh, [UNDER_ERROR, LOAD, UNDER_ERROR])
    assert plain[0]["seen"]["raised"], plain  # the loader's own warning, raised inside it
    assert cached[2]["through"] == {"entries": 0, "hits": 1}, cached[2]  # raised by the hit's replay
