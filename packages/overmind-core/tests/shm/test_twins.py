"""Read-only shared twins of entry mappings (shm/twins.py) and the copy path that reads them (shm/gpu_copies.py).

The driver's registration cannot happen without a CUDA device: these tests stand in for ``cudaHostRegister`` (it
succeeds, or refuses) and check everything else on real memfds: the twin holds the entry's bytes in shared,
read-only pages; a tensor with a written page is never pointed at its twin; a module's tensors come back to their
own storages, versions and values after the call; ``Module.to``/``.cuda`` are torch's own again after
``uninstall``. The copy to a GPU itself runs in ``tests/gpu`` (``pytest -m gpu``) and benchmarks/gpu/run_all.sh.
"""
from __future__ import annotations

import gc
import os

import pytest
import torch

from overmind.shm import gpu_copies, pagemap, twins
from overmind.shm.reader import EntryMapping
from overmind.shm.writer import write_entry

PAGE = pagemap.PAGE


@pytest.fixture
def twinned(monkeypatch):
    """Twins on (as with a CUDA build of torch), registration standing in for the driver's."""
    monkeypatch.setattr(twins, "enabled", lambda: True)
    registered: list[int] = []

    def register(twin):
        if twin.refusal is not None:
            return False
        twin.registered = True
        registered.append(twin.twin_address)
        return True

    monkeypatch.setattr(twins, "_ensure_registered", register)
    yield registered
    gpu_copies.uninstall()
    gc.collect()


def _entry(values: torch.Tensor) -> EntryMapping:
    data = values.contiguous().view(torch.uint8).reshape(-1)
    fd = write_entry(b"skeleton", [(data.untyped_storage(), 0)], data.numel())
    try:
        return EntryMapping("e-twin", fd)
    finally:
        os.close(fd)


def _tensor_in(m: EntryMapping, offset: int, n: int) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32).set_(m.storage(offset, n * 4))


def _maps_line(address: int) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return line
    raise AssertionError(f"{address:#x} is not mapped")


def test_a_twin_is_a_shared_read_only_mapping_of_the_same_bytes(twinned):
    values = torch.arange(4 * PAGE, dtype=torch.float32)
    m = _entry(values)
    t = _tensor_in(m, 0, values.numel())
    pinned = twins.pinned_storages([t.untyped_storage()])
    twin = pinned[t.untyped_storage().data_ptr()]
    assert twin.data_ptr() != t.data_ptr() and twin.nbytes() == t.untyped_storage().nbytes()
    perms = _maps_line(twin.data_ptr()).split()[1]
    assert perms == "r--s", perms  # shared, read-only: no write of this process replaces its pages
    assert _maps_line(t.data_ptr()).split()[1] == "rw-p"  # the user's view stays copy-on-write
    assert torch.equal(torch.empty(0, dtype=torch.float32).set_(twin), values)
    assert twinned and twins.state().registered >= 1


def test_a_storage_with_a_written_page_is_not_read_from_its_twin(twinned):
    m = _entry(torch.zeros(3 * PAGE))
    a, b = _tensor_in(m, 0, PAGE), _tensor_in(m, 4 * PAGE, PAGE)
    b[7] = 1.5  # the user's in-place write: a private page whose bytes the twin does not have
    pinned = twins.pinned_storages([a.untyped_storage(), b.untyped_storage()])
    assert set(pinned) == {a.untyped_storage().data_ptr()}


def test_a_refused_registration_leaves_the_copy_to_torch(twinned, monkeypatch):
    monkeypatch.setattr(twins, "_ensure_registered", lambda twin: False)
    m = _entry(torch.ones(PAGE))
    t = _tensor_in(m, 0, PAGE)
    assert twins.pinned_storages([t.untyped_storage()]) == {}


def test_a_module_reads_its_twins_during_the_call_and_gets_its_own_tensors_back(twinned):
    values = torch.linspace(-1, 1, 6 * PAGE)
    m = _entry(values)
    module = torch.nn.Linear(PAGE, 2)
    with torch.no_grad():
        module.weight = torch.nn.Parameter(_tensor_in(m, 0, 2 * PAGE).view(2, PAGE))
        module.register_buffer("table", _tensor_in(m, 2 * PAGE * 4, 2 * PAGE).view(2, PAGE)[:, 1:])
        module.bias = torch.nn.Parameter(_tensor_in(m, 5 * PAGE * 4, 2))
    module.bias.data.mul_(1)  # a written page (the bias's): that tensor stays on its own pages
    module.weight.requires_grad_(True)
    before = {n: (t.data_ptr(), t._version, t.clone()) for n, t in [*module.named_parameters(),
                                                                     *module.named_buffers()]}
    inside = {}
    with gpu_copies._reading_twins(module):
        for n, t in [*module.named_parameters(), *module.named_buffers()]:
            inside[n] = (t.data_ptr(), t._version, t.clone(), t.stride(), t.storage_offset())
    for n, (ptr, version, value) in before.items():
        t = dict([*module.named_parameters(), *module.named_buffers()])[n]
        assert (t.data_ptr(), t._version) == (ptr, version), n
        assert torch.equal(t, value) and torch.equal(inside[n][2], value), n
        assert inside[n][1] == version, n
    assert inside["weight"][0] != before["weight"][0] and inside["table"][0] != before["table"][0]
    assert inside["bias"][0] == before["bias"][0]
    assert inside["table"][3] == module.table.stride() and inside["table"][4] == module.table.storage_offset()
    assert isinstance(module.weight, torch.nn.Parameter) and module.weight.requires_grad


def test_a_hit_gets_twins_and_module_to_stays_torchs_for_other_targets(twinned, overmind_runtime):
    import overmind

    def build():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))

    overmind.load(build)
    hit = overmind.load(build)
    assert twins.any_live() and gpu_copies.installed()
    assert torch.nn.Module.to is gpu_copies._to
    plain = build()
    converted = hit.to(torch.float64)
    assert all(torch.equal(a, b) for a, b in zip(converted.state_dict().values(),
                                                  plain.to(torch.float64).state_dict().values()))
    gpu_copies.uninstall()
    assert torch.nn.Module.to is gpu_copies._TORCH_TO and torch.nn.Module.cuda is gpu_copies._TORCH_CUDA


def test_twins_are_not_made_without_a_cuda_build(overmind_runtime):
    import overmind

    if torch.backends.cuda.is_built():
        pytest.skip("a CUDA build of torch makes twins")

    def build():
        return torch.nn.Linear(32, 32)

    overmind.load(build)
    overmind.load(build)
    assert not twins.enabled() and twins.state().twins == 0


def test_deactivate_puts_torchs_methods_back(twinned):
    import overmind

    m = _entry(torch.ones(PAGE))
    _tensor_in(m, 0, PAGE)
    assert gpu_copies.installed()
    overmind.deactivate()
    assert torch.nn.Module.to is gpu_copies._TORCH_TO and not gpu_copies.installed()
