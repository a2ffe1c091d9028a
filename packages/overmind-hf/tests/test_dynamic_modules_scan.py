"""``dynamic_modules.any_imported``: the one-search test of ``sys.modules`` says what a test of each name says.

It decides whether an entry's result is walked for remote-code classes at all; a false "no" would write an
entry that cannot rebuild in a fresh process, so it is checked against the per-name definition over generated
module tables, near misses included (``transformers_modulesX``, ``xtransformers_modules.a``).
"""
from __future__ import annotations

import sys
import types

from hypothesis import given, settings
from hypothesis import strategies as st

from overmind_hf import dynamic_modules

PREFIXES = dynamic_modules.PREFIXES
_part = st.text(alphabet="abcx_.0", min_size=0, max_size=6)
_name = st.one_of(
    st.builds(lambda p, a, b: a + p + b, st.sampled_from(PREFIXES), _part, _part),  # near a prefix, or one
    st.sampled_from(PREFIXES),
    st.builds(lambda p, b: p + "." + b, st.sampled_from(PREFIXES), _part),
    _part.filter(bool),
)


def _by_name(names, prefixes) -> bool:
    return any(n == p or n.startswith(p + ".") for n in names for p in prefixes)


@settings(max_examples=300, deadline=None)
@given(st.lists(_name, max_size=6), st.sampled_from([PREFIXES, PREFIXES[:1], PREFIXES[1:]]))
def test_one_search_agrees_with_testing_each_name(names, prefixes):
    added = [n for n in dict.fromkeys(names) if n and n not in sys.modules]
    for n in added:
        sys.modules[n] = types.ModuleType(n)
    try:
        expected = _by_name(list(sys.modules), prefixes)
        assert dynamic_modules.any_imported(prefixes) is expected
    finally:
        for n in added:
            sys.modules.pop(n, None)


def test_a_dynamic_module_is_seen_and_its_classes_found():
    mod = types.ModuleType("transformers_modules.acme.modeling_acme")
    exec("class AcmeModel:\n    pass\n", mod.__dict__)  # noqa: S102 - a class defined in the fake dynamic module
    mod.AcmeModel.__module__ = mod.__name__
    sys.modules[mod.__name__] = mod
    try:
        assert dynamic_modules.any_imported()
        result = {"model": [mod.AcmeModel()]}
        assert dynamic_modules.referenced_modules(result) == {mod.__name__}
    finally:
        del sys.modules[mod.__name__]
