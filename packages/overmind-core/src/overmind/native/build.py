"""``overmind build-native``: compile ``overmind.native._C`` for the installed torch, from the sources shipped in
the package, in a child process, moved into place whole in
``$XDG_CACHE_HOME/overmind/native/torch-<release>-<python>/`` (see :mod:`.extension`).

For a user whose torch is newer than the one the installed extension was built for: the extension uses torch's
C++ API, so it is built per torch release, with torch's own extension builder (a C++20 compiler and torch's
headers, which torch's wheels ship; ninja where it is installed). The build runs in a child process, so that a
failed compile leaves this process as it was, and it is written next to the final folder and moved in whole.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

from ..errors import OvermindError
from . import extension

_COMPILE = '''
import sys
from torch.utils.cpp_extension import load
include, out, sources = sys.argv[1], sys.argv[2], sys.argv[3:]
load(name="_C", sources=sources, extra_include_paths=[include], extra_cflags=["-O2", "-g0"], build_directory=out,
     verbose=False, is_python_module=True)
'''


class BuildFailed(OvermindError):
    """The compile failed; the message holds the compiler's last lines and what to check."""


def build(release: str | None = None) -> tuple[str, float]:
    """Compile the extension for the installed torch; return its path and the seconds it took."""
    import torch

    release = release or extension.torch_release()
    sources = sorted(glob.glob(os.path.join(extension.SOURCES, "*.cpp")))
    if not sources:
        raise BuildFailed(f"no C++ sources in {extension.SOURCES}: reinstall overmind-core")
    final = extension.cache_dir(release)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    work = tempfile.mkdtemp(prefix=".build-", dir=os.path.dirname(final))
    start = time.monotonic()
    try:
        env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
        proc = subprocess.run([sys.executable, "-c", _COMPILE, extension.SOURCES, work, *sources],
                              capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise BuildFailed(f"compiling overmind.native._C for torch {torch.__version__} failed:\n{tail}\n"
                              f"It needs a C++20 compiler (g++ >= 10) and torch's headers (in torch's wheels). The "
                              f"pure-Python twins keep serving meanwhile.")
        built = sorted(glob.glob(os.path.join(work, "_C*.so")))
        if not built:
            raise BuildFailed(f"the compile left no _C*.so in {work}")
        keep = os.path.join(work, "keep")
        os.mkdir(keep)
        shutil.copy2(built[0], os.path.join(keep, os.path.basename(built[0])))
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(keep, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = extension.built_file(release)
    assert path is not None
    return path, time.monotonic() - start
