"""The eviction planner (``server/eviction.py``) on its own: hypothesis draws a store's entries
(sizes, last uses, references between them, pins, keyless entries), the bytes a publish needs and
the budget, and an order (least recently used, or any other ranking); a model of the store's removal
checks the plan it returns.

- it never chooses a pinned, keyless or referenced entry (one that an entry still staying
  references);
- it frees enough when that is possible at all (None only when evicting every entry free to go
  leaves too little);
- each victim is the least, in the order, among the entries free to go when it is chosen;
- it evicts nothing when the bytes fit, and stops as soon as they do.

Then the store with an order of its own, and what it keeps while it carries a plan out.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overmind.ipc.protocol import file_entry_id, file_identity
from overmind.server import eviction
from overmind.server.eviction import LEAST_RECENTLY_USED, Item, Order
from overmind.server.store import Store

PAGE = mmap.PAGESIZE

SETTINGS = settings(max_examples=300, deadline=None)

ORDERS = st.sampled_from([
    LEAST_RECENTLY_USED,
    Order("largest first", lambda item: -item.nbytes),
    Order("fewest hits", lambda item: (item.hits, item.last_use)),
    Order("oldest first", lambda item: item.created),
])


@st.composite
def stores(draw):
    """Items as a store holds them: each references only items published before it, a keyless one
    (a file or an entry out of service) is referenced by at least one other, and the last uses are
    distinct."""
    n = draw(st.integers(0, 12))
    uses = draw(st.permutations(range(n)))
    items: list[Item] = []
    for i in range(n):
        deps = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else ()
        items.append(Item(f"e{i}", draw(st.integers(0, 100)), last_use=uses[i], created=float(i),
                          hits=draw(st.integers(0, 3)), deps=tuple(f"e{d}" for d in deps),
                          pinned=draw(st.booleans()) and draw(st.booleans())))
    referenced = {d for item in items for d in item.deps}
    for i, item in enumerate(items):  # keyless: never chosen, gone with its last referent
        if item.id in referenced and draw(st.booleans()) and draw(st.booleans()):
            items[i] = Item(item.id, item.nbytes, item.last_use, item.created, item.hits,
                            item.deps, item.pinned, keyless=True)
    return items


class Model:
    """The store's removal, one entry at a time: a removed entry's keyless dependencies go with
    their last referent (pinned ones stay)."""

    def __init__(self, items: list[Item]) -> None:
        self.items = {item.id: item for item in items}
        self.left = dict(self.items)

    def used(self) -> int:
        return sum(item.nbytes for item in self.left.values())

    def referenced(self, item_id: str) -> bool:
        return any(item_id in other.deps for other in self.left.values() if other.id != item_id)

    def free_to_go(self) -> list[Item]:
        return [item for item in self.left.values()
                if not item.pinned and not item.keyless and not self.referenced(item.id)]

    def remove(self, item_id: str) -> None:
        item = self.left.pop(item_id)
        for dep in item.deps:
            found = self.left.get(dep)
            if found is None or not found.keyless or found.pinned:
                continue
            if not self.referenced(dep):
                self.remove(dep)


def most_freeable(items: list[Item]) -> int:
    """Bytes left after evicting every entry that can go (which ones can is the same in every
    order)."""
    model = Model(items)
    while model.free_to_go():
        model.remove(model.free_to_go()[0].id)
    return model.used()


@SETTINGS
@given(items=stores(), need=st.integers(0, 400), limit=st.integers(0, 800), order=ORDERS)
def test_a_plan_takes_only_what_may_go_in_the_order_and_just_enough(items, need, limit, order):
    plan = eviction.plan(items, need, limit, order)
    model = Model(items)
    if plan is None:
        assert most_freeable(items) + need > limit, "refused though evicting could make room"
        return
    if model.used() + need <= limit:
        assert plan == [], "evicted although the bytes fit"
    for victim in plan:
        assert model.used() + need > limit, "went on evicting after the bytes fit"
        free = model.free_to_go()
        assert victim in {item.id for item in free}, "chose a pinned, keyless or in-use entry"
        least = min(order.key(item) for item in free)
        assert order.key(model.items[victim]) == least, "out of order"
        model.remove(victim)
    assert model.used() + need <= limit, "the plan does not free enough"


@SETTINGS
@given(items=stores(), order=ORDERS)
def test_a_plan_frees_exactly_up_to_what_can_go(items, order):
    """Room for every byte that can go, in any order, and not one byte more."""
    total = sum(item.nbytes for item in items)
    freeable = total - most_freeable(items)
    assert eviction.plan(items, freeable, total, order) is not None
    assert eviction.plan(items, freeable + 1, total, order) is None


@SETTINGS
@given(items=stores())
def test_held_bytes_are_the_pinned_and_the_referenced(items):
    referenced = {dep for item in items for dep in item.deps}
    assert eviction.held_bytes(items) == sum(
        item.nbytes for item in items if item.pinned or item.id in referenced)


def test_least_recently_used_is_the_default_order():
    items = [Item("a", 10, last_use=3), Item("b", 10, last_use=1), Item("c", 10, last_use=2)]
    assert eviction.plan(items, 15, 30) == ["b", "c"]
    assert eviction.plan(items, 0, 30) == []
    assert eviction.plan(items, 31, 30) is None


def test_an_entry_freed_by_its_referents_going_is_a_candidate_then():
    base = Item("base", 10, last_use=0)
    user = Item("user", 10, last_use=5, deps=("base",))
    assert eviction.plan([base, user, Item("x", 10, last_use=3)], 30, 30) == ["x", "user", "base"]


def test_a_keyless_dependency_goes_with_its_last_referent_unless_pinned():
    file = Item("file", 50, keyless=True)
    users = [Item("a", 10, last_use=1, deps=("file",)), Item("b", 10, last_use=2, deps=("file",))]
    # the file's bytes count once both users are gone
    assert eviction.plan([file, *users], 60, 100) == ["a", "b"]
    pinned = Item("file", 50, keyless=True, pinned=True)
    assert eviction.plan([pinned, *users], 60, 100) is None, "a pinned file stays: 20 bytes can go"


@pytest.mark.parametrize("seed", range(3))
def test_a_large_store_is_planned_least_recently_used_first(seed):
    rng = random.Random(seed)
    items = [Item(f"e{i}", rng.randrange(1, 1 << 20), last_use=i) for i in range(20_000)]
    rng.shuffle(items)
    total = sum(item.nbytes for item in items)
    plan = eviction.plan(items, total // 2, total)
    assert plan is not None and plan == [f"e{i}" for i in range(len(plan))]


# --- the store carries out the plan ------------------------------------------------------------


def _sealed(data: bytes) -> int:
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def _closed(outcome):
    for fd in outcome.fds:
        os.close(fd)
    return outcome


def test_the_store_evicts_in_the_order_it_is_given():
    store = Store(3 * PAGE, order=Order("largest first", lambda item: -item.nbytes))
    _closed(store.publish("big", 1, _sealed(b"b" * 2 * PAGE), [], {}))
    _closed(store.publish("small", 1, _sealed(b"s" * PAGE), [], {}))
    _closed(store.get("big", 1, claim=False))  # the most recently used: LRU would take "small"
    _closed(store.publish("new", 1, _sealed(b"n" * PAGE), [], {}))
    assert sorted(row["key"] for row in store.listing()) == ["new", "small"]
    store.close_all()


def test_a_file_entry_the_new_entry_references_stays_when_its_other_referent_goes(tmp_path):
    """The new entry's own file entry is pinned: evicting the only other entry that references it
    leaves it."""
    path = tmp_path / "checkpoint"
    path.write_bytes(b"z" * 100)

    def file():
        fd = os.open(path, os.O_RDONLY)
        identity = file_identity(os.fstat(fd))
        return dict(identity, path=str(path), entry_id=file_entry_id(identity)), fd

    store = Store(PAGE + PAGE // 2)
    description, fd = file()
    _closed(store.publish("old", 1, _sealed(b"o" * PAGE), [description["entry_id"]], {},
                          files=[(description, fd)]))
    description, fd = file()
    out = _closed(store.publish("new", 1, _sealed(b"n" * PAGE), [description["entry_id"]], {},
                                files=[(description, fd)]))
    assert out.status == "hit"
    assert out.fd_entries == [out.entry["entry_id"], description["entry_id"]]
    assert [row["key"] for row in store.listing()] == ["new"] and store.stats()["files"] == 1
    store.close_all()
