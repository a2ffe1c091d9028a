"""The adapter as Overmind sees it: discovered through its entry point, its hooks valid, its reducers in use."""
from __future__ import annotations

from bitsandbytes.nn import Int8Params, Params4bit
from overmind import plugins
from overmind_bnb import plugin
from overmind_bnb.reducers import reduce_quantized_param


def test_discovered_and_loaded_through_the_entry_point():
    state = plugins.adapters()["bnb"]
    assert (state.status, state.dist) == ("loaded", "overmind-bnb"), state.reason
    pm = plugins.get_manager()
    assert pm.get_plugin("bnb") is plugin
    pm.check_pending()  # every hookimpl names a hookspec, with matching arguments


def test_core_reducer_table_holds_ours():
    table = plugins.reducers()
    assert table[Params4bit] is reduce_quantized_param and table[Int8Params] is reduce_quantized_param


def test_after_unpickle_runs_before_other_adapters():
    """``overmind_after_unpickle`` is firstresult: an adapter answering earlier would skip this one."""
    impls = plugins.get_manager().hook.overmind_after_unpickle.get_hookimpls()
    assert impls[-1].plugin_name == "bnb" and impls[-1].tryfirst  # pluggy calls the list's end first
