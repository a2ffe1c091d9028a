"""Keys that mean the same on every node of a fleet: a load's key described by what its files hold
(not where they lie, nor their inodes and times) and bound to the software stack that made the
entry.

A local key (:func:`overmind.keys.key.make_key`) names files by path and stat identity: exact and
cheap on one machine, meaningless on another. Inside :func:`portable_mode` the same walk describes a
path by its contents (:mod:`overmind.keys.fingerprint`, :mod:`overmind.keys.content_digest`) and
drops its absolute spelling (:func:`overmind.keys.canon._path`); adapters' key parts use the same
``fingerprint`` (``overmind.adapter``), so they switch with it. An entry pickled on one stack is
unpickled faithfully only by the same stack, so :func:`portable_key` also holds :func:`stack_digest`
of :func:`stack`: Python, machine, torch, CUDA, the GPUs' compute capabilities and every installed
distribution's version.

>>> with portable_mode():
...     fingerprint.fingerprint("/models/tiny/config.json")
('content', 571, '5c1f0e2c...')
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import platform
import sys
from typing import Any, Callable, Iterator

from .._util import interrupts
from . import key
from .fingerprint import PORTABLE

FLEET_KEY_VERSION = 1
__all__ = ["portable_mode", "active", "stack", "stack_digest", "portable_key"]


@contextlib.contextmanager
def portable_mode() -> Iterator[None]:
    """Within it, this thread's (or task's) keys describe files by content, paths without where
    they lie."""
    token = PORTABLE.set(True)
    try:
        yield
    finally:
        PORTABLE.reset(token)


def active() -> bool:
    """Whether :func:`portable_mode` is on in this thread or task (a context variable read)."""
    return PORTABLE.get()


@functools.cache
def stack() -> dict[str, Any]:
    """This process's software stack as JSON-ready values (read once per process):

    ``{"python": "3.11.7 cpython", "machine": "x86_64", "torch": "2.5.1+cu124", "cuda": "12.4",
    "cuda_arch": ["8.0"], "distributions": {"numpy": "2.1.0", ...}}``. ``torch`` and ``cuda`` are
    None without torch; ``cuda_arch`` lists the compute capabilities of the visible GPUs (CUDA is
    initialised only where ``torch.cuda.is_available()``).
    """
    torch_version, cuda, arch = _torch()
    return {"python": f"{platform.python_version()} {sys.implementation.name}",
            "machine": platform.machine(), "torch": torch_version, "cuda": cuda, "cuda_arch": arch,
            "distributions": _distributions()}


def _torch() -> tuple[str | None, str | None, list[str]]:
    try:
        import torch
    except ImportError:
        return None, None, []
    cuda = getattr(torch.version, "cuda", None) or None
    arch: set[str] = set()
    try:
        if cuda and torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                major, minor = torch.cuda.get_device_capability(i)
                arch.add(f"{major}.{minor}")
    except Exception as exc:  # a driver that answers is_available() but fails the query: no GPU
        interrupts.raise_users(exc)
    return str(torch.__version__), cuda, sorted(arch)


def _distributions() -> dict[str, str]:
    """``{name: version}`` of every distribution on ``sys.path``, the first of a name winning (as
    imports do)."""
    from importlib import metadata

    from .._util.distributions import normalize

    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            found.setdefault(normalize(name), dist.version)
    return dict(sorted(found.items()))


def stack_digest(stack: dict[str, Any]) -> str:
    """The sha256 hex of ``stack``'s canonical JSON (keys sorted, no spaces)."""
    text = json.dumps(stack, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def portable_key(loader: key.Loader, arguments: dict[str, Any], extra_parts_fn: Callable[[], Any],
                 value_hook: Callable[[Any], Any] | None = None) -> str:
    """The 64-hex fleet key of calling ``loader`` with bound ``arguments`` on this stack; raises
    :class:`~overmind.errors.Unkeyable` as :func:`~overmind.keys.key.make_key` does.

    ``extra_parts_fn`` returns the adapters' key parts (``lambda: hooks.key_parts(loader,
    arguments)``): it is called inside :func:`portable_mode`, so the files they fingerprint are
    described by content. ``value_hook`` gives the adapters' stand-ins for values, as for the local
    key (``hooks.key_for_value``).
    """
    with portable_mode():
        extra = extra_parts_fn()
        ck = key.make_key(loader, arguments, extra or (), value_hook)
    material = repr(("overmind-fleet", FLEET_KEY_VERSION, stack_digest(stack()), ck.key))
    return hashlib.sha256(material.encode("ascii")).hexdigest()
