"""numba kernels of :mod:`workloads.bridgetower.data.resample` (imported only where numba is installed).

Compiled on first use and cached on disk by numba (``cache=True``), so later processes load them.
"""

import math

import numba
import numpy as np
from numba.extending import overload

# Keys' cubic convolution coefficient of torch's (and Pillow's) antialiased bicubic filter
CUBIC_A = -0.5


@numba.njit(cache=True, nogil=True, inline="always")
def _filter(x, cubic):
    """torch's antialiasing filters at distance ``x``: Keys' cubic (a = -0.5) or the triangle (bilinear)."""
    x = abs(x)
    if not cubic:
        return 1.0 - x if x < 1.0 else 0.0
    a = CUBIC_A
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return 0.0


@numba.njit(cache=True, nogil=True)
def filter_taps(in_size, out_size, start, count, cubic):
    """Taps of torch's antialiased bicubic (``cubic``) or bilinear resampling from ``in_size`` to
    ``out_size`` samples for the outputs ``start .. start + count - 1``: (first input index, tap count,
    weights (count, max_taps)).

    ``_compute_weights_aa`` of ATen's UpSampleKernel.cpp (align_corners=False): a support of 2 (cubic) or 1
    (bilinear) input pixels, widened by the scale when downscaling; weights normalized per output; unused
    taps are 0.
    """
    scale = in_size / out_size
    radius = 2.0 if cubic else 1.0
    support = radius * scale if scale >= 1.0 else radius
    inv_scale = 1.0 / scale if scale >= 1.0 else 1.0
    max_taps = int(math.ceil(support)) * 2 + 1
    first = np.empty(count, np.int64)
    taps = np.empty(count, np.int64)
    weights = np.zeros((count, max_taps), np.float32)
    row = np.empty(max_taps, np.float64)
    for o in range(count):
        center = scale * (start + o + 0.5)
        lo = max(int(center - support + 0.5), 0)
        n = min(max(min(int(center + support + 0.5), in_size) - lo, 0), max_taps)
        total = 0.0
        for k in range(n):
            row[k] = _filter((k + lo - center + 0.5) * inv_scale, cubic)
            total += row[k]
        for k in range(n):
            weights[o, k] = row[k] / total if total != 0.0 else 0.0
        first[o] = lo
        taps[o] = n
    return first, taps, weights


@numba.njit(cache=True, nogil=True)
def resize_crop(image, size, new_h, new_w, top, left, scale, shift, out, cubic):
    """uint8 ``(H, W, 3)`` -> ``out`` ``(3, size, size)`` (float32 or uint8): rows, then columns (see the
    module docstring of :mod:`workloads.bridgetower.data.resample`)."""
    height, width = image.shape[0], image.shape[1]
    row_first, row_taps, row_weights = filter_taps(height, new_h, top, size, cubic)
    col_first, col_taps, col_weights = filter_taps(width, new_w, left, size, cubic)
    # the input columns the kept output columns read (the crop drops the rest): the rows pass computes only those
    lo, hi = col_first.min(), (col_first + col_taps).max()
    rows = np.empty((size, (hi - lo) * 3), np.float32)
    resample_rows(image.reshape(height, width * 3), lo * 3, row_first, row_taps, row_weights, rows)
    resample_columns(rows.reshape(size, hi - lo, 3), col_first - lo, col_taps, col_weights, scale, shift, out)


@numba.njit(cache=True, nogil=True)
def resample_rows(src, offset, first, taps, weights, out):
    """``out[i, x] = sum_k weights[i, k] * src[first[i] + k, offset + x]``; ``src`` (H, N) uint8 or float32."""
    width = out.shape[1]
    for i in range(out.shape[0]):
        row = out[i]
        for x in range(width):
            row[x] = 0.0
        for k in range(taps[i]):
            w = weights[i, k]
            # a slice, indexed from 0: LLVM vectorizes this loop (an index with an offset it cannot prove
            # non-negative keeps numba's wraparound check and stays scalar)
            line = src[first[i] + k, offset:offset + width]
            for x in range(width):  # contiguous: uint8 -> float32 in registers
                row[x] += w * np.float32(line[x])


def _store(out, index, value):
    """``out[index] = value``: as is into a float array; rounded half up and clamped to 0..255 into uint8.
    Compiled code only: the ``@overload`` below picks the implementation from ``out``'s dtype."""
    raise NotImplementedError("_store is implemented for numba-compiled callers only")


@overload(_store, inline="always")
def _store_typed(out, index, value):
    if out.dtype == numba.types.uint8:
        def store_uint8(out, index, value):
            out[index] = min(max(value + np.float32(0.5), np.float32(0.0)), np.float32(255.0))
        return store_uint8

    def store(out, index, value):
        out[index] = value
    return store


@numba.njit(cache=True, nogil=True, inline="always")
def _store_pixel(out, r, j, v0, v1, v2, scale, shift):
    _store(out, (0, r, j), v0 * scale[0] + shift[0])
    _store(out, (1, r, j), v1 * scale[1] + shift[1])
    _store(out, (2, r, j), v2 * scale[2] + shift[2])


@numba.njit(cache=True, nogil=True)
def resample_columns(src, first, taps, weights, scale, shift, out):
    """``out[c, r, j] = scale[c] * sum_k weights[j, k] * src[r, first[j] + k, c] + shift[c]``;
    ``src`` (R, W, 3) float32 interleaved, ``out`` (3, R, J) planar: float32, or uint8 (rounded, clamped).

    Four rows at a time: twelve independent sums keep the FMA units busy (three would wait on latency).
    """
    rows = src.shape[0]
    grouped = rows - rows % 4
    for r in range(0, grouped, 4):
        la, lb, lc, ld = src[r], src[r + 1], src[r + 2], src[r + 3]
        for j in range(out.shape[2]):
            a0 = a1 = a2 = b0 = b1 = b2 = c0 = c1 = c2 = d0 = d1 = d2 = np.float32(0.0)
            for x in range(first[j], first[j] + taps[j]):
                w = weights[j, x - first[j]]
                a0 += w * la[x, 0]
                a1 += w * la[x, 1]
                a2 += w * la[x, 2]
                b0 += w * lb[x, 0]
                b1 += w * lb[x, 1]
                b2 += w * lb[x, 2]
                c0 += w * lc[x, 0]
                c1 += w * lc[x, 1]
                c2 += w * lc[x, 2]
                d0 += w * ld[x, 0]
                d1 += w * ld[x, 1]
                d2 += w * ld[x, 2]
            _store_pixel(out, r, j, a0, a1, a2, scale, shift)
            _store_pixel(out, r + 1, j, b0, b1, b2, scale, shift)
            _store_pixel(out, r + 2, j, c0, c1, c2, scale, shift)
            _store_pixel(out, r + 3, j, d0, d1, d2, scale, shift)
    for r in range(grouped, rows):  # the last rows % 4
        line = src[r]
        for j in range(out.shape[2]):
            a0 = a1 = a2 = np.float32(0.0)
            for x in range(first[j], first[j] + taps[j]):
                w = weights[j, x - first[j]]
                a0 += w * line[x, 0]
                a1 += w * line[x, 1]
                a2 += w * line[x, 2]
            _store_pixel(out, r, j, a0, a1, a2, scale, shift)


@numba.njit(cache=True, nogil=True)
def normalize(src, scale, shift, out):
    """``out[b, c, :] = src[b, c, :] * scale[c] + shift[c]``: uint8 (B, 3, N) -> float32, one pass."""
    for b in range(src.shape[0]):
        for c in range(src.shape[1]):
            s, t = scale[c], shift[c]
            line, target = src[b, c], out[b, c]
            for x in range(line.shape[0]):
                target[x] = np.float32(line[x]) * s + t
