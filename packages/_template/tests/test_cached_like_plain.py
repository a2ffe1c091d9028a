"""mylib's loaders with Overmind on, in fresh processes, against plain mylib: the same model, the
random generators left where plain leaves them, served from the cache from the second process on;
a file changed under ``$MYLIB_HOME`` is a miss, never a stale model."""
from __future__ import annotations

import pytest

from overmind.testing import check_cached_like_plain, run_fresh

mylib = pytest.importorskip("mylib", reason="mylib, the library this adapter instruments, is not "
                                            "installed")

PREAMBLE = """
import overmind, torch
from overmind.testing import report
overmind.activate()
import mylib

def describe(model):
    weights = {name: t.tolist() for name, t in model.state_dict().items()}
    return [type(model).__name__, str(next(model.parameters()).dtype), weights]
"""


@pytest.fixture
def home(tmp_path):
    """A ``$MYLIB_HOME`` holding the model ``tiny``, as a download cache holds one."""
    import torch

    torch.manual_seed(0)
    mylib.create_model("tiny").save_pretrained(tmp_path / "tiny")
    return tmp_path


def test_from_pretrained_of_a_folder(overmind_runtime, home):
    check_cached_like_plain(PREAMBLE + f"""
model = mylib.Model.from_pretrained({str(home / "tiny")!r}, dtype=torch.float64)
report(describe(model))
""")


def test_from_pretrained_of_a_name_under_mylib_home(overmind_runtime, home):
    check_cached_like_plain(PREAMBLE + """
report(describe(mylib.Model.from_pretrained("tiny")))
""", env={"MYLIB_HOME": str(home)})


def test_create_model_built_at_random_in_a_seeded_script(overmind_runtime):
    check_cached_like_plain(PREAMBLE + """
torch.manual_seed(1)
report(describe(mylib.create_model("wide")))
""")


def test_a_model_changed_under_mylib_home_is_loaded_anew(overmind_runtime, home):
    script = PREAMBLE + """
report(describe(mylib.create_model("tiny", pretrained=True)))
"""
    env = {"MYLIB_HOME": str(home)}
    before = run_fresh(script, env=env)
    missed = _hits()
    assert run_fresh(script, env=env) == before and _hits() > missed  # served from the cache
    served = _hits()
    import torch

    torch.manual_seed(2)
    mylib.create_model("tiny").save_pretrained(home / "tiny")
    after = run_fresh(script, env=env)
    assert after != before and after == run_fresh(script, env={**env, "OVERMIND_DISABLE": "1"})
    assert _hits() == served  # the changed files: a new key, a miss


def _hits() -> int:
    import overmind

    return sum(entry.hits for entry in overmind.cache_info(processes=False).entries)


def test_the_self_check_sample_survives_the_cache(overmind_runtime):
    # what activate() checks on a mylib release newer than the tested range, once per environment
    check_cached_like_plain("""
import overmind, torch
from overmind.adapter import SelfCheck
from overmind.testing import report
from overmind_mylib.plugin import adapter

torch.manual_seed(0)
sample = overmind.load(adapter.overmind_self_check().sample)
report(repr(SelfCheck.default_describe(sample)))
""")
