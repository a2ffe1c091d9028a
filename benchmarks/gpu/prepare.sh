#!/usr/bin/env bash
# Run here, before benchmarks/gpu/run_all.sh on a GPU machine that cannot reach a package index: puts into .whl/
# the project's packages as wheels (without the compiled extension: the GPU machine's Python and torch differ;
# overmind.zerocopy's pure-Python twin is used there) and the libraries the checks need that such a machine
# lacks, as wheels for CPython 3.12 on x86-64. bitsandbytes keeps only its CUDA 13 libraries (the wheel carries one per
# CUDA release, 150 MB). Carry .whl (git-ignored: add it to .git/info/exclude) and .test-plugins with the tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
py=${PYTHON:-.venv/bin/python}
rm -rf .whl && mkdir -p .whl
for pkg in packages/overmind-*; do
  OVERMIND_NO_EXTENSION=1 "$py" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$pkg"
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  "dill==$("$py" -c 'import dill; print(dill.__version__)')" \
  "diffusers==$("$py" -c 'import diffusers; print(diffusers.__version__)')" \
  importlib_metadata "bitsandbytes==$("$py" -c 'import bitsandbytes; print(bitsandbytes.__version__)')"
"$py" - <<'PY'
import glob, os, zipfile
src = glob.glob(".whl/bitsandbytes-*.whl")[0]
keep = lambda n: not n.endswith(".so") or any(k in n for k in ("cuda130", "cuda132", "_cpu"))
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(src + ".tmp", "w", zipfile.ZIP_DEFLATED) as zo:
    for info in zi.infolist():
        if not keep(info.filename):
            continue
        data = zi.read(info.filename)
        if info.filename.endswith("RECORD"):
            data = b"\n".join(l for l in data.split(b"\n") if keep(l.split(b",")[0].decode()))
        zo.writestr(info, data)
os.replace(src + ".tmp", src)
PY
du -sh .whl
