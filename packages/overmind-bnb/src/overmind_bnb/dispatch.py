"""Take accelerate's dispatch machinery off a model for pickling, and put the same machinery on the copy.

``from_pretrained(..., device_map=...)`` calls ``accelerate.dispatch_model`` when the map spans several devices
or offloads to CPU/disk (with a GPU: ``device_map="auto"`` on a model that does not fit one device). That
leaves instance state on the model that pickle cannot carry:

- on every dispatched module, ``forward`` is a ``functools.partial`` of a function local to
  ``accelerate.hooks.add_hook_to_module``, and ``_old_forward`` the bound original;
- on the root, ``to`` / ``cuda`` (or ``xpu``, ``npu``...) are wrapped by a function local to
  ``dispatch_model`` that warns, and raises when some weights are offloaded to ``meta``.

The hook objects (``_hf_hook``: ``AlignDevicesHook`` with its execution device, offload flags, ``weights_map``)
are plain data. :func:`stripped` takes all three kinds off the modules for the duration of pickling and keeps
the hooks, with where everything was, in a marker on the root module, so they are pickled with the model
(offloaded weights held in a CPU ``weights_map`` are cached and shared too) while the modules themselves look
undispatched. The Hugging Face adapters refuse results whose modules carry ``_hf_hook`` (they cannot rebuild them)
unless an adapter declared it can: this one does, for the quantized models it owns
(``overmind_hf.dispatch.carries_hooks``, called by :mod:`overmind_bnb.plugin`). :func:`reattach` rebuilds everything
on the unpickled copy: the hooks go back, the forward wrappers are rebuilt by accelerate's own
``add_hook_to_module``, the move guards by :func:`move_guard`, which behaves as accelerate's does (same warning,
same error). The loading process gets every original object back on exit.

Transformers 5 adds no instance guards of its own: ``PreTrainedModel.to/cuda/half/float`` are class methods
that read ``quantization_method`` / ``is_loaded_in_8bit`` / ``is_quantized``, which are pickled with the model,
so a cached 4-bit or 8-bit model refuses ``.to(torch.float16)`` / ``.cuda()`` exactly as a fresh one does.
"""
from __future__ import annotations

import contextlib
import functools

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterator

MARKER = "_overmind_bnb_dispatch"
# accelerate.hooks._accelerate_added_attributes: what dispatch_model may wrap on the root model.
GUARDED_METHODS = ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa")
_ABSENT = object()

__all__ = ["MARKER", "has_dispatch_state", "stripped", "reattach", "move_guard"]


def _is_hook_forward(module: Any) -> bool:
    d = module.__dict__
    return "_hf_hook" in d and "_old_forward" in d and "forward" in d


def _is_accelerate_guard(fn: Any) -> bool:
    """Whether ``fn`` is the move guard ``dispatch_model`` attached (functools.wraps hides its name)."""
    code = getattr(fn, "__code__", None)
    if code is None or not hasattr(fn, "__wrapped__"):
        return False
    qualname = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+
    return qualname.endswith("add_warning.<locals>.wrapper") or getattr(fn, "__overmind_move_guard__", False)


def has_dispatch_state(module: Any) -> bool:
    """Whether ``module`` or a submodule carries accelerate dispatch state that :func:`stripped` removes."""
    for sub in module.modules():
        if _is_hook_forward(sub) or any(_is_accelerate_guard(sub.__dict__.get(a)) for a in GUARDED_METHODS):
            return True
    return False


@contextlib.contextmanager
def stripped(roots: list[Any]) -> Iterator[None]:
    """Remove accelerate's forward wrappers and move guards from ``roots`` (and submodules); restore on exit.

    While inside, each root that had any carries ``MARKER = {"hooked": [[name, hook]], "guards": [[name, attr]]}``.
    """
    taken: list[tuple[Any, dict[str, Any]]] = []  # (module, {attr: original object or _ABSENT})
    try:
        for root in roots:
            record: dict[str, list] = {"hooked": [], "guards": []}
            for name, module in root.named_modules():
                d, saved = module.__dict__, {}
                if _is_hook_forward(module):
                    for attr in ("forward", "_old_forward", "_hf_hook"):
                        saved[attr] = d.pop(attr)
                    record["hooked"].append([name, saved["_hf_hook"]])
                for attr in GUARDED_METHODS:
                    if _is_accelerate_guard(d.get(attr)):
                        saved[attr] = d.pop(attr)
                        record["guards"].append([name, attr])
                if saved:
                    taken.append((module, saved))
            if record["hooked"] or record["guards"]:
                taken.append((root, {MARKER: root.__dict__.get(MARKER, _ABSENT)}))
                root.__dict__[MARKER] = record
        yield
    finally:
        for module, saved in reversed(taken):
            for attr, original in saved.items():
                if original is _ABSENT:
                    module.__dict__.pop(attr, None)
                else:
                    module.__dict__[attr] = original


def reattach(root: Any) -> bool:
    """Rebuild on ``root`` (an unpickled copy) what :func:`stripped` removed; False if it had nothing."""
    record = root.__dict__.pop(MARKER, None)
    if record is None:
        return False
    from accelerate.hooks import ModelHook, add_hook_to_module

    modules = dict(root.named_modules(remove_duplicate=False))
    for name, hook in record["hooked"]:
        module = modules[name]
        # accelerate builds its forward wrapper over module.forward (the class's now) and calls the hook's
        # init_hook; a bare ModelHook's init_hook does nothing, so the weights are not moved or copied. The
        # wrapper reads module._hf_hook at call time, so the real hook can go in afterwards.
        add_hook_to_module(module, ModelHook())
        module._hf_hook = hook
    _rekey_tied_params(root)
    for name, attr in record["guards"]:
        module = modules[name]
        module.__dict__[attr] = move_guard(getattr(module, attr), module)
    return True


def _hooks_of(hook: Any) -> Iterator[Any]:
    yield hook
    for inner in getattr(hook, "hooks", ()) or ():  # SequentialHook
        yield from _hooks_of(inner)


def _rekey_tied_params(root: Any) -> None:
    """``tied_params_map`` is keyed by ``data_ptr()`` of tied weights: rebuild its keys for this process.

    dispatch_model shares one dict among all hooks; pickle's memo keeps it shared. Its keys are the addresses
    the tied parameters had in the loading process, meaningless here, so they are recomputed as dispatch_model
    computes them (its values are transient per-forward copies, empty at rest).
    """
    maps = {}
    for module in root.modules():
        for hook in _hooks_of(module.__dict__.get("_hf_hook")):
            m = getattr(hook, "tied_params_map", None)
            if isinstance(m, dict):
                maps[id(m)] = m
    if not maps:
        return
    from accelerate.utils import find_tied_parameters

    fresh: dict[int, dict] = {}
    for group in find_tied_parameters(root):
        for param_name in group:
            param = root.get_parameter(param_name)
            if param.device.type != "meta":
                fresh[param.data_ptr()] = {}
    for m in maps.values():
        m.clear()
        m.update(fresh)


def move_guard(fn: Any, model: Any) -> Any:
    """The ``to`` / ``cuda`` guard ``accelerate.dispatch_model`` puts on a dispatched model, rebuilt.

    accelerate's is a local function (``add_warning``), which pickle cannot name; this one behaves the same:
    the same warning through accelerate's logger, the same ``RuntimeError`` when weights are offloaded.
    """
    import torch
    from accelerate.big_modeling import logger

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warning_msg = "You shouldn't move a model that is dispatched using accelerate hooks."
        if str(fn.__name__) == "to":
            to_device = torch._C._nn._parse_to(*args, **kwargs)[0]
            if to_device is not None:
                logger.warning(warning_msg)
        else:
            logger.warning(warning_msg)
        for param in model.parameters():
            if param.device == torch.device("meta"):
                raise RuntimeError("You can't move a model that has some modules offloaded to cpu or disk.")
        return fn(*args, **kwargs)

    wrapper.__overmind_move_guard__ = True
    return wrapper
