"""Property tests of cache keys: values a loader can tell apart never share a key; equal calls always do.

Hypothesis generates the values: nested containers of atoms (floats by their bits: ``0.0``/``-0.0``, NaNs),
dataclasses with extra instance attributes, slotted objects, closures over different values, tensors that
differ in one attribute or one bit, and the real config classes of the installed libraries with one field
changed. The oracle :func:`same_to_a_loader` says whether a loader could tell two values apart; a key may
only be shared when it says no. These tests use only ``key.describe_loader``, ``key.bind_arguments`` and
``key.make_key``, so they hold any way of computing a key to the same oracle.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import os
import struct
import typing

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from overmind.adapters import hooks
from overmind.keys import key

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def loader(value, option="default", *, flag=False, **extra):
    return value


def key_of(value, **kwargs) -> str:
    ld = key.describe_loader(loader)
    arguments = key.bind_arguments(ld, (value,), kwargs)
    return key.make_key(ld, arguments, [], hooks.key_for_value).key


def key_or_none(value, **kwargs):
    try:
        return key_of(value, **kwargs)
    except key.Unkeyable:
        return None  # not cached: never a wrong hit


# --- the oracle ------------------------------------------------------------------------------------


def same_to_a_loader(a, b) -> bool:
    """Whether a loader reading ``a`` and ``b`` (types, values bit for bit, order, attributes) sees the same."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad, a.is_conj(), a.is_neg()) == \
               (b.dtype, b.shape, b.stride(), b.storage_offset(), b.requires_grad, b.is_conj(), b.is_neg()) and \
            _storage_bytes(a) == _storage_bytes(b) and same_to_a_loader(a.grad, b.grad) and \
            same_to_a_loader(dict(a.__dict__), dict(b.__dict__))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_to_a_loader(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(map(repr, a)) == list(map(repr, b)) and all(same_to_a_loader(a[k], b[k]) for k in a)
    if isinstance(a, (set, frozenset)):
        return sorted(map(repr, a)) == sorted(map(repr, b))
    if dataclasses.is_dataclass(a) or hasattr(a, "__dict__") or hasattr(type(a), "__slots__"):
        return same_to_a_loader(_state(a), _state(b))
    return a == b


def _storage_bytes(t: torch.Tensor) -> bytes:
    s = t.untyped_storage()
    return bytes(torch.empty(0, dtype=torch.uint8).set_(s).numpy()) if s.nbytes() else b""


def _state(obj) -> dict:
    out = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        for slot in cls.__dict__.get("__slots__", ()):
            slot = f"_{cls.__name__}{slot}" if slot.startswith("__") else slot
            out[slot] = getattr(obj, slot, "<unset>")
    return out


# --- generated values ----------------------------------------------------------------------------

floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, float("nan"),
                                                                               struct.unpack("<d", b"\x01\x00\x00\x00\x00\x00\xf8\x7f")[0]])
# A string that names an existing file or folder ("/", ".") is keyed by what it holds, not by its characters:
# tests of paths are elsewhere, so generated text stays clear of them.
texts = st.text(max_size=6).filter(lambda s: not os.path.lexists(s))
atoms = st.none() | st.booleans() | st.integers(-3, 3) | st.integers() | floats | texts | st.binary(max_size=6)
hashable = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3).filter(lambda s: not os.path.lexists(s))


@dataclasses.dataclass
class Point:
    x: object = 0
    y: object = 1


class Slotted:
    __slots__ = ("a", "__b")

    def __init__(self, a, b):
        self.a = a
        self.__b = b


def _point(x, y, extra):
    p = Point(x, y)
    if extra is not None:
        p.extra = extra  # not a declared field: the state a dataclass-only key misses
    return p


def containers(children):
    return (st.lists(children, max_size=3) | st.lists(children, max_size=3).map(tuple)
            | st.dictionaries(st.text(max_size=3), children, max_size=3)
            | st.frozensets(hashable, max_size=3) | st.sets(hashable, max_size=3)
            | st.builds(_point, children, children, st.none() | children)
            | st.builds(Slotted, children, children))


values = st.recursive(atoms, containers, max_leaves=12)


@SETTINGS
@given(values, values)
def test_values_a_loader_tells_apart_never_share_a_key(a, b):
    ka, kb = key_or_none(a), key_or_none(b)
    if ka is not None and ka == kb:
        assert same_to_a_loader(a, b), f"{a!r} and {b!r} share key {ka[:12]}"


@SETTINGS
@given(values)
def test_an_equal_copy_shares_the_key(a):
    ka = key_or_none(a)
    assume(ka is not None)
    assert key_of(copy.deepcopy(a)) == ka


@SETTINGS
@given(values, st.data())
def test_one_changed_leaf_changes_the_key(a, data):
    """Change one leaf somewhere inside ``a``: the key must change (the oracle confirms the change shows)."""
    b = copy.deepcopy(a)
    paths = list(_leaf_paths(b))
    assume(paths)
    parent, slot = data.draw(st.sampled_from(paths))
    old = _get(parent, slot)
    new = data.draw(atoms.filter(lambda v: not same_to_a_loader(v, old)))
    _set(parent, slot, new)
    assume(not same_to_a_loader(a, b))
    ka, kb = key_or_none(a), key_or_none(b)
    assert ka is None or kb is None or ka != kb, f"{a!r} -> {b!r} kept key {ka[:12]}"


def _leaf_paths(obj, depth=0):
    if depth > 6:
        return
    if isinstance(obj, (list, dict)):
        for k in (range(len(obj)) if isinstance(obj, list) else list(obj)):
            yield (obj, k)
            yield from _leaf_paths(obj[k], depth + 1)
    elif isinstance(obj, (Point, Slotted)):
        for name in _state(obj):
            if name != "<unset>":
                yield (obj, "." + name)
                yield from _leaf_paths(getattr(obj, name), depth + 1)


def _get(parent, slot):
    return getattr(parent, slot[1:]) if isinstance(slot, str) and slot.startswith(".") and \
        not isinstance(parent, dict) else parent[slot]


def _set(parent, slot, value):
    if isinstance(slot, str) and slot.startswith(".") and not isinstance(parent, dict):
        setattr(parent, slot[1:], value)
    else:
        parent[slot] = value


# --- closures and functions ---------------------------------------------------------------------


def make_loader(value):
    def load():
        return value
    return load


def make_default_loader(value):
    def load(scale=value):
        return scale
    return load


@SETTINGS
@given(atoms, atoms)
def test_closures_over_values_a_loader_tells_apart_have_different_keys(a, b):
    assume(not same_to_a_loader(a, b))
    for factory in (make_loader, make_default_loader):
        assert key_or_none(factory(a)) != key_or_none(factory(b)) or key_or_none(factory(a)) is None
        assert key_of(factory(a)) == key_of(factory(a)) if key_or_none(factory(a)) else True


def test_loaders_that_differ_in_captured_values_have_different_loader_keys():
    keys = set()
    for s in (1, 2, 3):
        ld = key.describe_loader(lambda: torch.full((2,), float(s)))  # noqa: B023  (the captured cell is the point)
        keys.add(key.make_key(ld, {}).key)
    assert len(keys) == 3


# --- tensors -------------------------------------------------------------------------------------

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.complex64, torch.uint8]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(_DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        t = torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    elif dtype.is_floating_point:
        t = torch.randn(shape, generator=g).to(dtype)
    else:
        t = torch.randint(0, 100, shape, generator=g).to(dtype)
    return t


def _variants(t: torch.Tensor):
    """``t`` changed in one thing a loader can read."""
    out = {}
    flipped = t.clone()
    raw = flipped.view(torch.uint8).view(-1) if flipped.is_contiguous() else None
    if raw is not None and raw.numel():
        raw[0] ^= 1
        out["one bit"] = flipped
    if t.is_complex():
        out["conj"] = t.conj()
        out["neg view"] = torch._neg_view(t)
    if t.dtype.is_floating_point:
        out["requires_grad"] = t.clone().requires_grad_()
        out["parameter"] = torch.nn.Parameter(t.clone(), requires_grad=False)
        with_grad = torch.nn.Parameter(t.clone())
        with_grad.grad = torch.ones_like(t)
        out["grad"] = with_grad
    if t.dim() >= 2:
        swapped = t.transpose(0, 1).contiguous().transpose(0, 1)
        if swapped.stride() != t.stride():
            out["stride"] = swapped
    if t.numel() > 1:
        out["offset"] = torch.cat([t.reshape(-1)[:1], t.reshape(-1)])[1:].view(t.shape)
    other = torch.float64 if t.dtype != torch.float64 else torch.float32
    out["dtype"] = t.to(other)
    tagged = t.clone()
    tagged.tag = "x"
    out["attribute"] = tagged
    return out


@SETTINGS
@given(tensors())
def test_tensors_differing_in_one_attribute_or_bit_have_different_keys(t):
    base = key_of(t.clone())
    assert key_of(t.clone()) == base
    for what, variant in _variants(t).items():
        assert not same_to_a_loader(t.clone(), variant), what
        k = key_or_none(variant)
        assert k != base, f"{what}: same key as the original"


# --- the installed libraries' config classes --------------------------------------------------


def _config_classes():
    import diffusers
    import transformers

    out = [transformers.BitsAndBytesConfig, transformers.GenerationConfig, transformers.LlamaConfig,
           transformers.BertConfig, diffusers.BitsAndBytesConfig]
    for name in ("GPTQConfig", "AwqConfig", "QuantoConfig", "HqqConfig", "TorchAoConfig", "EetqConfig",
                 "FbgemmFp8Config", "CompressedTensorsConfig", "BitNetQuantConfig", "HiggsConfig", "VptqConfig",
                 "FineGrainedFP8Config", "QuarkConfig", "SpQRConfig", "AqlmConfig", "Mxfp4Config"):
        cls = getattr(transformers, name, None)
        if cls is not None:
            out.append(cls)
    for name in ("GGUFQuantizationConfig", "QuantoConfig", "TorchAoConfig", "PipelineQuantizationConfig"):
        cls = getattr(diffusers, name, None)
        if cls is not None:
            out.append(cls)
    return out


_REQUIRED = {"GPTQConfig": dict(bits=4), "AwqConfig": dict(bits=4), "TorchAoConfig": dict(quant_type="int4_weight_only"),
             "GGUFQuantizationConfig": dict(compute_dtype=torch.float16), "HqqConfig": dict(),
             "VptqConfig": dict(), "QuarkConfig": dict(), "PipelineQuantizationConfig": dict(quant_backend="bitsandbytes_4bit",
                                                                                             quant_kwargs={"load_in_4bit": True})}


def _instance(cls):
    try:
        return cls(**_REQUIRED.get(cls.__name__, {}))
    except Exception:
        return None  # needs a library not installed here (hqq, torchao, ...): nothing to key


def _changed_values(value):
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, -value - 1]
    if isinstance(value, float):
        return [value + 0.5, -value if value else -0.0]
    if isinstance(value, str):
        return [value + "x"]
    if value is None:
        return [1, "x"]
    if isinstance(value, (list, tuple)):
        return [type(value)(list(value) + [1])]
    if isinstance(value, dict):
        return [{**value, "added": 1}]
    if isinstance(value, torch.dtype):
        return [torch.float64 if value != torch.float64 else torch.float32]
    return []


@pytest.fixture(scope="module")
def activated():
    import overmind

    overmind.activate()
    yield
    overmind.deactivate()


@pytest.mark.parametrize("cls", _config_classes(), ids=lambda c: f"{c.__module__.split('.')[0]}.{c.__name__}")
def test_real_config_classes_with_one_field_changed_have_different_keys(cls, activated):
    base_obj = _instance(cls)
    if base_obj is None:
        pytest.skip(f"{cls.__name__} cannot be built here")
    base = key_or_none(base_obj)
    assert base is None or key_of(copy.deepcopy(base_obj)) == base
    tried = 0
    for name, value in list(vars(base_obj).items()):
        for new in _changed_values(value):
            changed = copy.deepcopy(base_obj)
            try:
                object.__setattr__(changed, name, new)
            except Exception:
                continue
            tried += 1
            k = key_or_none(changed)
            assert k is None or k != base, f"{cls.__name__}.{name}: {value!r} -> {new!r} kept the key"
    assert tried, f"no field of {cls.__name__} was changed"


# --- equal calls share a key -----------------------------------------------------------------------


@SETTINGS
@given(st.permutations(["option", "flag", "extra_a", "extra_b"]), st.booleans())
def test_keyword_order_and_explicit_defaults_do_not_change_the_key(order, explicit_default):
    kwargs = {"option": "default" if explicit_default else "other", "flag": False, "extra_a": 1, "extra_b": (2,)}
    a = key_of("v", **{k: kwargs[k] for k in order})
    b = key_of("v", **kwargs)
    assert a == b
    if explicit_default:
        assert key_of("v", flag=False, extra_a=1, extra_b=(2,)) == a


def test_dtype_and_torch_dtype_share_a_key(tmp_path, activated):
    import transformers

    path = tmp_path / "m"
    transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=2, vocab_size=64).save_pretrained(path)
    from overmind.adapters import patching

    owner = transformers.LlamaForCausalLM
    original = patching.get_original(transformers.PreTrainedModel, "from_pretrained")
    ld = key.describe_loader(original.__get__(None, owner))  # what a patched from_pretrained hands to load()

    def key_for(**kw):
        arguments = key.bind_arguments(ld, (str(path),), kw)
        extra = hooks.key_parts(ld, arguments=arguments)
        return key.make_key(ld, arguments, extra, hooks.key_for_value).key

    assert key_for(dtype=torch.float16) == key_for(torch_dtype=torch.float16)
    assert key_for(dtype=torch.float16) != key_for(dtype=torch.float32)


# --- signatures (a hub loader's decorator keeps one in its closure) -------------------------------------

_P = inspect.Parameter
ANNOTATIONS = [_P.empty, int, str, int | None, list[int], typing.Any, typing.Self, typing.ClassVar]


@st.composite
def signatures(draw):
    names = draw(st.lists(st.sampled_from(["path", "a", "b", "c"]), unique=True, max_size=3))
    params = [_P(n, draw(st.sampled_from([_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY])) if i == 0 else _P.KEYWORD_ONLY,
                 default=draw(st.just(_P.empty) | atoms), annotation=draw(st.sampled_from(ANNOTATIONS)))
              for i, n in enumerate(names)]
    if draw(st.booleans()):
        params.append(_P("kwargs", _P.VAR_KEYWORD))
    return inspect.Signature(params, return_annotation=draw(st.sampled_from(ANNOTATIONS)))


def same_signature(a, b) -> bool:
    pa, pb = list(a.parameters.values()), list(b.parameters.values())
    return a.return_annotation is b.return_annotation and len(pa) == len(pb) and all(
        x.name == y.name and x.kind == y.kind and x.annotation is y.annotation and same_to_a_loader(x.default, y.default)
        for x, y in zip(pa, pb))


@SETTINGS
@given(signatures(), signatures())
def test_signatures_a_loader_tells_apart_never_share_a_key(a, b):
    assert (key_of(a) == key_of(b)) == same_signature(a, b)


@SETTINGS
@given(signatures())
def test_a_signature_built_again_shares_the_key(a):
    again = inspect.Signature([_P(p.name, p.kind, default=p.default, annotation=p.annotation)
                               for p in a.parameters.values()], return_annotation=a.return_annotation)
    assert key_of(again) == key_of(a)


def test_special_forms_are_keyed_by_name_only_when_they_are_typings_own():
    forms = [typing.Any, typing.Self, typing.ClassVar, typing.NoReturn, typing.Optional]
    assert len({key_of(f) for f in forms}) == len(forms)
    lookalike = typing._SpecialForm(lambda self, parameters: parameters)  # named after its function: "<lambda>"
    lookalike._name = "Self"
    assert key_or_none(lookalike) != key_of(typing.Self)


def test_nan_payloads_and_signed_zeros_are_told_apart():
    quiet = float("nan")
    other = struct.unpack("<d", b"\x01\x00\x00\x00\x00\x00\xf8\x7f")[0]
    assert math.isnan(other) and key_of(quiet) != key_of(other)
    assert key_of(0.0) != key_of(-0.0) and key_of(1) != key_of(True) and key_of(1) != key_of(1.0)


BNB_SCRIPT = """
import sys, copy
sys.path.insert(0, {here!r})
import overmind
overmind.activate()
import torch
from transformers import BitsAndBytesConfig
from overmind.adapters import hooks
from overmind.keys import key
from overmind.testing import report
assert "bitsandbytes" not in sys.modules

def loader(value):
    return value

def key_or_none(value):
    ld = key.describe_loader(loader)
    try:
        return key.make_key(ld, key.bind_arguments(ld, (value,), {{}}), [],
                            hooks.key_for_value).key
    except key.Unkeyable:
        return None

def _changed_values(value):
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, (int, float)):
        return [value + 1]
    if isinstance(value, str):
        return [value + "x"]
    if value is None:
        return [1]
    if isinstance(value, torch.dtype):
        return [torch.float64]
    if isinstance(value, (list, dict)):
        return [type(value)()] if value else [[1]]
    return []
configs = [BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"), BitsAndBytesConfig(load_in_8bit=True),
           BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="fp4"),
           BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=True)]
base = BitsAndBytesConfig(load_in_4bit=True)
for name, value in list(vars(base).items()):
    for new in _changed_values(value):
        c = copy.deepcopy(base)
        try:
            object.__setattr__(c, name, new)
        except Exception:
            continue
        configs.append(c)
keys = [key_or_none(c) for c in configs]
# Two configs with the same state are the same config (fp4 is the default quant type): the oracle is the state.
states = [repr(sorted(vars(c).items(), key=lambda kv: kv[0])) for c in configs]
report({{"n": len(set(states)), "distinct": len(set(keys)), "none": keys.count(None),
        "bnb_imported": "bitsandbytes" in sys.modules}})
"""


def test_bitsandbytes_configs_differ_before_bitsandbytes_is_imported():
    """The key is computed before the load imports bitsandbytes; every config still differs."""
    import os

    from overmind.testing import run_fresh

    got = run_fresh(BNB_SCRIPT.format(here=os.path.dirname(__file__)))
    assert got["none"] == 0 and not got["bnb_imported"]
    assert got["distinct"] == got["n"], got
