"""``overmind run``: the program gets the caller's own stdin/stdout/stderr (pipes stay pipes, a terminal stays
a terminal) and the signals a terminal or a supervisor sends to ``run``; a ``run`` that dies takes its
program with it. Real ``run`` processes, a real template, a real pseudo-terminal.

Background shells start the suite with SIGINT ignored, and a program started that way ignores it too (as
plain python would): the programs that must see Ctrl-C install Python's handler themselves.
"""
from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import subprocess
import termios

import pytest

from _support import run_support as rs


@pytest.fixture(scope="module")
def rt():
    """One private runtime directory for the module: its tests share a template (stopped at the end)."""
    with rs.shared_runtime() as path:
        yield path


def test_stdin_piped_in_and_stdout_stderr_captured(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", """
        import sys
        data = sys.stdin.read()
        print("out", data.upper(), sys.stdout.isatty(), sys.stdin.isatty())
        print("err", len(data), file=sys.stderr)
    """)
    out = rs.run([script], rt, input="hello\nworld")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "out HELLO\nWORLD False False\n"
    assert out.stderr == "err 11\n"


def test_redirections_to_files_and_closed_stdin(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", """
        import sys
        print("to a file", sys.stdin)
        sys.stdout.flush()
        print("to another", file=sys.stderr)
    """)
    with open(tmp_path / "o.txt", "w") as o, open(tmp_path / "e.txt", "w") as e:
        out = rs.run([script], rt, stdout=o, stderr=e, stdin=subprocess.DEVNULL, capture_output=False)
    assert out.returncode == 0
    assert (tmp_path / "o.txt").read_text().startswith("to a file <_io.TextIOWrapper name='<stdin>'")
    assert (tmp_path / "e.txt").read_text() == "to another\n"


def _in_pty(args, rt, plain: bool = False, **kwargs):
    """Start ``run`` (or plain python) as the session leader of a new pseudo-terminal, its controlling tty."""
    master, slave = pty.openpty()

    def controlling_tty():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    options = dict(stdin=slave, stdout=slave, stderr=slave, start_new_session=True, preexec_fn=controlling_tty)
    if plain:
        import sys

        proc = subprocess.Popen([sys.executable, *args], env=rs.env(rt), **options, **kwargs)
    else:
        proc = rs.start(args, rt, text=False, **options, **kwargs)
    os.close(slave)
    return proc, master


def _read_until(master: int, marker: bytes, limit: float = 120.0) -> bytes:
    import select

    data = b""
    while marker not in data:
        ready, _, _ = select.select([master], [], [], limit)
        if not ready:
            raise AssertionError(f"no {marker!r} in {data!r}")
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


def test_a_terminal_stays_a_terminal(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", """
        import os, sys
        print("tty", sys.stdin.isatty(), sys.stdout.isatty(), sys.stderr.isatty(), os.isatty(1),
              sys.stdout.line_buffering, sys.stdout.write_through, sys.stderr.line_buffering,
              sys.stdout.encoding, os.get_terminal_size(1), "END")
    """)
    seen = []
    for plain in (False, True):
        proc, master = _in_pty([script], rt, plain=plain)
        try:
            got = _read_until(master, b"END")
            assert proc.wait(timeout=120) == 0
        finally:
            os.close(master)
        seen.append(got.strip().splitlines()[-1])
    assert seen[0] == seen[1], seen
    assert seen[0].startswith(b"tty True True True True"), seen


def test_ctrl_c_on_the_terminal_raises_keyboardinterrupt_and_exits_by_sigint(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", """
        import os, signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("READY", os.getpid(), "END", flush=True)
        time.sleep(600)
    """)
    proc, master = _in_pty([script], rt)
    try:
        said = _read_until(master, b"END")
        rs.wait_asleep(int(said.split(b"READY")[1].split()[0]))
        os.write(master, b"\x03")  # the terminal driver sends SIGINT to run's process group
        got = _read_until(master, b"KeyboardInterrupt")
        code = proc.wait(timeout=120)
    finally:
        os.close(master)
    assert code == -signal.SIGINT, "run dies by SIGINT, as python does after an uncaught Ctrl-C (shell: 130)"
    assert b"Traceback (most recent call last)" in got and b'prog.py", line' in got
    assert b"runner" not in got, "no frame of overmind's"


def test_sigint_from_kill_reaches_the_program(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", """
        import os, signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            print(os.getpid(), flush=True)
            time.sleep(600)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise SystemExit(5)
    """)
    proc = rs.start([script], rt)
    rs.wait_asleep(int(rs.read_line(proc.stdout)))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 5 and out == "interrupted\n", err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH, signal.SIGUSR1])
def test_signals_sent_to_run_reach_the_program(rt, tmp_path, sig):
    script = rs.write(str(tmp_path), "prog.py", f"""
        import os, signal, sys, time
        def handler(signum, frame):
            print("got", signal.Signals(signum).name, flush=True)
            os._exit(7)
        signal.signal({int(sig)}, handler)
        print(os.getpid(), flush=True)
        time.sleep(600)
    """)
    proc = rs.start([script], rt)
    rs.wait_asleep(int(rs.read_line(proc.stdout)))
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out) == (7, f"got {sig.name}\n"), err


def test_a_run_that_starts_the_template_relays_from_its_only_signal_taking_thread(tmp_path):
    """The ``run`` that starts a template (and the server) keeps a thread to reap it; that thread blocks the
    signals a supervisor sends, so they reach the main thread that relays them, never a thread that cannot."""
    script = rs.write(str(tmp_path), "prog.py", """
        import os, signal, time
        signal.signal(signal.SIGUSR1, lambda *_: (print("got", flush=True), os._exit(7)))
        print(os.getpid(), flush=True)
        time.sleep(600)
    """)
    with rs.shared_runtime() as fresh:
        proc = rs.start([script], fresh)
        rs.wait_asleep(int(rs.read_line(proc.stdout)))
        threads = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert threads, "the run that started the template holds its reaper thread"
        for tid in threads:
            with open(f"/proc/{proc.pid}/task/{tid}/status") as f:
                mask = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGINT, signal.SIGWINCH):
                assert mask >> (sig - 1) & 1, (tid, sig.name)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=120)
        assert (proc.returncode, out) == (7, "got\n"), err


def test_sigterm_with_the_default_action_kills_program_and_run_alike(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n")
    proc = rs.start([script], rt)
    child = int(rs.read_line(proc.stdout))
    proc.terminate()
    assert proc.wait(timeout=120) == -signal.SIGTERM
    rs.wait_for(lambda: rs.gone(child), what="the program to end")


def test_sigtstp_stops_run_and_program_and_sigcont_resumes_both(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", """
        import os, sys
        print(os.getpid(), flush=True)
        sys.stdin.readline()
        print("resumed", flush=True)
    """)
    # Its own process group, as a shell starts a job: SIGTSTP stops no process of an orphaned group.
    proc = rs.start([script], rt, stdin=subprocess.PIPE, process_group=0)
    child = int(rs.read_line(proc.stdout))
    proc.send_signal(signal.SIGTSTP)
    rs.wait_for(lambda: rs.process_state(proc.pid) == "T" and rs.process_state(child) == "T", what="both stopped")
    proc.send_signal(signal.SIGCONT)
    rs.wait_for(lambda: rs.process_state(child) not in ("T", None), what="the program to resume")
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0 and out == "resumed\n", err


def test_a_run_that_is_killed_takes_its_program_with_it(rt, tmp_path):
    script = rs.write(str(tmp_path), "prog.py", """
        import os, subprocess, sys, time
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(os.getpid(), grandchild.pid, flush=True)
        time.sleep(600)
    """)
    proc = rs.start([script], rt)
    child, grandchild = map(int, rs.read_line(proc.stdout).split())
    proc.kill()
    proc.wait(timeout=60)
    rs.wait_for(lambda: rs.gone(child) and rs.gone(grandchild), what="the program and its process group to die")


def test_the_run_that_starts_the_template_says_so_once_on_a_terminal(tmp_path):
    """Starting a template takes seconds (it imports torch and the libraries): the first ``run`` on a terminal
    says what it is doing and how long it took; later runs, and any run whose stderr is not a terminal, say
    nothing of it."""
    script = rs.write(str(tmp_path), "prog.py", """
        print("END", flush=True)
    """)
    with rs.shared_runtime() as fresh:
        piped = rs.run([script], fresh)  # stderr a pipe: a template starts, silently
        assert piped.returncode == 0 and piped.stdout == "END\n" and piped.stderr == "", piped.stderr
    with rs.shared_runtime() as fresh:
        said = []
        for _ in range(2):
            proc, master = _in_pty([script], fresh)
            try:
                said.append(_read_until(master, b"END").decode())
                assert proc.wait(timeout=120) == 0
            finally:
                os.close(master)
    first, second = said
    assert re.search(r"overmind run: starting a template that imports \S.* \(once; later runs fork from it", first), first
    assert re.search(r"overmind run: template ready in \d+\.\d s\r?\n", first), first
    assert first.index("template ready") < first.index("END")
    assert "overmind run" not in second, second
