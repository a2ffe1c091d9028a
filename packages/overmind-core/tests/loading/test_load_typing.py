"""``overmind.load`` is typed as the loader it calls (``ParamSpec``/``TypeVar``): mypy, run on a user's snippet
against the installed package, reveals the loader's return type and rejects arguments the loader does not take."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mypy")

SNIPPET = '''
import overmind


class Net:
    scale: float = 1.0


def load_net(path: str, *, scale: float = 1.0) -> Net:
    return Net()


net = overmind.load(load_net, "w.pt", scale=2.0)
reveal_type(net)
reveal_type(overmind.load(len, [1, 2]))
overmind.load(load_net, 3)
overmind.load(load_net, "w.pt", strict=True)
'''


def test_mypy_reads_load_as_the_loader(tmp_path):
    path = tmp_path / "user_snippet.py"
    path.write_text(textwrap.dedent(SNIPPET))
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                          "--hide-error-context", "--no-error-summary", str(path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    lines = [line.split(": ", 1)[1] for line in out.stdout.splitlines() if ": " in line]
    assert 'note: Revealed type is "user_snippet.Net"' in lines, out.stdout
    assert any(line.startswith("note: Revealed type is \"") and line.endswith("int\"") for line in lines), out.stdout
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 2, out.stdout
    assert 'Argument 2 to "load" has incompatible type "int"; expected "str"' in errors[0]
    assert 'Unexpected keyword argument "strict"' in errors[1]
