"""What the overmind-sfast tests build: a stable-fast compiled tiny SD pipeline, as users write it.

Importable by name (``overmind_sfast_testlib.pipelines``, with this package's ``tests/`` folder on
``sys.path``) so that the builder has the same identity, hence the same cache key, in every process
that imports it.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

# The size the builder warms up with (64x64 renders through a 32x32 latent) and the steps.
SIZE = 64
STEPS = 2
PROMPT = "a photo of a red cat"



def builds() -> int:
    """How often build() ran in this process. Counted inside Overmind
    (``overmind.testing.record_call``): a global the builder incremented would be a global it reads,
    so part of its key, changing with every run."""
    from overmind.testing import recorded_calls

    return len(recorded_calls("sfast-build"))


def cpu_config():
    """stable-fast's default configuration with everything that needs CUDA, xformers or triton
    turned off."""
    from sfast.compilers.diffusion_pipeline_compiler import CompilationConfig

    config = CompilationConfig.Default()
    config.enable_xformers = False
    config.enable_triton = False
    config.enable_cuda_graph = False
    return config


def build(ckpt):
    """Load, compile and warm up (stable-fast traces lazily, on the first call): the way users
    cache it."""
    import torch
    from diffusers import StableDiffusionPipeline
    from sfast.compilers.diffusion_pipeline_compiler import compile

    from overmind.testing import record_call

    record_call(ckpt, "sfast-build")
    pipe = StableDiffusionPipeline.from_pretrained(ckpt, dtype=torch.float32, safety_checker=None)
    pipe.set_progress_bar_config(disable=True)
    pipe = compile(pipe, cpu_config())
    # its own generator: a loader that draws from the global one is not cached
    # (overmind/loading/randomness.py)
    pipe("warm-up", num_inference_steps=STEPS, height=SIZE, width=SIZE,
         generator=torch.Generator().manual_seed(0))
    return pipe


def render(pipe, seed: int = 1, size: int = SIZE):
    """One image as a float numpy array, from a fixed seed."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return pipe(PROMPT, num_inference_steps=STEPS, height=size, width=size, generator=generator,
                output_type="np").images


class TraceCounter:
    """Counts ``torch.jit.trace`` calls (stable-fast's ``better_trace`` looks it up at call
    time)."""

    def __init__(self) -> None:
        self.calls = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[TraceCounter]:
        import torch

        original = torch.jit.trace

        def counting_trace(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        torch.jit.trace = counting_trace
        try:
            yield self
        finally:
            torch.jit.trace = original
