"""``overmind.load`` never raises because of Overmind. A server that cannot be
spawned (``sys.executable`` not runnable, a directory at ``spawn.lock``, a runtime directory this user
cannot write) or a bad setting falls back with one warning, and ``overmind doctor`` reports the failure
instead of "all checks passed". Each case runs in a fresh process: doctor first (it never starts a server),
then a load.
"""
from __future__ import annotations

import os

import pytest

from _support import fault_procs

pytestmark = pytest.mark.usefixtures("impl")  # each test on overmind.native._C and on its pure-Python twin

NOBODY = 65534

CASE = """
import contextlib, io, os, sys, warnings, torch
import overmind, overmind.loading.flow, overmind.client.connection, overmind.cli.doctor, overmind.client.launcher
import overmind.shm.reader, overmind.entries.pickling, subprocess
from _support import fault_loaders as L
from overmind.fallback import OvermindWarning
from overmind.testing import report
if os.environ.get("CASE_EXECUTABLE"):
    sys.executable = os.environ["CASE_EXECUTABLE"]
if os.environ.get("CASE_AS_NOBODY"):
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = overmind.cli.doctor.run_checks()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        obj = overmind.load(L.build, 4)
        loaded = bool(torch.equal(obj, L.expected(4)))
    except BaseException as e:
        loaded = f"{type(e).__name__}: {e}"
report({"loaded": loaded, "doctor_rc": rc, "doctor": out.getvalue(),
        "warned": [str(w.message) for w in caught if issubclass(w.category, OvermindWarning)]})
"""


def _case(env, expect_in_warning, expect_in_doctor):
    seen = fault_procs.run(CASE, env, timeout=90)
    assert seen.get("loaded") is True, seen
    assert len(seen["warned"]) == 1, seen
    assert expect_in_warning in seen["warned"][0], seen["warned"]
    assert seen["doctor_rc"] == 1 and "all checks passed" not in seen["doctor"], seen["doctor"]
    assert expect_in_doctor in seen["doctor"], seen["doctor"]
    return seen


@pytest.mark.parametrize("executable", ["/nonexistent/python3", "/etc/hostname"])
def test_an_interpreter_that_cannot_run_falls_back(overmind_runtime, executable):
    seen = _case({"CASE_EXECUTABLE": executable}, executable, "[fail] server: cannot start one: ")
    assert executable in seen["doctor"].split("[fail] server: cannot start one: ")[1].splitlines()[0]


def test_a_directory_at_spawn_lock_falls_back(overmind_runtime):
    os.mkdir(os.path.join(overmind_runtime, "spawn.lock"))
    lock = os.path.join(overmind_runtime, "spawn.lock")
    _case({}, f"{lock} is a directory", f"[fail] runtime dir: {lock} is a directory")


@pytest.mark.skipif(os.geteuid() != 0, reason="root ignores directory permissions; run as nobody needs root")
def test_a_runtime_dir_this_user_cannot_write_falls_back(overmind_runtime):
    os.chown(overmind_runtime, NOBODY, NOBODY)
    os.chmod(overmind_runtime, 0o500)  # private to nobody, and read-only to it
    _case({"CASE_AS_NOBODY": "1"}, "cannot create", f"[fail] runtime dir: cannot create {overmind_runtime}/")


@pytest.mark.parametrize("name", ["OVERMIND_WAIT_TIMEOUT", "OVERMIND_REPLY_TIMEOUT", "OVERMIND_SERVER_START_TIMEOUT"])
def test_a_bad_setting_warns_once_and_the_load_uses_the_default(overmind_runtime, name):
    # a bad setting is no failure (overmind.settings): one warning, the default, a cached load.
    seen = fault_procs.run(CASE, {name: "abc"}, timeout=90)
    assert seen.get("loaded") is True and len(seen["warned"]) == 1, seen
    assert f"{name}='abc' is not a positive number of seconds" in seen["warned"][0], seen["warned"]
    assert seen["doctor_rc"] == 0 and f"[warn] setting: {name}='abc'" in seen["doctor"], seen["doctor"]
