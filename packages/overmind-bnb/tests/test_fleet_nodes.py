"""Two nodes of a fleet on one machine, each with its own server and its own copy of a tiny Llama: node B's
first 4-bit load imports the entry node A quantized, through a real S3-compatible store (SeaweedFS on
loopback), without running bitsandbytes' quantization once, and equals B's plain load (logits, generated
tokens, the parameters' types, transformers' guards).
"""
from __future__ import annotations

import textwrap

import pytest

from _support.fleet_nodes import Node, copy_model
from overmind_bnb_testlib import CONFIGS, PRELUDE, PROMPT_IDS

pytest.importorskip("overmind_transformers")

# The user's code: activate(), then from_pretrained in 4-bit (with Overmind off, the plain load).
LOAD = textwrap.dedent("""
    model = activated(lambda: AutoModelForCausalLM.from_pretrained({path!r}, quantization_config={config},
                                                                   device_map="cpu"))
    quantized = dict(QUANTIZE_CALLS)  # before any forward
    report({{**observe(model, {ids!r}), "quantized": quantized}})
""")
SAME = ("output", "tokens", "types", "guards", "hooked", "move")


def _script(path) -> str:
    return PRELUDE + LOAD.format(path=str(path), config=CONFIGS["4bit-nf4-double"], ids=PROMPT_IDS)


@pytest.mark.long(35)
def test_node_b_imports_the_4bit_model_node_a_quantized_through_s3(tmp_path, llama_path, s3_url, seaweed):
    a, b = Node.pair(tmp_path, s3_url, {**seaweed.env, "OVERMIND_STRICT": "1"})
    try:
        path_a, path_b = copy_model(llama_path, tmp_path / "a" / "llama"), copy_model(llama_path, tmp_path / "b" / "llama")
        loaded_a = a.run(_script(path_a))
        assert loaded_a["quantized"]["4bit"] > 0
        a.wait_uploads(1)
        plain_b = b.run_plain(_script(path_b))
        assert plain_b["quantized"]["4bit"] > 0
        loaded_b = b.run(_script(path_b))
        st = b.status()
        assert st["fleet_imports"] >= 1, f"node B did not import from the store: {st}"
        assert st["publishes"] == 0, "node B ran the loader and published instead of importing"
        assert loaded_b["quantized"] == {"4bit": 0, "8bit": 0}  # B quantized nothing
        assert loaded_b["mapped"][0] == loaded_b["mapped"][1] > 0  # every packed weight in B's own memfds
        assert {k: loaded_b[k] for k in SAME} == {k: plain_b[k] for k in SAME}
        assert loaded_a["output"] == plain_b["output"]  # the same model on both nodes
    finally:
        a.stop()
        b.stop()
