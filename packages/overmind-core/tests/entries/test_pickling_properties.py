"""Property tests of pickling.dumps/loads: both C picklers rebuild the same objects.

``dumps`` pickles with ``_FastPickler`` (no ``persistent_id``: storages and arguments answered in
``reducer_override``, plain containers the call was given put in its memo first, so the skeleton refers to them by
memo index); the ``persistent_id`` pickler (``_CPickler``) serves the rest, and is forced here to compare.
Hypothesis generates object graphs (nested containers of atoms, floats by their bits; tensors of six dtypes
with views sharing one storage, reinterpreted dtypes, expanded and as_strided views, grads; Parameters; Linear
and Sequential modules, tied and repeated; instances with ``__dict__``, ``__slots__``, ``__reduce__`` or only an
adapter's reducer; IntEnum, ``str`` and ``int`` subclasses; self-cycles) and the call's ``arguments``: objects
of the graph, atoms, an unused tensor, or plain containers. Each graph is pickled through each pickler (the
persistent_id one forced by patching ``pickling._FastPickler``; spies say which ran) and rebuilt from a source
that gives back copies of the placed storages' bytes, once with the caller's arguments and once with other,
fresh ones. Checked, for each pickler:

1. the rebuilt graph is the original node for node (types, contents, floats and tensor bytes bit for bit,
   dtype, shape, stride, offset, requires_grad, Parameter-ness, grads);
2. objects referenced twice are one object again, and distinct ones stay distinct; tensors share a storage
   after the rebuild exactly when they did before;
3. where the original held an argument, the rebuilt graph holds the object passed to ``loads`` at that path
   (``is``): the caller's own, or the fresh one when fresh ones are passed;
4. the two picklers' rebuilds are equivalent to each other (1 and 2 between them).

Not compared: storage sharing with an argument. Only the argument object itself is substituted; a view of an
argument tensor, or a parameter of an argument module held elsewhere in the result, is pickled by value
(arguments_ref looks into plain containers only; the placer references a storage only where it lies in a
mapping), so it shares no storage with the caller's argument after the rebuild, by design.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import enum
import struct
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overmind.entries import pickling
from overmind.native import tensors

SETTINGS = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- the user classes a graph holds (module level: pickled by reference) -----------------------------------

class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


class Tag(str):
    """A ``str`` subclass: not in the fast pickler's skip set, so reducer_override is asked about it."""


class Count(int):
    """An ``int`` subclass, likewise."""


class Plain:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


class Slotted:
    __slots__ = ("a", "b")


class Custom:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __reduce__(self):
        return (Custom, (self.x, self.y))


class Reduced:
    """Pickles only through the reducer passed to dumps (as an adapter's ``overmind_reducers`` would): if the
    table were not consulted, pickle would fail and dill would run, which the tests refuse."""

    def __init__(self, payload):
        self.payload = payload

    def __reduce_ex__(self, protocol):
        raise TypeError("Reduced pickles only through its Overmind reducer")


def _rebuild_reduced(payload):
    return Reduced(payload)


def _reduce_reduced(obj):
    return (_rebuild_reduced, (obj.payload,))


# --- strategies ---------------------------------------------------------------------------------------------

# Hypothesis draws the first of a list's choices more often than the others (the simplest): lists here begin
# with the more telling ones.
DTYPES = [torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8, torch.float32]
FLOATING = (torch.float32, torch.float16, torch.bfloat16)

HASHABLE = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5), st.binary(max_size=5), st.sampled_from(list(Color)),
    st.text(max_size=5).map(Tag), st.integers(-1000, 1000).map(Count))
KEYS = st.one_of(HASHABLE, st.tuples(HASHABLE, HASHABLE))
ATOMS = st.one_of(HASHABLE, st.binary(max_size=5).map(bytearray))


def _base_tensor(draw) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    n = 0 if draw(st.integers(0, 7)) == 7 else draw(st.integers(1, 12))
    itemsize = torch.empty(0, dtype=dtype).element_size()
    # Random bytes: every bit pattern (NaNs with payloads, -0.0, subnormals) is as likely as any other.
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    u8 = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=g)
    t = (u8 & 1).view(torch.bool) if dtype is torch.bool else u8.view(dtype)
    requires_grad = dtype in FLOATING and draw(st.sampled_from([True, False]))
    if draw(st.booleans()):
        t = torch.nn.Parameter(t, requires_grad=requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if requires_grad and draw(st.sampled_from([True, False])):
        t.grad = t.detach().flip(0).clone()
    if draw(st.sampled_from([False, True])):
        t.note = draw(HASHABLE)  # a Python attribute: the tensor's __dict__ travels as its state
    return t


def _view(draw, t: torch.Tensor) -> torch.Tensor:
    """A tensor sharing ``t``'s storage (through autograd when ``t`` requires grad: a non-leaf)."""
    ops = []
    if t.dim() >= 1 and t.shape[0] > 0:
        ops += ["slice", "select", "expand"]
    if t.dim() >= 2:
        ops += ["transpose"]
    if t.dim() == 1 and t.is_contiguous() and t.numel() >= 2:
        ops += ["matrix", "reinterpret"]
    if t.untyped_storage().nbytes() >= t.element_size() > 0:
        ops += ["as_strided"]
    op = draw(st.sampled_from(ops + ["detach"]))
    if op == "slice":
        n = t.shape[0]
        start = draw(st.integers(0, n - 1))
        return t[start:draw(st.integers(start, n)):draw(st.integers(1, 3))]
    if op == "select":
        return t[draw(st.integers(0, t.shape[0] - 1))]
    if op == "expand":
        return t[:1].expand(draw(st.integers(2, 3)), *t.shape[1:])
    if op == "transpose":
        return t.transpose(0, 1)
    if op == "matrix":
        n = t.numel()
        rows = draw(st.integers(1, n))
        cols = draw(st.integers(1, n // rows))
        m = t.narrow(0, draw(st.integers(0, n - rows * cols)), rows * cols).view(rows, cols)
        return m.t() if draw(st.booleans()) else m
    if op == "reinterpret":
        target = draw(st.sampled_from([d for d in DTYPES if d is not torch.bool]))
        try:
            return t.detach().view(target)
        except RuntimeError:  # sizes or offset that do not divide
            return t.detach()
    if op == "as_strided":
        elems = t.untyped_storage().nbytes() // t.element_size()
        size = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
        stride = [draw(st.integers(0, 3)) for _ in size]
        reach = sum((s - 1) * d for s, d in zip(size, stride))
        if reach < elems:
            return t.as_strided(size, stride, draw(st.integers(0, elems - 1 - reach)))
    return t.detach()


def _module(draw) -> torch.nn.Module:
    kind = draw(st.sampled_from(["linear", "sequential", "repeated", "tied"]))
    dims = [draw(st.integers(1, 3)) for _ in range(3)]

    def linear(i, o):
        return torch.nn.Linear(i, o, bias=draw(st.booleans()))

    if kind == "linear":
        m: torch.nn.Module = linear(dims[0], dims[1])
    elif kind == "sequential":
        layers = [linear(dims[0], dims[1]), torch.nn.ReLU()]
        if draw(st.booleans()):
            layers.append(torch.nn.BatchNorm1d(dims[1]))
        m = torch.nn.Sequential(*layers, linear(dims[1], dims[2]))
    elif kind == "repeated":
        one = linear(dims[0], dims[0])
        m = torch.nn.Sequential(one, torch.nn.ReLU(), one)  # one module at two places
    else:
        first, second = linear(dims[0], dims[0]), linear(dims[0], dims[0])
        second.weight = first.weight  # a tied weight
        m = torch.nn.Sequential(first, second)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    if draw(st.booleans()):
        m = m.to(draw(st.sampled_from([torch.float16, torch.bfloat16])))
    if draw(st.booleans()):
        m.requires_grad_(False)
    if draw(st.booleans()):
        m.eval()
    return m


def _value(draw, pool: list, depth: int = 0) -> Any:
    """An atom, an object of the pool (so referenced more than once), or a nested container of values."""
    branches = (["pool"] if pool else []) + ["atom"] + (["container"] if depth < 2 else [])
    branch = draw(st.sampled_from(branches))
    if branch == "atom":
        return draw(ATOMS)
    if branch == "pool":
        return pool[draw(st.integers(0, len(pool) - 1))]
    kind = draw(st.sampled_from(["list", "tuple", "dict", "set", "frozenset"]))
    size = draw(st.integers(0, 3))
    if kind == "set":
        return draw(st.sets(KEYS, max_size=size))
    if kind == "frozenset":
        return draw(st.frozensets(KEYS, max_size=size))
    if kind == "dict":
        return {draw(KEYS): _value(draw, pool, depth + 1) for _ in range(size)}
    items = [_value(draw, pool, depth + 1) for _ in range(size)]
    return items if kind == "list" else tuple(items)


def _pool_object(draw, pool: list) -> Any:
    tensors_so_far = [o for o in pool if isinstance(o, torch.Tensor)]
    kinds = ["tensor", "module", "plain", "list", "custom", "dict", "reduced", "slotted", "tuple", "set"]
    if tensors_so_far:
        kinds = ["view", "tensor", "parameter_over", "module", "view"] + kinds[2:]
    kind = draw(st.sampled_from(kinds))
    if kind == "tensor":
        return _base_tensor(draw)
    if kind == "view":
        return _view(draw, draw(st.sampled_from(tensors_so_far)))
    if kind == "parameter_over":  # a Parameter sharing another tensor's storage
        t = draw(st.sampled_from(tensors_so_far)).detach()
        return torch.nn.Parameter(t, requires_grad=t.dtype in FLOATING and draw(st.booleans()))
    if kind == "module":
        return _module(draw)
    if kind == "set":
        return draw(st.sets(KEYS, max_size=3))
    size = draw(st.integers(0, 3))
    if kind == "list":
        out: Any = [_value(draw, pool) for _ in range(size)]
        if draw(st.booleans()):
            out.append(out)  # a cycle
        return out
    if kind == "tuple":
        return tuple(_value(draw, pool) for _ in range(size))
    if kind == "dict":
        out = {draw(KEYS): _value(draw, pool) for _ in range(size)}
        if draw(st.booleans()):
            out["self"] = out
        return out
    if kind == "plain":
        out = Plain(**{name: _value(draw, pool) for name in draw(st.sets(st.sampled_from("abcd"), max_size=3))})
        if draw(st.booleans()):
            out.me = out
        return out
    if kind == "slotted":
        out = Slotted()
        for name in draw(st.sets(st.sampled_from(Slotted.__slots__))):
            setattr(out, name, _value(draw, pool))
        return out
    if kind == "custom":
        return Custom(_value(draw, pool), _value(draw, pool))
    return Reduced(_value(draw, pool))


_ARGUMENT_TYPES = (torch.Tensor, torch.nn.Module, Plain, Slotted, Custom, Reduced)


@dataclass
class Case:
    root: Any
    arguments: dict
    pool: list  # keeps every object alive (ids are compared)


@st.composite
def cases(draw, containers: bool) -> Case:
    """A graph and the call's arguments; ``containers``: at least one argument is a list or dict (which
    only the persistent_id pickler can see), else none is."""
    pool: list = [_base_tensor(draw)]  # a tensor first: later objects view it, hold it, wrap it
    for _ in range(draw(st.integers(0, 5))):
        pool.append(_pool_object(draw, pool))
        if isinstance(pool[-1], torch.nn.Module) and draw(st.booleans()):
            pool.append(next(pool[-1].parameters()))  # a module's parameter, also held outside it
    extra = [_value(draw, pool) for _ in range(draw(st.integers(0, 3)))]
    root = draw(st.permutations(pool + extra))
    arguments: dict = {}
    candidates = [o for o in pool if isinstance(o, _ARGUMENT_TYPES)]
    if candidates:
        for i, obj in enumerate(draw(st.lists(st.sampled_from(candidates), max_size=3))):
            arguments[f"obj{i}"] = obj  # the same object twice: an argument alias
    if draw(st.booleans()):
        arguments["steps"] = draw(HASHABLE)  # an atom: never substituted, pickled as it is
    if draw(st.booleans()):
        arguments["unused"] = torch.ones(2)
    if containers:
        held = [o for o in pool if type(o) in (list, dict)]
        choice = draw(st.sampled_from(["held", "list", "dict"] if held else ["list", "dict"]))
        if choice == "held":
            arguments["options"] = draw(st.sampled_from(held))
        elif choice == "list":
            arguments["parts"] = [draw(st.sampled_from(pool)) for _ in range(draw(st.integers(0, 3)))]
        else:
            arguments["named"] = {k: draw(st.sampled_from(pool)) for k in draw(st.sets(st.sampled_from("xyz")))}
    return Case(root, arguments, pool)


# --- arguments: where each was passed, and fresh ones of the same types -------------------------------------

_ATOM_TYPES = (type(None), bool, int, float, str, bytes, enum.Enum)


def _is_atom(value) -> bool:
    if isinstance(value, _ATOM_TYPES):
        return True
    return type(value) in (tuple, frozenset) and all(_is_atom(v) for v in value)


def _argument_paths(arguments: dict) -> dict[int, tuple]:
    """id of every object passed (looked for through lists, tuples and dicts) -> its first path."""
    paths: dict[int, tuple] = {}

    def visit(path, value):
        if _is_atom(value) or id(value) in paths:
            return
        paths[id(value)] = path
        if type(value) in (list, tuple):
            for i, v in enumerate(value):
                visit(path + (i,), v)
        elif type(value) is dict:
            for k, v in value.items():
                if type(k) in (str, int):
                    visit(path + (k,), v)

    for name, value in arguments.items():
        visit((name,), value)
    return paths


def _at(arguments: dict, path: tuple):
    obj = arguments[path[0]]
    for step in path[1:]:
        obj = obj[step]
    return obj


def _expected(original: dict, given: dict) -> dict[int, Any]:
    """id of each object passed in ``original`` -> the object ``given`` passes at that path."""
    return {ident: _at(given, path) for ident, path in _argument_paths(original).items()}


def _fresh(value, memo: dict) -> Any:
    """Another object of ``value``'s type (and containers of such), as a later caller would pass; objects
    passed twice stay one object."""
    if _is_atom(value):
        return value
    if id(value) in memo:
        return memo[id(value)]
    if type(value) is list:
        out: Any = []
        memo[id(value)] = out
        out.extend(_fresh(v, memo) for v in value)
        return out
    if type(value) is dict:
        out = {}
        memo[id(value)] = out
        out.update((k, _fresh(v, memo)) for k, v in value.items())
        return out
    if type(value) is tuple:
        out = tuple(_fresh(v, memo) for v in value)
    elif type(value) is torch.nn.Parameter:
        out = torch.nn.Parameter(torch.zeros_like(value.detach()), requires_grad=value.requires_grad)
    elif isinstance(value, torch.Tensor):
        out = torch.zeros_like(value.detach())
    elif type(value) is Reduced:
        out = Reduced(value.payload)
    else:
        out = copy.copy(value)  # modules, Plain, Slotted, Custom, sets, bytearrays
    assert out is not value
    memo[id(value)] = out
    return out


# --- pickling through a chosen pickler, rebuilding from the placed bytes ------------------------------------

_RAN: list[str] = []
_FAST, _PERSISTENT = pickling._FastPickler, pickling._CPickler


class _SpyFast(_FAST):
    def __init__(self, *args):
        _RAN.append("fast")
        super().__init__(*args)


class _SpyPersistent(_PERSISTENT):
    def __init__(self, *args):
        _RAN.append("persistent_id")
        super().__init__(*args)


@contextlib.contextmanager
def _pickler(mode: str):
    """``auto``: dumps chooses; ``persistent_id``: the persistent_id pickler even where the fast one would run."""
    fast = _SpyFast if mode == "auto" else _SpyPersistent
    with mock.patch.multiple(pickling, _FastPickler=fast, _CPickler=_SpyPersistent):
        yield


def _source(p: pickling.Pickled):
    """The placed storages' bytes laid out as the writer lays out a data region; each storage asked for is a
    fresh copy of its bytes (so two asks for one storage would give two storages)."""
    region = torch.zeros(p.data_len, dtype=torch.uint8)
    for storage, offset in p.storages:
        region[offset:offset + storage.nbytes()] = torch.empty(0, dtype=torch.uint8).set_(storage)

    def source(where, offset, nbytes):
        assert where is None, where  # nothing here lies in an entry mapping
        return region[offset:offset + nbytes].clone().untyped_storage()

    return source


def _reducers(tensor_reducer: bool) -> dict:
    table: dict = {Reduced: _reduce_reduced}
    if tensor_reducer:
        table.update(tensors.reducers())  # as hooks.reducers() gives; without it, torch's own reduce
    return table


def _roundtrip(case: Case, mode: str, reducers: dict, expect: list[str],
               fresh: dict) -> tuple[pickling.Pickled, Any, Any]:
    """One dump, and the graph rebuilt from it with the caller's own arguments and with ``fresh`` ones."""
    _RAN.clear()
    with _pickler(mode):
        p = pickling.dumps(case.root, reducers, arguments=case.arguments)
    assert (_RAN, p.pickler) == (expect, "pickle"), "the wrong pickler ran (or dill did)"
    source = _source(p)
    own = pickling.loads(p.skeleton, source, p.pickler, case.arguments, p.argument_aliases, p.argument_memo)
    other = pickling.loads(p.skeleton, source, p.pickler, fresh, p.argument_aliases, p.argument_memo)
    return p, own, other


# --- the comparison ------------------------------------------------------------------------------------------

_NO = object()


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _canon(x) -> Any:
    """A hashable stand-in for a set element, equal exactly when the elements are the same to a reader."""
    if type(x) is float:
        return (float, _bits(x))
    if type(x) is tuple:
        return (tuple, tuple(_canon(v) for v in x))
    return (type(x), x)


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def _value_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype).copy_(t.detach()).reshape(-1).view(torch.uint8)


class _Same:
    """Walks two graphs side by side and asserts they are the same: types, contents and bits at every node,
    one object for one object (a bijection over the objects with identity), and where ``left`` holds an
    argument, ``right`` holds ``expected[id(that argument)]`` itself (not looked into: the caller's).
    ``grads``: compare leaves' ``.grad`` too (only Overmind's tensor reducer keeps them; torch's reduce drops them)."""

    def __init__(self, expected: dict[int, Any], grads: bool):
        self.expected = expected
        self.grads = grads
        self.left: dict[int, Any] = {}  # id(left object) -> its right object
        self.right: dict[int, Any] = {}  # id(right object) -> its left object
        self.tuples: dict[int, Any] = {}
        self.tensors: list[tuple[torch.Tensor, torch.Tensor, str]] = []

    def _one_to_one(self, a, b, where) -> bool:
        """Registers a <-> b; True if a was met before (then b must be its counterpart again)."""
        met = self.left.get(id(a), _NO)
        if met is not _NO:
            assert met is b, f"{where}: one object in the original became two ({type(a).__name__})"
            return True
        assert id(b) not in self.right, f"{where}: two objects in the original became one ({type(a).__name__})"
        self.left[id(a)] = b
        self.right[id(b)] = a
        return False

    def same(self, a, b, where: str = "root") -> None:
        expected = self.expected.get(id(a), _NO)
        if expected is not _NO:
            assert b is expected, (f"{where}: the argument {type(a).__name__} came back as another object "
                                   f"({'a copy' if type(b) is type(a) else type(b).__name__}), not the one passed")
            self._one_to_one(a, b, where)
            return
        assert type(a) is type(b), f"{where}: {type(a).__name__} came back as {type(b).__name__}"
        if a is None or type(a) is bool or isinstance(a, enum.Enum):
            assert a is b, f"{where}: {a!r} came back as {b!r}"
            return
        if isinstance(a, (int, str, bytes)):
            assert a == b, f"{where}: {a!r} came back as {b!r}"
            if type(a) not in (int, str, bytes):
                self.same(vars(a), vars(b), where + ".__dict__")
            return
        if type(a) is float:
            assert _bits(a) == _bits(b), f"{where}: {a!r} came back as {b!r}"
            return
        if type(a) is tuple:
            met = self.tuples.get(id(a), _NO)
            if met is not _NO:
                assert met is b, f"{where}: one tuple in the original became two"
                return
            self.tuples[id(a)] = b
            assert len(a) == len(b), f"{where}: length {len(a)} came back as {len(b)}"
            for i, (x, y) in enumerate(zip(a, b)):
                self.same(x, y, f"{where}[{i}]")
            return
        if type(a) is frozenset:
            assert collections.Counter(map(_canon, a)) == collections.Counter(map(_canon, b)), where
            return
        if self._one_to_one(a, b, where):
            return
        if type(a) in (list, bytearray):
            assert len(a) == len(b), f"{where}: length {len(a)} came back as {len(b)}"
            for i, (x, y) in enumerate(zip(a, b)):
                self.same(x, y, f"{where}[{i}]")
        elif isinstance(a, dict):
            assert len(a) == len(b), f"{where}: {len(a)} keys came back as {len(b)}"
            for i, ((ka, va), (kb, vb)) in enumerate(zip(a.items(), b.items())):
                self.same(ka, kb, f"{where}.key{i}")
                self.same(va, vb, f"{where}[{ka!r}]")
        elif type(a) is set:
            assert collections.Counter(map(_canon, a)) == collections.Counter(map(_canon, b)), where
        elif isinstance(a, torch.Tensor):
            self._tensor(a, b, where)
        elif type(a) is Slotted:
            for name in Slotted.__slots__:
                assert hasattr(a, name) == hasattr(b, name), f"{where}.{name}: set on one side only"
                if hasattr(a, name):
                    self.same(getattr(a, name), getattr(b, name), f"{where}.{name}")
        elif isinstance(a, (torch.nn.Module, Plain, Custom, Reduced)):
            self.same(vars(a), vars(b), f"{where}.__dict__")
        else:  # the odd value a module's __dict__ holds
            assert a == b, f"{where}: {a!r} came back as {b!r}"

    def _tensor(self, a: torch.Tensor, b: torch.Tensor, where: str) -> None:
        meta = (a.dtype, tuple(a.shape), a.stride(), a.storage_offset(), a.requires_grad, a.device)
        back = (b.dtype, tuple(b.shape), b.stride(), b.storage_offset(), b.requires_grad, b.device)
        assert meta == back, f"{where}: tensor {meta} came back as {back}"
        assert torch.equal(_storage_bytes(a), _storage_bytes(b)), f"{where}: the storage's bytes differ"
        assert torch.equal(_value_bytes(a), _value_bytes(b)), f"{where}: the values differ"
        self.tensors.append((a, b, where))
        if self.grads and a.is_leaf:
            self.same(a.grad, b.grad, where + ".grad")
        self.same(vars(a), vars(b), where + ".__dict__")

    def storages_shared_alike(self) -> None:
        """Tensors share a storage on the right exactly when they do on the left."""
        seen = [(a, b, w) for a, b, w in self.tensors if a.untyped_storage().nbytes()]
        for i, (a1, b1, w1) in enumerate(seen):
            for a2, b2, w2 in seen[i + 1:]:
                left = a1.untyped_storage().data_ptr() == a2.untyped_storage().data_ptr()
                right = b1.untyped_storage().data_ptr() == b2.untyped_storage().data_ptr()
                assert left == right, (f"{w1} and {w2}: " + ("shared a storage, now two" if left else
                                                             "had two storages, now share one"))


def assert_rebuilt(original, rebuilt, expected: dict[int, Any], grads: bool) -> None:
    same = _Same(expected, grads)
    same.same(original, rebuilt)
    same.storages_shared_alike()


def _check(case: Case, mode: str, tensor_reducer: bool, expect: list[str],
           fresh: dict) -> tuple[pickling.Pickled, Any]:
    p, own, other = _roundtrip(case, mode, _reducers(tensor_reducer), expect, fresh)
    # properties 1, 2 and 3 (the caller's own arguments back)
    assert_rebuilt(case.root, own, _expected(case.arguments, case.arguments), tensor_reducer)
    # 3: the later caller's arguments, not the first caller's
    assert_rebuilt(case.root, other, _expected(case.arguments, fresh), tensor_reducer)
    return p, other


# --- the properties ------------------------------------------------------------------------------------------

@SETTINGS
@given(case=cases(containers=False), tensor_reducer=st.sampled_from([True, False]))
def test_both_picklers_rebuild_the_graph_and_agree(case, tensor_reducer):
    fresh = _fresh(case.arguments, {})
    fast, by_fast = _check(case, "auto", tensor_reducer, ["fast"], fresh)
    persistent, by_persistent_id = _check(case, "persistent_id", tensor_reducer, ["persistent_id"], fresh)
    # 4: the two rebuilds are the same graph, holding the same (fresh) argument objects; the two dumps place
    # the same bytes and name the same argument aliases (which loads checks)
    assert_rebuilt(by_fast, by_persistent_id, _expected(fresh, fresh), tensor_reducer)
    assert (fast.data_len, fast.argument_aliases) == (persistent.data_len, persistent.argument_aliases)


@SETTINGS
@given(case=cases(containers=True), tensor_reducer=st.sampled_from([True, False]))
def test_container_arguments_take_the_fast_pickler_and_both_picklers_agree(case, tensor_reducer):
    # Plain containers the call was given go into the fast pickler's memo: where the result holds one, the rebuild
    # holds this call's own (property 3, in _check), exactly as the persistent_id pickler's references do.
    held: list = []  # the containers the persistent_id pickler references: those the result holds
    reference = pickling.arguments_ref.ArgumentIndex.reference

    def spy(index, obj):
        pid = reference(index, obj)
        if pid is not None and type(obj) in (list, tuple, dict, set, frozenset, bytearray):
            held.append(pid[1])
        return pid

    fresh = _fresh(case.arguments, {})
    fast, by_fast = _check(case, "auto", tensor_reducer, ["fast"], fresh)
    with mock.patch.object(pickling.arguments_ref.ArgumentIndex, "reference", spy):
        persistent, by_persistent_id = _check(case, "persistent_id", tensor_reducer, ["persistent_id"], fresh)
    assert_rebuilt(by_fast, by_persistent_id, _expected(fresh, fresh), tensor_reducer)
    # "may refer" errs towards yes only: every container the result holds is marked, so it is resolved and checked
    may_refer = {tuple(path) for path, _type, may in fast.argument_memo if may}
    assert set(held) <= may_refer


def test_the_fast_pickler_serves_a_container_argument_held_or_not():
    # The blog's pipeline call: controlnet=[edge, depth] is a list the pipeline does not keep (it keeps the
    # modules, which are referenced); a result that keeps the list itself gets the caller's list back.
    edge, depth = torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)
    result = {"nets": torch.nn.ModuleList([edge, depth]), "w": torch.ones(3)}
    arguments = {"controlnet": [edge, depth], "config": {"a": 1}}
    for keeps in (False, True):
        if keeps:
            result["kept"] = arguments["controlnet"]
        _RAN.clear()
        with _pickler("auto"):
            p = pickling.dumps(result, _reducers(True), arguments=arguments)
        assert _RAN == ["fast"]
        assert [used for _p, _t, used in p.argument_memo] == [keeps, False]
        mine = {"controlnet": [edge, depth], "config": {"a": 1}}
        back = pickling.loads(p.skeleton, _source(p), p.pickler, mine, p.argument_aliases, p.argument_memo)
        assert back["nets"][0] is edge and back["nets"][1] is depth
        assert ("kept" in back) == keeps and (not keeps or back["kept"] is mine["controlnet"])


# --- OrderedDict: the fast pickler's own reduce (no copyreg._slotnames per instance) is the type's own, byte for byte

class _OrderedSub(collections.OrderedDict):
    """A subclass keeps the default reduce (its slot names are cached on it)."""


_names = st.sampled_from(["a", "b", "weight", "_modules", "x1"])


def _ordered(kind, items, attrs):
    od = (_OrderedSub if kind else collections.OrderedDict)(items)
    for name, value in attrs:
        setattr(od, name, value)  # an instance __dict__: the reduce's state
    return od


_ordered_graphs = st.recursive(
    st.none() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3)
    | st.builds(_ordered, st.booleans(), st.lists(st.tuples(_names, inner), max_size=4),
                st.lists(st.tuples(_names, inner), max_size=2)),
    max_leaves=12)


@SETTINGS
@given(graph=_ordered_graphs, share=st.booleans(), cycle=st.booleans())
def test_an_ordered_dict_pickles_to_the_bytes_of_its_own_reduce(graph, share, cycle):
    top = collections.OrderedDict(graph=graph)
    if share:
        top["again"] = graph  # a second reference: a memo hit either way
    if cycle:
        top["self"] = top
        top.me = top
    fast = pickling.dumps(top).skeleton
    with mock.patch.object(pickling, "_ordered_dict_reduce", lambda od: NotImplemented):  # the type's own reduce
        default = pickling.dumps(top).skeleton
    assert fast == default
    back = pickling.loads(fast, lambda *a: None)
    assert type(back) is collections.OrderedDict and list(back) == list(top)
    assert repr(back) == repr(top) if not cycle else back["self"] is back and back.me is back
