"""Image input pipelines: the reference one, and two faster ones of our own.

Each pipeline splits into a *worker stage* (runs in DataLoader workers, one encoded image in, one
tensor out) and a *device stage* (runs on the training device on the stacked batch, returns the
normalized float32 ``pixel_values`` the model takes). The split is the point: what the workers send
and what the device finishes decides the throughput when image loading is the bottleneck.

* ``reference`` - exactly run_bridgetower.py's: Pillow decode, float conversion, bicubic antialiased
  resize of the shorter side, center crop and CLIP normalization in the workers; normalized float32
  tensors (3 x 294 x 294 x 4 bytes per image) cross to the main process.
* ``closed`` - the same output within float32 (CPU device) or float16 (accelerators) rounding, checked
  against ``reference`` in the tests and by ``suite bench-loader``: JPEGs decoded by libjpeg-turbo
  straight into an array (simplejpeg; same pixels as Pillow, which is used for every other format), then
  resize + crop + normalization in one compiled pass over the uint8 pixels that computes only the kept
  pixels (:mod:`.resample`: torch's filter weights, no float copy of the full image, no intermediate
  tensors); freed buffers reused rather than page-faulted anew per image (glibc ``mallopt``). For an
  accelerator the workers send float16 on the 0..255 scale (half the bytes) and the normalization is one
  fused multiply-add on the device; on the CPU device, whose "device stage" would be an extra pass on the
  same cores, the workers normalize and send float32. The resampling is float throughout: torch's fast
  uint8 kernel clamps bicubic overshoot to 0..255, which on line drawings moves pixels by up to ~39 levels.
* ``open`` - allowed to differ: JPEGs decoded at 1/2 (1/4, 1/8) scale in the DCT domain as long as the
  shorter side keeps 3/4 of the target size, then the closed pipeline's compiled resize (upsampling by
  at most 4/3) with torch's antialiased bilinear filter instead of bicubic (half the taps; 0.2 dB less
  PSNR on the synthetic set), rounded to uint8 in the same pass; uint8 sent (a quarter of the reference's
  bytes) on every device, normalized by the device stage. Its fidelity is reported as PSNR against
  ``reference``.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from suite.imaging import decode_to_rgb_tensor, open_image

from workloads.bridgetower.data import resample
from workloads.bridgetower.data.bounds import ImageBounds
from workloads.bridgetower.data.host_memory import keep_freed_memory_for_reuse
from workloads.bridgetower.preprocessing import CLIP_MEAN, CLIP_STD, preprocess_image

if TYPE_CHECKING:
    pass


@functools.cache
def _simplejpeg() -> Any:
    """simplejpeg when importable, else ``None`` (Pillow then decodes JPEGs too: same pixels, slower)."""
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


def jpeg_decoder_name() -> str:
    module = _simplejpeg()
    return f"simplejpeg {module.__version__} (libjpeg-turbo)" if module else "Pillow (simplejpeg not installed)"


def _plain_jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` of a JPEG that libjpeg-turbo can turn into RGB exactly as Pillow does (not
    CMYK/YCCK), else ``None``."""
    module = _simplejpeg()
    if module is None or not data.startswith(b"\xff\xd8"):
        return None
    try:
        height, width, colorspace, _ = module.decode_jpeg_header(data)
    except ValueError:
        return None
    return (height, width) if colorspace in ("RGB", "YCbCr", "Gray") else None


def dct_reduction(height: int, width: int, min_short_side: int) -> int:
    """The largest factor of 1, 2, 4, 8 that keeps the shorter side >= ``min_short_side`` when a JPEG is
    decoded at 1/factor scale. Only powers of two: libjpeg-turbo's other scales (3/8, 5/8, ...) decode
    slower than full size."""
    short = min(height, width)
    for factor in (8, 4, 2):
        if -(-short // factor) >= min_short_side:
            return factor
    return 1


def decode_rgb_hwc(data: bytes, min_short_side: int | None = None) -> np.ndarray:
    """Decode to a uint8 ``(H, W, 3)`` RGB array.

    With ``min_short_side``, JPEGs are decoded at a reduced scale in the DCT domain (:func:`dct_reduction`;
    lossy: only the ``open`` pipeline asks for it). Anything that is not a plain JPEG, or that libjpeg-turbo
    refuses (truncated, corrupt), goes through Pillow, whose errors name the problem.
    """
    size = _plain_jpeg_size(data)
    if size is not None:
        module = _simplejpeg()
        try:
            if min_short_side is None:
                return module.decode_jpeg(data, colorspace="RGB", strict=True)
            height, width = size
            factor = dct_reduction(height, width, min_short_side)
            # simplejpeg picks the smallest libjpeg-turbo scale that is at least this size: exactly 1/factor
            return module.decode_jpeg(data, colorspace="RGB", strict=True, min_height=-(-height // factor),
                                      min_width=-(-width // factor))
        except ValueError:
            pass  # Pillow decodes it below, raising a clear error if it really is broken
    with open_image(data) as image:
        if min_short_side is not None and image.format == "JPEG":
            width, height = image.size
            factor = dct_reduction(height, width, min_short_side)
            image.draft("RGB", (-(-width // factor), -(-height // factor)))
        image.load()
        return np.array(image.convert("RGB"))


#: CLIP normalization ``(x / 255 - mean) / std`` of 0..255 values as a per-channel (scale, shift)
CLIP_AFFINE: tuple[tuple[float, ...], tuple[float, ...]] = (
    tuple(1.0 / (255.0 * s) for s in CLIP_STD), tuple(-m / s for m, s in zip(CLIP_MEAN, CLIP_STD)))
_IDENTITY_AFFINE: tuple[tuple[float, ...], tuple[float, ...]] = ((1.0, 1.0, 1.0), (0.0, 0.0, 0.0))


class ImagePipeline(ABC):
    """A worker stage and a device stage; see the module docstring."""

    name: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, image_size: int, device_type: str = "cpu") -> None:
        self.image_size = image_size
        self.device_type = device_type
        self._affine_on: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def normalize_in_workers(self) -> bool:
        """On the CPU device the "device stage" would run on the same cores as the workers, as an extra pass
        in the main process: there, the closed pipeline normalizes in the workers and sends float32."""
        return self.device_type == "cpu"

    #: Peak bytes the worker stage allocates per pixel of the decoded image and per pixel of the resize's larger
    #: buffer (intermediate pass or output), as measured by ``tests/test_loader_budget.py`` (which checks that the
    #: estimate covers the measured peak); plus a constant for the output and the allocator's slack.
    bytes_per_decoded_pixel: ClassVar[float] = 34.0  # Pillow's 4-byte pixels, the uint8 array and tensor, float32
    bytes_per_resized_pixel: ClassVar[float] = 26.0  # torch's antialiased resize: both passes' float32 outputs
    fixed_bytes: ClassVar[int] = 8 * 2**20
    #: Whether loader workers stack this pipeline's batches into reused shared memory (:mod:`.shared_batches`):
    #: ours do; the reference keeps torch's fresh buffer per batch, as the published benchmark ran.
    reuses_batch_memory: ClassVar[bool] = False

    def decoded_size(self, data: bytes, width: int, height: int) -> tuple[int, int]:
        """The size the worker stage decodes a ``width`` x ``height`` image at (smaller where it decodes at a
        reduced scale)."""
        return width, height

    def decoded_bytes_per_pixel(self, data: bytes) -> float:
        return self.bytes_per_decoded_pixel

    def peak_bytes(self, data: bytes, width: int, height: int) -> int:
        """About the most memory :meth:`worker_stage` allocates at once for this image, from its header alone (for
        the loader's :class:`~workloads.bridgetower.data.bounds.DecodeBudget`, checked before decoding)."""
        width, height = self.decoded_size(data, width, height)
        resized = max((w * h for stage, (w, h) in ImageBounds.stages(width, height, self.image_size)
                       if stage != "decoded"), default=0)
        return int(self.decoded_bytes_per_pixel(data) * width * height + self.bytes_per_resized_pixel * resized
                   + self.fixed_bytes)

    def worker_init(self) -> None:
        """Called once in each loader worker (and in-process before a worker-stage benchmark)."""

    @abstractmethod
    def worker_stage(self, data: bytes) -> torch.Tensor:
        """One encoded image -> the tensor the workers send (``(3, size, size)``)."""

    @abstractmethod
    def device_stage(self, batch: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        """Stacked worker outputs -> normalized float32 ``pixel_values`` on ``device``."""

    def _worker_affine(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel (scale, shift) that the workers apply to 0..255 values."""
        return CLIP_AFFINE if self.normalize_in_workers else _IDENTITY_AFFINE

    def _normalize_on(self, batch: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        """CLIP normalization of a 0..255 batch into float32 on the device."""
        if torch.device(device).type == "cpu" and batch.device.type == "cpu" and batch.dtype == torch.uint8:
            return resample.normalize_uint8(batch, *CLIP_AFFINE)  # one compiled pass, on huge pages
        key = str(device)
        if key not in self._affine_on:
            scale, shift = (torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1).to(device) for v in CLIP_AFFINE)
            self._affine_on[key] = scale, shift
        scale, shift = self._affine_on[key]
        # in place after one vectorized conversion: a mixed-dtype addcmul takes torch's per-element casting
        # path, 2-3x slower
        return batch.to(device, non_blocking=True).to(torch.float32).mul_(scale).add_(shift)


class ReferencePipeline(ImagePipeline):
    name = "reference"
    description = "Pillow decode + float resize/crop/normalize in the workers, float32 sent (run_bridgetower.py)"

    def worker_stage(self, data: bytes) -> torch.Tensor:
        return preprocess_image(decode_to_rgb_tensor(data), self.image_size)

    def device_stage(self, batch: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        return batch.to(device, non_blocking=True)


class _OwnPipeline(ImagePipeline):
    # libjpeg-turbo decodes straight into the uint8 array (3 bytes a pixel); Pillow (every other image) holds its
    # own 4-byte pixels, a converted copy and the array; the compiled resize's largest buffer is its float32 output
    # (its strips add 2 x 16 float32 per kept value of an input row)
    bytes_per_decoded_pixel = 18.0
    bytes_per_plain_jpeg_pixel: ClassVar[float] = 5.0
    bytes_per_resized_pixel = 14.0
    reuses_batch_memory = True

    def __init__(self, image_size: int, device_type: str = "cpu") -> None:
        super().__init__(image_size, device_type)
        resample.warm_up()  # compiled here, before DataLoader workers fork, not in each worker

    def decoded_bytes_per_pixel(self, data: bytes) -> float:
        return self.bytes_per_plain_jpeg_pixel if _plain_jpeg_size(data) else self.bytes_per_decoded_pixel

    def worker_init(self) -> None:
        keep_freed_memory_for_reuse()

    def _resize_crop(self, array: np.ndarray, dtype: torch.dtype = torch.float32, mode: str = "bicubic"
                     ) -> torch.Tensor:
        return resample.resize_crop(array, self.image_size, *self._worker_affine(), dtype=dtype, mode=mode)

    def device_stage(self, batch: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        if self.normalize_in_workers:
            return batch.to(device, non_blocking=True)
        return self._normalize_on(batch, device)


class ClosedPipeline(_OwnPipeline):
    name = "closed"
    description = ("libjpeg-turbo decode into an array; resize+crop+normalize in one compiled pass over the "
                   "uint8 pixels, kept pixels only; float16 sent to accelerators, normalized there")

    def worker_stage(self, data: bytes) -> torch.Tensor:
        image = self._resize_crop(decode_rgb_hwc(data))
        return image if self.normalize_in_workers else image.to(torch.float16)


class OpenPipeline(_OwnPipeline):
    name = "open"
    description = ("JPEG decoded at 1/2 (1/4, 1/8) scale in the DCT domain while the shorter side keeps "
                   "3/4 of the target, then the closed pipeline's compiled resize with the bilinear filter, "
                   "rounded to uint8; uint8 sent, normalized on the device; differs from the reference "
                   "(PSNR reported)")

    #: decode at a reduced scale only while the shorter side keeps this fraction of the target size (the
    #: resize then upsamples by at most 4/3)
    min_decoded_fraction: ClassVar[float] = 0.75

    @property
    def normalize_in_workers(self) -> bool:
        """Never: uint8 crosses to the main process even for the CPU device. Shared memory is the expensive
        part there (the kernel zeroes and maps every fresh page): on the 2-core CI machine a DataLoader that
        only moved ready-made images delivered ~1 500 float32 images/s but ~5 000 uint8 ones, which pays for
        the main process's one-pass normalization (~0.2 ms per image)."""
        return False

    def __init__(self, image_size: int, device_type: str = "cpu") -> None:
        super().__init__(image_size, device_type)
        self._min_short_side = max(1, math.ceil(self.min_decoded_fraction * image_size))

    def decoded_size(self, data: bytes, width: int, height: int) -> tuple[int, int]:
        if not data.startswith(b"\xff\xd8"):  # Pillow's draft() reduces JPEGs only
            return width, height
        factor = dct_reduction(height, width, self._min_short_side)
        return -(-width // factor), -(-height // factor)

    def worker_stage(self, data: bytes) -> torch.Tensor:
        return self._resize_crop(decode_rgb_hwc(data, min_short_side=self._min_short_side), torch.uint8,
                                 "bilinear")


PIPELINES: dict[str, type[ImagePipeline]] = {p.name: p for p in (ReferencePipeline, ClosedPipeline, OpenPipeline)}


def psnr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    """PSNR in dB of ``other`` against ``reference``, both normalized ``pixel_values``, measured in pixel
    units (0..1, the normalization undone), so 1/255 is one 8-bit level."""
    std = torch.tensor(CLIP_STD, dtype=torch.float64).view(-1, 3, 1, 1)
    diff = (other.to(torch.float64) - reference.to(torch.float64)) * std
    mse = float(diff.pow(2).mean())
    return float("inf") if mse == 0 else 10.0 * float(np.log10(1.0 / mse))
