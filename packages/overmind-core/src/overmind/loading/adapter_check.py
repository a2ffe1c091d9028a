"""An adapter proves itself on a library release outside its ``tested`` range, before activation patches it: its
loaders fit, its reducers are callables, its sample makes a round trip through the entry codec; once per
environment, remembered in ``$XDG_CACHE_HOME/overmind/self-checks`` (:mod:`overmind.adapters.self_check` has what
the adapter declares).

- every patch target takes the parameters the adapter reads (those that do not are left out; none left fails);
- each reducer the adapter registers is a callable for a type;
- once per environment (remembered in ``$XDG_CACHE_HOME/overmind/self-checks``), a tiny object of the library
  (``SelfCheck.sample()``) goes through the entry codec, a sealed memfd included, and comes back equal to
  itself, as ``SelfCheck.describe`` sees it.

The sample is built with the random generators' state saved and put back, and with warnings silenced: the
user's process sees nothing of it. Only a failed check turns the adapter off (see ``activation``).

>>> outcome = adapter_check.run("transformers", targets, check)
>>> outcome.passed, outcome.detail
(True, '54 loaders fit; ...; a BertModel and TokenizersBackend came back equal from the entry codec')
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys

from .._util import distributions, interrupts, user_cache
from .._util.lazy_logger import logger
from ..adapters.self_check import Outcome, SelfCheck, unfit_targets

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterator

    from ..adapters.patching import PatchTarget

log = logger("overmind")


def run(adapter: str, targets: list[PatchTarget], check: SelfCheck | None) -> Outcome:
    """Check adapter ``adapter`` against the installed library: its ``targets`` (collected, not patched yet),
    its reducers, and its sample's round trip (remembered per environment). A target whose signature lacks what
    the adapter reads is left out (named in the detail); the check fails when none is left, when a reducer is
    not callable or when the sample does not come back equal. An adapter with no target yet whose loaders are
    patched as their modules are imported (``overmind_patch_later``) is not failed for it: each of those is
    fitted as it comes (``activation._fitting``)."""
    relies_on = check.relies_on if check is not None else {}
    unfit = unfit_targets(targets, relies_on)
    problems = _reducer_problems(adapter)
    later = [] if targets else _later_modules(adapter)
    if relies_on and len(unfit) == len(targets) and not later:
        problems.insert(0, "none of the loaders it patches exists in this version" if not targets else
                        "no loader it patches takes the parameters it reads: " + "; ".join(unfit.values()))
    if problems:
        return Outcome(False, "; ".join(problems))
    fit = len(targets) - len(unfit)
    if later:
        said = [f"its loaders are checked as their modules are imported ({len(later)} module"
                f"{'s' if len(later) != 1 else ''})"]
    else:
        said = [f"{fit} loader{'s' if fit != 1 else ''} " + ("fit" if relies_on else "found") if targets
                else "it patches no loader"]
    if unfit:
        said.append(f"{len(unfit)} left unpatched ({'; '.join(unfit.values())})")
    if check is None or check.sample is None:
        said.append("no sample to send through the entry codec")
        return Outcome(True, "; ".join(said))
    trip = _remembered_round_trip(adapter, check)
    said.append(trip.detail)
    return Outcome(trip.passed, "; ".join(said))


def check_installed(adapter: str) -> Outcome:
    """Run ``adapter``'s check in this process as activation would (``overmind doctor``): its libraries are
    imported, its targets collected, nothing is patched."""
    import importlib

    from ..adapters import discovery, hooks

    state = discovery.states()[adapter]
    for group in state.modules:
        importlib.import_module(group[0])
    discovery.get_manager()
    for module in _later_modules(adapter):  # every loader it would patch, each checked (this release may lack some)
        with interrupts.suppress(ImportError):
            importlib.import_module(module)
    state.self_check = run(adapter, hooks.patch_targets(adapter), hooks.self_check(adapter))
    return state.self_check


def _later_modules(adapter: str) -> list[str]:
    """The modules whose import patches more of ``adapter``'s loaders (none where it cannot say)."""
    from ..adapters import hooks

    try:
        return list(hooks.patch_later(adapter))
    except Exception as e:
        interrupts.raise_users(e)
        return []


def _reducer_problems(adapter: str) -> list[str]:
    from ..adapters import hooks

    problems = []
    for table in hooks._own_calls("overmind_reducers", adapter):
        for t, reducer in (table or {}).items():
            if not isinstance(t, type) or not callable(reducer):
                problems.append(f"its reducer table maps {t!r} to {reducer!r}, not a type to a callable")
    return problems


# -- the round trip, once per environment ---------------------------------------------------------------------

def _remembered_round_trip(adapter: str, check: SelfCheck) -> Outcome:
    path = _memo_path(adapter)
    try:
        with open(path) as f:
            memo = json.load(f)
        return Outcome(bool(memo["passed"]), memo["detail"] + " (remembered)")
    except (OSError, ValueError, KeyError, TypeError) as e:  # none yet, or unreadable: check again
        interrupts.raise_users(e)
    outcome = round_trip(adapter, check)
    _remember(path, outcome)
    return outcome


def round_trip(adapter: str, check: SelfCheck) -> Outcome:
    """Build the sample, encode it into a sealed memfd with the entry codec, decode it, compare."""
    from ..entries import codec
    from ..keys.key import Loader

    assert check.sample is not None
    describe_fn = check.describe or SelfCheck.default_describe
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
            if np is not None and np_state is not None:
                np.random.set_state(np_state)


def _memo_path(adapter: str) -> str:
    """Where this environment's round trip for ``adapter`` is remembered: named by every version it depends on."""
    from .._version import __version__
    from ..adapters import discovery, libraries

    state = discovery.states(discover=False).get(adapter)
    dist = distributions.distribution(state.dist) if state is not None and state.dist else None
    parts = [sys.prefix, sys.version, __version__, adapter]
    if dist is not None:
        parts.append(f"{dist.name}=={dist.version}")
        names = {r.name for r in libraries.instruments_requirements(dist)}
        names |= {r.name for r in libraries.tested_requirements(dist)}
        parts += [f"{n}=={distributions.version(n)}" for n in sorted(names | {"torch"})]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    return user_cache.path("self-checks", f"{adapter}-{digest}.json")


def _remember(path: str, outcome: Outcome) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"passed": outcome.passed, "detail": outcome.detail}, f)
        os.replace(tmp, path)
    except OSError as e:
        interrupts.raise_users(e)
        log.debug("could not remember the self-check in %s: %s", path, e)
