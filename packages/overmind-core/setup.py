"""Build hook of overmind-core: the optional compiled extension ``overmind.native._C``.

Metadata lives in pyproject.toml; this file only adds the extension. It is built when torch imports in
the build environment (``pip install --no-build-isolation ...``, as scripts/setup does) and is never
required: without torch, with ``OVERMIND_NO_EXTENSION=1``, or when compiling fails, the package installs
with a warning and ``overmind.native.zerocopy`` uses its pure-Python twin. An editable install builds the shared
object next to the sources (src/overmind/native/_C*.so), where ``import overmind.native._C`` finds it.
"""
from __future__ import annotations

import glob
import os
import shutil
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("src", "overmind", "native", "csrc")


def _warn(message: str) -> None:
    # pip shows a build backend's stderr with -v only; the line still lands in logs, and
    # `overmind doctor` reports the missing extension at run time with the reason.
    print(f"overmind-core: {message}", file=sys.stderr)


def _extension_build() -> dict:
    """``setup()`` keyword arguments that build ``overmind.native._C``, or none when it cannot or must not be built."""
    if os.environ.get("OVERMIND_NO_EXTENSION", "") == "1":
        _warn("OVERMIND_NO_EXTENSION=1: not building overmind.native._C; the pure-Python twin will be used.")
        return {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension, library_paths
    except Exception as exc:  # torch absent or broken in the build environment
        _warn(
            f"torch does not import in the build environment ({type(exc).__name__}: {exc}); not building "
            "overmind.native._C, the pure-Python twin will be used. Install with --no-build-isolation after torch "
            "to build it."
        )
        return {}

    class OptionalBuildExtension(BuildExtension):
        """Build the extension if the toolchain allows; a failure is a warning, never a failed install."""

        def finalize_options(self) -> None:
            super().finalize_options()
            # One object folder for every build of this tree. setuptools builds an editable install in a throwaway
            # folder; here a later build with the same interpreter and flags (scripts/wheelhouse with
            # BUILD_PYTHON, a second editable install) finds the objects, and ninja compiles only what changed.
            # Another interpreter or torch changes the commands, and ninja compiles everything again.
            self.build_temp = os.path.join(HERE, "build", f"objects-{sys.implementation.cache_tag}")

        def run(self) -> None:
            try:
                super().run()
            except Exception as exc:
                _warn(
                    f"building overmind.native._C failed ({type(exc).__name__}: {exc}); installing without it, the "
                    "pure-Python twin will be used. Check for a C++20 compiler and the torch headers, then "
                    "rerun scripts/setup."
                )

        def copy_extensions_to_source(self) -> None:
            # Editable installs copy the built object into src/; skip that when the build itself failed.
            try:
                super().copy_extensions_to_source()
            except Exception as exc:
                _warn(f"could not place overmind.native._C next to the sources ({exc}); the pure-Python twin will be "
                      "used.")

    sources = sorted(glob.glob(os.path.join(CSRC, "*.cpp"), root_dir=HERE))
    extension = CppExtension(
        name="overmind.native._C",
        sources=sources,
        include_dirs=[os.path.join(HERE, CSRC)],
        extra_compile_args=["-O2", "-g0"],  # torch adds -std=c++20, which its 2.13 headers need
        # An rpath to torch's libraries lets `import overmind.native._C` resolve them even before `import torch`.
        extra_link_args=[f"-Wl,-rpath,{path}" for path in library_paths()],
    )
    # ninja, where it is on PATH (scripts/setup and scripts/wheelhouse put the venv's in), compiles the five files
    # in parallel: about 60 s instead of 105 s on two cores. It is not a dependency: without it the plain compiler
    # runs one file at a time.
    ninja = shutil.which("ninja") is not None
    return {"ext_modules": [extension], "cmdclass": {"build_ext": OptionalBuildExtension.with_options(use_ninja=ninja)}}


setup(**_extension_build())
