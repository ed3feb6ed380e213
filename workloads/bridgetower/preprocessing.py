"""Image preprocessing identical to the reference script (optimum-habana ``run_bridgetower.py``).

The reference, for the New Yorker dataset's decoded PIL images, does ``to_tensor`` (float in [0, 1]),
``Resize([image_size], bicubic)`` (shorter side to ``image_size``, antialiased, as torchvision does for
tensors), ``CenterCrop(image_size)``, ``ConvertImageDtype(float)`` and ``Normalize(CLIP mean, std)``.
This module does the same arithmetic with plain torch ops (torchvision's tensor resize calls the same
``torch.nn.functional.interpolate``), so it runs on any device and needs no torchvision.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch
import torch.nn.functional as F

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def resized_hw(height: int, width: int, size: int) -> tuple[int, int]:
    """Output size of ``Resize([size])``: shorter side to ``size``, aspect ratio kept (truncating)."""
    short, long = (height, width) if height <= width else (width, height)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if height <= width else (new_long, new_short)


def center_crop_offsets(height: int, width: int, size: int) -> tuple[int, int]:
    """Top/left offsets of ``CenterCrop(size)`` (torchvision rounds half-way offsets)."""
    return int(round((height - size) / 2.0)), int(round((width - size) / 2.0))


def resize_and_center_crop(x: torch.Tensor, size: int, mode: str = "bicubic") -> torch.Tensor:
    """``Resize([size], mode, antialias=True)`` then ``CenterCrop(size)`` of a float ``(C, H, W)`` tensor
    (a view of the resized tensor; no resampling where the shorter side already is ``size``)."""
    height, width = x.shape[-2:]
    new_h, new_w = resized_hw(height, width, size)
    if (new_h, new_w) != (height, width):
        x = F.interpolate(x.unsqueeze(0), size=(new_h, new_w), mode=mode, align_corners=False,
                          antialias=True).squeeze(0)
    top, left = center_crop_offsets(new_h, new_w, size)
    return x[:, top:top + size, left:left + size]


def preprocess_image(
    image: torch.Tensor, size: int, mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD
) -> torch.Tensor:
    """uint8 RGB ``(3, H, W)`` -> normalized float32 ``(3, size, size)``, on the image's device."""
    if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"expected a uint8 tensor of shape (3, H, W), got {image.dtype} {tuple(image.shape)}")
    x = resize_and_center_crop(image.to(torch.float32).div_(255.0), size)
    mean_t, std_t = normalization(tuple(mean), tuple(std), x.device)
    return x.sub_(mean_t).div_(std_t).contiguous()


@functools.lru_cache(maxsize=16)
def normalization(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The mean and std as float32 ``(3, 1, 1)`` tensors on ``device``, made once per device (each is a blocking copy
    to the device: two per image otherwise)."""
    return tuple(torch.tensor(values, dtype=torch.float32, device=device).view(3, 1, 1) for values in (mean, std))
