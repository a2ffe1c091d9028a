"""Zero-copy views of memory as torch storages, TorchScript modules imported from such storages, the tensor rebuild
an entry's ``rebuild_from_untyped`` resolves to, and the provenance walk and fingerprint: ``overmind.native._C`` or
the pure-Python twin (``OVERMIND_ZEROCOPY``).

Two implementations with one signature each, markupsafe style:

* ``c``: the compiled extension ``overmind.native._C`` (``csrc/``), built at install time when torch is present,
  or by ``overmind build-native`` for another torch (:mod:`.extension` says which serves);
* ``python``: the pure-Python twin below, always available.

``OVERMIND_ZEROCOPY=python`` forces the twin, ``OVERMIND_ZEROCOPY=c`` requires the extension (an import of
this module then fails loudly if it is missing), unset picks the extension when it imports and records why
not otherwise. ``describe()`` reports the choice for ``overmind doctor``.

>>> import mmap
>>> from overmind import zerocopy
>>> mm = mmap.mmap(-1, 4096)
>>> storage = zerocopy.storage_from_buffer(memoryview(mm)[64:128])   # data_ptr == address of mm + 64
>>> del mm                                                            # the storage keeps the mapping alive

What is and is not copied by ``script_module_from_storage`` (see ``entries/torchscript.py`` for the writer):

* archive bytes: the ``c`` path reads the ZIP through a read adapter over the storage's memory, never
  copying the archive; the twin copies the archive once into ``bytes``.
* tensor records: the ``c`` path serves every uncompressed (ZIP_STORED) tensor record of a torch.package
  layout archive as a storage aliasing the archive memory, so parameters share the caller's mapping; the
  twin copies each record. A plain ``torch.jit.save`` archive also loads, but its tensor records are copied
  on both paths (its two pickles reuse the same record keys, so they cannot be pre-supplied by name).
* code, pickles and debug records are small and parsed into new objects on both paths.
"""
from __future__ import annotations

import ctypes
import io
import re
from types import SimpleNamespace
from typing import Any, Callable

import torch

from .._util.quiet_warnings import quiet
from ..errors import OvermindError
from . import tensors

__all__ = [
    "storage_from_buffer",
    "storage_from_buffer_range",
    "script_module_from_storage",
    "tensor_rebuild",
    "provenance_walk",
    "provenance_digest",
    "tensor_walk",
    "stack_room",
    "describe",
    "IMPLEMENTATION",
    "ExtensionUnavailable",
]

ENV = "OVERMIND_ZEROCOPY"

# The torch.package layout keeps each module's pickles under .data/ts_code/<id>/ and every tensor record
# under .data/<key>.storage with keys unique across the module's pickles.
_PACKAGE_PICKLE = re.compile(r"^\.data/ts_code/(?!code/)([^/]+)/data\.pkl$")


class ExtensionUnavailable(OvermindError, ImportError):
    """``OVERMIND_ZEROCOPY=c`` asked for the compiled extension, and it does not import."""


# --------------------------------------------------------------------------------------------------
# The pure-Python twin
# --------------------------------------------------------------------------------------------------


def _py_storage_from_buffer(buf: Any) -> torch.UntypedStorage:
    """Twin of ``overmind.native._C.storage_from_buffer``: ``torch.frombuffer`` keeps a reference to ``buf``."""
    view = memoryview(buf)  # TypeError for a non-buffer, as PyObject_GetBuffer gives in C
    if not view.c_contiguous:
        raise BufferError(f"overmind: cannot view a non-contiguous buffer (strides {view.strides}) as one "
                          "storage; pass a contiguous slice.")
    nbytes = view.nbytes
    view.release()
    if nbytes == 0:
        # torch.frombuffer refuses an empty buffer; an empty storage needs no memory to keep alive.
        return torch.UntypedStorage(0)
    with quiet():
        # A read-only buffer is accepted on purpose (both paths do); torch warns about it on every call. (Not
        # catch_warnings: it swaps every thread's filters and makes each module's registry forget what it showed.)
        return torch.frombuffer(buf, dtype=torch.uint8).untyped_storage()


def _ranged(whole: Callable[[Any], torch.UntypedStorage]) -> Callable[[Any, int, int], torch.UntypedStorage]:
    """``storage_from_buffer_range`` made of a ``storage_from_buffer`` and a slice: the Python twin's, and the
    compiled one's where an extension built before ``_C.storage_from_buffer_range`` is in use."""

    def storage_from_buffer_range(buf: Any, offset: int, nbytes: int) -> torch.UntypedStorage:
        view = memoryview(buf)
        if nbytes < 0:
            nbytes = view.nbytes - offset
        if offset < 0 or nbytes < 0 or offset > view.nbytes or nbytes > view.nbytes - offset:
            raise ValueError(f"overmind: bytes [{offset}, +{nbytes}) lie outside the buffer's {view.nbytes} bytes")
        return whole(view.cast("B")[offset:offset + nbytes])

    return storage_from_buffer_range


def _storage_bytes(storage: torch.UntypedStorage) -> bytes:
    """Copy a CPU storage's bytes (the twin's one copy of a TorchScript archive)."""
    if isinstance(storage, torch.TypedStorage):
        storage = storage.untyped()
    if not isinstance(storage, torch.UntypedStorage):
        raise TypeError(
            f"overmind: script_module_from_storage expects a torch.UntypedStorage, got {type(storage).__name__}."
        )
    if storage.device.type != "cpu":
        raise ValueError(
            f"overmind: a TorchScript archive must be held in a CPU storage, got one on {storage.device}; "
            "move it with storage.cpu() first."
        )
    return ctypes.string_at(storage.data_ptr(), storage.nbytes()) if storage.nbytes() else b""


def _package_ts_id(records: list[str]) -> str | None:
    """The module id of a torch.package layout archive, or None for a plain ``torch.jit.save`` archive."""
    ids = [m.group(1) for m in map(_PACKAGE_PICKLE.match, records) if m]
    if len(ids) > 1:
        raise ValueError(
            f"overmind: the TorchScript archive holds {len(ids)} modules ({', '.join(sorted(ids))}); "
            "script_module_from_storage reads archives of exactly one module, as entries/torchscript.py writes them."
        )
    return ids[0] if ids else None


def _py_script_module_from_storage(
    storage: torch.UntypedStorage, map_location: Any = None
) -> torch.jit.ScriptModule:
    """Twin of the compiled import: copies the archive into bytes and lets torch read it from there."""
    from torch.jit._recursive import wrap_cpp_module
    from torch.jit._serialization import validate_map_location

    device = validate_map_location(map_location)
    stream = io.BytesIO(_storage_bytes(storage))
    reader = torch._C.PyTorchFileReader(stream)
    ts_id = _package_ts_id(reader.get_all_records())
    if ts_id is None:
        stream.seek(0)
        return torch.jit.load(stream, map_location=device)
    cu = torch._C.CompilationUnit()
    context = torch._C.DeserializationStorageContext()
    return wrap_cpp_module(torch._C._import_ir_module_from_package(cu, reader, context, device, ts_id))


_PYTHON = SimpleNamespace(
    storage_from_buffer=_py_storage_from_buffer,
    storage_from_buffer_range=_ranged(_py_storage_from_buffer),
    script_module_from_storage=_py_script_module_from_storage,
    tensor_rebuild=tensors.rebuild_from_untyped,
    provenance_walk=None,  # overmind.keys.provenance walks in Python
    provenance_digest=None,  # overmind.keys.provenance keeps its Python form
    tensor_walk=None,  # overmind.entries.estimate walks in Python
    stack_room=None,  # unknown: deepstack pickles on a helper thread
    dict_marks=None,  # overmind.loading.writes.marks digests in Python
    module_scan=None,  # overmind.loading.writes.watched scans in Python
)


# --------------------------------------------------------------------------------------------------
# The compiled implementation (thin wrappers over overmind.native._C)
# --------------------------------------------------------------------------------------------------


def _compiled(ext: Any) -> SimpleNamespace:
    """Wrap the extension's functions in the public signatures."""

    def script_module_from_storage(
        storage: torch.UntypedStorage, map_location: Any = None
    ) -> torch.jit.ScriptModule:
        from torch.jit._recursive import wrap_cpp_module
        from torch.jit._serialization import validate_map_location

        device = validate_map_location(map_location)
        return wrap_cpp_module(ext.script_module_from_storage(storage, None if device is None else str(device)))

    return SimpleNamespace(
        storage_from_buffer=ext.storage_from_buffer,
        # an extension built before it had this function slices the buffer for its storage_from_buffer
        storage_from_buffer_range=getattr(ext, "storage_from_buffer_range", None) or _ranged(ext.storage_from_buffer),
        script_module_from_storage=script_module_from_storage,
        # the common tensor built in C, every other call handed to the Python function (csrc/tensor_rebuild.cpp);
        # an extension built before it had this function rebuilds every tensor in Python
        tensor_rebuild=(ext.tensor_rebuilder(tensors.rebuild_from_untyped) if hasattr(ext, "tensor_rebuilder")
                        else tensors.rebuild_from_untyped),
        provenance_walk=getattr(ext, "provenance_walk", None),  # csrc/provenance_walk.cpp; older builds: None
        provenance_digest=getattr(ext, "provenance_digest", None),  # csrc/provenance_digest.cpp; older builds: None
        tensor_walk=getattr(ext, "tensor_walk", None),  # csrc/tensor_walk.cpp; older builds: None
        stack_room=getattr(ext, "stack_room", None),  # csrc/stack_room.cpp; older builds: None
        # csrc/dict_marks.cpp; older builds: None
        dict_marks=(ext.dict_marks, ext.dict_prefix_digest) if hasattr(ext, "dict_marks") else None,
        module_scan=getattr(ext, "module_scan", None),  # csrc/module_scan.cpp; older builds: None
    )


# --------------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------------

_impl: SimpleNamespace = _PYTHON
IMPLEMENTATION = "python"
_reason = "not selected yet"
_extension_path: str | None = None


def _select(name: str | None = None) -> str:
    """Pick the implementation: ``"c"``, ``"python"``, or ``None`` to follow ``OVERMIND_ZEROCOPY``.

    Internal: the test suite uses it to run every test against both. Returns the active name.
    """
    global _impl, IMPLEMENTATION, _reason, _extension_path
    if name is None:
        from ..settings import current, quiet

        with quiet():  # selected at import: a bad value warns at the user's first load, not at an import line
            name = current().zerocopy  # a bad value reads as "auto"
    requested = name
    if requested not in ("c", "python", "auto"):
        raise ValueError(
            f"overmind: {ENV}={requested!r} is not a zero-copy implementation; use 'c', 'python', or unset it."
        )
    ext, how = None, ""
    if requested != "python":
        from . import extension

        ext, how = extension.load()  # the installed one if built for this torch, else one built for it
    _extension_path = getattr(ext, "__file__", None)
    if requested == "c" and ext is None:
        raise ExtensionUnavailable(
            f"overmind: {ENV}=c requires the compiled extension overmind.native._C for this torch, and there is "
            f"none ({how}). Build it with 'overmind build-native' (torch and a C++20 compiler must be present), "
            f"or unset {ENV} to use the pure-Python twin."
        )
    if ext is None:
        _impl, IMPLEMENTATION = _PYTHON, "python"
        _reason = f"{ENV}=python" if requested == "python" else how
    else:
        _impl, IMPLEMENTATION = _compiled(ext), "c"
        _reason = f"{ENV}=c: {how}" if requested == "c" else how
    return IMPLEMENTATION


def describe() -> dict[str, Any]:
    """What ``overmind doctor`` prints: ``{"active": "c"|"python", "reason": str, "extension_path": str|None}``."""
    return {"active": IMPLEMENTATION, "reason": _reason, "extension_path": _extension_path}


# --------------------------------------------------------------------------------------------------
# Public API: stable functions that dispatch, so a later _select() reaches callers that imported them
# --------------------------------------------------------------------------------------------------


def storage_from_buffer(buf: Any) -> torch.UntypedStorage:
    """A CPU ``torch.UntypedStorage`` over ``buf``'s memory, without copying it.

    ``buf`` is any C-contiguous buffer: a memoryview (slice) of an ``mmap``, an ``mmap``, a ``bytearray``.
    The storage's ``data_ptr()`` is the buffer's address and it holds a reference to the buffer's owner, so
    the mapping stays valid after the caller drops every reference of its own. A 0-byte buffer gives an
    empty storage that holds nothing. Writable buffers are expected: a read-only one is accepted, but an
    in-place write through the storage then writes memory Python considers immutable (or, for a read-only
    mapping, kills the process with SIGSEGV); map copy-on-write (``mmap.ACCESS_COPY``) instead.

    >>> s = storage_from_buffer(bytearray(b"abcd"))
    >>> torch.empty(0, dtype=torch.uint8).set_(s).tolist()
    [97, 98, 99, 100]
    """
    return _impl.storage_from_buffer(buf)


def storage_from_buffer_range(buf: Any, offset: int, nbytes: int) -> torch.UntypedStorage:
    """:func:`storage_from_buffer` over bytes ``[offset, offset + nbytes)`` of ``buf`` (``nbytes < 0``: to its end),
    without a slice object per storage (a mapped entry's storages: ~0.3 MiB of memoryviews in a warm blog
    process). Raises ``ValueError`` for a range outside the buffer."""
    return _impl.storage_from_buffer_range(buf, offset, nbytes)


def tensor_rebuild() -> Any:
    """What an entry's ``overmind.native.tensors.rebuild_from_untyped`` resolves to when it is unpickled: that function,
    or (``c``) a compiled one with its signature and results that builds the common tensor (a CPU
    ``UntypedStorage``, no state, no gradient, no torch-function mode) without Python frames and hands every
    other call to it unchanged."""
    return _impl.tensor_rebuild


def stack_room() -> int | None:
    """Bytes of C stack the calling thread has left below this call (``csrc/stack_room.cpp``), or ``None`` when
    that is unknown: the ``python`` implementation, or bounds the C library does not report."""
    fn = _impl.stack_room
    room = fn() if fn is not None else -1
    return room if room >= 0 else None


def provenance_walk() -> Any:
    """The compiled walk behind ``overmind.keys.provenance.snapshot`` (``csrc/provenance_walk.cpp``), or ``None`` when
    the ``python`` implementation is active: provenance then walks in Python. Both build equal snapshots."""
    return _impl.provenance_walk


def provenance_digest() -> Any:
    """The compiled compact form behind ``overmind.keys.provenance.fingerprint`` (``csrc/provenance_digest.cpp``), or
    ``None`` when the ``python`` implementation is active: a record then keeps the snapshot's Python form."""
    return _impl.provenance_digest


def tensor_walk() -> Any:
    """The compiled walk behind ``overmind.entries.estimate.storages`` (``csrc/tensor_walk.cpp``), or ``None`` when the
    ``python`` implementation is active: the estimate then walks in Python. Both find the same tensors."""
    return _impl.tensor_walk


def dict_marks() -> Any:
    """``(marks, prefix_digest)`` compiled (``csrc/dict_marks.cpp``), or ``None`` when the ``python`` implementation
    is active: ``overmind.loading.writes.marks`` then digests in Python."""
    return _impl.dict_marks


def module_scan() -> Any:
    """The compiled scan of a module's globals for containers (``csrc/module_scan.cpp``), or ``None`` when the
    ``python`` implementation is active: ``overmind.loading.writes.watched`` then scans in Python."""
    return _impl.module_scan


def script_module_from_storage(storage: torch.UntypedStorage, map_location: Any = None) -> torch.jit.ScriptModule:
    """Import the TorchScript archive held in a CPU storage; ``map_location`` as in ``torch.jit.load``.

    ``storage`` is a ``torch.UntypedStorage`` (a ``TypedStorage`` wrapping one is accepted too).

    Accepts a plain ``torch.jit.save`` archive or the torch.package layout that ``entries/torchscript.py`` writes;
    see the module docstring for what each implementation copies.
    """
    return _impl.script_module_from_storage(storage, map_location)


_select()
