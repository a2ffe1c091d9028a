"""A result as an entry: the entry codec (:mod:`.codec`) pickles a result with its storages out of band and writes
it into a sealed memfd, and rebuilds the object from one.

The two functions here are what an adapter asks of the codec (the kit, ``overmind.adapter``, hands them on); they
import the codec, which imports torch, when called.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def meta_intended() -> None:
    """Say, inside an ``overmind_prepare_result`` context, that the meta tensors of the result being
    readied are meant: a model offloaded to disk whose hooks load those weights at call time, carried
    by the adapter. Without it, a result holding meta tensors is published only when its key says the
    call was made to produce them (``init_empty_weights``, a meta default device); otherwise it is
    returned unpublished, with an INFO line.
    """
    from .codec import intend_meta

    intend_meta()


def reduce_script_module(module: Any) -> tuple:
    """The core's reduce of a TorchScript module, ``(rebuild, args)``: its archive as one storage,
    rebuilt without a copy. For an adapter whose objects hold TorchScript modules the pickler does not
    meet as such."""
    from . import torchscript

    return torchscript.reduce_script_module(module)
