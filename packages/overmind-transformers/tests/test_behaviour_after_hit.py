"""What a user does with a model after loading it behaves the same in a process that only hit as in plain: a
sequence of two fresh processes (``_support/plain_sequences.py``), the first cached one the miss, the second served
by hits alone, each compared with its plain twin.

One script, run in each process, loads the model families the adapter's self-check covers (a BERT and its
tokenizer: ``overmind_transformers/self_check_sample.py``), a causal LM (tiny llama) and a CLIP text model, every
one with ``attn_implementation="eager"`` (so that attentions can be asked for), and records:

* forwards with each output flag: ``output_hidden_states``, ``output_attentions``, ``return_dict=False`` (with
  both), the flag set on the config; for the causal LM ``use_cache=True`` and the cache fed back for the next token;
* ``generate()`` (greedy, a few new tokens; once more returning scores);
* ``pickle.dumps`` / ``torch.save`` / ``copy.deepcopy`` of the model as loaded and after a forward with those flags,
  and of the tokenizer: the outcome (plain may raise: the exception's type is recorded, and the hit must raise the same) and,
  where it worked, the copy's forward;
* ``save_pretrained`` of the model and the tokenizer: the digests of the files written;
* one step of training (SGD, ``loss.backward``): the loss, the gradients and the updated weights' digests, then a
  load of the same model again (a hit after the first process) whose weights must be the ones on disk;
* the warnings and the ``transformers`` log records of all of it.
"""
from __future__ import annotations

import pytest

from _support.plain_sequences import compare_with_plain

CORPUS = '''
import copy, io, logging, pickle, tempfile
from pathlib import Path
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from _support.behaviour_checks import copies, kept_logs, outcome, saved_pretrained, train_step

logs = kept_logs("transformers")


def shape(x):
    """What a user can see of an output: classes, keys, and the exact bytes of every tensor."""
    if isinstance(x, torch.Tensor):
        return tm.tensor_digest(x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, dict):  # a ModelOutput is an OrderedDict of its set fields
        return [type(x).__name__, {k: shape(v) for k, v in x.items()}]
    if isinstance(x, (tuple, list)):
        return [type(x).__name__, [shape(v) for v in x]]
    if hasattr(x, "layers"):  # a transformers Cache
        return [type(x).__name__, x.get_seq_length(),
                [[shape(getattr(l, "keys", None)), shape(getattr(l, "values", None))] for l in x.layers]]
    return type(x).__name__


def flags(m, inputs):
    """Forwards with every output flag; the last one asks for hidden states and attentions."""
    out = {}
    with torch.no_grad():
        out["default"] = shape(m(**inputs))
        out["hidden"] = shape(m(**inputs, output_hidden_states=True))
        out["attentions"] = shape(m(**inputs, output_attentions=True))
        out["tuple"] = shape(m(**inputs, output_hidden_states=True, output_attentions=True, return_dict=False))
        m.config.output_hidden_states = True
        out["config_flag"] = shape(m(**inputs))
        m.config.output_hidden_states = False
        out["both"] = shape(m(**inputs, output_hidden_states=True, output_attentions=True))
    return out


def forward_digest(inputs):
    def use(m):
        with torch.no_grad():
            return shape(m(**inputs, output_hidden_states=True))
    return use


def model_corpus(name, load_model, inputs, loss_of, extra=None):
    m, said, through = load(load_model)
    seen = {"class": type(m).__qualname__, "said": said, "weights": tm.state_digest(m),
            "attn": m.config._attn_implementation, "training": m.training}
    seen["copies as loaded"] = copies(m, forward_digest(inputs))
    seen["flags"] = flags(m, inputs)
    if extra:
        seen.update(extra(m))
    seen["copies"] = copies(m, forward_digest(inputs))
    seen["saved"] = saved_pretrained(m)
    seen["train"] = train_step(m, loss_of)
    again, said_again, through_again = load(load_model)  # the weights on disk again, not the trained ones
    seen["again"] = [tm.state_digest(again), said_again]
    return seen, {name: through, name + " again": through_again}


def tokenizer_corpus(path, texts):
    tok, said, through = load(lambda: AutoTokenizer.from_pretrained(path))
    encoded = tok(texts, padding=True)
    seen = {"class": type(tok).__qualname__, "said": said, "ids": encoded["input_ids"],
            "mask": encoded["attention_mask"], "decoded": tok.batch_decode(encoded["input_ids"]),
            "tokens": tok.tokenize(texts[0]), "len": len(tok), "special": tok.all_special_tokens,
            "copies": copies(tok, lambda t: t(texts)["input_ids"]), "saved": saved_pretrained(tok)}
    return tok, seen, through


seen, through = {}, {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")

    # BERT, the family of the adapter's self-check sample
    bert_tok, seen["bert tokenizer"], through["bert tokenizer"] = tokenizer_corpus(P["bert"], [tm.LLAMA_PROMPT, "the cat"])
    bert_in = {k: torch.tensor(v) for k, v in bert_tok([tm.LLAMA_PROMPT, "the cat"], padding=True).items()}
    seen["bert"], t = model_corpus(
        "bert", lambda: AutoModel.from_pretrained(P["bert"], attn_implementation="eager"), bert_in,
        lambda m: m(**bert_in).last_hidden_state.pow(2).mean())
    through.update(t)

    # a causal LM: the cache fed back, generate()
    llama_tok, seen["llama tokenizer"], through["llama tokenizer"] = tokenizer_corpus(P["llama"], [tm.LLAMA_PROMPT])
    llama_in = {k: torch.tensor(v) for k, v in llama_tok([tm.LLAMA_PROMPT]).items() if k != "token_type_ids"}

    def causal(m):
        out = {}
        with torch.no_grad():
            first = m(**llama_in, use_cache=True)
            out["use_cache"] = shape(first)
            step = first.logits[:, -1:].argmax(-1)
            mask = torch.cat([llama_in["attention_mask"], torch.ones_like(step)], dim=1)
            out["fed_back"] = shape(m(input_ids=step, attention_mask=mask, past_key_values=first.past_key_values,
                                      use_cache=True))
            out["tuple_cache"] = shape(m(**llama_in, use_cache=True, return_dict=False))
        generated = m.generate(**llama_in, max_new_tokens=4, do_sample=False)
        out["generate"] = [generated.tolist(), llama_tok.batch_decode(generated)]
        scored = m.generate(**llama_in, max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                            output_scores=True)
        out["generate_scores"] = [type(scored).__name__, scored.sequences.tolist(), shape(scored.scores)]
        return out

    seen["llama"], t = model_corpus(
        "llama", lambda: AutoModelForCausalLM.from_pretrained(P["llama"], attn_implementation="eager"), llama_in,
        lambda m: m(**llama_in, labels=llama_in["input_ids"]).loss, extra=causal)
    through.update(t)

    # a CLIP text model (SD's text encoder)
    clip_tok, seen["clip tokenizer"], through["clip tokenizer"] = tokenizer_corpus(S["clip_text"], [tm.SD_PROMPT])
    clip_in = {k: torch.tensor(v) for k, v in clip_tok([tm.SD_PROMPT], padding="max_length").items()}
    seen["clip"], t = model_corpus(
        "clip", lambda: AutoModel.from_pretrained(S["clip_text"], attn_implementation="eager"), clip_in,
        lambda m: m(**clip_in).pooler_output.pow(2).mean())
    through.update(t)

seen["warnings"] = [(w.category.__name__, str(w.message)) for w in caught]
seen["logs"] = logs
done(seen, through)
'''


@pytest.fixture(scope="module")
def clip_text(tmp_path_factory):
    from _support import tiny_models as tm

    return str(tm.build_clip_text(tmp_path_factory.mktemp("tiny-clip-text") / "clip-text"))


@pytest.mark.long(45)  # seconds on a CI machine: conftest.py runs it early
def test_forward_flags_generate_copies_and_training_after_a_hit_behave_as_plain(fresh, clip_text):
    plain, cached = compare_with_plain(fresh, [CORPUS, CORPUS], setup=lambda run: {"clip_text": clip_text})
    seen = plain[0]["seen"]
    assert seen["bert"]["flags"]["hidden"] != seen["bert"]["flags"]["default"]  # the flags changed the outputs
    assert len(seen["llama"]["generate"][0][0]) == len(seen["llama tokenizer"]["ids"][0]) + 4
    assert seen["llama"]["train"]["weights"] != seen["llama"]["weights"]  # the step moved the weights
    assert all(s["again"][0] == s["weights"] for s in (seen["bert"], seen["llama"], seen["clip"]))
    miss, hit = cached[0]["through"], cached[1]["through"]
    assert sum(t["new_entries"] for t in miss.values()) >= 6, miss  # three models and their tokenizers
    assert all(t["new_entries"] == 0 and t["hits"] >= 1 for t in hit.values()), hit  # the second process only hit
