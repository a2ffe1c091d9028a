"""What an adapter declares to prove itself on a library release outside its ``tested`` range (:class:`SelfCheck`:
the parameters its loaders must take, a sample), and the part of the check that needs nothing but the adapter: which
of its loaders lack those parameters (left unpatched on every version).

An adapter declares two ranges: ``instruments`` (what activation needs: lower bounds, and an upper bound only
for a version known to break) and ``tested`` (what its test lanes run). Its ``overmind_self_check`` hook returns a
:class:`SelfCheck`. Activation leaves unpatched, on every version, a loader that lacks a parameter the adapter
reads (:func:`unfit_targets`); on a release outside ``tested`` it runs the whole check
(:mod:`overmind.loading.adapter_check`: the reducers, a sample through the entry codec, remembered per
environment), and only a failure turns the adapter off.
"""
from __future__ import annotations

import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

    from .patching import PatchTarget


class SelfCheck:
    """What an adapter's ``overmind_self_check`` hook returns.

    ``relies_on``: for a loader attribute name (``"from_pretrained"``), the parameters the adapter reads by
    name from its calls (alternatives joined by ``|``; ``*`` a ``*args``, ``**`` a ``**kwargs`` parameter).
    ``sample``: builds a tiny object of the library without reading any file (a two-layer model from a config).
    ``describe``: what must be equal after the round trip (default: :meth:`default_describe`, a module's class,
    config and every tensor's bytes).
    """

    __slots__ = ("relies_on", "sample", "describe")

    def __init__(self, relies_on: Mapping[str, Sequence[str]] | None = None,
                 sample: Callable[[], Any] | None = None, describe: Callable[[Any], Any] | None = None) -> None:
        self.relies_on = dict(relies_on or {})
        self.sample = sample
        self.describe = describe

    @staticmethod
    def default_describe(obj: Any) -> Any:
        """What a round trip must keep: a module's class, training flag, config and every tensor of its state
        (dtype, shape, bytes); another object's class and attributes, tensors by their bytes."""
        import hashlib

        import torch

        def value(v: Any, depth: int = 0) -> Any:
            if depth > 4:
                return type(v).__qualname__
            if isinstance(v, torch.Tensor):
                t = v.detach().contiguous().cpu()
                data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
                return ("tensor", str(t.dtype), tuple(t.shape), hashlib.sha256(data).hexdigest())
            if isinstance(v, torch.nn.Module) and depth > 1:
                return type(v).__qualname__  # a parameter's back reference to its module
            if isinstance(v, torch.nn.Module):
                config = getattr(v, "config", None)
                to_dict = getattr(config, "to_dict", None)
                return (type(v).__qualname__, v.training, to_dict() if callable(to_dict) else repr(config),
                        [(k, type(p).__qualname__, value(p.data), {a: value(x, 2) for a, x in vars(p).items()})
                         for k, p in v.named_parameters()],
                        [(k, value(t)) for k, t in v.state_dict().items()])
            if isinstance(v, (list, tuple)):
                return [value(x, depth + 1) for x in v]
            if isinstance(v, dict):
                return {k: value(x, depth + 1) for k, x in v.items()}
            if depth < 4 and hasattr(v, "__dict__") and not isinstance(v, type):
                return (type(v).__qualname__, {k: value(x, depth + 1) for k, x in vars(v).items()})
            return repr(v)

        return value(obj)


class Outcome:
    """A check's result: whether it passed, and what it found, in words."""

    __slots__ = ("passed", "detail")

    def __init__(self, passed: bool, detail: str) -> None:
        self.passed = passed
        self.detail = detail

    def __repr__(self) -> str:
        return f"Outcome(passed={self.passed!r}, detail={self.detail!r})"


def fit(targets: list[PatchTarget], check: SelfCheck | None) -> tuple[list[PatchTarget], dict[PatchTarget, str]]:
    """``targets`` the adapter patches (those taking what its ``check.relies_on`` names), and the others with what
    each lacks: what activation patches and what the conformance checks expect patched."""
    unfit = unfit_targets(targets, check.relies_on) if check is not None else {}
    return [t for t in targets if t not in unfit], unfit


def unfit_targets(targets: list[PatchTarget], relies_on: Mapping[str, Sequence[str]]) -> dict[PatchTarget, str]:
    """The targets lacking a parameter ``relies_on`` names for their attribute, each with what it lacks: each
    item is a parameter name, or alternatives joined by ``|``; ``*`` stands for a ``*args`` parameter, ``**`` for
    ``**kwargs``."""
    unfit = {}
    for t in targets:
        wanted = relies_on.get(t.name)
        if not wanted:
            continue
        where = f"{getattr(t.owner, '__qualname__', getattr(t.owner, '__name__', t.owner))}.{t.name}"
        loader = getattr(t.owner, t.name)
        have = _plain_parameters(loader)
        if have is None:
            try:
                have = _parameters(loader)
            except (TypeError, ValueError) as e:
                unfit[t] = f"the signature of {where} cannot be read ({e})"
                continue
        missing = [item for item in wanted if not have & set(item.split("|"))]
        if missing:
            unfit[t] = f"{where} takes no {', '.join(_show(item) for item in missing)}"
    return unfit


def _parameters(loader: Any) -> set[str]:
    """The names of ``loader``'s parameters as :func:`inspect.signature` gives them, with ``*`` for a ``*args`` and
    ``**`` for a ``**kwargs`` parameter."""
    import inspect

    params = inspect.signature(loader).parameters
    have = set(params)
    for p in params.values():
        if p.kind is p.VAR_POSITIONAL:
            have.add("*")
        elif p.kind is p.VAR_KEYWORD:
            have.add("**")
    return have


_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08
# what makes inspect.signature read a function other than by its code
_NOT_PLAIN = frozenset({"__signature__", "_partialmethod"})


def _plain_parameters(loader: Any) -> set[str] | None:
    """:func:`_parameters` read off the code objects, for a plain function or a method bound to one, through the
    callables decorators wrap (activation checks each loader it patches as their modules are imported, and
    :func:`inspect.signature` costs ~50 us a loader); None for anything else, which :func:`inspect.signature` reads."""
    params = _plain_list(loader, 0)
    if params is None:
        return None
    have = {name for name, _ in params}
    have.update(kind for _, kind in params if kind in ("*", "**"))
    return have


def _plain_list(obj: Any, depth: int) -> list[tuple[str, str]] | None:
    """``(name, kind)`` of each parameter in inspect's order (kind ``""``, ``"*"``, ``"kw"`` or ``"**"``), as
    :func:`inspect.signature` finds them, where only code objects decide them; else None."""
    if depth > 50:
        return None
    if isinstance(obj, types.MethodType):  # bound: inspect drops the first parameter, unless it is a *args
        params = _plain_list(obj.__func__, depth + 1)
        if not params or params[0][1] not in ("", "*"):
            return None  # inspect refuses such a method: let it say so
        return params[1:] if params[0][1] == "" else params
    if not isinstance(obj, types.FunctionType):
        return None
    own = vars(obj)
    if not _NOT_PLAIN.isdisjoint(own):
        return None
    if "__wrapped__" in own:  # a decorator's wrapper (functools.wraps): inspect reads what it wraps
        return _plain_list(own["__wrapped__"], depth + 1)
    code = obj.__code__
    flags, npos, nkw = code.co_flags, code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    params = [(n, "") for n in names[:npos]]
    at = npos + nkw
    if flags & _CO_VARARGS:
        params.append((names[at], "*"))
        at += 1
    params += [(n, "kw") for n in names[npos:npos + nkw]]
    if flags & _CO_VARKEYWORDS:
        params.append((names[at], "**"))
    return params


def _show(item: str) -> str:
    names = [{"*": "*args", "**": "**kwargs"}.get(n, n) for n in item.split("|")]
    return names[0] if len(names) == 1 else f"{names[0]} (or {', '.join(names[1:])})"
