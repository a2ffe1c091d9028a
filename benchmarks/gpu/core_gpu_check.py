"""GPU check for overmind-core (run on a CUDA machine; CI has none): CUDA tensors are written through host
memory and come back, in a second fresh process, on the device they had.

    .venv/bin/python benchmarks/gpu/core_gpu_check.py

Prints one line per check and exits 1 if any fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import json, torch, overmind
def build():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 16)).to("cuda:0")
    m.register_buffer("cpu_side", torch.arange(8.0), persistent=False)
    return m
m = overmind.load(build)
x = torch.linspace(-1, 1, 256, device="cuda:0").unsqueeze(0)
print(json.dumps({"devices": sorted({str(p.device) for p in m.parameters()}),
                  "out": m(x).double().sum().item()}))
'''


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing checked")
        return 0
    env = {**os.environ, "OVERMIND_RUNTIME_DIR": tempfile.mkdtemp(prefix="om-gpu-", dir="/tmp"),
           "OVERMIND_STRICT": "1", "OVERMIND_ADMIT": "first"}  # the first run publishes, the second maps it
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-3000:])
            return 1
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    subprocess.run([sys.executable, "-m", "overmind", "stop"], env=env, capture_output=True)
    ok_device = runs[1]["devices"] == ["cuda:0"]
    ok_equal = runs[0]["out"] == runs[1]["out"]
    print(f"device restored in a fresh process: {ok_device} {runs[1]['devices']}")
    print(f"outputs equal across processes:     {ok_equal} ({runs[0]['out']:.6f})")
    return 0 if ok_device and ok_equal else 1


if __name__ == "__main__":
    sys.exit(main())
