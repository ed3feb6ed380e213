"""A corpus of the odd images real datasets hold, made with Pillow (deterministic): each is an image a JPEG-only
or 8-bit-RGB-only hardware decoder may refuse or decode differently from the reference (Pillow + ``convert("RGB")``).

``odd_images()`` returns ``{file name: encoded bytes}``; names say what each is. The EXIF-rotated JPEG is a
landscape drawing tagged orientation 6 (rotate 90° clockwise to display): the reference preprocessing ignores the
tag, so a decoder that applies it gives another picture."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def _drawing(width: int = 96, height: int = 64, seed: int = 0) -> Image.Image:
    """A landscape RGB drawing whose left and right halves differ (so a rotation or mirror shows)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([(x * 255 // width), (y * 255 // height), np.where(x < width // 2, 40, 220)], -1)
    pixels = (pixels + rng.integers(0, 12, pixels.shape)).clip(0, 255).astype(np.uint8)
    pixels[4:20, 6:30] = (250, 30, 30)  # a red block at the top left
    return Image.fromarray(pixels, "RGB")


def _save(image: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def exif_rotated_jpeg(orientation: int = 6) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    return _save(_drawing(seed=1), "JPEG", quality=92, exif=exif.tobytes())


def odd_images() -> dict[str, bytes]:
    base = _drawing()
    rgba = base.convert("RGBA")
    rgba.putalpha(Image.fromarray(np.tile(np.linspace(0, 255, 96, dtype=np.uint8), (64, 1))))
    palette = base.quantize(colors=16)
    palette.info["transparency"] = 0
    sixteen = Image.fromarray(np.asarray(base.convert("L"), dtype=np.uint16) * 257)  # mode I;16
    frames = [_drawing(seed=s) for s in (2, 3)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return {
        "cmyk.jpg": _save(base.convert("CMYK"), "JPEG", quality=92),
        "grayscale.jpg": _save(base.convert("L"), "JPEG", quality=92),
        "progressive.jpg": _save(base, "JPEG", quality=92, progressive=True),
        "exif-rotated.jpg": exif_rotated_jpeg(),
        "sixteen-bit.png": _save(sixteen, "PNG"),
        "palette-transparent.png": _save(palette, "PNG", transparency=0),
        "rgba.png": _save(rgba, "PNG"),
        "animated.gif": gif.getvalue(),
        "lossy.webp": _save(base, "WEBP", quality=90),
        "plain.bmp": _save(base, "BMP"),
        "plain.tiff": _save(base, "TIFF"),
        "jpeg-named.png": _save(base, "JPEG", quality=92),
    }
