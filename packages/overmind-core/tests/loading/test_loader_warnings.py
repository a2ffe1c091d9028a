"""A cached call warns as the plain call does: the miss while its loader runs, a hit from what the entry
recorded (``overmind.loading.replay.loader_warnings``). Same category, text, file and line, as often as the user's filters
say, an "error" filter raising the same warning; and where a hit could not warn as plain does, nothing is cached.

Each example runs the plain call, the miss and a hit in this process, with every ``__warningregistry__`` and
the "once" registry emptied before each (as a fresh process has them), under one filter action of the user's.
"""
from __future__ import annotations

import functools
import json
import operator
import os
import subprocess
import sys
import threading
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overmind
from _support import warning_loaders as wl
from overmind.loading.replay import loader_warnings
from overmind.testing import clear_calls, recorded_calls

ACTIONS = ["default", "always", "once", "module", "ignore", "error"]


def _fresh_registries() -> None:
    for module in list(sys.modules.values()):
        g = getattr(module, "__dict__", None)
        if isinstance(g, dict) and isinstance(g.get("__warningregistry__"), dict):
            g["__warningregistry__"].clear()
    for g in loader_warnings._orphans.values():
        g.pop("__warningregistry__", None)
    warnings._onceregistry.clear()  # type: ignore[attr-defined]


def _shown(action: str, loader, description: tuple, calls: int) -> list:
    """What the user sees: each warning shown (category, text, file, line), or the one an "error" raised."""
    _fresh_registries()
    seen: list = []

    def show(message, category, filename, lineno, file=None, line=None):
        seen.append((category.__name__, str(message), filename, lineno))

    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter(action)  # the user's one filter
        warnings.showwarning = show
        try:
            for _ in range(calls):
                wl.call(loader, description)  # the line a stacklevel=3 warning names, in every mode
        except Warning as e:
            seen.append(("raised", type(e).__name__, str(e)))
    return seen


def _explicit_inside(description: tuple) -> bool:
    return any(s[0] == "explicit" or (s[0] == "nested" and _explicit_inside(s[1])) for s in description)


_category = st.sampled_from(sorted(wl.CATEGORIES))
_step = st.one_of(
    st.tuples(st.just("warn"), _category, st.sampled_from(["a", "b", "old argument"]), st.sampled_from([1, 2, 3, 400])),
    st.just(("torch",)),
    st.tuples(st.just("explicit"), _category, st.sampled_from(["a", "c"]), st.integers(1, 3)),
)
_descriptions = st.recursive(
    st.lists(_step, max_size=4).map(tuple),
    lambda inner: st.lists(st.one_of(_step, st.tuples(st.just("nested"), inner)), min_size=1, max_size=3).map(tuple),
    max_leaves=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(description=_descriptions, action=st.sampled_from(ACTIONS), calls=st.sampled_from([1, 2]))
def test_plain_miss_and_hit_show_the_same_warnings(overmind_runtime, monkeypatch, description, action, calls):
    cached = functools.partial(overmind.load, wl.warn_then_build)
    monkeypatch.setattr(wl, "NESTED_LOAD", operator.call)
    plain = _shown(action, wl.warn_then_build, description, calls)
    monkeypatch.setattr(wl, "NESTED_LOAD", overmind.load)
    miss = _shown(action, cached, description, calls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cached(description)  # published here if the miss raised (an "error" filter): the next one is a hit
    clear_calls("warning_loaders")
    hit = _shown(action, cached, description, calls)
    ran = recorded_calls("warning_loaders")
    assert miss == plain
    assert hit == plain
    if _explicit_inside(description):  # a warning at a place of its own: a hit could not know its registry
        assert ran, "a result whose loader warned with warnings.warn_explicit must not be cached"
    else:
        assert ran == [], f"the hit ran the loader: {ran}"


USER_SCRIPT = """\
import json, os, sys, warnings
sys.path.insert(0, os.environ["SUPPORT_DIR"])
import overmind
from _support import warning_loaders as wl
seen = []
warnings.showwarning = lambda m, c, f, n, file=None, line=None: seen.append([c.__name__, str(m), f, n])
d = (("warn", "FutureWarning", "old argument", 2), ("warn", "LibraryWarning", "b", 1), ("torch",))
for _ in range(2):
    t = wl.warn_then_build(d) if os.environ.get("PLAIN") else overmind.load(wl.warn_then_build, d)
print(json.dumps(seen))
"""


def test_a_warning_naming_the_callers_line_names_it_in_a_fresh_process(overmind_runtime, tmp_path):
    """Three fresh processes of one script: plain, the miss, a hit. A FutureWarning at the caller's line
    (stacklevel=2), one at the loader's line, torch's C++ warning; the second call shows nothing new."""
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    support = os.path.dirname(os.path.dirname(os.path.abspath(wl.__file__)))
    runs = []
    for extra in ({"PLAIN": "1"}, {}, {}):
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "SUPPORT_DIR": support, **extra})
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    plain, miss, hit = runs
    assert [w[0] for w in plain] == ["FutureWarning", "LibraryWarning", "UserWarning"]
    assert plain[0][2:] == [str(script), 9]  # the caller's line
    assert miss == plain
    assert hit == plain
    [entry] = [e for e in overmind.cache_info().entries if e.loader.endswith("warn_then_build")]
    assert entry.hits >= 1 and len(entry.meta["warnings"]) == 3


@pytest.mark.parametrize("action, text, runs, shown", [
    ("ignore", "quiet: now", 1, []),  # its filter drops the warning before Overmind's sees it: none to record
    ("ignore", "loud", 1, ["loud", "loud"]),  # a filter that does not match this warning changes nothing
    ("always", "quiet: now", 2, ["quiet: now", "quiet: now"]),  # its filter, not Overmind's, showed it: unsure
])
def test_a_loader_that_adds_a_filter(overmind_runtime, action, text, runs, shown):
    clear_calls("warning_loaders")
    seen: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: seen.append(str(m))
        for _ in range(2):
            _fresh_registries()
            overmind.load(wl.filters_then_warn, action, text)
    assert len(recorded_calls("warning_loaders")) == runs and seen == shown


@pytest.mark.parametrize("loader", [wl.records_its_own_warnings, wl.warns_a_local_category])
def test_a_loader_a_hit_could_not_imitate_is_not_cached(overmind_runtime, loader):
    """Warnings the loader catches itself (a hit would show them), a category no other process imports."""
    clear_calls("warning_loaders")
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            overmind.load(loader, "x")
        assert [str(w.message) for w in caught] == (["x"] if loader is wl.warns_a_local_category else [])
    assert len(recorded_calls("warning_loaders")) == 2
    assert not [e for e in overmind.cache_info().entries if e.loader.endswith(loader.__name__)]


def test_recording_leaves_the_filters_and_registries_as_they_were(overmind_runtime):
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.warn("before", UserWarning, stacklevel=1)  # this module's registry holds it now
        filters = list(warnings.filters)
        registry = dict(globals()["__warningregistry__"])
        show = warnings._showwarnmsg  # type: ignore[attr-defined]
        overmind.load(wl.warn_then_build, (("warn", "UserWarning", "inside", 1),))
        assert warnings.filters == filters
        assert warnings._showwarnmsg is show  # type: ignore[attr-defined]
        assert {k: v for k, v in globals()["__warningregistry__"].items() if k != "version"} == {
            k: v for k, v in registry.items() if k != "version"}


def test_a_failure_of_the_recorder_still_shows_the_warning_and_caches_nothing(overmind_runtime, monkeypatch):
    def broken(msg):
        raise RuntimeError("recorder bug")

    monkeypatch.setattr(loader_warnings, "_where_live", broken)
    clear_calls("warning_loaders")
    description = (("warn", "UserWarning", "still shown", 1),)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert overmind.load(wl.warn_then_build, description).tolist() == [0.0, 1.0]
        assert [str(w.message) for w in caught] == ["still shown"]
    assert len(recorded_calls("warning_loaders")) == 2  # not cached: the next call runs the loader again


def test_a_loader_whose_helper_thread_warns_is_not_cached(overmind_runtime):
    clear_calls("warning_loaders")
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            overmind.load(wl.warns_from_a_helper_thread, "from a helper")
        assert [str(w.message) for w in caught] == ["from a helper"]
    assert len(recorded_calls("warning_loaders")) == 2


def test_loads_in_concurrent_threads_keep_each_loaders_own_warnings(overmind_runtime):
    """Eight threads load at once, each warning its own text: whatever got cached warns, on a hit, exactly as its
    plain call does (an entry may be left uncached where another thread warned during its load)."""
    descriptions = [(("warn", "UserWarning", f"thread {i}", 1), ("torch",)) for i in range(8)]
    barrier = threading.Barrier(len(descriptions))

    def load(d):
        barrier.wait()
        overmind.load(wl.warn_then_build, d)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        threads = [threading.Thread(target=load, args=(d,)) for d in descriptions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    cached = functools.partial(overmind.load, wl.warn_then_build)
    for d in descriptions:
        assert _shown("always", cached, d, 1) == _shown("always", wl.warn_then_build, d, 1)


def test_a_category_of_the_users_script_is_not_cached(overmind_runtime):
    """``__main__`` is another script in another process: a hit there could not issue that category."""
    from overmind.testing import run_fresh

    got = run_fresh("""
        import warnings, torch, overmind
        from overmind.testing import report, record_call, recorded_calls

        class ScriptWarning(UserWarning):
            pass

        def build(n):
            record_call(n)
            warnings.warn("from the script", ScriptWarning)
            return torch.zeros(n)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            overmind.load(build, 3)
            overmind.load(build, 3)
        report({"runs": len(recorded_calls()), "shown": [str(w.message) for w in caught],
                "entries": len(overmind.cache_info().entries)})
    """)
    assert got == {"runs": 2, "shown": ["from the script"] * 2, "entries": 0}


def test_overmind_own_warning_inside_a_load_keeps_its_line_and_the_entry(overmind_runtime, monkeypatch):
    """Overmind itself warns inside a load (a nested load stepping aside): shown once, at the line Overmind chose
    (_util/user_frame.py), not recorded, and the outer result is still cached."""
    import inspect

    from overmind._util.user_frame import OvermindWarning

    monkeypatch.setenv("OVERMIND_STRICT", "0")
    source, first = inspect.getsourcelines(wl.steps_aside_inside)
    line = first + next(i for i, text in enumerate(source) if "fallback.step_aside(" in text)
    clear_calls("warning_loaders")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        overmind.load(wl.steps_aside_inside, "outer")
        overmind.load(wl.steps_aside_inside, "outer")
    ours = [(w.filename, w.lineno) for w in caught if issubclass(w.category, OvermindWarning)]
    assert ours == [(wl.__file__, line)]
    assert recorded_calls("warning_loaders") == ["outer"]  # cached: the second call was a hit
