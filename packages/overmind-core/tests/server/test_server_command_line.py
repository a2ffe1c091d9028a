"""``python -m overmind.server``'s command line (a hand parser, not argparse) and what the server imports at its start:
the standard library's lighter half and overmind, never argparse, hashlib's OpenSSL, secrets or typing (start time and memory
of a process that lives for hours, docs/benchmarks.md)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overmind.server.__main__ import UsageError, parse_args

_values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1,
                  max_size=12).filter(lambda v: not v.startswith("--"))


@settings(max_examples=300, deadline=None)
@given(runtime_dir=st.none() | _values, max_bytes=st.none() | _values, foreground=st.booleans(),
       claim=st.none() | st.tuples(_values, st.integers(1, 2**22)),
       joined=st.lists(st.booleans(), min_size=4, max_size=4), order=st.permutations([0, 1, 2, 3, 4]))
def test_every_spelling_of_the_options_parses_to_their_values(runtime_dir, max_bytes, foreground, claim, joined,
                                                              order):
    key, pid = claim if claim is not None else (None, None)
    parts: list[list[str]] = [[], [], [], [], []]
    named = (("--runtime-dir", runtime_dir), ("--max-bytes", max_bytes), ("--claim", key),
             ("--claim-pid", None if pid is None else str(pid)))
    for i, (name, value) in enumerate(named):
        if value is not None:
            parts[i] = [f"{name}={value}"] if joined[i] else [name, value]
    parts[4] = ["--foreground"] if foreground else []
    argv = [a for i in order for a in parts[i]]
    assert parse_args(argv) == {"runtime_dir": runtime_dir, "foreground": foreground, "max_bytes": max_bytes,
                                "claim": key, "claim_pid": pid}


@pytest.mark.parametrize("argv, says", [
    (["--runtime-dir"], "--runtime-dir needs a value"),
    (["--max-bytes", "--foreground"], "--max-bytes needs a value"),
    (["--foreground=yes"], "unrecognized argument: --foreground=yes"),
    (["--runtime"], "unrecognized argument: --runtime"),
    (["serve"], "unrecognized argument: serve"),
    (["--claim", "k"], "--claim and --claim-pid go together"),
    (["--claim-pid", "12"], "--claim and --claim-pid go together"),
    (["--claim", "k", "--claim-pid", "me"], "--claim-pid needs a process id, got 'me'"),
    (["--claim", "k", "--claim-pid=0"], "--claim-pid needs a process id, got '0'"),
])
def test_a_bad_command_line_is_refused_by_name(argv, says):
    with pytest.raises(UsageError, match=says):
        parse_args(argv)


def test_the_module_prints_usage_for_help_and_exits_2_on_a_bad_argument(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "overmind.server", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "--runtime-dir D" in ok.stdout and "--max-bytes SIZE" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "overmind.server", "--runtime-dir", str(tmp_path), "--bogus"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "error: unrecognized argument: --bogus" in bad.stderr, bad.stderr


def test_the_server_imports_neither_argparse_nor_hashlib_nor_logging_nor_dataclasses_at_its_start():
    # As the launcher runs it: python -S, overmind on PYTHONPATH; what its main() imports before serving too.
    from overmind.client.launcher import server_env

    code = ("import sys, overmind.server.__main__, overmind.server.daemon, overmind.server.log, overmind.settings\n"
            "print(sorted(m for m in ('argparse', 'hashlib', '_hashlib', 'secrets', 'gettext', 'shutil', 'typing', "
            "'logging', 'dataclasses', 'inspect', 'pickle', 'traceback') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-S", "-c", code], env=server_env(), capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.stdout.strip() == "[]", out.stdout
