"""The objects the diffusers adapter sends through the entry codec to prove itself on an untested release
(:mod:`overmind.loading.adapter_check`): a one-block UNet and a DDPM scheduler, built from their configs. Nothing
is read from disk.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def sample() -> dict[str, Any]:
    from diffusers import DDPMScheduler, UNet2DModel

    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(4,),
                       norm_num_groups=2, down_block_types=("DownBlock2D",), up_block_types=("UpBlock2D",))
    return {"unet": unet.eval(), "scheduler": DDPMScheduler(num_train_timesteps=10)}
