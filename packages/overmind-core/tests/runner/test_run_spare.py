"""The template's spare child (``overmind/runner/spare.py``): forked before a request, handed the next ``run``,
replaced after it; retired when the template stops; gone when the template dies; a spare killed from outside
leaves the runs working. Real templates, real processes: what is checked is which process runs the program."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from _support import run_support as rs

PIDS = "import os\nprint(os.getpid(), os.getppid())\n"


@pytest.fixture
def rt(overmind_runtime):
    yield overmind_runtime
    rs.stop_templates(overmind_runtime)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _spare(template: int) -> int:
    """The template's one child while no program runs: its spare."""
    rs.wait_for(lambda: len(_children(template)) == 1, what="the template's spare")
    return _children(template)[0]


def _run(rt: str, script: str) -> tuple[int, int]:
    done = rs.run([script], rt)
    assert done.returncode == 0, done.stderr
    pid, parent = map(int, done.stdout.split())
    return pid, parent


def test_each_run_is_the_spare_forked_before_it_and_a_new_spare_follows(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", PIDS)
    _, template = _run(rt, script)  # starts the template
    seen = set()
    for _ in range(3):
        spare = _spare(template)
        assert spare not in seen
        pid, parent = _run(rt, script)
        assert (pid, parent) == (spare, template), "the program runs in the spare, a child of the template"
        seen.add(pid)
    assert _spare(template) not in seen


def test_stopping_the_template_ends_its_spare(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", PIDS)
    _, template = _run(rt, script)
    spare = _spare(template)
    rs.stop_templates(rt)
    rs.wait_for(lambda: rs.gone(template) and rs.gone(spare), what="the template and its spare to end")


def test_a_template_killed_leaves_no_spare_behind(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", PIDS)
    _, template = _run(rt, script)
    spare = _spare(template)
    os.kill(template, signal.SIGKILL)
    rs.wait_for(lambda: rs.gone(spare), what="the spare to see its template's end and exit")
    pid, parent = _run(rt, script)  # a new template serves
    assert parent != template


def test_a_spare_killed_from_outside_leaves_the_runs_working(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", PIDS)
    _, template = _run(rt, script)
    spare = _spare(template)
    os.kill(spare, signal.SIGKILL)
    rs.wait_for(lambda: spare not in _children(template), what="the template to reap its spare")
    for _ in range(2):
        pid, parent = _run(rt, script)
        assert parent == template and pid != spare, "forked on the request, as without a spare"


def test_a_program_in_the_spare_gets_its_callers_state(rt, tmp_path):
    """The spare was forked before the request: what ``run`` passes still arrives (cwd, environment, argv, stdio,
    umask), and the template's descriptors are not the program's."""
    script = rs.write(str(tmp_path), "prog.py", """
        import os, sys
        print(os.getcwd(), os.environ.get("SPARE_CHECK"), sys.argv[1:], oct(os.umask(0)), sorted(os.listdir("/proc/self/fd")))
    """)
    _, template = _run(rt, rs.write(str(tmp_path), "start.py", PIDS))
    _spare(template)
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([rs.OVERMIND, "run", script, "a", "b"], cwd=work, capture_output=True, text=True,
                          env=rs.env(rt, SPARE_CHECK="yes"), timeout=240, preexec_fn=lambda: os.umask(0o027))
    assert done.returncode == 0, done.stderr
    plain = subprocess.run([rs.sys.executable, script, "a", "b"], cwd=work, capture_output=True, text=True,
                           env=rs.env(rt, SPARE_CHECK="yes"), timeout=240, preexec_fn=lambda: os.umask(0o027))
    assert done.stdout == plain.stdout


def test_while_a_program_runs_the_next_spare_follows_a_moment_later(rt, tmp_path):
    """A second ``run`` while the first program still runs is served by a spare too (forked a second after the
    handover, so that its fork does not take a core from the program as it starts)."""
    _, template = _run(rt, rs.write(str(tmp_path), "start.py", PIDS))
    first = _spare(template)
    script = rs.write(str(tmp_path), "prog.py", """
        import os, sys
        print(os.getpid(), flush=True)
        sys.stdin.readline()
    """)
    proc = rs.start([script], rt, stdin=subprocess.PIPE)
    try:
        assert int(rs.read_line(proc.stdout)) == first
        rs.wait_for(lambda: len(_children(template)) == 2, what="a spare beside the running program")
        spare = next(c for c in _children(template) if c != first)
        pid, parent = _run(rt, rs.write(str(tmp_path), "again.py", PIDS))
        assert (pid, parent) == (spare, template)
    finally:
        proc.communicate("\n", timeout=120)
    assert proc.returncode == 0
