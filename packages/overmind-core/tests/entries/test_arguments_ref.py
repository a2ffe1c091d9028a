"""Argument substitution without a server: which objects of a call's arguments the pickler writes as references
(the objects themselves, never atoms or copies), and what a rebuild refuses (see overmind.entries.arguments_ref)."""
from __future__ import annotations

import pytest
import torch

from overmind.entries import arguments_ref, pickling


def _round_trip(obj, arguments, rebuild_arguments=None):
    pickled = pickling.dumps(obj, reference_mapped=False, arguments=arguments)
    storages = {offset: storage for storage, offset in pickled.storages}
    return pickling.loads(pickled.skeleton, lambda where, offset, nbytes: storages[offset], pickled.pickler,
                          arguments if rebuild_arguments is None else rebuild_arguments, pickled.argument_aliases,
                          pickled.argument_memo)


def test_atoms_are_never_substituted_and_copies_are_not_the_argument():
    shared = "float16"
    dtype = torch.float16
    kept = torch.nn.Linear(2, 2)
    copied = torch.nn.Linear(2, 2)
    result = {"s": shared, "d": dtype, "n": 7, "t": (1, 2), "kept": kept, "copy": torch.nn.Linear(2, 2)}
    result["copy"].load_state_dict(copied.state_dict())
    args = {"variant": shared, "dtype": dtype, "n": 7, "t": (1, 2), "m": kept, "c": copied}
    index = arguments_ref.ArgumentIndex(args)
    assert [index.path_of(v) for v in (shared, dtype, 7, args["t"])] == [None] * 4
    other = {"variant": "fp16", "dtype": torch.float32, "n": 8, "t": (3,), "m": kept, "c": copied}
    out = _round_trip(result, args, other)
    # Atoms come back as pickled, never as this call's values; only the object passed itself is substituted.
    assert (out["s"], out["d"], out["n"], out["t"]) == ("float16", torch.float16, 7, (1, 2))
    assert out["kept"] is kept and out["copy"] is not copied and out["copy"] is not result["copy"]


def test_a_rebuild_refuses_arguments_of_another_shape():
    m = torch.nn.Linear(2, 2)
    with pytest.raises(arguments_ref.ArgumentMismatch, match="torch.nn.modules.linear.Linear"):
        _round_trip({"m": m}, {"m": m}, {"m": torch.nn.ReLU()})
    with pytest.raises(arguments_ref.ArgumentMismatch, match="does not pass"):
        _round_trip({"m": m}, {"ms": [m]}, {"ms": []})
