"""The CPU kernels (numba): the maths of RMSNorm / LayerNorm forward and backward over blocks of
rows.

Every tensor reaches a kernel as an address, a row stride and a dtype code; bfloat16 / float16
rows are read as their raw 16-bit patterns and converted with torch's rounding (round to nearest
even) by the row toolkit, :mod:`.rows`. Dtypes and options are runtime codes, the bit fields of
one ``flags`` argument (:mod:`.flags`), so each entry point compiles to exactly one
specialisation. The threads that share a call are :mod:`.runtime`'s.
"""

from __future__ import annotations

import numpy as np
from numba import carray, types

from . import flags as flag
from . import rows
from . import runtime as rt
from .flags import BF16, F16, F32, LAYER_NORM, MEAN_SQUARE, RMS, RMS_NORM
from .rows import (
    TINY,
    add_row,
    bf16_to_f32,
    bwd_rows_per_block,
    dx_rms,
    esize,
    f16_to_f32,
    f32_to_bf16,
    f32_to_f16,
    field,
    load_bf16_sum_squares,
    load_row,
    param_rows,
    partials,
    reduce_grads,
    rms_rstd,
    round_row,
    rounded,
    scale_row,
    scratch_row,
    store_row,
    sum_gx,
    sum_squares,
    sum_squares32,
)
from .runtime import bits_f64, f64_bits, njit, ptr_f32, ptr_f64, ptr_i64, ptr_u8, ptr_u16

# A LayerNorm row whose r is below _RISK_R (σ > 1e30) may overflow float32 in x − μ; it is then
# formed from s·x − s·μ with s = _SCALE, a power of two (exact), as the reference does.
_RISK_R = 2.0**-100
_SCALE = np.float32(2.0**-80)


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
    (:data:`.rows.TINY`) again from float32 deviations about that μ."""
    mu = np.float32(c + s1 / n)
    var = (s2 - s1 * s1 / n) / n
    if var < 0.0:  # (NaN stays NaN)
        var = 0.0
    if var < TINY:
        var = _deviations32(x, n, mu) / n
    return mu, var


@njit(fastmath={"reassoc", "contract"})
def _load_bf16_shifted_sums(src, t, n):
    """t = the bfloat16 row as float32, and :func:`_shifted_sums` of it about c = t[0]: one pass."""
    rt.wide_vectors()
    c = np.float64(bf16_to_f32(src[0]))
    s1 = 0.0
    s2 = 0.0
    for j in range(n):
        v = bf16_to_f32(src[j])
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
def _normalize_bf16(xs, mu, r, s, b, has_b, norm, out16):
    """As :func:`_normalize`, converted to bfloat16 bits in the same loop."""
    n = out16.shape[0]
    if norm == LAYER_NORM and r < _RISK_R:
        rs = r / _SCALE
        for j in range(n):
            v = ((xs[j] * _SCALE - mu * _SCALE) * rs) * s[j]
            out16[j] = f32_to_bf16(v + b[j] if has_b else v)
    elif norm == LAYER_NORM:
        if has_b:
            for j in range(n):
                out16[j] = f32_to_bf16(((xs[j] - mu) * r) * s[j] + b[j])
        else:
            for j in range(n):
                out16[j] = f32_to_bf16(((xs[j] - mu) * r) * s[j])
    elif has_b:
        for j in range(n):
            out16[j] = f32_to_bf16((xs[j] * r) * s[j] + b[j])
    else:
        for j in range(n):
            out16[j] = f32_to_bf16((xs[j] * r) * s[j])


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
                out[j] = bf16_to_f32(f32_to_bf16(xs[j] * rr)) * s[j] + b[j]
        elif c_mul == BF16:
            for j in range(n):
                out[j] = bf16_to_f32(f32_to_bf16(xs[j] * rr)) * s[j]
        elif c_mul == F16 and has_b:
            for j in range(n):
                out[j] = f16_to_f32(f32_to_f16(xs[j] * rr)) * s[j] + b[j]
        elif c_mul == F16:
            for j in range(n):
                out[j] = f16_to_f32(f32_to_f16(xs[j] * rr)) * s[j]
        else:
            _apply_rounded_any(xs, rr, s, b, has_b, c_mul, y_code, yaddr, n)
    elif y_code == BF16 and c_mul == BF16:
        out16 = carray(ptr_u16(yaddr), n)
        if has_b:
            for j in range(n):
                v = bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(xs[j] * rr)) * s[j]))
                out16[j] = f32_to_bf16(v + b[j])
        else:
            for j in range(n):
                out16[j] = f32_to_bf16(bf16_to_f32(f32_to_bf16(xs[j] * rr)) * s[j])
    elif y_code == F16 and c_mul == F16:
        out16 = carray(ptr_u16(yaddr), n)
        if has_b:
            for j in range(n):
                v = f16_to_f32(f32_to_f16(f16_to_f32(f32_to_f16(xs[j] * rr)) * s[j]))
                out16[j] = f32_to_f16(v + b[j])
        else:
            for j in range(n):
                out16[j] = f32_to_f16(f16_to_f32(f32_to_f16(xs[j] * rr)) * s[j])
    else:
        _apply_rounded_any(xs, rr, s, b, has_b, c_mul, y_code, yaddr, n)


@njit
def _apply_rounded_any(xs, rr, s, b, has_b, c_mul, y_code, yaddr, n):
    """:func:`_apply_rounded` for any codes, an element at a time (mixed half dtypes)."""
    rt.wide_vectors()
    t = np.empty(n, np.float32)
    for j in range(n):
        v = rounded(rounded(xs[j] * rr, c_mul) * s[j], y_code)
        t[j] = rounded(v + b[j], y_code) if has_b else v
    store_row(t, yaddr, n, y_code)


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


# ----------------------------------------------------------------------------------------------
# Forward: RMSNorm (optionally with the residual add) and LayerNorm, rows [lo, hi)
# ----------------------------------------------------------------------------------------------
@njit
def _fwd_rows(A, lo, hi, tx, ty, zaddr):
    rt.wide_vectors()
    m, n, k, flags = A[_M], A[_N], A[_K], A[_FLAGS]
    x_code, r_code, y_code = field(flags, flag.FX), field(flags, flag.FR), field(flags, flag.FY)
    has_res, norm = field(flags, flag.FHAS_RES), field(flags, flag.FNORM)
    eps_mode = field(flags, flag.FEPS)
    c_pre, c_r = field(flags, flag.FC_PRE), field(flags, flag.FC_R)
    c_mul, c_out = field(flags, flag.FC_MUL), field(flags, flag.FC_OUT)
    has_b = field(flags, flag.FHAS_B) == 1
    stream = field(flags, flag.FSTREAM) == 1  # rows are written to zaddr, then streamed out
    eps = bits_f64(A[_EPS])
    s = carray(ptr_f32(A[_S]), n)
    b = carray(ptr_f32(A[_B]), n)  # not read without a bias
    mean = carray(ptr_f32(A[_MEAN]), m)  # LayerNorm only
    rstd = carray(ptr_f32(A[_RSTD]), m)
    xb, xs = A[_X], A[_XS] * esize(x_code)
    rb, rs = A[_R], A[_RS] * esize(r_code)
    hb, yb = A[_H], A[_Y]
    fused = c_pre == F32 and c_r == F32 and c_mul == F32 and c_out == F32
    for i in range(lo, hi):
        if has_res:
            xs_ = load_row(xb + i * xs, n, x_code, tx)
            if x_code == F32:  # xs_ is a view of x: copy before adding in place
                for j in range(n):
                    tx[j] = xs_[j]
                xs_ = tx[:n]
            add_row(rb + i * rs, n, r_code, xs_)
            round_row(xs_, n, r_code)
            if stream:
                store_row(xs_, zaddr, n, r_code)
                _stream_row(zaddr, hb + i * n * esize(r_code), n * esize(r_code))
            else:
                store_row(xs_, hb + i * n * esize(r_code), n, r_code)
        elif x_code == BF16:  # convert and reduce in the pass that reads the row
            xs_ = tx[:n]
            xrow = carray(ptr_u16(xb + i * xs), n)
            if norm == RMS_NORM:
                ss = load_bf16_sum_squares(xrow, xs_, n, k)
                if ss < TINY:
                    ss = sum_squares32(xs_, k)
            else:
                cc, s1, s2 = _load_bf16_shifted_sums(xrow, xs_, n)
        else:
            xs_ = load_row(xb + i * xs, n, x_code, tx)

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
                ss = sum_squares(xs_, k)
            r = rms_rstd(ss, k, eps, eps_mode == RMS)
        rstd[i] = r

        yaddr = zaddr if stream else yb + i * n * esize(y_code)
        if fused and stream and (y_code == F32 or y_code == BF16):
            # a piece of the row at a time through the scratch row, which stays in L1 with it
            ye = esize(y_code)
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
                store_row(ty, yaddr, n, y_code)
        elif (c_pre == F32 or (x_code == c_pre and not has_res)) and c_out == y_code:
            # "llama" / "none" with half inputs, one pass (the input is already in c_pre)
            _apply_rounded(xs_, rounded(r, c_r), s, b, has_b, c_mul, y_code, yaddr, n)
        else:  # the rest, with a residual in another dtype: round where torch's eager ops round
            if c_pre != F32:
                for j in range(n):
                    ty[j] = xs_[j]
                round_row(ty, n, c_pre)
                xs_ = ty[:n]
            rr = rounded(r, c_r)
            for j in range(n):
                ty[j] = xs_[j] * rr
            round_row(ty, n, c_mul)
            for j in range(n):
                ty[j] = ty[j] * s[j]
            round_row(ty, n, c_out)
            if has_b:
                for j in range(n):
                    ty[j] = ty[j] + b[j]
                round_row(ty, n, c_out)
            store_row(ty, yaddr, n, y_code)
        if stream:
            _stream_row(zaddr, yb + i * n * esize(y_code), n * esize(y_code))
    if stream:
        rt.stream_fence()


# ----------------------------------------------------------------------------------------------
# Backward: dx for every row, d weight / d bias as per-block partial rows summed in a fixed order
# ----------------------------------------------------------------------------------------------
@njit
def _bwd_block(A, blk, tx, tdy, tdx):
    rt.wide_vectors_bwd()
    m, n, k, flags = A[_M], A[_N], A[_K], A[_FLAGS]
    dy_code, x_code, dr_code = field(flags, flag.BDY), field(flags, flag.BX), field(flags, flag.BDR)
    has_dr, norm = field(flags, flag.BHAS_DR), field(flags, flag.BNORM)
    eps_mode, c_xhat = field(flags, flag.BEPS), field(flags, flag.BC_XHAT)
    need_dw, need_db = field(flags, flag.BNEED_DW) == 1, field(flags, flag.BNEED_DB) == 1
    s64 = carray(ptr_f64(A[_S]), n)
    mean = carray(ptr_f32(A[_MEAN]), m)  # LayerNorm only
    rstd = carray(ptr_f32(A[_RSTD]), m)
    pw = carray(ptr_f32(A[_PW] + 4 * blk * n), n)  # this block's partial rows (when needed)
    pb = carray(ptr_f32(A[_PB] + 4 * blk * n), n)
    if need_dw:
        pw[:] = 0.0
    if need_db:
        pb[:] = 0.0
    xb, xs = A[_X], A[_XS] * esize(x_code)
    dyb, dys_ = A[_DY], A[_DYS] * esize(dy_code)
    drb, drs = A[_DR], A[_DRS] * esize(dr_code)
    dxb = A[_DX]
    rpb = A[_RPB]
    stream = field(flags, flag.BSTREAM) == 1  # dx rows streamed out of a scratch row
    direct = x_code == F32 and not has_dr and not stream  # dx goes straight to the output row
    for i in range(blk * rpb, min(m, (blk + 1) * rpb)):
        xs_ = load_row(xb + i * xs, n, x_code, tx)
        dys = load_row(dyb + i * dys_, n, dy_code, tdy)
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
            sx = rd * sum_gx(dys, xs_, s64, n)
            if eps_mode == MEAN_SQUARE:
                f = rd * sx / k
            else:
                root = np.sqrt(sum_squares(xs_, k) / k)
                f = sx / (k * root) if root > 0.0 else 0.0
            a, b, cc = rd, rd * f, 0.0  # (cc unused)
        out = carray(ptr_f32(dxb + i * n * 4), n) if direct else tdx[:n]
        if norm == LAYER_NORM:
            _dx_ln(dys, xs_, s64, n, mu, a, b, cc, out)
        else:
            dx_rms(dys, xs_, s64, n, k, a, b, out)
        # d weight and d bias partials in float32, x̂ = (x − μ)·r rounded as the reference rounds it
        # (to the input dtype in "llama" mode). A separate pass over the cached row costs no more
        # than fusing it into dx's (measured); LayerNorm's two partials share one pass.
        db_done = False
        if need_dw:
            if c_xhat == BF16 and norm == RMS_NORM:  # "llama": x̂ rounded as the forward did
                for j in range(n):
                    pw[j] += dys[j] * bf16_to_f32(f32_to_bf16(xs_[j] * r))
            elif c_xhat == F16 and norm == RMS_NORM:
                for j in range(n):
                    pw[j] += dys[j] * f16_to_f32(f32_to_f16(xs_[j] * r))
            elif c_xhat != F32:
                for j in range(n):
                    pw[j] += dys[j] * rounded((xs_[j] - mu) * r, c_xhat)
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
                add_row(drb + i * drs, n, dr_code, tdx)
            dst = dxb + i * n * esize(x_code)
            if stream and x_code == F32:
                _stream_row(np.int64(tdx.ctypes.data), dst, 4 * n)
            elif stream:  # converted in tdy's scratch row, free once the row's partials are done
                store_row(tdx, np.int64(tdy.ctypes.data), n, x_code)
                _stream_row(np.int64(tdy.ctypes.data), dst, n * esize(x_code))
            else:
                store_row(tdx, dst, n, x_code)
    if stream:
        rt.stream_fence()


# ----------------------------------------------------------------------------------------------
# Entry points: compiled with one signature each, loaded from numba's on-disk cache where possible
# (stale when this file or a module it takes code from changes: the row toolkit, the flag fields,
# the runtime)
# ----------------------------------------------------------------------------------------------
ENTRIES = rt.Entries(rows.__file__, flag.__file__, __file__)
_i, _f = types.int64, types.float64
# The block functions that the threads of a shared call run (runtime.run_blocks), in the task
# blocks' slots where the entry points find them
_FWD_SLOT, _BWD_SLOT = 0, 1


def _fwd_task(args, blk, scratch):
    A = carray(ptr_i64(args), _WORDS)
    n, rpb = A[_N], A[_RPB]
    lo, hi = blk * rpb, min(A[_M], (blk + 1) * rpb)
    tx, ty = scratch_row(scratch, n, 0), scratch_row(scratch, n, 1)
    _fwd_rows(A, lo, hi, tx, ty, scratch + 8 * n)


def _bwd_task(args, blk, scratch):
    A = carray(ptr_i64(args), _WORDS)
    n = A[_N]
    tx, tdy = scratch_row(scratch, n, 0), scratch_row(scratch, n, 1)
    _bwd_block(A, blk, tx, tdy, scratch_row(scratch, n, 2))


FWD_BLOCK = rt.register_block(_FWD_SLOT, ENTRIES.block(_fwd_task))
BWD_BLOCK = rt.register_block(_BWD_SLOT, ENTRIES.block(_bwd_task))


@ENTRIES.entry(*(_i,) * 16, _f, _f, _i)
def forward(
    ctrl, xp, xs, rp, rs, hp, yp, wp, ws, bp, bs, meanp, rstdp, m, n, k, eps, offset, flags
):
    """RMSNorm (with the residual add where has_res) or LayerNorm over m rows of n elements; y, h,
    mean and rstd are contiguous outputs. ctrl: a pool's task block or an OpenMP launch
    (:mod:`.pool`), or 0 to run alone."""
    w_code, b_code = field(flags, flag.FW), field(flags, flag.FB)
    has_w, has_b = field(flags, flag.FHAS_W) == 1, field(flags, flag.FHAS_B) == 1
    c_param = field(flags, flag.FC_PARAM)
    sp, bp_, owner = param_rows(n, wp, ws, w_code, has_w, bp, bs, b_code, has_b, offset, c_param)
    rpb = max(1, 16384 // n)  # ~16 K elements a block
    A = np.empty(_WORDS, np.int64)
    A[_M], A[_N], A[_K], A[_FLAGS], A[_RPB] = m, n, k, flags, rpb
    A[_X], A[_XS], A[_R], A[_RS], A[_H], A[_Y] = xp, xs, rp, rs, hp, yp
    A[_S], A[_B], A[_MEAN], A[_RSTD], A[_EPS] = sp, bp_, meanp, rstdp, f64_bits(eps)
    if ctrl == 0:  # alone: every row in one pass (rows are independent: the same results)
        scratch = np.empty(3 * n + 16, np.float32)  # three rows, the last 64-byte aligned
        base = np.int64(scratch.ctypes.data)
        tx, ty = scratch_row(base, n, 0), scratch_row(base, n, 1)
        _fwd_rows(A, 0, m, tx, ty, (base + 8 * n + 63) // 64 * 64)
        scratch[:0] = 0.0
    else:
        nb = (m + rpb - 1) // rpb
        args = np.int64(A.ctypes.data)
        rt.run_blocks(ctrl, rt.block_fn(ctrl, _FWD_SLOT), args, nb, 3 * n)
    # numba frees an array after its last use: this keeps the rows until every block is done
    owner[:0] = 0.0
    A[:0] = 0


@ENTRIES.entry(*(_i,) * 17, _f, _i)
def backward(
    ctrl, dyp, dys, xp, xs, drp, drs, dxp, wp, ws, meanp, rstdp, dwp, dbp, m, n, k, offset, flags
):
    """dx (contiguous, x's dtype) for m rows; dw / db (contiguous (N,), their codes) where needed.
    x is the normalized input (h for add_rms_norm); dresidual, where given, is added to dx."""
    sp, _, owner = param_rows(
        n,
        wp,
        ws,
        field(flags, flag.BW),
        field(flags, flag.BHAS_W) == 1,
        0,
        0,
        F32,
        False,
        offset,
        F32,
    )
    s32 = carray(ptr_f32(sp), n)
    s64 = np.empty(n, np.float64)  # the scale in float64: every element's g = dy·s is exact
    for j in range(n):
        s64[j] = s32[j]
    need_dw, need_db = field(flags, flag.BNEED_DW), field(flags, flag.BNEED_DB)
    rpb = bwd_rows_per_block(m, n)
    nb = (m + rpb - 1) // rpb
    pw, pb = partials(nb, n, need_dw), partials(nb, n, need_db)
    A = np.empty(_WORDS, np.int64)
    A[_M], A[_N], A[_K], A[_FLAGS], A[_RPB] = m, n, k, flags, rpb
    A[_DY], A[_DYS], A[_X], A[_XS], A[_DR], A[_DRS], A[_DX] = dyp, dys, xp, xs, drp, drs, dxp
    A[_S], A[_MEAN], A[_RSTD] = s64.ctypes.data, meanp, rstdp
    A[_PW], A[_PB] = pw.ctypes.data, pb.ctypes.data
    if ctrl == 0:  # alone: the same blocks, in order, with one scratch
        scratch = np.empty(3 * n, np.float32)
        base = np.int64(scratch.ctypes.data)
        for blk in range(nb):
            tx, tdy = scratch_row(base, n, 0), scratch_row(base, n, 1)
            _bwd_block(A, blk, tx, tdy, scratch_row(base, n, 2))
        scratch[:0] = 0.0
    else:
        args = np.int64(A.ctypes.data)
        rt.run_blocks(ctrl, rt.block_fn(ctrl, _BWD_SLOT), args, nb, 3 * n)
    A[:0] = 0
    owner[:0] = 0.0
    s64[:0] = 0.0  # keep the scale rows until every block is done
    reduce_grads(pw, pb, nb, n, dwp, field(flags, flag.BDW), dbp, field(flags, flag.BDB))
