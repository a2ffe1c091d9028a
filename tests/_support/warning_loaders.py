"""Loaders that warn, for ``test_loader_warnings.py``: what they issue is described by their argument (so each
description is its own cache key); and :func:`exotic_tensors`, whose tensors torch also warns about where Overmind
pickles and rebuilds them (``test_own_warnings.py``).

A description is a tuple of steps:

* ``("warn", category, text, stacklevel)``: ``warnings.warn``; ``category`` names one of :data:`CATEGORIES`;
* ``("torch",)``: a warning torch issues from C++ (copy-constructing a tensor);
* ``("explicit", category, text, lineno)``: ``warnings.warn_explicit`` at a file and module of no frame;
* ``("nested", description)``: a nested load of another description (through :data:`NESTED_LOAD`).
"""
from __future__ import annotations

import operator
import warnings

import torch

from overmind.testing import record_call


class LibraryWarning(UserWarning):
    """A library's own category, importable by its name."""


CATEGORIES = {"UserWarning": UserWarning, "FutureWarning": FutureWarning, "DeprecationWarning": DeprecationWarning,
              "RuntimeWarning": RuntimeWarning, "LibraryWarning": LibraryWarning}
# How a nested step loads: operator.call (the plain call, and no frame of its own, as Overmind's frames count
# for no stacklevel) or overmind.load.
NESTED_LOAD = operator.call


def warn_then_build(description: tuple) -> torch.Tensor:
    record_call(description, "warning_loaders")
    for step in description:
        if step[0] == "warn":
            _, category, text, stacklevel = step
            warnings.warn(text, CATEGORIES[category], stacklevel=stacklevel)
        elif step[0] == "torch":
            torch.tensor(torch.ones(2))
        elif step[0] == "explicit":
            _, category, text, lineno = step
            warnings.warn_explicit(text, CATEGORIES[category], "elsewhere/made_up.py", lineno,
                                   module="made_up_module")
        elif step[0] == "nested":
            NESTED_LOAD(warn_then_build, step[1])
    return torch.arange(len(description) + 1, dtype=torch.float32)


def call(loader, description):
    """The caller's frame a ``stacklevel=2`` warning of the loader names, whichever way the loader is called."""
    return loader(description)


def filters_then_warn(action: str, text: str) -> torch.Tensor:
    """A loader that adds a filter of its own (as a module imported during a load may) before it warns."""
    record_call(text, "warning_loaders")
    warnings.filterwarnings(action, message="quiet:.*")
    warnings.warn(text, UserWarning, stacklevel=1)
    return torch.zeros(3)


def records_its_own_warnings(text: str) -> torch.Tensor:
    """A loader that catches the warnings it causes (the caller sees none of them)."""
    record_call(text, "warning_loaders")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        warnings.warn(text, UserWarning, stacklevel=1)
    return torch.zeros(4)


def warns_a_local_category(text: str) -> torch.Tensor:
    """A category no other process can import by its name."""
    record_call(text, "warning_loaders")

    class Local(UserWarning):
        pass

    warnings.warn(text, Local, stacklevel=1)
    return torch.zeros(5)


def warns_from_a_helper_thread(text: str) -> torch.Tensor:
    """A loader whose warning comes from a thread it starts (a pool loading its parts)."""
    import threading

    record_call(text, "warning_loaders")
    helper = threading.Thread(target=warnings.warn, args=(text, UserWarning))
    helper.start()
    helper.join()
    return torch.zeros(6)


def steps_aside_inside(text: str) -> torch.Tensor:
    """A loader in which Overmind itself warns (a nested load stepping aside, here said directly)."""
    from overmind import fallback

    record_call(text, "warning_loaders")
    fallback.step_aside("overmind: a nested load stepped aside (test)", RuntimeError("test"))
    return torch.zeros(7)


def exotic_tensors() -> dict:
    """A sparse CSR tensor and a qint8 one: torch warns as it makes them (beta, deprecated) and again where it
    pickles or rebuilds them (their reduce and ``torch._utils`` rebuilds, ``TypedStorage`` reads)."""
    record_call("exotic", "warning_loaders")
    dense = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    return {"csr": dense.to_sparse_csr(),
            "q": torch.quantize_per_tensor(torch.tensor([1.0, 2.0, -1.0, 0.5]), 0.1, 0, torch.qint8)}
