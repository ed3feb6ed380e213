"""Bounds on what a dataset may make the suite read and decode, checked before any pixel is allocated.

Every encoded image passes :meth:`ImageBounds.check` once it is read and before any decoder sees it, whichever
loader runs (cpu, cpu-fast, device, dali) and in the ``--skip-bad-samples`` scan: its size in bytes, then its
pixel count from the header alone (libjpeg-turbo's header parser for JPEGs, Pillow's lazy open for the rest:
neither decodes). A refused image is a :class:`~suite.errors.DatasetError` naming the file and its size.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from suite.errors import DatasetError

#: Largest encoded image read when no --max-image-bytes is given (the published set's are ~100 KB).
DEFAULT_MAX_IMAGE_BYTES = 64 * 2**20


def pillow_max_image_pixels() -> int:
    """Pillow's decompression-bomb limit, the default pixel bound."""
    from PIL import Image

    return int(Image.MAX_IMAGE_PIXELS or 89_478_485)


def header_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from the image header alone; raises ``ValueError`` for data with no readable header."""
    if data.startswith(b"\xff\xd8"):
        try:
            import simplejpeg

            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            return int(width), int(height)
        except ImportError:
            pass
        except ValueError:
            pass  # Pillow's parser below says what is wrong with it
    from PIL import Image

    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # only the header is read here; the bound is ours, checked by the caller
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Exception as exc:  # noqa: BLE001 - UnidentifiedImageError, SyntaxError, struct errors of odd headers
        raise ValueError(f"not a readable image ({type(exc).__name__}: {' '.join(str(exc).split())})") from None
    finally:
        Image.MAX_IMAGE_PIXELS = previous


@dataclass(frozen=True)
class ImageBounds:
    max_pixels: int
    max_bytes: int

    @classmethod
    def of(cls, max_pixels: int | None, max_bytes: int | None) -> "ImageBounds":
        """The bounds a configuration asks for; ``None`` means the default (Pillow's pixel limit, 64 MiB)."""
        return cls(max_pixels or pillow_max_image_pixels(), max_bytes or DEFAULT_MAX_IMAGE_BYTES)

    def describe(self) -> dict[str, int]:
        return {"max_image_pixels": self.max_pixels, "max_image_bytes": self.max_bytes}

    def check(self, data: bytes, name: str) -> None:
        """Refuse ``data`` (image ``name``) when it is larger than the bounds; unreadable headers are left to
        the decoder, which names the problem."""
        if len(data) > self.max_bytes:
            raise DatasetError(f"image {name} is {len(data):,} bytes, over the limit of {self.max_bytes:,} "
                               "(--max-image-bytes)")
        try:
            width, height = header_size(data)
        except ValueError:
            return  # not an image we can size: the decoder fails on it with its own reason
        if width * height > self.max_pixels:
            raise DatasetError(f"image {name} is {width}x{height} = {width * height:,} pixels, over the limit of "
                               f"{self.max_pixels:,} (--max-image-pixels)")

    def apply_to_pillow(self) -> None:
        """Make Pillow's own decompression-bomb check agree with this bound (in this process and the loader
        workers forked from it), so that neither refuses what the other allows."""
        from PIL import Image

        Image.MAX_IMAGE_PIXELS = self.max_pixels
