"""The warnings a loader issues: recorded on a miss (every one, before the user's filters; the miss still shows them
as plain does), kept in the entry's meta, issued again on a hit at the place plain names, through the process's
filters and registries; a loader whose warnings a hit could not imitate is not cached.

A plain call warns while its loader runs (a deprecated argument's ``FutureWarning``, a library's
``UserWarning``, torch's C++ warnings). A hit runs no loader, so a miss records every warning its loader
issues, the entry keeps them (meta ``"warnings"``), and a hit issues them again. Each one then goes through the
hit process's own filters as the loader's would have: same category, text, file, line and module, counted in
that module's ``__warningregistry__`` ("default", "module" and "once" show it as often as in plain, "error"
raises it, "ignore" drops it).

Where a warning is attributed (``stacklevel``) is counted as in the plain call, without Overmind's own frames
(the patched loader's wrapper, ``load``): a warning a loader attributes to its caller names the caller's line, in
the miss and in a hit. A location outside the call (the caller's line, or further up) is kept as a depth above
the call and found again in the hit's own stack; one inside the loader is kept as its file, line and module.

Recording does not change what the miss itself shows. While a recording runs, a filter at the front of
``warnings.filters`` answers ``always`` for the warnings of the recording thread alone (its category's metaclass
answers ``issubclass`` per thread), so every warning reaches ``warnings._showwarnmsg``; the recorder notes it and
issues it at once through the other filters, in the loader's thread, so "error" raises inside the loader as in
plain. The modules' ``__warningregistry__`` dicts are set aside for the recording and stand in for them in those
issues (so a warning this process showed before is recorded, and still not shown twice), and are put back after.

When in doubt, the result is not cached (:attr:`Recording.unsure`): a warning arrived while the loader had
changed how warnings are filtered or shown (its own ``catch_warnings``, a filter in front of Overmind's),
another thread warned meanwhile, or a warning could not be issued again in another process (a category not
importable by its name, a message not rebuilt from its arguments).
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import sys
import threading
import warnings
from types import FrameType
from typing import Any, Callable

from ..._util import interrupts, quiet_warnings
from ..._util.user_frame import is_overmind
from . import recordings

_local = threading.local()  # this thread's filter state: issuing a warning itself, the front filter matched
_saved: dict[str, Any] = {}  # while any recording runs: the original _showwarnmsg, the set-aside registries
_SCALARS = (str, int, float, bool, type(None))
_ORIGINAL_SHOW = warnings._showwarnmsg  # type: ignore[attr-defined]
_orphans: dict[str, dict] = {}  # stand-in module dicts of modules a replay names and this process has not imported


class _PerThread(type):
    def __subclasscheck__(cls, sub: type) -> bool:
        # (Overmind's own pickling or rebuilding inside a loader, a nested hit's: its warnings are no loader's)
        if _RUNNING.mine() and not getattr(_local, "issuing", False) and not quiet_warnings.active():
            _local.matched = True
            return True
        return False


class _RecordingThread(Warning, metaclass=_PerThread):
    """The category of Overmind's front filter: it matches every warning of a thread that is recording."""


_FILTER = ("always", None, _RecordingThread, None, 0)


def _filters() -> list:
    return warnings.filters  # type: ignore[return-value]  # a list (typeshed says Sequence)


def _chain(frame: FrameType | None) -> list[FrameType]:
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def _plain_chain(frame: FrameType | None) -> list[FrameType]:
    """The frames from ``frame`` up, as a plain call would have them: without Overmind's own."""
    return [f for f in _chain(frame) if not is_overmind(f)]


class Recording(recordings.Recording):
    """The warnings of one loader run; :attr:`records` goes into the entry, unless :attr:`unsure` says why not."""

    def __init__(self, call_frame: FrameType | None) -> None:
        super().__init__()
        self._frames = _plain_chain(call_frame)  # holds the frames whose ids ``outer`` keys on
        self.outer = {id(f): k for k, f in enumerate(self._frames)}
        self.records: list[dict] = []
        self.filters: list = []
        self.shown_by: tuple = ()

    def begin(self) -> None:
        """Overmind's filter goes to the front; then note how warnings are filtered and shown as the loader starts.
        (The filters need no ``_filters_mutated()``: they are read at every warning, and a new version would
        empty the registries set aside.)"""
        with contextlib.suppress(ValueError):
            _filters().remove(_FILTER)
        _filters().insert(0, _FILTER)
        self.filters = [f for f in warnings.filters if f is not _FILTER]
        self.shown_by = _shown_by()

    def changed_for(self, message: Warning, module: str, lineno: int) -> bool:
        """Whether the loader has changed, since it started, how ``message`` is filtered or shown."""
        if _shown_by() != self.shown_by:
            return True
        now = [f for f in warnings.filters if f is not _FILTER]
        if now == self.filters:
            return False
        changed = [f for f in now if f not in self.filters] + [f for f in self.filters if f not in now]
        return any(_matches(f, message, module, lineno) for f in changed)

    def note(self, message: Warning, where: tuple) -> None:
        """Record ``message``, issued at ``where`` (:func:`_where_live`'s form), as a hit will issue it."""
        if self.unsure is not None:
            return
        category = type(message)
        name = f"{category.__module__}:{category.__qualname__}"
        try:
            found = _import(name)
            args = list(message.args)
            rebuilt = found(*args) if all(type(a) in _SCALARS for a in args) else None
        except Exception as exc:
            interrupts.raise_users(exc)
            found, rebuilt = None, None
        if (found is not category or rebuilt is None or str(rebuilt) != str(message)
                or category.__module__ == "__main__"):  # another process's __main__ is another script
            self.doubt(f"the loader issued a {name} that another process could not issue again")
            return
        if where[0] == "frame":
            frame = where[1]
            k = self.outer.get(id(frame))
            at = (["outer", k] if k is not None else
                  ["at", frame.f_code.co_filename, frame.f_lineno, frame.f_globals.get("__name__") or "<string>"])
        else:
            at = list(where)
        self.records.append({"category": name, "args": args, "where": at})


def _import(name: str) -> Any:
    module, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _shown_by() -> tuple:
    """What shows a warning that the filters let through (a ``catch_warnings(record=True)`` changes it)."""
    return warnings.showwarning, getattr(warnings, "_showwarnmsg_impl", None)


def _matches(entry: tuple, message: Warning, module: str, lineno: int) -> bool:
    """Whether the ``warnings.filters`` entry applies to ``message`` (``warnings``' own rule)."""
    _action, text, category, mod, ln = entry
    try:
        return ((text is None or bool(text.match(str(message)))) and issubclass(type(message), category)
                and (mod is None or bool(mod.match(module))) and (ln == 0 or ln == lineno))
    except Exception as exc:
        interrupts.raise_users(exc)
        return True  # an odd entry: assume it applies


# --- a warning, from where it was issued to where the process's filters see it --------------------------------


def _where_live(msg: Any) -> tuple | None:
    """Where a plain call would have attributed the warning ``msg`` that reached :func:`_showwarnmsg`:
    ``("frame", f)`` or ``("sys",)`` (a ``stacklevel`` above the stack); None for a place on no frame."""
    chain = _chain(sys._getframe(2))  # the frame that warned (or called the C function that did), and up
    for j, frame in enumerate(chain):
        if frame.f_code.co_filename == msg.filename and frame.f_lineno == msg.lineno:
            if _is_overmind_category(msg.message):
                return ("frame", frame)  # Overmind names the user's line itself (user_frame.py), not by stacklevel
            plain = [f for f in chain if not is_overmind(f)]
            return ("frame", plain[j]) if j < len(plain) else ("sys",)
    if msg.filename == "sys" and msg.lineno == 1:
        return ("sys",)
    return None  # warnings.warn_explicit at a place of its choosing, with a registry a hit cannot know


def _where_recorded(at: list, plain_chain: list[FrameType]) -> tuple:
    if at[0] == "outer":
        return ("frame", plain_chain[at[1]]) if at[1] < len(plain_chain) else ("sys",)
    return tuple(at)


def _site(where: tuple, peek: bool = False) -> tuple[str, int, str, dict | None, dict | None]:
    """``(filename, lineno, module, registry, module_globals)`` for ``warnings.warn_explicit``; ``peek``: no
    registry (none is made)."""
    if where[0] == "frame":
        frame = where[1]
        g = frame.f_globals
        return (frame.f_code.co_filename, frame.f_lineno, g.get("__name__") or "<string>",
                None if peek else _registry(g), g)
    if where[0] == "sys":
        return "sys", 1, "sys", None if peek else _registry(sys.__dict__), None
    _, filename, lineno, module, *no_registry = where
    if peek or no_registry:
        return filename, lineno, module, None, None
    loaded = sys.modules.get(module)
    g = getattr(loaded, "__dict__", None)
    if not isinstance(g, dict):
        g = _orphans.setdefault(module, {})  # a module this process has not imported
        return filename, lineno, module, _registry(g), None
    return filename, lineno, module, _registry(g), g


def _registry(g: dict) -> dict:
    """The registry a plain call would count in: the module's own, or the one set aside for the recording."""
    aside = _saved.get("registries")
    if aside is not None:
        held = aside.get(id(g))
        if held is None:
            held = aside[id(g)] = (g, {})
        return held[1]
    return g.setdefault("__warningregistry__", {})


def _issue(message: Warning, site: tuple, source: Any = None) -> None:
    """Issue ``message`` at ``site`` (:func:`_site`'s) through this process's filters (Overmind's passes it by);
    what the filters raise ("error") or a ``showwarning`` raises propagates, as in plain."""
    filename, lineno, module, registry, module_globals = site
    _local.issuing = True
    try:
        warnings.warn_explicit(message, type(message), filename, lineno, module, registry, module_globals,
                               source=source)
    finally:
        _local.issuing = False


def _showwarnmsg(msg: Any) -> None:
    """``warnings._showwarnmsg`` while a recording runs."""
    mine = _RUNNING.mine()
    original = _saved.get("showwarnmsg", _ORIGINAL_SHOW)
    if getattr(_local, "issuing", False):
        return original(msg)
    _RUNNING.doubt_other_threads("another thread warned while the loader ran")
    if not mine:  # a thread that is not recording: its filters showed the warning
        return original(msg)
    matched, _local.matched = getattr(_local, "matched", False), False
    if not matched or not isinstance(msg.message, Warning):  # a filter in front of Overmind's showed it
        for rec in mine:
            rec.doubt("the loader changed the warning filters while it ran")
        return original(msg)
    module = msg.filename[:-3] if msg.filename.endswith(".py") else msg.filename
    site: tuple = (msg.filename, msg.lineno, module, None, None)  # what warn_explicit gets without the rest
    try:
        where = _where_live(msg)
        if _is_overmind_category(msg.message):
            pass  # Overmind's own (a nested load stepping aside): about this process, not the entry
        elif where is None:
            for rec in mine:
                rec.doubt("the loader issued a warning at a place of its own (warnings.warn_explicit)")
        else:
            _note(mine, msg.message, where)
        if where is not None:
            site = _site(where)
    except Exception as e:  # Overmind's own failure: the warning is still shown, the result not cached
        interrupts.raise_users(e)
        for rec in mine:
            rec.doubt(f"recording a warning failed ({type(e).__name__}: {e})")
    _issue(msg.message, site, msg.source)


def _is_overmind_category(message: Warning) -> bool:
    return type(message).__module__.split(".")[0] == "overmind"


def _note(mine: list[Recording], message: Warning, where: tuple) -> None:
    if _is_overmind_category(message):
        return  # Overmind's own (a nested load stepping aside) is about this process, not the entry
    try:
        filename, lineno, module, _registry_, _globals = _site(where, peek=True)
        for rec in mine:
            if rec.changed_for(message, module, lineno):
                rec.doubt("the loader changed how this warning is filtered or shown while it ran")
            else:
                rec.note(message, where)
    except Exception as e:  # Overmind's own failure: not cached
        interrupts.raise_users(e)
        for rec in mine:
            rec.doubt(f"recording a warning failed ({type(e).__name__}: {e})")


# --- recording and replaying -----------------------------------------------------------------------------------


def _set_aside_registries() -> None:
    """Every module's ``__warningregistry__`` of warnings already shown is set aside (``_saved["registries"]``),
    the module given an empty one, so the loader's warnings show (and are recorded) as in a fresh process. Noted
    first, then swapped, each in one call: a module whose registry an interrupted start noted and did not swap
    is swapped now; one swapped stays set aside, its newer registry merged into it when it comes back."""
    aside = _saved.setdefault("registries", {})
    new = {}
    for module in list(sys.modules.values()):
        g = getattr(module, "__dict__", None)
        if not isinstance(g, dict) or id(g) in aside:
            continue
        registry = g.get("__warningregistry__")
        if isinstance(registry, dict) and len(registry) > 1:  # more than its "version"
            new[id(g)] = (g, registry)
    aside.update(new)
    swap = [g for g, registry in aside.values() if g.get("__warningregistry__") is registry]
    list(map(dict.__setitem__, swap, itertools.repeat("__warningregistry__"), [{} for _ in swap]))


def _put_back_registries() -> None:
    """The registries set aside come back, with what the modules' own registries noted meanwhile. Every change is
    one call (``map`` of a C method, run by ``list``), safe to make again, so an interrupt leaves no module with
    the empty registry it was given while its own is still set aside and forgotten."""
    aside = _saved.get("registries")
    if aside:
        held = list(aside.values())
        current = [g.get("__warningregistry__") for g, _ in held]
        noted = [{k: v for k, v in now.items() if k != "version"} if isinstance(now, dict) and now is not registry
                 else {} for (_, registry), now in zip(held, current)]
        list(map(dict.update, [registry for _, registry in held], noted))
        list(map(dict.__setitem__, [g for g, _ in held], itertools.repeat("__warningregistry__"),
                 [registry for _, registry in held]))
    _saved.pop("registries", None)  # none set aside: a replay counts in the modules' own (``_registry``)


def _start() -> None:
    """The first recording of the process (of any thread) starts: the registries are set aside and Overmind's show
    hook goes in (the filter goes in as each recording starts). Run again over what an interrupted start or stop
    left, it completes it, and never saves the hook as the library's own."""
    if warnings._showwarnmsg is not _showwarnmsg:  # type: ignore[attr-defined]
        _saved["showwarnmsg"] = warnings._showwarnmsg  # type: ignore[attr-defined]
    _set_aside_registries()
    warnings._showwarnmsg = _showwarnmsg  # type: ignore[attr-defined]


def _stop() -> None:
    """The last recording ends: the registries, the filters and the show hook are as they were. Each step is
    safe to run again over an interrupted run (the recording that ends leaves its stack only after this)."""
    _put_back_registries()
    with contextlib.suppress(ValueError):
        _filters().remove(_FILTER)
    if warnings._showwarnmsg is _showwarnmsg:  # type: ignore[attr-defined]
        warnings._showwarnmsg = _saved["showwarnmsg"]  # type: ignore[attr-defined]


_RUNNING: recordings.Running[Recording] = recordings.Running(_start, _stop)


def recording(call_frame: FrameType | None) -> recordings.Recorder[Recording]:
    """``with recording(call_frame) as rec``: record the warnings issued in this thread inside the block;
    ``call_frame``: the frame of the cached call, whose callers (Overmind's left out) a warning's location is
    counted from."""
    return _RUNNING.running(Recording(call_frame))


class Replay:
    """An entry's recorded warnings, ready to issue: built inside the hit's fallback (a category that does not
    import here is a failed hit), issued outside it (an "error" filter raises to the caller, as in plain).
    ``call_frame``: the frame of the cached call, whose callers a warning at the caller's line names."""

    def __init__(self, records: list | None, call_frame: FrameType | None) -> None:
        plain = _plain_chain(call_frame) if records else []
        self.items = []
        for r in records or ():
            where = _where_recorded(r["where"], plain)
            self.items.append((_import(r["category"])(*r["args"]), where, _site(where)))

    def issue(self, between: Callable[[int | None], None] | None = None) -> None:
        """Issue the warnings; ``between(k)`` runs before the ``k``-th and ``between(None)`` after the last (the
        loader's log records go there, in the plain call's order: ``loader_logs.Replay.emit``)."""
        if self.items:
            _RUNNING.doubt_other_threads("another thread warned while the loader ran")
        mine = _RUNNING.mine()
        for k, (message, where, site) in enumerate(self.items):
            if between is not None:
                between(k)
            _note(mine, message, where)  # an outer miss records what this nested hit issues
            _issue(message, site)
        if between is not None:
            between(None)
