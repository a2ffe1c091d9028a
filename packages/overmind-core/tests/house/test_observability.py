"""Observability: hits, misses, publishes, evictions and fallbacks on the ``overmind`` logger with
timings; a progress bar on a terminal for a long publish (never on a pipe, never under
HF_HUB_DISABLE_PROGRESS_BARS); the server's log rotates by size and comes back when deleted."""
from __future__ import annotations

import fcntl
import logging
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import textwrap
import warnings

import torch

import overmind
from overmind import settings
from overmind.client.connection import Client


def build(n):
    return torch.full((n,), 3.0)


def test_the_overmind_logger_tells_hits_misses_publishes_evictions_and_fallbacks(overmind_runtime, caplog,
                                                                                   monkeypatch):
    caplog.set_level(logging.INFO, logger="overmind")
    overmind.load(build, 11)
    overmind.load(build, 11)
    lines = [r.getMessage() for r in caplog.records if r.name == "overmind"]
    assert any(re.search(r"miss .*build .*the loader ran in \d+\.\d{3} s", m) for m in lines), lines
    assert any(re.search(r"published .*build .* in \d+\.\d{3} s", m) for m in lines), lines
    assert any(re.search(r"hit .*build .*\d+ bytes\) in \d+\.\d{3} s", m) for m in lines), lines
    # the logger's name says "overmind": a record's message does not say it again ("overmind: overmind: miss")
    assert lines and not [m for m in lines if m.startswith("overmind:")], lines
    (entry,) = overmind.cache_info().entries
    overmind.evict(entry.key[:8])
    assert any(f"evicted {entry.key[:12]}" in r.getMessage() for r in caplog.records), caplog.records
    caplog.clear()
    os.mkdir(os.path.join(overmind_runtime, "elsewhere"))
    monkeypatch.setenv("OVERMIND_RUNTIME_DIR", os.path.join(overmind_runtime, "elsewhere", "x" * 120))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        overmind.load(build, 12)
    assert any("fallback: the server is unavailable" in r.getMessage() for r in caplog.records), caplog.records
    assert not [r.getMessage() for r in caplog.records if r.getMessage().startswith("overmind:")]


PUBLISH = textwrap.dedent("""
    import torch, overmind
    def big(n):
        # bytes torch did not allocate, so the publish copies them (a tensor torch allocated in the loader is
        # made in the entry's memfd already: shm/arena.py)
        return torch.frombuffer(bytearray(b"\\x01" * (4 * n)), dtype=torch.float32)
    overmind.load(big, 1 << 22)
    print("done", flush=True)
""")


def _stderr_on_a_pty(env: dict, columns: int = 120) -> str:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", PUBLISH], stdout=subprocess.PIPE, stderr=slave,
                            env={**os.environ, **env})
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0 and proc.stdout.read().strip() == b"done"
    return out.decode(errors="replace")


def test_a_long_publish_shows_progress_on_a_terminal_only(overmind_runtime):
    shown = _stderr_on_a_pty({"OVERMIND_PROGRESS_DELAY": "0.000001"})
    assert "overmind: publishing" in shown and "16.0M" in shown, shown
    assert "overmind: publishing" not in _stderr_on_a_pty({"OVERMIND_PROGRESS_DELAY": "0.000001",
                                                           "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    assert "overmind: publishing" not in _stderr_on_a_pty({"OVERMIND_PROGRESS_DELAY": "0.000001",
                                                           "OVERMIND_PROGRESS": "off"})
    piped = subprocess.run([sys.executable, "-c", PUBLISH.replace("1 << 22", "1 << 21")], capture_output=True,
                           text=True, env={**os.environ, "OVERMIND_PROGRESS_DELAY": "0.000001"}, timeout=120)
    assert piped.returncode == 0 and "publishing" not in piped.stderr, piped.stderr
    # The default delay (3 s) keeps a quick publish silent even on a terminal.
    assert "overmind: publishing" not in _stderr_on_a_pty({"OVERMIND_PROGRESS_DELAY": ""}).replace("\r", "")


def test_the_progress_bar_fits_80_columns_with_the_short_name_percentage_bytes_and_time_left(overmind_runtime):
    shown = _stderr_on_a_pty({"OVERMIND_PROGRESS_DELAY": "0.000001"}, columns=80)
    lines = [line for line in shown.replace("\r", "\n").splitlines() if "publishing" in line]
    assert lines, shown
    final = lines[-1].rstrip()
    assert len(final) <= 80, (len(final), final)
    assert final.startswith("overmind: publishing __main__.big 100%|"), final  # the loader's last two names
    assert re.search(r" 100%\|[^|]{10,}\| 16\.0M/16\.0M ", final), final  # a bar of 10 columns at least


def test_the_bar_names_a_long_loader_by_its_class_and_method_within_80_columns():
    from overmind.shm.progress import describe

    name = "transformers.models.llama.modeling_llama.LlamaForCausalLM.from_pretrained"
    assert describe(name, 200) == "overmind: publishing LlamaForCausalLM.from_pretrained"
    assert describe(name, 80) == "overmind: LlamaForCausalLM.from_pretrained"
    assert describe(name, 60) == "overmind: LlamaForCausa…" and len(describe(name, 60)) == 60 - 36


def test_the_server_log_rotates_and_comes_back_when_deleted(overmind_runtime, monkeypatch, sealed_memfd):
    monkeypatch.setenv("OVERMIND_LOG_MAX_BYTES", "2K")
    settings.reload()
    client = Client()
    log = os.path.join(overmind_runtime, "server.log")
    try:
        for i in range(40):
            client.publish(f"key-{i:03d}", sealed_memfd(b"x" * 100), meta={"loader": "test"})
        assert os.path.exists(log + ".1"), os.listdir(overmind_runtime)
        assert os.path.getsize(log) <= 2048 + 512
        assert not os.path.exists(log + f".{4}")  # 3 old logs kept at most
        os.unlink(log)
        client.publish("key-after", sealed_memfd(b"y" * 100), meta={"loader": "test"})
        with open(log) as f:
            assert "published key-after" in f.read()
    finally:
        client.close()
