"""The one plugin body of the Hugging Face adapters: the hooks transformers and diffusers have in common.

Each adapter's ``plugin.py`` declares only what differs, as module attributes read at call time (so a test
may swap ``SPECS``), and makes the adapter object its entry point names: a :class:`HubAdapter` over
itself, or over a subclass that adds hooks of its own::

    ADAPTER = "diffusers"                         # the adapter's name, and the library it instruments
    SPECS = (Spec("diffusers...:DiffusionPipeline"), ...)
    PRELOAD = (...)                               # modules imported before collecting (an ImportError fails)
    PRELOAD_IF_PRESENT = (...)                    # the same, skipped where this version lacks them
    DYNAMIC_MODULES = "diffusers_modules"         # where the library puts remote code
    def normalise(loader, arguments): ...         # fold the call's arguments; return extra key parts
    def key_for_value(value): ...                 # the library's own key stand-ins, or None
    def self_check_sample(): ...                  # a tiny object of the library, built from a config
    def self_check_describe(obj): ...             # what must survive the entry codec (optional)
    def refusal(result): ...                      # why a result is never cached, or None (optional)

    adapter = HubAdapter(__name__)                # [project.entry-points."overmind.adapters"]
                                                  # diffusers = "overmind_diffusers.plugin:adapter"

Shared: the patch targets of ``SPECS`` with their overriding subclasses; key parts under the never-guess
rule (a call the adapter cannot read is left uncached, with one warning); the Hub ``ResolvedRevision``
stand-in; the accelerate rule (:mod:`.dispatch`); remote code recorded with the entry and made importable
before it is unpickled (:mod:`.dynamic_modules`); the places where a result keeps the model path as the caller
spelled it (:mod:`.derived_paths`). Key hooks run in every process: they look the library up
in ``sys.modules`` and never import it.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
from types import ModuleType

from overmind.adapter import (
    NotCachedByDesign,
    SelfCheck,
    Uncacheable,
    code_keyed_by_adapter,
    collect,
    hookimpl,
    label,
    owns,
    raise_users,
    resolve_roots,
    waiting_modules,
    warn,
)

from . import derived_paths, dispatch, hub
from .arguments import PATH_NAMES, path_argument

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ContextManager, Iterator, Mapping


class HubAdapter:
    """The adapter whose declarations live in module ``declared`` (its ``plugin.py``): the object its
    entry point names, whose methods are its hooks."""

    def __init__(self, declared: str) -> None:
        self._declared = declared
        # The library's copies of a model folder's code: keyed here with the folder, carried in the entry.
        code_keyed_by_adapter(*hub.DYNAMIC_MODULE_PREFIXES)
        self._roots: tuple[type, ...] | None = None
        self._roots_waiting: list[str] = []  # the lazy modules not imported when _roots was resolved

    @property
    def _plugin(self) -> ModuleType:
        return sys.modules[self._declared]

    @property
    def _adapter(self) -> str:
        return self._plugin.ADAPTER

    def _owns(self, loader: Any) -> bool:
        if self._adapter not in sys.modules:
            return False  # no class of the library exists yet; resolving the roots would import it
        specs = self._plugin.SPECS
        if self._roots is None or any(m in sys.modules for m in self._roots_waiting):
            # unresolvable ones: reported by patch_targets; a lazy one joins once the user imports its module
            self._roots_waiting = waiting_modules(specs)
            self._roots = resolve_roots(specs)
        return owns(loader, self._roots)

    @hookimpl
    def overmind_patch_targets(self) -> list:
        """Every loader listed in the plugin's ``SPECS``, with the subclasses overriding it."""
        plugin = self._plugin
        for module in getattr(plugin, "PRELOAD", ()):
            importlib.import_module(module)
        for module in getattr(plugin, "PRELOAD_IF_PRESENT", ()):
            try:
                importlib.import_module(module)
            except ImportError:
                pass  # an older version without it: nothing there to patch
        return collect(self._adapter, plugin.SPECS)

    @hookimpl
    def overmind_patch_later(self) -> list[str]:
        """The modules of the plugin's lazy ``SPECS`` the user has not imported: patched once they are."""
        return waiting_modules(self._plugin.SPECS)

    @hookimpl
    def overmind_self_check(self) -> SelfCheck:
        """On a library release newer than the tested range: every ``from_pretrained``/``from_single_file`` still
        takes the model path (by one of its names, or as the first positional) and keyword arguments, which
        ``normalise`` reads by name; the plugin's sample survives the entry codec."""
        plugin = self._plugin
        path = "|".join((*PATH_NAMES, "*"))
        reads = (path, "**")
        return SelfCheck(relies_on={"from_pretrained": reads, "from_single_file": reads},
                         sample=getattr(plugin, "self_check_sample", None),
                         describe=getattr(plugin, "self_check_describe", None))

    @hookimpl
    def overmind_key_parts(self, loader: Any, arguments: dict[str, Any]) -> Any:
        """The plugin's ``normalise``: folded arguments and extra key parts (the resolved Hub revision)."""
        if not self._owns(loader):
            return None
        adapter = self._adapter
        try:
            return self._plugin.normalise(loader, arguments)
        except Uncacheable:
            raise
        except Exception as e:  # never guess a key: an adapter that cannot read the call leaves it uncached
            raise_users(e)
            warn(f"overmind: {label(adapter)} could not read the arguments of {loader.name} ({type(e).__name__}: "
                 f"{e}); loaded without the cache. Please report this with your {adapter} version.")
            raise Uncacheable(f"{adapter} adapter could not read the arguments: {e}") from e

    @hookimpl
    def overmind_key_for_value(self, value: Any) -> Any:
        """The plugin's own stand-ins; huggingface_hub ``ResolvedRevision`` by commit."""
        return self._plugin.key_for_value(value) or hub.key_for_resolved_revision(value)

    @hookimpl
    def overmind_prepare_result(self, result: Any, loader: Any) -> ContextManager | None:
        """Refuse accelerate-dispatched results; name this adapter in pickling failures."""
        if not self._owns(loader):
            return None
        refuse = getattr(self._plugin, "refusal", None)
        why = refuse(result) if refuse is not None else None
        if why:  # raised as the context is entered, as dispatch.guard's refusals are: a refusal, not a fault
            return _refusing(f"{label(self._adapter)}: {loader.name} returned a model not cached: {why}")
        return dispatch.guard(self._adapter, result, loader)

    @hookimpl
    def overmind_entry_metadata(self, result: Any, loader: Any) -> Mapping[str, Any] | None:
        """The dynamic modules (remote code) the result's classes come from, with their source."""
        from . import dynamic_modules  # late: its importlib.abc costs activate() 5 ms

        prefix = self._plugin.DYNAMIC_MODULES
        records = dynamic_modules.record(result, (prefix,))
        return {prefix: records} if records else None

    @hookimpl
    def overmind_derived_paths(self, result: Any, loader: Any, arguments: Mapping[str, Any]) -> list | None:
        """Where the result keeps the model path as this caller spelled it (:mod:`.derived_paths`)."""
        if not self._owns(loader):
            return None
        argument = path_argument(arguments)
        return None if argument is None else derived_paths.places(result, argument, arguments)

    @hookimpl
    def overmind_before_unpickle(self, metadata: Mapping[str, Any]) -> None:
        """Make the recorded dynamic modules importable in this process."""
        from . import dynamic_modules

        dynamic_modules.register(metadata.get(self._plugin.DYNAMIC_MODULES) or ())


@contextlib.contextmanager
def _refusing(message: str) -> Iterator[None]:
    """A context that refuses the result by design as it is entered (logged at INFO, never warned)."""
    raise NotCachedByDesign(message)
    yield  # a generator: the refusal happens on entering
