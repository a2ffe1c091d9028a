"""Sequences of fresh processes, plain against cached, where process state or files on disk decide what a
transformers load returns: each process must see what the plain one sees, and the cache must still serve what it
can (``_support/plain_sequences.py``).

- a load inside ``accelerate.init_empty_weights()`` (meta parameters) and one outside it (CPU weights);
- a Hub repo id whose snapshot's ``config.json`` / ``tokenizer_config.json`` is edited in place;
- a load under ``torch.inference_mode()``: transformers returns ordinary tensors there;
- a subclass defined inside a function: the result is an instance of that very class;
- a ``device_map`` with disk offload: not cached by design, so no warning.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from _support import tiny_models as tm
from _support.plain_sequences import compare_with_plain

EMPTY_WEIGHTS = '''
from accelerate import init_empty_weights
from transformers import BertModel

def load_bert():
    if S["inside"]:
        with init_empty_weights():
            return BertModel.from_pretrained(P["bert"])
    return BertModel.from_pretrained(P["bert"])

m, said, through = load(load_bert)
devices = sorted({p.device.type for p in m.parameters()})
seen = {"devices": devices, "said": said,
        "digest": tm.state_digest(m) if devices == ["cpu"] else None}
done(seen, through)
'''


def _inside(flag):
    # Hub kernels off (transformers >= 5.25 kernelizes by default, and kernelizing a meta model raises in plain
    # transformers): what this sequence checks is the registration patches; test_hub_kernels... checks kernels.
    return lambda extra: extra.update(inside=flag, env={"USE_HUB_KERNELS": "0"})


def test_init_empty_weights_and_a_plain_load_each_get_their_own_result(fresh):
    # inside first: the outside load in the next processes must not get meta parameters, and the reverse
    steps = [_inside(True), EMPTY_WEIGHTS, _inside(False), EMPTY_WEIGHTS, _inside(True), EMPTY_WEIGHTS,
             _inside(False), EMPTY_WEIGHTS]
    plain, cached = compare_with_plain(fresh, steps, setup=lambda name: {})
    assert [r["seen"]["devices"] for r in plain] == [["meta"], ["cpu"], ["meta"], ["cpu"]]
    assert [r["through"]["hits"] for r in cached][2:] == [1, 1]  # both kinds served from the second time on


HUB_KERNELS = '''
from accelerate import init_empty_weights
from transformers import BertModel

def load_bert():
    if S.get("inside"):
        with init_empty_weights():
            return BertModel.from_pretrained(P["bert"])
    return BertModel.from_pretrained(P["bert"])

try:
    m, said, through = load(load_bert)
except Exception as e:  # plain transformers 5.25 cannot kernelize a meta model: the same error either way
    done({"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}, None if not ON else {"hits": 0})
else:
    seen = {"use_kernels": getattr(m, "use_kernels", None), "said": said, "digest": tm.state_digest(m)}
    done(seen, through)
'''


def _kernels(value, inside=False):
    return lambda extra: extra.update(env={"USE_HUB_KERNELS": value} if value else {}, inside=inside)


def test_hub_kernels_on_and_off_each_get_their_own_result(fresh):
    """transformers >= 5.25 kernelizes every model it loads unless ``USE_HUB_KERNELS=0``: ``model.use_kernels``
    differs, so each setting is its own entry, and a meta load with kernels on fails as it does plainly."""
    hub = pytest.importorskip("transformers.integrations.hub_kernels")
    if not hasattr(hub, "_kernels_enabled"):
        pytest.skip("this transformers does not kernelize by default")
    steps = [_kernels(None), HUB_KERNELS, _kernels("0"), HUB_KERNELS, _kernels(None), HUB_KERNELS,
             _kernels("0"), HUB_KERNELS, _kernels(None, inside=True), HUB_KERNELS]
    plain, cached = compare_with_plain(fresh, steps, setup=lambda name: {})
    assert [r["seen"].get("use_kernels") for r in plain[:4]] == [True, False, True, False]
    assert plain[4]["seen"]["error"].startswith("ValueError: Unsupported device type 'meta'")
    assert [r["through"]["hits"] for r in cached][2:4] == [1, 1]  # each setting served from the second time on


INFERENCE_MODE = '''
import transformers
from transformers import BertModel

def load_bert():
    with torch.inference_mode():
        return BertModel.from_pretrained(P["bert"])

m, said, through = load(load_bert)
w = m.embeddings.word_embeddings.weight
seen = {"inference": w.is_inference(), "said": said, "transformers": int(transformers.__version__.split(".")[0])}
try:
    with torch.no_grad():
        w.add_(1.0)  # an ordinary tensor takes an in-place update outside inference mode
    seen["update"] = "ok"
except RuntimeError as e:
    seen["update"] = str(e).split("\\n")[0]
seen["digest"] = tm.state_digest(m)
done(seen, through)
'''


def test_a_load_under_inference_mode_returns_what_plain_transformers_returns(fresh):
    plain, cached = compare_with_plain(fresh, [INFERENCE_MODE, INFERENCE_MODE])
    # transformers 5 returns ordinary tensors there, 4.x inference tensors: the cache gives each what it gives
    assert plain[0]["seen"]["inference"] is (plain[0]["seen"]["transformers"] < 5)
    assert cached[1]["through"]["hits"] >= 1


LOCAL_CLASS = '''
from transformers import BertModel

def define():
    class CustomBert(BertModel):
        def hello(self):
            return "custom"
    return CustomBert

CustomBert = define()
first, said, through = load(lambda: CustomBert.from_pretrained(P["bert"]))
again, said_again, through_again = load(lambda: CustomBert.from_pretrained(P["bert"]))
Other = define()  # the same code, another class object: its own calls get its own class
other, _, _ = load(lambda: Other.from_pretrained(P["bert"]))
other_again, _, through_other = load(lambda: Other.from_pretrained(P["bert"]))
seen = {"is": [type(first) is CustomBert, type(again) is CustomBert, type(other) is Other,
               type(other_again) is Other],
        "isinstance": isinstance(again, CustomBert), "hello": again.hello(), "said": said + said_again,
        "digest": tm.state_digest(again)}
done(seen, {"again": through_again, "other_again": through_other})
'''


def test_a_class_defined_in_a_function_comes_back_as_that_class(fresh):
    plain, cached = compare_with_plain(fresh, [LOCAL_CLASS, LOCAL_CLASS])
    assert plain[0]["seen"]["is"] == [True, True, True, True]
    # transformers notes a value on the class at its first load (the key sees the class change): the second
    # load of each class object is served, as the class itself, in the process that published and in the next
    assert cached[0]["through"]["other_again"]["hits"] == 1
    assert cached[1]["through"]["again"]["hits"] == 1 and cached[1]["through"]["other_again"]["hits"] == 1


DISK_OFFLOAD = '''
import logging
from transformers import BertModel

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
device_map = {"embeddings": "cpu", "encoder": "disk", "pooler": "cpu"}
m, said, through = load(lambda: BertModel.from_pretrained(P["bert"], device_map=device_map,
                                                        offload_folder=S["offload"]))
with torch.no_grad():
    out = m(torch.tensor([[1, 5, 7, 9, 3]])).last_hidden_state
seen = {"said": said, "out": tm.tensor_digest(out), "offloaded": sorted(os.listdir(S["offload"]))}
done(seen, through)
'''


def test_a_disk_offload_is_not_cached_and_says_nothing(fresh, tmp_path):
    def setup(name):
        folder = tmp_path / f"offload-{name}"
        return {"offload": str(folder)}

    plain, cached = compare_with_plain(fresh, [DISK_OFFLOAD, DISK_OFFLOAD], setup=setup)
    assert plain[0]["seen"]["said"] == []
    assert [r["through"]["new_entries"] for r in cached] == [0, 0]


HUB_EDIT = '''
from transformers import AutoTokenizer, BertModel

m, said, through = load(lambda: BertModel.from_pretrained("tiny-org/bert"))  # from HF_HUB_CACHE, offline
tok, said_tok, through_tok = load(lambda: AutoTokenizer.from_pretrained("tiny-org/bert"))
seen = {"hidden_act": m.config.hidden_act, "model_max_length": tok.model_max_length, "said": said + said_tok,
        "digest": tm.state_digest(m)}
done(seen, {"model": through, "tokenizer": through_tok})
'''


def _edit_in_place(name, change):
    def edit(extra):
        path = os.path.join(extra["snapshot"], name)  # a symlink to the blob, as the Hub cache lays it out
        with open(path) as f:
            data = json.load(f)
        data.update(change)
        with open(path, "w") as f:  # writes through the link into the blob: same revision, new content
            json.dump(data, f)
    return edit


def test_a_hub_snapshot_edited_in_place_is_read_again(fresh, tiny, tmp_path):
    def setup(name):
        source = tmp_path / f"source-{name}"
        shutil.copytree(tiny["bert"], source)
        for file, change in (("config.json", {"hidden_act": "gelu"}), ("tokenizer_config.json",
                                                                         {"model_max_length": 77})):
            data = json.loads((source / file).read_text())
            data.update(change)
            (source / file).write_text(json.dumps(data))
        snapshot, _ = tm.build_hf_cache(tmp_path / f"hub-{name}", "tiny-org/bert", source)
        return {"env": {"HF_HUB_CACHE": str(tmp_path / f"hub-{name}")}, "snapshot": str(snapshot)}

    steps = [HUB_EDIT, HUB_EDIT, _edit_in_place("config.json", {"hidden_act": "relu"}), HUB_EDIT,
             _edit_in_place("tokenizer_config.json", {"model_max_length": 50}), HUB_EDIT, HUB_EDIT]
    plain, cached = compare_with_plain(fresh, steps, setup=setup)
    assert [(r["seen"]["hidden_act"], r["seen"]["model_max_length"]) for r in plain] == \
        [("gelu", 77), ("gelu", 77), ("relu", 77), ("relu", 50), ("relu", 50)]
    assert cached[1]["through"]["model"]["hits"] >= 1 and cached[4]["through"]["model"]["hits"] >= 1
    assert cached[4]["through"]["tokenizer"]["hits"] >= 1
