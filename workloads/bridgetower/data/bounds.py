"""Bounds on what a dataset may make the suite read and decode, checked before any pixel is allocated.

Every encoded image passes :meth:`ImageBounds.check` once it is read and before any decoder sees it, whichever
loader runs (cpu, cpu-fast, device, dali) and in the ``--skip-bad-samples`` scan: its size in bytes, then, from the
header alone (libjpeg-turbo's header parser for JPEGs, Pillow's lazy open for the rest: neither decodes), the pixel
count of every buffer preprocessing would make of it: the decoded image, its resize to the model's size and the
resize's intermediate pass (a tiny 50000x1 PNG is small decoded and 4.3 billion pixels resized). A refused image is
a :class:`~suite.errors.DatasetError` naming the file, the stage and its size.
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
    output_size: int | None = None  # the preprocessing's shorter side; None: only the decoded image is bounded

    @classmethod
    def of(cls, max_pixels: int | None, max_bytes: int | None, output_size: int | None = None) -> "ImageBounds":
        """The bounds a configuration asks for; ``None`` means the default (Pillow's pixel limit, 64 MiB)."""
        return cls(max_pixels or pillow_max_image_pixels(), max_bytes or DEFAULT_MAX_IMAGE_BYTES, output_size)

    def describe(self) -> dict[str, int | None]:
        return {"max_image_pixels": self.max_pixels, "max_image_bytes": self.max_bytes,
                "bounded_output_size": self.output_size}

    def check(self, data: bytes, name: str) -> None:
        """Refuse ``data`` (image ``name``) when it is larger than the bounds, at every stage that would allocate
        pixels (:meth:`stages`: a 230-byte 50000x1 PNG asked for 52 GB once resized). Unreadable headers are left to
        the decoder, which names the problem."""
        if len(data) > self.max_bytes:
            raise DatasetError(f"image {name} is {len(data):,} bytes, over the limit of {self.max_bytes:,} "
                               "(--max-image-bytes)")
        try:
            width, height = header_size(data)
        except ValueError:
            return  # not an image we can size: the decoder fails on it with its own reason
        for stage, (w, h) in self.stages(width, height, self.output_size):
            if w * h > self.max_pixels:
                what = f"image {name} is" if stage == "decoded" else f"image {name}: {stage} is"
                raise DatasetError(f"{what} {w}x{h} = {w * h:,} pixels, over the limit of {self.max_pixels:,} "
                                   "(--max-image-pixels)")

    @staticmethod
    def stages(width: int, height: int, output_size: int | None) -> list[tuple[str, tuple[int, int]]]:
        """Every pixel buffer preprocessing makes of a ``width`` x ``height`` image, as (what, (width, height)):
        the decoded image; with ``output_size``, the resize of its shorter side to it (aspect kept) and the
        separable resize's intermediate pass (one axis resized, the other not yet)."""
        stages = [("decoded", (width, height))]
        if output_size is None or width < 1 or height < 1:
            return stages
        short, long = min(width, height), max(width, height)
        new_long = max(1, int(output_size * long / short))
        new_w, new_h = (new_long, output_size) if width >= height else (output_size, new_long)
        stages.append((f"resized to a shorter side of {output_size}", (new_w, new_h)))
        intermediate = max((new_w, height), (width, new_h), key=lambda size: size[0] * size[1])
        stages.append(("the resize's intermediate pass", intermediate))
        return stages

    def apply_to_pillow(self) -> None:
        """Make Pillow's own decompression-bomb check agree with this bound (in this process and the loader
        workers forked from it), so that neither refuses what the other allows."""
        from PIL import Image

        Image.MAX_IMAGE_PIXELS = self.max_pixels
