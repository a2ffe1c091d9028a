"""Scenario 8 (needs CUDA): the blog pipeline moved to the GPU, ``pipe.to('cuda')``, timed in GB/s.

    python benchmarks/scenarios/to_cuda.py CKPT DEPTH EDGE

After the blog's four calls (plain, or served by Overmind), the process times ``pipe.to("cuda")`` with the
device synchronised on both sides. Served by Overmind, the copy reads the private mappings' pageable pages, or,
with ``OVERMIND_PINNED_COPIES=1``, the pinned read-only twins of the entries' mappings (``overmind.shm.twins``;
their registration with the driver happens inside the timed call).
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
args = ap.parse_args()
ckpt, depth, edge = args.ckpt, args.depth, args.edge

sw = child.Stopwatch()
with sw("import"):
    import torch
    from diffusers import AutoencoderKL, ControlNetModel, StableDiffusionControlNetPipeline
if not torch.cuda.is_available():
    sys.exit("to_cuda.py: no CUDA device (torch.cuda.is_available() is False); this scenario needs a GPU")
with sw("cuda_init"):
    torch.zeros(1, device="cuda")  # context creation is not part of the copy
    torch.cuda.synchronize()
with sw("overmind_setup"):
    facts = child.start(wrap={"diffusers:AutoencoderKL": "from_pretrained",
                              "diffusers:ControlNetModel": "from_pretrained",
                              "diffusers:StableDiffusionControlNetPipeline": "from_pretrained"})

t_calls = time.perf_counter()
vae = AutoencoderKL.from_pretrained(ckpt, subfolder="vae", torch_dtype=torch.float16)
cn_depth = ControlNetModel.from_pretrained(depth, torch_dtype=torch.float16, variant="fp16")
cn_edge = ControlNetModel.from_pretrained(edge, torch_dtype=torch.float16, variant="fp16")
pipe = StableDiffusionControlNetPipeline.from_pretrained(ckpt, vae=vae, controlnet=[cn_edge, cn_depth], torch_dtype=torch.float16, safety_checker=None)
sw.times["from_pretrained"] = time.perf_counter() - t_calls
nbytes = child.weight_bytes(pipe)
keep = child.storages(pipe)  # the CPU pages stay mapped (and their twins registered) until the report
torch.cuda.synchronize()
t = time.perf_counter()
pipe = pipe.to("cuda")
torch.cuda.synchronize()
sw.times["to_cuda"] = time.perf_counter() - t
registered = 0
if "overmind.shm.twins" in sys.modules:
    registered = sys.modules["overmind.shm.twins"].state().registered_bytes
del keep
child.emit(**facts, times=sw.times, weight_bytes=nbytes, gb_per_s=nbytes / sw.times["to_cuda"] / 1e9,
           registered_bytes=registered, gpu=torch.cuda.get_device_name(),
           python_s=time.perf_counter() - _t_process)
