"""Read-only shared twins of this process's entry mappings (with a CUDA build of torch), registered with the CUDA
driver on their first copy to a GPU, so that a copy of a hit's weights runs by DMA from the one shared copy; a
storage with a written page is never read from its twin (``OVERMIND_PINNED_COPIES``).

A hit's tensors live in a ``MAP_PRIVATE`` mapping (:mod:`.reader`): copy-on-write, so an in-place write by the user
stays private. Such memory is pageable, and a copy to a GPU from it goes through the driver's staging buffers (at a
fraction of the rate pinned memory moves at: docs/architecture.md, "Measured costs"). Pinning that private mapping
is wrong whichever way the kernel takes it: either the pin breaks copy-on-write for every page (a private copy of
the weights in each process: the sharing is gone), or it pins the page-cache pages, and a later write by the user
lands in a new private page that the DMA never reads (the GPU gets the old bytes).

So a mapping gets a *twin*: a ``MAP_SHARED``, ``PROT_READ`` mapping of the same sealed memfd or checkpoint file
(one ``mmap`` call; no page until touched). Its pages are the file's own, shared by every process, and no write
through this process can replace them, so pinning it read-only (``cudaHostRegisterReadOnly``) keeps the sharing
and never goes stale. A copy to a GPU reads a storage's bytes from the twin only where the storage's private
pages are pristine (:mod:`.pagemap`: absent, or the file's own page): there both views hold the same bytes. A
storage with a written page is copied from its private pages, as plain torch copies it.

A twin is registered with the driver on the first copy that uses it (CUDA is in use by then; Overmind never
initialises CUDA itself), once, and unregistered when its private mapping is freed (the last storage over it
gone). Where registration fails (no CUDA device, the driver refuses read-only registration), that twin is not
used and the copy is the plain pageable one; the reason is logged once.

>>> twins.attach(mapping, fd, size)             # reader.py, when a hit maps an entry (if twins.enabled())
>>> twins.pinned_storages([storage, ...])       # {storage.data_ptr(): the twin's storage}, registered
"""
from __future__ import annotations

import bisect
import ctypes
import threading
import weakref
from typing import Any, NamedTuple

import torch

from .. import settings
from .._util import interrupts
from .._util.lazy_logger import logger
from ..native import zerocopy
from . import fdless, pagemap

log = logger("overmind")

# cudaHostRegisterPortable | cudaHostRegisterReadOnly: usable from every device's context; pinned without
# write access, so the kernel keeps the shared page-cache pages.
_REGISTER_FLAGS = 0x01 | 0x08


class _Twin:
    __slots__ = ("start", "end", "twin", "twin_address", "view", "private", "registered", "refusal")

    def __init__(self, start: int, size: int, twin: Any, private: Any):
        self.start, self.end = start, start + size
        self.twin = twin
        probe = ctypes.c_char.from_buffer(twin)
        self.twin_address = ctypes.addressof(probe)
        del probe
        self.view = memoryview(twin)
        self.private = weakref.ref(private)  # the private mmap: the twin lives as long as it does
        self.registered = False
        self.refusal: str | None = None


class TwinState(NamedTuple):
    """What :func:`state` reports: twins alive in this process, and how many of them are registered."""

    twins: int
    registered: int
    registered_bytes: int


_lock = threading.Lock()
_starts: list[int] = []
_twins: dict[int, _Twin] = {}
_refusals_logged: set[str] = set()


def enabled() -> bool:
    """Whether hits get twins: the setting is on, torch is a CUDA build, and mappings can be made without fds."""
    return settings.current().pinned_copies and torch.backends.cuda.is_built() and fdless.FDLESS


def attach(private_mm: Any, address: int, fd: int, size: int) -> bool:
    """Give the private mapping ``private_mm`` (at ``address``, ``size`` bytes of ``fd``) a read-only shared twin;
    False where it cannot (that mapping's copies stay pageable). Never raises for that."""
    if size <= 0:
        return False
    try:
        twin = fdless.map_shared_readonly(fd, size)
    except OSError as exc:
        interrupts.raise_users(exc)
        _log_refusal(f"a read-only shared mapping could not be made ({exc})")
        return False
    entry = _Twin(address, size, twin, private_mm)
    with _lock:
        _sweep()
        if address not in _twins:
            bisect.insort(_starts, address)
        _twins[address] = entry
    return True


def any_live() -> bool:
    """Whether this process holds a twin (cheap: the copy path skips its work when none)."""
    return bool(_twins)


def pinned_storages(storages: list[torch.UntypedStorage]) -> dict[int, torch.UntypedStorage]:
    """For each CPU storage lying wholly in a twinned mapping with every page pristine: ``data_ptr`` -> a storage
    over the same bytes in the registered twin. Storages not found, written to, or in a twin the driver refused
    are left out (their copy is the plain one). Registers twins on their first use here."""
    with _lock:
        _sweep()
        found: list[tuple[torch.UntypedStorage, _Twin]] = []
        for s in storages:
            ptr, nbytes = s.data_ptr(), s.nbytes()
            if nbytes == 0 or s.device.type != "cpu":
                continue
            twin = _holding(ptr)
            if twin is not None and ptr + nbytes <= twin.end:
                found.append((s, twin))
    if not found or not pagemap.all_pristine([(s.data_ptr(), s.nbytes()) for s, _ in found]):
        # One written page anywhere (or pagemap unreadable) sends every storage through the per-storage check.
        found = [(s, t) for s, t in found if pagemap.is_pristine(s.data_ptr(), s.nbytes())]
    out: dict[int, torch.UntypedStorage] = {}
    for s, twin in found:
        if not _ensure_registered(twin):
            continue
        lo = s.data_ptr() - twin.start
        out[s.data_ptr()] = zerocopy.storage_from_buffer_range(twin.view, lo, s.nbytes())
    return out


def state() -> TwinState:
    with _lock:
        _sweep()
        live = list(_twins.values())
    registered = [t for t in live if t.registered]
    return TwinState(len(live), len(registered), sum(t.end - t.start for t in registered))


def sweep() -> None:
    """Unregister and unmap the twins of mappings freed since (their pinned pages are released at once)."""
    if _twins:
        with _lock:
            _sweep()


def _holding(ptr: int) -> _Twin | None:
    i = bisect.bisect_right(_starts, ptr) - 1
    if i < 0:
        return None
    twin = _twins[_starts[i]]
    return twin if ptr < twin.end and twin.private() is not None else None


def _ensure_registered(twin: _Twin) -> bool:
    if twin.registered:
        return True
    if twin.refusal is not None:
        return False
    try:
        code = cuda_host_register(twin.twin_address, twin.end - twin.start)
        refusal = None if code == 0 else f"cudaHostRegister(read-only) returned error {code}"
    except Exception as exc:  # no CUDA device, no CUDA runtime library loaded
        interrupts.raise_users(exc)
        refusal = f"cudaHostRegister could not be called ({type(exc).__name__}: {exc})"
    if refusal is not None:
        twin.refusal = refusal
        _log_refusal(refusal)
        return False
    twin.registered = True
    return True


_cudart_lib: Any = None


def _cudart() -> Any:
    """The CUDA runtime library torch loaded (ctypes): found in this process's mappings after CUDA's start."""
    global _cudart_lib
    if _cudart_lib is None:
        torch.cuda.init()  # what the copy this serves does first; raises where there is no device
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libcudart" in line and ".so" in line}
        if not paths:
            raise OSError("no CUDA runtime library (libcudart) is mapped in this process")
        lib = ctypes.CDLL(sorted(paths)[0])
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        for fn in (lib.cudaHostRegister, lib.cudaHostUnregister, lib.cudaGetLastError):
            fn.restype = ctypes.c_int
        _cudart_lib = lib
    return _cudart_lib


def cuda_host_register(address: int, size: int, flags: int = _REGISTER_FLAGS) -> int:
    """``cudaHostRegister(address, size, flags)``'s error code (0: registered). A failure is also cleared from
    the runtime's last error, which torch's next kernel-launch check would otherwise raise in the user's code."""
    lib = _cudart()
    code = lib.cudaHostRegister(ctypes.c_void_p(address), size, flags)
    if code != 0:
        lib.cudaGetLastError()
    return int(code)


def cuda_host_unregister(address: int) -> int:
    lib = _cudart()
    code = lib.cudaHostUnregister(ctypes.c_void_p(address))
    if code != 0:
        lib.cudaGetLastError()
    return int(code)


def _sweep() -> None:
    """Unregister and unmap the twins whose private mapping is gone (the caller holds ``_lock``)."""
    for start in [s for s, t in _twins.items() if t.private() is None]:
        twin = _twins[start]
        if twin.registered:
            try:
                cuda_host_unregister(twin.twin_address)
            except Exception as exc:
                interrupts.raise_users(exc)
            twin.registered = False
        try:
            twin.view.release()
            twin.twin.close()
        except BufferError:
            continue  # a twin storage is still alive (a copy in flight holds it): freed on a later sweep
        del _twins[start]
        del _starts[bisect.bisect_left(_starts, start)]


def _log_refusal(reason: str) -> None:
    if reason not in _refusals_logged:
        _refusals_logged.add(reason)
        log.info("copies to the GPU from cached weights stay pageable: %s", reason)
