"""The accelerate rule: a dispatched result is refused unless an adapter declared it carries that model's hooks.

Real torch modules; the accelerate hook is any object in ``_hf_hook`` (what the rule looks at). The end-to-end
cases (a real offloaded load refused by overmind-transformers, a dispatched 4-bit model cached through
overmind-bnb) are in those packages' tests.
"""
from __future__ import annotations

import types

import pytest
import torch

from overmind.adapter import NotCacheable, NotCachedByDesign
from overmind_hf import dispatch


class AlignDevicesHook:  # stands in for accelerate's: only its presence and its name matter here
    pass


def hooked(model: torch.nn.Module) -> torch.nn.Module:
    model[0]._hf_hook = AlignDevicesHook()
    return model


LOADER = types.SimpleNamespace(name="Model.from_pretrained")


@pytest.fixture(autouse=True)
def no_claims(monkeypatch):
    monkeypatch.setattr(dispatch, "_claims", {})


def enter(result):
    with dispatch.guard("transformers", result, LOADER):
        pass


def test_an_undispatched_model_passes():
    enter(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_a_dispatched_model_is_refused_by_design_with_the_adapter_the_loader_and_the_fix():
    with pytest.raises(NotCachedByDesign) as e:
        enter(hooked(torch.nn.Sequential(torch.nn.Linear(2, 2))))
    message = str(e.value)
    assert "adapter transformers (overmind-transformers" in message and "Model.from_pretrained" in message
    assert "Linear carries an accelerate AlignDevicesHook" in message and "device_map='cuda:0'" in message


def test_a_model_an_adapter_carries_passes_and_its_unclaimed_sibling_still_counts():
    carried = hooked(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    dispatch.carries_hooks("bnb", lambda root: root is carried)
    enter(carried)
    other = hooked(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    pipeline = types.SimpleNamespace(components={"unet": carried, "vae": other, "name": "not a module"})
    with pytest.raises(NotCacheable):
        enter(pipeline)
    enter(types.SimpleNamespace(components={"unet": carried}))


def test_claims_are_asked_only_about_dispatched_results():
    asked = []
    dispatch.carries_hooks("bnb", lambda root: asked.append(root) or False)
    enter(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert asked == []


class ConfigAttributes(torch.nn.Module):  # a __getattr__ of its own (diffusers' ModelMixin reads its config there)
    def __getattr__(self, name):
        if name == "_hf_hook":
            return AlignDevicesHook()
        return super().__getattr__(name)


class ClassHook(torch.nn.Linear):
    _hf_hook = AlignDevicesHook()


def test_the_hook_is_what_getattr_reads_for_every_kind_of_module():
    with_buffer = torch.nn.Linear(2, 2)
    with_buffer.register_buffer("_hf_hook", torch.ones(1))
    named_child = torch.nn.Sequential()
    named_child.add_module("_hf_hook", torch.nn.Linear(1, 1))
    modules = [torch.nn.Linear(2, 2), hooked(torch.nn.Sequential(torch.nn.Linear(2, 2)))[0], with_buffer,
               named_child, ConfigAttributes(), ClassHook(2, 2), torch.nn.Conv2d(1, 1, 1)]
    for m in modules:
        read = dispatch._hook_of(m)
        plain = getattr(m, "_hf_hook", None)
        assert type(read) is type(plain) and (read is plain or isinstance(plain, AlignDevicesHook)), type(m)
    assert [dispatch._hook_of(m) is None for m in modules] == [True, False, False, False, False, False, True]
    for m in modules[:4]:
        assert dispatch._plain_lookup[type(m)], "a plain module's hook is read from its dicts"
    assert not dispatch._plain_lookup[ConfigAttributes] and not dispatch._plain_lookup[ClassHook]


def test_a_pickling_failure_names_the_adapter():
    from overmind.adapter import PicklingFailed

    with pytest.raises(NotCacheable, match="adapter diffusers .*cannot pickle what Model.from_pretrained returned"):
        with dispatch.guard("diffusers", torch.nn.Linear(2, 2), LOADER):
            raise PicklingFailed(object(), TypeError("a lock"), TypeError("a lock"))
