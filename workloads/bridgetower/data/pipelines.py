"""Image input pipelines: the reference one, and two faster ones of our own.

Each pipeline splits into a *worker stage* (runs in DataLoader workers, one encoded image in, one
tensor out) and a *device stage* (runs on the training device on the stacked batch, returns the
normalized float32 ``pixel_values`` the model takes). The split is the point: what the workers send
and what the device finishes decides the throughput when image loading is the bottleneck.

* ``reference`` - exactly run_bridgetower.py's: Pillow decode, float conversion, bicubic antialiased
  resize of the shorter side, center crop and CLIP normalization in the workers; normalized float32
  tensors (3 x 294 x 294 x 4 bytes per image) cross to the main process.
* ``closed`` - the same output within float16 rounding (checked against ``reference`` in the tests and
  by ``suite bench-loader``): JPEGs decoded by libjpeg-turbo straight into an array (simplejpeg; same
  pixels as Pillow, which is used for every other format), one vectorized uint8->float conversion in the
  decoder's layout, the separable resize done axis by axis with the crop applied between the passes (the
  second pass only computes kept pixels), no division by 255 in the workers, freed buffers reused rather
  than page-faulted anew per image (glibc ``mallopt``); for an accelerator, float16 is sent (half the
  bytes) and the normalization is one fused multiply-add on the device; for the CPU device, whose
  "device stage" would be an extra pass on the same cores, the workers normalize (one fused multiply-add)
  and send float32. The float resampling itself is kept: torch's
  fast uint8 kernel clamps bicubic overshoot to 0..255, which on line drawings moves pixels by up to
  ~39 levels.
* ``open`` - allowed to differ: DCT-domain downscaling while decoding (libjpeg-turbo scales by 1/2,
  1/4, 1/8 as long as the shorter side stays >= the target), the resize in uint8 (torch's vectorized
  channels-last kernel, clamped to 0..255, so bicubic overshoot is lost); uint8 sent to an accelerator
  (a quarter of the reference's bytes), normalized float32 on the CPU device. Its fidelity is reported as
  PSNR against ``reference``.
"""

from __future__ import annotations

import functools
import io
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from suite.imaging import decode_to_rgb_tensor

from workloads.bridgetower.preprocessing import (
    CLIP_MEAN,
    CLIP_STD,
    center_crop_offsets,
    preprocess_image,
    resized_hw,
)


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


def _is_plain_jpeg(data: bytes) -> bool:
    """A JPEG that libjpeg-turbo can turn into RGB exactly as Pillow does (not CMYK/YCCK)."""
    module = _simplejpeg()
    if module is None or not data.startswith(b"\xff\xd8"):
        return False
    try:
        _, _, colorspace, _ = module.decode_jpeg_header(data)
    except ValueError:
        return False
    return colorspace in ("RGB", "YCbCr", "Gray")


def decode_rgb_hwc(data: bytes, min_side: int | None = None) -> np.ndarray:
    """Decode to a uint8 ``(H, W, 3)`` RGB array.

    With ``min_side``, JPEGs may be downscaled in the DCT domain while decoding, keeping both sides at
    least ``min_side`` (lossy: only the ``open`` pipeline asks for it). Anything that is not a plain JPEG,
    or that libjpeg-turbo refuses (truncated, corrupt), goes through Pillow, whose errors name the problem.
    """
    if _is_plain_jpeg(data):
        module = _simplejpeg()
        try:
            if min_side is None:
                return module.decode_jpeg(data, colorspace="RGB", strict=True)
            return module.decode_jpeg(data, colorspace="RGB", strict=True, min_height=min_side,
                                      min_width=min_side)
        except ValueError:
            pass  # Pillow decodes it below, raising a clear error if it really is broken
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if min_side is not None and image.format == "JPEG":
            image.draft("RGB", (min_side, min_side))
        image.load()
        return np.array(image.convert("RGB"))


def _resize_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """Resize the shorter side to ``size`` (bicubic, antialiased) and center-crop, on a ``(1, C, H, W)``
    tensor; the long axis is resampled first and cropped before the short-axis pass."""
    height, width = x.shape[-2:]
    new_h, new_w = resized_hw(height, width, size)
    top, left = center_crop_offsets(new_h, new_w, size)

    def resample(t: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        if tuple(t.shape[-2:]) == hw:
            return t
        return F.interpolate(t, size=hw, mode="bicubic", antialias=True, align_corners=False)

    if width >= height:
        x = resample(x, (height, new_w))[..., left:left + size]
        return resample(x, (new_h, size))[..., top:top + size, :]
    x = resample(x, (new_h, width))[..., top:top + size, :]
    return resample(x, (size, new_w))[..., left:left + size]


class ImagePipeline(ABC):
    """A worker stage and a device stage; see the module docstring."""

    name: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, image_size: int, device_type: str = "cpu") -> None:
        self.image_size = image_size
        self.device_type = device_type
        self._scale: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def normalize_in_workers(self) -> bool:
        """On the CPU device the "device stage" would run on the same cores as the workers, as an extra pass
        in the main process: there, our pipelines normalize in the workers and send float32."""
        return self.device_type == "cpu"

    def worker_init(self) -> None:
        """Called once in each loader worker (and in-process before a worker-stage benchmark)."""

    @abstractmethod
    def worker_stage(self, data: bytes) -> torch.Tensor:
        """One encoded image -> the tensor the workers send (``(3, size, size)``)."""

    @abstractmethod
    def device_stage(self, batch: torch.Tensor, device: Any) -> torch.Tensor:
        """Stacked worker outputs -> normalized float32 ``pixel_values`` on ``device``."""

    def _finish(self, batch: torch.Tensor, device: Any) -> torch.Tensor:
        """The device stage of our pipelines: already normalized (CPU device) or normalized here."""
        if self.normalize_in_workers:
            return batch.to(device, non_blocking=True)
        return self._normalize_on(batch, device)

    def _send(self, image: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """What a worker sends: ``image`` (0..255 scale) as ``dtype``, or normalized float32 on the CPU device."""
        if self.normalize_in_workers:
            return self._normalize_on(image.unsqueeze(0), "cpu")[0]
        return image.to(dtype, memory_format=torch.contiguous_format)

    def _normalize_on(self, batch: torch.Tensor, device: Any) -> torch.Tensor:
        """``(x / 255 - mean) / std`` as one multiply-add in float32 on the device, for 0..255 inputs."""
        key = str(device)
        if key not in self._scale:
            std = torch.tensor(CLIP_STD, dtype=torch.float32).view(1, 3, 1, 1)
            mean = torch.tensor(CLIP_MEAN, dtype=torch.float32).view(1, 3, 1, 1)
            self._scale[key] = ((1.0 / (255.0 * std)).to(device), (-mean / std).to(device))
        scale, shift = self._scale[key]
        # float16/uint8 in, float32 out in the same pass (type promotion), no intermediate copy
        return torch.addcmul(shift, batch.to(device, non_blocking=True), scale)


class ReferencePipeline(ImagePipeline):
    name = "reference"
    description = "Pillow decode + float resize/crop/normalize in the workers, float32 sent (run_bridgetower.py)"

    def worker_stage(self, data: bytes) -> torch.Tensor:
        return preprocess_image(decode_to_rgb_tensor(data), self.image_size)

    def device_stage(self, batch: torch.Tensor, device: Any) -> torch.Tensor:
        return batch.to(device, non_blocking=True)


def keep_freed_memory_for_reuse() -> bool:
    """Ask glibc to serve large allocations from the heap and keep freed memory, so that the per-image
    buffers (a few MB each) reuse the same pages instead of being mapped and page-faulted anew for every
    image. Returns False where this is not glibc (then nothing changes)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 64 * 2**20)) and bool(mallopt(m_trim_threshold, 256 * 2**20))


class _OwnPipeline(ImagePipeline):
    def worker_init(self) -> None:
        keep_freed_memory_for_reuse()


class ClosedPipeline(_OwnPipeline):
    name = "closed"
    description = ("libjpeg-turbo decode into an array, fused float conversion, axis-by-axis resize with the "
                   "crop between passes, float16 sent, normalization fused on the device")

    def worker_stage(self, data: bytes) -> torch.Tensor:
        array = decode_rgb_hwc(data)
        # One vectorized pass uint8 -> float32 keeping the decoder's channels-last layout (a transposing
        # conversion costs 4x more); the resize reads either layout.
        x = torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0).to(torch.float32)
        return self._send(_resize_crop(x, self.image_size)[0], torch.float16)

    def device_stage(self, batch: torch.Tensor, device: Any) -> torch.Tensor:
        return self._finish(batch, device)


class OpenPipeline(_OwnPipeline):
    name = "open"
    description = ("DCT-domain downscaling while decoding, uint8 resize (clamped), uint8 sent, normalization "
                   "on the device; differs from the reference (PSNR reported)")

    def worker_stage(self, data: bytes) -> torch.Tensor:
        array = decode_rgb_hwc(data, min_side=self.image_size)
        x = torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0)  # a channels-last view: the fast uint8 path
        return self._send(_resize_crop(x, self.image_size)[0], torch.uint8)

    def device_stage(self, batch: torch.Tensor, device: Any) -> torch.Tensor:
        return self._finish(batch, device)


PIPELINES: dict[str, type[ImagePipeline]] = {p.name: p for p in (ReferencePipeline, ClosedPipeline, OpenPipeline)}


def psnr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    """PSNR in dB of ``other`` against ``reference``, both normalized ``pixel_values``, measured in pixel
    units (0..1, the normalization undone), so 1/255 is one 8-bit level."""
    std = torch.tensor(CLIP_STD, dtype=torch.float64).view(-1, 3, 1, 1)
    diff = (other.to(torch.float64) - reference.to(torch.float64)) * std
    mse = float(diff.pow(2).mean())
    return float("inf") if mse == 0 else 10.0 * float(np.log10(1.0 / mse))
