"""TorchScript modules in the cache: pickled as one archive storage, rebuilt without copying it.

TorchScript modules cannot be pickled attribute by attribute (their state lives in C++), so the reducer
serializes the whole module into a ZIP archive held in a ``torch.UntypedStorage``. The core pickler then
treats that storage like any other: it goes out of band into shared memory, and a later load hands the
mapped storage to :func:`rebuild_script_module`, which imports the module straight from the mapping via
:func:`overmind.native.zerocopy.script_module_from_storage`.

The archive uses the torch.package layout (``torch._C.ScriptModuleSerializer``), not the ``torch.jit.save``
layout: there every tensor record has a key unique in the archive (``.data/<n>.storage``), which lets the
compiled importer hand each record to the unpickler as a storage aliasing the mapping, so the module's
parameters share the cached memory instead of being copied. ``torch.jit.save``'s layout reuses record
keys between its two pickles and cannot be served that way.

Records need not be re-packed: torch's ZIP writer already stores tensor records uncompressed
(ZIP_STORED) at 64-byte aligned offsets, which is what aliasing needs; re-packing with ``zipfile`` would
lose the alignment. Only the small code records are deflated, and those are parsed, not aliased.

>>> table = reducers()                    # merged into the pickler's reducer table by entries/pickling.py
>>> fn, args = table[torch.jit.ScriptModule](scripted)
>>> clone = fn(*args)                     # what unpickling does, with args[0] mapped from shared memory
"""
from __future__ import annotations

import io
from typing import Any, Callable

import torch

from ..native import zerocopy

__all__ = ["reducers", "reduce_script_module", "rebuild_script_module", "archive_storage"]

# The id of the one module in each archive; torch.package numbers modules, one archive holds one.
_MODULE_ID = 0


def archive_storage(module: torch.jit.ScriptModule) -> torch.UntypedStorage:
    """Serialize ``module`` into a torch.package layout TorchScript archive held in a CPU storage.

    Tensors on any device, including ones already mapped from shared memory, are written as copies into
    the archive (the serializer reads them; it never writes to them).
    """
    stream = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(stream)
    serializer = torch._C.ScriptModuleSerializer(writer)
    serializer.serialize(module._c, _MODULE_ID)
    serializer.write_files()
    writer.write_end_of_file()  # the central directory; without it the archive cannot be read
    del serializer, writer
    # getbuffer() is a writable view of the BytesIO's own memory: no further copy, and the storage keeps
    # the BytesIO alive through the view.
    return zerocopy.storage_from_buffer(stream.getbuffer())


def _device_of(module: torch.jit.ScriptModule) -> str:
    """The device of the module's tensors: ``"cpu"`` when it has none, ``""`` when they are on several."""
    devices = {str(t.device) for t in (*module.parameters(), *module.buffers())}
    if not devices:
        return "cpu"
    return devices.pop() if len(devices) == 1 else ""


def reduce_script_module(module: torch.jit.ScriptModule) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Pickle reducer: ``(rebuild_script_module, (archive storage, device string))``.

    The device string is the module's single device (``"cpu"``, ``"cuda:0"``), or ``""`` when its tensors
    lie on several devices; the archive itself records each tensor's device either way.
    """
    return rebuild_script_module, (archive_storage(module), _device_of(module))


def rebuild_script_module(storage: torch.UntypedStorage, device: str = "cpu") -> torch.jit.ScriptModule:
    """Unpickle counterpart of :func:`reduce_script_module`: import the module from its archive storage.

    ``storage`` may also be the ``TypedStorage(uint8)`` wrapper the core unpickler gives for every storage.

    Tensors return to the device they had when saved; on CPU they alias ``storage`` when the compiled
    extension is active (the twin copies them).
    """
    if isinstance(storage, torch.storage.TypedStorage):  # the core unpickler hands storages back typed
        storage = storage._untyped_storage
    # A mixed-device module ("") needs no map_location: the archive names every tensor's device.
    return zerocopy.script_module_from_storage(storage, map_location=device or None)


def reducers() -> dict[type, Callable[[Any], tuple[Callable[..., Any], tuple[Any, ...]]]]:
    """The reducers this module contributes to the core pickler, keyed by the type they apply to.

    ``torch.jit.ScriptModule`` covers scripted modules (``RecursiveScriptModule``) and traced ones
    (``TopLevelTracedModule``, ``TracedModule``) through the pickler's MRO lookup.
    """
    return {torch.jit.ScriptModule: reduce_script_module}
