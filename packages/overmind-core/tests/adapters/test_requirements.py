"""overmind.adapters.requirements reads an adapter's ``instruments`` lines and compares versions as packaging does: every
answer here is checked against packaging itself, over versions chosen to sit on each rule's edge."""
from __future__ import annotations

import itertools

import pytest
from packaging.requirements import Requirement as PackagingRequirement

from overmind.adapters import requirements

VERSIONS = [
    "0.49.9", "0.50", "0.50.0", "0.50.1", "0.50.post1", "0.50.0.post1.dev2", "0.50+cpu", "0.50.0+cu121.x",
    "0.51", "0.51.0", "0.51.0rc1", "0.51a0", "0.51b3", "0.51.dev0", "0.51.0.dev4", "0.51rc1.post2",
    "1", "1.0", "1.0.0", "1.0.0.0", "1.0.1", "1.0.1+abc.1", "1.0a1", "1.0.dev3", "1.0.post1", "1.0+local",
    "1.1", "1.9rc1", "2", "2.0.0rc1", "2.13.0+cpu", "2.13.1", "2.14.0.dev20260101", "4.57.1", "5.24.0",
    "5.25.0rc0", "5.25", "10.0", "0.100",
    # spelled other than in normal form, an epoch, not a version: packaging decides these
    "1!1.0", "1.0-1", "1.0RC1", "v1.0", "1.0.0-dev1", "junk", "",
]
SPECS = [
    ">=0.50,<0.51", "<0.51,>=0.50", ">=0.50.0", "<0.51", "<=0.51", ">0.50", "==0.50", "==0.50.0", "!=0.50",
    "~=0.50", "~=0.50.0", "~=1.0", "~=2.13", ">=1", ">1", "<1", "<=1", "==1", "!=1.0.0", ">=1.0,!=1.0.1",
    ">=2.13,<2.14", ">=4.57,<5.25", ">=99", "<2", "", " >= 1.0 , < 2 ", "(>=1.0,<2)",
    # shapes packaging handles: wildcards, pre-release bounds, ===, an epoch
    "==1.*", "!=0.50.*", ">=1.0rc1", "<2.0.dev0", "===1.0", ">=1!0.5",
]


def _ours_and_theirs(line):
    return requirements.parse(line), PackagingRequirement(line)


@pytest.mark.parametrize("spec", SPECS)
def test_each_version_meets_each_specifier_exactly_when_packaging_says_so(spec):
    line = f'lib{spec}; extra == "instruments"'
    ours, theirs = _ours_and_theirs(line)
    for version in VERSIONS:
        assert ours.satisfied_by(version) == theirs.specifier.contains(version, prereleases=True), (spec, version)


@pytest.mark.parametrize("spec", SPECS)
def test_the_plain_shapes_are_compared_without_packaging(spec):
    fast = requirements._fast(f'lib{spec}; extra == "instruments"')
    plain = not any(s in spec for s in ("*", "rc", "dev", "===", "1!"))
    assert (fast is not None) == plain, spec


@pytest.mark.parametrize("line", [
    'bitsandbytes<0.51,>=0.50; extra == "instruments"',
    "diffusers >= 0.35 , < 0.43 ; extra=='instruments'",
    'Stable_Fast (>=1.0.5,<1.1); extra == "instruments"',
    'torch>=99; extra == "instruments"',
    'plain; extra == "instruments"',
    'lib[fast,a]>=1; extra == "instruments"',
    'lib>=1; extra == "instruments" and python_version >= "3"',
    'lib>=1; extra == "instruments" or extra == "other"',
    'lib>=1; extra == "Instruments"',
    'lib>=1; extra == "other"',
    'lib>=1; extra != "instruments"',
    'lib>=1; python_version >= "3"',
    'lib>=1,>=1.0; extra == "instruments"',
    'lib @ https://example.com/lib-1.0.tar.gz ; extra == "instruments"',
])
def test_each_line_reads_as_packaging_reads_it(line):
    ours, theirs = _ours_and_theirs(line)
    only = bool(theirs.marker is not None and theirs.marker.evaluate({"extra": "instruments"})
                and not theirs.marker.evaluate({"extra": ""}))
    assert (ours.name, str(ours), ours.instruments_only) == (theirs.name, str(theirs), only)
    assert ",".join(ours.specifier) == str(theirs.specifier)


def test_only_the_instruments_lines_are_kept_and_lines_without_an_extra_are_not_parsed():
    lines = ["overmind-core==0.1.0", "not a requirement at all", 'lib>=1; extra == "instruments"',
             'other>=2; extra == "test"']
    assert [str(r) for r in requirements.instruments_only(lines)] == ['lib>=1; extra == "instruments"']


def test_a_line_packaging_refuses_raises_packagings_error():
    from packaging.requirements import InvalidRequirement

    with pytest.raises(InvalidRequirement):
        requirements.parse('lib>=>1; extra == "instruments"')


def test_every_operator_pair_on_shared_release_numbers_agrees_with_packaging():
    # Bounds and versions that share release numbers, where PEP 440's exclusions live.
    bounds = ["1", "1.0", "1.0.0", "1.2"]
    versions = [f"{r}{s}" for r, s in itertools.product(["1", "1.0", "1.0.0", "1.2", "1.2.0"],
                                                         ["", "a1", "rc2", ".dev0", ".post1", ".post1.dev1", "+l",
                                                          "rc1.post1", ".post2+l"])]
    for op, bound in itertools.product(["<", "<=", ">", ">=", "==", "!=", "~="], bounds):
        if op == "~=" and "." not in bound:
            continue
        ours, theirs = _ours_and_theirs(f'lib{op}{bound}; extra == "instruments"')
        for v in versions:
            assert ours.satisfied_by(v) == theirs.specifier.contains(v, prereleases=True), (op, bound, v)
