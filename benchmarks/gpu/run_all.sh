#!/usr/bin/env bash
# Every GPU check and measurement of the project in one go, on a machine with a CUDA GPU:
#   core_gpu_check.py   CUDA tensors cached through host memory come back on their device in a fresh process
#   register_costs.py   what cudaHostRegister costs here by kind of memory (pages migrated, copy GB/s)
#   transfers.py        module.to("cuda") bandwidth (plain, pinned tensor, warm pageable, warm pinned twin), the PSS
#                       of 4 processes on the GPU, a CPU write before the move reaching the GPU
#   pytest -m gpu       tests/test_gpu.py: hits moved to the GPU equal plain; cached device_map="cuda" loads
#   bnb_gpu_check.py    bitsandbytes 4-bit and 8-bit quantized on the GPU, cached, restored on the GPU
#   blog                the blog pipeline's pipe.to("cuda"): benchmarks/run.py gpu at full scale
# Writes to $OUT (default: a new folder under /tmp): steps.log (every step's output), transfers.json, blog.json,
# gpu.json (the summary docs/benchmarks.md shows: copy it to benchmarks/results/gpu-<date>.json).
#   benchmarks/gpu/prepare.sh            here, first, where the GPU machine has no package index (.whl/)
#   benchmarks/gpu/run_all.sh [STEP...]  there; STEP: core costs transfers pss pytest bnb blog (default: all but
#                                        pss, which transfers includes; pss: the memory by mapping kind alone)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d /tmp/overmind-gpu-XXXX)}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OVERMIND_MAX_BYTES=${OVERMIND_MAX_BYTES:-48G}
if [ -d .whl ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/overmind-site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/overmind-site${PYTHONPATH:+:$PYTHONPATH}
fi
steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(core costs transfers pytest bnb blog)
log="$out/steps.log"
{ date -u; uname -r; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c 'import torch, transformers, overmind; print("torch", torch.__version__, "transformers", transformers.__version__, "overmind", overmind.__file__)'
} 2>&1 | tee "$log"
declare -A rc
run() {  # run NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "=== $name: $*" >>"$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  rc[$name]=$?
  echo "=== $name: exit ${rc[$name]} in $((SECONDS - start)) s" | tee -a "$log"
}
for step in "${steps[@]}"; do
  case $step in
    core) run core 120 "$py" benchmarks/gpu/core_gpu_check.py ;;
    costs) run costs 120 "$py" benchmarks/gpu/register_costs.py ;;
    pss) run pss 150 "$py" benchmarks/gpu/transfers.py --pss-only --pss-gib 1 ;;
    transfers) run transfers 240 "$py" benchmarks/gpu/transfers.py --gib "${GPU_GIB:-3}" --pss-gib 1.5 \
                 --json "$out/transfers.json" ;;
    pytest) run pytest 240 "$py" -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider -p no:xdist -rA ;;
    bnb) run bnb 200 "$py" benchmarks/gpu/bnb_gpu_check.py ;;
    blog) run fixture 240 "$py" benchmarks/fixtures/make_fixture.py --scale full --parts sd,controlnet
          run blog 300 "$py" benchmarks/run.py gpu --scale full -n 1
          # run.py's result: in results/, or in results/logs/<stamp>/ beside a fuller one it does not replace
          newest=$(ls -t benchmarks/results/gpu-full-*.json benchmarks/results/logs/*/gpu-full-*.json 2>/dev/null \
                   | head -1)
          [ -n "$newest" ] && cp "$newest" "$out/blog.json" ;;
    *) echo "unknown step $step" | tee -a "$log"; exit 2 ;;
  esac
done
steps_rc=""; for k in "${!rc[@]}"; do steps_rc+="$k=${rc[$k]} "; done
"$py" - "$out" "$steps_rc" <<'PY'
import json, os, subprocess, sys, time
out, steps = sys.argv[1], dict(kv.split("=") for kv in sys.argv[2].split())
import torch
summary = {"date": time.strftime("%Y-%m-%d"), "command": "benchmarks/gpu/run_all.sh",
           "machine": f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {os.cpu_count()} CPUs",
           "bandwidth": [], "pss_mib": None, "checks": []}
path = os.path.join(out, "transfers.json")
if os.path.exists(path):
    t = json.load(open(path))
    summary.update(bandwidth=t["bandwidth"], pss_mib=t["pss_mib"])
    summary["checks"] += t["checks"]
names = {"core": "core_gpu_check.py: CUDA tensors cached and restored on their device",
         "pytest": "pytest -m gpu (tests/test_gpu.py)", "bnb": "bnb_gpu_check.py: 4-bit and 8-bit on the GPU",
         "fixture": "the blog fixture at full scale", "blog": "benchmarks/run.py gpu (the blog pipeline)",
         "transfers": "transfers.py", "costs": "register_costs.py", "pss": "transfers.py --pss-only"}
summary["checks"] += [{"name": names.get(k, k), "ok": v == "0", "detail": f"exit {v}"} for k, v in steps.items()]
path = os.path.join(out, "blog.json")
if os.path.exists(path):
    summary["blog"] = json.load(open(path))
json.dump(summary, open(os.path.join(out, "gpu.json"), "w"), indent=1)
for c in summary["checks"]:
    print(("PASS" if c["ok"] else "info" if c["ok"] is None else "FAIL"), c["name"], "-", c["detail"])
PY
