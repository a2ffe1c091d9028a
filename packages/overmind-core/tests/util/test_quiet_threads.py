"""Threads Overmind starts take no asynchronous signal, so a process's signals reach its main thread (and a
blocking call there) as in plain Python: the thread's own mask read from /proc, a caller's mask unchanged,
and a fresh process whose main thread sleeps while a helper thread lives."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

from _support import run_support as rs
from overmind._util import quiet_threads


def _blocked(tid: int) -> set[int]:
    """The signals thread ``tid`` of this process blocks (its SigBlk line)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        mask = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_a_quiet_thread_blocks_the_asynchronous_signals_and_not_the_faults():
    ready, done = threading.Event(), threading.Event()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    thread = quiet_threads.start(threading.Thread(target=lambda: (ready.set(), done.wait()), daemon=True))
    try:
        ready.wait()
        blocked = _blocked(thread.native_id)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD,
                    signal.SIGWINCH, signal.SIGALRM):
            assert sig in blocked, sig.name
        for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT):
            assert sig not in blocked, sig.name
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    finally:
        done.set()
        thread.join()


def test_every_thread_overmind_starts_goes_through_quiet_threads():
    """A ``threading.Thread(...).start()`` in the package would take signals from the main thread."""
    import overmind

    root = os.path.dirname(overmind.__file__)
    offenders = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".py") and name != "quiet_threads.py":
                path = os.path.join(folder, name)
                with open(path) as f:
                    text = f.read()
                if ".start()" in text and "threading.Thread(" in text and "quiet_threads.start(" not in text:
                    offenders.append(os.path.relpath(path, root))
    assert offenders == []


def test_a_signal_to_a_process_with_a_helper_thread_interrupts_the_sleeping_main_thread(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys, threading, time
        from overmind._util import quiet_threads
        def handler(signum, frame):
            print("handled", flush=True)
            os._exit(3)
        signal.signal(signal.SIGUSR1, handler)
        never = threading.Event()
        quiet_threads.start(threading.Thread(target=never.wait, daemon=True))
        print("READY", flush=True)
        time.sleep(600)
        os._exit(9)
    """))
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline() == "READY\n"
            rs.wait_asleep(proc.pid)
            proc.send_signal(signal.SIGUSR1)
            out, _ = proc.communicate(timeout=60)
            assert (proc.returncode, out) == (3, "handled\n")
        finally:
            proc.kill()
            proc.communicate()
