"""A stand-in for the library ``packages/_template`` instruments, as small as a real one's
loaders allow: :meth:`Model.from_pretrained` reads a folder (given, or named under ``$MYLIB_HOME``
as a download cache is), :func:`create_model` builds a network at random and loads a checkpoint
into it.

tests/test_adapter_template.py installs it beside the template; nothing else sees it."""
from __future__ import annotations

from .models import CONFIGS, Model, create_model, locate

__version__ = "1.0.0"
__all__ = ["CONFIGS", "Model", "create_model", "locate"]
