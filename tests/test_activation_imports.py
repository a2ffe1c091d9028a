"""activate() imports no library: each installed adapter patches its library the moment it is imported,
and deactivate() undoes both the patches and the waiting."""
from __future__ import annotations

from overmind.testing import run_fresh


def test_activate_defers_each_adapter_until_its_library_is_imported(overmind_runtime):
    out = run_fresh('''
        import sys
        import overmind
        from overmind import adapters, patching
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
                "restored": restored, "bnb_live": adapters.states()["bnb"].live()})
    ''')
    assert out == {"before": [], "after_transformers": [True, False], "after_diffusers": True,
                   "restored": [False, False], "bnb_live": True}
