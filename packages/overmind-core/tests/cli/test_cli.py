"""The ``overmind`` command, run as a real subprocess against a real server."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from overmind.client.connection import Client
from overmind.client.launcher import accepts
from overmind.ipc.protocol import PROTOCOL_VERSION

OVERMIND = os.path.join(os.path.dirname(sys.executable), "overmind")


def om(*args: str, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    out = subprocess.run([OVERMIND, *args], capture_output=True, text=True, timeout=120)
    if check_rc is not None:
        assert out.returncode == check_rc, (out.stdout, out.stderr)
    return out


@pytest.fixture
def served(overmind_runtime):
    """A server started with ``overmind serve`` (foreground process), plus a client of it."""
    proc = subprocess.Popen([OVERMIND, "serve"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sock = os.path.join(overmind_runtime, "server.sock")
    while not accepts(sock):
        assert proc.poll() is None, proc.communicate()
        os.sched_yield()
    yield proc, Client(autostart=False)
    if proc.poll() is None:
        proc.terminate()
    proc.communicate(timeout=60)


def test_console_script_is_installed():
    assert os.access(OVERMIND, os.X_OK), f"{OVERMIND} missing; run scripts/setup"


def test_status_without_a_server_says_so_and_starts_none(overmind_runtime):
    out = om("status", check_rc=1)
    assert "no server is running" in out.stderr and "overmind serve" in out.stderr
    assert not os.path.exists(os.path.join(overmind_runtime, "server.sock"))
    assert "no server is running" in om("stop").stdout


def test_serve_status_ls_evict_stop(served, sealed_memfd, monkeypatch):
    proc, client = served
    monkeypatch.setenv("COLUMNS", "300")  # 'ls' fits its rows to the terminal (test_cli_cache checks how)
    base = client.publish("k-base", sealed_memfd(b"b" * 3000), meta={"loader": "diffusers.UNet.from_pretrained",
                                                                     "summary": "('/models/unet',) dtype=fp16"})
    client.publish("k-user", sealed_memfd(b"u" * 10), deps=[base], meta={"loader": "torch.load"})
    client.get("k-base").close()

    status = om("status").stdout
    assert f"pid {proc.pid}" in status
    assert "\nentries  2\n" in status
    assert "2.9 KiB used of" in status
    assert "1 connected" in status, status  # the whole status, should this ever fail again (once, in a full suite)

    listing = om("ls").stdout
    assert "k-base" in listing and "UNet.from_pretrained" in listing  # key prefixes and short loader names
    assert "('/models/unet',) dtype=fp16" in listing and "2.9 KiB" in listing
    assert "torch.load" in listing and "2 entries" in listing

    refused = om("evict", "k-base", check_rc=1)
    assert "not evicted k-base: referenced by" in refused.stderr
    user_id = next(e["entry_id"] for e in client.ls() if e["key"] == "k-user")
    assert "evicted k-user" in om("evict", user_id).stdout  # an entry id from 'ls' works too
    assert "evicted k-base" in om("evict", "--all").stdout
    assert "no entries cached" in om("ls").stdout

    assert f"stopped server pid {proc.pid}" in om("stop").stdout
    assert proc.wait(timeout=60) == 0
    assert "serving" in proc.stderr.read(), "serve logs to the terminal"


def test_status_json_and_python_dash_m(served):
    proc, _ = served
    out = subprocess.run([sys.executable, "-m", "overmind", "status", "--json"], capture_output=True, text=True,
                         check=True)
    assert f'"pid": {proc.pid}' in out.stdout and '"torch_imported": false' in out.stdout


def test_serve_refuses_a_second_server(served):
    out = om("serve", check_rc=3)
    assert "already serves" in out.stderr


def test_doctor_brief_prints_one_line_per_check(served):
    proc, _ = served
    out = om("doctor", "--brief")
    lines = out.stdout.splitlines()
    names = [line.split()[1] for line in lines]
    assert names[:5] == ["memfd", "runtime", "budget", "server", "zero-copy"]
    # then one line per installed adapter, then one per installed library (overmind.cli.compatibility)
    assert set(names[5:]) == {"adapter", "library"} and names[5:] == sorted(names[5:])
    assert any(line.split()[2] == "future" and "skipped" in line and "torch>=99" in line for line in lines[5:])
    assert all(line.split()[0] in ("ok", "warn") for line in lines)
    assert f"pid {proc.pid}, protocol {PROTOCOL_VERSION}" in out.stdout


def test_doctor_does_not_start_a_server_and_reports_fixes(overmind_runtime):
    out = om("doctor")
    assert "[ok] server: not running" in out.stdout and "all checks passed" in out.stdout
    assert not os.path.exists(os.path.join(overmind_runtime, "server.sock"))
    os.chmod(overmind_runtime, 0o755)
    try:
        bad = om("doctor", check_rc=1)
    finally:
        os.chmod(overmind_runtime, 0o700)
    assert "[fail] runtime dir" in bad.stdout and f"chmod 700 {overmind_runtime}" in bad.stdout


def test_doctor_flags_a_bad_budget(overmind_runtime, monkeypatch):
    monkeypatch.setenv("OVERMIND_MAX_BYTES", "much")  # a warning, and the default budget is used
    out = om("doctor", "--brief")
    assert any(line.startswith("warn") and "OVERMIND_MAX_BYTES='much'" in line for line in out.stdout.splitlines())


def test_run_help_is_overminds():
    for flag in ("--help", "-h"):
        out = om("run", flag)
        assert out.stdout.startswith("usage: overmind run"), out.stdout
        assert "forked from a template" in out.stdout and "--json" in out.stdout
        assert "PYTHONSTARTUP" not in out.stdout  # not CPython's own help


def test_doctor_reports_the_running_servers_budget_and_the_directorys_real_mode(served):
    out = om("doctor", "--brief").stdout
    budget = next(line for line in out.splitlines() if line.split()[1] == "budget")
    assert "the running server's, pid" in budget, budget
    runtime_dir = os.environ["OVERMIND_RUNTIME_DIR"]
    os.chmod(runtime_dir, 0o500)
    try:
        line = next(x for x in om("doctor", "--brief", check_rc=None).stdout.splitlines() if " runtime " in x)
    finally:
        os.chmod(runtime_dir, 0o700)
    assert "(mode 0500, yours," in line, line  # the mode it has, not a fixed text


def test_a_runtime_dir_that_is_a_file_is_named_so(tmp_path):
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    out = subprocess.run([OVERMIND, "status"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OVERMIND_RUNTIME_DIR": str(target)})
    assert out.returncode != 0 and "File exists" not in out.stderr, out.stderr
    assert f"the runtime directory {target} is not a directory" in out.stderr, out.stderr


def test_doctor_checks_the_fleet_a_process_would_use(overmind_runtime, monkeypatch, tmp_path, seaweed):
    from _support.seaweed import closed_endpoint

    assert "fleet" not in om("doctor", "--brief").stdout  # no fleet set: no line
    key = tmp_path / "fleet.key"
    key.write_text("k" * 32)
    monkeypatch.setenv("OVERMIND_FLEET", f"file://{tmp_path / 'store'}")
    monkeypatch.setenv("OVERMIND_FLEET_KEY_FILE", str(key))
    assert any(line.startswith("ok") and "fleet" in line and "answers" in line
               for line in om("doctor", "--brief").stdout.splitlines())
    monkeypatch.setenv("OVERMIND_FLEET_KEY_FILE", str(tmp_path / "missing.key"))
    out = om("doctor", check_rc=1)
    assert "[fail] fleet" in out.stdout and "missing.key" in out.stdout
    monkeypatch.setenv("OVERMIND_FLEET_KEY_FILE", str(key))
    monkeypatch.setenv("OVERMIND_FLEET", "s3://overmind/doctor")
    for name, value in {**seaweed.env, "AWS_ENDPOINT_URL": closed_endpoint(), "OVERMIND_FLEET_TIMEOUT": "2"}.items():
        monkeypatch.setenv(name, value)
    out = om("doctor", check_rc=1)
    assert "[fail] fleet" in out.stdout and "s3://overmind/doctor" in out.stdout
