"""Which compiled extension serves this process: the one installed with overmind-core under the torch it was built
for (``_C.TORCH_BUILT``), else one ``overmind build-native`` built for the installed torch in
``$XDG_CACHE_HOME/overmind/native/``, else none (the pure-Python twins).

``overmind.native._C`` is compiled against torch's C++ API, which changes between torch releases: an extension built
for torch 2.13 must not serve torch 2.15. It records the torch it was built for (``_C.TORCH_BUILT``), and
:func:`load` uses it only under that torch. Otherwise it looks for an extension built for this torch and this Python
in ``$XDG_CACHE_HOME/overmind/native/`` (``overmind build-native`` compiles one there from the sources shipped in
the package); without either, the pure-Python twins serve (``zerocopy``), slower on a warm load, and
``overmind doctor`` says so and what to run.

>>> module, how = extension.load()
>>> how
'installed with overmind-core, built for torch 2.13.0'
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from .._util import interrupts, user_cache

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

NAME = "overmind.native._C"
SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")


def torch_release() -> str:
    """The installed torch's release, without a local label (``2.13.0`` for ``2.13.0+cpu``)."""
    import torch

    return torch.__version__.split("+")[0]


def cache_dir(release: str | None = None) -> str:
    """Where ``overmind build-native`` puts the extension for ``release`` (default: the installed torch) and this
    Python."""
    return user_cache.path("native", f"torch-{release or torch_release()}-{sys.implementation.cache_tag}")


def built_file(release: str | None = None) -> str | None:
    """The extension ``overmind build-native`` made for ``release`` (default: the installed torch), if any."""
    folder = cache_dir(release)
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("_C") and n.endswith(".so"))
    except OSError as e:  # none built
        interrupts.raise_users(e)
        return None
    return os.path.join(folder, names[0]) if names else None


def load() -> tuple[ModuleType | None, str]:
    """The extension for the installed torch, and how it was found (or why none was)."""
    here = torch_release()
    why = []
    try:
        module = importlib.import_module(NAME)  # a blocked entry (None) in sys.modules reads as "not built"
    except Exception as exc:  # an ABI mismatch raises ImportError, a broken build may raise others
        interrupts.raise_users(exc)
        why.append(f"{NAME} does not import ({type(exc).__name__}: {exc})")
    else:
        built = getattr(module, "TORCH_BUILT", None)
        if built == here:
            return module, f"installed with overmind-core, built for torch {built}"
        why.append(f"{NAME} was built for torch {built or 'before 2.13.0'}, this is torch {here}")
    path = built_file()
    if path is None:
        return None, f"{'; '.join(why)}; run 'overmind build-native' to compile it for this torch"
    try:
        module = _import_file(path)
    except Exception as exc:
        interrupts.raise_users(exc)
        return None, (f"{'; '.join(why)}; the extension built for it in {path} does not import "
                      f"({type(exc).__name__}: {exc}): run 'overmind build-native' again")
    built = getattr(module, "TORCH_BUILT", None)
    if built != here:
        return None, f"{'; '.join(why)}; {path} was built for torch {built}: run 'overmind build-native' again"
    return module, f"built for torch {built} by overmind build-native ({path})"


def _import_file(path: str) -> ModuleType:
    """Import the extension at ``path`` as ``overmind.native._C``, for every module that imports it by name."""
    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not an extension module: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[NAME] = module
    return module
