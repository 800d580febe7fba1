"""The CPU kernels (numba) of grouped and gated RMSNorm, forward and backward, over blocks of rows.

Rows, bit conversions, row sums, parameter rows and the backward's partial rows are the row
toolkit's (:mod:`.rows`, shared with the plain kernels of :mod:`.kernels`); the dtype codes and the
bit fields of ``flags`` are :mod:`.flags`'; the threads that share a call are :mod:`.runtime`'s.
"""

from __future__ import annotations

import numpy as np
from numba import carray, types

from . import flags as flag
from . import rows
from . import runtime as rt
from .flags import BF16, F16, F32, F64, GEMMA, LLAMA, NONE
from .rows import (
    FLOAT,
    TINY,
    add_row,
    bf16_to_f32,
    bwd_rows_per_block,
    dx_rms,
    esize,
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
    sum_squares64,
)
from .runtime import I32, bits_f64, c32, f64_bits, ptr_f32, ptr_i64, ptr_u16
from .runtime import njit as _njit

# The argument block of a task (int64 words), filled by the entry points
_X, _XS, _Z, _ZS, _Y, _S, _B, _RSTD, _M, _N, _G, _K, _EPS, _FLAGS, _RPB = range(15)
_DY, _DYS, _DR, _DRS, _DX, _DZ, _PW, _PB, _SN, _BN = range(15, 25)
_WORDS = 32


@rt.lowered(types.float32(types.float32))
def _pow2(b, kd):
    """2^n as a float32 from kd = n + 1.5·2^23 (n in its low mantissa bits, |n| ≤ 127): the bits
    (n + 127) << 23, in 32-bit integer lanes."""
    bits = b.add(b.bitcast(kd, I32), c32(127))
    return b.bitcast(b.shl(bits, c32(23)), FLOAT)


# ----------------------------------------------------------------------------------------------
# The activation: σ(z) = 1/(1 + exp(−z)) in float32, as torch computes SiLU (z/(1 + exp(−z))) and
# the sigmoid, with exp written so that LLVM vectorizes it (16 lanes with AVX-512; no libm call,
# no float-to-int conversion): exp(t) = 2^n · exp(r), n = round(t/ln 2), r = t − n·ln 2 in two
# parts (Cody-Waite), exp(r) by Cephes' degree-7 polynomial. Measured against float64 on 2^22
# points of [−90, 90] (values above 1e-30): σ within 1.24 ulp and SiLU within 1.44 ulp, as
# torch's (1.24 and 1.44); NaN and ±inf where torch's are.
# ----------------------------------------------------------------------------------------------
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)  # exact in 9 bits: n·LN2_HI is exact for |n| < 2^15
_LN2_LO = np.float32(-2.12194440e-4)
_SHIFTER = np.float32(12582912.0)  # 1.5·2^23: t + SHIFTER holds round(t) in its low bits
_EXP_MAX = np.float32(88.0)  # exp(88) = 1.65e38; past 88.72 float32's expf overflows
_EXP_MIN = np.float32(-87.0)  # 2^n stays normal
_OVERFLOW = np.float32(88.72283935546875)  # ln(FLT_MAX): exp(−z) is inf there in torch, σ = 0
_P0, _P1, _P2 = (
    np.float32(1.9875691500e-4),
    np.float32(1.3981999507e-3),
    np.float32(8.3334519073e-3),
)
_P3, _P4, _P5 = (
    np.float32(4.1665795894e-2),
    np.float32(1.6666665459e-1),
    np.float32(5.0000001201e-1),
)
_ONE = np.float32(1.0)
_INF = np.float32(np.inf)


@_njit(inline="always", fastmath={"contract"})
def _exp_neg(z):
    """exp(−z) in float32 for a float32 z: inf where float32's expf overflows (z < −88.72, as
    torch's), NaN for NaN."""
    t = -z
    t = _EXP_MAX if t > _EXP_MAX else t
    t = _EXP_MIN if t < _EXP_MIN else t
    kd = t * _LOG2E + _SHIFTER
    n = kd - _SHIFTER
    r = (t - n * _LN2_HI) - n * _LN2_LO  # |r| ≤ ln2/2
    r2 = r * r
    p = _P0 * r + _P1
    p = p * r + _P2
    p = p * r + _P3
    p = p * r + _P4
    p = p * r + _P5
    p = p * r2 + r + _ONE
    e = p * _pow2(kd)
    return _INF if -z > _OVERFLOW else e


@_njit(inline="always")
def _sigmoid32(z):
    """σ(z) = 1/(1 + exp(−z)) in float32 (0 below z = −88.72, as torch's)."""
    return _ONE / (_ONE + _exp_neg(z))


@_njit(inline="always")
def _silu32(z):
    """SiLU(z) = z/(1 + exp(−z)) in float32, torch's formula (NaN at −inf: −inf/inf)."""
    return z / (_ONE + _exp_neg(z))


@_njit
def _gate_row(addr, n, code, t):
    """The gate row as float32 in t (copied for float32 too: the activation rewrites it)."""
    rt.wide_vectors()
    row = load_row(addr, n, code, t)
    if code == F32:
        for j in range(n):
            t[j] = row[j]


@_njit
def _act_row(addr, n, code, sigmoid, a):
    """a = act(z) of the gate row at addr (any float code) in one pass: read, convert, activate."""
    rt.wide_vectors()
    if code == F32:
        z32 = carray(ptr_f32(addr), n)
        _activation(z32, n, sigmoid, a)
    elif code == BF16:
        z16 = carray(ptr_u16(addr), n)
        if sigmoid:
            for j in range(n):
                a[j] = _sigmoid32(bf16_to_f32(z16[j]))
        else:
            for j in range(n):
                a[j] = _silu32(bf16_to_f32(z16[j]))
    else:  # float16, float64: converted into a first, then activated in place (rare: slower)
        _gate_row(addr, n, code, a)
        _activation(a, n, sigmoid, a)


# The activations read z from one row and write another: in place, LLVM's run-time overlap check
# sends the loop to its scalar version (measured 10x slower).
@_njit
def _activation(z, n, sigmoid, a):
    """a = act(z) in float32: SiLU z·σ(z) or σ(z)."""
    rt.wide_vectors()
    if sigmoid:
        for j in range(n):
            a[j] = _sigmoid32(z[j])
    else:
        for j in range(n):
            a[j] = _silu32(z[j])


@_njit
def _activation_grad(z, n, sigmoid, a, da):
    """a = act(z) and da = act'(z) in float32, as the spec writes them: SiLU' = σ·(1 + z·(1 − σ)),
    σ' = σ·(1 − σ) (so SiLU'(±inf) is NaN, as there)."""
    rt.wide_vectors()
    if sigmoid:
        for j in range(n):
            s = _sigmoid32(z[j])
            a[j] = s
            da[j] = s * (_ONE - s)
    else:
        for j in range(n):
            s = _sigmoid32(z[j])
            a[j] = z[j] * s
            da[j] = s * (_ONE + z[j] * (_ONE - s))


# Σx² of a group: :func:`.rows.sum_squares` (float64, float32 squares for a tiny group). The
# group helpers take the group's slices and loop from 0: a loop from a run-time start o would
# keep numba's negative-index wraparound in every access, which LLVM cannot vectorize (measured
# 0.9 ns an element against 0.05).
@_njit(fastmath={"reassoc", "contract"})
def _bf16_sum_squares(src, k):
    """Σ_{j<k} x_j² of raw bfloat16 bits, in float64."""
    rt.wide_vectors()
    acc = 0.0
    for j in range(k):
        d = np.float64(bf16_to_f32(src[j]))
        acc += d * d
    return acc


@_njit
def _gated_input(x, a, n, cast, c_in, tv):
    """u = x ⊙ a (gate, then norm): in float32, or in "none" mode rounded to the input dtype (x
    rounded to it first; a already is)."""
    rt.wide_vectors()
    if cast == NONE:
        for j in range(n):
            tv[j] = x[j]
        round_row(tv, n, c_in)
        for j in range(n):
            tv[j] = tv[j] * a[j]
        round_row(tv, n, c_in)
    else:
        for j in range(n):
            tv[j] = x[j] * a[j]
    return tv[:n]


@_njit
def _apply(v, r, s, b, has_b, cast, c_in, c_out, out):
    """out = a group's norm n = (offset + γ) ⊙ v·r + β (v, s, b, out: the group's slices), rounded
    where the casting mode rounds (as ``reference.rms_norm_apply``); s and b were rounded to the
    mode's parameter dtype."""
    rt.wide_vectors()
    g = out.shape[0]
    if cast == GEMMA:
        scale_row(v, r, s, b, has_b, out)
        return
    if cast == LLAMA:
        rr, c_mul, c_last = r, c_in, c_out
        for j in range(g):
            out[j] = v[j]
    else:  # "none": v and r rounded to the input dtype first
        rr, c_mul, c_last = rounded(r, c_in), c_in, c_in
        for j in range(g):
            out[j] = v[j]
        round_row(out, g, c_in)
    for j in range(g):
        out[j] = out[j] * rr
    round_row(out, g, c_mul)
    for j in range(g):
        out[j] = out[j] * s[j]
    round_row(out, g, c_last)
    if has_b:
        for j in range(g):
            out[j] = out[j] + b[j]
        round_row(out, g, c_last)


@_njit(fastmath={"contract"})
def _dv_gate_first(dn, s, v, x, act, dact, k, a, b, dx, dz):
    """Gate, then norm: dx = dv·act(z), d gate = dv·x·act'(z), dv formed as
    :func:`.rows.dx_rms` forms dx."""
    rt.wide_vectors()
    g = dx.shape[0]
    for j in range(g):
        dvj = a * (np.float64(dn[j]) * np.float64(s[j]))
        dvj = dvj - b * np.float64(v[j]) if j < k else dvj
        dx[j] = np.float32(dvj * np.float64(act[j]))
        dz[j] = np.float32(dvj * np.float64(x[j]) * np.float64(dact[j]))


@_njit(fastmath={"contract"})
def _gate_last(dy, a, da, n, dn):
    """Norm, then gate (y = n·a): dn = dy·a, and n is replaced by d gate = dy·n·act'(z)."""
    rt.wide_vectors()
    for j in range(n.shape[0]):
        dn[j] = dy[j] * a[j]
        n[j] = np.float32(np.float64(dy[j]) * np.float64(n[j]) * np.float64(da[j]))


@_njit
def _dw_partial(dn, v, r, llama, c_in, pw, t):
    """pw += dn·v̂, v̂ = v·r (rounded to the input dtype in "llama" mode, as the forward's)."""
    rt.wide_vectors()
    g = pw.shape[0]
    if llama:
        for j in range(g):
            t[j] = v[j] * r
        round_row(t, g, c_in)
        for j in range(g):
            pw[j] += dn[j] * t[j]
    else:
        for j in range(g):
            pw[j] += dn[j] * (v[j] * r)


# ----------------------------------------------------------------------------------------------
# The forward's fused loops, one per combination of the constants that shape them (casting mode,
# rounding and output dtypes, how the gate enters): with them fixed the roundings, the activation
# and the store are straight-line code that LLVM vectorizes, where a run-time dtype code in the
# loop keeps it scalar. The output loop computes the norm, the gate product (act(z) from the raw
# gate row, or from a precomputed row) and the store in one pass; gate-first's input loop forms
# u = x·act(z) from both raw rows in one. Fused, the activation's arithmetic overlaps the loads
# and stores instead of taking a pass of its own: the (2048, 4096) bf16 forward of Qwen3-Next's
# order took 0.82–0.98 ns an element on one core against 1.04–1.15 with a pass per step
# (torch.compile of the Hugging Face forward, which drops its intermediate bf16 roundings:
# 0.56–0.89; one loaded 2-core machine, the spread of repeated runs). Other combinations
# (float16 or float64 gates, a gate in another dtype than the input) take the activation from a
# precomputed row; what no loop covers is rounded pass by pass (_apply).
# ----------------------------------------------------------------------------------------------
NO_GATE, PRE, RAW_SILU, RAW_SIGMOID = 0, 1, 2, 3  # how the gate enters the output loop


@_njit(inline="always")
def _raw(zr, j, code):
    """Element j of a raw row (float32 or bfloat16 bits) as float32."""
    if code == F32:
        return zr[j]
    return bf16_to_f32(zr[j])


def _make_out(cast, c_in, c_out, gate, y_code):
    rnd = rounded

    @_njit(inline="always")
    def value(vj, r, rr, sj, bj):
        if cast == GEMMA:
            return (vj * r) * sj + bj
        if cast == LLAMA:
            return rnd(rnd(rnd(vj * r, c_in) * sj, c_out) + bj, c_out)
        return rnd(rnd(rnd(rnd(vj, c_in) * rr, c_in) * sj, c_in) + bj, c_in)

    @_njit(inline="always")
    def value_nb(vj, r, rr, sj):  # no bias: the same without its add and rounding
        if cast == GEMMA:
            return (vj * r) * sj
        if cast == LLAMA:
            return rnd(rnd(vj * r, c_in) * sj, c_out)
        return rnd(rnd(rnd(vj, c_in) * rr, c_in) * sj, c_in)

    @_njit(inline="always")
    def gated(t, j, a, zr):
        if gate == PRE:
            return t * a[j]
        if gate == NO_GATE:
            return t
        zj = _raw(zr, j, c_in)
        aj = _sigmoid32(zj) if gate == RAW_SIGMOID else _silu32(zj)
        if cast == NONE:
            aj = rnd(aj, c_in)
        return t * aj

    @_njit(inline="always")
    def vx(v, xr, j):  # the raw-gate loops read x raw too (its dtype is the input's)
        if gate == RAW_SILU or gate == RAW_SIGMOID:
            return _raw(xr, j, c_in)
        return v[j]

    @_njit
    def out(v, xaddr, r, s, b, has_b, a, zaddr, dst):
        rt.wide_vectors()
        g = v.shape[0]
        rr = rounded(r, c_in)
        if c_in == F32:
            zr, xr = carray(ptr_f32(zaddr), g), carray(ptr_f32(xaddr), g)
        else:
            zr, xr = carray(ptr_u16(zaddr), g), carray(ptr_u16(xaddr), g)
        if y_code == F32:
            y32 = carray(ptr_f32(dst), g)
            if has_b:
                for j in range(g):
                    y32[j] = gated(value(vx(v, xr, j), r, rr, s[j], b[j]), j, a, zr)
            else:
                for j in range(g):
                    y32[j] = gated(value_nb(vx(v, xr, j), r, rr, s[j]), j, a, zr)
        elif y_code == BF16:
            y16 = carray(ptr_u16(dst), g)
            if has_b:
                for j in range(g):
                    t = gated(value(vx(v, xr, j), r, rr, s[j], b[j]), j, a, zr)
                    y16[j] = f32_to_bf16(t)
            else:
                for j in range(g):
                    y16[j] = f32_to_bf16(gated(value_nb(vx(v, xr, j), r, rr, s[j]), j, a, zr))
        else:
            yh = carray(ptr_u16(dst), g)
            if has_b:
                for j in range(g):
                    yh[j] = f32_to_f16(gated(value(vx(v, xr, j), r, rr, s[j], b[j]), j, a, zr))
            else:
                for j in range(g):
                    yh[j] = f32_to_f16(gated(value_nb(vx(v, xr, j), r, rr, s[j]), j, a, zr))

    return out


def _make_in(c, sigmoid, none):
    """Gate-first's input loop: u = x·act(z) from raw rows of the dtype c (rounded to it in
    "none" mode, act(z) first), and Σu² of each group's first k."""

    @_njit
    def inp(xaddr, zaddr, n, u):
        rt.wide_vectors()
        if c == F32:
            xr, zr = carray(ptr_f32(xaddr), n), carray(ptr_f32(zaddr), n)
        else:
            xr, zr = carray(ptr_u16(xaddr), n), carray(ptr_u16(zaddr), n)
        for j in range(n):
            xj, zj = _raw(xr, j, c), _raw(zr, j, c)
            aj = _sigmoid32(zj) if sigmoid else _silu32(zj)
            if none:
                u[j] = rounded(xj * rounded(aj, c), c)
            else:
                u[j] = xj * aj

    return inp


# (cast, c_in, c_out): the output dtype is c_in after a gate product, else the norm's (c_out)
_ROUNDINGS = (
    (GEMMA, F32, F32), (GEMMA, BF16, BF16), (GEMMA, F16, F16),
    (LLAMA, F32, F32), (LLAMA, BF16, BF16), (LLAMA, BF16, F32), (LLAMA, F16, F16),
    (LLAMA, F16, F32), (NONE, F32, F32), (NONE, BF16, BF16), (NONE, F16, F16),
)  # fmt: skip
_OUT_KEYS = [
    (cast, c_in, c_out, gate)
    for cast, c_in, c_out in _ROUNDINGS
    for gate in (NO_GATE, PRE, RAW_SILU, RAW_SIGMOID)
    if gate in (NO_GATE, PRE) or c_in in (F32, BF16)
]
_IN_KEYS = [(c, sig, none) for c in (F32, BF16) for sig in (False, True) for none in (False, True)]
_LOOPS = {
    f"_OUT{i}": _make_out(cast, c_in, c_out, gate, c_in if gate else c_out)
    for i, (cast, c_in, c_out, gate) in enumerate(_OUT_KEYS)
}
_LOOPS.update({f"_IN{i}": _make_in(*key) for i, key in enumerate(_IN_KEYS)})


def _dispatcher(name: str, prefix: str, count: int, args: str):
    """An njit function ``name(variant, <args>)`` calling loop ``<prefix><variant>``: written out
    as an if-chain (numba calls no function through a variable)."""
    lines = [f"def {name}(variant, {args}):"]
    for i in range(count):
        lines.append(f"    {'if' if i == 0 else 'elif'} variant == {i}:")
        lines.append(f"        {prefix}{i}({args})")
    namespace = dict(_LOOPS)
    exec("\n".join(lines), namespace)  # noqa: S102 - generated from the constants above
    return _njit(namespace[name])


_out = _dispatcher("_out", "_OUT", len(_OUT_KEYS), "v, xaddr, r, s, b, has_b, a, zaddr, dst")
_in = _dispatcher("_in", "_IN", len(_IN_KEYS), "xaddr, zaddr, n, u")


def out_variant(cast: int, c_in: int, c_out: int, gate: int) -> int:
    """The index of the output loop for these constants (the launchers put it in the flags), or
    −1 where none covers them (the kernel then rounds pass by pass). ``gate``: NO_GATE, PRE,
    RAW_SILU or RAW_SIGMOID."""
    if cast != LLAMA:
        c_out = c_in
    key = (cast, c_in, c_out, gate)
    return _OUT_KEYS.index(key) if key in _OUT_KEYS else -1


def in_variant(code: int, sigmoid: bool, none: bool) -> int:
    """The index of gate-first's input loop for rows of the dtype ``code``, or −1."""
    key = (code, sigmoid, none)
    return _IN_KEYS.index(key) if key in _IN_KEYS else -1


# ----------------------------------------------------------------------------------------------
# Forward: rows [lo, hi)
# ----------------------------------------------------------------------------------------------
@_njit
def _fwd_rows(A, lo, hi, tx, ta, tv, ty):
    rt.wide_vectors()
    n, g, k, flags = A[_N], A[_G], A[_K], A[_FLAGS]
    x_code, z_code, y_code = field(flags, flag.GX), field(flags, flag.GZ), field(flags, flag.GY)
    c_in, c_out, cast = field(flags, flag.GIN), field(flags, flag.GOUT), field(flags, flag.GCAST)
    has_gate, first = field(flags, flag.GHAS_GATE) == 1, field(flags, flag.GFIRST) == 1
    sigmoid, rms_eps = field(flags, flag.GSIGMOID) == 1, field(flags, flag.GEPS) == 1
    out_v, in_v = field(flags, flag.GOUTV) - 1, field(flags, flag.GINV) - 1  # -1: no fused loop
    raw = field(flags, flag.GRAW) == 1  # the output loop reads the gate itself
    has_b = field(flags, flag.GHAS_B) == 1
    eps = bits_f64(A[_EPS])
    groups = n // g
    s = carray(ptr_f32(A[_S]), n)
    b = carray(ptr_f32(A[_B]), n)  # not read without a bias
    rstd = carray(ptr_f32(A[_RSTD]), A[_M] * groups)
    xb, xs = A[_X], A[_XS] * esize(x_code)
    zb, zs = A[_Z], A[_ZS] * (8 if z_code == F64 else esize(z_code))
    yb, ye = A[_Y], esize(y_code)
    ze = 8 if z_code == F64 else esize(z_code)
    xe = esize(x_code)
    last = has_gate and not first
    for i in range(lo, hi):
        zrow = zb + i * zs
        if has_gate and (not raw) and (not first or in_v < 0):
            _act_row(zrow, n, z_code, sigmoid, ta)
            if cast == NONE:
                round_row(ta, n, c_in)
        if first and in_v >= 0:
            _in(in_v, xb + i * xs, zrow, n, tv)
            v = tv[:n]
        elif first:
            v = _gated_input(load_row(xb + i * xs, n, x_code, tx), ta, n, cast, c_in, tv)
        elif x_code == BF16:  # converted in the pass that sums each group's squares
            v = tx[:n]
            src = carray(ptr_u16(xb + i * xs), n)
        else:
            v = load_row(xb + i * xs, n, x_code, tx)
        row, xrow = yb + i * n * ye, xb + i * xs
        for q in range(groups):
            o = q * g
            vq = v[o : o + g]
            if not first and x_code == BF16 and raw:  # the output loop reads x raw
                ss = _bf16_sum_squares(src[o : o + g], k)
                if ss < TINY:
                    load_row(xrow + 2 * o, g, BF16, vq)
                    ss = sum_squares32(vq, k)
            elif not first and x_code == BF16:
                ss = load_bf16_sum_squares(src[o : o + g], vq, g, k)
                ss = sum_squares32(vq, k) if ss < TINY else ss
            else:
                ss = sum_squares(vq, k)
            r = rms_rstd(ss, k, eps, rms_eps)
            rstd[i * groups + q] = r
            if out_v >= 0:
                sq, bq, aq = s[o : o + g], b[o : o + g], ta[o : o + g]
                _out(out_v, vq, xrow + o * xe, r, sq, bq, has_b, aq, zrow + o * ze, row + o * ye)
            else:
                _apply(vq, r, s[o : o + g], b[o : o + g], has_b, cast, c_in, c_out, ty[o : o + g])
        if out_v < 0:
            if last:  # the gate product, in float32 (rounded at the store)
                for j in range(n):
                    ty[j] = ty[j] * ta[j]
            store_row(ty, row, n, y_code)


def _fwd_block(args, blk, scratch):
    A = carray(ptr_i64(args), _WORDS)
    n, rpb = A[_N], A[_RPB]
    tx, ta = scratch_row(scratch, n, 0), scratch_row(scratch, n, 1)
    tv, ty = scratch_row(scratch, n, 2), scratch_row(scratch, n, 3)
    _fwd_rows(A, blk * rpb, min(A[_M], (blk + 1) * rpb), tx, ta, tv, ty)


# ----------------------------------------------------------------------------------------------
# Backward: dx, dz for every row; d weight / d bias as per-block partial rows, summed in block order
# ----------------------------------------------------------------------------------------------
def _bwd_block(args, blk, scratch):
    A = carray(ptr_i64(args), _WORDS)
    m, n, g, k, flags = A[_M], A[_N], A[_G], A[_K], A[_FLAGS]
    x_code, z_code, dy_code = field(flags, flag.GX), field(flags, flag.GZ), field(flags, flag.GDY)
    dr_code, dz_code = field(flags, flag.GDR), field(flags, flag.GDZ)
    c_in, c_out, cast = field(flags, flag.GIN), field(flags, flag.GOUT), field(flags, flag.GCAST)
    has_gate, first = field(flags, flag.GHAS_GATE) == 1, field(flags, flag.GFIRST) == 1
    sigmoid, rms_eps = field(flags, flag.GSIGMOID) == 1, field(flags, flag.GEPS) == 1
    has_b, has_dr = field(flags, flag.GHAS_B) == 1, field(flags, flag.GHAS_DR) == 1
    need_dw, need_db = field(flags, flag.GNEED_DW) == 1, field(flags, flag.GNEED_DB) == 1
    last = has_gate and not first
    groups = n // g
    s = carray(ptr_f32(A[_S]), n)  # offset + γ in float32, unrounded (ones without γ)
    sn = carray(ptr_f32(A[_SN]), n)  # ... and as the forward's n rounded it (norm, then gate)
    bn = carray(ptr_f32(A[_BN]), n)
    rstd = carray(ptr_f32(A[_RSTD]), m * groups)
    rpb = A[_RPB]
    pw = carray(ptr_f32(A[_PW] + 4 * blk * n), n)
    pb = carray(ptr_f32(A[_PB] + 4 * blk * n), n)
    if need_dw:
        pw[:] = 0.0
    if need_db:
        pb[:] = 0.0
    tx, tdy = scratch_row(scratch, n, 0), scratch_row(scratch, n, 1)
    ta, tda = scratch_row(scratch, n, 2), scratch_row(scratch, n, 3)
    tv = scratch_row(scratch, n, 4)
    tn = scratch_row(scratch, n, 5)  # n (norm, then gate), then d gate
    tdn = scratch_row(scratch, n, 6)  # the gradient reaching n
    tdx = scratch_row(scratch, n, 7)
    tw = scratch_row(scratch, n, 8)  # x̂ rounded to the input dtype ("llama" d weight)
    xb, xs = A[_X], A[_XS] * esize(x_code)
    zb, zs = A[_Z], A[_ZS] * (8 if z_code == F64 else esize(z_code))
    dyb, dys = A[_DY], A[_DYS] * esize(dy_code)
    drb, drs = A[_DR], A[_DRS] * esize(dr_code)
    dxb, dzb = A[_DX], A[_DZ]
    dze = 8 if dz_code == F64 else esize(dz_code)
    for i in range(blk * rpb, min(m, (blk + 1) * rpb)):
        x = load_row(xb + i * xs, n, x_code, tx)
        dy = load_row(dyb + i * dys, n, dy_code, tdy)
        if has_gate:
            _gate_row(zb + i * zs, n, z_code, tdx)  # (tdx is free until dx)
            _activation_grad(tdx, n, sigmoid, ta, tda)
        v = x
        if first:
            if cast == NONE:  # u as the forward rounded it: a rounded to the input dtype first
                tdn[:n] = ta[:n]
                round_row(tdn, n, c_in)
                v = _gated_input(x, tdn, n, cast, c_in, tv)
            else:
                v = _gated_input(x, ta, n, cast, c_in, tv)
        for q in range(groups):
            o, e = q * g, q * g + g
            r = rstd[i * groups + q]
            rd = np.float64(r)
            vq, sq = v[o:e], s[o:e]
            if last:
                # n as the forward multiplied it by the gate ("llama": rounded; else in float32)
                nq = tn[o:e]
                mode = LLAMA if cast == LLAMA else GEMMA
                _apply(vq, r, sn[o:e], bn[o:e], has_b, mode, c_in, c_out, nq)
                _gate_last(dy[o:e], ta[o:e], tda[o:e], nq, tdn[o:e])
                dn = tdn[o:e]
            else:
                dn = dy[o:e]
            # S = Σ g'·v̂ over the group, g' = dn·(offset + γ), formed as r·Σ g'·v (so that
            # r = inf keeps S finite where the sum is); dv = r·g' − m·v̂·f as in the plain kernel
            sv = rd * sum_gx(dn, vq, sq, g)
            if rms_eps:
                root = np.sqrt(sum_squares64(vq, k) / k)
                f = sv / (k * root) if root > 0.0 else 0.0
            else:
                f = rd * sv / k
            if first:
                xq, aq, daq = x[o:e], ta[o:e], tda[o:e]
                _dv_gate_first(dn, sq, vq, xq, aq, daq, k, rd, rd * f, tdx[o:e], tn[o:e])
            else:
                dx_rms(dn, vq, sq, g, k, rd, rd * f, tdx[o:e])
            if need_dw:
                _dw_partial(dn, vq, r, cast == LLAMA, c_in, pw[o:e], tw[o:e])
            if need_db:
                pbq = pb[o:e]
                for j in range(g):
                    pbq[j] += dn[j]
        if has_dr:
            add_row(drb + i * drs, n, dr_code, tdx)
        store_row(tdx, dxb + i * n * esize(x_code), n, x_code)
        if has_gate:
            store_row(tn, dzb + i * n * dze, n, dz_code)


# ----------------------------------------------------------------------------------------------
# Entry points: one signature each, cached on disk (stale when this file or a module it takes code
# from changes: the row toolkit, the flag fields, the runtime)
# ----------------------------------------------------------------------------------------------
ENTRIES = rt.Entries(rows.__file__, flag.__file__, __file__)
FWD_BLOCK = ENTRIES.block(_fwd_block)  # the block functions that the threads of a call run
BWD_BLOCK = ENTRIES.block(_bwd_block)

_i, _f = types.int64, types.float64


@ENTRIES.entry(*(_i,) * 16, _f, _f, _i)
def forward(ctrl, fn, xp, xs, zp, zs, yp, wp, ws, bp, bs, rstdp, m, n, g, k, eps, offset, flags):
    """Grouped / gated RMSNorm over m rows of n elements in groups of g (statistics from the first
    k of each); y and rstd (m·n/g) contiguous. fn: FWD_BLOCK's address. ctrl: as kernels.forward."""
    w_code, b_code = field(flags, flag.GW), field(flags, flag.GB)
    has_w, has_b = field(flags, flag.GHAS_W) == 1, field(flags, flag.GHAS_B) == 1
    c_param = field(flags, flag.GPARAM)
    sp, bpp, owner = param_rows(n, wp, ws, w_code, has_w, bp, bs, b_code, has_b, offset, c_param)
    A = np.zeros(_WORDS, np.int64)
    rpb = max(1, 16384 // n)  # ~16 K elements a block, as kernels.forward
    nb = (m + rpb - 1) // rpb
    A[_X], A[_XS], A[_Z], A[_ZS], A[_Y] = xp, xs, zp, zs, yp
    A[_S], A[_B], A[_RSTD], A[_M], A[_N], A[_G], A[_K] = sp, bpp, rstdp, m, n, g, k
    A[_EPS], A[_FLAGS], A[_RPB] = f64_bits(eps), flags, rpb
    rt.run_blocks(ctrl, fn, np.int64(A.ctypes.data), nb, 4 * n)
    owner[:0] = 0.0  # the parameter rows and the argument block live until every block is done
    A[:0] = 0


@ENTRIES.entry(*(_i,) * 23, _f, _i)
def backward(
    ctrl,
    fn,
    dyp,
    dys,
    xp,
    xs,
    zp,
    zs,
    drp,
    drs,
    dxp,
    dzp,
    wp,
    ws,
    bp,
    bs,
    rstdp,
    dwp,
    dbp,
    m,
    n,
    g,
    k,
    offset,
    flags,
):
    """dx (x's dtype) and d gate (the gate's) for m rows, contiguous; d weight / d bias ((N,),
    their codes) where needed. fn: BWD_BLOCK's address."""
    has_w, has_b = field(flags, flag.GHAS_W) == 1, field(flags, flag.GHAS_B) == 1
    w_code, b_code = field(flags, flag.GW), field(flags, flag.GB)
    sp, _, owner = param_rows(n, wp, ws, w_code, has_w, 0, 0, F32, False, offset, F32)
    # n in the gate's derivative (norm, then gate) as the forward rounded it in "llama" mode, in
    # float32 otherwise ("none" differentiates the unrounded function)
    c_param = field(flags, flag.GPARAM) if field(flags, flag.GCAST) == LLAMA else F32
    snp, bnp, owner_n = param_rows(n, wp, ws, w_code, has_w, bp, bs, b_code, has_b, offset, c_param)
    need_dw, need_db = field(flags, flag.GNEED_DW), field(flags, flag.GNEED_DB)
    rpb = bwd_rows_per_block(m, n)
    nb = (m + rpb - 1) // rpb
    pw, pb = partials(nb, n, need_dw), partials(nb, n, need_db)
    A = np.zeros(_WORDS, np.int64)
    A[_X], A[_XS], A[_Z], A[_ZS], A[_DY], A[_DYS] = xp, xs, zp, zs, dyp, dys
    A[_DR], A[_DRS], A[_DX], A[_DZ] = drp, drs, dxp, dzp
    A[_S], A[_SN], A[_BN], A[_RSTD] = sp, snp, bnp, rstdp
    A[_M], A[_N], A[_G], A[_K], A[_FLAGS], A[_RPB] = m, n, g, k, flags, rpb
    A[_PW], A[_PB] = pw.ctypes.data, pb.ctypes.data
    rt.run_blocks(ctrl, fn, np.int64(A.ctypes.data), nb, 9 * n)
    owner[:0] = 0.0
    owner_n[:0] = 0.0
    A[:0] = 0
    reduce_grads(pw, pb, nb, n, dwp, field(flags, flag.GW), dbp, field(flags, flag.GB))
