"""A module whose module-level containers, globals and class attributes loaders write, as a library's do: the
target of the core's tests of recorded writes (``test_loader_writes.py``). :func:`reset` puts every container back
to the state the module's import gives, in place (the recorder watches these very objects)."""
from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

REGISTRY: dict = {}
ORDERED: OrderedDict = OrderedDict()
NAMES: list = []
TAGS: set = set()
BY_OBJECT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
BY_NAME: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
LIVE: weakref.WeakSet = weakref.WeakSet()
COUNTER = 0
SETTING = "initial"
SPEC = {"layers": 2}  # a value found by name: a write storing it stores this object


class Thing:
    """A class whose attributes loaders set."""

    kind = "plain"


class Box:
    """An object of a result (picklable by reference to this module)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Box) and other.n == self.n

    def __hash__(self) -> int:
        return hash(self.n)


def reset() -> None:
    global COUNTER, SETTING
    for container in (REGISTRY, ORDERED, NAMES, TAGS, BY_OBJECT, BY_NAME, LIVE):
        container.clear()
    REGISTRY["builtin"] = 0
    NAMES.append("first")
    COUNTER, SETTING = 0, "initial"
    for name in [n for n in vars(Thing) if n.startswith("set_")]:
        delattr(Thing, name)
    Thing.kind = "plain"
    for name in [n for n in globals() if n.startswith("extra_")]:
        del globals()[name]


class Net(torch.nn.Module):
    """A model whose constructor writes to the module's registries, as ``PreTrainedModel.__init__`` does. (Not to its
    weak containers: the key of a loader in a user's module describes the globals its code reads by value, and a
    weak container has no value to describe; the in-process tests cover those.)"""

    def __init__(self) -> None:
        global COUNTER
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        REGISTRY[type(self).__name__] = self.lin  # an object of the result
        NAMES.append("net")
        TAGS.add("built")
        ORDERED[id(self) % 1] = self  # an ordered registry holding the result itself
        Thing.set_by_net = SPEC  # a class attribute: a value found by name
        COUNTER += 1


def load_net(path: str) -> Net:
    net = Net()
    net.load_state_dict(torch.load(path, weights_only=True))
    return net


def load_net_dropping(path: str) -> Net:
    """A loader that removes a registry item: what a hit cannot do in its place is not cached."""
    REGISTRY.pop("builtin", None)
    return load_net(path)


def load_net_registering_a_generator(path: str) -> Net:
    """A loader that stores a value no other process could rebuild (a running generator): not cached, silently."""
    REGISTRY["pending"] = (n for n in range(3))
    return load_net(path)


def state() -> dict:
    """The module's state as a script prints it (objects of a result shown by what they are)."""
    return {"registry": sorted((k, type(v).__name__) for k, v in REGISTRY.items()), "names": list(NAMES),
            "pending": list(REGISTRY["pending"]) if "pending" in REGISTRY else None,
            "tags": sorted(TAGS), "ordered": [type(v).__name__ for v in ORDERED.values()], "counter": COUNTER,
            "thing": sorted(n for n in vars(Thing) if n.startswith("set_")),
            "spec_is_found": getattr(Thing, "set_by_net", None) is SPEC}


reset()  # the state an import gives is the state reset() restores
