"""After a publish, a miss returns the loader's own result where a rebuild from the entry would gain nothing.

A rebuild shares the result's weights with other processes and lets provenance key a module or tensor by its
entry later (``vae=vae``). A result with neither to gain comes back as the loader made it: the very object, which
is the plain call's. That is a result that is not a module or tensor and whose storages, if any, all lie where
this process already shares them (an entry it maps: a nested load's result; a checkpoint file's pages). Any
storage with its bytes in the entry itself, however small, and the result is rebuilt. Each case runs against a
real server; the warm load in a fresh process equals the cold.
"""
from __future__ import annotations

import sys

import torch

import overmind
from overmind.testing import overmind_mapped, run_fresh


def _kept() -> list:
    """What each loader made, kept where the miss's writes recorder does not look (a list in a module of the standard
    library's: a write to a module of the program's is one a hit makes again, with the rebuilt object), and reached
    through this function, so that no loader's key describes the list."""
    return sys.modules["sysconfig"].__dict__.setdefault("_overmind_test_kept", [])


def settings_like(seed: int) -> dict:
    """A tokenizer- or scheduler-like result: no storages at all."""
    out = {"seed": seed, "names": [f"tok{i}" for i in range(50)], "table": {i: str(i) for i in range(20)}}
    _kept().append(out)
    return out


def with_small_tensor(seed: int) -> dict:
    out = {"bias": torch.arange(16, dtype=torch.float32) + seed, "name": "small"}
    _kept().append(out)
    return out


def with_large_tensor(seed: int) -> dict:
    out = {"weight": torch.full((512, 1024), float(seed)), "name": "large"}  # 2 MiB of the process's heap
    _kept().append(out)
    return out


def holding(seed: int) -> dict:
    out = {"inner": overmind.load(with_small_tensor, seed), "note": "a pipeline-like result"}
    _kept().append(out)
    return out


def passing_through(inner: dict) -> dict:
    out = {"inner": inner}
    _kept().append(out)
    return out


def a_module(seed: int) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was: cacheable
        torch.manual_seed(seed)
        out = torch.nn.Linear(4, 3)
        _kept().append(out)
        return out


def _cold(fn, seed):
    got = overmind.load(fn, seed)
    made = _kept()[-1]  # the outermost loader's, which returned last
    _kept().clear()
    return got, made


def test_a_result_without_storages_is_the_loaders_own_object(overmind_runtime):
    got, made = _cold(settings_like, 1)
    assert got is made
    again = overmind.load(settings_like, 1)  # a hit: rebuilt from the entry, equal
    assert again is not made and again == made
    assert not _kept()  # the loader did not run


def test_a_result_holding_any_storage_is_rebuilt(overmind_runtime):
    got, made = _cold(with_small_tensor, 2)
    assert got is not made
    assert torch.equal(got["bias"], made["bias"]) and got["bias"].data_ptr() != made["bias"].data_ptr()
    assert overmind_mapped(got["bias"].data_ptr())  # the entry's pages, shared


def test_a_result_written_once_is_rebuilt_too(overmind_runtime):
    got, made = _cold(with_large_tensor, 3)
    assert got is not made and torch.equal(got["weight"], made["weight"])
    assert overmind_mapped(got["weight"].data_ptr())


def holding_and_owning(seed: int) -> dict:
    out = {"inner": overmind.load(with_small_tensor, seed), "own": torch.full((4,), float(seed))}
    _kept().append(out)
    return out


def holding_a_file_mapping(path: str) -> dict:
    from safetensors.torch import load_file

    out = {"weights": load_file(path), "note": "a pipeline-like result of a lazy checkpoint load"}
    _kept().append(out)
    return out


def test_a_result_whose_storages_all_lie_in_a_nested_entry_is_the_loaders_own_object(overmind_runtime):
    # a pipeline of components loaded by nested loads: their storages are already the nested entries' pages
    got, made = _cold(holding, 7)
    assert got is made
    assert overmind_mapped(got["inner"]["bias"].data_ptr())  # the nested load's rebuild, shared
    again = overmind.load(holding, 7)  # a hit: rebuilt from the entries, equal
    assert again is not made and torch.equal(again["inner"]["bias"], made["inner"]["bias"])
    assert overmind_mapped(again["inner"]["bias"].data_ptr()) and not _kept()


def test_one_storage_of_its_own_and_the_result_is_rebuilt(overmind_runtime):
    got, made = _cold(holding_and_owning, 8)
    assert got is not made
    assert torch.equal(got["own"], made["own"]) and overmind_mapped(got["own"].data_ptr())
    assert torch.equal(got["inner"]["bias"], made["inner"]["bias"])


def test_a_result_whose_storages_are_checkpoint_pages_is_the_loaders_own_object(overmind_runtime, tmp_path):
    from safetensors.torch import save_file

    from overmind.testing import mapped_path

    path = str(tmp_path / "model.safetensors")
    save_file({"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(2048)}, path)
    got, made = _cold(holding_a_file_mapping, path)
    assert got is made  # its tensors are the checkpoint's pages already, referenced by the entry
    assert all(mapped_path(t.untyped_storage().data_ptr()) == path for t in got["weights"].values())
    again = overmind.load(holding_a_file_mapping, path)
    assert again is not made and all(torch.equal(again["weights"][k], made["weights"][k]) for k in made["weights"])


def test_an_argument_is_no_storage_of_the_result(overmind_runtime):
    inner = {"bias": torch.ones(3)}
    got, made = _cold(passing_through, inner)  # recorded as a reference to the caller's argument
    assert got is made and got["inner"] is inner


def test_a_module_is_rebuilt_for_provenance(overmind_runtime):
    from overmind.keys import provenance

    got, made = _cold(a_module, 4)
    assert got is not made
    assert provenance.origin_of(got) is not None  # keyed by its entry when passed to a later load
    assert torch.equal(got.weight, made.weight)


FRESH = """
import sys, torch, overmind
from overmind.client.connection import get_client
from overmind.testing import report

def _kept():
    return sys.modules["sysconfig"].__dict__.setdefault("_overmind_test_kept", [])


def settings_like(seed):
    out = {"seed": seed, "names": [f"tok{i}" for i in range(50)], "table": {i: str(i) for i in range(20)}}
    _kept().append(out)
    return out


got = overmind.load(settings_like, 5)
made = _kept().pop() if _kept() else None
report({"ran": made is not None, "same_object": got is made, "got": repr(got),
        "hits": get_client().status()["hits"]})
"""


def test_the_cold_object_and_a_fresh_processs_hit_are_equal(overmind_runtime):
    cold = run_fresh(FRESH)
    warm = run_fresh(FRESH)
    assert cold["ran"] and cold["same_object"]
    assert not warm["ran"] and warm["hits"] > cold["hits"]
    assert warm["got"] == cold["got"]
