"""A loader that changes an argument in place (PEFT injecting layers into ``base_model``, a ``vae.half()``
inside): a hit could not make that change to another call's objects, so the call is not cached. It runs plain,
its result and the argument are what the plain call leaves, and one INFO line names the argument, never a
warning."""
from __future__ import annotations

import logging
import warnings

import torch

import overmind
from overmind.testing import clear_calls, record_call, recorded_calls


def attach_head(config: dict, size: int):
    record_call("attach_head", "mutated")
    config["head"] = size  # in place: the caller's dict is the loader's record
    return torch.arange(size, dtype=torch.float32)


def scale_in_place(weights: torch.Tensor, factor: float):
    record_call("scale_in_place", "mutated")
    weights.mul_(factor)
    return weights.sum()


def read_only(config: dict, size: int):
    record_call("read_only", "mutated")
    return torch.full((size,), float(len(config)))


def test_a_loader_that_changes_its_argument_runs_plain_and_the_log_names_the_argument(overmind_runtime, caplog):
    clear_calls("mutated")
    caplog.set_level(logging.INFO, logger="overmind")
    configs = [{"name": "a"}, {"name": "a"}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not cached by design: logged, never warned
        results = [overmind.load(attach_head, config, 3) for config in configs]
    assert recorded_calls("mutated") == ["attach_head", "attach_head"]  # each call ran the loader: nothing was served
    for config, result in zip(configs, results):
        assert config == {"name": "a", "head": 3}
        assert torch.equal(result, torch.arange(3, dtype=torch.float32))
    lines = [r.getMessage() for r in caplog.records if "not caching" in r.getMessage()]
    assert len(lines) == 2 and all("changed its argument 'config' while it loaded" in line for line in lines)
    assert "attach_head" in lines[0] and "runs plain" in lines[0]


def test_a_tensor_argument_changed_in_place_is_named_too(overmind_runtime, caplog):
    clear_calls("mutated")
    caplog.set_level(logging.INFO, logger="overmind")
    weights = torch.ones(4)
    first = overmind.load(scale_in_place, weights, 2.0)
    second = overmind.load(scale_in_place, weights, 2.0)
    assert recorded_calls("mutated") == ["scale_in_place", "scale_in_place"]
    assert (float(first), float(second)) == (8.0, 16.0) and torch.equal(weights, torch.full((4,), 4.0))
    lines = [r.getMessage() for r in caplog.records if "not caching" in r.getMessage()]
    assert lines and all("its argument 'weights'" in line for line in lines)


def test_a_loader_that_leaves_its_arguments_alone_is_served(overmind_runtime):
    clear_calls("mutated")
    config = {"name": "a"}
    results = [overmind.load(read_only, config, 3) for _ in range(2)]
    assert recorded_calls("mutated") == ["read_only"] and torch.equal(results[0], results[1]) and config == {"name": "a"}
