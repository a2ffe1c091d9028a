"""Scenarios 1-4: the blog's four ``from_pretrained`` calls, in a fresh process, timed.

    python benchmarks/scenarios/blog.py CKPT DEPTH EDGE [--touch] [--hold] [--activate-first]

``--activate-first`` calls ``overmind.activate()`` before the imports, as the blog and most user scripts do
(the default activates after them); the garbage collector's state at the first load differs. ``--touch`` then reads every weight (time to first use, scenario 3); ``--hold`` then waits until stdin is
closed, so the harness can measure the process's memory (scenario 4). The four calls below are the blog's,
unmodified except for the paths.
"""
import time

_t_process = time.perf_counter()
import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "harness")))  # child.py
import child  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("ckpt")
ap.add_argument("depth")
ap.add_argument("edge")
ap.add_argument("--touch", action="store_true")
ap.add_argument("--hold", action="store_true")
ap.add_argument("--activate-first", action="store_true")
args = ap.parse_args()
ckpt, depth, edge = args.ckpt, args.depth, args.edge
WRAP = {"diffusers:AutoencoderKL": "from_pretrained", "diffusers:ControlNetModel": "from_pretrained",
        "diffusers:StableDiffusionControlNetPipeline": "from_pretrained"}

sw = child.Stopwatch()
if args.activate_first:
    if child.VIA != "activate":
        sys.exit("blog.py: --activate-first needs BENCH_VIA=activate (wrapping loaders imports their library)")
    with sw("overmind_setup"):
        facts = child.start(breakdown_now=False)
with sw("import"):
    import torch
    from diffusers import AutoencoderKL, ControlNetModel, StableDiffusionControlNetPipeline
if args.activate_first:
    child.install_breakdown()
else:
    with sw("overmind_setup"):
        facts = child.start(wrap=WRAP)
facts["order"] = "activate-first" if args.activate_first else "activate-after-imports"

t_calls = time.perf_counter()
window = child.Window().start()
with sw("vae"):
    vae = AutoencoderKL.from_pretrained(ckpt, subfolder="vae", torch_dtype=torch.float16)
with sw("cn_depth"):
    cn_depth = ControlNetModel.from_pretrained(depth, torch_dtype=torch.float16, variant="fp16")
with sw("cn_edge"):
    cn_edge = ControlNetModel.from_pretrained(edge, torch_dtype=torch.float16, variant="fp16")
with sw("pipeline"):
    pipe = StableDiffusionControlNetPipeline.from_pretrained(ckpt, vae=vae, controlnet=[cn_edge, cn_depth], torch_dtype=torch.float16, safety_checker=None)
sw.times["from_pretrained"] = time.perf_counter() - t_calls
calls_window = window.stop()
child.ready()

touched = 0
if args.touch:
    with sw("touch"):
        touched = child.touch(pipe)
    sw.times["load_and_touch"] = sw.times["from_pretrained"] + sw.times["touch"]

dtypes = sorted({str(p.dtype) for m in child.modules_of(pipe) for p in m.parameters()})
child.emit(**facts, times=sw.times, calls_window=calls_window, touched_bytes=touched,
           weight_bytes=child.weight_bytes(pipe), dtypes=dtypes, python_s=time.perf_counter() - _t_process)
if args.hold:
    child.wait_for_release()
