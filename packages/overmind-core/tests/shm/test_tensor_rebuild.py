"""The compiled tensor rebuild (``csrc/tensor_rebuild.cpp``) against the Python ``tensors.rebuild_from_untyped``.

An entry names ``overmind.native.tensors.rebuild_from_untyped``; when the extension is built, the unpickler resolves that
name to a compiled function that builds the common tensor itself and hands every other call to the Python
function. Generated calls (dtypes, shapes, strides, offsets, flags, state, a gradient, arguments of odd types,
out-of-range storage views) are made to both, under no mode, ``no_grad``, ``inference_mode``, a torch-function
mode (``torch.device``) and a dispatch mode that records every operator: the results must be indistinguishable
(type, metadata, memory, autograd state, version counter, attributes; or the same error), and the same
operators must reach the dispatcher in the same order.
"""
from __future__ import annotations

import contextlib
import io
import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from overmind.entries import pickling
from overmind.native import tensors, zerocopy

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]
STORAGE_BYTES = 4096


@pytest.fixture(scope="module")
def compiled(compiled_function):
    return compiled_function("tensor_rebuilder")(tensors.rebuild_from_untyped)


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


MODES = ["none", "no_grad", "inference", "device_meta", "record"]


@contextlib.contextmanager
def mode(name: str, recorder: Recorder | None = None):
    if name == "none":
        yield
    elif name == "no_grad":
        with torch.no_grad():
            yield
    elif name == "inference":
        with torch.inference_mode():
            yield
    elif name == "device_meta":
        with torch.device("meta"):
            yield
    else:
        with recorder:
            yield


def describe(t):
    """Everything a user can observe of a rebuilt tensor (or of the error its rebuild raised)."""
    if isinstance(t, BaseException):
        return ("error", type(t), str(t))
    out = [type(t), t.dtype, t.device, tuple(t.shape), t.stride(), t.storage_offset(), t.requires_grad, t.is_leaf,
           t.grad_fn, t.is_inference(), t._is_view(), dict(t.__dict__), t.untyped_storage().data_ptr(),
           t.untyped_storage().nbytes(), t.is_contiguous()]
    out.append(None if t.is_inference() else t._version)
    out.append(None if t.grad is None else (t.grad.data_ptr(), tuple(t.grad.shape)))
    if t.device.type == "cpu" and t.numel():
        dense = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach())  # fresh strides, whatever t's are
        out.append(dense.view(-1).view(torch.uint8).tolist() if t.dtype != torch.bool else dense.tolist())
    return tuple(out)


def call(fn, args, name):
    recorder = Recorder() if name == "record" else None
    try:
        with mode(name, recorder):
            result = fn(*args)
    except Exception as exc:  # noqa: BLE001 - compared below
        result = exc
    return describe(result), (recorder.ops if recorder else None)


@st.composite
def rebuild_args(draw, storage):
    dtype = draw(st.sampled_from(DTYPES))
    item = torch.empty(0, dtype=dtype).element_size()
    ndim = draw(st.integers(0, 4))
    size = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    stride = tuple(draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim)))
    offset = draw(st.integers(0, STORAGE_BYTES // item + draw(st.sampled_from([0, 0, 0, 64]))))  # some past the end
    floating = dtype.is_floating_point or dtype.is_complex
    is_parameter = draw(st.booleans())
    requires_grad = draw(st.booleans()) and (floating or draw(st.booleans()))  # an int with grad: an error
    state = draw(st.sampled_from([None, None, None, {}, {"tag": "kept"}]))
    args = [storage, dtype, offset, size, stride, requires_grad, is_parameter, state]
    # today's entries pass a gradient (or None) and the version counter; older ones stop at state, or add a gradient
    form = draw(st.sampled_from(["versioned", "versioned", "versioned", "eight", "nine"]))
    grad = (torch.zeros(size, dtype=dtype) if floating and draw(st.integers(0, 4)) == 0 else None)
    if form == "versioned":
        args += [grad, draw(st.sampled_from([None, 0, 1, 7, 2**40, -1, True, 1.0, tensors.INFERENCE]))]
    elif form == "nine":
        args.append(grad)
    odd = draw(st.sampled_from(["", "", "", "", "list_size", "big_offset", "bool_offset", "int_flag",
                                "short", "typed_storage"]))
    if odd == "":
        pass
    elif odd == "list_size":
        args[3] = list(size)
    elif odd == "big_offset":
        args[2] = 1 << 70
    elif odd == "bool_offset":
        args[2] = True
    elif odd == "int_flag":
        args[6] = int(is_parameter)
    elif odd == "short":
        args = args[:draw(st.sampled_from([7, 9]))]
    elif odd == "typed_storage":
        args[0] = torch.storage.TypedStorage(wrap_storage=storage, dtype=torch.uint8, _internal=True)
    return args


STORAGE = torch.UntypedStorage(STORAGE_BYTES)
STORAGE.copy_(torch.randint(0, 256, (STORAGE_BYTES,), dtype=torch.uint8).untyped_storage())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=rebuild_args(STORAGE), name=st.sampled_from(MODES))
def test_the_compiled_rebuild_is_indistinguishable_from_the_python_one(compiled, args, name):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated; both calls see the same warning
        expected = call(tensors.rebuild_from_untyped, args, name)
        got = call(compiled, args, name)
    assert got == expected


def test_every_dtype_takes_the_compiled_path_and_matches(compiled):
    for dtype in DTYPES + [torch.float8_e4m3fn, torch.complex128, torch.int16]:
        for is_parameter in (False, True):
            args = [STORAGE, dtype, 3, (2, 3), (3, 1), is_parameter and dtype.is_floating_point, is_parameter, None]
            assert call(compiled, args, "record") == call(tensors.rebuild_from_untyped, args, "record")


def resolved_rebuild():
    """What an entry's ``overmind.native.tensors.rebuild_from_untyped`` resolves to when the unpickler reads it."""
    unpickler = pickling._CUnpickler(io.BytesIO(b""), lambda pid: None)
    return unpickler.find_class("overmind.native.tensors", "rebuild_from_untyped")


def test_the_unpickler_resolves_the_rebuild_to_the_selected_implementation(impl):
    got = resolved_rebuild()
    assert got is zerocopy.tensor_rebuild()
    if impl == "python":
        assert got is tensors.rebuild_from_untyped
    else:
        assert got is not tensors.rebuild_from_untyped and got.__name__ == "rebuild_from_untyped"


def test_a_pickled_parameter_round_trips_through_either_rebuild(impl):
    p = torch.nn.Parameter(torch.arange(12.0).view(3, 4).t())
    data = pickle.dumps(tensors.reduce_tensor(p)[1][1:])  # the reduce's arguments past the storage
    reduced = tensors.reduce_tensor(p)
    rebuild = resolved_rebuild()
    got = rebuild(p.untyped_storage(), *pickle.loads(data))
    assert reduced[0] is tensors.rebuild_from_untyped
    assert type(got) is torch.nn.Parameter and got.requires_grad and got.is_leaf
    assert (got.shape, got.stride(), got.data_ptr()) == (p.shape, p.stride(), p.data_ptr())


def test_an_extension_built_before_the_compiled_rebuild_leaves_the_python_one():
    from types import SimpleNamespace

    older = SimpleNamespace(storage_from_buffer=lambda buf: None, script_module_from_storage=lambda *a: None)
    assert zerocopy._compiled(older).tensor_rebuild is tensors.rebuild_from_untyped


def _made_in_inference_mode(kind: str) -> torch.Tensor:
    with torch.inference_mode():
        base = torch.arange(12.0).view(3, 4)
        if kind == "tensor":
            return base
        if kind == "view":
            return base.t()[1:]
        return torch.nn.Parameter(base, requires_grad=kind == "parameter")


@pytest.mark.parametrize("kind", ["tensor", "view", "parameter", "frozen-parameter"])
@pytest.mark.parametrize("where", MODES[:3])
def test_an_inference_tensor_is_rebuilt_as_one_wherever_the_rebuild_runs(impl, kind, where):
    """A loader may enter inference mode itself: its tensors are inference tensors whatever mode the caller is in,
    and so are their rebuilds (a normal tensor would accept the in-place and autograd uses the plain one refuses)."""
    original = _made_in_inference_mode(kind)
    rebuild, args = tensors.reduce_tensor(original)
    assert rebuild is tensors.rebuild_from_untyped and args[-1] == tensors.INFERENCE
    args = (original.untyped_storage(), *args[1:])
    got, _ = call(resolved_rebuild(), args, where)
    assert got == describe(original)
    assert got[9] is True  # is_inference
