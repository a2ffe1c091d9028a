"""Follow, during a miss in a process that has not seeded, the values a loader draws at random, and say whether its
result keeps any: a dispatch mode marks what draws write and what reads it, clears what the checkpoint overwrites,
and notes drawn values read into Python and draws it could not see.

:class:`Tracker` is a torch dispatch mode: it sees every tensor operation of the loader's thread below autograd. It
starts at the loader's first draw from torch's global CPU generator: until then nothing is drawn, so nothing needs
following, and a loader that draws nothing from it (a model built on the meta device, a generator of its own) runs
without the mode. A mode makes torch give every tensor an operator touches a Python object, which a tensor subclass
made from data (``Subclass([1, 2])``, as stable-fast's tracing makes) cannot take over. The first draw is seen where
Python calls torch's random functions (``torch.rand``, ``randn``, ``randint``, ``randperm``, ``normal``,
``bernoulli``, ``multinomial``, ``poisson``, ``*_like``, and ``Tensor.uniform_``, ``normal_`` and the other in-place
draws), wrapped while a tracker waits: one that moved the generator marks what it wrote and enters the mode. A draw
that starts elsewhere (inside a compiled function such as dropout) is not followed and breaks the chain below.

- An operation tagged ``nondeterministic_seeded`` (``uniform_``, ``normal_``, ``randn``, ``randperm``,
  ``bernoulli``, dropout, ...) writes drawn values: the bytes it writes are marked (:mod:`.taint`).
- Any other operation that reads a marked byte marks every byte it writes.
- An operation that overwrites a tensor without reading it (``copy_``, ``fill_``, ``zero_``, an ``out=`` argument)
  from unmarked inputs clears the bytes it covers: the checkpoint's values replacing the initial draws. A write
  to a tensor whose elements are not one dense block only adds marks, never clears.
- A marked value that reaches Python is kept: ``.item()`` and every operation that gives a Python number or a
  shape that depends on the values (``nonzero``, ``unique``), ``.tolist()``, ``.numpy()``, ``.data_ptr()`` and
  ``__dlpack__`` (wrapped on ``torch.Tensor`` from the first draw on). Inside ``torch.nn.init`` such reads are the
  routine's own rejection sampling, whose only effect is the tensor it fills and the generator.
- Every draw from the default CPU generator is checked against the generator's state: a draw this mode did not
  see (another thread, a path past the dispatcher) breaks the chain, and the verdict is then that draws may be kept.

:meth:`Tracker.verdict` at the end: ``None`` when no storage still alive holds a marked byte and no marked value
reached Python; otherwise why the result may keep a drawn value. Storages made on the ``meta`` device hold no
values and are not followed. Only the loader's thread is followed (dispatch modes are per thread); a draw made
elsewhere shows as a broken chain.
"""
from __future__ import annotations

import gc
import os
import re
import sys
import threading
from typing import Any, Iterator, NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from ..._util import interrupts
from .taint import Taint

# Files whose code reads the values it draws only to draw again into the same tensor (rejection sampling)
DRAW_ROUTINES = (os.path.join("torch", "nn", "init.py"),)
# operators whose Python-valued answer is of the tensors' metadata, not their values
_METADATA = re.compile(r"(?!is_nonzero$)(_?is_|sym_|_has_|_nnz$|dense_dim$|sparse_dim$|_debug_has_internal_overlap$"
                       r"|output_nr$|_version$|size$|stride$|numel$|dim$|storage_offset$)")
_OVERWRITE_SELF = frozenset({"copy_", "fill_", "zero_"})
_ESCAPES = ("numpy", "tolist", "data_ptr", "__dlpack__")
# where Python starts a draw: torch.Tensor's in-place draws, torch's functions that make drawn tensors
TENSOR_DRAWS = ("uniform_", "normal_", "random_", "bernoulli_", "exponential_", "geometric_", "log_normal_",
                "cauchy_")
TORCH_DRAWS = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson", "rand_like",
               "randn_like", "randint_like")
_active: list[Tracker] = []
_lock = threading.Lock()
# (torch.Tensor or torch, name): what the attribute was before its wrapper (None: torch.Tensor inherits it)
_draw_originals: dict[tuple[Any, str], Any] = {}  # the draws, wrapped while a tracker waits or runs
_read_originals: dict[tuple[Any, str], Any] = {}  # the reads, wrapped from the first draw on


class _Op(NamedTuple):
    """What the tracker needs of an operator's schema: whether it draws, which arguments it writes (by position
    and name) and whether it overwrites them without reading them, and whether its output says something of its
    input's values to Python."""

    draws: bool
    written: tuple[tuple[int, str, bool], ...]  # (position, name, overwritten without being read)
    to_python: bool


_ops: dict[Any, _Op] = {}


def _op(func: Any) -> _Op:
    op = _ops.get(func)
    if op is None:
        tags = getattr(func, "tags", ())
        draws = torch.Tag.nondeterministic_seeded in tags
        name = func._schema.name.split("::")[-1]
        written = tuple(
            (i, a.name, draws or a.kwarg_only or (i == 0 and name in _OVERWRITE_SELF))
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write)
        to_python = (name == "_local_scalar_dense" or torch.Tag.dynamic_output_shape in tags
                     or torch.Tag.data_dependent_output in tags
                     or (not _METADATA.match(name)
                         and any(not str(r.type).startswith("Tensor") for r in func._schema.returns)))
        op = _ops[func] = _Op(draws, written, to_python)
    return op


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v


class _Span(NamedTuple):
    key: int
    start: int
    stop: int
    dense: bool  # the tensor's elements fill [start, stop) exactly, once each


def _span(t: torch.Tensor) -> _Span | None:
    """The bytes of its storage ``t`` covers; None for a tensor without values (meta) or without a storage of its
    own to follow (sparse, nested, a wrapper subclass)."""
    if t.is_meta:
        return None
    storage = t.untyped_storage()
    size = t.element_size()
    start = int(t.storage_offset()) * size
    if t.numel() == 0:
        return _Span(storage._cdata, start, start, True)
    last = int(sum((n - 1) * s for n, s in zip(t.shape, t.stride())))
    dense = last + 1 == t.numel() and _non_overlapping(t)
    return _Span(storage._cdata, start, start + (last + 1) * size, dense)


def _non_overlapping(t: torch.Tensor) -> bool:
    expected = 1
    for s, n in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n != 1):
        if s != expected:
            return False
        expected *= n
    return True


class Tracker(TorchDispatchMode):
    """One miss's follower of drawn values (see the module doc). Use :func:`following`."""

    def __init__(self) -> None:
        super().__init__()
        self.taint = Taint()
        self.kept: str | None = None  # why a drawn value may be kept, found during the call
        self._chain = _cpu_state()  # the CPU generator's state after the last draw followed
        self.thread = threading.get_ident()
        self.entered = False

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's handler in torch._disable_dynamo, whose first call imports torch._dynamo (1.4 s, 800
        # modules, a warnings filter that resets every warning registry): a loader's plain call imports none of it
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        op = _op(func)
        if not op.draws and not self.taint:
            return func(*args, **kwargs)
        if op.draws:  # a draw elsewhere leaves the CPU generator as it was: the chain holds
            self._check_chain()
        out = func(*args, **kwargs)
        try:
            if op.draws:
                self._chain = _cpu_state()
            self._follow(func, op, args, kwargs, out)
        except Exception as e:
            interrupts.raise_users(e)
            self._keep(f"following {func} failed ({type(e).__name__}: {e})")
        return out

    def _check_chain(self) -> None:
        if _cpu_state() != self._chain:
            self._keep("torch's generator moved by draws this process could not follow (another thread, or a "
                       "path that does not go through torch's dispatcher)")

    def _follow(self, func: Any, op: _Op, args: tuple, kwargs: dict, out: Any) -> None:
        written: list[tuple[torch.Tensor, bool]] = []
        overwritten: set[int] = set()
        for i, name, overwrite in op.written:
            value = args[i] if i < len(args) else kwargs.get(name)
            for t in _tensors(value):
                written.append((t, overwrite))
                if overwrite:
                    overwritten.add(id(t))
        inputs = [(t, _span(t)) for a in (*args, *kwargs.values()) for t in _tensors(a)]
        drawn = op.draws or any(span is not None and self.taint.overlaps(span.key, span.start, span.stop)
                                for t, span in inputs if id(t) not in overwritten)
        for t, overwrite in written:
            span = _span(t)
            if span is None:
                continue
            if drawn:
                self._mark(t, span)
            elif overwrite and span.dense:
                self.taint.clear(span.key, span.start, span.stop)
        sources = {span.key for _, span in inputs if span is not None}
        for t in _tensors(out):
            span = _span(t)
            if span is None:
                if drawn and not t.is_meta:
                    self._keep(f"{func} made a tensor from drawn values that cannot be followed")
                continue
            if drawn and span.key not in sources:  # a new storage (a view of an input is marked as written)
                self._mark(t, span)
        if drawn and op.to_python and not op.draws and not _in_draw_routine():
            self._keep(f"a drawn value reached Python through {func}{_where()}")

    def _marked(self, t: torch.Tensor) -> bool:
        span = _span(t)
        return span is not None and self.taint.overlaps(span.key, span.start, span.stop)

    def _mark(self, t: torch.Tensor, span: _Span) -> None:
        self.taint.add(span.key, span.start, span.stop, lambda: StorageWeakRef(t.untyped_storage()))

    def _keep(self, why: str) -> None:
        if self.kept is None:
            self.kept = why

    def escaped(self, t: torch.Tensor, how: str) -> None:
        """``t`` is read outside the dispatcher (``how``): kept if it holds a drawn value."""
        try:
            if self.taint and self._marked(t) and not _in_draw_routine():
                self._keep(f"a drawn value reached Python through Tensor.{how}(){_where()}")
        except Exception as e:
            interrupts.raise_users(e)
            self._keep(f"a tensor read through Tensor.{how}() could not be followed ({type(e).__name__})")

    def verdict(self, result: Any = None) -> str | None:
        """Why the call's result may keep a drawn value; None when it keeps none (see the module doc)."""
        if self.kept is not None:
            return self.kept
        self._check_chain()
        if self.kept is not None:
            return self.kept
        if self.taint.live(StorageWeakRef.expired):
            gc.collect()  # a drawn tensor the loader dropped may wait in a reference cycle
            live = self.taint.live(StorageWeakRef.expired)
            if live:
                return f"its result keeps values drawn at random ({_named(result, set(live))})"
        return None


def following() -> Tracker:
    """A tracker waiting for the first draw of this thread: the caller runs the loader, then calls :func:`stop`."""
    tracker = Tracker()
    with _lock:
        if not _active:
            _wrap_draws()
        _active.append(tracker)
    return tracker


def stop(tracker: Tracker) -> None:
    """Leave ``tracker``'s mode if a draw started it (in the thread that entered it), and stop watching for it."""
    try:
        if tracker.entered:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            if _get_current_dispatch_mode() is tracker:
                tracker.__exit__(None, None, None)
            else:  # the loader left a mode of its own above this one: it stays, and this one with it
                tracker._keep("a dispatch mode the loader entered was still active when it returned")
    finally:
        with _lock:
            if tracker in _active:
                _active.remove(tracker)
            if not _active:
                _put_back(_draw_originals)
                _put_back(_read_originals)


def _waiting() -> list[Tracker]:
    """The trackers of this thread that no draw has started yet."""
    me = threading.get_ident()
    return [t for t in _active if t.thread == me and not t.entered]


def _started(waiting: list[Tracker], drawn: Any, before: bytes) -> None:
    """A draw outside any mode moved torch's generator from ``before``: mark what it wrote in each tracker that
    waited, then enter their modes (in the order they started: the outermost load's mode lies below its nested
    loads')."""
    with _lock:
        _wrap_escapes()
    after = _cpu_state()
    for tracker in waiting:
        if tracker._chain != before:
            tracker._keep("torch's generator moved by draws this process could not follow before the first one it "
                          "saw")
        for t in _tensors(drawn):
            span = _span(t)
            if span is not None:
                tracker._mark(t, span)
        tracker._chain = after
        tracker.entered = True
        tracker.__enter__()


def _wrap_draws() -> None:
    for owner, names in ((torch.Tensor, TENSOR_DRAWS), (torch, TORCH_DRAWS)):
        in_place = owner is torch.Tensor
        for name in names:
            original = getattr(owner, name, None)
            if original is None:
                continue

            def draw(*args: Any, _original: Any = original, _in_place: bool = in_place, **kwargs: Any) -> Any:
                waiting = _waiting() if _active else None
                if not waiting:
                    return _original(*args, **kwargs)
                # a draw from the meta device, from a generator the loader made or on another device leaves the
                # CPU generator where it was: it starts nothing
                before = _cpu_state()
                out = _original(*args, **kwargs)
                if _cpu_state() != before:
                    _started(waiting, args[0] if _in_place else out, before)
                return out

            _replace(owner, name, draw, _draw_originals)


def _wrap_escapes() -> None:
    if _read_originals:  # already, for another tracker
        return
    for how in _ESCAPES:
        original = getattr(torch.Tensor, how)

        def read(self: torch.Tensor, *args: Any, _how: str = how, _original: Any = original, **kwargs: Any) -> Any:
            for tracker in list(_active):
                tracker.escaped(self, _how)
            return _original(self, *args, **kwargs)

        _replace(torch.Tensor, how, read, _read_originals)


def _replace(owner: Any, name: str, wrapper: Any, originals: dict[tuple[Any, str], Any]) -> None:
    """Set ``owner.name`` to ``wrapper``, noting in ``originals`` what to put back (:func:`_put_back`)."""
    originals[(owner, name)] = owner.__dict__.get(name)
    wrapper.__name__ = name
    setattr(owner, name, wrapper)


def _put_back(originals: dict[tuple[Any, str], Any]) -> None:
    """Undo :func:`_replace` for every attribute noted in ``originals``."""
    for (owner, name), original in originals.items():
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    originals.clear()


def _cpu_state() -> bytes:
    return bytes(torch.default_generator.get_state().numpy())


def _in_draw_routine() -> bool:
    frame: Any = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(DRAW_ROUTINES):
            return True
        frame = frame.f_back
    return False


def _where() -> str:
    """`` (file:line)`` of the first frame outside torch and this module."""
    here = os.path.dirname(__file__)
    torch_dir = os.path.dirname(torch.__file__)
    frame: Any = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith((here, torch_dir)):
            return f" ({os.path.basename(name)}:{frame.f_lineno})"
        frame = frame.f_back
    return ""


def _named(result: Any, live: set[int]) -> str:
    """The names of ``result``'s parameters and buffers whose storages are in ``live`` (a module's), else a
    count."""
    names: list[str] = []
    if isinstance(result, torch.nn.Module):
        for name, t in (*result.named_parameters(), *result.named_buffers()):
            span = _span(t)
            if span is not None and span.key in live:
                names.append(name)
    if names:
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        return f"{shown}: not in the checkpoint?"
    return f"{len(live)} tensor storage(s) made during the call"
