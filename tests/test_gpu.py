"""On a CUDA device (``pytest -m gpu``; skipped without one): copies of cached weights to the GPU are the plain
copies, read from pinned shared twins; loads that put tensors on the GPU are cached and come back there.

Each case runs in fresh processes against the test's private server, compared with the same code run plainly.
benchmarks/gpu/run_all.sh runs these with the GPU checks and measurements.
"""
from __future__ import annotations

import pytest

from _support import pythonpath_env
from _support.tiny_models import build_llama
from overmind.testing import run_fresh

pytestmark = pytest.mark.gpu

_OBSERVE = '''
    import hashlib, json, torch
    def digest(module):
        h = hashlib.sha256()
        for name, t in sorted([*module.named_parameters(), *module.named_buffers()]):
            h.update(name.encode() + str(t.dtype).encode() + str(t.device).encode() + str(t.requires_grad).encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()
'''


def _env(overmind_runtime: str, **extra: str) -> dict:
    return {"PYTHONPATH": pythonpath_env(), "OVERMIND_RUNTIME_DIR": overmind_runtime, "OVERMIND_STRICT": "1",
            "OVERMIND_PINNED_COPIES": "1", **extra}


def test_module_to_cuda_from_a_hit_equals_plain_and_reads_the_pinned_twin(overmind_runtime):
    script = _OBSERVE + '''
    import overmind
    from overmind.shm import gpu_copies, twins
    from overmind.testing import report
    from _support.gpu_loaders import mixed_module
    plain = mixed_module().to("cuda")
    module = overmind.load(mixed_module)
    cpu_side = [p.data for p in module.parameters()]
    moved = module.to("cuda")
    state = twins.state()
    report({"same": digest(moved) == digest(plain), "registered": state.registered,
            "moved_is_module": moved is module, "installed": gpu_copies.installed(),
            "cpu_kept": all(t.device.type == "cpu" for t in cpu_side),
            "all_cuda": {str(t.device) for t in [*module.parameters(), *module.buffers()]} == {"cuda:0"}})
    '''
    first = run_fresh(script, env=_env(overmind_runtime))
    assert first["same"] and first["all_cuda"]
    second = run_fresh(script, env=_env(overmind_runtime))
    assert second == {"same": True, "registered": second["registered"], "moved_is_module": True, "installed": True,
                      "cpu_kept": True, "all_cuda": True}
    assert second["registered"] >= 1, "the hit's twin was not registered with the driver"


def test_a_cpu_write_before_the_move_reaches_the_gpu(overmind_runtime):
    run_fresh('''
    import overmind
    from overmind.testing import report
    from _support.gpu_loaders import mixed_module
    overmind.load(mixed_module)
    report(True)
    ''', env=_env(overmind_runtime))
    second = run_fresh(_OBSERVE + '''
    import overmind
    from overmind.shm import twins
    from overmind.testing import report
    from _support.gpu_loaders import mixed_module
    plain = mixed_module()
    module = overmind.load(mixed_module)
    params, plain_params = list(module.parameters()), list(plain.parameters())
    registered = len(twins.pinned_storages([p.untyped_storage() for p in params]))  # pinned before the write
    with torch.no_grad():
        for group in (params, plain_params):
            group[3].data.add_(1)
            group[10][5:900] = -3
    module.cuda()
    plain.cuda()
    report({"registered": registered, "same": digest(module) == digest(plain)})
    ''', env=_env(overmind_runtime))
    assert second["registered"] > 0 and second["same"]


def test_a_load_that_returns_cuda_tensors_is_cached_and_comes_back_on_the_gpu(overmind_runtime):
    script = _OBSERVE + '''
    import overmind
    from overmind.testing import report
    from _support.gpu_loaders import cuda_module
    module = overmind.load(cuda_module)
    report({"digest": digest(module), "devices": sorted({str(t.device) for t in module.parameters()})})
    '''
    first = run_fresh(script, env=_env(overmind_runtime))
    second = run_fresh(script, env=_env(overmind_runtime))
    assert first == second and first["devices"] == ["cuda:0"]
    info = run_fresh('''
    import overmind
    from overmind.testing import report
    info = overmind.cache_info()
    report({"entries": len(info.entries)})
    ''', env=_env(overmind_runtime))
    assert info["entries"] >= 1


def test_transformers_device_map_cuda_is_cached_bitwise_and_the_server_never_touches_cuda(overmind_runtime, tmp_path):
    path = build_llama(tmp_path / "llama")
    script = _OBSERVE + f'''
    import overmind
    overmind.activate()
    from transformers import AutoModelForCausalLM
    from overmind.testing import report
    model = AutoModelForCausalLM.from_pretrained({str(path)!r}, device_map="cuda", torch_dtype=torch.float16)
    ids = torch.tensor([[1, 5, 9, 3]], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits
    report({{"digest": digest(model), "logits": hashlib.sha256(logits.cpu().numpy().tobytes()).hexdigest(),
            "devices": sorted({{str(p.device) for p in model.parameters()}})}})
    '''
    plain = run_fresh(script, env={**_env(overmind_runtime), "OVERMIND_DISABLE": "1"})
    first = run_fresh(script, env=_env(overmind_runtime))
    after_first = _server(overmind_runtime)
    second = run_fresh(script, env=_env(overmind_runtime))
    after_second = _server(overmind_runtime)
    assert plain == first == second and plain["devices"] == ["cuda:0"]
    assert after_first["publishes"] >= 1 and after_second["hits"] > after_first["hits"]
    assert after_second["publishes"] == after_first["publishes"], "the second process published again"
    assert after_second["servers"] == 1 and not after_second["cuda_mapped"] and not after_second["torch_mapped"]


def _server(runtime: str) -> dict:
    """The server's counters, and whether its process maps torch or a CUDA library."""
    return run_fresh('''
    import os, overmind
    from overmind.testing import report, server_pids
    pids = server_pids(os.environ["OVERMIND_RUNTIME_DIR"])
    maps = "".join(open(f"/proc/{pid}/maps").read() for pid in pids)
    status = overmind.cache_info().status
    report({"servers": len(pids), "cuda_mapped": "libcuda" in maps or "libcudart" in maps,
            "torch_mapped": "libtorch" in maps, "hits": status.get("hits", 0),
            "publishes": status.get("publishes", 0)})
    ''', env=_env(runtime))
