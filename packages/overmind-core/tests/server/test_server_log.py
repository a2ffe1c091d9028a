"""The server's own log (``server/log.py``): the line format, levels, tracebacks, rotation and reopening.

The server process itself is tested through its log in test_observability.py (rotation under real publishes)
and the server tests; here one :class:`ServerLog` writes to a temporary file.
"""
from __future__ import annotations

import os
import re
import threading

from overmind.server.log import BACKUPS, DEBUG, ServerLog

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} pid (\d+) (\S+) (DEBUG|INFO|WARNING|ERROR) (.*)$")


def lines(path):
    with open(path) as f:
        return f.read().splitlines()


def test_a_line_names_the_time_pid_thread_and_level(tmp_path):
    log = ServerLog()
    path = str(tmp_path / "server.log")
    log.open(path, 1 << 20)
    log.info("published %s (%d bytes)", "abc", 12)
    log.debug("not shown at the default level")
    worker = threading.Thread(target=log.warning, args=("from %s", "a thread"), name="helper")
    worker.start()
    worker.join()
    log.level = DEBUG
    log.debug("shown now")
    got = [LINE.match(x) for x in lines(path)]
    assert all(got), lines(path)
    assert [(m.group(1), m.group(2), m.group(3), m.group(4)) for m in got] == [
        (str(os.getpid()), "MainThread", "INFO", "published abc (12 bytes)"),
        (str(os.getpid()), "helper", "WARNING", "from a thread"),
        (str(os.getpid()), "MainThread", "DEBUG", "shown now")]


def test_exception_adds_the_traceback_and_a_bad_format_does_not_raise(tmp_path):
    log = ServerLog()
    path = str(tmp_path / "server.log")
    log.open(path, 1 << 20)
    try:
        raise ValueError("the cause")
    except ValueError:
        log.exception("%s crashed", "conn 3")
    log.error("%d items", "not a number")
    text = open(path).read()
    assert "ERROR conn 3 crashed\nTraceback (most recent call last):" in text
    assert "ValueError: the cause" in text
    assert "ERROR '%d items' % ('not a number',)" in text


def test_before_open_warnings_go_to_stderr_and_foreground_echoes(tmp_path, capsys):
    log = ServerLog()
    log.info("nowhere")
    log.warning("early %s", "trouble")
    err = capsys.readouterr().err
    assert "WARNING early trouble" in err and "nowhere" not in err
    path = str(tmp_path / "server.log")
    log.open(path, 1 << 20, foreground=True)
    log.info("both")
    assert "INFO both" in capsys.readouterr().err
    assert lines(path)[-1].endswith("INFO both")


def test_it_rotates_by_size_and_keeps_three_old_logs(tmp_path):
    log = ServerLog()
    path = str(tmp_path / "server.log")
    log.open(path, 1000)
    for i in range(200):
        log.info("line %03d %s", i, "x" * 40)
    assert sorted(os.listdir(tmp_path)) == ["server.log"] + [f"server.log.{i}" for i in range(1, BACKUPS + 1)]
    assert all(os.path.getsize(os.path.join(tmp_path, n)) < 1000 for n in os.listdir(tmp_path))
    assert lines(path)[-1].endswith("line 199 " + "x" * 40)
    newest_old = int(lines(path + ".1")[-1].split("line ")[1][:3])
    assert newest_old == int(lines(path)[0].split("line ")[1][:3]) - 1  # no line lost at a rotation


def test_a_removed_or_replaced_log_is_reopened(tmp_path):
    log = ServerLog()
    path = str(tmp_path / "server.log")
    log.open(path, 1 << 20)
    log.info("first")
    os.unlink(path)
    log.info("after the removal")
    assert [x.split(" INFO ")[1] for x in lines(path)] == ["after the removal"]
    os.replace(path, path + ".moved")
    open(path, "w").close()
    log.info("after the replacement")
    assert [x.split(" INFO ")[1] for x in lines(path)] == ["after the replacement"]
    log.close()
    log.warning("closed: to stderr")  # no file, no error
