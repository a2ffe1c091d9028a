"""A first load's own result (admission by reuse: returned plain, a mark left) is keyed by its call when it is passed
to a later load, while its weights are untouched pages of the checkpoint file: so the second process, whose model
comes from the entry, asks for the same key as the first and publishes what the first only marked. A weight written
in place, or a result converted on load, is keyed by its content.
"""
from __future__ import annotations

SCRIPT = '''
from transformers import BertModel
from overmind.testing import origin_of, set_thresholds

overmind.activate()
CAP_LINE


def scaled_row(model, scale):
    """A loader given a module: its key holds what the module is."""
    return {"scale": scale, "row": model.embeddings.word_embeddings.weight[0].detach().clone() * scale}


model = BertModel.from_pretrained(P["bert"], dtype=DTYPE)
row = overmind.load(scaled_row, model, 2.0)
origin = origin_of(model)
with torch.no_grad():
    model.embeddings.word_embeddings.weight.add_(1)
written = origin_of(model)
st = overmind.cache_info(processes=False).status
report({"origin": origin is not None, "written": written, "publishes": st["publishes"], "marks": st["marks"],
        "row": row["row"].tolist()})
'''


def _run(fresh, dtype: str, cap_line: str = "") -> dict:
    return fresh(SCRIPT.replace("DTYPE", dtype).replace("CAP_LINE", cap_line), OVERMIND_ADMIT="reuse")


def test_the_second_process_publishes_what_the_first_marked(fresh):
    first = _run(fresh, "torch.float32")
    assert first["origin"] and first["written"] is None  # keyed by its call until a weight is written
    assert first["publishes"] == 0 and first["marks"] >= 2, first
    second = _run(fresh, "torch.float32")
    assert second["publishes"] == first["marks"] and second["marks"] == 0, (first, second)
    assert second["row"] == first["row"]
    third = _run(fresh, "torch.float32")
    assert third["publishes"] == second["publishes"] and third["row"] == first["row"]


def test_a_result_converted_on_load_is_keyed_by_its_content(fresh):
    # converted from the fp32 checkpoint, its weights are the process's own: more of them than the tiny model's two
    # computed buffers (1 KiB) when the bytes of its own that are digested are capped at 4 KiB
    cap = "set_thresholds(own_bytes_digested=4096)"
    assert _run(fresh, "torch.float32", cap)["origin"]
    first = _run(fresh, "torch.float16", cap)
    assert not first["origin"] and first["written"] is None
