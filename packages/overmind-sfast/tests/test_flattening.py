"""Dataclass outputs of stable-fast traces survive the cache (flattening.py), with the real stable-fast."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("sfast", reason="stable-fast is not installed (scripts/setup installs it from ../shared/wheels)")
torch = pytest.importorskip("torch")

from sfast.compilers.diffusion_pipeline_compiler import _build_lazy_trace  # noqa: E402
from sfast.utils import flat_tensors  # noqa: E402
from transformers.modeling_outputs import BaseModelOutputWithPooling  # noqa: E402

from overmind_sfast import flattening  # noqa: E402
from overmind_sfast_testlib.modules import Encoder, LocalModel, Pair, PairModel  # noqa: E402
from overmind_sfast_testlib.pipelines import cpu_config  # noqa: E402
from overmind_sfast_testlib.roundtrip import roundtrip  # noqa: E402


def traced(module):
    """stable-fast's lazy trace of ``module.forward`` (as compile() makes it), called once so it traces."""
    wrapper = _build_lazy_trace(cpu_config())(module.forward)
    out = wrapper(torch.ones(2, 4))
    return wrapper, out


def the_traced_module(wrapper):
    (helper,) = wrapper._cached.values()
    return helper


def test_patched_flattening_keeps_the_class_in_this_process(sfast_patched):
    wrapper, out = traced(Encoder().eval())
    assert type(out) is BaseModelOutputWithPooling
    again = wrapper(torch.ones(2, 4))  # the traced module, through stable-fast's own unflattening
    assert type(again) is BaseModelOutputWithPooling
    assert torch.equal(again.last_hidden_state, out.last_hidden_state)
    tags = flattening.tagged_constants(the_traced_module(wrapper).module)
    assert [path for _, path in tags] == ["transformers.modeling_outputs:BaseModelOutputWithPooling"]


def test_dataclass_output_survives_the_cache(sfast_patched, table):
    wrapper, out = traced(Encoder().eval())
    helper = roundtrip(the_traced_module(wrapper), table)
    assert isinstance(helper.module, torch.jit.ScriptModule)
    got = helper(torch.ones(2, 4))
    assert type(got) is BaseModelOutputWithPooling
    assert torch.equal(got.pooler_output, out.pooler_output)


def test_rebuilt_module_needs_no_patch(sfast_patched, table):
    """Unflattening is stable-fast's own: a rebuilt module works after deactivate() too."""
    from overmind.testing import unpatch

    wrapper, out = traced(Encoder().eval())
    data = roundtrip(the_traced_module(wrapper), table)
    for t in sfast_patched:
        unpatch(t)
    assert flat_tensors.flatten_dataclass is not flattening.flatten_dataclass
    assert type(data(torch.ones(2, 4))) is BaseModelOutputWithPooling


def test_without_the_patch_the_class_is_lost(table, monkeypatch):
    """Why the patch exists: stable-fast's own encoding does not survive saving (its clean-up attribute is
    replaced here so that the module can be saved at all)."""
    from sfast.jit import utils

    from overmind_sfast import clear_hooks

    monkeypatch.setattr(utils, "attach_script_module_clear_hook", clear_hooks.attach_script_module_clear_hook)
    wrapper, _ = traced(Encoder().eval())
    assert flattening.tagged_constants(the_traced_module(wrapper).module) == []
    helper = roundtrip(the_traced_module(wrapper), table)
    with pytest.raises(AssertionError):
        helper(torch.ones(2, 4))


def test_class_paths():
    assert flattening.class_path(BaseModelOutputWithPooling) == "transformers.modeling_outputs:BaseModelOutputWithPooling"
    assert flattening.resolve_class(flattening.class_path(Encoder)) is Encoder

    @dataclass
    class Local:
        x: int

    assert flattening.class_path(Local).startswith("?")
    tag = flattening.class_tag(BaseModelOutputWithPooling)
    assert isinstance(tag, flat_tensors.ObjectTensor) and tag.get_value() is BaseModelOutputWithPooling
    assert flattening.read_tag(tag) == "transformers.modeling_outputs:BaseModelOutputWithPooling"
    assert flattening.read_tag(torch.tensor([0.0])) is None
    assert flattening.read_tag(torch.zeros(len(flattening.MAGIC) + 5)) is None


def test_a_module_level_dataclass_of_the_user_survives(sfast_patched, table):
    wrapper, _ = traced(PairModel().eval())
    got = roundtrip(the_traced_module(wrapper), table)(torch.ones(2, 4))
    assert type(got) is Pair and torch.equal(got.b, torch.full((2, 4), 2.0))


def test_a_class_defined_in_a_function_fails_at_saving_not_later(sfast_patched, table):
    wrapper, out = traced(LocalModel().eval())
    assert out.a.shape == (2, 4)  # works in this process, as stable-fast always did
    with pytest.raises(Exception, match="defined inside a function"):
        roundtrip(the_traced_module(wrapper), table)


def test_restoring_leaves_a_module_traced_here_alone(sfast_patched):
    wrapper, _ = traced(Encoder().eval())
    assert flattening.restore_class_tags(the_traced_module(wrapper).module) == 0


def test_a_class_that_cannot_be_imported_is_named():
    with pytest.raises(RuntimeError, match="no_such_module_xyz:Gone"):
        flattening._resolve_or_explain("no_such_module_xyz:Gone")
