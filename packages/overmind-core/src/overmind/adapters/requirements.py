"""An adapter's ``instruments`` and ``tested`` requirement lines, and whether an installed version meets one, as
packaging says, without importing packaging for the plain shape.

The adapters declare the library versions they need as ``name>=A; extra == "instruments"`` and the ones their test
lanes run as ``name>=A,<B; extra == "tested"``: release bounds joined by commas. ``overmind.activate()`` checks
those against the installed versions, and importing packaging to do so would cost a quarter of activation. This
module reads that shape itself and compares as PEP 440 and packaging do (``<B`` admits none of B's pre-releases,
``>A`` none of A's post-releases or local versions, ``>=``, ``<=`` and ``==`` ignore a local label, ``~=A.B`` is
``>=A.B`` with ``A.*``). Every other line or version (another marker, extras, a URL, ``===``, wildcards, pre-release
or epoch bounds, a version spelled other than in normal form) is handed to packaging, so each answer is packaging's.

>>> r = parse('bitsandbytes<0.51,>=0.50; extra == "instruments"')
>>> str(r), r.instruments_only, r.satisfied_by("0.50.1"), r.satisfied_by("0.51.0rc1")
('bitsandbytes<0.51,>=0.50; extra == "instruments"', True, True, False)
"""
from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_LINE = re.compile(rf"\s*({_NAME})\s*([^;]*?)\s*;\s*extra\s*==\s*(['\"])([A-Za-z0-9_.-]+)\3\s*")
_CLAUSE = re.compile(r"\s*(~=|==|!=|<=|>=|<|>)\s*([0-9]+(?:\.[0-9]+)*)\s*")
_VERSION = re.compile(r"([0-9]+(?:\.[0-9]+)*)(?:(a|b|rc)([0-9]+))?(?:\.post([0-9]+))?(?:\.dev([0-9]+))?"
                      r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?")


class Requirement:
    """One requirement line: its name, specifier clauses and the one extra its marker selects alone (``"tested"``
    for ``extra == "tested"``; ``None`` without any extra, or for a marker no single extra decides)."""

    def __init__(self, name: str, clauses: tuple[str, ...], text: str, extra: str | None,
                 bounds: tuple[tuple[str, tuple[int, ...]], ...] | None, parsed: Any = None):
        self.name = name
        self.specifier = clauses  # each ``op`` + ``version``, in packaging's order (sorted as strings)
        self.extra = extra
        self.instruments_only = extra == "instruments"
        self._text = text
        self._bounds = bounds  # (op, release) of each clause; None: packaging compares
        self._parsed = parsed  # packaging's Requirement, when it parsed the line

    def __str__(self) -> str:
        return self._text

    def satisfied_by(self, version: str) -> bool:
        """Whether installed ``version`` meets the specifier, pre-releases admitted (packaging's
        ``SpecifierSet.contains(version, prereleases=True)``)."""
        parsed = _VERSION.fullmatch(version) if self._bounds is not None else None
        if parsed is None:
            from packaging.specifiers import SpecifierSet

            spec = self._parsed.specifier if self._parsed is not None else SpecifierSet(",".join(self.specifier))
            return bool(spec.contains(version, prereleases=True))
        release = tuple(map(int, parsed.group(1).split(".")))
        pre, post, dev = parsed.group(2), parsed.group(4), parsed.group(5)
        # Against a release R of the same numbers: below it (a pre-release, or a dev release not of a post),
        # above it (a post-release), or R itself (a local label is set aside where PEP 440 does).
        phase = -1 if pre is not None or (dev is not None and post is None) else (1 if post is not None else 0)
        assert self._bounds is not None
        return all(_meets(op, bound, release, phase) for op, bound in self._bounds)


def _trim(release: tuple[int, ...]) -> tuple[int, ...]:
    end = len(release)
    while end > 1 and release[end - 1] == 0:
        end -= 1
    return release[:end]


def _meets(op: str, bound: tuple[int, ...], release: tuple[int, ...], phase: int) -> bool:
    if op == "~=":
        prefix = bound[:-1]
        padded = release + (0,) * (len(prefix) - len(release))
        return padded[:len(prefix)] == prefix and _meets(">=", bound, release, phase)
    have, want = _trim(release), _trim(bound)
    if have != want:
        return {">=": have > want, ">": have > want, "<=": have < want, "<": have < want,
                "==": False, "!=": True}[op]
    # The same release numbers: ``<R`` and ``>R`` exclude R's whole family (pre, post, local); the others
    # compare the phase.
    return {">=": phase >= 0, "<=": phase <= 0, "==": phase == 0, "!=": phase != 0, "<": False, ">": False}[op]


def _fast(line: str) -> Requirement | None:
    """The requirement, if ``line`` has the plain shape this module compares itself; else None."""
    match = _LINE.fullmatch(line)
    if match is None:
        return None
    name, spec = match.group(1), match.group(2)
    if spec.startswith("("):
        if not spec.endswith(")"):
            return None
        spec = spec[1:-1].strip()
    bounds = []
    if spec:
        for clause in spec.split(","):
            c = _CLAUSE.fullmatch(clause)
            if c is None:
                return None
            release = tuple(map(int, c.group(2).split(".")))
            if c.group(1) == "~=" and len(release) < 2:
                return None  # packaging refuses it: let it say so
            bounds.append((c.group(1), c.group(2), release))
    if len({(op, _trim(r)) for op, _, r in bounds}) != len(bounds):
        return None  # packaging folds equal clauses: let it
    clauses = tuple(sorted(op + v for op, v, _ in bounds))
    extra = match.group(4)
    if extra != re.sub(r"[-_.]+", "-", extra).lower():
        return None  # an extra not in normal form: packaging normalises it (and prints it so)
    return Requirement(name, clauses, f'{name}{",".join(clauses)}; extra == "{extra}"', extra,
                       tuple((op, r) for op, _, r in bounds))


def parse(line: str, extra: str = "instruments") -> Requirement:
    """Parse one requirement line (``Requires-Dist``); raises packaging's ``InvalidRequirement`` for a line
    packaging refuses. ``extra``: the extra asked about, where the marker is one packaging evaluates."""
    fast = _fast(line)
    if fast is not None:
        return fast
    from packaging.requirements import Requirement as Parsed

    r = Parsed(line)
    only = (r.marker is not None and r.marker.evaluate({"extra": extra})
            and not r.marker.evaluate({"extra": ""}))
    clauses = tuple(str(r.specifier).split(",")) if r.specifier else ()  # packaging's order, equal ones folded
    return Requirement(r.name, clauses, str(r), extra if only else None, None, r)


def extra_only(lines: list[str], extra: str) -> list[Requirement]:
    """The requirements of ``lines`` that only extra ``extra`` selects. A line that names no extra at all cannot
    be one and is not parsed."""
    reqs = (parse(line, extra) for line in lines if "extra" in line and extra in line)
    return [r for r in reqs if r.extra == extra]


def instruments_only(lines: list[str]) -> list[Requirement]:
    """The requirements of ``lines`` that only the ``instruments`` extra selects (what activation needs)."""
    return extra_only(lines, "instruments")
