"""A hit logs as the plain call logs (``overmind.loader_logs``): the same records, to the same loggers, with the
same names, levels, messages, places, exception text and extra attributes, in the same order among the warnings.

Hypothesis generates loaders (records at several levels, one with an exception, one with an extra attribute, a
branch on ``isEnabledFor``/``getEffectiveLevel``, warnings between them) and the logger's level when the entry is
made and when it is used. Each call through ``overmind.load`` must show exactly what the plain call shows under
the same level; when the two levels agree a non-empty loader's second call must be a hit.
"""
from __future__ import annotations

import logging
import threading
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overmind
from overmind import client as client_mod
from overmind import loader_logs

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


def test_another_thread_logging_during_the_load_leaves_it_uncached(overmind_runtime, quiet_lib):
    other = logging.getLogger("overmind_tests_lib.other")

    def loader_with_helper(n: int):
        t = threading.Thread(target=other.warning, args=("from a helper thread",))
        t.start()
        t.join()
        return torch.ones(n)

    for _ in range(2):
        hits = _hits()
        overmind.load(loader_with_helper, 3)
        assert _hits() == hits


def test_the_logger_methods_are_put_back_after_every_load(overmind_runtime):
    before = {name: vars(logging.Logger)[name] for name in ("handle", "isEnabledFor", "getEffectiveLevel")}
    overmind.load(load_logging, ("warning",), 2)
    overmind.load(load_logging, ("warning",), 2)
    assert {name: vars(logging.Logger)[name] for name in before} == before
    assert not loader_logs._RUNNING.any()
