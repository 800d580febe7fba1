"""The CPU kernels (numba): RMSNorm / LayerNorm forward and backward over blocks of rows.

Every tensor reaches a kernel as an address, a row stride and a dtype code; bfloat16 / float16
rows are read as their raw 16-bit patterns and converted here with torch's rounding (round to
nearest even). Dtypes and options are runtime codes, so each entry point compiles to exactly one
specialisation. All numba code lives in this one file: numba's on-disk cache does not notice edits
to other modules that a cached function calls.
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import carray, types
from numba import njit as _numba_njit
from numba.extending import intrinsic


def njit(fn=None, **options):
    """numba's ``njit`` with ``error_model="numpy"`` (every function of this file is compiled so):
    float division follows IEEE as torch's ops do (x/0 = ±inf, 0/0 = NaN), where numba's default
    ``"python"`` model raises ZeroDivisionError from inside a kernel (an all-zero row with eps = 0)
    and branches on every divisor. The integer divisors here (n, k, rows per block) are ≥ 1 by
    construction (the launchers send empty tensors to the reference), and no float is converted
    to an integer, so the model's other difference (integer division by zero giving 0) never
    applies."""
    options = {"error_model": "numpy", **options}
    return _numba_njit(**options) if fn is None else _numba_njit(**options)(fn)


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


def pack(**fields: tuple[tuple[int, int], int]) -> int:
    """flags from {name: ((shift, width), value)}; the launchers build them once per combination of
    dtypes and options."""
    out = 0
    for (shift, width), value in fields.values():
        if not 0 <= value < 1 << width:
            raise ValueError(f"flag value {value} does not fit in {width} bits")
        out |= value << shift
    return out


_I8P, _I16, _I32, _I64, _F32 = (
    ir.IntType(8).as_pointer(), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType(),
)  # fmt: skip


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
# Addresses, atomics and the spin-wait hint
# ----------------------------------------------------------------------------------------------
def _pointer_intrinsic(elem):
    @intrinsic
    def ptr(typingctx, addr):
        """The int64 address as a typed pointer (for ``numba.carray``)."""
        if addr != types.int64:
            return None
        sig = types.CPointer(elem)(types.int64)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

        return sig, codegen

    return ptr


_ptr_f32 = _pointer_intrinsic(types.float32)
_ptr_f64 = _pointer_intrinsic(types.float64)
_ptr_u16 = _pointer_intrinsic(types.uint16)
_ptr_i64 = _pointer_intrinsic(types.int64)


@intrinsic
def _atomic_add(typingctx, addr, val):
    """Atomically add val to the int64 at addr; returns the old value (sequentially consistent)."""
    if addr != types.int64 or val != types.int64:
        return None

    def codegen(context, builder, sig, args):
        p = builder.inttoptr(args[0], _I64.as_pointer())
        return builder.atomic_rmw("add", p, args[1], "seq_cst")

    return types.int64(types.int64, types.int64), codegen


@intrinsic
def _atomic_load(typingctx, addr):
    if addr != types.int64:
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(builder.inttoptr(args[0], _I64.as_pointer()), "seq_cst", 8)

    return types.int64(types.int64), codegen


@intrinsic
def _atomic_store(typingctx, addr, val):
    if addr != types.int64 or val != types.int64:
        return None

    def codegen(context, builder, sig, args):
        builder.store_atomic(args[1], builder.inttoptr(args[0], _I64.as_pointer()), "seq_cst", 8)
        return context.get_dummy_value()

    return types.void(types.int64, types.int64), codegen


@intrinsic
def _syscall4(typingctx, addr, nr, a1, a2, a3, a4):
    """Call libc's ``long syscall(long nr, ...)`` at addr with four integer arguments (pointers as
    integers), declared variadic as it is."""
    if not all(t == types.int64 for t in (addr, nr, a1, a2, a3, a4)):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_I64, [_I64], var_arg=True)
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))

    return types.int64(*(types.int64,) * 6), codegen


@intrinsic
def _gomp_parallel(typingctx, addr, body, data, threads):
    """Call ``void GOMP_parallel(void (*fn)(void *), void *data, unsigned threads, unsigned
    flags)`` at addr: run body(data) on a team of `threads` (this thread included) and return when
    every member has."""
    if not all(t == types.int64 for t in (addr, body, data, threads)):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [_I8P, _I8P, _I32, _I32])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        builder.call(
            fn,
            [
                builder.inttoptr(args[1], _I8P), builder.inttoptr(args[2], _I8P),
                builder.trunc(args[3], _I32), _c(0),
            ],
        )  # fmt: skip
        return context.get_dummy_value()

    return types.void(*(types.int64,) * 4), codegen


_ARCH = platform.machine().lower()


@intrinsic
def _pause(typingctx):
    """The CPU's spin-wait hint (x86 ``pause``, ARM ``yield``), nothing elsewhere."""

    def codegen(context, builder, sig, args):
        if _ARCH in ("x86_64", "amd64", "i386", "i686"):
            fn = builder.module.declare_intrinsic(
                "llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), [])
            )
            builder.call(fn, [])
        elif _ARCH in ("aarch64", "arm64"):
            fn = builder.module.declare_intrinsic(
                "llvm.aarch64.hint", fnty=ir.FunctionType(ir.VoidType(), [_I32])
            )
            builder.call(fn, [_c(1)])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _call_int(typingctx, addr):
    """Call ``int f(void)`` at addr (``omp_get_thread_num``) and return its value."""
    if addr != types.int64:
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_I32, [])
        return builder.sext(builder.call(builder.inttoptr(args[0], fnty.as_pointer()), []), _I64)

    return types.int64(types.int64), codegen


@intrinsic
def _call_int_void(typingctx, addr):
    """Call ``int f(void)`` at addr (``sched_yield``). The address is a run-time value: code that
    embeds a library's address cannot be cached."""
    if addr != types.int64:
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_I32, [])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])
        return context.get_dummy_value()

    return types.void(types.int64), codegen


@intrinsic
def _call_block(typingctx, fn, args, blk):
    """Call ``void fn(int64 args, int64 block)`` at address fn (a task of kind _CALL)."""
    if not all(t == types.int64 for t in (fn, args, blk)):
        return None

    def codegen(context, builder, sig, args_):
        fnty = ir.FunctionType(ir.VoidType(), [_I64, _I64])
        builder.call(builder.inttoptr(args_[0], fnty.as_pointer()), list(args_[1:]))
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def _f64_bits(typingctx, v):
    """The bits of a float64 as an int64 (to carry ε in the int64 task block)."""
    if v != types.float64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _I64)

    return types.int64(types.float64), codegen


@intrinsic
def _bits_f64(typingctx, v):
    if v != types.int64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


# ----------------------------------------------------------------------------------------------
# Row helpers. A row is n elements at an address; `t` arguments are float32 scratch rows private to
# one thread (they stay in L1/L2: extra passes over them are cheap).
# ----------------------------------------------------------------------------------------------
@njit
def _esize(code):
    return 4 if code == F32 else 2


@njit
def _load_row(addr, n, code, t):
    """The row as float32: a view of the input for float32, else converted into t."""
    if code == F32:
        return carray(_ptr_f32(addr), n)
    src = carray(_ptr_u16(addr), n)
    if code == BF16:
        for j in range(n):
            t[j] = _bf16_to_f32(src[j])
    else:
        for j in range(n):
            t[j] = _f16_to_f32(src[j])
    return t[:n]


@njit
def _add_row(addr, n, code, t):
    """t += the row (float32 sum)."""
    if code == F32:
        src = carray(_ptr_f32(addr), n)
        for j in range(n):
            t[j] = t[j] + src[j]
    elif code == BF16:
        src16 = carray(_ptr_u16(addr), n)
        for j in range(n):
            t[j] = t[j] + _bf16_to_f32(src16[j])
    else:
        src16 = carray(_ptr_u16(addr), n)
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
def _store_row(t, addr, n, code):
    """Write the float32 row t to the row at addr, converting to the dtype `code`."""
    if code == F32:
        dst = carray(_ptr_f32(addr), n)
        for j in range(n):
            dst[j] = t[j]
    elif code == BF16:
        dst16 = carray(_ptr_u16(addr), n)
        for j in range(n):
            dst16[j] = _f32_to_bf16(t[j])
    else:
        dst16 = carray(_ptr_u16(addr), n)
        for j in range(n):
            dst16[j] = _f32_to_f16(t[j])


@njit
def _params(dst, n, addr, stride, code, offset, c_round):
    """dst = the (N,) parameter at addr (element stride `stride`, 0 for an expanded one) as float32,
    rounded to `c_round`, plus offset rounded again: ``p.to(dtype) + offset`` as torch computes it
    in that dtype."""
    span = (n - 1) * stride + 1
    if code == F32:
        a32 = carray(_ptr_f32(addr), span)
        if stride == 1:
            for j in range(n):
                dst[j] = a32[j]
        else:
            for j in range(n):
                dst[j] = a32[j * stride]
    elif code == F64:
        a64 = carray(_ptr_f64(addr), span)
        for j in range(n):
            dst[j] = np.float32(a64[j * stride])
    else:
        a16 = carray(_ptr_u16(addr), span)
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


@njit
def _field(flags, f):
    return (flags >> f[0]) & ((1 << f[1]) - 1)


# Row statistics are accumulated in float64 (they come out as the correctly rounded float32
# values in practice) and may be reassociated, so LLVM vectorizes them; float32 sums in their place
# measured no faster (docs/cpu.md). Nothing else is fastmath: the element-wise products round
# exactly as torch's eager ops do. A row whose float64 sum is tiny (< _TINY) is summed again the
# way torch sums it, squares (and x − μ) in float32, so that squares that underflow float32
# (|x| ≲ 1e-19) do there what they do in torch: an all-tiny row then gets r = inf with eps = 0, as
# torch's (and the other backends') does. Above _TINY, what underflows in float32 is below 2^-35
# of the sum, so both ways agree to rounding.
_TINY = 2.0**-60


@njit(fastmath={"reassoc", "contract"})
def _sum_squares64(x, k):
    acc = 0.0
    for j in range(k):
        v = np.float64(x[j])
        acc += v * v
    return acc


@njit(fastmath={"reassoc", "contract"})
def _sum_squares32(x, k):
    """Σ_{j<k} x_j² with each square rounded to float32 (as torch's x.pow(2)), summed in float64."""
    acc = 0.0
    for j in range(k):
        acc += np.float64(x[j] * x[j])
    return acc


@njit
def _sum_squares(x, k):
    """Σ_{j<k} x_j² in float64 (float32 squares for a tiny row, see above)."""
    ss = _sum_squares64(x, k)
    return _sum_squares32(x, k) if ss < _TINY else ss


@njit(fastmath={"reassoc", "contract"})
def _shifted_sums(x, n, c):
    """Σ (x − c) and Σ (x − c)² in float64; with c = x[0] the variance from them has no cancellation
    unless the row's spread is tiny next to |x[0] − mean|, and a constant row gets μ = c exactly
    and σ² = 0 (x − μ = 0, as in torch)."""
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
    acc = 0.0
    for j in range(n):
        d = x[j] - mu
        acc += np.float64(d * d)
    return acc


@njit
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
    acc = 0.0
    for j in range(n):
        acc += (np.float64(dy[j]) * s64[j]) * np.float64(x[j])
    return acc


@njit(fastmath={"reassoc", "contract"})
def _sum_g_gx(dy, x, s64, n, mu):
    """Σ g and Σ g·(x − μ) in float64 (LayerNorm's Σ g·x̂ is r times the second)."""
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
    for j in range(k):
        out[j] = np.float32(a * (np.float64(dy[j]) * s64[j]) - b * np.float64(x[j]))
    for j in range(k, n):
        out[j] = np.float32(a * (np.float64(dy[j]) * s64[j]))


@njit(fastmath={"contract"})
def _dx_ln(dy, x, s64, n, mu, a, b, c, out):
    """out_j = a·g_j − b·(x_j − μ) + c (g = dy·s), in float64, rounded once."""
    mud = np.float64(mu)
    for j in range(n):
        out[j] = np.float32(a * (np.float64(dy[j]) * s64[j]) - b * (np.float64(x[j]) - mud) + c)


# "llama" / "none" products in one pass: v = x·r rounded to c_mul (the input dtype), times the
# scale (already rounded to the output dtype), plus β rounded again, stored in the output dtype
# (which rounds), each rounding where torch's eager ops round. One loop per combination, so that
# each vectorizes (four loops with a rounding pass each measured 1.7-2.4x the gemma forward).
@njit
def _apply_rounded(xs, rr, s, b, has_b, c_mul, y_code, yaddr, n):
    if y_code == F32:
        out = carray(_ptr_f32(yaddr), n)
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
        out16 = carray(_ptr_u16(yaddr), n)
        if has_b:
            for j in range(n):
                v = _bf16_to_f32(_f32_to_bf16(_bf16_to_f32(_f32_to_bf16(xs[j] * rr)) * s[j]))
                out16[j] = _f32_to_bf16(v + b[j])
        else:
            for j in range(n):
                out16[j] = _f32_to_bf16(_bf16_to_f32(_f32_to_bf16(xs[j] * rr)) * s[j])
    elif y_code == F16 and c_mul == F16:
        out16 = carray(_ptr_u16(yaddr), n)
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
    t = np.empty(n, np.float32)
    for j in range(n):
        v = _round(_round(xs[j] * rr, c_mul) * s[j], y_code)
        t[j] = _round(v + b[j], y_code) if has_b else v
    _store_row(t, yaddr, n, y_code)


# ----------------------------------------------------------------------------------------------
# The task block: one int64 array per work-sharing pool, read by every thread of a call. The words
# the threads update are a cache line (8 words) apart.
# ----------------------------------------------------------------------------------------------
_GEN, _ARRIVED, _DONE, _ACTIVE = 0, 8, 16, 24  # generation (odd while written), arrivals, done
_SLEEPERS = 32  # helpers asleep in futex_wait on the generation word
HELPED = 36  # blocks the helpers have run, in all (for tests and measurements)
HELPER_SPINS = 37  # a helper's pause-loop iterations between a task and sleep (set by the pool)
# What `ctrl` points to: a pool's task block (MODE = POOL), or an OpenMP launch (MODE = OPENMP:
# GOMP_parallel's address, the team body's address, the team size); the call then fills a private
# task block and runs it on an OpenMP team (torch's own threads).
MODE, GOMP, BODY, TEAM = 38, 39, 33, 34
TID = 35  # omp_get_thread_num's address (0 where not found: team members take ranges as they come)
POOL, OPENMP = 0, 1
# set once by the pool: sched_yield's and syscall's addresses, the futex number, a stop flag, and
# the helpers' futex timeout as a struct timespec (seconds, nanoseconds)
YIELD, SYSCALL, SYS_FUTEX, STOP, TIMESPEC = 40, 41, 42, 43, 44  # (44, 45: the timespec)
WANT = 46  # helpers allowed to join the next task (written by the launcher before the call)
_KIND, _NB, _RPB = 48, 49, 50  # task kind, blocks, rows a block
_M, _N, _K, _FLAGS = 51, 52, 53, 54  # the call's sizes and flags (both kinds)
# forward: input, residual, h and y rows (address, row stride), the float32 scale / bias rows
_X, _XS, _R, _RS, _H, _Y, _S, _B, _MEAN, _RSTD, _EPS = 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65
# backward: dy, dresidual, dx; the scale; the statistics; the float32 partial rows of dw and db
_DY, _DYS, _DR, _DRS, _DX, _PW, _PB = 66, 67, 68, 69, 70, 71, 72
_PARTS = 73  # the contiguous ranges the blocks are split into (one per thread of the call)
# a task of kind _CALL: the address of a compiled ``void fn(int64 args, int64 block)`` that runs
# one block, and its argument block (kernels of other modules share calls this way: run_blocks)
_FN, _ARGS = 74, 75
# Range t's claim counter is word _CNT + 8·t (a cache line each), t < MAX_PARTS.
_CNT, MAX_PARTS = 80, 64
WORDS = _CNT + 8 * MAX_PARTS
_FORWARD, _BACKWARD, _CALL = 0, 1, 2
SPINS = 2000  # pause-loop iterations before a waiting thread starts yielding its core (~20-60 µs)
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129  # FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE


@njit
def _addr(c, i):
    """Address of word i of the task block c."""
    return np.int64(c.ctypes.data) + 8 * i


@njit
def _backoff(c, spins):
    """One step of a wait: spin on the CPU's pause hint, then yield the core between checks (a
    helper that was preempted mid-block finishes sooner when the waiter gives its core away)."""
    if spins >= SPINS and c[YIELD] != 0:
        _call_int_void(c[YIELD])
    else:
        _pause()
    return spins + 1


# ----------------------------------------------------------------------------------------------
# Forward: RMSNorm (optionally with the residual add) and LayerNorm, rows [lo, hi)
# ----------------------------------------------------------------------------------------------
@njit
def _fwd_rows(c, lo, hi, tx, ty):
    m, n, k, flags = c[_M], c[_N], c[_K], c[_FLAGS]
    x_code, r_code, y_code = _field(flags, FX), _field(flags, FR), _field(flags, FY)
    has_res, norm, eps_mode = _field(flags, FHAS_RES), _field(flags, FNORM), _field(flags, FEPS)
    c_pre, c_r = _field(flags, FC_PRE), _field(flags, FC_R)
    c_mul, c_out = _field(flags, FC_MUL), _field(flags, FC_OUT)
    has_b = _field(flags, FHAS_B) == 1
    eps = _bits_f64(c[_EPS])
    s = carray(_ptr_f32(c[_S]), n)
    b = carray(_ptr_f32(c[_B]), n)  # not read without a bias
    mean = carray(_ptr_f32(c[_MEAN]), m)  # LayerNorm only
    rstd = carray(_ptr_f32(c[_RSTD]), m)
    xb, xs = c[_X], c[_XS] * _esize(x_code)
    rb, rs = c[_R], c[_RS] * _esize(r_code)
    hb, yb = c[_H], c[_Y]
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
            _store_row(xs_, hb + i * n * _esize(r_code), n, r_code)
        elif x_code == BF16:  # convert and reduce in the pass that reads the row
            xs_ = tx[:n]
            xrow = carray(_ptr_u16(xb + i * xs), n)
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
            ms = ss / k
            if eps_mode == MEAN_SQUARE:
                r = np.float32(1.0 / np.sqrt(ms + eps))
            else:
                r = np.float32(1.0 / (np.sqrt(ms) + eps))
        rstd[i] = r

        yaddr = yb + i * n * _esize(y_code)
        if fused:  # statistics and products in float32, one conversion at the store
            if y_code == F32:
                _normalize(xs_, mu, r, s, b, has_b, norm, carray(_ptr_f32(yaddr), n))
            elif y_code == BF16:
                _normalize_bf16(xs_, mu, r, s, b, has_b, norm, carray(_ptr_u16(yaddr), n))
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


# ----------------------------------------------------------------------------------------------
# Backward: dx for every row, d weight / d bias as per-block partial rows summed in a fixed order
# ----------------------------------------------------------------------------------------------
@njit
def _bwd_block(c, blk, tx, tdy, tdx):
    m, n, k, flags = c[_M], c[_N], c[_K], c[_FLAGS]
    dy_code, x_code, dr_code = _field(flags, BDY), _field(flags, BX), _field(flags, BDR)
    has_dr, norm, eps_mode = _field(flags, BHAS_DR), _field(flags, BNORM), _field(flags, BEPS)
    c_xhat = _field(flags, BC_XHAT)
    need_dw, need_db = _field(flags, BNEED_DW) == 1, _field(flags, BNEED_DB) == 1
    s64 = carray(_ptr_f64(c[_S]), n)
    mean = carray(_ptr_f32(c[_MEAN]), m)  # LayerNorm only
    rstd = carray(_ptr_f32(c[_RSTD]), m)
    pw = carray(_ptr_f32(c[_PW] + 4 * blk * n), n)  # this block's partial rows (when needed)
    pb = carray(_ptr_f32(c[_PB] + 4 * blk * n), n)
    if need_dw:
        pw[:] = 0.0
    if need_db:
        pb[:] = 0.0
    xb, xs = c[_X], c[_XS] * _esize(x_code)
    dyb, dys_ = c[_DY], c[_DYS] * _esize(dy_code)
    drb, drs = c[_DR], c[_DRS] * _esize(dr_code)
    dxb = c[_DX]
    rpb = c[_RPB]
    direct = x_code == F32 and not has_dr  # dx goes straight to the output row
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
        out = carray(_ptr_f32(dxb + i * n * 4), n) if direct else tdx[:n]
        if norm == LAYER_NORM:
            _dx_ln(dys, xs_, s64, n, mu, a, b, cc, out)
        else:
            _dx_rms(dys, xs_, s64, n, k, a, b, out)
        # d weight and d bias partials in float32, x̂ = (x − μ)·r rounded as the reference rounds it
        # (to the input dtype in "llama" mode). A separate pass over the cached row costs no more
        # than fusing it into dx's (measured).
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
            elif norm == LAYER_NORM:
                for j in range(n):
                    pw[j] += dys[j] * ((xs_[j] - mu) * r)
            else:
                for j in range(n):
                    pw[j] += dys[j] * (xs_[j] * r)
        if need_db:
            for j in range(n):
                pb[j] += dys[j]
        if not direct:
            if has_dr:
                _add_row(drb + i * drs, n, dr_code, tdx)
            _store_row(tdx, dxb + i * n * _esize(x_code), n, x_code)


@njit
def _reduce_partials(p, nb, n, addr, code, acc):
    """Σ over the nb partial rows of p (float32, block order, in float64) into the (N,) output at
    addr in the dtype `code` (float64 → float32 → half, as torch's ``.to`` converts)."""
    for j in range(n):
        acc[j] = 0.0
    for blk in range(nb):
        row = p[blk * n : (blk + 1) * n]
        for j in range(n):
            acc[j] += np.float64(row[j])
    if code == F64:
        out64 = carray(_ptr_f64(addr), n)
        for j in range(n):
            out64[j] = acc[j]
    else:
        t = np.empty(n, np.float32)
        for j in range(n):
            t[j] = np.float32(acc[j])
        _store_row(t, addr, n, code)


# ----------------------------------------------------------------------------------------------
# Work sharing. A call's blocks of rows are split into `parts` contiguous ranges, one per thread
# of the call, each with its own claim counter. Thread t of the call (the caller is 0; an OpenMP
# team member's number, a pool helper's index + 1) runs range t's blocks in order, streaming
# through memory as thread t of torch's own parallel_for does — and the same rows in a forward
# and in the backward that follows, which finds them in its core's cache where they fit — then it
# takes the blocks still left in the other ranges, one at a time. So no thread waits for another
# to start: the blocks of a thread that arrives late (or never: a helper the scheduler does not
# run) are run by the others, and the caller only waits for blocks already claimed. Blocks depend
# on the sizes alone, never on the threads, so neither the number of threads nor which thread ran
# which block changes a result.
# ----------------------------------------------------------------------------------------------
@njit
def _set_ranges(c, nb, parts):
    """Split the nb blocks into `parts` contiguous ranges (their claim counters at their starts)."""
    c[_PARTS] = parts
    for t in range(parts):
        c[_CNT + 8 * t] = t * nb // parts


@njit
def _left(c, nb, parts):
    """Whether some range still has a block nobody has claimed."""
    for t in range(parts):
        if _atomic_load(_addr(c, _CNT + 8 * t)) < (t + 1) * nb // parts:
            return True
    return False


@njit
def _claim(c, me):
    """Join the published task as thread `me` (< 0: the next free range, in order of arrival):
    run the blocks of range `me`, then those left in the others' (see above); returns how many
    blocks it ran."""
    nb, n, parts = c[_NB], c[_N], c[_PARTS]
    if me < 0:
        me = _atomic_add(_addr(c, _ARRIVED), 1)
    me = me % parts
    if not _left(c, nb, parts):
        return 0
    # Scratch rows as plain views of one allocation: arrays without an owner are passed between
    # functions without reference counting (atomic increments: ~15 ns a row measured).
    scratch = np.empty(3 * n, np.float32)
    base = np.int64(scratch.ctypes.data)
    tx = carray(_ptr_f32(base), n)
    ty = carray(_ptr_f32(base + 4 * n), n)
    tz = carray(_ptr_f32(base + 8 * n), n)
    kind, rpb, m = c[_KIND], c[_RPB], c[_M]
    ran = 0
    for step in range(parts):
        t = (me + step) % parts
        hi = (t + 1) * nb // parts
        counter = _addr(c, _CNT + 8 * t)
        while _atomic_load(counter) < hi:
            blk = _atomic_add(counter, 1)
            if blk >= hi:
                break
            ran += 1
            if kind == _FORWARD:
                _fwd_rows(c, blk * rpb, min(m, (blk + 1) * rpb), tx, ty)
            elif kind == _BACKWARD:
                _bwd_block(c, blk, tx, ty, tz)
            else:
                _call_block(c[_FN], c[_ARGS], blk)
            _atomic_add(_addr(c, _DONE), 1)
    scratch[:0] = 0.0  # the scratch rows live until here
    return ran


@njit
def _publish_begin(c):
    """Mark the task block as being written and wait until no helper is inside the last task (a
    helper registers in ACTIVE, then checks the generation: one of the two sides sees the other)."""
    gen = _atomic_load(_addr(c, _GEN))
    _atomic_store(_addr(c, _GEN), gen + 1)
    spins = 0
    while _atomic_load(_addr(c, _ACTIVE)) != 0:
        spins = _backoff(c, spins)
    return gen + 2


@njit
def _run_published(c, gen, nb):
    """Publish generation gen (the task words are written), run blocks, wait for the blocks others
    claimed."""
    _atomic_store(_addr(c, _ARRIVED), 0)
    _atomic_store(_addr(c, _DONE), 0)
    _atomic_store(_addr(c, _GEN), gen)
    # A helper counts itself in SLEEPERS before its last look at GEN: one of the two sides sees
    # the other, so no wake-up is lost and none is made while every helper is awake.
    if _atomic_load(_addr(c, _SLEEPERS)) > 0:
        _syscall4(c[SYSCALL], c[SYS_FUTEX], _addr(c, _GEN), _FUTEX_WAKE, 1 << 30, 0)
    _claim(c, 0)
    spins = 0
    while _atomic_load(_addr(c, _DONE)) < nb:
        spins = _backoff(c, spins)


@njit
def _task_block(ctrl):
    """The pool's task block at address ctrl, or a private one (this thread alone, ctrl = 0, or an
    OpenMP team)."""
    if ctrl != 0 and carray(_ptr_i64(ctrl), WORDS)[MODE] == POOL:
        return carray(_ptr_i64(ctrl), WORDS)
    c = np.empty(WORDS, np.int64)  # (every word a private task reads is written first)
    c[_ARRIVED] = 0
    c[_DONE] = 0
    return c


@njit
def _run(ctrl, c, gen, nb):
    """Run the task written in c: alone, with the pool's helpers (c is the pool's block, gen its
    generation) or on an OpenMP team (ctrl points to the launch words)."""
    if ctrl == 0:
        _set_ranges(c, nb, 1)
        _claim(c, 0)
        return
    launch = carray(_ptr_i64(ctrl), WORDS)
    if launch[MODE] == POOL:
        _set_ranges(c, nb, min(1 + c[WANT], nb, MAX_PARTS))
        _run_published(c, gen, nb)
        return
    team = min(launch[TEAM], nb, MAX_PARTS)  # no more threads than blocks
    _set_ranges(c, nb, team)
    c[TID] = launch[TID]
    if team < 2:
        _claim(c, 0)
    else:
        _gomp_parallel(launch[GOMP], launch[BODY], np.int64(c.ctypes.data), team)


@njit
def _begin(ctrl, c):
    """The generation to publish in the pool's block (after waiting out the last task's helpers);
    0 where the task block is private."""
    if ctrl != 0 and carray(_ptr_i64(ctrl), WORDS)[MODE] == POOL:
        return _publish_begin(c)
    return 0


@njit
def run_blocks(ctrl, fn, args, nb):
    """Run blocks 0 … nb − 1 of a task of another module as this module's own tasks run: alone
    (ctrl = 0), with the pool's helpers or on an OpenMP team (ctrl as the launchers give it).
    fn is the address of a compiled ``void fn(int64 args, int64 block)`` that runs one block (a
    numba ``cfunc``, which keeps its own scratch), args the address of its argument block. Blocks
    must depend on the sizes alone, as this module's do, so that results do not depend on the
    threads."""
    c = _task_block(ctrl)
    gen = _begin(ctrl, c)
    c[_KIND], c[_NB], c[_RPB] = _CALL, nb, 1
    c[_M], c[_N], c[_K], c[_FLAGS] = nb, 1, 1, 0  # (one-element scratch rows: unused)
    c[_FN], c[_ARGS] = fn, args
    _run(ctrl, c, gen, nb)


# ----------------------------------------------------------------------------------------------
# Entry points: compiled with one signature each, loaded from numba's on-disk cache where possible
# ----------------------------------------------------------------------------------------------
CACHED = True  # False where no cache directory is writable: the entry points compile in-process
ENTRIES: list = []  # (dispatcher, argument types)


def _entry(*argtypes):
    def wrap(fn):
        global CACHED
        try:
            disp = njit(nogil=True, cache=True)(fn)
        except RuntimeError:  # numba found no writable cache directory ("no locator available")
            CACHED = False
            disp = njit(nogil=True)(fn)
        ENTRIES.append((disp, argtypes))
        return disp

    return wrap


_i, _f = types.int64, types.float64


@_entry(*(_i,) * 16, _f, _f, _i)
def forward(
    ctrl, xp, xs, rp, rs, hp, yp, wp, ws, bp, bs, meanp, rstdp, m, n, k, eps, offset, flags
):
    """RMSNorm (with the residual add where has_res) or LayerNorm over m rows of n elements; y, h,
    mean and rstd are contiguous outputs. ctrl: a pool's task block, or 0 to run alone."""
    sp, bp_, owner = _param_rows(
        n, wp, ws, _field(flags, FW), _field(flags, FHAS_W) == 1, bp, bs, _field(flags, FB),
        _field(flags, FHAS_B) == 1, offset, _field(flags, FC_PARAM),
    )  # fmt: skip
    rpb = max(1, 16384 // n)  # ~16 K elements a block
    nb = (m + rpb - 1) // rpb
    c = _task_block(ctrl)
    gen = _begin(ctrl, c)
    c[_KIND], c[_NB], c[_RPB] = _FORWARD, nb, rpb
    c[_M], c[_N], c[_K], c[_FLAGS] = m, n, k, flags
    c[_X], c[_XS], c[_R], c[_RS], c[_H], c[_Y] = xp, xs, rp, rs, hp, yp
    c[_S], c[_B], c[_MEAN], c[_RSTD], c[_EPS] = sp, bp_, meanp, rstdp, _f64_bits(eps)
    _run(ctrl, c, gen, nb)
    # numba frees an array after its last use: this keeps the rows until every block is done
    owner[:0] = 0.0


@njit
def _bwd_rows_per_block(m, n):
    # ≥ 16 rows (the float32 partial rows of d weight are then ≤ 1/16 of the input), ~16 K elements
    # where rows are short, and at most 64 blocks: the caller sums the partial rows alone (64·N
    # additions: ~0.1 ms at N = 4096, where 8192 × 4096 in blocks of 16 rows left it 512·N,
    # ~1-2 ms of a 15 ms call on two threads). Fixed by the sizes alone: d weight is summed in the
    # same order on any number of threads.
    return max(16, (16384 + n - 1) // n, (m + 63) // 64)


@_entry(*(_i,) * 17, _f, _i)
def backward(ctrl, dyp, dys, xp, xs, drp, drs, dxp, wp, ws, meanp, rstdp, dwp, dbp, m, n, k,
             offset, flags):  # fmt: skip
    """dx (contiguous, x's dtype) for m rows; dw / db (contiguous (N,), their codes) where needed.
    x is the normalized input (h for add_rms_norm); dresidual, where given, is added to dx."""
    sp, _, owner = _param_rows(
        n, wp, ws, _field(flags, BW), _field(flags, BHAS_W) == 1, 0, 0, F32, False, offset, F32
    )
    s32 = carray(_ptr_f32(sp), n)
    s64 = np.empty(n, np.float64)  # the scale in float64: every element's g = dy·s is exact
    for j in range(n):
        s64[j] = s32[j]
    need_dw, need_db = _field(flags, BNEED_DW), _field(flags, BNEED_DB)
    rpb = _bwd_rows_per_block(m, n)
    nb = (m + rpb - 1) // rpb
    pw = np.empty(nb * n if need_dw else 0, np.float32)
    pb = np.empty(nb * n if need_db else 0, np.float32)
    c = _task_block(ctrl)
    gen = _begin(ctrl, c)
    c[_KIND], c[_NB], c[_RPB] = _BACKWARD, nb, rpb
    c[_M], c[_N], c[_K], c[_FLAGS] = m, n, k, flags
    c[_DY], c[_DYS], c[_X], c[_XS], c[_DR], c[_DRS], c[_DX] = dyp, dys, xp, xs, drp, drs, dxp
    c[_S], c[_MEAN], c[_RSTD], c[_PW], c[_PB] = (
        s64.ctypes.data,
        meanp,
        rstdp,
        pw.ctypes.data,
        pb.ctypes.data,
    )
    _run(ctrl, c, gen, nb)
    owner[:0] = 0.0
    s64[:0] = 0.0  # keep the scale rows until every block is done
    if need_dw or need_db:
        acc = np.empty(n, np.float64)
        if need_dw:
            _reduce_partials(pw, nb, n, dwp, _field(flags, BDW), acc)
        if need_db:
            _reduce_partials(pb, nb, n, dbp, _field(flags, BDB), acc)


@njit
def _next_task(c, last, forever):
    """Wait for a task newer than generation `last`; its generation, or `last` if none came (after
    a short spin when not `forever`; when the pool stops, always)."""
    spins = 0
    while True:
        gen = _atomic_load(_addr(c, _GEN))
        if gen != last and not gen & 1:
            return gen
        if _atomic_load(_addr(c, STOP)) != 0:
            return last
        if spins < c[HELPER_SPINS]:
            _pause()
            spins += 1
        elif not forever:
            return last
        else:  # sleep until the generation word changes (or the timeout: STOP is re-read)
            _atomic_add(_addr(c, _SLEEPERS), 1)
            if _atomic_load(_addr(c, _GEN)) == gen:
                _syscall4(c[SYSCALL], c[SYS_FUTEX], _addr(c, _GEN), _FUTEX_WAIT,
                          gen & 0xFFFFFFFF, _addr(c, TIMESPEC))  # fmt: skip
            _atomic_add(_addr(c, _SLEEPERS), -1)  # (a timeout goes back to sleep at once)


@_entry(_i, _i, _i, _i)
def serve(ctrl, index, last, forever):
    """A pool helper's work: help with each published task (claim its blocks) while `index` is
    below the task's WANT. With `forever`, loop until STOP, sleeping in futex_wait between tasks
    (Linux); else return after one task (or a short wait for one). Returns the last generation."""
    c = carray(_ptr_i64(ctrl), WORDS)
    while True:
        gen = _next_task(c, last, forever)
        if gen == last:
            return last
        last = gen
        _atomic_add(_addr(c, _ACTIVE), 1)
        if _atomic_load(_addr(c, _GEN)) == gen and index < c[WANT]:
            _atomic_add(_addr(c, HELPED), _claim(c, index + 1))
        _atomic_add(_addr(c, _ACTIVE), -1)
        if not forever:
            return last


def _team_member(data):
    """What every member of an OpenMP team runs: claim blocks of the task block at data, from the
    range of its thread number."""
    c = carray(data, (WORDS,), np.int64)
    _claim(c, _call_int(c[TID]) if c[TID] != 0 else -1)


def _make_team_body():
    global CACHED
    try:  # numba's C-callback class, built here so that compile_all compiles it with the rest
        from numba.core.ccallback import CFunc

        body = CFunc(
            _team_member,
            ((types.voidptr,), types.void),
            locals={},
            options={"error_model": "numpy"},
        )
    except (ImportError, TypeError):  # another numba: calls are shared with the helper pool
        return None
    try:
        body.enable_caching()
    except RuntimeError:  # no writable cache directory
        CACHED = False
    return body


# The team body: a C callback that GOMP_parallel runs on every member of a team.
TEAM_BODY = _make_team_body()


def cache_state() -> tuple[bool | None, str | None]:
    """(whether every entry point is in numba's on-disk cache, the cache directory); (False, None)
    where nothing can be cached, (None, None) where this numba does not let it be told."""
    if not CACHED:
        return False, None
    try:
        found = []
        for disp, argtypes in ENTRIES:
            disp.targetctx.refresh()
            key = disp._cache._index_key(argtypes, disp.targetctx.codegen())
            found.append(key in disp._cache._cache_file._load_index())
        if TEAM_BODY is not None:
            ctx = TEAM_BODY._targetdescr.target_context
            key = TEAM_BODY._cache._index_key(TEAM_BODY._sig, ctx.codegen())
            found.append(key in TEAM_BODY._cache._cache_file._load_index())
        return all(found), ENTRIES[0][0]._cache.cache_path
    except Exception:  # private numba API: only the message depends on it
        return None, None


def entry_point(disp):
    """The compiled function behind an entry point's one signature. Calling it skips the
    dispatcher's type resolution (~0.2 µs a call); the arguments must then have exactly the
    signature's types (Python ints and floats), which the launchers guarantee."""
    try:
        (cres,) = disp.overloads.values()
        return cres.entry_point
    except (AttributeError, ValueError):  # another numba: the dispatcher itself
        return disp


def compile_all() -> None:
    """Load every entry point from the cache, or compile it (and cache it where possible); then
    refuse further compilation, so that an argument of a wrong type fails instead of compiling."""
    for disp, argtypes in ENTRIES:
        disp.compile(argtypes)
        disp.disable_compile()
    if TEAM_BODY is not None:
        TEAM_BODY.compile()
