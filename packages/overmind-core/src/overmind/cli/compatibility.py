"""Which library versions are installed, and whether each lies in the tested range of the installed adapters
released with this Overmind (:func:`released_adapters`) or of a companion library.

CI runs the whole suite on the newest supported set (``scripts/requirements.txt``) and the adapter and
cross-process suites on the oldest (``scripts/requirements-oldest.txt``). The tested range of a library is
what lies between those two: for a library an adapter instruments, its ``tested`` requirement; for the
libraries those pull in, :data:`COMPANIONS` below. A version outside its range is not refused (an adapter
needs only its ``instruments``, and proves itself on a newer release: ``overmind.loading.adapter_check``):
``overmind doctor`` says so, so that a report of a fault can start from there.

>>> [(r.name, r.installed, r.tested, r.in_range) for r in library_versions()][:1]
[('torch', '2.13.0+cpu', '>=2.13,<2.14', True)]
"""
from __future__ import annotations

from dataclasses import dataclass

from .._util import distributions
from ..adapters import libraries

# The libraries the adapters' libraries need, as tested (both lanes' pins lie in each range; the lower bound is
# the oldest lane's release, the upper one the release after the newest lane's: tests/test_tested_versions.py).
COMPANIONS = {
    "torch": ">=2.13,<2.14",
    "huggingface-hub": ">=0.36,<2.5",
    "tokenizers": ">=0.22,<0.24",
    "accelerate": ">=1.15,<1.17",
    "safetensors": ">=0.8,<0.9",
    "sentence-transformers": ">=5.7,<6.4",
}


@dataclass(frozen=True)
class LibraryVersion:
    """One library: its installed version (``None``: not installed), its tested range and who declares it."""

    name: str
    installed: str | None
    tested: str
    declared_by: str  # "overmind-transformers tested", or "overmind (companion)"

    @property
    def in_range(self) -> bool | None:
        """Whether the installed version lies in the tested range (``None`` when it is not installed)."""
        if self.installed is None:
            return None
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        try:
            return SpecifierSet(self.tested).contains(Version(self.installed), prereleases=True)
        except InvalidVersion:
            return False


def _installed(name: str) -> str | None:
    return distributions.version(name)


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def _lower_first(specifier) -> str:
    """``>=4.57,<5.25`` rather than packaging's sorted ``<5.25,>=4.57``."""
    return ",".join(sorted(map(str, specifier), key=lambda s: (not s.startswith((">", "=", "~")), s)))


def released_adapters() -> list[str]:
    """The installed adapters released with this Overmind, by distribution name: each declares an
    ``overmind.adapters`` entry point and requires ``overmind-core`` at exactly this version, as every package of
    the Overmind repository does. Their ``tested`` ranges are the ones Overmind is tested with; a third-party
    adapter's range is its own, reported by its skip line."""
    from .._version import __version__
    from ..adapters.discovery import GROUP

    pinned = f"overmind-core=={__version__}"
    names = {ep.dist.name for ep in distributions.entry_points(GROUP)
             if any(line.replace(" ", "").split(";")[0] == pinned for line in ep.dist.requires or [])}
    return sorted(n for n in names if n)


def library_versions() -> list[LibraryVersion]:
    """Every instrumented library of an installed adapter and every companion library, once each, in that order:
    its installed version and tested range."""
    rows: dict[str, LibraryVersion] = {}
    for adapter in released_adapters():
        dist = distributions.distribution(adapter)
        if dist is None:
            continue
        for req in libraries.tested_requirements(dist):
            name = _canonical(req.name)
            if name not in rows and req.specifier:
                rows[name] = LibraryVersion(name, _installed(name), _lower_first(req.specifier),
                                            f"{adapter} tested")
    for name, tested in COMPANIONS.items():
        rows.setdefault(name, LibraryVersion(name, _installed(name), tested, "overmind (companion)"))
    return sorted(rows.values(), key=lambda r: (r.declared_by.endswith("(companion)"), r.name))


def checks() -> list:
    """``overmind doctor``'s lines: one per installed library, ok when in its tested range, else a warning."""
    from .checks import OK, WARN, Check

    out = []
    for row in library_versions():
        if row.installed is None:
            continue
        if row.in_range:
            out.append(Check(f"library {row.name}", OK, f"{row.installed} (tested: {row.tested})"))
        else:
            out.append(Check(f"library {row.name}", WARN,
                             f"{row.installed} is outside the tested range {row.tested} ({row.declared_by})",
                             f'pip install "{row.name}{row.tested}" for a tested setup, or report what fails '
                             f"with this version"))
    return out
