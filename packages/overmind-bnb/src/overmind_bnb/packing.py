"""4-bit weights in the layout bitsandbytes' CPU kernel runs with, published once and handed out on first use.

On a CPU with AVX512-BF16, ``Linear4bit.forward`` (bitsandbytes 0.50; eval mode, input without grad) calls
``_convert_weight_packed_for_cpu(weight.data, quant_state)`` once: it builds a new ``[N, K/2]`` weight and
rewrites the ``QuantState`` in place (absmax dequantized to a transposed bf16 tensor, ``nested`` off,
``state2`` deleted, ``original_*`` fields and ``packing_format_for_cpu`` added). Those are private
allocations: after one forward a cached model's 4-bit weights no longer lie in the entry, and N processes hold
N copies.

Publishing the repacked form *instead* would be visible: before its first forward a plain model has a
``(N*K/2, 1)`` weight and its original state; ``state_dict()`` saves that state (after a forward it saves
bitsandbytes' lossy inverse of the packing); a forward with grad (or in train mode) never repacks and
runs another kernel, with other logits. So the cached model keeps the plain model's form at every point:

- :func:`precomputed` (entered while the result is pickled): for each ``Linear4bit`` that its first forward
  would repack, run bitsandbytes' own conversion on a copy of its ``QuantState`` (the user's object is not
  touched) and put the results, ``(param, packed weight, attributes set, attributes deleted)``, in a marker
  on the root module, so the entry holds both forms;
- :func:`adopt` (after unpickling): take the marker off and remember, per ``QuantState``, the precomputed
  form together with a fingerprint of every input the conversion reads;
- the conversion itself is replaced (in ``bitsandbytes.nn.modules``, through the kit's ``patch_now``, so
  ``get_original`` answers) by :func:`convert`, which hands out the precomputed form, applying the same
  attribute changes in the same order, only when the weight and the state are provably what was converted at
  publish time: same tensors at the same addresses with the same dtype, shape, strides and view bits, every
  page still the entry's (copy-on-write untouched), every other attribute equal. Anything else, including
  every object that is not from an entry, runs bitsandbytes' function. The conversion is deterministic, so the
  result is bitwise what bitsandbytes would have built, now over shared memory.

The replacement is installed the first time a process rebuilds a cached model with precomputed forms, and
stays after ``overmind.deactivate()``: it serves objects that outlive activation, and for any other object it
only calls the original. The price is bytes in the entry: both layouts of each 4-bit weight (the packed one
plus bf16 absmax adds about 1.06x the weight's packed bytes), in exchange for one copy per machine instead of
one per process after the first forward.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import sys
import threading
import weakref

from overmind.adapter import (
    PatchTarget,
    get_original,
    in_cache_mapping,
    is_patched,
    logger,
    pages_untouched,
    patch_now,
    raise_users,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator, NamedTuple

    import torch

log = logger("overmind.bnb")  # imports logging when it first logs: activate() imports this module

MARKER = "_overmind_bnb_cpu_packed"
FUNCTION = "_convert_weight_packed_for_cpu"
_ABSENT = object()

__all__ = ["MARKER", "has_repackable", "precomputed", "adopt", "convert", "prepared_count"]


# owner: the weakref.ref to the QuantState this form is for; fingerprint: of (weight.data, quant_state) when
# adopted; keep: the input storages (their mappings stay put, so an equal address means the same memory); packed:
# the packed tensor; changes: attribute -> value, in the order bitsandbytes sets them; deleted: attributes removed.
if TYPE_CHECKING:
    class _Prepared(NamedTuple):
        owner: weakref.ref
        fingerprint: tuple
        keep: list
        packed: torch.Tensor
        changes: dict
        deleted: list
else:
    _Prepared = collections.namedtuple("_Prepared", ("owner", "fingerprint", "keep", "packed", "changes", "deleted"))


_lock = threading.Lock()
_prepared: dict[int, _Prepared] = {}  # id(QuantState) -> its precomputed form (QuantState is unhashable)


def _modules_namespace() -> Any:
    """The module whose global ``Linear4bit.forward`` looks the conversion up in, or ``None``."""
    bnb_nn = sys.modules.get("bitsandbytes.nn")
    linear4bit = getattr(bnb_nn, "Linear4bit", None)
    namespace = sys.modules.get(getattr(linear4bit, "__module__", ""), None)
    return namespace if callable(getattr(namespace, FUNCTION, None)) else None


def _original() -> Callable | None:
    namespace = _modules_namespace()
    return None if namespace is None else get_original(namespace, FUNCTION)


def _will_repack(module: Any) -> bool:
    """Whether ``module``'s first CPU forward would call the conversion (bitsandbytes' own condition, less the
    per-call parts: eval mode and an input without grad)."""
    bnb_nn = sys.modules["bitsandbytes.nn"]
    if not isinstance(module, bnb_nn.Linear4bit) or not getattr(module, "support_avx512bf16_for_cpu", False):
        return False
    weight = module.weight
    quant_state = getattr(weight, "quant_state", None)
    return (isinstance(weight, bnb_nn.Params4bit) and weight.device.type == "cpu" and quant_state is not None
            and not getattr(quant_state, "packing_format_for_cpu", False))


def has_repackable(root: Any) -> bool:
    """Whether a first forward of ``root`` would repack some 4-bit weight on this CPU."""
    return "bitsandbytes.nn" in sys.modules and any(_will_repack(m) for m in root.modules())


def _precompute(param: Any, original: Callable) -> tuple | None:
    """``(param, packed, changes, deleted)`` from running the conversion on a copy of the quant state."""
    quant_state = param.quant_state
    twin = object.__new__(type(quant_state))
    twin.__dict__.update(quant_state.__dict__)
    before = dict(twin.__dict__)
    import torch

    try:
        with torch.no_grad():
            packed, out = original(param.data, twin)
    except Exception as e:  # the plain model's forward raises the same; the cached one will run the same call
        raise_users(e)
        log.debug("overmind-bnb: not precomputing the CPU packing of a %s weight: %s", tuple(param.shape), e)
        return None
    if out is not twin:
        return None
    after = twin.__dict__
    changes = {k: v for k, v in after.items() if k not in before or before[k] is not v}
    deleted = [k for k in before if k not in after]
    return (param, packed, changes, deleted)


@contextlib.contextmanager
def precomputed(roots: list[Any]) -> Iterator[None]:
    """While inside, each root with repackable 4-bit layers carries ``MARKER = [(param, packed, changes,
    deleted), ...]``; the roots and everything they hold are otherwise unchanged."""
    taken: list[tuple[Any, Any]] = []
    original = _original() if "bitsandbytes.nn" in sys.modules else None
    try:
        if original is not None:
            seen: set[int] = set()
            for root in roots:
                forms = []
                for module in root.modules():
                    if _will_repack(module) and id(module.weight) not in seen:
                        seen.add(id(module.weight))
                        form = _pending(module.weight) or _precompute(module.weight, original)
                        if form is not None:
                            forms.append(form)
                if forms:
                    taken.append((root, root.__dict__.get(MARKER, _ABSENT)))
                    root.__dict__[MARKER] = forms
        yield
    finally:
        for root, old in reversed(taken):
            if old is _ABSENT:
                root.__dict__.pop(MARKER, None)
            else:
                root.__dict__[MARKER] = old


# --- the fingerprint of the conversion's inputs -----------------------------------------------------------

class _Unprovable(Exception):
    """An input cannot be shown to be what was converted at publish time."""


def _tensor_print(t: torch.Tensor, ranges: list, keep: list | None) -> tuple:
    import torch

    storage = t.untyped_storage()
    if t.device.type != "cpu" or t.layout is not torch.strided:
        raise _Unprovable("not a strided CPU tensor")
    if t.numel():
        start = storage.data_ptr() + t.storage_offset() * t.element_size()
        nbytes = storage.nbytes() - t.storage_offset() * t.element_size()
        if not in_cache_mapping(start):
            raise _Unprovable("a tensor outside the entry mappings")
        ranges.append((start, nbytes))
    if keep is not None:
        keep.append(storage)
    return ("tensor", type(t), t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), storage.data_ptr(),
            storage.nbytes(), t.is_conj(), t.is_neg())


@functools.lru_cache(maxsize=1)
def _simple_types() -> tuple[type, ...]:
    """Attribute types compared by value (torch is imported by then: a quantized weight exists)."""
    import torch

    return (type(None), bool, int, float, str, torch.dtype, torch.device, torch.Size)


def _value_print(value: Any, ranges: list, keep: list | None, depth: int = 0) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return _tensor_print(value, ranges, keep)
    if type(value) is float:  # by its bits: 0.0 == -0.0, and nan != nan
        return ("value", float, value.hex())
    if type(value) in _simple_types():
        return ("value", type(value), value)
    if isinstance(value, (tuple, list)) and depth < 4:
        return (type(value), tuple(_value_print(v, ranges, keep, depth + 1) for v in value))
    if type(value).__name__ == "QuantState" and depth < 4:  # state2 of a nested state
        return _state_print(value, ranges, keep, depth + 1)
    raise _Unprovable(f"an attribute of type {type(value).__qualname__}")


def _state_print(state: Any, ranges: list, keep: list | None, depth: int = 0) -> tuple:
    return (type(state), id(state), tuple((k, _value_print(v, ranges, keep, depth)) for k, v in vars(state).items()))


def _fingerprint(qweight: torch.Tensor, quant_state: Any, keep: list | None = None) -> tuple[tuple, list]:
    ranges: list = []
    return (_tensor_print(qweight, ranges, keep), _state_print(quant_state, ranges, keep)), ranges


# --- after unpickling, and at the first forward ------------------------------------------------------------

def adopt(root: Any) -> int:
    """Take ``root``'s marker off (an unpickled copy) and remember its precomputed forms; returns how many."""
    forms = root.__dict__.pop(MARKER, None)
    if not forms:
        return 0
    adopted = 0
    for param, packed, changes, deleted in forms:
        quant_state = param.quant_state
        keep: list = []
        try:
            fingerprint, ranges = _fingerprint(param.data, quant_state, keep)
        except _Unprovable as e:
            log.debug("overmind-bnb: the CPU packing of a cached weight is not used: %s", e)
            continue
        if not pages_untouched(ranges):
            continue
        key = id(quant_state)
        with _lock:
            # A C callback (dict.pop, the weak reference as its ignored default): no Python code of Overmind's runs
            # when the user's object dies, where a signal handler's exception would be lost (see ``raise_users``).
            _prepared[key] = _Prepared(weakref.ref(quant_state, functools.partial(_prepared.pop, key)), fingerprint,
                                       keep, packed, changes, deleted)
        adopted += 1
    if adopted:
        _install()
    return adopted


def prepared_count() -> int:
    """How many precomputed forms wait for their first forward in this process."""
    with _lock:
        return len(_prepared)


def _pending(param: Any) -> tuple | None:
    """The form adopted for ``param`` if it is still valid: a cached model passed on to another load (a nested
    ``from_pretrained``, ``text_encoder=model``) publishes the very same packed tensors, so the new entry
    references them instead of holding a second copy."""
    quant_state = param.quant_state
    with _lock:
        rec = _prepared.get(id(quant_state))
    if rec is None or rec.owner() is not quant_state or not _still_valid(rec, param.data, quant_state):
        return None
    return (param, rec.packed, rec.changes, rec.deleted)


def _still_valid(rec: _Prepared, qweight: Any, quant_state: Any) -> bool:
    try:
        fingerprint, ranges = _fingerprint(qweight, quant_state)
    except _Unprovable:
        return False
    return fingerprint == rec.fingerprint and pages_untouched(ranges)


def _take(qweight: Any, quant_state: Any) -> _Prepared | None:
    """The precomputed form for these inputs, removed from the registry, if they are provably unchanged."""
    with _lock:
        rec = _prepared.get(id(quant_state))
        if rec is None or rec.owner() is not quant_state:
            return None
        del _prepared[id(quant_state)]  # one use: after it the state has moved on (and a mismatch means it did)
    return rec if _still_valid(rec, qweight, quant_state) else None


def convert(qweight: torch.Tensor, quant_state: Any, *args: Any, **kwargs: Any) -> Any:
    """Stands in for bitsandbytes' ``_convert_weight_packed_for_cpu``; same arguments, same result."""
    original = _original()
    rec = None
    if not args and not kwargs:
        try:
            rec = _take(qweight, quant_state)
        except Exception as e:  # never break the user's forward: bitsandbytes' own function runs
            raise_users(e)
            log.debug("overmind-bnb: CPU packing lookup failed: %s", e)
    if rec is None:
        return original(qweight, quant_state, *args, **kwargs)
    for name in rec.deleted:
        delattr(quant_state, name)
    for name, value in rec.changes.items():
        setattr(quant_state, name, value)
    return rec.packed, quant_state


def _install() -> None:
    """Put :func:`convert` where ``Linear4bit.forward`` finds the conversion (idempotent)."""
    namespace = _modules_namespace()
    if namespace is None or is_patched(namespace, FUNCTION):
        return

    @functools.wraps(get_original(namespace, FUNCTION))
    def wrapper(qweight: torch.Tensor, quant_state: Any, *args: Any, **kwargs: Any) -> Any:
        return convert(qweight, quant_state, *args, **kwargs)

    patch_now(PatchTarget(namespace, FUNCTION, kind="replace", adapter="bnb", replacement=wrapper))
