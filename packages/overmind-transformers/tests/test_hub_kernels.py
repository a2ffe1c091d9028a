"""The Hub-kernels key part and refusal (``overmind_transformers.hub_kernels``), on the rules transformers 5.25
applies: ``use_kernels`` given wins, except that ``USE_HUB_KERNELS=0`` turns even ``True`` off; a model whose
layers kernelize replaced is not cached. The fresh-process sequence against plain is in test_plain_sequences.py."""
from __future__ import annotations

import types

import pytest
import torch

from overmind_transformers import hub_kernels

hub = pytest.importorskip("transformers.integrations.hub_kernels")
if not hasattr(hub, "_kernels_enabled"):
    pytest.skip("this transformers does not kernelize by default", allow_module_level=True)


@pytest.mark.parametrize("env, given, resolved", [
    (None, None, True), ("0", None, False), (None, False, False), (None, True, True), ("0", True, False),
    ("1", None, True),
])
def test_the_key_part_is_the_flag_the_load_resolves(monkeypatch, env, given, resolved):
    if env is None:
        monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    else:
        monkeypatch.setenv("USE_HUB_KERNELS", env)
    part = hub_kernels.key_part({} if given is None else {"use_kernels": given})
    assert part[:2] == ("use_kernels", resolved)


def test_a_model_whose_layers_run_hub_kernels_is_refused_and_names_them():
    class Norm(torch.nn.Module):
        kernel_layer_name = "RMSNorm"

        def forward(self, x):
            return x

    model = torch.nn.Sequential(Norm(), Norm())
    model.use_kernels = True
    assert hub_kernels.refusal(model) is None  # kernelize fell back: nothing replaced
    model[0].forward = types.MethodType(lambda self, x: x * 3, model[0])  # accelerate's hooks do this too
    assert hub_kernels.refusal(model) is None
    model[1].forward = types.MethodType(lambda self, x: x * 2, model[1])  # what kernelize does with a Hub kernel
    model[1]._kernel_repo = "kernels-community/rmsnorm"
    why = hub_kernels.refusal(model)
    assert why.startswith("its layers run Hub kernels (1)") and "use_kernels=False" in why
    model.use_kernels = False
    assert hub_kernels.refusal(model) is None
