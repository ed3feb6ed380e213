"""numba kernels of :mod:`workloads.bridgetower.data.resample` (imported only where numba is installed).

Compiled on first use and cached on disk by numba (``cache=True``), so later processes load them. numba's cache
follows this file only: whatever the kernels compile in (the SIMD vectors below included) lives here.

**SIMD vectors.** numba has no vector type, and its auto-vectorizers leave both passes scalar or keep their sums in
memory across taps. :class:`Float32Vector` hands LLVM vectors to the kernels through numba's extension API (a data
model, ``numba.extending.intrinsic`` per operation), so that a sum stays in one register across its taps:
``float32x4`` is one RGB pixel of an interleaved float32 row read as 4 lanes (the 4th, the next value, unused), for
the columns pass; ``float32x16`` is 16 consecutive values of a row (uint8 converted in registers, or float32), for
the rows pass. LLVM lowers them to what the CPU has (SSE, AVX2, AVX-512, NEON). Loads and stores are
**unchecked**: the caller keeps ``index .. index + lanes - 1`` inside the array's buffer.
"""

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.datamodel import models
from numba.extending import intrinsic, overload, register_model


class Float32Vector(types.Type):
    """A vector of ``lanes`` float32 values, held in registers (an LLVM ``<lanes x float>``)."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        super().__init__(name=f"float32x{lanes}")

    @property
    def llvm(self) -> ir.VectorType:
        return ir.VectorType(ir.FloatType(), self.lanes)


float32x4 = Float32Vector(4)
float32x16 = Float32Vector(16)


@register_model(Float32Vector)
class _Float32VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type: Float32Vector) -> None:
        super().__init__(dmm, fe_type, fe_type.llvm)


def _element_pointer(context, builder, array_type, array, index_type, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [context.cast(builder, index, index_type, types.intp)])


def _zeros(vector_type: Float32Vector):
    def typer(typingctx):
        def codegen(context, builder, sig, args):
            return ir.Constant(vector_type.llvm, None)  # zeroinitializer
        return vector_type(), codegen
    return intrinsic(typer)


zeros4 = _zeros(float32x4)
zeros16 = _zeros(float32x16)


def _load(vector_type: Float32Vector, dtypes: tuple):
    def typer(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.layout == "C" and array.dtype in dtypes
                and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            pointer = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            element = context.get_value_type(sig.args[0].dtype)
            raw = builder.load(builder.bitcast(pointer, ir.VectorType(element, vector_type.lanes).as_pointer()),
                               align=1)
            return raw if sig.args[0].dtype == types.float32 else builder.uitofp(raw, vector_type.llvm)
        return vector_type(array, index), codegen
    return intrinsic(typer)


#: ``load4(a, i)``: ``a.flat[i:i + 4]`` of a C-contiguous float32 array
load4 = _load(float32x4, (types.float32,))
#: ``load16(a, i)``: ``a.flat[i:i + 16]`` of a C-contiguous uint8 (converted) or float32 array, as float32
load16 = _load(float32x16, (types.uint8, types.float32))


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
        lanes = sig.args[0].lanes
        scalar = context.cast(builder, args[1], sig.args[1], types.float32)
        undefined = ir.Constant(sig.args[0].llvm, ir.Undefined)
        one = builder.insert_element(undefined, scalar, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(one, undefined, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
        return builder.fadd(args[0], builder.fmul(splat, args[2], flags=("contract",)), flags=("contract",))
    return acc(acc, weight, vector), codegen


@intrinsic
def lane(typingctx, vector, index):
    """``vector[index]`` as a float32."""
    if not (isinstance(vector, Float32Vector) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1], types.int32))
    return types.float32(vector, index), codegen


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
    # one float past the last row: the columns pass reads each pixel as 4 lanes
    flat = np.empty(size * (hi - lo) * 3 + 1, np.float32)
    flat[-1] = 0.0
    rows = flat[:-1].reshape(size, (hi - lo) * 3)
    resample_rows(image.reshape(height, width * 3), lo * 3, row_first, row_taps, row_weights, rows)
    resample_columns(flat, (hi - lo) * 3, col_first - lo, col_taps, col_weights, scale, shift, out)


@numba.njit(cache=True, nogil=True)
def resample_rows(src, offset, first, taps, weights, out):
    """``out[i, x] = sum_k weights[i, k] * src[first[i] + k, offset + x]``; ``src`` (H, N) uint8 or float32,
    ``out`` (R, width) float32, both C-contiguous.

    16 outputs at a time, their sums in one vector register across the taps (uint8 converted in registers); the
    last ``width % 16`` one at a time.
    """
    stride, width = src.shape[1], out.shape[1]
    whole = width - width % 16
    for i in range(out.shape[0]):
        row, w, n = out[i], weights[i], taps[i]
        start = first[i] * stride + offset
        for x in range(0, whole, 16):
            acc = zeros16()
            for k in range(n):
                acc = fma(acc, w[k], load16(src, start + k * stride + x))
            store16(row, x, acc)
        for x in range(whole, width):
            total = np.float32(0.0)
            for k in range(n):
                total += w[k] * np.float32(src[first[i] + k, offset + x])
            row[x] = total


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
def _store_pixel(out, r, j, pixel, scale, shift):
    """The first 3 lanes of ``pixel`` into ``out[:, r, j]``, normalized."""
    _store(out, (0, r, j), lane(pixel, 0) * scale[0] + shift[0])
    _store(out, (1, r, j), lane(pixel, 1) * scale[1] + shift[1])
    _store(out, (2, r, j), lane(pixel, 2) * scale[2] + shift[2])


@numba.njit(cache=True, nogil=True)
def resample_columns(flat, row_floats, first, taps, weights, scale, shift, out):
    """``out[c, r, j] = scale[c] * sum_k weights[j, k] * src[r, first[j] + k, c] + shift[c]`` where ``src`` is
    ``flat[:-1]`` read as (R, row_floats / 3, 3) float32 interleaved; ``out`` (3, R, J) planar: float32, or uint8
    (rounded, clamped).

    A pixel is one 4-lane vector (its 3 channels and the next value, unused: hence ``flat``'s extra float at the
    end), four rows at a time: four independent sums keep the multiply-add units busy.
    """
    rows = out.shape[1]
    grouped = rows - rows % 4
    for r in range(0, grouped, 4):
        for j in range(out.shape[2]):
            w, n = weights[j], taps[j]
            start = r * row_floats + first[j] * 3
            a, b, c, d = zeros4(), zeros4(), zeros4(), zeros4()
            for k in range(n):
                at = start + 3 * k
                a = fma(a, w[k], load4(flat, at))
                b = fma(b, w[k], load4(flat, at + row_floats))
                c = fma(c, w[k], load4(flat, at + 2 * row_floats))
                d = fma(d, w[k], load4(flat, at + 3 * row_floats))
            _store_pixel(out, r, j, a, scale, shift)
            _store_pixel(out, r + 1, j, b, scale, shift)
            _store_pixel(out, r + 2, j, c, scale, shift)
            _store_pixel(out, r + 3, j, d, scale, shift)
    for r in range(grouped, rows):  # the last rows % 4
        for j in range(out.shape[2]):
            w, n = weights[j], taps[j]
            start = r * row_floats + first[j] * 3
            a = zeros4()
            for k in range(n):
                a = fma(a, w[k], load4(flat, start + 3 * k))
            _store_pixel(out, r, j, a, scale, shift)


@numba.njit(cache=True, nogil=True)
def normalize(src, scale, shift, out):
    """``out[b, c, :] = src[b, c, :] * scale[c] + shift[c]``: uint8 (B, 3, N) -> float32, one pass."""
    for b in range(src.shape[0]):
        for c in range(src.shape[1]):
            s, t = scale[c], shift[c]
            line, target = src[b, c], out[b, c]
            for x in range(line.shape[0]):
                target[x] = np.float32(line[x]) * s + t
