"""One checkpoint, five ways to load it, one server: every cached load returns what the plain call returns.

The user's code, unchanged, in a fresh process each time: ``overmind.activate()``, then
``AutoModelForCausalLM.from_pretrained(path, **variant)`` with bitsandbytes not yet imported (it is imported
inside the load, as in a user's process), where the variants are plain fp32, ``dtype=torch.float16``, 4-bit
nf4 (double quantization), 4-bit fp4 and 8-bit (``BitsAndBytesConfig``, ``device_map="cpu"``).

What "returns what the plain call returns" is checked as: a description of the model (every parameter's
name, class, dtype, shape, ``requires_grad`` and exact bytes; for ``Params4bit`` every attribute of its
``QuantState``, tensors by their bytes, in attribute order; for ``Int8Params`` ``SCB``, ``CB`` and flags;
buffers; ``model.dtype``) equal to the plain model's after loading, after a first forward under
``torch.no_grad()`` (where bitsandbytes repacks 4-bit weights for its AVX512-BF16 CPU kernel) and after a
``state_dict()`` (which undoes that packing); bitwise-equal logits of that first forward, a second one, one
with grad enabled and one after the ``state_dict()``; equal ``state_dict()`` bytes. The reference comes from one
process that loads each variant with the plain loader (no Overmind). After the second forward every parameter
of a cached model, 4-bit ones included, must still lie in an Overmind mapping.

Which orders, and why they cover collisions. A process computes a variant's key from its arguments alone, in
the same import state each time (fresh process, bitsandbytes not imported yet), and no argument is a cached
object, so a key should depend on neither the order nor which entries exist: two variants collide exactly when
their keys are equal, and then whichever is loaded second in a server is served the first's entry. One server
that loads all five therefore shows every pairwise collision, in either direction. The forward server loads
the five as misses (each must add an entry: a hit there is a collision, and says so), then all five again as
hits in the reverse order, each in a process that did not publish it, with all five entries present. The
reverse server loads them as misses in the reverse order: with the forward one, every ordered pair (A before
B) has run in some server, which checks the assumption above (a key or a result that depends on which
entries already exist would show there). Fifteen cached loads instead of the 600 of all 120 orders.

An 8-bit load after a 4-bit one in one server (a key that missed the config would return the 4-bit model) is its
own test; that 4-bit weights stay in shared memory after the first forward is checked in every cached process
of the matrix and in its own test, with writes before the first forward that must make the cached model fall
back to bitsandbytes' own repacking exactly as the plain model does.
"""
from __future__ import annotations

import json
import textwrap

import pytest

from _support import pythonpath_env
from overmind.testing import run_fresh
from overmind_bnb_testlib import PROMPT_IDS, build_bnb_llama

pytest.importorskip("overmind_transformers")

VARIANTS = {
    "fp32": "dict()",
    "fp16": "dict(dtype=torch.float16)",
    "nf4": "dict(quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
           "bnb_4bit_use_double_quant=True), device_map='cpu')",
    "fp4": "dict(quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='fp4'), "
           "device_map='cpu')",
    "8bit": "dict(quantization_config=BitsAndBytesConfig(load_in_8bit=True), device_map='cpu')",
}
FORWARD = list(VARIANTS)
REVERSE = FORWARD[::-1]

# What every process observes about a model: the same code for the plain reference and for cached loads.
OBSERVE = textwrap.dedent('''
    import hashlib, json, os, sys
    import torch

    IDS = torch.tensor(%(ids)r)

    def digest(t):
        t = t.detach().contiguous().reshape(-1)
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return h.hexdigest()[:16]

    def value(v):
        if isinstance(v, torch.Tensor):
            return ["tensor", str(v.dtype), list(v.shape), digest(v)]
        if type(v).__name__ == "QuantState":
            return ["QuantState", [[k, value(x)] for k, x in vars(v).items()]]
        return repr(v)

    def describe(model):
        """Everything about the weights a user can see, without state_dict() (it undoes the 4-bit packing)."""
        params = []
        for name, p in model.named_parameters():
            d = [name, type(p).__name__, str(p.dtype), list(p.shape), p.requires_grad, digest(p.data)]
            if type(p).__name__ == "Params4bit":
                d.append(value(p.quant_state))
                d.append([p.blocksize, p.quant_type, p.bnb_quantized, getattr(p.module, "quant_state", None) is p.quant_state])
            elif type(p).__name__ == "Int8Params":
                d.append([p.has_fp16_weights, value(p.SCB), value(p.CB) if p.CB is not None else None])
            params.append(d)
        buffers = [[n, str(b.dtype), list(b.shape), digest(b)] for n, b in model.named_buffers()]
        return {"params": params, "buffers": buffers, "dtype": str(model.dtype), "training": model.training}

    def quantized(model):
        return [p for p in model.parameters() if type(p).__name__ in ("Params4bit", "Int8Params")]

    def mapped(model):
        """[in an Overmind mapping, all] for the parameters, and the same for the quantized ones alone."""
        from overmind.testing import overmind_mapped
        ps, qs = list(model.parameters()), quantized(model)
        return [[sum(overmind_mapped(p.data_ptr()) for p in ps), len(ps)],
                [sum(overmind_mapped(p.data_ptr()) for p in qs), len(qs)]]

    def logits(model, grad=False):
        with torch.set_grad_enabled(grad):
            return digest(model(IDS).logits)

    def observe(model, on_mapped=None):
        """Descriptions and logits at each point; ``on_mapped(model)`` runs right after the second forward."""
        out = {"loaded": describe(model), "forward1": logits(model)}
        out["after_forward1"] = describe(model)
        out["forward2"] = logits(model)
        if on_mapped is not None:
            out["mapped"] = on_mapped(model)
        out["forward_grad"] = logits(model, grad=True)
        out["state_dict"] = sorted([k, digest(v)] for k, v in model.state_dict().items())
        out["after_state_dict"] = describe(model)
        out["forward3"] = logits(model)
        return out
''') % {"ids": PROMPT_IDS}

# A cached load in a fresh process, as a user's script runs it.
CACHED = textwrap.dedent('''
    import overmind
    overmind.activate()
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from overmind.testing import report

    def server_state():
        entries = overmind.cache_info(processes=False).entries
        return len(entries), sum(e.hits for e in entries)

    bnb_before = "bitsandbytes" in sys.modules
    entries0, hits0 = server_state()
    model = AutoModelForCausalLM.from_pretrained(os.environ["CKPT"], **%(variant)s)
    entries1, hits1 = server_state()
    result = observe(model, on_mapped=mapped)
    result.update(bnb_imported_before_load=bnb_before, new_entries=entries1 - entries0, new_hits=hits1 - hits0)
    report(result)
''')

REFERENCE = textwrap.dedent('''
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from overmind.testing import patched_targets, report
    assert not patched_targets()  # the plain loader: nothing routed through the cache
    out = {}
    for name, kwargs in %(variants)s:
        model = AutoModelForCausalLM.from_pretrained(os.environ["CKPT"], **eval(kwargs))  # as loaded (shm/placer.py)
        out[name] = observe(model)
    model = AutoModelForCausalLM.from_pretrained(os.environ["CKPT"], **eval(%(nf4)r))
    edit(model)
    out["nf4-edited"] = observe(model)
    report(out)
''')

# Writes before the first forward, made the same way to the plain and the cached model: one 4-bit weight's
# bytes, and another layer's quantization statistics (a QuantState tensor, not the weight).
EDIT = textwrap.dedent('''
    EDITED = ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight")

    def edit(model):
        with torch.no_grad():
            model.get_parameter(EDITED[0]).data.view(-1)[:64].bitwise_xor_(0x5A)
            model.get_parameter(EDITED[1]).quant_state.offset.add_(0.25)
''')

COMPARED = ("loaded", "forward1", "after_forward1", "forward2", "forward_grad", "state_dict", "after_state_dict",
            "forward3")


def _env(ckpt) -> dict[str, str]:
    return {"CKPT": str(ckpt), "OVERMIND_STRICT": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OVERMIND_DISABLED_ADAPTERS": "fixture,fixture_broken,future",
            "PYTHONPATH": pythonpath_env()}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_bnb_llama(tmp_path_factory.mktemp("matrix-llama"))


@pytest.fixture(scope="module")
def reference(ckpt):
    """What the plain call returns, per variant (and for the edited nf4 model), from one plain process."""
    script = OBSERVE + EDIT + REFERENCE % {"variants": list(VARIANTS.items()), "nf4": VARIANTS["nf4"]}
    return run_fresh(script, env={**_env(ckpt), "OVERMIND_DISABLE": "1"}, timeout=600)


def _load_cached(ckpt, variant: str) -> dict:
    return run_fresh(OBSERVE + CACHED % {"variant": VARIANTS[variant]}, env=_env(ckpt), timeout=600)


def _differences(got: dict, want: dict) -> list[str]:
    return [point for point in COMPARED if got[point] != want[point]]


def _check(variant: str, got: dict, reference: dict, expect: str) -> list[str]:
    """Problems with one cached load (empty if none); ``expect`` is ``miss`` or ``hit``."""
    problems = []
    if got["bnb_imported_before_load"]:
        problems.append("bitsandbytes was imported before the load: not the user's situation")
    if expect == "miss" and got["new_entries"] == 0:  # (a miss also counts hits: publish reads its entry back)
        problems.append(f"expected a miss, got no new entry and {got['new_hits']} hits: served another "
                        f"variant's entry")
    if expect == "hit" and (got["new_entries"] != 0 or got["new_hits"] == 0):
        problems.append(f"expected a hit, got {got['new_entries']} new entries and {got['new_hits']} hits")
    diff = _differences(got, reference[variant])
    if diff:
        types = sorted({p[1] for p in got["loaded"]["params"]})
        problems.append(f"differs from the plain call at {diff} (parameter classes {types}, dtype "
                        f"{got['loaded']['dtype']})")
    (all_mapped, n), (q_mapped, nq) = got["mapped"]
    if all_mapped != n:  # after two forwards: every weight, 4-bit ones included, still in shared memory
        problems.append(f"after the forwards only {all_mapped} of {n} parameters lie in the entry "
                        f"({q_mapped} of {nq} quantized)")
    return [f"{variant} ({expect}): {p}" for p in problems]


@pytest.mark.parametrize("misses, hits", [pytest.param(FORWARD, REVERSE, id="forward-misses-then-reverse-hits"),
                                          pytest.param(REVERSE, [], id="reverse-misses")])
@pytest.mark.long(165)  # seconds on a CI machine: conftest.py runs it early
def test_every_variant_returns_the_plain_result_in_one_server(overmind_runtime, ckpt, reference, misses, hits):
    """One server: the five variants as misses in one order, then (forward server) as hits in the other."""
    problems = []
    for expect, variants in (("miss", misses), ("hit", hits)):
        for variant in variants:
            problems += _check(variant, _load_cached(ckpt, variant), reference, expect)
    assert not problems, "\n".join(problems)


def test_reference_variants_differ(reference):
    """The matrix can only find a wrong entry if the variants differ where it looks (classes, dtypes, logits)."""
    classes = {v: tuple(sorted({p[1] for p in reference[v]["loaded"]["params"]})) for v in VARIANTS}
    assert classes["fp32"] == classes["fp16"] == ("Parameter",)
    assert classes["nf4"] == classes["fp4"] == ("Parameter", "Params4bit")
    assert classes["8bit"] == ("Int8Params", "Parameter")
    assert reference["fp16"]["loaded"]["dtype"] == "torch.float16"
    assert len({reference[v]["forward1"] for v in VARIANTS}) == len(VARIANTS)
    assert len({json.dumps(reference[v]["loaded"]) for v in VARIANTS}) == len(VARIANTS)
    # bitsandbytes repacks 4-bit weights on the first no-grad forward where its CPU kernel runs (AVX512-BF16): the
    # points before and after differ there, and only there
    for v in ("nf4", "fp4"):
        assert (reference[v]["loaded"] != reference[v]["after_forward1"]) == _repacks_4bit_for_this_cpu()


def test_a_4bit_then_an_8bit_load_returns_an_8bit_model(overmind_runtime, ckpt, reference):
    """In one server a 4-bit load, then ``BitsAndBytesConfig(load_in_8bit=True)``."""
    first = _load_cached(ckpt, "nf4")
    second = _load_cached(ckpt, "8bit")
    types = sorted({p[1] for p in second["loaded"]["params"]})
    assert types == ["Int8Params", "Parameter"], f"the 8-bit call returned a model with {types}"
    assert second["forward1"] == reference["8bit"]["forward1"]
    problems = _check("nf4", first, reference, "miss") + _check("8bit", second, reference, "miss")
    assert not problems, "\n".join(problems)


FINDING_9 = textwrap.dedent('''
    import overmind
    overmind.activate()
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from overmind.testing import mapped_entry, report
    from overmind_bnb import packing

    PAGE = os.sysconf("SC_PAGE_SIZE")

    def located(model):
        """Where each 4-bit weight's bytes lie: the entry id (the same for all) or None (private memory)."""
        out = {}
        for name, p in model.named_parameters():
            if type(p).__name__ == "Params4bit":
                s = p.untyped_storage()
                out[name] = mapped_entry(s.data_ptr(), s.nbytes())
        return out

    def pages(t):
        s = t.untyped_storage()
        return set(range(s.data_ptr() // PAGE, (s.data_ptr() + max(s.nbytes(), 1) - 1) // PAGE + 1))

    def input_pages(p):
        """The pages of everything bitsandbytes' repacking reads for ``p``: the weight and its statistics."""
        qs, out = p.quant_state, pages(p.data)
        for state in (qs, getattr(qs, "state2", None)):
            for v in vars(state).values() if state is not None else ():
                if isinstance(v, torch.Tensor):
                    out |= pages(v)
        return out

    model = AutoModelForCausalLM.from_pretrained(os.environ["CKPT"], **%(nf4)s)
    before = located(model)
    touched = []
    if os.environ.get("EDIT"):
        written = pages(model.get_parameter(EDITED[0]).data) | pages(model.get_parameter(EDITED[1]).quant_state.offset)
        touched = sorted(n for n, p in model.named_parameters()
                         if type(p).__name__ == "Params4bit" and input_pages(p) & written)
        edit(model)
    result = observe(model, on_mapped=lambda m: located(m))
    import gc; gc.collect()
    result.update(before=before, touched=touched, waiting=packing.prepared_count())
    report(result)
''')


def test_4bit_weights_stay_in_the_entry_after_forward(overmind_runtime, ckpt, reference):
    """After a forward pass every 4-bit weight of a cached model still lies in the entry
    (in the publishing process and in a second fresh one), with outputs bitwise those of the plain model.

    A write before the first forward (one weight's bytes, another layer's statistics) makes the cached model
    repack with bitsandbytes' own function, as the plain model does: those layers, and any layer whose inputs
    share a written page (copy-on-write works in pages), end in private memory; every other one stays shared.
    """
    script = OBSERVE + EDIT + FINDING_9 % {"nf4": VARIANTS["nf4"]}
    runs = {"publisher": run_fresh(script, env=_env(ckpt), timeout=600),
            "second": run_fresh(script, env=_env(ckpt), timeout=600),
            "edited": run_fresh(script, env={**_env(ckpt), "EDIT": "1"}, timeout=600)}
    for name, run in runs.items():
        want = reference["nf4-edited" if name == "edited" else "nf4"]
        assert _differences(run, want) == [], name
        entries = set(run["before"].values())
        assert len(run["before"]) == 14 and len(entries) == 1 and None not in entries, (name, run["before"])
        assert run["waiting"] == 0, name  # every precomputed form was used or let go
    for name in ("publisher", "second"):
        assert runs[name]["mapped"] == runs[name]["before"], name  # repacked, and still in the entry
    edited = runs["edited"]
    private = sorted(n for n, where in edited["mapped"].items() if where is None)
    assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight"} <= set(private)
    assert private == edited["touched"]
    assert len(private) <= 7, private  # the check is per page, not per model: most layers stay shared
    assert all(where == edited["before"][n] for n, where in edited["mapped"].items() if n not in private)


# --- in this process: what a user may do to a cached 4-bit model before its first forward ------------------

FIRST_USES = {
    "nothing": "pass",
    "grad forward": "model(IDS)",
    "train-mode forward": "model.train(); model(IDS); model.eval()",
    "state_dict": "model.state_dict()",
    "a statistics field re-set, same value": "qs.blocksize = 64",
    "a statistics field changed": "qs.quant_type = 'fp4'",
    "weight data replaced": "q_proj.weight.data = q_proj.weight.data.bitwise_xor(0x11)",
    "absmax replaced": "qs.absmax = qs.absmax.bitwise_xor(1)",
    "weight copied over itself": "q_proj.weight.data.copy_(q_proj.weight.data.clone())",
}
# Where the first no-grad forward repacks the 4-bit weights (an AVX512-BF16 CPU), a layer whose weight or statistics
# were touched is repacked privately, as plain; elsewhere only a weight replaced by a new tensor leaves the entry.
PRIVATE_AFTER = {"a statistics field changed", "weight data replaced", "absmax replaced", "weight copied over itself"}
PRIVATE_WITHOUT_REPACK = {"weight data replaced"}


def _repacks_4bit_for_this_cpu() -> bool:
    """Whether bitsandbytes repacks 4-bit weights for its CPU kernel here (it does on AVX512-BF16 CPUs only; CI
    machines of this project have been both kinds). For a model at hand, ``overmind_bnb.packing.has_repackable``
    answers the same per layer; the reference here comes from another process."""
    from bitsandbytes.functional import has_avx512bf16

    return bool(has_avx512bf16())


@pytest.fixture
def in_process(overmind_runtime, monkeypatch):
    """Loads through the cache in this process (strict: a fallback fails the test); afterwards the adapters
    are forgotten and bitsandbytes' conversion is put back, so no other test sees this one's state."""
    from overmind.testing import forget_adapters, patched_targets, unpatch

    monkeypatch.setenv("OVERMIND_STRICT", "1")
    monkeypatch.setenv("OVERMIND_DISABLED_ADAPTERS", "fixture,fixture_broken,future")
    forget_adapters()
    yield
    forget_adapters()
    for target in patched_targets():
        if target.adapter == "bnb" and target.name == "_convert_weight_packed_for_cpu":
            unpatch(target)


@pytest.mark.parametrize("first_use", list(FIRST_USES))
def test_first_use_of_a_cached_4bit_model_matches_plain(in_process, ckpt, first_use):
    """Whatever happens between the load and the first no-grad forward, the cached model's outputs and state
    stay the plain model's; the entry's repacked form is used only where the weight and its statistics are
    still the entry's (the layer touched here is repacked privately, as plain; the others stay shared)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    import overmind
    from overmind.testing import overmind_mapped

    ns: dict = {}
    exec(OBSERVE, ns)
    kwargs = eval(VARIANTS["nf4"], {"BitsAndBytesConfig": BitsAndBytesConfig})
    overmind.load(AutoModelForCausalLM.from_pretrained, str(ckpt), **kwargs)  # publish
    models = {"plain": AutoModelForCausalLM.from_pretrained(str(ckpt), **kwargs),
              "cached": overmind.load(AutoModelForCausalLM.from_pretrained, str(ckpt), **kwargs)}
    from overmind_bnb import packing

    repacks = packing.has_repackable(models["plain"])  # asked before the first use repacks anything
    assert repacks == _repacks_4bit_for_this_cpu()
    seen = {}
    for name, model in models.items():
        q_proj = model.model.layers[0].self_attn.q_proj
        exec(FIRST_USES[first_use], {"model": model, "q_proj": q_proj, "qs": q_proj.weight.quant_state,
                                     "IDS": ns["IDS"]})
        seen[name] = {"forward1": ns["logits"](model), "after": ns["describe"](model), "forward2": ns["logits"](model)}
    assert seen["cached"] == seen["plain"]
    quantized = {n: overmind_mapped(p.data_ptr()) for n, p in models["cached"].named_parameters()
                 if type(p).__name__ == "Params4bit"}
    private = sorted(n for n, m in quantized.items() if not m)
    private_after = PRIVATE_AFTER if repacks else PRIVATE_WITHOUT_REPACK
    expected = ["model.layers.0.self_attn.q_proj.weight"] if first_use in private_after else []
    if first_use == "weight copied over itself" and repacks:  # a page written: its neighbours cannot be proved unchanged
        assert expected[0] in private and len(private) < len(quantized) // 2, private
    else:
        assert private == expected
