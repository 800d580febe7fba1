"""The CPU kernels (numba): the maths of RMSNorm / LayerNorm forward and backward over blocks of
rows.

Every tensor reaches a kernel as an address, a row stride and a dtype code; bfloat16 / float16
rows are read as their raw 16-bit patterns and converted here with torch's rounding (round to
nearest even). Dtypes and options are runtime codes, so each entry point compiles to exactly one
specialisation. The threads that share a call are :mod:`.runtime`'s.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, types

from . import runtime as rt
from .runtime import _I32, _c, bits_f64, f64_bits, njit, ptr_f32, ptr_f64, ptr_i64, ptr_u8, ptr_u16

# dtype codes (shared with the launchers); F64 only for weights and biases and their gradients
F32, BF16, F16, F64 = 0, 1, 2, 3
# what a row is normalized by
RMS_NORM, LAYER_NORM = 0, 1
# where ε goes in RMSNorm
MEAN_SQUARE, RMS = 0, 1
# A LayerNorm row whose r is below _RISK_R (σ > 1e30) may overflow float32 in x − μ; it is then
# formed from s·x − s·μ with s = _SCALE, a power of two (exact), as the reference does.
_RISK_R = 2.0**-100
_SCALE = np.float32(2.0**-80)

# Bit fields of the forward's `flags` argument: (shift, width)
FX, FR, FY, FHAS_RES, FNORM, FEPS = (0, 2), (2, 2), (4, 2), (6, 1), (7, 1), (8, 1)
FC_PRE, FC_R, FC_MUL, FC_OUT = (9, 2), (11, 2), (13, 2), (15, 2)
FW, FHAS_W, FB, FHAS_B, FC_PARAM = (17, 2), (19, 1), (20, 2), (22, 1), (23, 2)
FSTREAM = (25, 1)  # y (and h) written with non-temporal stores (runtime.stream_rule)
# ... and of the backward's
BDY, BX, BDR, BHAS_DR, BNORM, BEPS = (0, 2), (2, 2), (4, 2), (6, 1), (7, 1), (8, 1)
BC_XHAT, BW, BHAS_W, BNEED_DW, BDW, BNEED_DB, BDB = (
    (9, 2),
    (11, 2),
    (13, 1),
    (14, 1),
    (15, 2),
    (17, 1),
    (18, 2),
)
BSTREAM = (20, 1)  # dx written with non-temporal stores, as the forward's FSTREAM


def pack(**fields: tuple[tuple[int, int], int]) -> int:
    """flags from {name: ((shift, width), value)}; the launchers build them once per combination of
    dtypes and options."""
    out = 0
    for (shift, width), value in fields.values():
        if not 0 <= value < 1 << width:
            raise ValueError(f"flag value {value} does not fit in {width} bits")
        out |= value << shift
    return out


_I16, _F32 = ir.IntType(16), ir.FloatType()  # (_I32 and _c, a 32-bit constant: the runtime's)


# ----------------------------------------------------------------------------------------------
# Bit conversions, written as LLVM IR so that every step is a 32-bit integer or float op that the
# loop vectorizer turns into AVX2 / NEON lanes (numba would widen integer arithmetic to 64 bits).
# ----------------------------------------------------------------------------------------------
@rt.lowered(types.float32(types.uint16))
def _bf16_to_f32(b, h):
    """bfloat16 bits -> float32 (exact: the bits are the high half of the float32)."""
    return b.bitcast(b.shl(b.zext(h, _I32), _c(16)), _F32)


@rt.lowered(types.uint16(types.float32))
def _f32_to_bf16(b, f):
    """float32 -> bfloat16 bits, round to nearest even as ``c10::BFloat16``; NaN -> 0x7FC0."""
    # NaN is replaced by the quiet NaN before rounding (which leaves 0x7FC00000 as 0x7FC0):
    # a blend of 32-bit lanes, cheaper than blending the 16-bit results (measured 10%)
    u = b.bitcast(f, _I32)
    u = b.select(b.fcmp_unordered("uno", f, f), _c(0x7FC00000), u)
    lsb = b.and_(b.lshr(u, _c(16)), _c(1))
    r = b.lshr(b.add(b.add(u, _c(0x7FFF)), lsb), _c(16))
    return b.trunc(r, _I16)


@rt.lowered(types.float32(types.uint16))
def _f16_to_f32(b, h):
    """float16 bits -> float32, exact for normals, subnormals, ±inf and NaN (payload kept)."""
    h32 = b.zext(h, _I32)
    sign = b.shl(b.and_(h32, _c(0x8000)), _c(16))
    em = b.and_(h32, _c(0x7FFF))  # exponent and mantissa
    shifted = b.shl(em, _c(13))
    normal = b.add(shifted, _c((127 - 15) << 23))  # rebias the exponent
    infnan = b.or_(shifted, _c(0x7F800000))
    # subnormal (and zero): em · 2^-24, exact in float32
    sub = b.fmul(b.uitofp(em, _F32), ir.Constant(_F32, 2.0**-24))
    sub = b.bitcast(sub, _I32)
    r = b.select(b.icmp_unsigned(">=", em, _c(0x7C00)), infnan, normal)
    r = b.select(b.icmp_unsigned("<", em, _c(0x0400)), sub, r)
    return b.bitcast(b.or_(r, sign), _F32)


@rt.lowered(types.uint16(types.float32))
def _f32_to_f16(b, f):
    """float32 -> float16 bits, round to nearest even (IEEE, as ``c10::Half``): overflow -> ±inf,
    NaN -> ±0x7E00, subnormals rounded by the float adder (|x| + 0.5 has a 2^-24 ulp)."""
    u = b.bitcast(f, _I32)
    sign = b.and_(b.lshr(u, _c(16)), _c(0x8000))
    a = b.and_(u, _c(0x7FFFFFFF))
    big = b.select(b.icmp_unsigned(">", a, _c(0x7F800000)), _c(0x7E00), _c(0x7C00))
    sub = b.fadd(b.bitcast(a, _F32), ir.Constant(_F32, 0.5))
    sub = b.sub(b.bitcast(sub, _I32), _c(0x3F000000))
    odd = b.and_(b.lshr(a, _c(13)), _c(1))
    # rebias (15 - 127 << 23, mod 2^32), add 0xFFF + odd: round to nearest even, carry into the
    # exponent (65520 and up become inf, as they should)
    normal = b.lshr(b.add(b.add(a, _c(0xC8000FFF)), odd), _c(13))
    r = b.select(b.icmp_unsigned("<", a, _c(0x38800000)), sub, normal)
    r = b.select(b.icmp_unsigned(">=", a, _c(0x47800000)), big, r)
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
def _esize(code):
    return 4 if code == F32 else 2


@njit(inline="always")
def _load_row(addr, n, code, t):
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
            t[j] = _bf16_to_f32(src[j])
    else:
        for j in range(n):
            t[j] = _f16_to_f32(src[j])
    return t[:n]


@njit(inline="always")
def _add_row(addr, n, code, t):
    """t += the row (float32 sum)."""
    if code == F32:
        src = carray(ptr_f32(addr), n)
        for j in range(n):
            t[j] = t[j] + src[j]
    elif code == BF16:
        src16 = carray(ptr_u16(addr), n)
        for j in range(n):
            t[j] = t[j] + _bf16_to_f32(src16[j])
    else:
        src16 = carray(ptr_u16(addr), n)
        for j in range(n):
            t[j] = t[j] + _f16_to_f32(src16[j])


@njit(inline="always")
def _round_row(t, n, code):
    """Round t in place to the dtype `code` (what a torch op in that dtype does to its result)."""
    if code == BF16:
        for j in range(n):
            t[j] = _bf16_to_f32(_f32_to_bf16(t[j]))
    elif code == F16:
        for j in range(n):
            t[j] = _f16_to_f32(_f32_to_f16(t[j]))


@njit(inline="always")
def _round(v, code):
    if code == BF16:
        return _bf16_to_f32(_f32_to_bf16(v))
    if code == F16:
        return _f16_to_f32(_f32_to_f16(v))
    return v


@njit(inline="always")
def _store_row(t, addr, n, code):
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
            dst16[j] = _f32_to_bf16(t[j])
    else:
        dst16 = carray(ptr_u16(addr), n)
        for j in range(n):
            dst16[j] = _f32_to_f16(t[j])


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
                dst[j] = _bf16_to_f32(a16[j])
        else:
            for j in range(n):
                dst[j] = _f16_to_f32(a16[j])
    _round_row(dst, n, c_round)
    if offset != 0.0:
        o = np.float32(offset)
        for j in range(n):
            dst[j] = dst[j] + o
        _round_row(dst, n, c_round)


@njit
def _param_rows(n, wp, ws, w_code, has_w, bp, bs, b_code, has_b, offset, c_round):
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
def _field(flags, f):
    return (flags >> f[0]) & ((1 << f[1]) - 1)


# Row statistics are accumulated in float64 (they come out as the correctly rounded float32
# values in practice) and may be reassociated, so LLVM vectorizes them; float32 sums in chunks
# carried in float64 would save 0-21% of a row loop's time in cache and nothing from memory, and a
# plain float32 sum fails the tolerance rule (docs/cpu.md, "What float64 statistics cost").
# Nothing else is fastmath: the element-wise products round
# exactly as torch's eager ops do. A row whose float64 sum is tiny (< _TINY) is summed again the
# way torch sums it, squares (and x − μ) in float32, so that squares that underflow float32
# (|x| ≲ 1e-19) do there what they do in torch: an all-tiny row then gets r = inf with eps = 0, as
# torch's (and the other backends') does. Above _TINY, what underflows in float32 is below 2^-35
# of the sum, so both ways agree to rounding.
_TINY = 2.0**-60


@njit(fastmath={"reassoc", "contract"})
def _sum_squares64(x, k):
    rt.wide_vectors()
    acc = 0.0
    for j in range(k):
        v = np.float64(x[j])
        acc += v * v
    return acc


@njit(fastmath={"reassoc", "contract"})
def _sum_squares32(x, k):
    """Σ_{j<k} x_j² with each square rounded to float32 (as torch's x.pow(2)), summed in float64."""
    rt.wide_vectors()
    acc = 0.0
    for j in range(k):
        acc += np.float64(x[j] * x[j])
    return acc


@njit(inline="always")
def _sum_squares(x, k):
    """Σ_{j<k} x_j² in float64 (float32 squares for a tiny row, see above)."""
    ss = _sum_squares64(x, k)
    return _sum_squares32(x, k) if ss < _TINY else ss


@njit(inline="always")
def _rstd(ss, k, eps, rms_eps):
    """RMSNorm's r from Σx² of k elements: 1/√(ms + ε), or 1/(√ms + ε) where ε goes on the RMS."""
    ms = ss / k
    if rms_eps:
        return np.float32(1.0 / (np.sqrt(ms) + eps))
    return np.float32(1.0 / np.sqrt(ms + eps))


@njit(fastmath={"reassoc", "contract"})
def _shifted_sums(x, n, c):
    """Σ (x − c) and Σ (x − c)² in float64; with c = x[0] the variance from them has no cancellation
    unless the row's spread is tiny next to |x[0] − mean|, and a constant row gets μ = c exactly
    and σ² = 0 (x − μ = 0, as in torch)."""
    rt.wide_vectors()
    s1 = 0.0
    s2 = 0.0
    for j in range(n):
        d = np.float64(x[j]) - c
        s1 += d
        s2 += d * d
    return s1, s2


@njit(fastmath={"reassoc", "contract"})
def _deviations32(x, n, mu):
    """Σ (x − μ)² with each x − μ and its square rounded to float32 (torch's), summed in float64."""
    rt.wide_vectors()
    acc = 0.0
    for j in range(n):
        d = x[j] - mu
        acc += np.float64(d * d)
    return acc


@njit(inline="always")
def _moments(x, n, c, s1, s2):
    """(μ in float32, σ²) of the row from :func:`_shifted_sums` about c = x[0]; σ² of a tiny row
    (see above) again from float32 deviations about that μ."""
    mu = np.float32(c + s1 / n)
    var = (s2 - s1 * s1 / n) / n
    if var < 0.0:  # (NaN stays NaN)
        var = 0.0
    if var < _TINY:
        var = _deviations32(x, n, mu) / n
    return mu, var


# The bfloat16 forward sums the squares of 256 elements at a time in float32 (each float32 sum then
# added in float64): on Zen 4 the float64 sum was most of the first pass's work (0.086 against 0.042
# ns an element, rows in cache). A piece's float32 sum carries a relative error below ~2^-16 (256
# terms, any order), far under the bfloat16 output's 2^-9; a piece whose float32 sum overflows (or
# holds inf / NaN) is summed again in float64, so large rows get what the float64 sum gives.
_PIECE = 256
_PIECE_MAX = np.float32(3.0e38)


@njit(fastmath={"reassoc", "contract"})
def _load_bf16_sum_squares(src, t, n, k):
    """t = the bfloat16 row as float32, and Σ_{j<k} t_j² (float64): one pass over the input."""
    rt.wide_vectors()
    acc = 0.0
    for c0 in range(0, k, _PIECE):
        c1 = min(k, c0 + _PIECE)
        sv, tv = src[c0:c1], t[c0:c1]  # (indices from 0: numba then drops its negative-index test)
        part = np.float32(0.0)
        for j in range(c1 - c0):
            v = _bf16_to_f32(sv[j])
            tv[j] = v
            part += v * v
        if part <= _PIECE_MAX:
            acc += np.float64(part)
        else:  # inf or NaN: a square overflowed float32 (|x| > 1.8e19), or x is inf or NaN
            for j in range(c1 - c0):
                d = np.float64(tv[j])
                acc += d * d
    for j in range(k, n):
        t[j] = _bf16_to_f32(src[j])
    return acc


@njit(fastmath={"reassoc", "contract"})
def _load_bf16_shifted_sums(src, t, n):
    """t = the bfloat16 row as float32, and :func:`_shifted_sums` of it about c = t[0]: one pass."""
    rt.wide_vectors()
    c = np.float64(_bf16_to_f32(src[0]))
    s1 = 0.0
    s2 = 0.0
    for j in range(n):
        v = _bf16_to_f32(src[j])
        t[j] = v
        d = np.float64(v) - c
        s1 += d
        s2 += d * d
    return c, s1, s2


@njit(inline="always")
def _normalize(xs, mu, r, s, b, has_b, norm, out):
    """out = ((x − μ)·r)·s (+ β) in float32, rounded per op as torch's eager float32 ops are
    (RMSNorm has no μ to subtract; both forms have the same rounding points). A LayerNorm row with
    r < 2^-100 (σ > 1e30), where x − μ may overflow float32, is normalized as
    (s·x − s·μ)·(r/s) with s = 2^-80: the same value, no overflow (as the reference does)."""
    n = out.shape[0]
    if norm == LAYER_NORM and r < _RISK_R:
        rs = r / _SCALE
        for j in range(n):
            v = ((xs[j] * _SCALE - mu * _SCALE) * rs) * s[j]
            out[j] = v + b[j] if has_b else v
    elif norm == LAYER_NORM:
        if has_b:
            for j in range(n):
                out[j] = ((xs[j] - mu) * r) * s[j] + b[j]
        else:
            for j in range(n):
                out[j] = ((xs[j] - mu) * r) * s[j]
    else:
        scale_row(xs, r, s, b, has_b, out)


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


@njit(inline="always")
def _normalize_bf16(xs, mu, r, s, b, has_b, norm, out16):
    """As :func:`_normalize`, converted to bfloat16 bits in the same loop."""
    n = out16.shape[0]
    if norm == LAYER_NORM and r < _RISK_R:
        rs = r / _SCALE
        for j in range(n):
            v = ((xs[j] * _SCALE - mu * _SCALE) * rs) * s[j]
            out16[j] = _f32_to_bf16(v + b[j] if has_b else v)
    elif norm == LAYER_NORM:
        if has_b:
            for j in range(n):
                out16[j] = _f32_to_bf16(((xs[j] - mu) * r) * s[j] + b[j])
        else:
            for j in range(n):
                out16[j] = _f32_to_bf16(((xs[j] - mu) * r) * s[j])
    elif has_b:
        for j in range(n):
            out16[j] = _f32_to_bf16((xs[j] * r) * s[j] + b[j])
    else:
        for j in range(n):
            out16[j] = _f32_to_bf16((xs[j] * r) * s[j])


@njit(fastmath={"reassoc", "contract"})
def _sum_gx(dy, x, s64, n):
    """Σ g·x in float64, g = dy·s (RMSNorm's Σ g·x̂ is r times this)."""
    rt.wide_vectors_bwd()
    acc = 0.0
    for j in range(n):
        acc += (np.float64(dy[j]) * s64[j]) * np.float64(x[j])
    return acc


@njit(fastmath={"reassoc", "contract"})
def _sum_g_gx(dy, x, s64, n, mu):
    """Σ g and Σ g·(x − μ) in float64 (LayerNorm's Σ g·x̂ is r times the second)."""
    rt.wide_vectors_bwd()
    sg = 0.0
    sgx = 0.0
    for j in range(n):
        g = np.float64(dy[j]) * s64[j]
        sg += g
        sgx += g * (np.float64(x[j]) - mu)
    return sg, sgx


# dx is formed in float64 with fused multiply-adds allowed (one rounding fewer, in float64); it is
# rounded once to float32.
@njit(fastmath={"contract"})
def _dx_rms(dy, x, s64, n, k, a, b, out):
    """out_j = a·g_j − b·x_j for j < k, a·g_j after (g = dy·s), in float64, rounded once."""
    rt.wide_vectors_bwd()
    for j in range(k):
        out[j] = np.float32(a * (np.float64(dy[j]) * s64[j]) - b * np.float64(x[j]))
    for j in range(k, n):
        out[j] = np.float32(a * (np.float64(dy[j]) * s64[j]))


@njit(fastmath={"contract"})
def _dx_ln(dy, x, s64, n, mu, a, b, c, out):
    """out_j = a·g_j − b·(x_j − μ) + c (g = dy·s), in float64, rounded once."""
    rt.wide_vectors_bwd()
    mud = np.float64(mu)
    for j in range(n):
        out[j] = np.float32(a * (np.float64(dy[j]) * s64[j]) - b * (np.float64(x[j]) - mud) + c)


# "llama" / "none" products in one pass: v = x·r rounded to c_mul (the input dtype), times the
# scale (already rounded to the output dtype), plus β rounded again, stored in the output dtype
# (which rounds), each rounding where torch's eager ops round. One loop per combination, so that
# each vectorizes (four loops with a rounding pass each measured 1.7-2.4x the gemma forward).
@njit
def _apply_rounded(xs, rr, s, b, has_b, c_mul, y_code, yaddr, n):
    rt.wide_vectors()
    if y_code == F32:
        out = carray(ptr_f32(yaddr), n)
        if c_mul == BF16 and has_b:
            for j in range(n):
                out[j] = _bf16_to_f32(_f32_to_bf16(xs[j] * rr)) * s[j] + b[j]
        elif c_mul == BF16:
            for j in range(n):
                out[j] = _bf16_to_f32(_f32_to_bf16(xs[j] * rr)) * s[j]
        elif c_mul == F16 and has_b:
            for j in range(n):
                out[j] = _f16_to_f32(_f32_to_f16(xs[j] * rr)) * s[j] + b[j]
        elif c_mul == F16:
            for j in range(n):
                out[j] = _f16_to_f32(_f32_to_f16(xs[j] * rr)) * s[j]
        else:
            _apply_rounded_any(xs, rr, s, b, has_b, c_mul, y_code, yaddr, n)
    elif y_code == BF16 and c_mul == BF16:
        out16 = carray(ptr_u16(yaddr), n)
        if has_b:
            for j in range(n):
                v = _bf16_to_f32(_f32_to_bf16(_bf16_to_f32(_f32_to_bf16(xs[j] * rr)) * s[j]))
                out16[j] = _f32_to_bf16(v + b[j])
        else:
            for j in range(n):
                out16[j] = _f32_to_bf16(_bf16_to_f32(_f32_to_bf16(xs[j] * rr)) * s[j])
    elif y_code == F16 and c_mul == F16:
        out16 = carray(ptr_u16(yaddr), n)
        if has_b:
            for j in range(n):
                v = _f16_to_f32(_f32_to_f16(_f16_to_f32(_f32_to_f16(xs[j] * rr)) * s[j]))
                out16[j] = _f32_to_f16(v + b[j])
        else:
            for j in range(n):
                out16[j] = _f32_to_f16(_f16_to_f32(_f32_to_f16(xs[j] * rr)) * s[j])
    else:
        _apply_rounded_any(xs, rr, s, b, has_b, c_mul, y_code, yaddr, n)


@njit
def _apply_rounded_any(xs, rr, s, b, has_b, c_mul, y_code, yaddr, n):
    """:func:`_apply_rounded` for any codes, an element at a time (mixed half dtypes)."""
    rt.wide_vectors()
    t = np.empty(n, np.float32)
    for j in range(n):
        v = _round(_round(xs[j] * rr, c_mul) * s[j], y_code)
        t[j] = _round(v + b[j], y_code) if has_b else v
    _store_row(t, yaddr, n, y_code)


# ----------------------------------------------------------------------------------------------
# The argument block of a call (int64 words), filled by the entry points and read by every block
# ----------------------------------------------------------------------------------------------
_M, _N, _K, _FLAGS, _RPB = 0, 1, 2, 3, 4  # the call's sizes, flags and rows a block
# forward: input, residual, h and y rows (address, row stride), the float32 scale / bias rows,
# the statistics' outputs and ε's bits
_X, _XS, _R, _RS, _H, _Y, _S, _B, _MEAN, _RSTD, _EPS = range(5, 16)
# backward (x, the scale and the statistics as above): dy, dresidual, dx, and the float32 partial
# rows of d weight and d bias
_DY, _DYS, _DR, _DRS, _DX, _PW, _PB = range(16, 23)
_WORDS = 24


_STREAM_PIECE = 1024  # elements of a row normalized into the scratch row, then streamed out


@njit(inline="always")
def _stream_row(src, dst, nbytes):
    """Copy nbytes (even) from the scratch row at src to the output row at dst: the whole 64-byte
    lines of dst with non-temporal stores (:func:`runtime.stream_line`), the rest before and after
    them with ordinary ones."""
    head = min((64 - dst % 64) % 64, nbytes)
    lines = (nbytes - head) // 64
    a = carray(ptr_u8(src), nbytes)
    d = carray(ptr_u8(dst), nbytes)
    for j in range(head):
        d[j] = a[j]
    for j in range(lines):
        rt.stream_line(dst + head + 64 * j, src + head + 64 * j)
    for j in range(head + 64 * lines, nbytes):
        d[j] = a[j]


@njit(inline="always")
def _row(base, n, i):
    """Scratch row i of n float32s at base, a view without an owner: such arrays are passed between
    functions without reference counting (atomic increments: ~15 ns a row measured)."""
    return carray(ptr_f32(base + 4 * i * n), n)


# ----------------------------------------------------------------------------------------------
# Forward: RMSNorm (optionally with the residual add) and LayerNorm, rows [lo, hi)
# ----------------------------------------------------------------------------------------------
@njit
def _fwd_rows(A, lo, hi, tx, ty, zaddr):
    rt.wide_vectors()
    m, n, k, flags = A[_M], A[_N], A[_K], A[_FLAGS]
    x_code, r_code, y_code = _field(flags, FX), _field(flags, FR), _field(flags, FY)
    has_res, norm, eps_mode = _field(flags, FHAS_RES), _field(flags, FNORM), _field(flags, FEPS)
    c_pre, c_r = _field(flags, FC_PRE), _field(flags, FC_R)
    c_mul, c_out = _field(flags, FC_MUL), _field(flags, FC_OUT)
    has_b = _field(flags, FHAS_B) == 1
    stream = _field(flags, FSTREAM) == 1  # rows are written to zaddr, then streamed out
    eps = bits_f64(A[_EPS])
    s = carray(ptr_f32(A[_S]), n)
    b = carray(ptr_f32(A[_B]), n)  # not read without a bias
    mean = carray(ptr_f32(A[_MEAN]), m)  # LayerNorm only
    rstd = carray(ptr_f32(A[_RSTD]), m)
    xb, xs = A[_X], A[_XS] * _esize(x_code)
    rb, rs = A[_R], A[_RS] * _esize(r_code)
    hb, yb = A[_H], A[_Y]
    fused = c_pre == F32 and c_r == F32 and c_mul == F32 and c_out == F32
    for i in range(lo, hi):
        if has_res:
            xs_ = _load_row(xb + i * xs, n, x_code, tx)
            if x_code == F32:  # xs_ is a view of x: copy before adding in place
                for j in range(n):
                    tx[j] = xs_[j]
                xs_ = tx[:n]
            _add_row(rb + i * rs, n, r_code, xs_)
            _round_row(xs_, n, r_code)
            if stream:
                _store_row(xs_, zaddr, n, r_code)
                _stream_row(zaddr, hb + i * n * _esize(r_code), n * _esize(r_code))
            else:
                _store_row(xs_, hb + i * n * _esize(r_code), n, r_code)
        elif x_code == BF16:  # convert and reduce in the pass that reads the row
            xs_ = tx[:n]
            xrow = carray(ptr_u16(xb + i * xs), n)
            if norm == RMS_NORM:
                ss = _load_bf16_sum_squares(xrow, xs_, n, k)
                if ss < _TINY:
                    ss = _sum_squares32(xs_, k)
            else:
                cc, s1, s2 = _load_bf16_shifted_sums(xrow, xs_, n)
        else:
            xs_ = _load_row(xb + i * xs, n, x_code, tx)

        mu = np.float32(0.0)
        if norm == LAYER_NORM:
            if has_res or x_code != BF16:
                cc = np.float64(xs_[0])
                s1, s2 = _shifted_sums(xs_, n, cc)
            mu, var = _moments(xs_, n, cc, s1, s2)
            r = np.float32(1.0 / np.sqrt(var + eps))
            mean[i] = mu
        else:
            if has_res or x_code != BF16:
                ss = _sum_squares(xs_, k)
            r = _rstd(ss, k, eps, eps_mode == RMS)
        rstd[i] = r

        yaddr = zaddr if stream else yb + i * n * _esize(y_code)
        if fused and stream and (y_code == F32 or y_code == BF16):
            # a piece of the row at a time through the scratch row, which stays in L1 with it
            ye = _esize(y_code)
            for c0 in range(0, n, _STREAM_PIECE):
                c1 = min(n, c0 + _STREAM_PIECE)
                if y_code == F32:
                    out = carray(ptr_f32(zaddr), c1 - c0)
                    _normalize(xs_[c0:c1], mu, r, s[c0:c1], b[c0:c1], has_b, norm, out)
                else:
                    out16 = carray(ptr_u16(zaddr), c1 - c0)
                    _normalize_bf16(xs_[c0:c1], mu, r, s[c0:c1], b[c0:c1], has_b, norm, out16)
                _stream_row(zaddr, yb + (i * n + c0) * ye, (c1 - c0) * ye)
            continue
        if fused:  # statistics and products in float32, one conversion at the store
            if y_code == F32:
                _normalize(xs_, mu, r, s, b, has_b, norm, carray(ptr_f32(yaddr), n))
            elif y_code == BF16:
                _normalize_bf16(xs_, mu, r, s, b, has_b, norm, carray(ptr_u16(yaddr), n))
            else:
                _normalize(xs_, mu, r, s, b, has_b, norm, ty[:n])
                _store_row(ty, yaddr, n, y_code)
        elif (c_pre == F32 or (x_code == c_pre and not has_res)) and c_out == y_code:
            # "llama" / "none" with half inputs, one pass (the input is already in c_pre)
            _apply_rounded(xs_, _round(r, c_r), s, b, has_b, c_mul, y_code, yaddr, n)
        else:  # the rest, with a residual in another dtype: round where torch's eager ops round
            if c_pre != F32:
                for j in range(n):
                    ty[j] = xs_[j]
                _round_row(ty, n, c_pre)
                xs_ = ty[:n]
            rr = _round(r, c_r)
            for j in range(n):
                ty[j] = xs_[j] * rr
            _round_row(ty, n, c_mul)
            for j in range(n):
                ty[j] = ty[j] * s[j]
            _round_row(ty, n, c_out)
            if has_b:
                for j in range(n):
                    ty[j] = ty[j] + b[j]
                _round_row(ty, n, c_out)
            _store_row(ty, yaddr, n, y_code)
        if stream:
            _stream_row(zaddr, yb + i * n * _esize(y_code), n * _esize(y_code))
    if stream:
        rt.stream_fence()


# ----------------------------------------------------------------------------------------------
# Backward: dx for every row, d weight / d bias as per-block partial rows summed in a fixed order
# ----------------------------------------------------------------------------------------------
@njit
def _bwd_block(A, blk, tx, tdy, tdx):
    rt.wide_vectors_bwd()
    m, n, k, flags = A[_M], A[_N], A[_K], A[_FLAGS]
    dy_code, x_code, dr_code = _field(flags, BDY), _field(flags, BX), _field(flags, BDR)
    has_dr, norm, eps_mode = _field(flags, BHAS_DR), _field(flags, BNORM), _field(flags, BEPS)
    c_xhat = _field(flags, BC_XHAT)
    need_dw, need_db = _field(flags, BNEED_DW) == 1, _field(flags, BNEED_DB) == 1
    s64 = carray(ptr_f64(A[_S]), n)
    mean = carray(ptr_f32(A[_MEAN]), m)  # LayerNorm only
    rstd = carray(ptr_f32(A[_RSTD]), m)
    pw = carray(ptr_f32(A[_PW] + 4 * blk * n), n)  # this block's partial rows (when needed)
    pb = carray(ptr_f32(A[_PB] + 4 * blk * n), n)
    if need_dw:
        pw[:] = 0.0
    if need_db:
        pb[:] = 0.0
    xb, xs = A[_X], A[_XS] * _esize(x_code)
    dyb, dys_ = A[_DY], A[_DYS] * _esize(dy_code)
    drb, drs = A[_DR], A[_DRS] * _esize(dr_code)
    dxb = A[_DX]
    rpb = A[_RPB]
    stream = _field(flags, BSTREAM) == 1  # dx rows streamed out of a scratch row
    direct = x_code == F32 and not has_dr and not stream  # dx goes straight to the output row
    for i in range(blk * rpb, min(m, (blk + 1) * rpb)):
        xs_ = _load_row(xb + i * xs, n, x_code, tx)
        dys = _load_row(dyb + i * dys_, n, dy_code, tdy)
        r = rstd[i]
        rd = np.float64(r)
        # dx = a·g − b·(x − μ) + c, formed in float64 and rounded once: its terms can nearly cancel
        # (a row dominated by one element, N = 1), where float32 products would lose the difference.
        if norm == LAYER_NORM:
            # dx = r·(g − mean(g) − x̂·mean(g·x̂)), x̂ = (x − μ)·r
            mu = mean[i]
            sg, sgx = _sum_g_gx(dys, xs_, s64, n, np.float64(mu))
            a, b, cc = rd, rd * rd * (rd * sgx / n), -rd * (sg / n)
            if rd == np.inf:  # eps = 0, σ² = 0: x̂ is ±inf (or NaN), so mean(g·x̂) is NaN, as torch's
                a = b = cc = np.nan
        else:
            # dx = r·g − m_j·x̂·f, f = r·S/k ("mean_square") or S/(k·s) ("rms", 0 where s = 0),
            # S = Σ g·x̂, m_j = 1 for the first k elements
            mu = np.float32(0.0)
            sx = rd * _sum_gx(dys, xs_, s64, n)
            if eps_mode == MEAN_SQUARE:
                f = rd * sx / k
            else:
                root = np.sqrt(_sum_squares(xs_, k) / k)
                f = sx / (k * root) if root > 0.0 else 0.0
            a, b, cc = rd, rd * f, 0.0  # (cc unused)
        out = carray(ptr_f32(dxb + i * n * 4), n) if direct else tdx[:n]
        if norm == LAYER_NORM:
            _dx_ln(dys, xs_, s64, n, mu, a, b, cc, out)
        else:
            _dx_rms(dys, xs_, s64, n, k, a, b, out)
        # d weight and d bias partials in float32, x̂ = (x − μ)·r rounded as the reference rounds it
        # (to the input dtype in "llama" mode). A separate pass over the cached row costs no more
        # than fusing it into dx's (measured); LayerNorm's two partials share one pass.
        db_done = False
        if need_dw:
            if c_xhat == BF16 and norm == RMS_NORM:  # "llama": x̂ rounded as the forward did
                for j in range(n):
                    pw[j] += dys[j] * _bf16_to_f32(_f32_to_bf16(xs_[j] * r))
            elif c_xhat == F16 and norm == RMS_NORM:
                for j in range(n):
                    pw[j] += dys[j] * _f16_to_f32(_f32_to_f16(xs_[j] * r))
            elif c_xhat != F32:
                for j in range(n):
                    pw[j] += dys[j] * _round((xs_[j] - mu) * r, c_xhat)
            elif norm == LAYER_NORM and r < _RISK_R:  # x − μ may overflow: as _normalize
                rs = r / _SCALE
                for j in range(n):
                    pw[j] += dys[j] * ((xs_[j] * _SCALE - mu * _SCALE) * rs)
            elif norm == LAYER_NORM and need_db:  # LayerNorm's usual case: both in one pass
                for j in range(n):
                    d = dys[j]
                    pw[j] += d * ((xs_[j] - mu) * r)
                    pb[j] += d
                db_done = True
            elif norm == LAYER_NORM:
                for j in range(n):
                    pw[j] += dys[j] * ((xs_[j] - mu) * r)
            else:
                for j in range(n):
                    pw[j] += dys[j] * (xs_[j] * r)
        if need_db and not db_done:
            for j in range(n):
                pb[j] += dys[j]
        if not direct:
            if has_dr:
                _add_row(drb + i * drs, n, dr_code, tdx)
            dst = dxb + i * n * _esize(x_code)
            if stream and x_code == F32:
                _stream_row(np.int64(tdx.ctypes.data), dst, 4 * n)
            elif stream:  # converted in tdy's scratch row, free once the row's partials are done
                _store_row(tdx, np.int64(tdy.ctypes.data), n, x_code)
                _stream_row(np.int64(tdy.ctypes.data), dst, n * _esize(x_code))
            else:
                _store_row(tdx, dst, n, x_code)
    if stream:
        rt.stream_fence()


@njit
def _partials(nb, n, need):
    """A block's float32 partial row of d weight or d bias for each of nb blocks (none if not
    needed)."""
    rt.wide_vectors_bwd()
    return np.empty(nb * n if need else 0, np.float32)


@njit
def _reduce_grads(pw, pb, nb, n, dwp, dw_code, dbp, db_code):
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
        _store_row(t, addr, n, code)


# ----------------------------------------------------------------------------------------------
# Entry points: compiled with one signature each, loaded from numba's on-disk cache where possible
# ----------------------------------------------------------------------------------------------
ENTRIES = rt.Entries(__file__)
_i, _f = types.int64, types.float64
# The block functions that the threads of a shared call run (runtime.run_blocks), in the task
# blocks' slots where the entry points find them
_FWD_SLOT, _BWD_SLOT = 0, 1


def _fwd_task(args, blk, scratch):
    A = carray(ptr_i64(args), _WORDS)
    n, rpb = A[_N], A[_RPB]
    lo, hi = blk * rpb, min(A[_M], (blk + 1) * rpb)
    _fwd_rows(A, lo, hi, _row(scratch, n, 0), _row(scratch, n, 1), scratch + 8 * n)


def _bwd_task(args, blk, scratch):
    A = carray(ptr_i64(args), _WORDS)
    n = A[_N]
    _bwd_block(A, blk, _row(scratch, n, 0), _row(scratch, n, 1), _row(scratch, n, 2))


FWD_BLOCK = rt.register_block(_FWD_SLOT, ENTRIES.block(_fwd_task))
BWD_BLOCK = rt.register_block(_BWD_SLOT, ENTRIES.block(_bwd_task))


@ENTRIES.entry(*(_i,) * 16, _f, _f, _i)
def forward(
    ctrl, xp, xs, rp, rs, hp, yp, wp, ws, bp, bs, meanp, rstdp, m, n, k, eps, offset, flags
):
    """RMSNorm (with the residual add where has_res) or LayerNorm over m rows of n elements; y, h,
    mean and rstd are contiguous outputs. ctrl: a pool's task block or an OpenMP launch
    (:mod:`.pool`), or 0 to run alone."""
    w_code, has_w, b_code = _field(flags, FW), _field(flags, FHAS_W) == 1, _field(flags, FB)
    has_b, c_param = _field(flags, FHAS_B) == 1, _field(flags, FC_PARAM)
    sp, bp_, owner = _param_rows(n, wp, ws, w_code, has_w, bp, bs, b_code, has_b, offset, c_param)
    rpb = max(1, 16384 // n)  # ~16 K elements a block
    A = np.empty(_WORDS, np.int64)
    A[_M], A[_N], A[_K], A[_FLAGS], A[_RPB] = m, n, k, flags, rpb
    A[_X], A[_XS], A[_R], A[_RS], A[_H], A[_Y] = xp, xs, rp, rs, hp, yp
    A[_S], A[_B], A[_MEAN], A[_RSTD], A[_EPS] = sp, bp_, meanp, rstdp, f64_bits(eps)
    if ctrl == 0:  # alone: every row in one pass (rows are independent: the same results)
        scratch = np.empty(3 * n + 16, np.float32)  # three rows, the last 64-byte aligned
        base = np.int64(scratch.ctypes.data)
        _fwd_rows(A, 0, m, _row(base, n, 0), _row(base, n, 1), (base + 8 * n + 63) // 64 * 64)
        scratch[:0] = 0.0
    else:
        nb = (m + rpb - 1) // rpb
        args = np.int64(A.ctypes.data)
        rt.run_blocks(ctrl, rt.block_fn(ctrl, _FWD_SLOT), args, nb, 3 * n)
    # numba frees an array after its last use: this keeps the rows until every block is done
    owner[:0] = 0.0
    A[:0] = 0


@njit
def _bwd_rows_per_block(m, n):
    rt.wide_vectors_bwd()
    # ≥ 16 rows (the float32 partial rows of d weight are then ≤ 1/16 of the input), ~16 K elements
    # where rows are short, and at most 64 blocks: the caller sums the partial rows alone (64·N
    # additions: ~0.1 ms at N = 4096, where 8192 × 4096 in blocks of 16 rows left it 512·N,
    # ~1-2 ms of a 15 ms call on two threads). Fixed by the sizes alone: d weight is summed in the
    # same order on any number of threads.
    return max(16, (16384 + n - 1) // n, (m + 63) // 64)


@ENTRIES.entry(*(_i,) * 17, _f, _i)
def backward(
    ctrl, dyp, dys, xp, xs, drp, drs, dxp, wp, ws, meanp, rstdp, dwp, dbp, m, n, k, offset, flags
):
    """dx (contiguous, x's dtype) for m rows; dw / db (contiguous (N,), their codes) where needed.
    x is the normalized input (h for add_rms_norm); dresidual, where given, is added to dx."""
    sp, _, owner = _param_rows(
        n, wp, ws, _field(flags, BW), _field(flags, BHAS_W) == 1, 0, 0, F32, False, offset, F32
    )
    s32 = carray(ptr_f32(sp), n)
    s64 = np.empty(n, np.float64)  # the scale in float64: every element's g = dy·s is exact
    for j in range(n):
        s64[j] = s32[j]
    need_dw, need_db = _field(flags, BNEED_DW), _field(flags, BNEED_DB)
    rpb = _bwd_rows_per_block(m, n)
    nb = (m + rpb - 1) // rpb
    pw, pb = _partials(nb, n, need_dw), _partials(nb, n, need_db)
    A = np.empty(_WORDS, np.int64)
    A[_M], A[_N], A[_K], A[_FLAGS], A[_RPB] = m, n, k, flags, rpb
    A[_DY], A[_DYS], A[_X], A[_XS], A[_DR], A[_DRS], A[_DX] = dyp, dys, xp, xs, drp, drs, dxp
    A[_S], A[_MEAN], A[_RSTD] = s64.ctypes.data, meanp, rstdp
    A[_PW], A[_PB] = pw.ctypes.data, pb.ctypes.data
    if ctrl == 0:  # alone: the same blocks, in order, with one scratch
        scratch = np.empty(3 * n, np.float32)
        base = np.int64(scratch.ctypes.data)
        for blk in range(nb):
            _bwd_block(A, blk, _row(base, n, 0), _row(base, n, 1), _row(base, n, 2))
        scratch[:0] = 0.0
    else:
        args = np.int64(A.ctypes.data)
        rt.run_blocks(ctrl, rt.block_fn(ctrl, _BWD_SLOT), args, nb, 3 * n)
    A[:0] = 0
    owner[:0] = 0.0
    s64[:0] = 0.0  # keep the scale rows until every block is done
    _reduce_grads(pw, pb, nb, n, dwp, _field(flags, BDW), dbp, _field(flags, BDB))
