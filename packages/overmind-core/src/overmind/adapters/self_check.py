"""An adapter proves itself on a library version outside its tested range, instead of being turned off by a bound.

An adapter declares two ranges: ``instruments`` (what activation needs: lower bounds, and an upper bound only
for a version known to break) and ``tested`` (what its test lanes run). Where an installed library lies
outside ``tested`` (a release newer than the lanes), activation runs this check before patching:

- every patch target exists, and takes the parameters the adapter reads (``SelfCheck.relies_on``), by name;
- each reducer the adapter registers is a callable for a type;
- once per environment (remembered in ``$XDG_CACHE_HOME/overmind/self-checks``), a tiny object of the library
  (``SelfCheck.sample()``) goes through the entry codec, a sealed memfd included, and comes back equal to
  itself, as ``SelfCheck.describe`` sees it.

The sample is built with the random generators' state saved and put back, and with warnings silenced: the
user's process sees nothing of it. Only a failed check turns the adapter off (see ``activation``).

>>> outcome = self_check.run("transformers", targets)
>>> outcome.passed, outcome.detail
(True, '41 loaders take the parameters the adapter reads; a BertModel came back equal from the entry codec')
"""
from __future__ import annotations

import contextlib
import os
import sys

from .._util import distributions, interrupts
from .._util.lazy_logger import logger

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator, Mapping, Sequence

    from .patching import PatchTarget

log = logger("overmind")


class SelfCheck:
    """What an adapter's ``overmind_self_check`` hook returns.

    ``relies_on``: for a loader attribute name (``"from_pretrained"``), the parameters the adapter reads by
    name from its calls (alternatives joined by ``|``; ``*`` a ``*args``, ``**`` a ``**kwargs`` parameter). ``sample``: builds a tiny object of the library without reading any file (a
    two-layer model from a config); ``describe``: what must be equal after the round trip (default:
    :func:`describe`, a module's class, config and every tensor's bytes).
    """

    __slots__ = ("relies_on", "sample", "describe")

    def __init__(self, relies_on: Mapping[str, Sequence[str]] | None = None,
                 sample: Callable[[], Any] | None = None, describe: Callable[[Any], Any] | None = None) -> None:
        self.relies_on = dict(relies_on or {})
        self.sample = sample
        self.describe = describe


class Outcome:
    """A check's result: whether it passed, what it found in words, and the targets left unpatched (their
    signature no longer takes what the adapter reads: those calls run plain; the others are served)."""

    __slots__ = ("passed", "detail", "left_out")

    def __init__(self, passed: bool, detail: str, left_out: list | None = None) -> None:
        self.passed = passed
        self.detail = detail
        self.left_out = left_out or []

    def __repr__(self) -> str:
        return f"Outcome(passed={self.passed!r}, detail={self.detail!r}, left_out={len(self.left_out)})"

    def fit(self, targets: list[PatchTarget]) -> list[PatchTarget]:
        """``targets`` without the ones left out."""
        return [t for t in targets if t not in self.left_out]


def run(adapter: str, targets: list[PatchTarget], check: SelfCheck | None) -> Outcome:
    """Check adapter ``adapter`` against the installed library: its ``targets`` (collected, not patched yet),
    its reducers, and its sample's round trip (remembered per environment). A target whose signature lacks what
    the adapter reads is left out (named in the detail); the check fails when none is left, when a reducer is
    not callable or when the sample does not come back equal."""
    relies_on = check.relies_on if check is not None else {}
    unfit = unfit_targets(targets, relies_on)
    problems = _reducer_problems(adapter)
    if relies_on and len(unfit) == len(targets):
        problems.insert(0, "none of the loaders it patches exists in this version" if not targets else
                        "no loader it patches takes the parameters it reads: " + "; ".join(unfit.values()))
    if problems:
        return Outcome(False, "; ".join(problems), list(unfit))
    fit = len(targets) - len(unfit)
    said = [f"{fit} loader{'s' if fit != 1 else ''} " + ("fit" if relies_on else "found") if targets
            else "it patches no loader"]
    if unfit:
        said.append(f"{len(unfit)} left unpatched ({'; '.join(unfit.values())})")
    if check is None or check.sample is None:
        said.append("no sample to send through the entry codec")
        return Outcome(True, "; ".join(said), list(unfit))
    trip = _remembered_round_trip(adapter, check)
    said.append(trip.detail)
    return Outcome(trip.passed, "; ".join(said), list(unfit))


def check_installed(adapter: str) -> Outcome:
    """Run ``adapter``'s check in this process as activation would (``overmind doctor``): its libraries are
    imported, its targets collected, nothing is patched."""
    import importlib

    from . import discovery, hooks

    state = discovery.states()[adapter]
    for group in state.modules:
        importlib.import_module(group[0])
    discovery.get_manager()
    checks = hooks.self_check(adapter)
    outcome = state.self_check = run(adapter, hooks.patch_targets(adapter), checks[0] if checks else None)
    return outcome


def unfit_targets(targets: list[PatchTarget], relies_on: Mapping[str, Sequence[str]]) -> dict[PatchTarget, str]:
    """The targets lacking a parameter ``relies_on`` names for their attribute, each with what it lacks: each
    item is a parameter name, or alternatives joined by ``|``; ``*`` stands for a ``*args`` parameter, ``**`` for
    ``**kwargs``."""
    import inspect

    unfit = {}
    for t in targets:
        wanted = relies_on.get(t.name)
        if not wanted:
            continue
        where = f"{getattr(t.owner, '__qualname__', getattr(t.owner, '__name__', t.owner))}.{t.name}"
        try:
            params = inspect.signature(getattr(t.owner, t.name)).parameters
        except (TypeError, ValueError) as e:
            unfit[t] = f"the signature of {where} cannot be read ({e})"
            continue
        have = set(params)
        for p in params.values():
            if p.kind is p.VAR_POSITIONAL:
                have.add("*")
            elif p.kind is p.VAR_KEYWORD:
                have.add("**")
        missing = [item for item in wanted if not have & set(item.split("|"))]
        if missing:
            unfit[t] = f"{where} takes no {', '.join(_show(item) for item in missing)}"
    return unfit


def _show(item: str) -> str:
    names = [{"*": "*args", "**": "**kwargs"}.get(n, n) for n in item.split("|")]
    return names[0] if len(names) == 1 else f"{names[0]} (or {', '.join(names[1:])})"


def _reducer_problems(adapter: str) -> list[str]:
    from . import hooks

    problems = []
    for table in hooks._own_calls("overmind_reducers", adapter):
        for t, reducer in (table or {}).items():
            if not isinstance(t, type) or not callable(reducer):
                problems.append(f"its reducer table maps {t!r} to {reducer!r}, not a type to a callable")
    return problems


# -- the round trip, once per environment ---------------------------------------------------------------------

def _remembered_round_trip(adapter: str, check: SelfCheck) -> Outcome:
    import json  # here and below, late: the kit imports this module, and activate() imports the kit

    path = _memo_path(adapter)
    if path is not None:
        try:
            with open(path) as f:
                memo = json.load(f)
            return Outcome(bool(memo["passed"]), memo["detail"] + " (remembered)")
        except (OSError, ValueError, KeyError, TypeError):
            pass
    outcome = round_trip(adapter, check)
    if path is not None:
        _remember(path, outcome)
    return outcome


def round_trip(adapter: str, check: SelfCheck) -> Outcome:
    """Build the sample, encode it into a sealed memfd with the entry codec, decode it, compare."""
    from ..entries import codec
    from ..keys.key import Loader

    assert check.sample is not None
    describe_fn = check.describe or describe
    try:
        with _unobserved():
            obj = check.sample()
            loader = Loader(check.sample, check.sample, None, f"{adapter} self-check")
            encoded = codec.encode(obj, loader, f"{adapter} self-check", reference_mapped=False)
            for _, fd in encoded.files:
                os.close(fd)
            entry = {"entry_id": "self-check", "key": f"self-check:{adapter}", "meta": encoded.meta}
            back = codec.decode(entry, {"self-check": encoded.fd})
            kind = _kind(obj)
            if type(back) is not type(obj):
                return Outcome(False, f"a {kind} came back from the entry codec as a {type(back).__name__}")
            if describe_fn(back) != describe_fn(obj):
                return Outcome(False, f"a {kind} came back from the entry codec different from itself")
    except Exception as e:
        interrupts.raise_users(e)
        return Outcome(False, f"its sample could not make a round trip through the entry codec "
                              f"({type(e).__name__}: {e})")
    return Outcome(True, f"a {kind} came back equal from the entry codec")


def _kind(obj: Any) -> str:
    if isinstance(obj, dict):
        return " and ".join(type(v).__name__ for v in obj.values())
    return type(obj).__name__


@contextlib.contextmanager
def _unobserved() -> Iterator[None]:
    """The random generators as they were, and no warning shown, whatever the sample does."""
    import random
    import warnings

    import torch

    py_state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            random.setstate(py_state)
            if np_state is not None:
                np.random.set_state(np_state)


def describe(obj: Any) -> Any:
    """What a round trip must keep: a module's class, training flag, config and every tensor of its state (dtype,
    shape, bytes); another object's class and attributes, tensors by their bytes."""
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


def _memo_path(adapter: str) -> str | None:
    """Where this environment's round trip for ``adapter`` is remembered: named by every version it depends on."""
    import hashlib

    from .._version import __version__
    from . import discovery, libraries

    state = discovery.states(discover=False).get(adapter)
    dist = distributions.distribution(state.dist) if state is not None and state.dist else None
    parts = [sys.prefix, sys.version, __version__, adapter]
    if dist is not None:
        parts.append(f"{dist.name}=={dist.version}")
        names = {r.name for r in libraries.instruments_requirements(dist)}
        names |= {r.name for r in libraries.tested_requirements(dist)}
        parts += [f"{n}=={distributions.version(n)}" for n in sorted(names | {"torch"})]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    return os.path.join(base, "overmind", "self-checks", f"{adapter}-{digest}.json")


def _remember(path: str, outcome: Outcome) -> None:
    import json

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"passed": outcome.passed, "detail": outcome.detail}, f)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("overmind: could not remember the self-check in %s: %s", path, e)
