"""Bounds on what a dataset may make the suite read and decode, checked before any pixel is allocated.

Every encoded image passes :meth:`ImageBounds.check` once it is read and before any decoder sees it, whichever
loader runs (cpu, cpu-fast, device, dali) and in the ``--skip-bad-samples`` scan: its size in bytes, then, from the
header alone (libjpeg-turbo's header parser for JPEGs, Pillow's lazy open for the rest: neither decodes), the pixel
count of every buffer preprocessing would make of it: the decoded image, its resize to the model's size and the
resize's intermediate pass (a tiny 50000x1 PNG is small decoded and 4.3 billion pixels resized). A refused image is
a :class:`~suite.errors.DatasetError` naming the file, the stage and its size.

Bounding each image is not enough when several loader workers decode at once: eight 9400x9400 JPEGs of 632 bytes
each (just under Pillow's pixel limit) took 1.7-2.6 GB in two workers. :class:`DecodeBudget` gives every worker its
share of ``--loader-memory`` (all workers together), and a worker refuses, before decoding, an image whose pipeline
would need more than that share (the pipeline's own estimate of its peak, :meth:`ImagePipeline.peak_bytes`).
"""

from __future__ import annotations

import io
import resource
from dataclasses import dataclass, replace

from suite.errors import DatasetError

#: Largest encoded image read when no --max-image-bytes is given (the published set's are ~100 KB).
DEFAULT_MAX_IMAGE_BYTES = 64 * 2**20
#: What all loader workers together may allocate at once to decode images when no --loader-memory is given: with
#: the reference pipeline (~34 bytes a pixel) one worker may decode a 120-megapixel image, eight workers 15-megapixel
#: ones each; two workers may not decode two images at Pillow's limit (~3 GB each) at once.
DEFAULT_LOADER_MEMORY_BYTES = 4 * 2**30


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

    def check(self, data: bytes, name: str) -> tuple[int, int] | None:
        """Refuse ``data`` (image ``name``) when it is larger than the bounds, at every stage that would allocate
        pixels (:meth:`stages`: a 230-byte 50000x1 PNG asked for 52 GB once resized). Returns its ``(width,
        height)``, or ``None`` for a header that cannot be read: that is left to the decoder, which names the
        problem."""
        if len(data) > self.max_bytes:
            raise DatasetError(f"image {name} is {len(data):,} bytes, over the limit of {self.max_bytes:,} "
                               "(--max-image-bytes)")
        try:
            width, height = header_size(data)
        except ValueError:
            return None  # not an image we can size: the decoder fails on it with its own reason
        for stage, (w, h) in self.stages(width, height, self.output_size):
            if w * h > self.max_pixels:
                what = f"image {name} is" if stage == "decoded" else f"image {name}: {stage} is"
                raise DatasetError(f"{what} {w}x{h} = {w * h:,} pixels, over the limit of {self.max_pixels:,} "
                                   "(--max-image-pixels)")
        return width, height

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


@dataclass(frozen=True)
class DecodeBudget:
    """What one loader worker may allocate to decode and preprocess one image: an equal share of ``total_bytes``
    (``--loader-memory``, all workers together) among ``workers`` (0: the training process decodes, alone), so
    that the workers decoding at once stay within the total whatever their number."""

    total_bytes: int
    workers: int
    #: what the process may still map under an address-space limit (``--memory-limit``), once measured in it
    address_space_left: int | None = None

    @classmethod
    def of(cls, loader_memory_gib: float | None, workers: int) -> "DecodeBudget":
        """The budget a configuration asks for; ``None`` means :data:`DEFAULT_LOADER_MEMORY_BYTES`."""
        total = int(loader_memory_gib * 2**30) if loader_memory_gib else DEFAULT_LOADER_MEMORY_BYTES
        return cls(total, workers)

    @property
    def share_bytes(self) -> int:
        share = self.total_bytes // max(1, self.workers)
        return share if self.address_space_left is None else min(share, self.address_space_left)

    def in_this_process(self) -> "DecodeBudget":
        """This budget in the process that decodes (a loader worker, or the training process without workers):
        under an address-space limit (RLIMIT_AS, ``--memory-limit``), no larger than what is left of it, so an image
        that would not fit is refused with the figures instead of failing "out of memory" half-way."""
        limit, _ = resource.getrlimit(resource.RLIMIT_AS)
        if limit == resource.RLIM_INFINITY:
            return self
        try:
            with open("/proc/self/status", encoding="ascii") as status:
                mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        except (OSError, StopIteration):  # no /proc (not Linux): the share alone, the limit still fails cleanly
            return self
        return replace(self, address_space_left=max(0, limit - mapped))

    def describe(self) -> dict[str, int]:
        return {"loader_memory_bytes": self.total_bytes, "loader_memory_share_bytes": self.share_bytes}

    def check(self, need_bytes: int, name: str, pipeline: str) -> None:
        """Refuse image ``name``, before decoding it, when the ``pipeline`` needs more than one worker's share."""
        if need_bytes <= self.share_bytes:
            return
        if self.address_space_left is not None and self.address_space_left < self.total_bytes // max(1, self.workers):
            raise DatasetError(f"image {name}: decoding and preprocessing it ({pipeline} pipeline) needs about "
                               f"{need_bytes / 2**20:,.0f} MiB, over the {self.address_space_left / 2**20:,.0f} MiB "
                               "of address space this process has left under --memory-limit")
        who = (f"each of {self.workers} loader workers' share of" if self.workers > 1
               else "the loader's budget of")
        raise DatasetError(f"image {name}: decoding and preprocessing it ({pipeline} pipeline) needs about "
                           f"{need_bytes / 2**20:,.0f} MiB, over {who} {self.share_bytes / 2**20:,.0f} MiB "
                           f"(--loader-memory {self.total_bytes / 2**30:g} GiB in all; raise it or use fewer "
                           "workers)")
