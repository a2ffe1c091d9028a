"""A model folder named as ``m``, ``./m``, ``/abs/m``, ``/abs/m/`` (and as ``pathlib.Path``) in a sequence of fresh
processes: the spellings of one type share an entry, and each process sees its own spelling wherever plain
transformers derives a string from the path (``name_or_path``, the config's ``_name_or_path``, an inner model's,
the tokenizer's ``init_kwargs`` and the files it resolved there, a processor's tokenizer), and nothing else changed (``model_type`` is
``"bert"`` whatever the folder is called); see ``_support/path_spellings.py``.
"""
from __future__ import annotations

import os

from _support import path_spellings as ps
from _support.plain_sequences import compare_with_plain

LOADS = ps.PRELUDE + '''
from transformers import AutoModelForCausalLM, AutoProcessor, AutoTokenizer, BertModel

bert, said, through_bert = load(lambda: BertModel.from_pretrained(spelled("bert")))
tokenizer, said_tokenizer, through_tokenizer = load(lambda: AutoTokenizer.from_pretrained(spelled("bert")))
llama, said_llama, through_llama = load(lambda: AutoModelForCausalLM.from_pretrained(spelled("llama")))
processor, said_processor, through_processor = load(lambda: AutoProcessor.from_pretrained(spelled("clip-processor")))
seen = {"bert": naming(bert, "bert"), "tokenizer": naming(tokenizer, "bert"), "llama": naming(llama, "llama"),
        "processor": naming(processor, "clip-processor"), "said": said + said_tokenizer + said_llama + said_processor}
done(seen, {"bert": through_bert, "tokenizer": through_tokenizer, "llama": through_llama,
            "processor": through_processor})
'''


def test_each_process_sees_the_path_as_it_spelled_it(fresh, tiny):
    cwd = os.path.dirname(tiny["bert"])
    assert os.path.dirname(tiny["llama"]) == os.path.dirname(tiny["processor"]) == cwd
    assert os.path.basename(tiny["processor"]) == "clip-processor"
    steps = [x for form in ps.FORMS for x in (ps.spelled_as(*form), LOADS)]
    plain, cached = compare_with_plain(fresh, steps, setup=lambda run: {"cwd": cwd})
    # the spellings show where plain derives from the path, so the comparison above tells them apart
    assert plain[1]["seen"]["bert"][".config._name_or_path"] == repr("./bert")
    assert plain[1]["seen"]["tokenizer"][".init_kwargs['name_or_path']"] == repr("./bert")
    assert plain[1]["seen"]["processor"][".tokenizer.name_or_path"] == repr("./clip-processor")
    assert plain[3]["seen"]["llama"]["._modules['model'].name_or_path"] == repr(os.path.join(cwd, "llama") + "/")
    assert len({repr(r["seen"]) for r in plain[:4]}) == 4  # each str spelling shows
    for i in ps.HITS_EXPECTED:  # served from an entry another spelling made
        assert [cached[i]["through"][load]["hits"] for load in ("bert", "tokenizer", "llama", "processor")] == [1] * 4, i
