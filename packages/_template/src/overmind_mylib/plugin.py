"""The mylib adapter: :data:`adapter`, the object the ``overmind.adapters`` entry point names; its
methods marked ``@hookimpl`` are its hooks (docs/adapters.md, "Hooks", says what each may do).

It imports nothing of Overmind but the kit (``overmind.adapter``), and mylib only inside the hooks
that run once mylib is imported: ``activate()`` imports this module in every process, whatever the
process loads.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from overmind.adapter import Function, SelfCheck, Spec, collect, fingerprint, hookimpl, owns

from . import self_check_sample


class MylibAdapter:
    """What Overmind needs to know of mylib: its loaders, what their keys lack, its self-check."""

    name = "mylib"  # the entry point's name, and the library whose import makes the adapter live
    # The loaders to patch: a classmethod of a class (and of each imported subclass that overrides
    # it), and a function, named where it is defined (patched there and wherever mylib re-exports
    # it). lazy=True patches a loader once the user imports its module (a module costly to import).
    FROM_PRETRAINED = (Spec("mylib.models:Model"),)
    CREATE_MODEL = (Function("mylib.models:create_model"),)
    SPECS = FROM_PRETRAINED + CREATE_MODEL

    @hookimpl
    def overmind_patch_targets(self) -> list:
        """Every loader of :attr:`SPECS` that this release of mylib defines."""
        return collect(self.name, self.SPECS)

    @hookimpl
    def overmind_key_parts(self, loader: Any, arguments: dict[str, Any]) -> list | None:
        """A model named, not given as a folder, is read from ``$MYLIB_HOME``: the key holds those
        files.

        The core keys every argument, and the files of an argument that is a path; a file the
        library finds by other means (an environment variable, a download cache) is the adapter's
        to add. A key hook runs in every process, before mylib may be imported: ``owns`` never
        imports, and mylib is looked up in ``sys.modules`` (one of its loaders was called).
        """
        if owns(loader, self.CREATE_MODEL):
            # else built at random (the core keys the draws), or from the checkpoint_path it names
            from_home = bool(arguments.get("pretrained"))
        else:
            from_home = owns(loader, self.FROM_PRETRAINED)
        name = arguments.get("name")
        if not from_home or not isinstance(name, str) or os.path.isdir(name):
            return None  # a folder argument: the core keys its files
        return [("mylib home", fingerprint(sys.modules["mylib.models"].locate(name)))]

    @hookimpl
    def overmind_self_check(self) -> SelfCheck:
        """On a mylib release newer than ``tested``: the loaders still take what the key hook reads,
        and a tiny model survives the entry codec (``overmind doctor`` shows the outcome)."""
        return SelfCheck(relies_on={"from_pretrained": ("name",),
                                    "create_model": ("name", "pretrained")},
                         sample=self_check_sample.sample)


adapter = MylibAdapter()
