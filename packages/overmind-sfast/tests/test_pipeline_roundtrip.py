"""A compiled, warmed-up tiny SD pipeline through the real cache parts in one process (closures.py, reducers.py)."""
from __future__ import annotations

import types

import numpy as np
import pytest

pytest.importorskip("sfast", reason="stable-fast is not installed (scripts/setup installs it from ../shared/wheels)")
torch = pytest.importorskip("torch")

from sfast.hooks.module_jit_hook import ModuleJITHook  # noqa: E402
from sfast.jit.trace_helper import TracedPosArgOnlyModuleWrapper, lazy_trace  # noqa: E402
from sfast.libs.diffusers import image_processor as sfast_image_processor  # noqa: E402

from overmind.adapter import patch_now, reduce_script_module  # noqa: E402
from overmind.testing import overmind_mapped, unpatch  # noqa: E402
from overmind_sfast import closures, plugin, sharing  # noqa: E402
from overmind_sfast_testlib import pipelines as sp  # noqa: E402
from overmind_sfast_testlib.roundtrip import roundtrip  # noqa: E402


@pytest.fixture(scope="module")
def compiled(sd_ckpt):
    """(pipeline built as users build it, its image for seed 1), with overmind-sfast's patches applied."""
    targets = plugin.patch_targets()
    for t in targets:
        patch_now(t)
    try:
        pipe = sp.build(sd_ckpt)
        yield pipe, sp.render(pipe)
    finally:
        for t in reversed(targets):
            unpatch(t)


@pytest.fixture(scope="module")
def rebuilt(compiled):
    from overmind_sfast.reducers import reducers

    return roundtrip(compiled[0], {torch.jit.ScriptModule: reduce_script_module, **reducers()})


def test_rebuilt_pipeline_renders_the_same_image_without_tracing(compiled, rebuilt):
    counter = sp.TraceCounter()
    with counter.installed():
        image = sp.render(rebuilt)
    assert counter.calls == 0
    np.testing.assert_array_equal(image, compiled[1])


def test_the_original_keeps_working_after_pickling(compiled, rebuilt):
    np.testing.assert_array_equal(sp.render(compiled[0]), compiled[1])


def test_rebuilt_wrappers_are_stable_fasts_own_around_the_rebuilt_modules(rebuilt):
    forward = rebuilt.unet.forward
    assert forward.__code__ is closures._nested_code(lazy_trace, "wrapper")
    assert forward.__self__ is rebuilt.unet
    (helper,) = forward._cached.values()
    assert isinstance(helper, TracedPosArgOnlyModuleWrapper) and isinstance(helper.module, torch.jit.ScriptModule)
    (te_helper,) = rebuilt.text_encoder.forward._cached.values()
    assert te_helper.module is not helper.module

    decoder = rebuilt.vae.decoder
    hook = decoder._call_impl.__closure__[0].cell_contents
    assert isinstance(hook, ModuleJITHook) and hook.module is decoder
    # the hook calls the module's own _call_impl, not itself
    assert hook.call_impl.__func__ is torch.nn.Module._call_impl and hook.call_impl.__self__ is decoder
    assert any(isinstance(v, types.FunctionType) for v in hook.compiled_cache.values())

    processor = rebuilt.image_processor
    assert processor.postprocess.__func__ is sfast_image_processor.postprocess
    assert processor.postprocess.__self__ is processor
    assert processor.pt_to_pil is sfast_image_processor.pt_to_pil.__func__


def test_weights_of_the_traced_modules_are_mapped_from_the_entry(rebuilt):
    (helper,) = rebuilt.unet.forward._cached.values()
    weights = [t for _, t in sharing.tensor_attributes(helper.module._c)]
    assert weights and all(overmind_mapped(t.data_ptr()) for t in weights)
    assert overmind_mapped(rebuilt.unet.conv_in.weight.data_ptr())


def traced_helpers(pipe) -> list:
    """The call helpers of every module the pipeline traced: UNet, text encoder, VAE decoder."""
    helpers = [*pipe.unet.forward._cached.values(), *pipe.text_encoder.forward._cached.values()]
    decoder_hook = pipe.vae.decoder._call_impl.__closure__[0].cell_contents
    for compiled in decoder_hook.compiled_cache.values():  # AutoTraceCompiler's closures over their helper
        if isinstance(compiled, types.FunctionType):
            cells = dict(zip(compiled.__code__.co_freevars, (c.cell_contents for c in compiled.__closure__)))
            helpers.append(cells["traced_module"])
    return helpers


def as_python_sees_it(module) -> dict:
    """A traced module as Python code sees it: its parameters, buffers and submodules by name, and the
    attributes of each wrapper (less the script methods a wrapper keeps once looked up)."""
    return {
        "parameters": [(n, type(p).__name__, p.dtype, tuple(p.shape)) for n, p in module.named_parameters()],
        "buffers": [(n, type(b).__name__, b.dtype, tuple(b.shape)) for n, b in module.named_buffers()],
        "modules": [(n, type(m).__name__, sorted(k for k in vars(m) if not m._c._has_method(k)))
                    for n, m in module.named_modules()],
    }


def test_rebuilt_traced_modules_look_to_python_as_the_plain_ones(compiled, rebuilt):
    plain, cached = traced_helpers(compiled[0]), traced_helpers(rebuilt)
    assert len(plain) == len(cached) >= 3
    for p, c in zip(plain, cached):
        assert as_python_sees_it(c.module) == as_python_sees_it(p.module)
        # the same C++ module, submodules and weights under the Python view
        assert sorted(n for n, _ in sharing.tensor_attributes(c.module._c)) == \
            sorted(n for n, _ in sharing.tensor_attributes(p.module._c))


def test_a_call_of_another_kind_is_traced_lazily_as_stable_fast_does(sd_ckpt, table):
    """stable-fast keys its traces by the kinds of the arguments (not their shapes): a rebuilt wrapper keeps
    the traces it had and still traces a new kind of call."""
    for t in plugin.patch_targets():
        patch_now(t)
    try:
        pipe = roundtrip(sp.build(sd_ckpt), table)  # its own copy: a new trace must not leak into the others
        unet = pipe.unet
        sample = torch.randn(1, unet.config.in_channels, sp.SIZE // 8, sp.SIZE // 8)
        hidden = torch.randn(1, 3, unet.config.cross_attention_dim)
        counter = sp.TraceCounter()
        with counter.installed():
            out = unet(sample, torch.tensor(10), encoder_hidden_states=hidden)  # return_dict: a new kind
        assert counter.calls == 1
        assert out.sample.shape == sample.shape and type(out).__name__ == "UNet2DConditionOutput"
        assert len(unet.forward._cached) == 2
    finally:
        for t in reversed(plugin.patch_targets()):
            unpatch(t)


def test_cuda_graph_wrappers_are_rebuilt_empty(table):
    """enable_cuda_graph wraps forward in make_dynamic_graphed_callable; graphs are captured again."""
    from sfast.cuda.graphs import make_dynamic_graphed_callable

    module = torch.nn.Linear(2, 2)
    module.forward = make_dynamic_graphed_callable(module.forward)
    module.forward._cached[("key",)] = object()  # stands for a captured graph: must not be pickled
    clone = roundtrip(module, table)
    assert clone.forward.__code__ is module.forward.__code__
    assert clone.forward._cached == {}
    inner = dict(zip(clone.forward.__code__.co_freevars, (c.cell_contents for c in clone.forward.__closure__)))
    assert inner["func"].__self__ is clone and inner["func"].__func__ is torch.nn.Linear.forward


def test_traced_and_eager_modules_share_one_copy_of_the_weights(rebuilt):
    (helper,) = rebuilt.unet.forward._cached.values()
    eager = {p.untyped_storage().data_ptr() for p in rebuilt.unet.parameters()}
    traced = [t for _, t in sharing.tensor_attributes(helper.module._c)]
    assert traced and all(t.untyped_storage().data_ptr() in eager for t in traced)


def _tensor_record_bytes(fn_args) -> int:
    """Bytes of the tensor records in a TorchScript archive reduction ``(fn, (storage, ...))``."""
    import io
    import zipfile

    storage = fn_args[1][0]
    data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy().tobytes()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return sum(i.file_size for i in archive.infolist() if i.filename.endswith(".storage"))


def test_archives_leave_the_weights_out(compiled):
    (helper,) = compiled[0].unet.forward._cached.values()
    weights = sum(t.untyped_storage().nbytes() for _, t in sharing.tensor_attributes(helper.module._c))
    whole = reduce_script_module(helper.module)
    fn, args, left_out = sharing.split(helper.module)
    assert _tensor_record_bytes(whole) >= weights  # as the core alone would store it: a second copy
    assert _tensor_record_bytes((fn, args)) < 1024  # only the graph's small constants remain
    assert sum(t.untyped_storage().nbytes() for _, t in left_out) == weights
    # and the module that was split still has its weights
    assert all(t.numel() for _, t in sharing.tensor_attributes(helper.module._c))
