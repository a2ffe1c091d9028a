"""Provenance: a module or tensor returned by an earlier load is keyed by that entry while it provably still is what
the rebuild produced (torch-free at import; the rebuild hands it the config describer).

``vae = AutoencoderKL.from_pretrained(...)`` then ``Pipeline.from_pretrained(..., vae=vae)``: hashing the
vae's weights on every call would cost as much as loading them, so a module or tensor rebuilt from entry
``E`` is keyed as ``("entry", E)``, but only while it is exactly what the rebuild produced:

- the same tensors at the same places (``vae.decoder.conv.weight`` is still the tensor that was there, not
  one swapped in from elsewhere), each in its original mapping with its original dtype, shape, stride,
  offset, class, device and ``requires_grad``, and its pages untouched since the mapping was made
  (``/proc/self/pagemap``: a private copy-on-write page means it was written);
- the same module tree (the same submodule objects, and the class and ``training`` flag of each);
- for a module with a ``config``, the same config content (as the function the rebuild passed to
  :func:`remember_origin` describes it: the key's own description, so this module imports no key code).

``vae.half()``, ``vae.to("cuda")``, ``p.data.add_(1)``, a replaced parameter, ``vae.train()`` or an edited
config all end that: the object is then keyed by content, or not at all.

The loader's own result of a first load that left a mark (admission by reuse) is keyed by the call's key the same
way when its storages are untouched private mappings of checkpoint files (an fp16 safetensors load without
conversion), the files checked by identity (device, inode, size, mtime, ctime) and the pages by pagemap as an
entry's file references are (``shm/filemaps.py``), but for at most :data:`OWN_BYTES_DIGESTED` of storages of its
own (buffers its constructor computed, BERT's ``position_ids``), checked by a digest of their bytes. So the pipeline
given that vae has the key it has in a process whose vae came from the entry, and its next load publishes. A
result with more bytes of its own (converted on load) is keyed by content. Only modules and tensors are
tracked; any other result (a tokenizer, a pipeline) is keyed by its content every time.
"""
from __future__ import annotations

import collections
import functools
import itertools
import marshal
import struct
import sys
import threading
import weakref
from typing import Any, Callable

from ..errors import Unkeyable

_lock = threading.Lock()
# id -> (weak reference, entry key, fingerprint form, what the form needs alive, describe_config, the file ids of its
# storages for a loader's own result (None: rebuilt from an entry, its storages in entry mappings))
_origins: dict[int, tuple[weakref.ref, str, Any, Any, Callable[[Any], Any], tuple[str, ...] | None]] = {}


def _tensor_row(t: Any) -> tuple:
    s = t.untyped_storage()
    return (type(t), s.data_ptr(), s.nbytes(), t.dtype, t.shape, t.stride(), t.storage_offset(), t.requires_grad,
            t.is_conj(), t.is_neg(), t.device)


# Types of module attributes known not to be tensors (dicts, sets, bools, ints, configs...): a module's __dict__
# is scanned for tensor attributes with one C-level superset test against this, not an isinstance per value
# (isinstance against torch.Tensor goes through its metaclass: ~0.2 us a value, 4 ms a pipeline).
_not_tensor_types: set[type] = set()


def _loose_tensors(d: dict, tensor_type: type) -> tuple:
    """``(name, tensor)`` of the tensors among a module's plain attributes (not parameters or buffers)."""
    if _not_tensor_types.issuperset(map(type, d.values())):
        return ()
    found = []
    for k, v in d.items():
        t = type(v)
        if t in _not_tensor_types:
            continue
        if isinstance(v, tensor_type):
            found.append((k, v))
        elif type(t) is type and not any("__class__" in vars(b) for b in t.__mro__[:-1]):
            # a plain class (no metaclass, no __class__ override) answers isinstance by its type alone
            _not_tensor_types.add(t)
    return tuple(found)


def tracked(obj: Any) -> bool:
    """Whether :func:`remember_origin` would track ``obj`` (a torch module or tensor)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, (torch.Tensor, torch.nn.Module))


def snapshot(obj: Any, describe_config: Callable[[Any], Any]) -> Any:
    """What :func:`origin_of` compares against later; ``None`` if ``obj`` is not tracked.

    A module's snapshot lists, module by module in tree order, the class, ``training``, hook counts, child
    names and objects, and the names and objects of its parameters (with whether ``.grad`` is None), buffers and tensor
    attributes; then a :func:`_tensor_row` for each of those tensors, in the same order. It reads the module
    dicts directly: this runs for every module a load returns and again each time the result is passed to
    another load. The walk is compiled where ``overmind.native._C`` is (~1 us a module instead of ~3 us in Python).
    ``describe_config(config)`` gives a module's config in comparable form, or raises ``Unkeyable``.
    """
    import torch

    from ..native import zerocopy

    tensor_type = torch.Tensor
    if isinstance(obj, tensor_type):
        return ("tensor", _tensor_row(obj), getattr(obj, "_grad", None) is None, bool(obj.__dict__))
    if not isinstance(obj, torch.nn.Module):
        return None
    walk = zerocopy.provenance_walk()
    if walk is not None:  # the same lists, built in C (csrc/provenance_walk.cpp)
        modules, rows = walk(obj, tensor_type, torch.nn.Parameter, _not_tensor_types, _loose_tensors, _tensor_row)
    else:
        modules, rows = _walk(obj, tensor_type)
    return ("module", modules, rows, _config_form(obj, describe_config))


def _walk(obj: Any, tensor_type: type) -> tuple[list, list]:
    """``(modules, rows)`` of a module tree, the snapshot's body; ``csrc/provenance_walk.cpp`` is its compiled twin
    (keep them in step: ``tests/keys/test_provenance_walk.py`` compares them)."""
    modules, tensors = [], []
    seen: set[int] = set()
    stack = [obj]
    while stack:  # pre-order, children in order, each module once: the order of obj.modules()
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        d = m.__dict__
        params, buffers, children = d["_parameters"], d["_buffers"], d["_modules"]
        prow: list | tuple = ()
        brow: list | tuple = ()
        lrow: list | tuple = ()
        if params:
            ps = [(k, v) for k, v in params.items() if v is not None]
            prow = [(k, id(v), v.grad is None) for k, v in ps]
            tensors += [v for _, v in ps]
        if buffers:
            bs = [(k, v) for k, v in buffers.items() if v is not None]
            brow = [(k, id(v)) for k, v in bs]
            tensors += [v for _, v in bs]
        loose = _loose_tensors(d, tensor_type)
        if loose:
            lrow = [(k, id(v)) for k, v in loose]
            tensors += [v for _, v in loose]
        modules.append((type(m), m.training, tuple(children), tuple(map(id, children.values())),
                        len(d["_forward_hooks"]), len(d["_forward_pre_hooks"]), prow, brow, lrow))
        if children:
            stack.extend(c for c in reversed(children.values()) if c is not None)
    # One comprehension, no call per tensor: the fields of _tensor_row.
    rows = [(type(t), (s := t.untyped_storage()).data_ptr(), s.nbytes(), t.dtype, t.shape, t.stride(),
             t.storage_offset(), t.requires_grad, t.is_conj(), t.is_neg(), t.device) for t in tensors]
    return modules, rows


def _config_form(module: Any, describe_config: Callable[[Any], Any]) -> Any:
    config = getattr(module, "config", None)
    if config is None:
        return None
    exact = _exact_config_form(config)
    if exact is not None:
        return exact
    try:
        return ("described", describe_config(config))
    except Unkeyable:
        # A new object each time: sequences compare their items by identity first, so one shared marker would
        # make two snapshots of an undescribable config equal; two of these never are (see __eq__).
        return _UnknownType()


_plain_dict_types: dict[type, bool] = {}


def _exact_config_form(config: Any) -> tuple | None:
    """A diffusers-style config (a dict, or a dict subclass without slots, whose items and attributes are all
    of exact builtin types) as ``marshal`` version 0 writes it, else ``None``.

    marshal refuses any other type (subclasses included), and version 0 writes no references and no interning
    marks, so two such configs give equal bytes exactly when their content is equal, value types included
    (``1``, ``1.0`` and ``True`` differ). That is all the comparison needs, at ~5 us a config instead of
    ~0.7 ms for ``describe_config`` (the key's canonical form, which also fingerprints the files its paths
    name: a file changed on disk does not change the module, so it need not be looked at here).
    """
    t = type(config)
    plain = _plain_dict_types.get(t)
    if plain is None:
        plain = _plain_dict_types[t] = isinstance(config, dict) and not any(
            "__slots__" in vars(b) for b in t.__mro__ if b not in (dict, collections.OrderedDict, object))
    if not plain:
        return None
    try:
        attrs = marshal.dumps(dict(vars(config)), 0) if t is not dict else b""
        return ("exact", t, marshal.dumps(dict(config), 0), attrs)
    except (ValueError, TypeError):  # a value marshal does not write: not a plain config
        return None


class _UnknownType:
    def __eq__(self, other):
        return False

    def __repr__(self):
        return "<config not describable>"



def _ranges(shot: Any) -> list[tuple[int, int]]:
    """The (address, nbytes) of every storage a snapshot lists that has bytes."""
    rows = [shot[1]] if shot[0] == "tensor" else shot[2]
    return [(row[1], row[2]) for row in rows if row[2]]  # a storage off the CPU is in no mapping: not pristine


def _still_mapped(ranges: list[tuple[int, int]]) -> bool:
    """Every storage lies in a live entry mapping and its pages are untouched."""
    from ..shm import mappings, pagemap

    if not mappings.contain_all([p for p, _ in ranges]):
        return False  # moved to a GPU, converted, or replaced by a tensor from elsewhere
    return pagemap.all_pristine(ranges)


def fingerprint(obj: Any, describe_config: Callable[[Any], Any]) -> tuple[Any, Any, list[tuple[int, int]]] | None:
    """``(form, held, ranges)`` of a tracked object, ``None`` for any other: ``form`` is what a record keeps and
    compares (equal exactly when two :func:`snapshot` calls would be, or stricter), ``held`` what the record keeps
    alive for that comparison to stay exact, ``ranges`` the ``(address, nbytes)`` of its tensors' storages.

    A module's form is built in one pass in C where ``overmind.native._C`` is (``csrc/provenance_digest.cpp``: the
    walk's reads as bytes, ~4x faster than a snapshot and its :func:`_kept` form, which the ``python``
    implementation keeps).
    """
    from ..native import zerocopy

    digest = zerocopy.provenance_digest()
    torch = sys.modules.get("torch")
    if digest is not None and torch is not None and isinstance(obj, torch.nn.Module):
        body, values, rows, held, packed = digest(obj, torch.Tensor, torch.nn.Parameter, _not_tensor_types,
                                                  _loose_tensors, _tensor_row)
        flat = iter(struct.unpack(f"{len(packed) // 8}Q", packed))
        ranges = [*zip(flat, flat), *((row[1], row[2]) for row in rows if row[2])]
        return ("module-digest", body, values, rows, _config_form(obj, describe_config)), held, ranges
    shot = snapshot(obj, describe_config)
    if shot is None:
        return None
    return _kept(shot), None, _ranges(shot)


# Types, dtypes and devices of kept snapshots, each with the number that stands for it there. Held for the life of
# the process, so no number ever stands for two objects and no object dies while a record names it (a few dozen).
_tokens: dict[Any, int] = {}
_next_token = itertools.count()


def _token(obj: Any) -> int:
    found = _tokens.get(obj)
    # count() is atomic, and setdefault keeps the first number stored: two threads racing for one new object both
    # get the same number, and a number drawn but not stored is never used.
    return found if found is not None else _tokens.setdefault(obj, next(_next_token))


def _kept(shot: Any) -> Any:
    """What a record keeps of a module snapshot, compared instead of the snapshot: equal exactly when the snapshots
    hold equal values of equal types (never looser than ``==`` on the snapshots; stricter only where a value kept
    its value but changed its type), in ~a quarter of the memory (~0.5 MiB less in a warm blog process).

    The modules and tensor rows become one ``marshal`` version 0 string (no references or interning marks: equal
    bytes exactly when the values and their types are equal, ``1``, ``1.0`` and ``True`` apart), with each type,
    dtype and device replaced by its :func:`_token`: a dict lookup compares them as the tuple comparison did, by
    ``==`` (identity for types and dtypes, value for devices). A snapshot that holds something else (an unhashable
    type, a ``str`` subclass as a name) is kept whole; a tensor's snapshot is kept as it is.
    """
    if shot is None or shot[0] != "module":
        return shot
    _, modules, rows, config = shot
    t = _token
    try:
        mods = [(t(m[0]), *m[1:]) for m in modules]
        # type, data_ptr, nbytes, dtype, shape (a torch.Size: marshal takes exact tuples), stride, offset,
        # requires_grad, conj, neg, device
        tensor_rows = [(t(r[0]), r[1], r[2], t(r[3]), tuple(r[4]), *r[5:10], t(r[10])) for r in rows]
        return ("module-kept", marshal.dumps((mods, tensor_rows), 0), config)
    except (TypeError, ValueError):
        return shot


def remember_origin(obj: Any, key: str, describe_config: Callable[[Any], Any], *, in_files: bool = False) -> None:
    """Record that ``obj`` was just rebuilt from the entry with ``key``. Other objects are not tracked.
    ``describe_config`` describes a module's config, now and in every later :func:`origin_of` check. ``in_files``:
    ``obj`` is what the loader of ``key`` returned, tracked only where its storages all lie untouched in checkpoint
    files."""
    made = fingerprint(obj, describe_config)
    if made is None:
        return
    files = _file_ids(made[2]) if in_files else None
    if in_files and files is None:
        return
    try:
        # The callback is C (dict.pop, the weak reference as its ignored default): no Python code of Overmind's
        # runs when the user's object dies, where a signal handler's exception would be lost (_util/interrupts.py).
        # An id is reused only after its object's callbacks ran, so the pop never takes a newer object's record.
        ref = weakref.ref(obj, functools.partial(_origins.pop, id(obj)))
    except TypeError:
        return
    with _lock:
        _origins[id(obj)] = (ref, key, made[0], made[1], describe_config, files)


def origin_of(obj: Any) -> str | None:
    """The key of the entry ``obj`` still provably is, else ``None`` (then it is keyed by content)."""
    with _lock:
        rec = _origins.get(id(obj))
    if rec is None or rec[0]() is not obj:
        return None
    _, key, kept, _held, describe_config, files = rec
    now = fingerprint(obj, describe_config)
    if now is None or now[0] != kept:
        return None
    if not (_still_mapped(now[2]) if files is None else _file_ids(now[2]) == files):
        return None
    return key


OWN_BYTES_DIGESTED = 16 << 20


def _file_ids(ranges: list[tuple[int, int]]) -> tuple[str, ...] | None:
    """For each range, the file entry id (the file's identity) where it lies in an untouched private mapping of a
    file, else a digest of its bytes; None where those other ranges hold more than :data:`OWN_BYTES_DIGESTED`."""
    import ctypes
    import hashlib

    from ..shm.filemaps import FileMaps

    maps = FileMaps()
    ids, own = [], 0
    for ptr, nbytes in ranges:
        found = maps.locate(ptr, nbytes)
        if found is not None:
            ids.append(found.file_id)
            continue
        own += nbytes
        if own > OWN_BYTES_DIGESTED:
            return None
        ids.append("bytes-" + hashlib.blake2b((ctypes.c_char * nbytes).from_address(ptr), digest_size=20).hexdigest())
    return tuple(ids)


__all__ = ["remember_origin", "origin_of", "snapshot", "fingerprint"]
