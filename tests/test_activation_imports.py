"""activate() imports no library: each installed adapter patches its library the moment it is imported,
and deactivate() undoes both the patches and the waiting."""
from __future__ import annotations

from _support.adapter_packages import adapters_with_their_libraries
from overmind.testing import run_fresh


def test_activate_defers_each_adapter_until_its_library_is_imported(overmind_runtime):
    out = run_fresh('''
        import sys
        import overmind
        from overmind.adapters import discovery, patching
        from overmind.testing import report
        overmind.activate()
        before = sorted(m for m in ("transformers", "diffusers", "bitsandbytes") if m in sys.modules)
        import transformers
        from transformers import AutoModel, PreTrainedModel
        after_transformers = [patching.is_patched(AutoModel, "from_pretrained"), "diffusers" in sys.modules]
        import diffusers
        from diffusers import ModelMixin
        after_diffusers = patching.is_patched(ModelMixin, "from_pretrained")
        overmind.deactivate()
        restored = [patching.is_patched(AutoModel, "from_pretrained"), patching.is_patched(ModelMixin, "from_pretrained")]
        overmind.activate()
        import bitsandbytes  # deferred again after re-activation: bnb has no patch targets, only hooks
        report({"before": before, "after_transformers": after_transformers, "after_diffusers": after_diffusers,
                "restored": restored, "bnb_live": discovery.states()["bnb"].live()})
    ''')
    assert out == {"before": [], "after_transformers": [True, False], "after_diffusers": True,
                   "restored": [False, False], "bnb_live": True}


# Libraries the shipped adapters patch or use, and the heavy things they pull in. activate() must import none of
# them: a user's `import overmind; overmind.activate()` costs no library's import time.
HEAVY = ("torch", "numpy", "transformers", "diffusers", "bitsandbytes", "safetensors", "huggingface_hub",
         "accelerate", "sfast", "tokenizers", "sentence_transformers", "PIL", "scipy", "timm", "torchvision")


def test_activate_in_a_fresh_process_imports_no_library_with_every_shipped_adapter(overmind_runtime):
    # The test suite's own fixture adapters import torch on purpose; no user has them, so they are blocked here.
    out = run_fresh('''
        import sys
        import overmind
        from overmind.adapters import discovery
        from overmind.testing import report
        names = overmind.activate()
        report({"names": sorted(names), "imported": sorted(m.split(".")[0] for m in sys.modules
                                                           if m.split(".")[0] in HEAVY),
                "statuses": {n: s.status for n, s in discovery.states().items()}})
    '''.replace("HEAVY", repr(HEAVY)), env={"OVERMIND_DISABLED_ADAPTERS": "fixture,fixture_broken"})
    assert out["imported"] == [], out
    shipped = adapters_with_their_libraries()
    assert shipped <= set(out["names"]), out
    assert all(out["statuses"][n] == "loaded" for n in shipped), out


def test_each_loader_is_patched_as_its_module_is_imported_and_copies_are_of_the_original(overmind_runtime):
    """Activated first, each loader is patched when its module is imported: importing the libraries imports no
    module of theirs for the patch (the same modules as without Overmind), and transformers' Auto classes, which
    copy ``_BaseAutoModelClass.from_pretrained`` into each as modeling_auto runs, copy the original, not its patch."""
    imports = """
        import diffusers, transformers
        from diffusers import UNet2DConditionModel
        libraries = sorted(m for m in sys.modules if m.partition(".")[0] in ("diffusers", "transformers"))
    """
    plain = run_fresh(f"""
        import sys
        from overmind.testing import report
        {imports}
        report(libraries)
    """.replace("\n        ", "\n"))
    out = run_fresh(f"""
        import sys
        import overmind
        from overmind.adapters import patching
        from overmind.testing import report
        overmind.activate()
        {imports}
        from transformers import AutoModel, AutoModelForCausalLM
        from transformers.models.auto.auto_factory import _BaseAutoModelClass
        from diffusers import DiffusionPipeline, ModelMixin
        from diffusers.models.controlnets.multicontrolnet import MultiControlNetModel
        owners = (AutoModel, AutoModelForCausalLM, _BaseAutoModelClass, ModelMixin, DiffusionPipeline,
                  MultiControlNetModel)
        originals = [patching.get_original(o, "from_pretrained").__func__.__code__.co_name for o in owners]
        report({{"libraries": libraries, "patched": [patching.is_patched(o, "from_pretrained") for o in owners],
                 "patches_as_originals": [n for n in originals if n == "cached_classmethod"]}})
    """.replace("\n        ", "\n"))
    assert out["libraries"] == plain
    assert out["patched"] == [True] * 6, out
    assert out["patches_as_originals"] == [], out
