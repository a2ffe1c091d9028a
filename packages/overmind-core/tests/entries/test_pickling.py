"""Which pickler pickling.dumps uses: without persistent_id (no Python call per string or int); a plain container
the call was given is put in its memo first, so the result holding it refers to it by memo index."""
from __future__ import annotations

import pickletools

import pytest
import torch

from overmind.entries import pickling


def _source(where, offset, nbytes):
    return torch.UntypedStorage(nbytes)


def _opcodes(skeleton: bytes) -> set[str]:
    return {op.name for op, _, _ in pickletools.genops(skeleton)}


class Holder:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_storages_and_object_arguments_go_through_reducer_override():
    module = torch.nn.Linear(3, 2)
    t = torch.arange(6.0)
    result = Holder(module=module, views=[t[:2], t[2:]], typed=t.untyped_storage(), names={"a": 1}, again=module)
    p = pickling.dumps(result, arguments={"module": module})
    assert "BINPERSID" not in _opcodes(p.skeleton)
    back = pickling.loads(p.skeleton, _source, p.pickler, arguments={"module": module})
    assert back.module is module and back.again is module
    assert back.views[0].untyped_storage().data_ptr() == back.views[1].untyped_storage().data_ptr()
    assert isinstance(back.typed, torch.storage.TypedStorage) and back.typed.dtype == torch.uint8
    assert back.names == {"a": 1}


def test_a_container_argument_held_by_the_result_is_the_callers_again():
    options = {"scale": 2}
    result = Holder(options=options, weight=torch.ones(2))
    p = pickling.dumps(result, arguments={"options": options})
    # the fast pickler, the dict put in its memo first: the skeleton opens by filling memo index 0 (one persistent
    # id) and refers to it there
    ops = [op.name for op, _, _ in pickletools.genops(p.skeleton)]
    assert ops[:5] == ["BININT", "TUPLE1", "BINPERSID", "MEMOIZE", "POP"] and ops.count("BINPERSID") == 1
    assert "BINGET" in ops
    assert p.argument_memo == [[["options"], "builtins.dict", True]]
    mine = {"scale": 2}
    back = pickling.loads(p.skeleton, _source, p.pickler, arguments={"options": mine}, argument_memo=p.argument_memo)
    assert back.options is mine
    assert back.weight.shape == (2,)
    # this call's object at that path must fit
    with pytest.raises(pickling.arguments_ref.ArgumentMismatch):
        pickling.loads(p.skeleton, _source, p.pickler, arguments={"options": [2]}, argument_memo=p.argument_memo)


def test_a_container_argument_the_result_does_not_hold_is_not_looked_up():
    options = {"scale": 2}
    result = Holder(options=dict(options), weight=torch.ones(2))  # an equal dict, not the one passed
    p = pickling.dumps(result, arguments={"options": options})
    assert p.argument_memo == [[["options"], "builtins.dict", False]] and p.argument_aliases == []
    back = pickling.loads(p.skeleton, _source, p.pickler, arguments={}, argument_memo=p.argument_memo)
    assert back.options == options and back.options is not options


def test_resources_are_refused_without_persistent_id():
    import threading

    import pytest

    with pytest.raises(pickling.ResourceRefused):
        pickling.dumps(Holder(lock=threading.Lock(), n=[1, 2]))
