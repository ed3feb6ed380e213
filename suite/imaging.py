"""Image decoding shared by the CPU loader and the CPU adapter's "device" decode path, and what an encoded image is
(:class:`ImageKind`, from its header: what a hardware decoder's support depends on)."""

from __future__ import annotations

import io
from dataclasses import dataclass

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


#: EXIF's Orientation tag.
EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class ImageKind:
    """What an encoded image is, read from its header (nothing decoded): the facts a hardware decoder's support
    depends on. ``format`` is Pillow's (``JPEG``, ``PNG``, ``GIF``...; ``unknown`` where Pillow reads no header),
    ``mode`` Pillow's pixel mode (``RGB``, ``L``, ``CMYK``, ``P``, ``RGBA``, ``I;16``...), ``orientation`` the EXIF
    orientation (1: as stored)."""

    format: str
    mode: str
    progressive: bool = False
    orientation: int = 1
    animated: bool = False

    @classmethod
    def of(cls, data: bytes) -> "ImageKind":
        try:
            with open_image(data) as image:
                return cls(str(image.format or "unknown"), str(image.mode),
                           bool(image.info.get("progressive") or image.info.get("progression")),
                           int(image.getexif().get(EXIF_ORIENTATION, 1) or 1),
                           bool(getattr(image, "is_animated", False)))
        except Exception:  # noqa: BLE001 - not an image Pillow reads: the decoders say what is wrong with it
            return cls("unknown", "unknown")

    def spelled(self) -> str:
        """One string (what a DataLoader batch carries per image), read back by :meth:`parse`."""
        return (f"{self.format}|{self.mode}|{int(self.progressive)}|{self.orientation}|{int(self.animated)}")

    @classmethod
    def parse(cls, text: str) -> "ImageKind":
        fmt, mode, progressive, orientation, animated = text.split("|")
        return cls(fmt, mode, progressive == "1", int(orientation), animated == "1")

    def describe(self) -> str:
        """e.g. ``JPEG CMYK`` or ``GIF P animated`` (for the records)."""
        extras = [name for name, on in (("progressive", self.progressive), ("animated", self.animated),
                                        (f"EXIF orientation {self.orientation}", self.orientation != 1)) if on]
        return " ".join([self.format, self.mode, *extras])
