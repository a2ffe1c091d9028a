"""timm's loaders with Overmind on, in fresh processes against plain timm: the same model (weights, a head drawn
at random, classes, dtypes), the random generators left where plain leaves them, served from the cache from the
second process on; a changed file is a miss, never a stale model."""
from __future__ import annotations

import pytest

from _support.snippets import SAID
from overmind.testing import check_cached_like_plain, run_fresh

pytest.importorskip("timm", reason="timm (with a torchvision that imports) is not installed here: the timm lane "
                                   "runs these tests (scripts/test --timm)")

PREAMBLE = """
import hashlib, json
import overmind
from overmind.testing import report
overmind.activate()
import timm, torch

def digest(model):
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode()); h.update(str(t.dtype).encode()); h.update(t.detach().float().numpy().tobytes())
    return h.hexdigest()

def describe(model):
    return [type(model).__qualname__, type(model).__module__, digest(model), str(next(model.parameters()).dtype),
            model.training, model.num_classes]
"""


def test_create_model_from_a_seeded_script_is_served_like_plain(overmind_runtime, weights):
    # 3 classes where the checkpoint has 5: timm drops its head and keeps the one it drew at random
    check_cached_like_plain(PREAMBLE + f"""
        torch.manual_seed(0)
        model = timm.create_model("test_vit", pretrained=True, num_classes=3,
                                  pretrained_cfg_overlay=dict(file={str(weights["safetensors"])!r}))
        report(describe(model))
    """.replace("\n        ", "\n"))


def test_a_script_that_draws_before_it_loads_is_served_from_its_second_run(overmind_runtime, weights):
    # the entry is the variant of the generator's state after the draws: every run of the script reaches it
    check_cached_like_plain(PREAMBLE + """
        torch.manual_seed(3)
        noise = torch.randn(7)
        model = timm.create_model("test_convnext", num_classes=4)  # built at random, no weights at all
        report(describe(model) + [noise.tolist()])
    """.replace("\n        ", "\n"))


def test_checkpoint_path_and_a_local_dir_model_are_served_like_plain(overmind_runtime, weights):
    check_cached_like_plain(PREAMBLE + f"""
        torch.manual_seed(5)
        first = timm.create_model("test_vit", num_classes=5, checkpoint_path={str(weights["pth"])!r})
        second = timm.create_model("local-dir:" + {str(weights["local"])!r})
        report([describe(first), describe(second), digest(first) == digest(second)])
    """.replace("\n        ", "\n"))


LOAD_CHECKPOINT = PREAMBLE + """
import sys
""" + SAID + """torch.manual_seed(2)
model = timm.create_model("test_vit", num_classes=5)
before = digest(model)
result = timm.models.load_checkpoint(model, sys.argv[-1] if len(sys.argv) > 1 else %(path)r)
state = timm.models.load_state_dict(%(path)r)
report({"model": describe(model), "changed": before != digest(model), "result": repr(result),
        "state": sorted(state), "again": torch.randn(2).tolist(),
        "hits": sorted(m.split()[1] for m in said if m.startswith("hit ")),
        "published": sorted(m.split()[1] for m in said if m.startswith("published "))})
"""


def test_load_checkpoint_fills_the_callers_model_from_a_cached_state_dict(overmind_runtime, weights):
    script = LOAD_CHECKPOINT % {"path": str(weights["pth"])}
    plain = run_fresh(script, env={"OVERMIND_DISABLE": "1"})
    miss, hit = run_fresh(script), run_fresh(script)
    for run in (miss, hit):
        for field in ("model", "changed", "result", "state", "again"):
            assert run[field] == plain[field], field
    assert plain["changed"], "the checkpoint was copied into the caller's model"
    assert miss["published"] == ["timm.models._factory.create_model", "timm.models._helpers.load_state_dict"]
    assert hit["hits"] == ["timm.models._factory.create_model", "timm.models._helpers.load_state_dict",
                           "timm.models._helpers.load_state_dict"]


EDITED = PREAMBLE + """
torch.manual_seed(0)
model = timm.create_model("test_vit", pretrained=True, num_classes=5, pretrained_cfg_overlay=dict(file=%(path)r))
report(describe(model))
"""


def test_an_overwritten_weights_file_is_a_miss_in_the_next_process(overmind_runtime, tmp_path, save_weights):
    files = save_weights(tmp_path, seed=1)
    script = EDITED % {"path": str(files["safetensors"])}
    first = run_fresh(script)
    assert run_fresh(script) == first
    save_weights(tmp_path, seed=2)  # other weights, same file name
    plain = run_fresh(script, env={"OVERMIND_DISABLE": "1"})
    assert plain != first
    assert run_fresh(script) == plain


def test_conformance(overmind_runtime):
    from overmind.testing import check_claims_only_its_own, check_patch_symmetry, check_targets_resolve

    check_targets_resolve("timm")
    check_patch_symmetry("timm")
    check_claims_only_its_own("timm")
