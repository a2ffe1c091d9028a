"""One folder named by several spellings in a sequence of fresh processes: ``m``, ``./m``, ``/abs/m``, ``/abs/m/``
and the same as ``pathlib.Path``. The spellings of one type name one folder, so they share a cache entry; what
each process loads must still name the folder as that process spelled it, wherever plain derives a string from
the path (``packages/overmind-*/tests/**/test_path_spellings.py``, through ``plain_sequences.compare_with_plain``).

>>> steps = [x for form in FORMS for x in (spelled_as(*form), SCRIPT_WITH_PRELUDE)]

:data:`PRELUDE` goes at the head of each script: it moves to ``S["cwd"]`` (the folders' parent, so the relative
spellings resolve) and gives ``spelled(name)``, the folder ``name`` as this step spells it, and
``naming(obj, name)``, every string or path in ``obj``'s object graph that contains ``name``: the ones plain
derived from the path, and any other that merely contains the name, which must stay as plain leaves it.
"""
from __future__ import annotations

from typing import Any, Callable

# (form, as pathlib.Path): the str forms share one entry, the Path forms another (a key tells the types apart)
FORMS = (("name", False), ("./name", False), ("abs", False), ("abs/", False), ("name", True), ("abs", True))
HITS_EXPECTED = (1, 2, 3, 5)  # the steps of FORMS whose loads an earlier step's entry serves

PRELUDE = '''
import pathlib

os.chdir(S["cwd"])


def spelled(name):
    """The folder ``name`` (in the current directory) as this step spells it."""
    form = S["form"]
    text = {"name": name, "./name": "./" + name, "abs": os.path.join(os.getcwd(), name),
            "abs/": os.path.join(os.getcwd(), name) + "/"}[form]
    return pathlib.Path(text) if S["pathlib"] else text


def naming(root, name):
    """{where: repr} of every str or path reachable from root (attributes, dict values, list and tuple items, set
    members) that contains ``name``."""
    out, seen, todo = {}, set(), [("", root)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, (str, pathlib.PurePath)):
            if name in str(v):
                out[where] = repr(v)
            continue
        if isinstance(v, (int, float, bool, bytes, type(None), type, torch.Tensor)) or id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, dict):
            todo.extend((f"{where}[{k!r}]", x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            todo.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, (set, frozenset)):
            members = sorted(repr(x) for x in v if isinstance(x, (str, pathlib.PurePath)) and name in str(x))
            if members:
                out[where] = repr(members)
        attributes = getattr(v, "__dict__", None)
        if isinstance(attributes, dict):
            todo.extend((f"{where}.{k}", x) for k, x in attributes.items())
    return out
'''


def spelled_as(form: str, as_path: bool) -> Callable[[dict], Any]:
    """A step that makes the next scripts spell their folders as ``form`` (a key of ``spelled``'s table)."""
    return lambda extra: extra.update(form=form, pathlib=as_path)
