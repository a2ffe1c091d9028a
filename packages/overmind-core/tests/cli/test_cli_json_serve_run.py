"""``--json`` on the two long-running commands: ``serve --json`` prints one JSON line per event on
stdout (listening, template, exited), ``run --json`` one line on stderr once its program ended (exit status,
signal, pid, template or plain python and why, timings), leaving the program's stdout alone. Real servers,
templates and programs, each in its own process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from _support import run_support as rs
from overmind.client.launcher import accepts

OVERMIND = os.path.join(os.path.dirname(sys.executable), "overmind")


def _serve(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OVERMIND_PRELOAD": rs.LIGHT_PRELOAD}
    return subprocess.Popen([OVERMIND, "serve", "--json", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _event(proc: subprocess.Popen) -> dict:
    line = rs.read_line(proc.stdout)
    assert line.endswith("\n"), (line, proc.poll())
    return json.loads(line)


def _stop(proc: subprocess.Popen) -> tuple[list[dict], str]:
    """``overmind stop``, then the events ``proc`` printed after the ones read so far, and its stderr."""
    subprocess.run([OVERMIND, "stop"], check=True, capture_output=True, timeout=120)
    out, err = proc.communicate(timeout=120)
    return [json.loads(line) for line in out.splitlines()], err


@pytest.fixture
def rt(overmind_runtime):
    yield overmind_runtime
    rs.stop_templates(overmind_runtime)


def test_serve_json_says_where_it_listens_then_how_it_exited(overmind_runtime):
    proc = _serve("--no-template")
    try:
        listening = _event(proc)
        assert listening["event"] == "listening" and listening["pid"] == proc.pid, listening
        assert listening["runtime_dir"] == overmind_runtime
        assert listening["socket"] == os.path.join(overmind_runtime, "server.sock") and accepts(listening["socket"])
        assert listening["log"] == os.path.join(overmind_runtime, "server.log") and os.path.exists(listening["log"])
        assert listening["max_bytes"] > 0 and listening["version"] and listening["protocol"] >= 1
        rest, err = _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert rest == [{"event": "exited", "pid": proc.pid, "exit_code": 0}], (rest, err)
    assert proc.returncode == 0
    assert "stopping" in err  # the log still goes to the terminal, on stderr


def test_serve_json_a_second_server_prints_only_its_exit(overmind_runtime):
    first = _serve("--no-template")
    try:
        assert _event(first)["event"] == "listening"
        second = subprocess.run([OVERMIND, "serve", "--json", "--no-template"], capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 3 and "already serves" in second.stderr, second
        assert [json.loads(line) for line in second.stdout.splitlines()] == [
            {"event": "exited", "pid": json.loads(second.stdout)["pid"], "exit_code": 3}]
        assert json.loads(second.stdout)["pid"] != first.pid
        rest, _ = _stop(first)
        assert [e["event"] for e in rest] == ["exited"]
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()


def test_serve_json_announces_the_template_it_starts(rt):
    proc = _serve()
    try:
        events = [_event(proc), _event(proc)]
        by_kind = {e["event"]: e for e in events}
        assert set(by_kind) == {"listening", "template"}, events
        template = by_kind["template"]
        assert isinstance(template["pid"], int) and "json" in template["preloaded"], template
        assert template["pid"] in {t["pid"] for t in rs.templates(rt)}
        rest, _ = _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert rest == [{"event": "exited", "pid": proc.pid, "exit_code": 0}]


def _report(stderr: str) -> dict:
    last = stderr.splitlines()[-1]
    report = json.loads(last)
    assert set(report) == {"exit_code", "signal", "pid", "via", "fallback", "start_s", "wall_s"}, report
    assert 0 <= report["start_s"] <= report["wall_s"], report
    return report


PROGRAM = "import os, sys; print('pid', os.getpid()); sys.exit(int(sys.argv[1]))"


def test_run_json_reports_the_exit_status_pid_and_timings_on_stderr(rt):
    out = rs.run(["--json", "-c", PROGRAM, "3"], rt)
    assert out.returncode == 3, out.stderr
    assert out.stdout.startswith("pid ") and out.stdout.count("\n") == 1, "stdout is the program's alone"
    report = _report(out.stderr)
    assert report == {**report, "exit_code": 3, "signal": None, "via": "template", "fallback": None,
                      "pid": int(out.stdout.split()[1])}


def test_run_json_reports_the_signal_that_killed_the_program(rt):
    out = rs.run(["--json", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], rt)
    assert out.returncode == -signal.SIGTERM, out.stderr  # and overmind run died of it too
    report = _report(out.stderr)
    assert report["exit_code"] is None and report["signal"] == "SIGTERM" and report["via"] == "template"


def test_run_json_says_when_plain_python_ran_it_and_why(rt, tmp_path):
    disabled = rs.run(["--json", "-c", PROGRAM, "0"], rt, env_extra={"OVERMIND_RUN_DISABLE": "1"})
    assert disabled.returncode == 0, disabled.stderr
    report = _report(disabled.stderr)
    assert report == {**report, "exit_code": 0, "via": "python", "fallback": "OVERMIND_RUN_DISABLE=1",
                      "pid": int(disabled.stdout.split()[1])}

    # A file next to the script named like a preloaded module: the one warning, then the report.
    script = rs.write(str(tmp_path), "prog.py", "import sys\nprint('ran')\nsys.exit(5)\n")
    rs.write(str(tmp_path), "json.py", "")
    shadowed = rs.run(["--json", script], rt)
    assert shadowed.returncode == 5 and shadowed.stdout == "ran\n", shadowed.stderr
    assert "running the program with plain python instead" in shadowed.stderr.splitlines()[-2]
    report = _report(shadowed.stderr)
    assert report["via"] == "python" and "json.py" in report["fallback"] and report["exit_code"] == 5


def test_run_json_counts_only_right_after_run(rt):
    out = rs.run(["-c", "import sys; print(sys.argv[1:])", "--json"], rt)
    assert out.returncode == 0 and out.stdout == "['--json']\n" and out.stderr == "", out


def test_every_exit_status_is_in_the_cli_page():
    from pathlib import Path

    from overmind.cli.commands import EXIT_CODES

    page = (Path(__file__).resolve().parents[4] / "docs" / "cli.md").read_text()
    table = page.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows - {"status"} == {str(code) for code in EXIT_CODES}, rows
