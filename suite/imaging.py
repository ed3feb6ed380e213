"""Image decoding shared by the CPU loader and the CPU adapter's "device" decode path."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError


def open_image(data: bytes) -> Image.Image:
    """Pillow's lazy open of encoded bytes (header only); an unreadable format says so without Pillow's
    description of an anonymous in-memory buffer."""
    try:
        return Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise UnidentifiedImageError("not an image in a format Pillow reads") from None


def decode_to_rgb_tensor(data: bytes) -> torch.Tensor:
    """Decode an encoded image with Pillow into a uint8 tensor of shape (3, H, W), RGB.

    Grayscale, palette, CMYK and alpha images are converted to RGB, as real datasets contain them.
    Raises ``PIL.UnidentifiedImageError`` / ``OSError`` for data that is not a readable image.
    """
    with open_image(data) as image:
        image.load()  # decode now, so truncated files fail here and not later
        rgb = image.convert("RGB")
    array = np.asarray(rgb, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()
