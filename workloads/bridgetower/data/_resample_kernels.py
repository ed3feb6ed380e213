"""numba kernels of :mod:`workloads.bridgetower.data.resample` (imported only where numba is installed).

Compiled on first use and cached on disk by numba (``cache=True``), so later processes load them. numba's cache
follows this file only: whatever the kernels compile in (the SIMD vectors below included) lives here.

**SIMD vectors.** numba has no vector type, and its auto-vectorizers leave the passes scalar or keep their sums in
memory across taps. :class:`Float32Vector` hands LLVM vectors to the kernels through numba's extension API (a data
model, ``numba.extending.intrinsic`` per operation), so that a sum stays in one register across its taps:
``float32x16`` is 16 consecutive values of an array (uint8 converted in registers, or float32), and
:func:`store_transposed` turns 16 such rows into 16 columns in registers. LLVM lowers them to what the CPU has (SSE,
AVX2, AVX-512, NEON). Loads and stores are **unchecked**: the caller keeps every index inside the array's buffer.
"""

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model


class Float32Vector(types.Type):
    """A vector of ``lanes`` float32 values, held in registers (an LLVM ``<lanes x float>``)."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        super().__init__(name=f"float32x{lanes}")

    @property
    def llvm(self) -> ir.VectorType:
        return ir.VectorType(ir.FloatType(), self.lanes)


#: Output rows and columns are computed 16 at a time: one float32x16 vector
LANES = 16
float32x16 = Float32Vector(LANES)


@register_model(Float32Vector)
class _Float32VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type: Float32Vector) -> None:
        super().__init__(dmm, fe_type, fe_type.llvm)


def _element_pointer(context, builder, array_type, array, index_type, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [context.cast(builder, index, index_type, types.intp)])


def _splat(builder, vector_type: ir.VectorType, scalar):
    one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), vector_type.count), None))


@intrinsic
def zeros16(typingctx):
    """A float32x16 of zeros."""
    return float32x16(), lambda context, builder, sig, args: ir.Constant(float32x16.llvm, None)


@intrinsic
def load16(typingctx, array, index):
    """``a.flat[i:i + 16]`` of a C-contiguous uint8 (converted) or float32 array, as a float32x16."""
    if not (isinstance(array, types.Array) and array.layout == "C" and array.dtype in (types.uint8, types.float32)
            and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        pointer = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        element = context.get_value_type(sig.args[0].dtype)
        raw = builder.load(builder.bitcast(pointer, ir.VectorType(element, LANES).as_pointer()), align=1)
        return raw if sig.args[0].dtype == types.float32 else builder.uitofp(raw, float32x16.llvm)
    return float32x16(array, index), codegen


@intrinsic
def store16(typingctx, array, index, vector):
    """``a.flat[i:i + 16] = vector`` into a C-contiguous float32 array."""
    if not (isinstance(array, types.Array) and array.layout == "C" and array.dtype == types.float32
            and isinstance(index, types.Integer) and vector == float32x16):
        return None

    def codegen(context, builder, sig, args):
        pointer = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        builder.store(args[2], builder.bitcast(pointer, float32x16.llvm.as_pointer()), align=1)
        return context.get_dummy_value()
    return types.void(array, index, vector), codegen


@intrinsic
def fma(typingctx, acc, weight, vector):
    """``acc + weight * vector`` (a scalar weight broadcast to every lane; LLVM may fuse the multiply-add)."""
    if not (isinstance(acc, Float32Vector) and acc == vector and isinstance(weight, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        splat = _splat(builder, sig.args[0].llvm, context.cast(builder, args[1], sig.args[1], types.float32))
        return builder.fadd(args[0], builder.fmul(splat, args[2], flags=("contract",)), flags=("contract",))
    return acc(acc, weight, vector), codegen


def _transposed(builder, rows: list) -> list:
    """The 16x16 transpose of 16 ``<16 x float>`` values: 4 butterfly stages of 16 shuffles, stage ``s`` swapping
    bit ``s`` of the row index with bit ``s`` of the lane index."""
    rows, mask_type = list(rows), ir.VectorType(ir.IntType(32), LANES)
    for stage in range(4):
        bit = 1 << stage
        low = ir.Constant(mask_type, [i if not i & bit else LANES + (i & ~bit) for i in range(LANES)])
        high = ir.Constant(mask_type, [i | bit if not i & bit else LANES + i for i in range(LANES)])
        for m in range(LANES):
            if not m & bit:
                a, b = rows[m], rows[m | bit]
                rows[m], rows[m | bit] = builder.shuffle_vector(a, b, low), builder.shuffle_vector(a, b, high)
    return rows


@intrinsic
def store_transposed(typingctx, src, at, src_stride, dst, dst_at, dst_stride, scale, shift):
    """``dst.flat[dst_at + m * dst_stride + l] = src.flat[at + l * src_stride + m] * scale + shift`` for ``l, m``
    in 0..15: a 16x16 block of the C-contiguous float32 ``src``, transposed in registers, into the C-contiguous
    ``dst``: float32, or uint8 (``v + 0.5`` clamped to 0..255, then truncated: rounded half up, clamped)."""
    if not (isinstance(src, types.Array) and src.layout == "C" and src.dtype == types.float32
            and isinstance(dst, types.Array) and dst.layout == "C" and dst.dtype in (types.float32, types.uint8)
            and all(isinstance(i, types.Integer) for i in (at, src_stride, dst_at, dst_stride))
            and isinstance(scale, types.Float) and isinstance(shift, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        vector = float32x16.llvm
        at, src_stride, dst_at, dst_stride = (context.cast(builder, args[i], sig.args[i], types.intp)
                                              for i in (1, 2, 4, 5))
        source = _element_pointer(context, builder, sig.args[0], args[0], types.intp, at)
        target = _element_pointer(context, builder, sig.args[3], args[3], types.intp, dst_at)
        scale_v, shift_v = (_splat(builder, vector, context.cast(builder, args[i], sig.args[i], types.float32))
                            for i in (6, 7))
        rows = [builder.load(builder.bitcast(builder.gep(source, [builder.mul(src_stride, context.get_constant(
            types.intp, m))]), vector.as_pointer()), align=1) for m in range(LANES)]
        for m, row in enumerate(_transposed(builder, rows)):
            value = builder.fadd(builder.fmul(row, scale_v, flags=("contract",)), shift_v, flags=("contract",))
            pointer = builder.gep(target, [builder.mul(dst_stride, context.get_constant(types.intp, m))])
            if sig.args[3].dtype == types.uint8:
                value = builder.fadd(value, ir.Constant(vector, [0.5] * LANES))
                for bound, keep in ((0.0, ">"), (255.0, "<")):
                    limit = ir.Constant(vector, [bound] * LANES)
                    value = builder.select(builder.fcmp_ordered(keep, value, limit), value, limit)
                value = builder.fptoui(value, ir.VectorType(ir.IntType(8), LANES))
            builder.store(value, builder.bitcast(pointer, value.type.as_pointer()), align=1)
        return context.get_dummy_value()
    return types.void(src, at, src_stride, dst, dst_at, dst_stride, scale, shift), codegen


CUBIC_A = -0.5  # Keys' cubic convolution coefficient of torch's (and Pillow's) antialiased bicubic filter


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
    """uint8 ``(H, W, 3)`` -> ``out`` ``(3, size, size)`` (float32 or uint8), in strips of 16 output rows (see the
    module docstring of :mod:`workloads.bridgetower.data.resample`), through buffers that stay in the caches."""
    height, width = image.shape[0], image.shape[1]
    row_first, row_taps, row_weights = filter_taps(height, new_h, top, size, cubic)
    col_first, col_taps, col_weights = filter_taps(width, new_w, left, size, cubic)
    # the input columns the kept output columns read (the crop drops the rest): the rows pass computes only those
    lo, hi = col_first.min(), (col_first + col_taps).max()
    col_first -= lo
    src, offset, floats = image.reshape(height, width * 3), lo * 3, (hi - lo) * 3
    if floats < LANES:  # fewer kept values in a row than one vector: a zero-padded copy
        padded = np.zeros((height, LANES), np.uint8)
        padded[:, :floats] = src[:, offset:offset + floats]
        src, offset, floats = padded, 0, LANES
    # under 16 output rows: computed as 16 (the extra ones repeat the last), then the real ones copied out
    target = out if size >= LANES else np.empty((3, LANES, LANES), out.dtype)
    extent = max(size, LANES)
    rows = np.empty(LANES * floats, np.float32)  # a strip's 16 rows after the rows pass, one after the other
    strip = np.empty(floats * LANES, np.float32)  # the same transposed: each input value's 16 rows side by side
    block = np.empty(3 * LANES * LANES, np.float32)  # 16 output columns of the strip, per channel, transposed
    pair = np.empty((2 * row_weights.shape[1] + 2, 2), np.float32)
    for r in range(0, extent, LANES):
        r = min(r, extent - LANES)  # the last strip overlaps the one before: the same values, written again
        _rows_pass(src, offset, floats, r, size, row_first, row_taps, row_weights, pair, rows)
        for x in range(0, floats, LANES):
            x = min(x, floats - LANES)
            store_transposed(rows, x, floats, strip, x * LANES, LANES, np.float32(1.0), np.float32(0.0))
        for j in range(0, extent, LANES):
            j = min(j, extent - LANES)
            _columns_pass(strip, j, size, col_first, col_taps, col_weights, block)
            for c in range(3):
                store_transposed(block, c * LANES * LANES, LANES, target, (c * extent + r) * extent + j, extent,
                                 scale[c], shift[c])
    if size < LANES:
        out[:] = target[:, :size, :size]


@numba.njit(cache=True, nogil=True)
def _rows_pass(src, offset, floats, r, size, first, taps, weights, pair, rows):
    """``rows[l, x] = sum_k weights[i, k] * src[first[i] + k, offset + x]`` for the strip's output rows
    ``i = r + l`` (the last repeated past ``size``): 16 values of ``x`` at a time, their sums in registers across
    the taps, uint8 converted in registers.

    Two output rows at a time: each input vector is loaded and converted once for both (the conversions, not the
    multiply-adds, bound this pass). ``pair`` holds both rows' weights over their taps' union, 0 outside a row's
    own taps: adding ``0 * value`` leaves a float sum as it was, so each row gets the sum it has alone, in order.
    """
    stride = src.shape[1]
    for row in range(0, LANES, 2):
        i0, i1 = min(r + row, size - 1), min(r + row + 1, size - 1)
        f0, f1 = first[i0], first[i1]  # a row's first and last taps never decrease with the row
        union = max(f0 + taps[i0], f1 + taps[i1]) - f0
        pair[:union] = 0.0
        pair[:taps[i0], 0] = weights[i0, :taps[i0]]
        pair[f1 - f0:f1 - f0 + taps[i1], 1] = weights[i1, :taps[i1]]
        start = f0 * stride + offset
        for x in range(0, floats, LANES):
            x = min(x, floats - LANES)  # the last vector overlaps the one before
            a0, a1 = zeros16(), zeros16()
            for t in range(union):
                value = load16(src, start + t * stride + x)
                a0 = fma(a0, pair[t, 0], value)
                a1 = fma(a1, pair[t, 1], value)
            store16(rows, row * floats + x, a0)
            store16(rows, (row + 1) * floats + x, a1)


@numba.njit(cache=True, nogil=True)
def _columns_pass(strip, j, size, first, taps, weights, block):
    """``block[c, l, :] = sum_k weights[jj, k] * strip[3 * (first[jj] + k) + c, :]`` for the output columns
    ``jj = j + l`` (the last repeated past ``size``): per column, its 3 channels' sums over the strip's 16 rows in
    registers, one weight broadcast for the three."""
    for column in range(LANES):
        jj = min(j + column, size - 1)
        start = first[jj] * 3 * LANES
        a0, a1, a2 = zeros16(), zeros16(), zeros16()
        for k in range(taps[jj]):
            w, at = weights[jj, k], start + 3 * k * LANES
            a0 = fma(a0, w, load16(strip, at))
            a1 = fma(a1, w, load16(strip, at + LANES))
            a2 = fma(a2, w, load16(strip, at + 2 * LANES))
        store16(block, column * LANES, a0)
        store16(block, (LANES + column) * LANES, a1)
        store16(block, (2 * LANES + column) * LANES, a2)


@numba.njit(cache=True, nogil=True)
def normalize(src, scale, shift, out):
    """``out[b, c, :] = src[b, c, :] * scale[c] + shift[c]``: uint8 (B, 3, N) -> float32, one pass."""
    for b in range(src.shape[0]):
        for c in range(src.shape[1]):
            s, t = scale[c], shift[c]
            line, target = src[b, c], out[b, c]
            for x in range(line.shape[0]):
                target[x] = np.float32(line[x]) * s + t
