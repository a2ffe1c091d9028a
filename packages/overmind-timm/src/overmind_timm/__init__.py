"""overmind-timm: cache timm's model factory and checkpoint reads across processes with Overmind.

Install it beside timm and call ``overmind.activate()``; the user's code is unchanged::

    import overmind
    overmind.activate()
    import timm, torch

    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=True,
                              pretrained_cfg_overlay=dict(file="/models/vit.safetensors"))

The hook implementations are in :mod:`overmind_timm.plugin`.
"""
__version__ = "0.1.0"
