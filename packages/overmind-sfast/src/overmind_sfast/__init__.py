"""overmind-sfast: cache stable-fast compiled diffusers pipelines across processes with Overmind.

Install it beside stable-fast, call ``overmind.activate()`` before compiling, and cache the whole builder::

    import overmind
    overmind.activate()

    def build(ckpt):
        pipe = StableDiffusionPipeline.from_pretrained(ckpt, dtype=torch.float16)
        pipe = compile(pipe, config)             # sfast.compilers.diffusion_pipeline_compiler
        pipe("warm-up", num_inference_steps=2)   # stable-fast traces lazily, here
        return pipe

    pipe = overmind.load(build, ckpt)            # later processes: no loading, no tracing

The hook implementations are in :mod:`overmind_sfast.plugin`.
"""
__version__ = "0.1.0"
