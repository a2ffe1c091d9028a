"""activate()/deactivate() patch stable-fast symmetrically; the clean-up hooks move beside the module."""
from __future__ import annotations

import gc
import io
import pickle

import pytest

pytest.importorskip("sfast", reason="stable-fast is not installed (scripts/setup installs it from ../shared/wheels)")
torch = pytest.importorskip("torch")

from sfast.jit import utils as sfast_jit_utils  # noqa: E402
from sfast.jit.trace_helper import lazy_trace  # noqa: E402
from sfast.utils import flat_tensors  # noqa: E402

import overmind  # noqa: E402
from overmind.testing import check_patch_symmetry, check_targets_resolve, forget_adapters  # noqa: E402
from overmind_sfast import clear_hooks, flattening, reducers  # noqa: E402


@pytest.fixture
def fresh_plugins():
    forget_adapters()
    yield
    forget_adapters()


def test_conformance(fresh_plugins):
    targets = check_targets_resolve("sfast")
    assert {(t.owner, t.name) for t in targets} == {
        (flat_tensors, "flatten_dataclass"), (sfast_jit_utils, "attach_script_module_clear_hook")}
    check_patch_symmetry("sfast")


def test_activate_installs_the_replacements_and_deactivate_restores_them(fresh_plugins):
    original_flatten = flat_tensors.flatten_dataclass
    original_attach = sfast_jit_utils.attach_script_module_clear_hook
    assert "sfast" in overmind.activate()
    try:
        assert flat_tensors.flatten_dataclass is flattening.flatten_dataclass
        assert sfast_jit_utils.attach_script_module_clear_hook is clear_hooks.attach_script_module_clear_hook
    finally:
        overmind.deactivate()
    assert flat_tensors.flatten_dataclass is original_flatten
    assert sfast_jit_utils.attach_script_module_clear_hook is original_attach


def _trace_linear():
    wrapper = lazy_trace(torch.nn.Linear(3, 3).eval().forward, check_trace=False, strict=False)
    wrapper(torch.ones(1, 3))
    (helper,) = wrapper._cached.values()
    return helper


def test_traced_while_active_the_module_carries_no_pyobject_and_the_hooks_are_held(sfast_patched):
    helper = _trace_linear()
    handle = helper.module._c
    assert not clear_hooks.carries_hook_attribute(helper.module)
    hooks = clear_hooks.held_hooks(handle)
    assert len(hooks) >= 2  # the wrapper and the module it traced through, at least
    assert all(isinstance(h, sfast_jit_utils.ScriptModuleClearHook) for h in hooks)
    torch.jit.save(helper.module, io.BytesIO())  # saveable


def test_held_hooks_go_with_the_module(sfast_patched):
    helper = _trace_linear()
    key = id(helper.module._c)
    assert clear_hooks._held.get(key)
    del helper
    gc.collect()
    assert key not in clear_hooks._held


def test_traced_while_inactive_the_module_cannot_be_cached_and_the_error_says_why():
    helper = _trace_linear()  # stable-fast's own hook attribute
    assert clear_hooks.carries_hook_attribute(helper.module)
    with pytest.raises(pickle.PicklingError, match=r"overmind.activate\(\) before compiling"):
        reducers.reduce_traced_wrapper(helper)
