"""The preload list of ``overmind run``: the default, ``[tool.overmind]`` in the project's pyproject.toml
(``preload`` replaces, ``preload-extra`` adds), ``OVERMIND_PRELOAD`` (``a,b`` replaces, ``+a,b`` adds, empty
preloads nothing), and what the program then finds already imported (and what it never does: its own
modules).
"""
from __future__ import annotations

import json
import subprocess

import pytest

from _support import run_support as rs
from overmind.runner import preload


def _project(tmp_path, table: str):
    (tmp_path / "pyproject.toml").write_text(f"[project]\nname = 'p'\n\n[tool.overmind]\n{table}\n")
    sub = tmp_path / "src" / "deep"
    sub.mkdir(parents=True)
    return str(sub)


@pytest.mark.parametrize("table, env, expected", [
    ("", None, ["@default"]),
    ("preload = ['a', 'b:C']", None, ["a", "b:C"]),
    ("preload-extra = ['x']", None, ["@default", "x"]),
    ("preload = ['a']\npreload-extra = ['x', 'a']", None, ["a", "x"]),
    ("preload = ['a']", "m,n", ["m", "n"]),
    ("preload = ['a']", "+m, n", ["a", "m", "n"]),
    ("", "+m", ["@default", "m"]),
    ("preload = ['a']", "", []),
])
def test_resolution(tmp_path, table, env, expected):
    start = _project(tmp_path, table)  # found from a folder below the project's root
    environ = {} if env is None else {preload.ENV: env}
    assert preload.resolve(start, environ) == expected


def test_a_malformed_table_names_the_file(tmp_path):
    start = _project(tmp_path, "preload = 'torch'")
    with pytest.raises(preload.PreloadSettingError, match=r"pyproject.toml: \[tool.overmind\] preload must be a list"):
        preload.resolve(start, {})


@pytest.fixture
def rt(overmind_runtime):
    yield overmind_runtime
    rs.stop_templates(overmind_runtime)


CHECK = """
import json, sys
print(json.dumps({name: name in sys.modules for name in ("om_light_a", "om_light_b", "mine")}))
import mine
"""


def test_the_program_finds_the_project_preload_imported_and_never_its_own_modules(rt, tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    rs.write(str(lib), "om_light_a.py", "A = 1\n")
    rs.write(str(lib), "om_light_b.py", "B = 1\n")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.overmind]\npreload = ['om_light_a', 'mine']\n")
    rs.write(str(project), "mine.py", "print('mine imported')\n")
    script = rs.write(str(project), "prog.py", CHECK)
    env = {"PYTHONPATH": str(lib)}
    env_without = {k: v for k, v in rs.env(rt).items() if k != "OVERMIND_PRELOAD"}
    def run(extra):
        return subprocess.run([rs.OVERMIND, "run", script], capture_output=True, text=True, timeout=240,
                              env={**env_without, **env, **extra})

    out = run({})
    assert out.returncode == 0 and not rs.warnings_in(out.stderr), out.stderr
    lines = out.stdout.splitlines()
    assert json.loads(lines[0]) == {"om_light_a": True, "om_light_b": False, "mine": False}
    assert lines[1:] == ["mine imported"], "the script's own module runs in the program, once"
    (template,) = rs.templates(rt)
    assert template["preloaded"] == ["om_light_a"] and "mine" in template["failed"], template["failed"]
    added = run({"OVERMIND_PRELOAD": "+om_light_b"})
    assert json.loads(added.stdout.splitlines()[0]) == {"om_light_a": True, "om_light_b": True, "mine": False}
