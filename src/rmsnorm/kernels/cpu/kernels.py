"""The CPU kernels (numba): RMSNorm / LayerNorm forward and backward, parallel over blocks of rows.

Every tensor reaches a kernel as a flat 1-D array of its storage plus a row stride, in two typed
views of which one is used: float32 data as ``float32``, bfloat16 / float16 as their raw 16-bit
patterns (``uint16``), converted here with torch's rounding (round to nearest even). The dtype is a
runtime code, so each kernel compiles to exactly one specialisation whatever the dtype mix. All
numba code lives in this one file: numba's on-disk cache does not notice edits to other modules
that a cached function calls.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

# dtype codes (shared with the launchers)
F32, BF16, F16 = 0, 1, 2
# what a row is normalized by
RMS_NORM, LAYER_NORM = 0, 1
# where ε goes in RMSNorm
MEAN_SQUARE, RMS = 0, 1

_I16, _I32, _F32 = ir.IntType(16), ir.IntType(32), ir.FloatType()


def _c(v: int) -> ir.Constant:
    return ir.Constant(_I32, v)


# ----------------------------------------------------------------------------------------------
# Bit conversions, written as LLVM IR so that every step is a 32-bit integer or float op that the
# loop vectorizer turns into AVX2 / NEON lanes (numba would widen integer arithmetic to 64 bits).
# ----------------------------------------------------------------------------------------------
@intrinsic
def _bf16_to_f32(typingctx, h):
    """bfloat16 bits -> float32 (exact: the bits are the high half of the float32)."""
    if h != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.shl(builder.zext(args[0], _I32), _c(16)), _F32)

    return types.float32(types.uint16), codegen


@intrinsic
def _f32_to_bf16(typingctx, f):
    """float32 -> bfloat16 bits, round to nearest even as ``c10::BFloat16``; NaN -> 0x7FC0."""
    if f != types.float32:
        return None

    def codegen(context, builder, sig, args):
        (x,) = args
        # NaN is replaced by the quiet NaN before rounding (which leaves 0x7FC00000 as 0x7FC0):
        # a blend of 32-bit lanes, cheaper than blending the 16-bit results (measured 10%)
        u = builder.bitcast(x, _I32)
        u = builder.select(builder.fcmp_unordered("uno", x, x), _c(0x7FC00000), u)
        lsb = builder.and_(builder.lshr(u, _c(16)), _c(1))
        r = builder.lshr(builder.add(builder.add(u, _c(0x7FFF)), lsb), _c(16))
        return builder.trunc(r, _I16)

    return types.uint16(types.float32), codegen


@intrinsic
def _f16_to_f32(typingctx, h):
    """float16 bits -> float32, exact for normals, subnormals, ±inf and NaN (payload kept)."""
    if h != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        h32 = builder.zext(args[0], _I32)
        sign = builder.shl(builder.and_(h32, _c(0x8000)), _c(16))
        em = builder.and_(h32, _c(0x7FFF))  # exponent and mantissa
        shifted = builder.shl(em, _c(13))
        normal = builder.add(shifted, _c((127 - 15) << 23))  # rebias the exponent
        infnan = builder.or_(shifted, _c(0x7F800000))
        # subnormal (and zero): em · 2^-24, exact in float32
        sub = builder.fmul(builder.uitofp(em, _F32), ir.Constant(_F32, 2.0**-24))
        sub = builder.bitcast(sub, _I32)
        r = builder.select(builder.icmp_unsigned(">=", em, _c(0x7C00)), infnan, normal)
        r = builder.select(builder.icmp_unsigned("<", em, _c(0x0400)), sub, r)
        return builder.bitcast(builder.or_(r, sign), _F32)

    return types.float32(types.uint16), codegen


@intrinsic
def _f32_to_f16(typingctx, f):
    """float32 -> float16 bits, round to nearest even (IEEE, as ``c10::Half``): overflow -> ±inf,
    NaN -> ±0x7E00, subnormals rounded by the float adder (|x| + 0.5 has a 2^-24 ulp)."""
    if f != types.float32:
        return None

    def codegen(context, builder, sig, args):
        u = builder.bitcast(args[0], _I32)
        sign = builder.and_(builder.lshr(u, _c(16)), _c(0x8000))
        a = builder.and_(u, _c(0x7FFFFFFF))
        big = builder.select(builder.icmp_unsigned(">", a, _c(0x7F800000)), _c(0x7E00), _c(0x7C00))
        sub = builder.fadd(builder.bitcast(a, _F32), ir.Constant(_F32, 0.5))
        sub = builder.sub(builder.bitcast(sub, _I32), _c(0x3F000000))
        odd = builder.and_(builder.lshr(a, _c(13)), _c(1))
        # rebias (15 - 127 << 23, mod 2^32), add 0xFFF + odd: round to nearest even, carry into the
        # exponent (65520 and up become inf, as they should)
        normal = builder.lshr(builder.add(builder.add(a, _c(0xC8000FFF)), odd), _c(13))
        r = builder.select(builder.icmp_unsigned("<", a, _c(0x38800000)), sub, normal)
        r = builder.select(builder.icmp_unsigned(">=", a, _c(0x47800000)), big, r)
        return builder.trunc(builder.or_(r, sign), _I16)

    return types.uint16(types.float32), codegen


# ----------------------------------------------------------------------------------------------
# Row helpers. A row is n elements starting at `base` of a flat array; `t` arguments are fp32
# scratch rows private to one block of rows (they stay in L1/L2: extra passes over them are cheap).
# ----------------------------------------------------------------------------------------------
@njit
def _load_row(f32, u16, base, n, code, t):
    """The row as float32: a view of the input for float32, else converted into t."""
    if code == F32:
        return f32[base : base + n]
    src = u16[base : base + n]
    if code == BF16:
        for j in range(n):
            t[j] = _bf16_to_f32(src[j])
    else:
        for j in range(n):
            t[j] = _f16_to_f32(src[j])
    return t[:n]


@njit
def _add_row(f32, u16, base, n, code, t):
    """t += the row (float32 sum)."""
    if code == F32:
        src = f32[base : base + n]
        for j in range(n):
            t[j] = t[j] + src[j]
    elif code == BF16:
        src16 = u16[base : base + n]
        for j in range(n):
            t[j] = t[j] + _bf16_to_f32(src16[j])
    else:
        src16 = u16[base : base + n]
        for j in range(n):
            t[j] = t[j] + _f16_to_f32(src16[j])


@njit
def _round_row(t, n, code):
    """Round t in place to the dtype `code` (what a torch op in that dtype does to its result)."""
    if code == BF16:
        for j in range(n):
            t[j] = _bf16_to_f32(_f32_to_bf16(t[j]))
    elif code == F16:
        for j in range(n):
            t[j] = _f16_to_f32(_f32_to_f16(t[j]))


@njit
def _round(v, code):
    if code == BF16:
        return _bf16_to_f32(_f32_to_bf16(v))
    if code == F16:
        return _f16_to_f32(_f32_to_f16(v))
    return v


@njit
def _store_row(t, f32, u16, base, n, code):
    """Write the float32 row t to the output row, converting to the output dtype."""
    if code == F32:
        dst = f32[base : base + n]
        for j in range(n):
            dst[j] = t[j]
    elif code == BF16:
        dst16 = u16[base : base + n]
        for j in range(n):
            dst16[j] = _f32_to_bf16(t[j])
    else:
        dst16 = u16[base : base + n]
        for j in range(n):
            dst16[j] = _f32_to_f16(t[j])


# Reductions are accumulated in float64 (the statistics come out as the correctly rounded fp32
# values in practice) and may be reassociated, so LLVM vectorizes them. Nothing else is fastmath:
# the element-wise products round exactly as torch's eager ops do.
@njit(fastmath={"reassoc", "contract"})
def _sum_squares(x, k):
    acc = 0.0
    for j in range(k):
        v = np.float64(x[j])
        acc += v * v
    return acc


@njit(fastmath={"reassoc", "contract"})
def _shifted_sums(x, n, c):
    """Σ (x − c) and Σ (x − c)² in float64; with c = x[0] the variance from them has no cancellation
    unless the row's spread is tiny next to |x[0] − mean|."""
    s1 = 0.0
    s2 = 0.0
    for j in range(n):
        d = np.float64(x[j]) - c
        s1 += d
        s2 += d * d
    return s1, s2


@njit(fastmath={"reassoc", "contract"})
def _load_bf16_sum_squares(src, t, n, k):
    """t = the bfloat16 row as float32, and Σ_{j<k} t_j² (float64): one pass over the input."""
    acc = 0.0
    for j in range(k):
        v = _bf16_to_f32(src[j])
        t[j] = v
        d = np.float64(v)
        acc += d * d
    for j in range(k, n):
        t[j] = _bf16_to_f32(src[j])
    return acc


@njit(fastmath={"reassoc", "contract"})
def _load_bf16_shifted_sums(src, t, n):
    """t = the bfloat16 row as float32, and :func:`_shifted_sums` of it about c = t[0]: one pass."""
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


@njit
def _normalize(xs, mu, r, s, b, has_b, norm, out):
    """out = ((x − μ)·r)·s (+ β) in float32, rounded per op as torch's eager float32 ops are
    (RMSNorm has no μ to subtract; both forms have the same rounding points)."""
    n = out.shape[0]
    if norm == LAYER_NORM:
        if has_b:
            for j in range(n):
                out[j] = ((xs[j] - mu) * r) * s[j] + b[j]
        else:
            for j in range(n):
                out[j] = ((xs[j] - mu) * r) * s[j]
    elif has_b:
        for j in range(n):
            out[j] = (xs[j] * r) * s[j] + b[j]
    else:
        for j in range(n):
            out[j] = (xs[j] * r) * s[j]


@njit
def _normalize_bf16(xs, mu, r, s, b, has_b, norm, out16):
    """As :func:`_normalize`, converted to bfloat16 bits in the same loop."""
    n = out16.shape[0]
    if norm == LAYER_NORM:
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
def _grad_sums(dy, x, s, n, mu, r):
    """Σ g and Σ g·x̂ in float64 with g = dy·s and x̂ = (x − μ)·r (each product exact in float64)."""
    sg = 0.0
    sgx = 0.0
    for j in range(n):
        g = np.float64(dy[j]) * s[j]
        sg += g
        sgx += g * ((np.float64(x[j]) - mu) * r)
    return sg, sgx


# ----------------------------------------------------------------------------------------------
# Forward: RMSNorm (optionally with the residual add) and LayerNorm
# ----------------------------------------------------------------------------------------------
@njit(parallel=True, cache=True)
def forward(
    xf, xu, x_stride, x_code,  # input x: flat views, row stride (elements), dtype code
    rf, ru, r_stride, r_code, has_res,  # residual (add_rms_norm); h = x + residual has its dtype
    hf, hu,  # (M·N,) h output, contiguous (add_rms_norm only)
    yf, yu, y_code,  # (M·N,) y output, contiguous
    s, b, has_b,  # (N,) float32: scale (offset + γ; ones without a weight: ×1 is exact), bias
    mean, rstd,  # (M,) float32 outputs (mean: LayerNorm only)
    m, n, k, eps,  # rows, row length, RMS over the first k elements, ε
    norm, eps_mode,  # RMS_NORM / LAYER_NORM; MEAN_SQUARE / RMS
    c_pre, c_r, c_mul, c_out,  # rounding points (dtype codes, F32 = none): input, r, x·r, ×s / +β
    rows_per_block,
):  # fmt: skip
    nblocks = (m + rows_per_block - 1) // rows_per_block
    fused = c_pre == F32 and c_r == F32 and c_mul == F32 and c_out == F32
    for blk in prange(nblocks):
        tx = np.empty(n, np.float32)  # the input row as float32
        ty = np.empty(n, np.float32)  # the output row before conversion
        for i in range(blk * rows_per_block, min(m, (blk + 1) * rows_per_block)):
            if has_res:
                xs = _load_row(xf, xu, i * x_stride, n, x_code, tx)
                if x_code == F32:  # xs is a view of x: copy before adding in place
                    for j in range(n):
                        tx[j] = xs[j]
                    xs = tx
                _add_row(rf, ru, i * r_stride, n, r_code, xs)
                _round_row(xs, n, r_code)
                _store_row(xs, hf, hu, i * n, n, r_code)
            elif x_code == BF16:  # convert and reduce in the pass that reads the row
                xs = tx[:n]
                xrow = xu[i * x_stride : i * x_stride + n]
                if norm == RMS_NORM:
                    ss = _load_bf16_sum_squares(xrow, xs, n, k)
                else:
                    c, s1, s2 = _load_bf16_shifted_sums(xrow, xs, n)
            else:
                xs = _load_row(xf, xu, i * x_stride, n, x_code, tx)

            mu = np.float32(0.0)
            if norm == LAYER_NORM:
                if has_res or x_code != BF16:
                    c = np.float64(xs[0])
                    s1, s2 = _shifted_sums(xs, n, c)
                var = max((s2 - s1 * s1 / n) / n, 0.0)
                mu = np.float32(c + s1 / n)
                r = np.float32(1.0 / np.sqrt(var + eps))
                mean[i] = mu
            else:
                if has_res or x_code != BF16:
                    ss = _sum_squares(xs, k)
                ms = ss / k
                if eps_mode == MEAN_SQUARE:
                    r = np.float32(1.0 / np.sqrt(ms + eps))
                else:
                    r = np.float32(1.0 / (np.sqrt(ms) + eps))
            rstd[i] = r

            ob = i * n
            if fused:  # statistics and products in float32, one conversion at the store
                if y_code == F32:
                    _normalize(xs, mu, r, s, b, has_b, norm, yf[ob : ob + n])
                elif y_code == BF16:
                    _normalize_bf16(xs, mu, r, s, b, has_b, norm, yu[ob : ob + n])
                else:
                    _normalize(xs, mu, r, s, b, has_b, norm, ty[:n])
                    _store_row(ty, yf, yu, ob, n, y_code)
            else:  # "llama" / "none" with half inputs: round where torch's eager ops round
                if c_pre != F32:
                    for j in range(n):
                        ty[j] = xs[j]
                    _round_row(ty, n, c_pre)
                    xs = ty
                rr = _round(r, c_r)
                for j in range(n):
                    ty[j] = xs[j] * rr
                _round_row(ty, n, c_mul)
                for j in range(n):
                    ty[j] = ty[j] * s[j]
                _round_row(ty, n, c_out)
                if has_b:
                    for j in range(n):
                        ty[j] = ty[j] + b[j]
                    _round_row(ty, n, c_out)
                _store_row(ty, yf, yu, ob, n, y_code)


# ----------------------------------------------------------------------------------------------
# Backward: dx for every row, d weight / d bias as per-block partials summed in a fixed order
# ----------------------------------------------------------------------------------------------
@njit(parallel=True, cache=True)
def backward(
    dyf, dyu, dy_stride, dy_code,  # incoming gradient dy
    xf, xu, x_stride, x_code,  # the normalized input (h for add_rms_norm); dx gets its dtype
    drf, dru, dr_stride, dr_code, has_dr,  # gradient reaching h directly (add_rms_norm): + dx
    dxf, dxu,  # (M·N,) dx output, contiguous
    s,  # (N,) float32: offset + γ (ones without a weight)
    mean, rstd,  # (M,) float32 statistics saved by the forward (mean: LayerNorm only)
    m, n, k, norm, eps_mode,  # as in forward; k < n masks the RMS correction to the first k
    c_xhat,  # dtype x̂ is rounded to in d weight ("llama": the input dtype; else F32)
    need_dw, need_db,
    rows_per_block,  # fixed by M alone: the d weight sum order does not depend on the threads
    dw, db,  # (N,) float64 outputs
):  # fmt: skip
    nblocks = (m + rows_per_block - 1) // rows_per_block
    pw = np.zeros((nblocks if need_dw else 0, n), np.float32)  # per-block partial sums
    pb = np.zeros((nblocks if need_db else 0, n), np.float32)
    for blk in prange(nblocks):
        tx = np.empty(n, np.float32)
        tdy = np.empty(n, np.float32)
        tdx = np.empty(n, np.float32)
        for i in range(blk * rows_per_block, min(m, (blk + 1) * rows_per_block)):
            xs = _load_row(xf, xu, i * x_stride, n, x_code, tx)
            dys = _load_row(dyf, dyu, i * dy_stride, n, dy_code, tdy)
            r = rstd[i]
            mu = mean[i] if norm == LAYER_NORM else np.float32(0.0)
            rd = np.float64(r)
            mud = np.float64(mu)
            sg, sgx = _grad_sums(dys, xs, s, n, mud, rd)
            # dx is formed in float64 and rounded once: its two terms can nearly cancel (a row
            # dominated by one element, N = 1), where float32 products would lose the difference.
            if norm == LAYER_NORM:
                # dx = r·(g − mean(g) − x̂·mean(g·x̂))
                mg = sg / n
                mgx = sgx / n
                for j in range(n):
                    g = np.float64(dys[j]) * s[j]
                    tdx[j] = np.float32(rd * ((g - mg) - ((np.float64(xs[j]) - mud) * rd) * mgx))
            else:
                # dx = r·g − m_j·x̂·c, c = r·S/k ("mean_square") or S/(k·s) ("rms", 0 where s = 0)
                if eps_mode == MEAN_SQUARE:
                    cf = rd * sgx / k
                else:
                    root = np.sqrt(_sum_squares(xs, k) / k)
                    cf = sgx / (k * root) if root > 0.0 else 0.0
                for j in range(k):
                    g = np.float64(dys[j]) * s[j]
                    tdx[j] = np.float32(rd * g - (np.float64(xs[j]) * rd) * cf)
                for j in range(k, n):
                    tdx[j] = np.float32(rd * (np.float64(dys[j]) * s[j]))
            if has_dr:
                _add_row(drf, dru, i * dr_stride, n, dr_code, tdx)
            _store_row(tdx, dxf, dxu, i * n, n, x_code)

            if need_dw:
                acc = pw[blk]
                if c_xhat == F32:
                    for j in range(n):
                        acc[j] += dys[j] * ((xs[j] - mu) * r)
                else:
                    for j in range(n):
                        acc[j] += dys[j] * _round((xs[j] - mu) * r, c_xhat)
            if need_db:
                accb = pb[blk]
                for j in range(n):
                    accb[j] += dys[j]

    # Sum the partials over blocks in block order, parallel over column chunks.
    chunk = 256
    for cblk in prange((n + chunk - 1) // chunk):
        lo = cblk * chunk
        hi = min(n, lo + chunk)
        if need_dw:
            for j in range(lo, hi):
                dw[j] = 0.0
            for blk in range(nblocks):
                row = pw[blk]
                for j in range(lo, hi):
                    dw[j] += np.float64(row[j])
        if need_db:
            for j in range(lo, hi):
                db[j] = 0.0
            for blk in range(nblocks):
                rowb = pb[blk]
                for j in range(lo, hi):
                    db[j] += np.float64(rowb[j])
