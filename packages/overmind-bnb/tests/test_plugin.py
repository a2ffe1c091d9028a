"""The adapter as Overmind sees it: discovered through its entry point, its hooks valid, its reducers in use."""
from __future__ import annotations

from bitsandbytes.nn import Int8Params, Params4bit

from _support import pythonpath_env
from overmind.testing import adapter_reducers, adapter_state, plugin_manager
from overmind_bnb import plugin
from overmind_bnb.reducers import reduce_quantized_param


def test_discovered_and_loaded_through_the_entry_point():
    state = adapter_state("bnb")
    assert (state.status, state.dist) == ("loaded", "overmind-bnb"), state.reason
    pm = plugin_manager()
    assert pm.get_plugin("bnb") is plugin
    pm.check_pending()  # every hookimpl names a hookspec, with matching arguments


def test_core_reducer_table_holds_ours():
    table = adapter_reducers()
    assert reduce_quantized_param in table[Params4bit] and reduce_quantized_param in table[Int8Params]


def test_after_unpickle_runs_before_other_adapters():
    """``overmind_after_unpickle`` chains through the adapters; this one re-attaches hooks first, so others
    see a model that behaves like a freshly loaded one."""
    impls = plugin_manager().hook.overmind_after_unpickle.get_hookimpls()
    assert impls[-1].plugin_name == "bnb" and impls[-1].tryfirst  # pluggy calls the list's end first


def test_reducers_asked_before_bitsandbytes_is_imported_still_apply():
    """Overmind may ask for reducers before bitsandbytes is imported (a first, unrelated load): the adapter
    is not live yet and adds nothing; bitsandbytes parameters pickled later must still keep their type."""
    from overmind.testing import run_fresh

    result = run_fresh('''
        import sys, torch
        from overmind.testing import adapter_reducers, report
        table = adapter_reducers()
        assert "bitsandbytes" not in sys.modules, "asking for reducers must not import bitsandbytes"
        assert torch.nn.Parameter not in table  # the adapter waits for bitsandbytes
        from bitsandbytes.nn import Linear4bit
        from overmind_bnb_testlib import Roundtrip
        layer = Linear4bit(64, 64, quant_type="nf4").to("cpu")
        copy = Roundtrip(layer, adapter_reducers()).obj
        report([type(copy.weight).__name__, copy.weight.module is copy, torch.equal(copy.weight, layer.weight)])
    ''', env={"PYTHONPATH": pythonpath_env()})
    assert result == ["Params4bit", True, True]
