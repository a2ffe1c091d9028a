"""What the timm adapter adds to a key, and which calls it leaves uncached; runs without timm installed (the
hooks never import it)."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("arguments", [
    {"model_name": "test_vit", "pretrained": True},
    {"model_name": "test_vit", "pretrained": True, "pretrained_cfg": "augreg_in21k"},
    {"model_name": "hf-hub:timm/test_vit.r160_in1k"},
    {"model_name": "test_vit", "pretrained": True, "pretrained_cfg_overlay": {"file": "/w.pt", "source": "hf-hub"}},
])
def test_weights_from_the_hub_or_a_url_are_not_cached_and_the_reason_says_how(arguments):
    from overmind.adapter import Uncacheable
    from overmind_timm import plugin

    with pytest.raises(Uncacheable, match=r"pretrained_cfg_overlay=dict\(file=PATH\)"):
        plugin._create_model_parts(dict(arguments))


def test_the_parts_of_a_call_whose_weights_are_in_files_it_names(tmp_path):
    from overmind_timm import plugin

    local = tmp_path / "local"
    local.mkdir()
    (local / "config.json").write_text("{}")
    (local / "model.safetensors").write_bytes(b"0")
    assert plugin._create_model_parts({"model_name": "test_vit"}) is None
    assert plugin._create_model_parts({"model_name": "test_vit", "pretrained": True,
                                       "pretrained_cfg_overlay": {"file": str(local / "model.safetensors")}}) is None
    assert plugin._create_model_parts({"model_name": "test_vit", "pretrained": True,
                                       "pretrained_cfg": {"state_dict": {}}}) is None
    [(label, folder)] = plugin._create_model_parts({"model_name": f"local-dir:{local}"})
    assert label == "timm local-dir" and {row[0] for row in folder} >= {"config.json", "model.safetensors"}
    (local / "model.safetensors").write_bytes(b"01")
    assert plugin._create_model_parts({"model_name": f"local-dir:{local}"}) != [(label, folder)]
