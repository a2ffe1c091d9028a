"""Hit rate over everyday variants of one process, seeded and not: which ordinary differences between two runs hit.

    python benchmarks/variants.py [--out benchmarks/results] [--loaders ...] [--variants ...]
    .venv-timm/bin/python benchmarks/variants.py --loaders timm

For each loader (a transformers model, a transformers model with a head the checkpoint lacks, the plain PyTorch
pattern ``Net(); load_state_dict(torch.load(path))``, a diffusers pipeline; timm's ``create_model`` with
``--loaders timm`` under ``.venv-timm/bin/python``) each variant runs in two forms: **seeded** (the script calls
``torch.manual_seed(0)`` before the variant's own lines) and **not seeded** (it never seeds: a fresh process's
generator is as torch's import seeded it from the OS). Every script imports ``overmind`` and calls ``activate()``
first, then torch and the library, except the variant "torch imported before overmind". Each form runs as a plain
process (no Overmind) and as two fresh Overmind processes against one private server: the first publishes what it
can (``OVERMIND_ADMIT=first``), the second is the measured one. A row says whether the second process's load was served from the cache (the
``overmind`` logger: hits and no miss) and whether its result equals the plain process's:

- seeded: the result and ``torch.randn(4)`` after the load equal the plain process's bit for bit;
- not seeded, a result that keeps no drawn value: the result equals the plain process's (its generator is the
  OS's, in plain processes too, so what it draws after the load is not compared);
- not seeded, a result that keeps drawn values (a head the checkpoint lacks): a plain process's differs from run to
  run, so the expected outcome is "not served", and a result that differs from the plain process's and from the
  first Overmind process's (each process draws its own).

Tiny models (tests/_support/tiny_models.py) in a temporary folder, removed at the end; prints a markdown table per loader, the
``overmind`` logger's "not caching" / "not serving" lines (DEBUG) of each row that is not what is expected, and
writes ``variants-<stamp>.{md,json}`` (benchmarks/charts.py puts the newest result of each loader into
docs/benchmarks.md). Exit status 1 when any row is not what is expected.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MARK = "VARIANT-RESULT:"
MODES = ("seeded", "not seeded")

# What each variant does before the load: a line of Python run after the imports (after torch.manual_seed(0) in
# the seeded form). SEEDED_ONLY variants have no unseeded form.
VARIANTS = {
    "a script": "",
    "draws before the load": "torch.rand(7)",
    "another seed": "torch.manual_seed(1)",
    "warnings ignored": "import warnings; warnings.simplefilter('ignore')",
    "logging configured": "import logging; logging.basicConfig(level=logging.INFO)",
    "under torch.no_grad()": "NO_GRAD = True",
    "in a thread": "IN_THREAD = True",
    "another working directory": "os.chdir(tempfile.gettempdir())",
    "PYTHONHASHSEED=1": "",
    "under inference_mode": "INFERENCE = True",
    "torch imported before overmind": "",
}
SEEDED_ONLY = {"another seed"}
ENV = {"PYTHONHASHSEED=1": {"PYTHONHASHSEED": "1"}, "torch imported before overmind": {"TORCH_FIRST": "1"}}
# Not seeded, torch imported before overmind counts as seeded (the program may have seeded before Overmind could
# watch): a variant per generator state, and a state torch's import drew from the OS is never published, so a load
# that draws from torch's generator is not served (one that draws nothing has no variant).
NOT_SERVED_UNSEEDED = {"torch imported before overmind"}

# name: (imports, the call, whether its result keeps values drawn at random: a layer the checkpoint lacks)
LOADERS = {
    "transformers BertModel": ("from transformers import BertModel",
                               "BertModel.from_pretrained(P['bert'])", False),
    "transformers head not in checkpoint": ("from transformers import BertForSequenceClassification",
                                            "BertForSequenceClassification.from_pretrained(P['bert'], num_labels=3)",
                                            True),
    "plain PyTorch Net + load_state_dict": ("from _support import random_loaders as rl",
                                            "overmind.load(rl.load_net, P['net'])", False),
    "diffusers pipeline": ("from diffusers import StableDiffusionPipeline",
                           "StableDiffusionPipeline.from_pretrained(P['sd'], safety_checker=None)", False),
    # run with the timm lane's interpreter: .venv-timm/bin/python benchmarks/variants.py --loaders timm
    "timm": ("import timm",
             "timm.create_model('test_vit', pretrained=True, num_classes=5, "
             "pretrained_cfg_overlay=dict(file=P['timm'], num_classes=5))", False),
    "timm head not in checkpoint": ("import timm",
                                    "timm.create_model('test_vit', pretrained=True, num_classes=3, "
                                    "pretrained_cfg_overlay=dict(file=P['timm']))", True),
}
DEFAULT_LOADERS = [name for name in LOADERS if not name.startswith("timm")]

CHILD = r'''
import hashlib, io, json, logging, os, sys, tempfile, threading
LOG = io.StringIO()
logging.getLogger("overmind").addHandler(logging.StreamHandler(LOG))
logging.getLogger("overmind").setLevel(logging.DEBUG)
if os.environ.get("TORCH_FIRST"):
    import torch
if os.environ["VIA"] == "overmind":
    import overmind
    overmind.activate()
import torch
{imports}
P = json.loads(os.environ["PATHS"])
NO_GRAD = IN_THREAD = INFERENCE = False
if os.environ["SEEDED"]:
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
before = torch.get_rng_state()
if IN_THREAD:
    t = threading.Thread(target=lambda: box.append(run())); t.start(); t.join()
else:
    box.append(run())
obj = box[0]
drew = not torch.equal(before, torch.get_rng_state())
h = hashlib.sha256()
modules = [obj] if isinstance(obj, torch.nn.Module) else [m for m in vars(obj).values() if isinstance(m, torch.nn.Module)]
for m in modules:
    for name, t in sorted(m.state_dict().items()):
        h.update(name.encode() + t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
said = LOG.getvalue().splitlines()
print("{mark}" + json.dumps({{"digest": h.hexdigest(), "next": torch.randn(4).tolist(), "drew": drew,
                             "hits": sum(m.startswith("hit ") for m in said),
                             "misses": sum(m.startswith("miss ") for m in said),
                             "why": [m for m in said if m.startswith(("not caching", "not serving"))]}}), flush=True)
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
    if any(name.startswith("timm") for name in loaders):
        import safetensors.torch
        import timm
        import torch

        with torch.random.fork_rng():
            torch.manual_seed(11)
            model = timm.create_model("test_vit", num_classes=5)
        paths["timm"] = os.path.join(root, "test_vit.safetensors")
        safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, paths["timm"])
    return paths


def _child(loader: str, variant: str, mode: str, via: str, env: dict) -> dict:
    imports, call, _ = LOADERS[loader]
    if via == "plain":
        call = call.replace("overmind.load(rl.load_net, ", "rl.load_net(")
    script = CHILD.format(imports=imports, setup=VARIANTS[variant], call=call, mark=MARK)
    extra = {**ENV.get(variant, {}), "VIA": via, "SEEDED": "1" if mode == "seeded" else ""}
    proc = subprocess.run([sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{loader} / {variant} / {mode} / {via}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK):])


def expected(loader: str, variant: str, mode: str, drew: bool) -> dict:
    """What a row should show: ``served``, and ``equal`` (True: the result, and when seeded what torch draws after
    it, equal plain's; "own draw": the result differs from plain's and from the first Overmind process's). ``drew``:
    whether the plain process's load moved torch's generator."""
    if mode == "seeded":
        return {"served": True, "equal": True}
    keeps_draws = LOADERS[loader][2]
    return {"served": not keeps_draws and not (drew and variant in NOT_SERVED_UNSEEDED),
            "equal": "own draw" if keeps_draws else True}


def row(loader: str, variant: str, mode: str, plain: dict, first: dict, second: dict) -> dict:
    served = second["hits"] > 0 and second["misses"] == 0
    same_result = second["digest"] == plain["digest"]
    same_next = second["next"] == plain["next"] if mode == "seeded" else None
    want = expected(loader, variant, mode, plain["drew"])
    if want["equal"] == "own draw":
        equal = "own draw" if second["digest"] not in (plain["digest"], first["digest"]) else False
    else:
        equal = same_result and same_next is not False
    return {"loader": loader, "variant": variant, "mode": mode, "served": served, "same_result": same_result,
            "same_random_after": same_next, "equal": equal, "drew": plain["drew"], "expected": want,
            "as_expected": served == want["served"] and equal == want["equal"],
            "why_first": first["why"], "why_second": second["why"]}


def served_cell(r: dict) -> str:
    text = "hit" if r["served"] else "miss"
    return text if r["served"] == r["expected"]["served"] else f"**{text}**"


def equal_cell(r: dict) -> str:
    if r["equal"] == "own draw":
        return "own draw ¹"
    if r["equal"] is True:
        return "yes"
    if r["expected"]["equal"] == "own draw":
        return "**same as another process's**"
    if not r["same_result"]:
        return "**result differs**"
    return "**generator differs after**"


def tables(rows: list[dict], wrap=lambda text: text) -> str:
    """A summary line per loader, then one markdown table per loader (a row per variant, the seeded and the not
    seeded form side by side), then the legend; ``wrap`` formats each paragraph of prose."""
    out = ["| loader | seeded: served | not seeded: served | rows not as expected | the plain load draws from "
           "torch's generator |", "|---|---|---|---|---|"]
    loaders = list(dict.fromkeys(r["loader"] for r in rows))
    for loader in loaders:
        mine = [r for r in rows if r["loader"] == loader]
        counts = []
        for mode in MODES:
            rs = [r for r in mine if r["mode"] == mode]
            counts.append(f"{sum(r['served'] for r in rs)} of {len(rs)}")
        off = sum(not r["as_expected"] for r in mine)
        drew = {r.get("drew") for r in mine}
        draws = "yes" if drew == {True} else "no" if drew == {False} else "in some variants"
        out.append(f"| {loader} | " + " | ".join(counts) + f" | {f'**{off}**' if off else 0} | {draws} |")
    out.append("")
    for loader in loaders:
        mine = {(r["variant"], r["mode"]): r for r in rows if r["loader"] == loader}
        out += [f"**{loader}**", "", "| variant | seeded: served | seeded: equals plain | not seeded: served | "
                "not seeded: equals plain |", "|---|---|---|---|---|"]
        for v in dict.fromkeys(v for v, _ in mine):
            cells = []
            for mode in MODES:
                r = mine.get((v, mode))
                cells += [served_cell(r), equal_cell(r)] if r else ["-", "-"]
            out.append(f"| {v}{' ²' if v in NOT_SERVED_UNSEEDED else ''} | " + " | ".join(cells) + " |")
        out.append("")
    out.append("\n\n".join(wrap(p) for p in LEGEND))
    return "\n".join(out)


LEGEND = (
    "Seeded: the script calls `torch.manual_seed(0)` before the variant's lines; \"equals plain\": the result and "
    "`torch.randn(4)` after the load equal a plain process's bit for bit. Not seeded: the script never seeds; "
    "\"equals plain\": the result equals a plain unseeded process's (what torch draws after the load follows the "
    "OS's seed, in plain processes too). A hit: the second Overmind process's load was served from the cache (the "
    "first published it). Bold: not what is expected.",
    "¹ The result keeps values drawn at random (a head the checkpoint lacks), so a plain unseeded process's differs "
    "from run to run: expected is a miss, and a result that differs from the plain process's and from the first "
    "Overmind process's (each process draws its own, as plain).",
    "² torch imported before `overmind` counts as seeded (the program may have seeded before Overmind could watch): "
    "a variant per generator state, and a state torch's import drew from the OS is never published. Not seeded, a "
    "load that draws from torch's generator is then a miss by design; one that draws nothing is served (it has no "
    "variant).",
)


def _machine() -> dict:
    sys.path.insert(0, os.path.join(HERE, "harness"))
    from harness import machine

    m = machine()
    try:
        m["timm"] = metadata.version("timm")
    except metadata.PackageNotFoundError:
        m["timm"] = "-"
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--loaders", help="comma-separated subset of: " + ", ".join(LOADERS) + "; a name's first word "
                                      "picks every loader it begins (`timm`: both timm loaders, which run with the "
                                      "timm lane's interpreter; default: every loader but timm's)")
    ap.add_argument("--variants", help="comma-separated subset of: " + ", ".join(VARIANTS))
    args = ap.parse_args(argv)
    if args.loaders:
        loaders = [name for want in args.loaders.split(",") for name in LOADERS
                   if name == want or name.startswith(want + " ")]
    else:
        loaders = DEFAULT_LOADERS
    loaders = list(dict.fromkeys(loaders))
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS] + ([] if loaders else [args.loaders])
    if unknown:
        ap.error(f"unknown: {', '.join(unknown)}")
    machine = _machine()
    work = tempfile.mkdtemp(prefix="om-variants-")  # mode 700
    runtime = os.path.join(work, "rt")
    os.mkdir(runtime, 0o700)
    paths = _fixtures(work, loaders)
    pythonpath = os.pathsep.join([os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
    base = {**os.environ, "PATHS": json.dumps(paths), "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "OVERMIND_RUNTIME_DIR": runtime,
            "OVERMIND_ADMIT": "first"}  # the first Overmind process publishes what it can
    for name in ("TORCH_FIRST", "SEEDED", "VIA"):
        base.pop(name, None)
    rows = []
    try:
        for loader in loaders:
            for variant in variants:
                for mode in MODES:
                    if mode == "not seeded" and variant in SEEDED_ONLY:
                        continue
                    plain = _child(loader, variant, mode, "plain", base)
                    first = _child(loader, variant, mode, "overmind", base)
                    second = _child(loader, variant, mode, "overmind", base)
                    r = row(loader, variant, mode, plain, first, second)
                    rows.append(r)
                    print(f"  {loader:<37} {variant:<32} {mode:<10} served={r['served']} equal={r['equal']}"
                          + ("" if r["as_expected"] else "  NOT AS EXPECTED"), file=sys.stderr, flush=True)
    finally:
        subprocess.run([sys.executable, "-m", "overmind", "stop"], env=base, capture_output=True, timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    table = tables(rows)
    off = [r for r in rows if not r["as_expected"]]
    why = []
    for r in off:
        why.append(f"- {r['loader']} / {r['variant']} / {r['mode']}: first process: "
                   + ("; ".join(r["why_first"]) or "-") + " | second: " + ("; ".join(r["why_second"]) or "-"))
    print(table)
    if why:
        print("\nNot as expected, the overmind logger's lines:\n" + "\n".join(why))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    command = "python benchmarks/variants.py" + (f" --loaders {args.loaders}" if args.loaders else "") + (
        f" --variants '{args.variants}'" if args.variants else "")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"variants-{stamp}.json"), "w") as f:
        json.dump({"command": command, "modes": list(MODES), "machine": machine, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, f"variants-{stamp}.md"), "w") as f:
        f.write(f"`{command}`\n\n" + table + "\n" + ("\nNot as expected:\n" + "\n".join(why) + "\n" if why else ""))
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
