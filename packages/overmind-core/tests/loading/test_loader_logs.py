"""A hit logs as the plain call logs (``overmind.loading.replay.loader_logs``): the same records, to the same loggers, with the
same names, levels, messages, places, exception text and extra attributes, in the same order among the warnings.

Hypothesis generates loaders (records at several levels, one with an exception, one with an extra attribute, a
branch on ``isEnabledFor``/``getEffectiveLevel``, warnings between them) and the logger's level when the entry is
made and when it is used. Each call through ``overmind.load`` must show exactly what the plain call shows under
the same level; when the two levels agree a non-empty loader's second call must be a hit.

Once-only methods (transformers' ``warning_once``, a ``functools.lru_cache`` on ``Logger``): hypothesis generates
programs of loads and of the user's own once-only calls, run plainly and through ``overmind.load``, each from an
empty cache of the method: the same records must show, wherever the entries were made.
"""
from __future__ import annotations

import functools
import logging
import threading
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overmind
from overmind.client import connection as client_mod
from overmind.loading.replay import loader_logs

LIB = logging.getLogger("overmind_tests_lib.loading")
LEVELS = [logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR]
STEPS = ["warning", "info", "debug-if-enabled", "effective", "warn", "extra", "exception", "error-percent"]


def load_logging(steps: tuple, n: int):
    more = 0
    for k, step in enumerate(steps):
        if step == "warning":
            LIB.warning("weights %s of %d were not used", k, n)
        elif step == "info":
            LIB.info("loaded part %d", k)
        elif step == "debug-if-enabled":
            if LIB.isEnabledFor(logging.DEBUG):
                LIB.debug("expensive detail %s", "x" * k)
                more += 1
        elif step == "effective":  # the result itself follows the logging configuration
            more += 10 if LIB.getEffectiveLevel() <= logging.INFO else 0
        elif step == "warn":
            warnings.warn(f"careful with part {k}", UserWarning, stacklevel=1)
        elif step == "extra":
            LIB.warning("component %s", k, extra={"component": f"part-{k}", "size": n})
        elif step == "exception":
            try:
                raise ValueError(f"bad part {k}")
            except ValueError:
                LIB.exception("could not read part %d", k)
        elif step == "error-percent":
            LIB.error("100%% of part %d, %s", k, "50% done")
    return torch.full((n,), float(len(steps) + more))


class Events(logging.Handler):
    def __init__(self, events: list) -> None:
        super().__init__(logging.DEBUG)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        exc = logging.Formatter().formatException(record.exc_info) if record.exc_info else record.exc_text
        self.events.append(("log", record.name, record.levelno, record.getMessage(), record.pathname,
                            record.lineno, record.funcName, exc, getattr(record, "component", None),
                            getattr(record, "size", None)))


def shown(call, level: int) -> tuple:
    """What ``call()`` shows (log records and warnings, in order) with LIB at ``level``, and its result."""
    events: list = []
    handler = Events(events)
    LIB.setLevel(level)
    LIB.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda m, c, f, n, file=None, line=None: events.append(
                ("warning", c.__name__, str(m), f, n))
            result = call()
    finally:
        LIB.removeHandler(handler)
        LIB.setLevel(logging.NOTSET)
    return events, result.tolist()


def _hits() -> int:
    return sum(e["hits"] for e in client_mod.get_client().ls())


@pytest.fixture
def quiet_lib():
    LIB.propagate = False  # pytest's capture handlers see nothing of it
    yield
    LIB.propagate = True


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(st.sampled_from(STEPS), max_size=5).map(tuple), n=st.integers(1, 4),
       made_at=st.sampled_from(LEVELS), used_at=st.sampled_from(LEVELS))
def test_a_hit_logs_what_the_plain_call_logs(overmind_runtime, quiet_lib, steps, n, made_at, used_at):
    for level, attempt in ((made_at, "made"), (used_at, "used")):
        plain = shown(lambda: load_logging(steps, n), level)
        hits = _hits()
        got = shown(lambda: overmind.load(load_logging, steps, n), level)
        assert got == plain, (attempt, steps)
    if made_at == used_at and steps:
        assert _hits() == hits + 1, "the second call at the same level is served from the cache"


def test_warnings_shown_through_logging_are_shown_once_by_a_hit(overmind_runtime, quiet_lib):
    """With ``logging.captureWarnings(True)`` a warning becomes a ``py.warnings`` record: a hit replays the warning,
    which makes that record again; the record itself is not kept as well."""
    events: list = []
    handler = Events(events)
    captured = logging.getLogger("py.warnings")
    captured.addHandler(handler)
    logging.captureWarnings(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            load_logging(("warn",), 5)
            plain = list(events)
            for _ in range(2):
                del events[:]
                overmind.load(load_logging, ("warn",), 5)
                assert [e[:4] for e in events] == [e[:4] for e in plain]
    finally:
        logging.captureWarnings(False)
        captured.removeHandler(handler)
    assert len(plain) == 1 and "careful with part 0" in plain[0][3]


def test_a_process_whose_logging_answers_otherwise_is_not_served(overmind_runtime, quiet_lib, caplog):
    overmind.load(load_logging, ("info",), 9)  # made at the default level (WARNING): the info record is not made
    with caplog.at_level(logging.DEBUG, logger="overmind"):
        events, _ = shown(lambda: overmind.load(load_logging, ("info",), 9), logging.INFO)
    assert [e[3] for e in events] == ["loaded part 0"]  # the plain loader ran and logged
    assert any("not serving entry" in r.getMessage() and "'overmind_tests_lib.loading' answers" in r.getMessage()
               for r in caplog.records)


def load_with_a_helper_thread(logger_name: str, method: str, n: int):
    """A loader whose helper thread logs through ``logging.getLogger(logger_name).<method>`` meanwhile."""
    t = threading.Thread(target=getattr(logging.getLogger(logger_name), method), args=("from a helper thread",))
    t.start()
    t.join()
    return torch.ones(n)


def test_another_thread_logging_during_the_load_leaves_it_uncached(overmind_runtime, quiet_lib):
    for _ in range(2):
        hits = _hits()
        overmind.load(load_with_a_helper_thread, "overmind_tests_lib.other", "warning", 3)
        assert _hits() == hits


def test_the_logger_methods_are_put_back_after_every_load(overmind_runtime):
    before = {name: vars(logging.Logger)[name] for name in ("handle", "isEnabledFor", "getEffectiveLevel")}
    overmind.load(load_logging, ("warning",), 2)
    overmind.load(load_logging, ("warning",), 2)
    assert {name: vars(logging.Logger)[name] for name in before} == before
    assert not loader_logs._RUNNING.any()


@functools.lru_cache(None)
def _warning_once(self, *args, **kwargs):
    self.warning(*args, **kwargs)


@functools.lru_cache(None)
def _info_once(self, *args, **kwargs):
    self.info(*args, **kwargs)


@pytest.fixture
def once_methods():
    """``Logger.test_warning_once``/``test_info_once``, made as transformers makes its ``warning_once``."""
    logging.Logger.test_warning_once = _warning_once
    logging.Logger.test_info_once = _info_once
    yield
    del logging.Logger.test_warning_once, logging.Logger.test_info_once


ONCE_STEPS = ["once-a", "once-b", "once-args", "info-once", "once-kwarg", "warning", "warn"]


def load_once(steps: tuple, n: int):
    for k, step in enumerate(steps):
        if step == "once-a":
            LIB.test_warning_once("`torch_dtype` is deprecated! Use `dtype` instead!")
        elif step == "once-b":
            LIB.test_warning_once("a notice of its own")
        elif step == "once-args":
            LIB.test_warning_once("part %s of %d", "x", n)
        elif step == "info-once":  # disabled at WARNING: the call is still remembered
            LIB.test_info_once("an info once")
        elif step == "once-kwarg":  # a keyword a hit could not pass as it was: not cached; the record names this
            LIB.test_warning_once("with a keyword", stacklevel=2)  # line in the miss as in plain
        elif step == "warning":
            LIB.warning("loaded part %d", k)
        elif step == "warn":
            warnings.warn(f"careful with part {k}", UserWarning, stacklevel=1)
    return torch.full((n,), float(len(steps)))


def _run_program(program: list, through_overmind: bool) -> list:
    """Run the actions, from empty caches of the once-only methods; a load's hit count, or None plainly."""
    _warning_once.cache_clear()
    _info_once.cache_clear()
    served = []
    for action, arg in program:
        if action == "user":
            LIB.test_warning_once("`torch_dtype` is deprecated! Use `dtype` instead!" if arg == 0 else "a notice of its own")
        elif through_overmind:
            hits = _hits()
            overmind.load(load_once, arg, 2)
            served.append(_hits() - hits)
        else:
            load_once(arg, 2)
    return served


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=st.lists(st.one_of(
    st.tuples(st.just("user"), st.integers(0, 1)),
    st.tuples(st.just("load"), st.lists(st.sampled_from(ONCE_STEPS), min_size=1, max_size=3).map(tuple))),
    min_size=1, max_size=5))
def test_once_only_records_show_as_plain_shows_them(overmind_runtime, quiet_lib, once_methods, program):
    plain = shown(lambda: (_run_program(program, False), torch.zeros(1))[1], logging.WARNING)
    served: list = []
    got = shown(lambda: (served.extend(_run_program(program, True)), torch.zeros(1))[1], logging.WARNING)
    assert got == plain, program
    loads = [arg for action, arg in program if action == "load"]
    for k, steps in enumerate(loads):
        if steps in loads[:k] and "once-kwarg" not in steps:
            assert served[k] == 1, f"the repeated load {steps} is served from the cache"


def test_a_once_only_call_the_recording_did_not_see_leaves_the_load_uncached(overmind_runtime, quiet_lib,
                                                                            once_methods):
    """A once-only method called from another thread during the load: its record is not the loader's to keep."""
    for _ in range(2):
        _warning_once.cache_clear()
        hits = _hits()
        events, _ = shown(lambda: overmind.load(load_with_a_helper_thread, LIB.name, "test_warning_once", 4),
                          logging.WARNING)
        assert _hits() == hits
        assert [e[3] for e in events] == ["from a helper thread"]


def test_the_once_only_methods_are_put_back_and_keep_their_place(overmind_runtime, quiet_lib, once_methods):
    """While a load records, ``findCaller`` skips the stand-in's frame: the record names the method's own line."""
    overmind.load(load_once, ("once-b",), 3)
    assert vars(logging.Logger)["test_warning_once"] is _warning_once
    _warning_once.cache_clear()
    plain, _ = shown(lambda: load_once(("once-b", "once-a"), 3), logging.WARNING)
    _warning_once.cache_clear()
    miss, _ = shown(lambda: overmind.load(load_once, ("once-b", "once-a"), 3), logging.WARNING)
    assert miss == plain and [e[6] for e in plain] == ["_warning_once", "_warning_once"]


def test_a_once_only_call_not_made_through_logger_leaves_the_load_uncached(overmind_runtime, quiet_lib, once_methods):
    """The cached function called as a function (or a method defined while the loader runs) bypasses the stand-in;
    its cache counts a call the recording did not see. Kept as a plain record, a second hit would show it again."""
    def loader_calling_it_directly(n: int):
        _warning_once(LIB, "called directly")
        return torch.ones(n)

    _warning_once.cache_clear()
    plain = [shown(lambda: loader_calling_it_directly(5), logging.WARNING)[0] for _ in range(2)]
    _warning_once.cache_clear()
    got = []
    for _ in range(2):
        hits = _hits()
        got.append(shown(lambda: overmind.load(loader_calling_it_directly, 5), logging.WARNING)[0])
        assert _hits() == hits
    assert got == plain and [len(e) for e in plain] == [1, 0]


SETUP_CHANGES = {
    "level": lambda: LIB.setLevel(logging.ERROR),
    "handler": lambda: LIB.addHandler(logging.NullHandler()),
    "propagate": lambda: setattr(LIB, "propagate", not LIB.propagate),
    "disable": lambda: logging.disable(logging.INFO),
    "root-level": lambda: logging.root.setLevel(logging.CRITICAL),
}


def load_changing_setup(change: str, n: int):
    if change == "restored":  # changed and put back: nothing a hit would miss
        LIB.setLevel(logging.ERROR)
        LIB.setLevel(logging.NOTSET)
    elif change == "new-logger":  # made while the loader ran (an import would make it in a hit too)
        logging.getLogger(f"overmind_tests_lib.made_by_the_loader_{n}")
    else:
        SETUP_CHANGES[change]()
    return torch.ones(n)


@pytest.mark.parametrize("change", [*SETUP_CHANGES, "restored", "new-logger"])
def test_a_loader_that_changes_the_logging_set_up_is_not_cached(overmind_runtime, quiet_lib, change):
    saved = (LIB.level, list(LIB.handlers), LIB.propagate, logging.root.level, logging.root.manager.disable)
    try:
        for _ in range(2):
            hits = _hits()
            overmind.load(load_changing_setup, change, 3)
            LIB.setLevel(saved[0]), setattr(LIB, "handlers", list(saved[1])), setattr(LIB, "propagate", saved[2])
            logging.root.setLevel(saved[3]), logging.disable(saved[4])
        assert _hits() == hits + (1 if change in ("restored", "new-logger") else 0), change
    finally:
        LIB.setLevel(saved[0]), setattr(LIB, "handlers", saved[1]), setattr(LIB, "propagate", saved[2])
        logging.root.setLevel(saved[3]), logging.disable(saved[4])


ROOT_CONFIGURED = """
import io, logging, os, sys
sys.stderr = err = io.StringIO()  # the last resort and basicConfig()'s handler write here
import torch, overmind
from overmind.client.connection import get_client
from overmind.testing import report

LIB = logging.getLogger("overmind_tests_lib.root")


def load_configuring(n):
    LIB.warning("before: the last resort shows it")
    logging.info("not shown, but the root logger gets basicConfig()'s handler")
    LIB.warning("after: through that handler")
    return torch.ones(n)


def load_configuring_otherwise(how, n):
    if how == "level":
        logging.basicConfig(level=logging.ERROR)
    elif how == "format":
        logging.basicConfig(format="%(message)s")
    else:
        logging.root.addHandler(logging.StreamHandler())
    return torch.ones(n)


active = os.environ.get("OVERMIND_DISABLE") != "1"
call = overmind.load if active else (lambda fn, *a: fn(*a))
hits = lambda: sum(e["hits"] for e in get_client().ls()) if active else 0
call(load_configuring, 2)
call(load_configuring, 2)  # the root logger has its handler now: none is added
seen = {"shown": err.getvalue(), "handlers": len(logging.root.handlers), "hits": hits(), "others": {}}
for how in ("level", "format", "handler"):  # other changes of the root logger: not made again by a hit
    logging.root.handlers.clear()
    logging.root.setLevel(logging.WARNING)
    before = hits()
    call(load_configuring_otherwise, how, 3)
    seen["others"][how] = hits() - before
sys.stderr = sys.__stderr__
report(seen)
"""


def test_a_module_level_log_call_that_configures_the_root_logger_is_made_again_by_a_hit(overmind_runtime):
    """``logging.info()`` with no handler on the root logger calls ``basicConfig()`` (open_clip's loaders do): the
    process's later records reach standard error. A hit makes that call where the plain call made it among the
    records, and leaves a root logger that has a handler as it is; another change of the root logger's set-up
    (a level, a format, a handler of its own) leaves the call uncached. Plain, then a miss, then a hit process."""
    from overmind.testing import run_fresh

    plain = run_fresh(ROOT_CONFIGURED, env={"OVERMIND_DISABLE": "1"})
    miss, hit = run_fresh(ROOT_CONFIGURED), run_fresh(ROOT_CONFIGURED)
    assert plain["shown"].splitlines() == [
        "before: the last resort shows it", "WARNING:overmind_tests_lib.root:after: through that handler",
        "WARNING:overmind_tests_lib.root:before: the last resort shows it",
        "WARNING:overmind_tests_lib.root:after: through that handler"]
    assert plain["handlers"] == 1
    for run, hits in ((miss, 1), (hit, 3)):  # the miss process's second call is a hit already
        assert (run["shown"], run["handlers"], run["hits"]) == (plain["shown"], 1, hits)
        assert run["others"] == {"level": 0, "format": 0, "handler": 0}


LATE_MODULE = '''
import functools, logging


@functools.lru_cache(None)
def late_warning_once(self, *args, **kwargs):
    self.warning(*args, **kwargs)


logging.Logger.late_warning_once = late_warning_once
'''

LATE_SCRIPT = '''
import logging, os, torch, overmind
from overmind.client.connection import get_client
from overmind.testing import report

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append([record.name, record.getMessage(), os.path.basename(record.pathname), record.funcName])


lib = logging.getLogger("late_lib")
lib.addHandler(Keep())
lib.propagate = False


def load(n):
    import late_once_module  # the first import defines Logger.late_warning_once, while the loader runs
    for message in ("first", "second", "first"):
        lib.late_warning_once(message)
    return torch.ones(n)


active = os.environ["ACTIVE"] == "1"
for _ in range(2):
    (overmind.load(load, 2) if active else load(2))
report({"records": records, "hits": sum(e["hits"] for e in get_client().ls()) if active else 0})
'''


def test_a_once_only_method_defined_while_the_loader_runs_is_followed_by_its_frames(overmind_runtime, tmp_path):
    """transformers imported by the loader itself defines ``warning_once`` meanwhile: no stand-in is in place, so
    the calls that run its body are noted from their frames; the entry is made and a hit shows what plain shows."""
    from overmind.testing import run_fresh

    (tmp_path / "late_once_module.py").write_text(LATE_MODULE)
    env = {"PYTHONPATH": str(tmp_path)}
    plain = run_fresh(LATE_SCRIPT, env={**env, "ACTIVE": "0"})
    assert [r[1] for r in plain["records"]] == ["first", "second"]
    cold = run_fresh(LATE_SCRIPT, env={**env, "ACTIVE": "1"})
    warm = run_fresh(LATE_SCRIPT, env={**env, "ACTIVE": "1"})
    assert cold["records"] == plain["records"] and warm["records"] == plain["records"]
    # Each serving is two hits: the call's marker (its entry varies with late_once_module.py, which the loader
    # imports: loading/code_deps.py) and the variant of that file.
    assert cold["hits"] == 2 and warm["hits"] == 6, "published by the first call, served to the next three"


def test_odd_once(self, message):  # not transformers' (self, *args, **kwargs): its call cannot be read back
    self.warning(message)


test_odd_once.__test__ = False  # a logging method, not a test


def load_defining_an_odd_once_method(n: int):
    logging.Logger.test_odd_once = functools.lru_cache(None)(test_odd_once)
    LIB.test_odd_once("an odd notice")
    return torch.ones(n)


def test_a_once_only_method_of_another_signature_leaves_the_load_uncached(overmind_runtime, quiet_lib):
    try:
        for _ in range(2):
            hits = _hits()
            events, _ = shown(lambda: overmind.load(load_defining_an_odd_once_method, 3), logging.WARNING)
            assert _hits() == hits
            assert [e[3] for e in events] == ["an odd notice"]
    finally:
        if "test_odd_once" in vars(logging.Logger):
            del logging.Logger.test_odd_once


def notice_once(self, *args, **kwargs):
    self.warning(*args, **kwargs)


def load_replacing_a_once_method(n: int):
    logging.Logger.notice_once = functools.lru_cache(None)(notice_once)  # a new method, its cache empty
    LIB.notice_once("from a method the loader replaced")
    return torch.ones(n)


def test_a_loader_that_replaces_a_once_only_method_is_not_cached(overmind_runtime, quiet_lib):
    """Plain, each call makes a new method and shows the notice again; a hit would call the one the process
    already has, whose cache holds it. The method the loader found has counts of 0, as the replacement's end at
    one call seen: only their identity tells them apart."""
    try:
        plain = [shown(lambda: load_replacing_a_once_method(3), logging.WARNING)[0] for _ in range(2)]
        got = []
        for _ in range(3):
            logging.Logger.notice_once = functools.lru_cache(None)(notice_once)
            hits = _hits()
            got.append(shown(lambda: overmind.load(load_replacing_a_once_method, 3), logging.WARNING)[0])
            assert _hits() == hits
        assert got == plain + plain[:1] and [len(e) for e in plain] == [1, 1]
    finally:
        del logging.Logger.notice_once
