"""What ``PreTrainedModel.__init__`` writes outside the model is there in a process that only hit: sequences of fresh
processes, plain against cached (``_support/plain_sequences.py``).

transformers >= 5 records each model's ``_can_record_outputs`` in a process-wide registry from the constructor, and
``output_hidden_states`` / ``output_attentions`` read it; a hit runs no constructor. The core records the write on
the miss and replays it on every hit, and the transformers adapter declares it as well
(``overmind_transformers.recorded_outputs``): each is proved here with the other turned off. A user's subclass in a
module file, to which transformers writes a cached class attribute at its first construction, is served from the
second process on.
"""
from __future__ import annotations

from _support.plain_sequences import compare_with_plain

OUTPUTS = '''
import pickle
import overmind_transformers.recorded_outputs as recorded
from transformers import AutoConfig, BertModel

recorded.declared = S.get("declared", True)
core_off = S.get("core_off", False)
if ON and core_off:
    from overmind.testing import stop_recording_writes
    stop_recording_writes()  # the core's recorder off: only the adapter's declaration is left

def load_bert():
    cfg = AutoConfig.from_pretrained(P["bert"])
    cfg.output_hidden_states = True
    return BertModel.from_pretrained(P["bert"], config=cfg, attn_implementation="eager")

m, said, through = load(load_bert)
ids = torch.tensor([[1, 5, 7, 9, 3]])
with torch.no_grad():
    out = m(ids)
    attentions = m(ids, output_attentions=True).attentions
    tuple_out = m(ids, return_dict=False)
seen = {
    "hidden": None if out.hidden_states is None else [tm.tensor_digest(h) for h in out.hidden_states],
    "attentions": None if attentions is None else [tm.tensor_digest(a) for a in attentions],
    "tuple": [type(x).__name__ for x in tuple_out],
    "said": said,
}
try:
    pickle.dumps(m)
    seen["pickle"] = "ok"
except Exception as e:  # plain: the output hooks hold local closures once a forward asked for outputs
    seen["pickle"] = type(e).__name__
done(seen, through)
'''


def _set(**values):
    return lambda extra: extra.update(values)


def test_hidden_states_and_attentions_after_a_hit_by_the_core_recorder_alone(fresh):
    """The adapter's declaration off: the core finds the registry by itself."""
    steps = [_set(declared=False), OUTPUTS, OUTPUTS]
    plain, cached = compare_with_plain(fresh, steps)
    assert plain[0]["seen"]["hidden"] is not None and len(plain[0]["seen"]["hidden"]) == 3
    assert plain[0]["seen"]["attentions"] is not None
    assert [r["through"]["hits"] for r in cached] == [0, 1]


def test_the_adapters_declaration_alone_serves_a_hit(fresh):
    """The declaration covers a miss that could not see the write (the core's recorder is off here)."""
    steps = [_set(core_off=True), OUTPUTS, OUTPUTS]
    plain, cached = compare_with_plain(fresh, steps)
    assert [r["through"]["hits"] for r in cached] == [0, 1]


USER_SUBCLASS = '''
import sys
sys.path.insert(0, S["mods"])
from usermods import MyBert

m, said, through = load(lambda: MyBert.from_pretrained(P["bert"], attn_implementation="eager"))
with torch.no_grad():
    out = m(torch.tensor([[1, 5, 7, 9, 3]]), output_hidden_states=True)
seen = {"class": type(m).__qualname__, "is": type(m) is MyBert, "said": said,
        "hidden": None if out.hidden_states is None else len(out.hidden_states),
        "digest": tm.tensor_digest(out.last_hidden_state),
        "cached_attribute": "_can_set_experts_implementation_cached_value" in MyBert.__dict__}
done(seen, through)
'''

USERMODS = '''
from transformers import BertModel


class MyBert(BertModel):
    def __init__(self, config):
        super().__init__(config)
'''


def test_a_users_subclass_in_a_module_file_is_served_from_the_second_process(fresh, tmp_path):
    def setup(name):
        folder = tmp_path / f"mods-{name}"
        folder.mkdir()
        (folder / "usermods.py").write_text(USERMODS)
        return {"mods": str(folder)}

    plain, cached = compare_with_plain(fresh, [USER_SUBCLASS, USER_SUBCLASS, USER_SUBCLASS], setup=setup)
    assert plain[0]["seen"]["is"] is True and plain[0]["seen"]["hidden"] == 3
    assert [r["through"]["new_entries"] for r in cached][0] == 1
    assert [r["through"]["hits"] for r in cached][1:] == [1, 1]
