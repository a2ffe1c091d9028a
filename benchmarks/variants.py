"""Hit rate over everyday variants of one process: which ordinary differences between two runs still hit.

    python benchmarks/variants.py [--out benchmarks/results]

For each loader (a transformers model, a transformers model with a head the checkpoint lacks, the plain PyTorch
pattern ``Net(); load_state_dict(torch.load(path))``, a diffusers pipeline; timm's ``create_model`` with
``--loaders timm`` under ``.venv-timm/bin/python``), each variant runs as a fresh process
twice against one private server: the first publishes what it can, the second is the measured one. A row says
whether the second process's load was served from the cache (the ``overmind`` logger's INFO lines: hits and no
miss) and whether its result and ``torch.randn(4)`` afterwards equal a plain process's of the same variant (the
result only for "not seeded": torch seeds itself from the OS there, in plain processes too). Tiny models (tests/_support/tiny_models.py) in a temporary folder; prints a markdown table
and writes ``variants-<stamp>.{md,json}``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MARK = "VARIANT-RESULT:"

# What each variant does before the load (a line of Python, run after the imports and activate()). Every variant
# but "not seeded" is a script that seeds torch first, so that what the generators give afterwards can be compared
# with a plain process's; "not seeded" compares the result only.
VARIANTS = {
    "a seeded script": "",
    "draws between the seed and the load": "torch.rand(7)",
    "another seed": "torch.manual_seed(1)",
    "not seeded": "torch.seed()",
    "warnings ignored": "import warnings; warnings.simplefilter('ignore')",
    "logging configured": "import logging; logging.basicConfig(level=logging.INFO)",
    "under torch.no_grad()": "NO_GRAD = True",
    "in a thread": "IN_THREAD = True",
    "another working directory": "os.chdir(tempfile.gettempdir())",
    "PYTHONHASHSEED=1": "",
    "under inference_mode": "INFERENCE = True",
}

LOADERS = {
    "transformers BertModel": ("from transformers import BertModel",
                               "BertModel.from_pretrained(P['bert'])"),
    "transformers head not in checkpoint": ("from transformers import BertForSequenceClassification",
                                            "BertForSequenceClassification.from_pretrained(P['bert'], num_labels=3)"),
    "plain PyTorch Net + load_state_dict": ("from _support import random_loaders as rl",
                                            "overmind.load(rl.load_net, P['net'])"),
    "diffusers pipeline": ("from diffusers import StableDiffusionPipeline",
                           "StableDiffusionPipeline.from_pretrained(P['sd'], safety_checker=None)"),
    # run with the timm lane's interpreter: .venv-timm/bin/python benchmarks/variants.py --loaders timm
    "timm": ("import timm",
             "timm.create_model('test_vit', pretrained=True, num_classes=3, "
             "pretrained_cfg_overlay=dict(file=P['timm']))"),
}
DEFAULT_LOADERS = [name for name in LOADERS if name != "timm"]

CHILD = r'''
import hashlib, io, json, logging, os, sys, tempfile, threading
import torch
import overmind
LOG = io.StringIO()
_handler = logging.StreamHandler(LOG)
logging.getLogger("overmind").addHandler(_handler)
logging.getLogger("overmind").setLevel(logging.INFO)
if os.environ["VIA"] == "overmind":
    overmind.activate()
{imports}
P = json.loads(os.environ["PATHS"])
NO_GRAD = IN_THREAD = INFERENCE = False
torch.manual_seed(0)
{setup}
def load():
    return {call}
def run():
    if INFERENCE:
        with torch.inference_mode():
            return load()
    if NO_GRAD:
        with torch.no_grad():
            return load()
    return load()
box = []
if IN_THREAD:
    t = threading.Thread(target=lambda: box.append(run())); t.start(); t.join()
else:
    box.append(run())
obj = box[0]
h = hashlib.sha256()
modules = [obj] if isinstance(obj, torch.nn.Module) else [m for m in vars(obj).values() if isinstance(m, torch.nn.Module)]
for m in modules:
    for name, t in sorted(m.state_dict().items()):
        h.update(name.encode() + t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
text = LOG.getvalue()
said = text.splitlines()
print("{mark}" + json.dumps({{"digest": h.hexdigest(), "next": torch.randn(4).tolist(),
                             "hits": sum(m.startswith("hit ") for m in said),
                             "misses": sum(m.startswith("miss ") for m in said)}}), flush=True)
'''


def _fixtures(root: str, loaders: list[str]) -> dict:
    """The files ``loaders`` read, each built only when one of them needs it (the timm lane has no transformers)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    paths = {}
    if any(name.startswith("transformers") for name in loaders):
        from _support import tiny_models

        paths["bert"] = str(tiny_models.build_bert(os.path.join(root, "bert")))
    if "diffusers pipeline" in loaders:
        from _support import tiny_models

        paths["sd"] = str(tiny_models.build_sd_pipeline(os.path.join(root, "sd")))
    if "plain PyTorch Net + load_state_dict" in loaders:
        from _support import random_loaders

        paths["net"] = random_loaders.save_net(os.path.join(root, "net.pt"))
    if "timm" in loaders:
        import safetensors.torch
        import timm
        import torch

        with torch.random.fork_rng():
            torch.manual_seed(11)
            model = timm.create_model("test_vit", num_classes=5)
        paths["timm"] = os.path.join(root, "test_vit.safetensors")
        safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, paths["timm"])
    return paths


def _child(loader: str, variant: str, via: str, env: dict) -> dict:
    imports, call = LOADERS[loader]
    if via == "plain":
        call = call.replace("overmind.load(rl.load_net, ", "rl.load_net(")
    script = CHILD.format(imports=imports, setup=VARIANTS[variant], call=call, mark=MARK)
    extra = {"PYTHONHASHSEED": "1"} if variant == "PYTHONHASHSEED=1" else {}
    proc = subprocess.run([sys.executable, "-c", script], env={**env, **extra, "VIA": via}, capture_output=True,
                          text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{loader} / {variant} / {via}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--loaders", help="comma-separated subset of: " + ", ".join(LOADERS) + " (default: all but "
                                      "timm, which runs with the timm lane's interpreter)")
    ap.add_argument("--variants", help="comma-separated subset of: " + ", ".join(VARIANTS))
    args = ap.parse_args(argv)
    loaders = args.loaders.split(",") if args.loaders else DEFAULT_LOADERS
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    work = tempfile.mkdtemp(prefix="om-variants-")
    paths = _fixtures(work, loaders)
    pythonpath = os.pathsep.join([os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
    base = {**os.environ, "PATHS": json.dumps(paths), "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "OVERMIND_RUNTIME_DIR": os.path.join(work, "rt")}
    rows = []
    try:
        for loader in loaders:
            for variant in variants:
                plain = _child(loader, variant, "plain", base)
                _child(loader, variant, "overmind", base)
                second = _child(loader, variant, "overmind", base)
                served = second["hits"] > 0 and second["misses"] == 0
                same = second["digest"] == plain["digest"]
                same_next = second["next"] == plain["next"] or variant == "not seeded"
                rows.append({"loader": loader, "variant": variant, "served": served, "same_result": same,
                             "same_random_after": same_next})
                print(f"  {loader:<40} {variant:<36} served={served} same={same} next={same_next}",
                      file=sys.stderr, flush=True)
    finally:
        subprocess.run([sys.executable, "-m", "overmind", "stop"], env=base, capture_output=True, timeout=60)
    lines = ["| loader | " + " | ".join(variants) + " | served |", "|---|" + "---|" * (len(variants) + 1)]
    for loader in loaders:
        mine = [r for r in rows if r["loader"] == loader]
        cells = []
        for r in mine:
            mark = "hit" if r["served"] else "miss"
            if not r["same_result"] or not r["same_random_after"]:
                # unseeded, a result drawn at random differs between any two processes, plain ones too
                mark += " (drawn from an OS seed)" if r["variant"] == "not seeded" else " **differs**"
            cells.append(mark)
        lines.append(f"| {loader} | " + " | ".join(cells) + f" | {sum(r['served'] for r in mine)} of {len(mine)} |")
    table = "\n".join(lines)
    print(table)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"variants-{stamp}.json"), "w") as f:
        json.dump({"command": "python benchmarks/variants.py", "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, f"variants-{stamp}.md"), "w") as f:
        f.write("`python benchmarks/variants.py`\n\n" + table + "\n")
    differs = [r for r in rows if r["variant"] != "not seeded" and not (r["same_result"] and r["same_random_after"])]
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
