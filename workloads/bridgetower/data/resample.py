"""The reference's resize + center crop + normalization as one fast pass over a decoded uint8 image.

The reference does ``F.interpolate(mode="bicubic", antialias=True)`` of the shorter side to ``size``,
``CenterCrop(size)`` and a per-channel affine normalization, in float32. The resize is linear and
separable: each output pixel is a weighted sum of input pixels along one axis, then along the other, with
torch's weights (Keys' cubic, a = -0.5, widened by the downscale factor, normalized per output pixel;
:func:`filter_taps`; the bilinear triangle filter likewise, for the ``open`` pipeline). This module computes the
same sums, differently scheduled:

* only the kept (cropped) pixels are computed, on both axes;
* in strips of 16 output rows, whose buffers stay in the CPU's caches (no float copy of the image, no
  image-sized intermediate);
* rows first, straight from the decoder's interleaved uint8 ``(H, W, 3)`` array: each output row a weighted
  sum of whole input rows, 16 values at a time in one SIMD register across the taps, the uint8 -> float32
  conversion in registers, two output rows per pass sharing each converted input vector;
* the strip transposed in registers (16 x 16 blocks), so that each input value's 16 rows sit side by side;
* columns second: each output column's sums over the strip's 16 rows in one register per channel, transposed
  back in registers into planar ``(3, size, size)`` float32 (or uint8) with the normalization fused in.

The kernels are compiled with numba (LLVM), with explicit SIMD vectors (see :mod:`._resample_kernels`). Sums are
float32 as in torch, only in another order (and possibly fused multiply-adds), so the result matches torch's to
float32 rounding (~1e-2 of an 8-bit level; tested). Where numba is not
installed, torch's own kernel computes the same result, slower; :func:`resampler_name` says which ran.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np
import torch

from workloads.bridgetower.data.host_memory import empty_on_huge_pages
from workloads.bridgetower.preprocessing import center_crop_offsets, resize_and_center_crop, resized_hw

MODES = ("bicubic", "bilinear")


def filter_taps(in_size: int, out_size: int, start: int, count: int, mode: str = "bicubic"
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Taps of torch's antialiased ``mode`` resampling from ``in_size`` to ``out_size`` samples, for the
    outputs ``start .. start + count - 1``: ``(first input index, tap count, weights (count, max_taps))``
    (needs numba)."""
    kernels = _kernels()
    if kernels is None:
        raise RuntimeError("filter_taps needs numba: pip install numba")
    return kernels.filter_taps(in_size, out_size, start, count, _is_cubic(mode))


def _is_cubic(mode: str) -> bool:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode == "bicubic"


@functools.cache
def _kernels() -> Any | None:
    """The compiled kernels module, or ``None`` where numba is not installed."""
    try:
        from workloads.bridgetower.data import _resample_kernels
    except ImportError:
        return None
    return _resample_kernels


def resampler_name() -> str:
    """Which implementation :func:`resize_crop` uses here."""
    if _kernels() is None:
        return "torch F.interpolate (numba not installed)"
    import numba

    return f"numba {numba.__version__} (separable passes in 16-row strips, SIMD, cropped pixels only)"


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels now, e.g. in the main process before DataLoader
    workers fork, so that no worker compiles them on its first image."""
    for dtype in (torch.float32, torch.uint8):
        for mode in MODES:
            resize_crop(np.zeros((12, 10, 3), np.uint8), 8, dtype=dtype, mode=mode)
    normalize_uint8(torch.zeros((1, 3, 2, 2), dtype=torch.uint8), (1.0,) * 3, (0.0,) * 3)


def resize_crop(
    image: np.ndarray,
    size: int,
    scale: Sequence[float] = (1.0, 1.0, 1.0),
    shift: Sequence[float] = (0.0, 0.0, 0.0),
    dtype: torch.dtype = torch.float32,
    mode: str = "bicubic",
) -> torch.Tensor:
    """uint8 RGB ``(H, W, 3)`` -> ``(3, size, size)``: shorter side resized to ``size`` (``mode``: bicubic
    or bilinear, antialiased, as torch's ``interpolate``), center-cropped, then ``value * scale[c] +
    shift[c]`` per channel (values on the 0..255 scale before that), computed in float32 and returned as
    ``dtype``: ``torch.float32``, or ``torch.uint8`` (rounded half up, clamped to 0..255)."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected a uint8 array of shape (H, W, 3), got {image.dtype} {image.shape}")
    if dtype not in (torch.float32, torch.uint8):
        raise ValueError(f"dtype must be torch.float32 or torch.uint8, got {dtype}")
    cubic = _is_cubic(mode)
    scale_a = np.asarray(scale, dtype=np.float32)
    shift_a = np.asarray(shift, dtype=np.float32)
    kernels = _kernels()
    if kernels is None:
        out = _resize_crop_torch(image, size, scale_a, shift_a, mode)
        return out if dtype == torch.float32 else out.add_(0.5).clamp_(0.0, 255.0).to(torch.uint8)
    height, width = image.shape[:2]
    new_h, new_w = resized_hw(height, width, size)
    top, left = center_crop_offsets(new_h, new_w, size)
    pixels = np.empty((3, size, size), np.float32 if dtype == torch.float32 else np.uint8)
    kernels.resize_crop(np.ascontiguousarray(image), size, new_h, new_w, top, left, scale_a, shift_a, pixels, cubic)
    return torch.from_numpy(pixels)


def normalize_uint8(batch: torch.Tensor, scale: Sequence[float], shift: Sequence[float]) -> torch.Tensor:
    """uint8 ``(B, 3, H, W)`` -> float32 ``value * scale[c] + shift[c]``, in one pass (numba; torch's
    conversion + two in-place passes where numba is missing), into memory that may use huge pages
    (:func:`.host_memory.empty_on_huge_pages`)."""
    if batch.dtype != torch.uint8 or batch.ndim != 4 or batch.shape[1] != 3 or batch.device.type != "cpu":
        raise ValueError(f"expected a uint8 CPU tensor of shape (B, 3, H, W), got {batch.dtype} "
                         f"{tuple(batch.shape)} on {batch.device}")
    out = empty_on_huge_pages(batch.shape)
    scale_a = np.asarray(scale, dtype=np.float32)
    shift_a = np.asarray(shift, dtype=np.float32)
    kernels = _kernels()
    if kernels is None:
        out.copy_(batch)
        return out.mul_(torch.from_numpy(scale_a).view(1, 3, 1, 1)).add_(torch.from_numpy(shift_a).view(1, 3, 1, 1))
    flat = batch.contiguous().numpy().reshape(batch.shape[0], 3, -1)
    kernels.normalize(flat, scale_a, shift_a, out.numpy().reshape(batch.shape[0], 3, -1))
    return out


def _resize_crop_torch(image: np.ndarray, size: int, scale: np.ndarray, shift: np.ndarray, mode: str
                       ) -> torch.Tensor:
    """The same result with torch's kernel (the fallback without numba)."""
    x = resize_and_center_crop(torch.from_numpy(image).permute(2, 0, 1).to(torch.float32), size, mode)
    return torch.addcmul(torch.from_numpy(shift).view(3, 1, 1), x, torch.from_numpy(scale).view(3, 1, 1))
