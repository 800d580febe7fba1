"""The CPU kernels' row toolkit (numba): the per-row helpers the plain kernels (:mod:`.kernels`)
and the grouped and gated ones (:mod:`.gated`) share. Bit conversions between float32 and the
16-bit dtypes, loading, adding, rounding and storing rows of any dtype code (:mod:`.flags`), the
parameter rows a kernel multiplies by, the float64 row sums and RMSNorm's r, dx of an RMSNorm row,
scratch rows, the backward's block size and its parameter-gradient partial rows.

Rows are addresses: a row is n elements at an address, read and written through typed pointers
(:mod:`.runtime`).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, types

from . import runtime as rt
from .flags import BF16, F16, F32, F64
from .runtime import I32, c32, njit, ptr_f32, ptr_f64, ptr_u16

_I16 = ir.IntType(16)
FLOAT = ir.FloatType()  # LLVM's float32 (I32 and c32, a 32-bit constant, are the runtime's)


# ----------------------------------------------------------------------------------------------
# Bit conversions, written as LLVM IR so that every step is a 32-bit integer or float op that the
# loop vectorizer turns into AVX2 / NEON lanes (numba would widen integer arithmetic to 64 bits).
# ----------------------------------------------------------------------------------------------
@rt.lowered(types.float32(types.uint16))
def bf16_to_f32(b, h):
    """bfloat16 bits -> float32 (exact: the bits are the high half of the float32)."""
    return b.bitcast(b.shl(b.zext(h, I32), c32(16)), FLOAT)


@rt.lowered(types.uint16(types.float32))
def f32_to_bf16(b, f):
    """float32 -> bfloat16 bits, round to nearest even as ``c10::BFloat16``; NaN -> 0x7FC0."""
    # NaN is replaced by the quiet NaN before rounding (which leaves 0x7FC00000 as 0x7FC0):
    # a blend of 32-bit lanes, cheaper than blending the 16-bit results (measured 10%)
    u = b.bitcast(f, I32)
    u = b.select(b.fcmp_unordered("uno", f, f), c32(0x7FC00000), u)
    lsb = b.and_(b.lshr(u, c32(16)), c32(1))
    r = b.lshr(b.add(b.add(u, c32(0x7FFF)), lsb), c32(16))
    return b.trunc(r, _I16)


@rt.lowered(types.float32(types.uint16))
def f16_to_f32(b, h):
    """float16 bits -> float32, exact for normals, subnormals, ±inf and NaN (payload kept)."""
    h32 = b.zext(h, I32)
    sign = b.shl(b.and_(h32, c32(0x8000)), c32(16))
    em = b.and_(h32, c32(0x7FFF))  # exponent and mantissa
    shifted = b.shl(em, c32(13))
    normal = b.add(shifted, c32((127 - 15) << 23))  # rebias the exponent
    infnan = b.or_(shifted, c32(0x7F800000))
    # subnormal (and zero): em · 2^-24, exact in float32
    sub = b.fmul(b.uitofp(em, FLOAT), ir.Constant(FLOAT, 2.0**-24))
    sub = b.bitcast(sub, I32)
    r = b.select(b.icmp_unsigned(">=", em, c32(0x7C00)), infnan, normal)
    r = b.select(b.icmp_unsigned("<", em, c32(0x0400)), sub, r)
    return b.bitcast(b.or_(r, sign), FLOAT)


@rt.lowered(types.uint16(types.float32))
def f32_to_f16(b, f):
    """float32 -> float16 bits, round to nearest even (IEEE, as ``c10::Half``): overflow -> ±inf,
    NaN -> ±0x7E00, subnormals rounded by the float adder (|x| + 0.5 has a 2^-24 ulp)."""
    u = b.bitcast(f, I32)
    sign = b.and_(b.lshr(u, c32(16)), c32(0x8000))
    a = b.and_(u, c32(0x7FFFFFFF))
    big = b.select(b.icmp_unsigned(">", a, c32(0x7F800000)), c32(0x7E00), c32(0x7C00))
    sub = b.fadd(b.bitcast(a, FLOAT), ir.Constant(FLOAT, 0.5))
    sub = b.sub(b.bitcast(sub, I32), c32(0x3F000000))
    odd = b.and_(b.lshr(a, c32(13)), c32(1))
    # rebias (15 - 127 << 23, mod 2^32), add 0xFFF + odd: round to nearest even, carry into the
    # exponent (65520 and up become inf, as they should)
    normal = b.lshr(b.add(b.add(a, c32(0xC8000FFF)), odd), c32(13))
    r = b.select(b.icmp_unsigned("<", a, c32(0x38800000)), sub, normal)
    r = b.select(b.icmp_unsigned(">=", a, c32(0x47800000)), big, r)
    return b.trunc(b.or_(r, sign), _I16)


# ----------------------------------------------------------------------------------------------
# Row helpers. A row is n elements at an address; `t` arguments are float32 scratch rows private to
# one thread (they stay in L1/L2: extra passes over them are cheap). Those without fastmath flags
# are inlined into their callers (numba's `inline="always"`, at its IR level): calls of compiled
# functions with array arguments, several a row, were about a third of a 128-element row's forward
# (1024 × 128 float32 RMSNorm forward: 1.01× F.rms_norm's time with the calls, 0.65× inlined, in
# the latency grids of benchmarks/results/CPU_NOTES.md). The float64 reductions stay calls:
# inlined at numba's IR level they would lose their own fastmath flags, which let LLVM vectorize
# them.
# ----------------------------------------------------------------------------------------------
@njit(inline="always")
def esize(code):
    return 4 if code == F32 else 2


@njit(inline="always")
def load_row(addr, n, code, t):
    """The row as float32: a view of the input for float32, else converted into t (float64
    rounded to nearest)."""
    if code == F32:
        return carray(ptr_f32(addr), n)
    if code == F64:
        src64 = carray(ptr_f64(addr), n)
        for j in range(n):
            t[j] = np.float32(src64[j])
        return t[:n]
    src = carray(ptr_u16(addr), n)
    if code == BF16:
        for j in range(n):
            t[j] = bf16_to_f32(src[j])
    else:
        for j in range(n):
            t[j] = f16_to_f32(src[j])
    return t[:n]


@njit(inline="always")
def add_row(addr, n, code, t):
    """t += the row (float32 sum)."""
    if code == F32:
        src = carray(ptr_f32(addr), n)
        for j in range(n):
            t[j] = t[j] + src[j]
    elif code == BF16:
        src16 = carray(ptr_u16(addr), n)
        for j in range(n):
            t[j] = t[j] + bf16_to_f32(src16[j])
    else:
        src16 = carray(ptr_u16(addr), n)
        for j in range(n):
            t[j] = t[j] + f16_to_f32(src16[j])


@njit(inline="always")
def round_row(t, n, code):
    """Round t in place to the dtype `code` (what a torch op in that dtype does to its result)."""
    if code == BF16:
        for j in range(n):
            t[j] = bf16_to_f32(f32_to_bf16(t[j]))
    elif code == F16:
        for j in range(n):
            t[j] = f16_to_f32(f32_to_f16(t[j]))


@njit(inline="always")
def rounded(v, code):
    """v rounded to the dtype `code` (float32 for F32)."""
    if code == BF16:
        return bf16_to_f32(f32_to_bf16(v))
    if code == F16:
        return f16_to_f32(f32_to_f16(v))
    return v


@njit(inline="always")
def store_row(t, addr, n, code):
    """Write the float32 row t to the row at addr, converting to the dtype `code` (float64
    widened exactly)."""
    if code == F32:
        dst = carray(ptr_f32(addr), n)
        for j in range(n):
            dst[j] = t[j]
    elif code == F64:
        dst64 = carray(ptr_f64(addr), n)
        for j in range(n):
            dst64[j] = np.float64(t[j])
    elif code == BF16:
        dst16 = carray(ptr_u16(addr), n)
        for j in range(n):
            dst16[j] = f32_to_bf16(t[j])
    else:
        dst16 = carray(ptr_u16(addr), n)
        for j in range(n):
            dst16[j] = f32_to_f16(t[j])


@njit
def _params(dst, n, addr, stride, code, offset, c_round):
    """dst = the (N,) parameter at addr (element stride `stride`, 0 for an expanded one) as float32,
    rounded to `c_round`, plus offset rounded again: ``p.to(dtype) + offset`` as torch computes it
    in that dtype."""
    rt.wide_vectors()
    span = (n - 1) * stride + 1
    if code == F32:
        a32 = carray(ptr_f32(addr), span)
        if stride == 1:
            for j in range(n):
                dst[j] = a32[j]
        else:
            for j in range(n):
                dst[j] = a32[j * stride]
    elif code == F64:
        a64 = carray(ptr_f64(addr), span)
        for j in range(n):
            dst[j] = np.float32(a64[j * stride])
    else:
        a16 = carray(ptr_u16(addr), span)
        if stride != 1:
            t16 = np.empty(n, np.uint16)
            for j in range(n):
                t16[j] = a16[j * stride]
            a16 = t16
        if code == BF16:
            for j in range(n):
                dst[j] = bf16_to_f32(a16[j])
        else:
            for j in range(n):
                dst[j] = f16_to_f32(a16[j])
    round_row(dst, n, c_round)
    if offset != 0.0:
        o = np.float32(offset)
        for j in range(n):
            dst[j] = dst[j] + o
        round_row(dst, n, c_round)


@njit
def param_rows(n, wp, ws, w_code, has_w, bp, bs, b_code, has_b, offset, c_round):
    """(scale address, bias address, the array that owns converted copies) for a kernel that
    multiplies by the (N,) float32 scale (offset + γ; ones without a weight: × 1 is exact) and adds
    the (N,) float32 bias. A parameter that is already such a row is used in place."""
    rt.wide_vectors()
    w_direct = has_w and w_code == F32 and ws == 1 and offset == 0.0 and c_round == F32
    b_direct = not has_b or (b_code == F32 and bs == 1 and c_round == F32)
    nw = 0 if w_direct else n
    buf = np.empty(nw + (0 if b_direct else n), np.float32)
    sp, bpp = wp, bp
    if not w_direct:
        sp = np.int64(buf.ctypes.data)  # (ctypes.data is unsigned: mixed with int64 it is float64)
        if has_w:
            _params(buf[:n], n, wp, ws, w_code, offset, c_round)
        else:
            buf[:n] = 1.0
    if not b_direct:
        bpp = np.int64(buf.ctypes.data) + 4 * nw
        _params(buf[nw:], n, bp, bs, b_code, 0.0, c_round)
    return sp, bpp, buf


@njit(inline="always")
def field(flags, f):
    """The value of the bit field f = (shift, width) of a flags word (:mod:`.flags`)."""
    return (flags >> f[0]) & ((1 << f[1]) - 1)


@njit(inline="always")
def scratch_row(base, n, i):
    """Scratch row i of n float32s at base, a view without an owner: such arrays are passed between
    functions without reference counting (atomic increments: ~15 ns a row measured)."""
    return carray(ptr_f32(base + 4 * i * n), n)


# Row statistics are accumulated in float64 (they come out as the correctly rounded float32
# values in practice) and may be reassociated, so LLVM vectorizes them; float32 sums in chunks
# carried in float64 would save 0-21% of a row loop's time in cache and nothing from memory, and a
# plain float32 sum fails the tolerance rule (docs/cpu.md, "What float64 statistics cost").
# Nothing else is fastmath: the element-wise products round
# exactly as torch's eager ops do. A row whose float64 sum is tiny (< TINY) is summed again the
# way torch sums it, squares (and x − μ) in float32, so that squares that underflow float32
# (|x| ≲ 1e-19) do there what they do in torch: an all-tiny row then gets r = inf with eps = 0, as
# torch's (and the other backends') does. Above TINY, what underflows in float32 is below 2^-35
# of the sum, so both ways agree to rounding.
TINY = 2.0**-60


@njit(fastmath={"reassoc", "contract"})
def sum_squares64(x, k):
    rt.wide_vectors()
    acc = 0.0
    for j in range(k):
        v = np.float64(x[j])
        acc += v * v
    return acc


@njit(fastmath={"reassoc", "contract"})
def sum_squares32(x, k):
    """Σ_{j<k} x_j² with each square rounded to float32 (as torch's x.pow(2)), summed in float64."""
    rt.wide_vectors()
    acc = 0.0
    for j in range(k):
        acc += np.float64(x[j] * x[j])
    return acc


@njit(inline="always")
def sum_squares(x, k):
    """Σ_{j<k} x_j² in float64 (float32 squares for a tiny row, see above)."""
    ss = sum_squares64(x, k)
    return sum_squares32(x, k) if ss < TINY else ss


@njit(inline="always")
def rms_rstd(ss, k, eps, rms_eps):
    """RMSNorm's r from Σx² of k elements: 1/√(ms + ε), or 1/(√ms + ε) where ε goes on the RMS."""
    ms = ss / k
    if rms_eps:
        return np.float32(1.0 / (np.sqrt(ms) + eps))
    return np.float32(1.0 / np.sqrt(ms + eps))


# The bfloat16 forward sums the squares of 256 elements at a time in float32 (each float32 sum then
# added in float64): on Zen 4 the float64 sum was most of the first pass's work (0.086 against 0.042
# ns an element, rows in cache). A piece's float32 sum carries a relative error below ~2^-16 (256
# terms, any order), far under the bfloat16 output's 2^-9; a piece whose float32 sum overflows (or
# holds inf / NaN) is summed again in float64, so large rows get what the float64 sum gives.
_PIECE = 256
_PIECE_MAX = np.float32(3.0e38)


@njit(fastmath={"reassoc", "contract"})
def load_bf16_sum_squares(src, t, n, k):
    """t = the bfloat16 row as float32, and Σ_{j<k} t_j² (float64): one pass over the input."""
    rt.wide_vectors()
    acc = 0.0
    for c0 in range(0, k, _PIECE):
        c1 = min(k, c0 + _PIECE)
        sv, tv = src[c0:c1], t[c0:c1]  # (indices from 0: numba then drops its negative-index test)
        part = np.float32(0.0)
        for j in range(c1 - c0):
            v = bf16_to_f32(sv[j])
            tv[j] = v
            part += v * v
        if part <= _PIECE_MAX:
            acc += np.float64(part)
        else:  # inf or NaN: a square overflowed float32 (|x| > 1.8e19), or x is inf or NaN
            for j in range(c1 - c0):
                d = np.float64(tv[j])
                acc += d * d
    for j in range(k, n):
        t[j] = bf16_to_f32(src[j])
    return acc


@njit(inline="always")
def scale_row(v, r, s, b, has_b, out):
    """out = (v·r)·s (+ β) in float32: the RMSNorm row's last step (the grouped and gated kernels'
    too), one loop per case so that each vectorizes."""
    if has_b:
        for j in range(out.shape[0]):
            out[j] = (v[j] * r) * s[j] + b[j]
    else:
        for j in range(out.shape[0]):
            out[j] = (v[j] * r) * s[j]


@njit(fastmath={"reassoc", "contract"})
def sum_gx(dy, x, s64, n):
    """Σ g·x in float64, g = dy·s (RMSNorm's Σ g·x̂ is r times this)."""
    rt.wide_vectors_bwd()
    acc = 0.0
    for j in range(n):
        acc += (np.float64(dy[j]) * s64[j]) * np.float64(x[j])
    return acc


# dx is formed in float64 with fused multiply-adds allowed (one rounding fewer, in float64); it is
# rounded once to float32.
@njit(fastmath={"contract"})
def dx_rms(dy, x, s64, n, k, a, b, out):
    """out_j = a·g_j − b·x_j for j < k, a·g_j after (g = dy·s), in float64, rounded once."""
    rt.wide_vectors_bwd()
    for j in range(k):
        out[j] = np.float32(a * (np.float64(dy[j]) * s64[j]) - b * np.float64(x[j]))
    for j in range(k, n):
        out[j] = np.float32(a * (np.float64(dy[j]) * s64[j]))


# ----------------------------------------------------------------------------------------------
# The backward's blocks and its d weight / d bias: per-block float32 partial rows, summed in block
# order on the caller (so the same order on any number of threads)
# ----------------------------------------------------------------------------------------------
@njit
def bwd_rows_per_block(m, n):
    rt.wide_vectors_bwd()
    # ≥ 16 rows (the float32 partial rows of d weight are then ≤ 1/16 of the input), ~16 K elements
    # where rows are short, and at most 64 blocks: the caller sums the partial rows alone (64·N
    # additions: ~0.1 ms at N = 4096, where 8192 × 4096 in blocks of 16 rows left it 512·N,
    # ~1-2 ms of a 15 ms call on two threads). Fixed by the sizes alone: d weight is summed in the
    # same order on any number of threads.
    return max(16, (16384 + n - 1) // n, (m + 63) // 64)


@njit
def partials(nb, n, need):
    """A block's float32 partial row of d weight or d bias for each of nb blocks (none if not
    needed)."""
    rt.wide_vectors_bwd()
    return np.empty(nb * n if need else 0, np.float32)


@njit
def reduce_grads(pw, pb, nb, n, dwp, dw_code, dbp, db_code):
    """d weight and d bias, where their partial rows were kept (pw, pb not empty)."""
    rt.wide_vectors_bwd()
    if pw.shape[0] == 0 and pb.shape[0] == 0:
        return
    acc = np.empty(n, np.float64)
    if pw.shape[0] != 0:
        _reduce_partials(pw, nb, n, dwp, dw_code, acc)
    if pb.shape[0] != 0:
        _reduce_partials(pb, nb, n, dbp, db_code, acc)


@njit
def _reduce_partials(p, nb, n, addr, code, acc):
    """Σ over the nb partial rows of p (float32, block order, in float64) into the (N,) output at
    addr in the dtype `code` (float64 → float32 → half, as torch's ``.to`` converts)."""
    rt.wide_vectors_bwd()
    for j in range(n):
        acc[j] = 0.0
    for blk in range(nb):
        row = p[blk * n : (blk + 1) * n]
        for j in range(n):
            acc[j] += np.float64(row[j])
    if code == F64:
        out64 = carray(ptr_f64(addr), n)
        for j in range(n):
            out64[j] = acc[j]
    else:
        t = np.empty(n, np.float32)
        for j in range(n):
            t[j] = np.float32(acc[j])
        store_row(t, addr, n, code)
