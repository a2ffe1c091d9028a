"""Dataclass outputs that survive ``torch.jit.save``: stable-fast's flattening, patched to name the class.

stable-fast traces a module through a positional-tensors-only wrapper: every input and output is flattened
into a tuple of tensors (``sfast.utils.flat_tensors``). A dataclass output (``BaseModelOutputWithPooling``
from a CLIP text encoder, ``UNet2DConditionOutput`` ...) is flattened as its class, then its fields; the
class rides in an ``ObjectTensor``, a tensor subclass holding a Python reference, which the trace records
as a graph constant. In the tracing process that constant is still the ``ObjectTensor``; ``torch.jit.save``
keeps only its data (``[0.]``), so a module loaded back returns a plain tensor where the class was, and
stable-fast's unflattening fails (``assert isinstance(t, ObjectTensor)``).

While ``overmind-sfast`` is active, :func:`flatten_dataclass` replaces stable-fast's: the ``ObjectTensor``
still holds the class (so the module works in this process exactly as before, with stable-fast's own
unflattening) and its data now spell the class's import path behind a marker,
``MAGIC + b"module:qualname"``. When the cache rebuilds a traced module, :func:`restore_class_tags` finds
those constants in the loaded graph and puts an ``ObjectTensor`` holding the imported class back in their
place, so stable-fast's unmodified unflattening works there too, whether or not the adapter is active.

>>> from overmind_sfast import flattening
>>> flattening.patch_targets()   # [PatchTarget(flat_tensors, "flatten_dataclass", kind="replace", ...)]
"""
from __future__ import annotations

import functools
import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MAGIC", "flatten_dataclass", "class_tag", "read_tag", "class_path", "resolve_class",
           "tagged_constants", "restore_class_tags", "patch_targets"]

# Starts with a NUL so no UTF-8 text stable-fast flattens (str and bytes go through flatten_bytes) matches.
MAGIC = b"\x00overmind-sfast:class\x00"
_SEP = ":"
_UNIMPORTABLE = "?"  # prefix of the path of a class that cannot be imported by name
_MAX_PATH = 1024  # longest class path a tag is read for


@functools.lru_cache(maxsize=1024)
def class_path(cls: type) -> str:
    """``"module:qualname"`` of ``cls``, or ``"?module:qualname"`` if importing that name does not give
    ``cls`` back (a class defined inside a function)."""
    path = f"{getattr(cls, '__module__', '')}{_SEP}{getattr(cls, '__qualname__', cls.__name__)}"
    try:
        found = resolve_class(path)
    except (ImportError, AttributeError, ValueError):
        found = None
    return path if found is cls else _UNIMPORTABLE + path


@functools.lru_cache(maxsize=1024)
def resolve_class(path: str) -> type:
    """Import the class named by ``"module:qualname"``."""
    module, _, qualname = path.partition(_SEP)
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def class_tag(cls: type) -> Any:
    """The ``ObjectTensor`` a dataclass's class is flattened to: holds ``cls``, spells its path.

    Built from a Python list, as stable-fast builds its own, so that a trace records this very tensor as
    its constant (a tensor made from another tensor would be recorded as that other one).
    """
    from sfast.utils.flat_tensors import ObjectTensor

    return ObjectTensor(list(MAGIC + class_path(cls).encode("utf-8")), cls)


def flatten_dataclass(obj: Any) -> tuple:
    """Replacement for ``sfast.utils.flat_tensors.flatten_dataclass``: same layout (class, then fields
    as a dict), the class as a :func:`class_tag`."""
    import dataclasses  # late: activate() imports this module, and dataclasses imports inspect (~10 ms)

    from sfast.utils import flat_tensors

    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return (class_tag(type(obj)),) + flat_tensors.flatten_dict(fields)


def read_tag(t: Any) -> str | None:
    """The class path a tensor spells if it is a class tag, else ``None`` (cheap for any other constant,
    including the weights a frozen graph holds)."""
    import torch

    n = len(MAGIC)
    if t.dim() != 1 or not n < t.numel() <= n + _MAX_PATH or t.is_complex() or t.dtype == torch.bool:
        return None
    values = t.tolist()
    if any(v != int(v) or not 0 <= v <= 255 for v in values):
        return None
    data = bytes(int(v) for v in values)
    return data[n:].decode("utf-8", "replace") if data.startswith(MAGIC) else None


def tagged_constants(script_module: Any) -> list[tuple[Any, str]]:
    """``(node, class path)`` for every class-tag constant in the module's ``forward`` graph (where
    stable-fast's wrapper flattens the outputs), nested blocks included."""
    import torch

    found = []
    graph = getattr(script_module, "graph", None)
    if graph is None:
        return found
    for node in graph.findAllNodes("prim::Constant"):
        if not node.hasAttribute("value") or node.kindOf("value") != "t":
            continue
        t = node.t("value")
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            path = read_tag(t)
            if path is not None:
                found.append((node, path))
    return found


def restore_class_tags(script_module: Any) -> int:
    """Put an ``ObjectTensor`` holding the imported class back in place of every class-tag constant of a
    module loaded from an archive; returns how many. Raises ``RuntimeError`` naming a class that cannot
    be imported here."""
    from sfast.utils.flat_tensors import ObjectTensor

    count = 0
    for node, path in tagged_constants(script_module):
        t = node.t("value")
        if isinstance(t, ObjectTensor) and t.get_value() is not None:
            continue  # this process traced it: the constant is still the original
        node.t_("value", ObjectTensor(t, _resolve_or_explain(path)))
        count += 1
    return count


def _resolve_or_explain(path: str) -> type:
    if path.startswith(_UNIMPORTABLE):
        raise RuntimeError(
            f"overmind-sfast: a module traced by stable-fast returns a dataclass of class {path[1:]!r}, which is "
            f"defined inside a function and cannot be imported in another process. Define the class at module "
            f"level, or cache the pipeline without tracing that module.")
    try:
        return resolve_class(path)
    except (ImportError, AttributeError, ValueError) as e:
        raise RuntimeError(
            f"overmind-sfast: a module traced by stable-fast returns a dataclass of class {path!r}, which cannot be "
            f"imported here ({type(e).__name__}: {e}). Install the library that defines it in this environment, "
            f"or evict the entry ('overmind evict') so it is built again.") from e


def patch_targets() -> list:
    """The replacement as ``overmind.adapter.PatchTarget(kind="replace")``: applied by activate(),
    restored to the identical original by deactivate(). Unflattening is never patched: see the module doc."""
    from sfast.utils import flat_tensors

    from overmind.adapter import PatchTarget

    return [PatchTarget(flat_tensors, "flatten_dataclass", kind="replace", replacement=flatten_dataclass)]
