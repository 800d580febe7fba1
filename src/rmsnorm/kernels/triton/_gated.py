"""The grouped and gated RMSNorm kernels, forward and backward.

A tile is (BLOCK_M · GP, BLOCK_G): tile row t is group t % GP of row t // GP of the row block, so
the per-group statistics are row reductions of the tile and one program holds BLOCK_M whole rows
(GP ≥ G groups of BLOCK_G ≥ g columns, the padding masked). Programs walk row blocks with a grid
stride. Rows too long for one tile take the looped layout (``LOOP``, BLOCK_M rows and GP = 1): each
group is walked in BLOCK_G column blocks, a first pass for its statistics and a second for the
output. The backward's d weight / d bias are per-program partial rows in ACC, summed afterwards in
a fixed order (``sum_partials_kernel``): no atomics, the same bits on every run.

``GATING`` is 0 (no gate), 1 (norm, then gate) or 2 (gate, then norm), plus 4 for the sigmoid in
place of SiLU. Everything is computed in ACC (float32; float64 for float64 inputs) and rounded where
the casting mode rounds (docs/spec.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import _flags as flag
from ._common import any_row, as_acc, cvt, div, over_scale, overflowed, rnd, sqrt, sum_squares


@triton.jit
def _inv_rms(ss, sc, kf, eps, RMS_EPS: tl.constexpr, ACC: tl.constexpr):
    """r from the sum of squares of a group's first k elements (sc = s where it was rescaled, see
    ``sum_squares``)."""
    ms = div(ss, kf, ACC)
    if RMS_EPS:
        return div(tl.full(ss.shape, 1.0, ACC), sqrt(ms, ACC) + eps * sc, ACC) * sc
    else:
        return div(tl.full(ss.shape, 1.0, ACC), sqrt(ms + eps * sc * sc, ACC), ACC) * sc


@triton.jit
def _act(z, SIGMOID: tl.constexpr, ACC: tl.constexpr):
    """act(z) as torch computes it: σ(z) = 1/(1 + exp(−z)), SiLU = z/(1 + exp(−z)) (NaN at −inf,
    as there)."""
    e = tl.exp(-z) + 1.0
    if SIGMOID:
        return div(tl.full(z.shape, 1.0, ACC), e, ACC)
    else:
        return div(z, e, ACC)


@triton.jit
def _act_grad(z, SIGMOID: tl.constexpr, ACC: tl.constexpr):
    """act'(z): σ·(1 − σ), or σ·(1 + z·(1 − σ)) for SiLU (the spec's expressions)."""
    s = div(tl.full(z.shape, 1.0, ACC), tl.exp(-z) + 1.0, ACC)
    if SIGMOID:
        return s * (1.0 - s)
    else:
        return s * (1.0 + z * (1.0 - s))


@triton.jit
def _gated_input(x, a, CAST: tl.constexpr, IN: tl.constexpr, RNE: tl.constexpr):
    """u = x ⊙ act(z) (gate, then norm): in ACC, or in "none" mode rounded to the input dtype (x
    rounded to it first; a already is)."""
    if CAST == flag.CAST_NONE:
        return rnd(rnd(x, IN, RNE) * a, IN, RNE)
    else:
        return x * a


@triton.jit
def _apply(v, r, w, b, off, HAS_W: tl.constexpr, HAS_B: tl.constexpr, CAST: tl.constexpr,
           IN: tl.constexpr, OUT: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr):  # fmt: skip
    """n = (offset + γ) ⊙ v·r + β for an ACC tile v and its per-tile-row r, rounded where the
    casting mode rounds (``reference.rms_norm_apply``); w, b are the raw weight / bias tiles. OUT
    is the norm's output dtype (promote(input, weight) in "llama")."""
    if CAST == flag.CAST_GEMMA:
        y = v * r[:, None]
        if HAS_W:
            y = y * (w.to(ACC) + off)
        if HAS_B:
            y = y + b.to(ACC)
    elif CAST == flag.CAST_LLAMA:
        if OUT == tl.float64:
            P: tl.constexpr = tl.float64
        else:
            P: tl.constexpr = tl.float32
        y = cvt(v * r[:, None], IN, RNE).to(P)
        if HAS_W:
            s = rnd(w.to(P) + off.to(P), OUT, RNE)
            y = rnd(y * s, OUT, RNE)
        if HAS_B:
            y = rnd(y + rnd(b.to(P), OUT, RNE), OUT, RNE)
    else:
        if IN == tl.float64:
            P: tl.constexpr = tl.float64
        else:
            P: tl.constexpr = tl.float32
        y = rnd(rnd(v.to(P), IN, RNE) * rnd(r.to(P), IN, RNE)[:, None], IN, RNE)
        if HAS_W:
            s = rnd(rnd(w.to(P), IN, RNE) + off.to(P), IN, RNE)
            y = rnd(y * s, IN, RNE)
        if HAS_B:
            y = rnd(y + rnd(b.to(P), IN, RNE), IN, RNE)
    return y


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _fwd_v(X, Z, rows64, col0, cols, mask, stride_x, stride_z, GATING: tl.constexpr,
           CAST: tl.constexpr, IN: tl.constexpr, ACC: tl.constexpr,
           RNE: tl.constexpr):  # fmt: skip
    """(v, a): the normalized input tile (x, or x ⊙ act(z) gate-first) and act(z) (x when there is
    no gate), in ACC; col0 (per tile row) + cols are the columns."""
    c = col0[:, None] + cols[None, :]
    x = tl.load(X + rows64[:, None] * stride_x + c, mask=mask, other=0.0).to(ACC)
    if GATING % 4 != 0:
        z = tl.load(Z + rows64[:, None] * stride_z + c, mask=mask, other=0.0).to(ACC)
        a = _act(z, GATING >= 4, ACC)
        if CAST == flag.CAST_NONE:
            a = rnd(a, IN, RNE)
        if GATING % 4 == 2:
            v = _gated_input(x, a, CAST, IN, RNE)
        else:
            v = x
    else:
        a = x
        v = x
    return v, a


@triton.jit
def gated_rms_norm_fwd_kernel(
    X,  # (M, N) input x (h for the residual form)
    Z,  # (M, N) gate z (GATING % 4 != 0) else unused
    Y,  # (M, N) output y, contiguous
    W,  # (N,) weight (HAS_W) else unused
    B,  # (N,) bias (HAS_B) else unused
    RSTD,  # (M·G,) ACC: r per group
    stride_x, stride_z,  # row strides, in elements
    M, N, G, GS, K,  # rows, columns, groups a row, group size, leading columns the RMS is over
    eps: tl.float64,
    offset: tl.float64,
    BLOCK_M: tl.constexpr, GP: tl.constexpr, BLOCK_G: tl.constexpr,
    FLAGS: tl.constexpr,  # LOOP, W, B, RMS_EPS, PARTIAL, CAST, RNE (_flags)
    GATING: tl.constexpr,  # 0 none, 1 norm then gate, 2 gate then norm; + 4: sigmoid
    IN: tl.constexpr,  # the casting mode's input dtype
    OUT: tl.constexpr,  # the norm's output dtype (promote(input, weight) in "llama")
    ACC: tl.constexpr,
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & flag.LOOP) != 0
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    HAS_W: tl.constexpr = (FLAGS & flag.W) != 0
    HAS_B: tl.constexpr = (FLAGS & flag.B) != 0
    RMS_EPS: tl.constexpr = (FLAGS & flag.RMS_EPS) != 0
    PARTIAL: tl.constexpr = (FLAGS & flag.PARTIAL) != 0
    CAST: tl.constexpr = (FLAGS >> flag.CAST_SHIFT) & flag.FIELD_MASK
    GATE_LAST: tl.constexpr = GATING % 4 == 1
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    off = as_acc(offset, ACC)
    eps_a = as_acc(eps, ACC)
    kf = as_acc(K, ACC)
    num_rb = tl.cdiv(M, BLOCK_M)
    if LOOP:
        cols = tl.arange(0, BLOCK_G)
        for rb in tl.range(pid, num_rb, n_prog):
            rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
            rmask = rows < M
            rows64 = rows.to(tl.int64)
            for q in tl.range(0, G):
                col0 = tl.zeros([BLOCK_M], tl.int32) + q * GS
                acc = tl.zeros([BLOCK_M, BLOCK_G], ACC)
                for c0 in tl.range(0, K, BLOCK_G):
                    m = rmask[:, None] & ((c0 + cols) < K)[None, :]
                    v, a = _fwd_v(X, Z, rows64, col0 + c0, cols, m, stride_x, stride_z, GATING,
                                  CAST, IN, ACC, RNE)  # fmt: skip
                    acc += v * v
                ss = tl.sum(acc, axis=1)
                over = overflowed(ss, ACC)
                sc = over_scale(over, ACC)
                if any_row(over):  # rare: Σv² overflowed ACC; sum it again from s·v
                    acc = tl.zeros([BLOCK_M, BLOCK_G], ACC)
                    for c0 in tl.range(0, K, BLOCK_G):
                        m = rmask[:, None] & ((c0 + cols) < K)[None, :]
                        v, a = _fwd_v(X, Z, rows64, col0 + c0, cols, m, stride_x, stride_z,
                                      GATING, CAST, IN, ACC, RNE)  # fmt: skip
                        vs = v * sc[:, None]
                        acc += vs * vs
                    ss = tl.where(over, tl.sum(acc, axis=1), ss)
                r = _inv_rms(ss, sc, kf, eps_a, RMS_EPS, ACC)
                tl.store(RSTD + rows64 * G + q, r, mask=rmask)
                for c0 in tl.range(0, GS, BLOCK_G):
                    cm = (c0 + cols) < GS
                    m = rmask[:, None] & cm[None, :]
                    v, a = _fwd_v(X, Z, rows64, col0 + c0, cols, m, stride_x, stride_z, GATING,
                                  CAST, IN, ACC, RNE)  # fmt: skip
                    pc = q * GS + c0 + cols
                    w = tl.load(W + pc, mask=cm, other=0.0)[None, :] if HAS_W else 0.0
                    b = tl.load(B + pc, mask=cm, other=0.0)[None, :] if HAS_B else 0.0
                    y = _apply(v, r, w, b, off, HAS_W, HAS_B, CAST, IN, OUT, ACC, RNE)
                    if GATE_LAST:
                        y = y.to(ACC) * a
                    tl.store(Y + rows64[:, None] * N + pc[None, :], cvt(y, Y.dtype.element_ty, RNE),
                             mask=m)  # fmt: skip
    else:
        t = tl.arange(0, BLOCK_M * GP)
        q = t % GP
        cols = tl.arange(0, BLOCK_G)
        col0 = q * GS
        cm = (q < G)[:, None] & (cols < GS)[None, :]
        pc = col0[:, None] + cols[None, :]  # the parameters' columns, the same for every row
        w = tl.load(W + pc, mask=cm, other=0.0) if HAS_W else 0.0
        b = tl.load(B + pc, mask=cm, other=0.0) if HAS_B else 0.0
        for rb in tl.range(pid, num_rb, n_prog):
            rows = rb * BLOCK_M + t // GP
            rmask = (rows < M) & (q < G)
            rows64 = rows.to(tl.int64)
            m = rmask[:, None] & cm
            v, a = _fwd_v(X, Z, rows64, col0, cols, m, stride_x, stride_z, GATING, CAST, IN, ACC,
                          RNE)  # fmt: skip
            if PARTIAL:
                ss, sc = sum_squares(tl.where((cols < K)[None, :], v, 0.0), ACC)
            else:
                ss, sc = sum_squares(v, ACC)
            r = _inv_rms(ss, sc, kf, eps_a, RMS_EPS, ACC)
            tl.store(RSTD + rows64 * G + q, r, mask=rmask)
            y = _apply(v, r, w, b, off, HAS_W, HAS_B, CAST, IN, OUT, ACC, RNE)
            if GATE_LAST:
                y = y.to(ACC) * a
            tl.store(Y + rows64[:, None] * N + pc, cvt(y, Y.dtype.element_ty, RNE), mask=m)


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _bwd_terms(X, Z, DY, rows64, col0, cols, mask, stride_x, stride_z, stride_dy, r, w, b, off,
               HAS_W: tl.constexpr, HAS_B: tl.constexpr, GATING: tl.constexpr,
               CAST: tl.constexpr, IN: tl.constexpr, OUT: tl.constexpr, ACC: tl.constexpr,
               RNE: tl.constexpr):  # fmt: skip
    """Per tile: (x, v, a, da, dn, gs, dz) in ACC. dn is the gradient reaching the norm's output
    n (dy, or dy·a norm-then-gate), gs = dn·(offset + γ) and dz = dy·n·act'(z) norm-then-gate
    (0 otherwise; gate-first's d gate needs dv first)."""
    c = col0[:, None] + cols[None, :]
    x = tl.load(X + rows64[:, None] * stride_x + c, mask=mask, other=0.0).to(ACC)
    dy = tl.load(DY + rows64[:, None] * stride_dy + c, mask=mask, other=0.0).to(ACC)
    a = x
    da = x
    v = x
    dn = dy
    dz = dy * 0.0
    if GATING % 4 != 0:
        z = tl.load(Z + rows64[:, None] * stride_z + c, mask=mask, other=0.0).to(ACC)
        a = _act(z, GATING >= 4, ACC)
        da = _act_grad(z, GATING >= 4, ACC)
        if GATING % 4 == 2:
            if CAST == flag.CAST_NONE:
                v = _gated_input(x, rnd(a, IN, RNE), CAST, IN, RNE)
            else:
                v = _gated_input(x, a, CAST, IN, RNE)
        else:
            # n as the forward multiplied it by the gate: rounded in "llama", in ACC otherwise
            if CAST == flag.CAST_LLAMA:
                n = _apply(v, r, w, b, off, HAS_W, HAS_B, CAST, IN, OUT, ACC, RNE).to(ACC)
            else:
                n = _apply(v, r, w, b, off, HAS_W, HAS_B, flag.CAST_GEMMA, IN, OUT, ACC, RNE)
            dz = dy * n * da
            dn = dy * a
    if HAS_W:
        gs = dn * (w.to(ACC) + off)
    else:
        gs = dn
    return x, v, a, da, dn, gs, dz


@triton.jit
def _finite(r):
    """r where finite, 1 where r = inf: S = Σ gs·(v·r) is summed as r·Σ gs·v on a group with
    r = inf (ε = 0 and squares below float32's range), as the spec, whose sum stays finite."""
    return tl.where(r == float("inf"), 1.0, r)


@triton.jit
def _coef(sgv, ss, sc, r, kf, RMS_EPS: tl.constexpr, ACC: tl.constexpr):
    """f per tile row such that dv = r·gs − m·v̂·f: r·S/k ("mean_square") or S/(k·√(ss/k)), 0
    where the root is 0 ("rms"; scaled by sc where ss was rescaled); S = sgv = Σ gs·(v·r) (times
    r where r = inf, see _finite)."""
    s_ = tl.where(r == float("inf"), r * sgv, sgv)
    if RMS_EPS:
        root = sqrt(div(ss, kf, ACC), ACC)
        pos = root > 0
        return tl.where(pos, div(s_, kf * tl.where(pos, root, 1.0), ACC), 0.0) * sc
    else:
        return r * s_ / kf


@triton.jit
def gated_rms_norm_bwd_kernel(
    DY,  # (M, N) gradient of y
    X,  # (M, N) the forward's x (h for the residual form)
    Z,  # (M, N) gate (GATING % 4 != 0) else unused
    W,  # (N,) weight (HAS_W) else unused
    B,  # (N,) bias (HAS_B; norm-then-gate's n needs it) else unused
    RSTD,  # (M·G,) r per group
    DRES,  # (M, N) gradient added to dx (HAS_DRES) else unused
    DX,  # (M, N) output, x's dtype
    DZ,  # (M, N) output, the gate's dtype (GATING % 4 != 0) else unused
    PART,  # (programs, NEED_DW·N + NEED_DB·N) ACC partial d weight | d bias
    stride_dy, stride_x, stride_z, stride_dres,
    M, N, G, GS, K,
    offset: tl.float64,
    BLOCK_M: tl.constexpr, GP: tl.constexpr, BLOCK_G: tl.constexpr,
    FLAGS: tl.constexpr,  # LOOP, RES (d residual), W, B, DW, DB, RMS_EPS, PARTIAL, CAST, RNE
    GATING: tl.constexpr,
    IN: tl.constexpr, OUT: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & flag.LOOP) != 0
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    HAS_DRES: tl.constexpr = (FLAGS & flag.RES) != 0
    HAS_W: tl.constexpr = (FLAGS & flag.W) != 0
    HAS_B: tl.constexpr = (FLAGS & flag.B) != 0
    NEED_DW: tl.constexpr = (FLAGS & flag.DW) != 0
    NEED_DB: tl.constexpr = (FLAGS & flag.DB) != 0
    RMS_EPS: tl.constexpr = (FLAGS & flag.RMS_EPS) != 0
    PARTIAL: tl.constexpr = (FLAGS & flag.PARTIAL) != 0
    CAST: tl.constexpr = (FLAGS >> flag.CAST_SHIFT) & flag.FIELD_MASK
    LLAMA: tl.constexpr = CAST == flag.CAST_LLAMA
    GATE_FIRST: tl.constexpr = GATING % 4 == 2
    HAS_GATE: tl.constexpr = GATING % 4 != 0
    if NEED_DW and NEED_DB:
        stride_part = 2 * N
    else:
        stride_part = N
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    off = as_acc(offset, ACC)
    kf = as_acc(K, ACC)
    num_rb = tl.cdiv(M, BLOCK_M)
    part_row = PART + pid.to(tl.int64) * stride_part
    if NEED_DW:
        db_row = part_row + N
    else:
        db_row = part_row
    if LOOP:
        cols = tl.arange(0, BLOCK_G)
        for rb in tl.range(pid, num_rb, n_prog):
            rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
            rmask = rows < M
            rows64 = rows.to(tl.int64)
            # not this program's first row block: its partial rows are added to, not written
            later = (tl.zeros([BLOCK_G], tl.int32) + rb) != pid
            for q in tl.range(0, G):
                col0 = tl.zeros([BLOCK_M], tl.int32) + q * GS
                r = tl.load(RSTD + rows64 * G + q, mask=rmask, other=0.0).to(ACC)
                # pass 1: Σ gs·v over the group, Σ v² over its first K ("rms")
                acc_g = tl.zeros([BLOCK_M, BLOCK_G], ACC)
                acc_s = tl.zeros([BLOCK_M, BLOCK_G], ACC)
                for c0 in tl.range(0, GS, BLOCK_G):
                    cm = (c0 + cols) < GS
                    m = rmask[:, None] & cm[None, :]
                    pc = q * GS + c0 + cols
                    w = tl.load(W + pc, mask=cm, other=0.0)[None, :] if HAS_W else 0.0
                    b = tl.load(B + pc, mask=cm, other=0.0)[None, :] if HAS_B else 0.0
                    x, v, a, da, dn, gs, dz = _bwd_terms(
                        X, Z, DY, rows64, col0 + c0, cols, m, stride_x, stride_z, stride_dy, r,
                        w, b, off, HAS_W, HAS_B, GATING, CAST, IN, OUT, ACC, RNE,
                    )  # fmt: skip
                    acc_g += gs * (v * _finite(r)[:, None])
                    if RMS_EPS:
                        vk = tl.where(((c0 + cols) < K)[None, :], v, 0.0)
                        acc_s += vk * vk
                sgv = tl.sum(acc_g, axis=1)
                ss = tl.sum(acc_s, axis=1)
                sc = tl.full([BLOCK_M], 1.0, ACC)
                if RMS_EPS:
                    over = overflowed(ss, ACC)
                    sc = over_scale(over, ACC)
                    if any_row(over):  # rare: Σv² overflowed; sum it again from s·v
                        acc_s = tl.zeros([BLOCK_M, BLOCK_G], ACC)
                        for c0 in tl.range(0, K, BLOCK_G):
                            m = rmask[:, None] & ((c0 + cols) < K)[None, :]
                            pc = q * GS + c0 + cols
                            x, v, a, da, dn, gs, dz = _bwd_terms(
                                X, Z, DY, rows64, col0 + c0, cols, m, stride_x, stride_z,
                                stride_dy, r, 0.0, 0.0, off, False, False,
                                GATING % 4 // 2 * 2 + GATING // 4 * 4, CAST, IN, OUT, ACC, RNE,
                            )  # fmt: skip
                            vs = v * sc[:, None]
                            acc_s += vs * vs
                        ss = tl.where(over, tl.sum(acc_s, axis=1), ss)
                f = _coef(sgv, ss, sc, r, kf, RMS_EPS, ACC)
                # pass 2: dx, d gate, and the partial d weight / d bias rows
                for c0 in tl.range(0, GS, BLOCK_G):
                    cm = (c0 + cols) < GS
                    m = rmask[:, None] & cm[None, :]
                    pc = q * GS + c0 + cols
                    w = tl.load(W + pc, mask=cm, other=0.0)[None, :] if HAS_W else 0.0
                    b = tl.load(B + pc, mask=cm, other=0.0)[None, :] if HAS_B else 0.0
                    x, v, a, da, dn, gs, dz = _bwd_terms(
                        X, Z, DY, rows64, col0 + c0, cols, m, stride_x, stride_z, stride_dy, r,
                        w, b, off, HAS_W, HAS_B, GATING, CAST, IN, OUT, ACC, RNE,
                    )  # fmt: skip
                    vhat = v * r[:, None]
                    corr = vhat * f[:, None]
                    if PARTIAL:
                        corr = tl.where(((c0 + cols) < K)[None, :], corr, 0.0)
                    dv = r[:, None] * gs - corr
                    if GATE_FIRST:
                        dz = dv * x * da
                        dx = dv * a
                    else:
                        dx = dv
                    if HAS_DRES:
                        dx += tl.load(DRES + rows64[:, None] * stride_dres + pc[None, :], mask=m,
                                      other=0.0).to(ACC)  # fmt: skip
                    tl.store(DX + rows64[:, None] * N + pc[None, :],
                             cvt(dx, DX.dtype.element_ty, RNE), mask=m)  # fmt: skip
                    if HAS_GATE:
                        tl.store(DZ + rows64[:, None] * N + pc[None, :],
                                 cvt(dz, DZ.dtype.element_ty, RNE), mask=m)  # fmt: skip
                    if NEED_DW:
                        if LLAMA:
                            vhat = rnd(vhat, IN, RNE)
                        prev = tl.load(part_row + pc, mask=cm & later, other=0.0)
                        tl.store(part_row + pc, prev + tl.sum(tl.where(m, dn * vhat, 0.0), axis=0),
                                 mask=cm)  # fmt: skip
                    if NEED_DB:
                        prev = tl.load(db_row + pc, mask=cm & later, other=0.0)
                        tl.store(db_row + pc, prev + tl.sum(tl.where(m, dn, 0.0), axis=0),
                                 mask=cm)  # fmt: skip
    else:
        t = tl.arange(0, BLOCK_M * GP)
        q = t % GP
        cols = tl.arange(0, BLOCK_G)
        col0 = q * GS
        cm = (q < G)[:, None] & (cols < GS)[None, :]
        pc = col0[:, None] + cols[None, :]
        w = tl.load(W + pc, mask=cm, other=0.0) if HAS_W else 0.0
        b = tl.load(B + pc, mask=cm, other=0.0) if HAS_B else 0.0
        dw_acc = tl.zeros([BLOCK_M * GP, BLOCK_G], ACC)
        db_acc = tl.zeros([BLOCK_M * GP, BLOCK_G], ACC)
        for rb in tl.range(pid, num_rb, n_prog):
            rows = rb * BLOCK_M + t // GP
            rmask = (rows < M) & (q < G)
            rows64 = rows.to(tl.int64)
            m = rmask[:, None] & cm
            r = tl.load(RSTD + rows64 * G + q, mask=rmask, other=0.0).to(ACC)
            x, v, a, da, dn, gs, dz = _bwd_terms(
                X, Z, DY, rows64, col0, cols, m, stride_x, stride_z, stride_dy, r, w, b, off,
                HAS_W, HAS_B, GATING, CAST, IN, OUT, ACC, RNE,
            )  # fmt: skip
            sgv = tl.sum(gs * (v * _finite(r)[:, None]), axis=1)
            ss = sgv
            sc = sgv
            if RMS_EPS:
                if PARTIAL:
                    ss, sc = sum_squares(tl.where((cols < K)[None, :], v, 0.0), ACC)
                else:
                    ss, sc = sum_squares(v, ACC)
            f = _coef(sgv, ss, sc, r, kf, RMS_EPS, ACC)
            vhat = v * r[:, None]
            corr = vhat * f[:, None]
            if PARTIAL:
                corr = tl.where((cols < K)[None, :], corr, 0.0)
            dv = r[:, None] * gs - corr
            if GATE_FIRST:
                dz = dv * x * da
                dx = dv * a
            else:
                dx = dv
            if HAS_DRES:
                dx += tl.load(DRES + rows64[:, None] * stride_dres + pc, mask=m, other=0.0).to(ACC)
            tl.store(DX + rows64[:, None] * N + pc, cvt(dx, DX.dtype.element_ty, RNE), mask=m)
            if HAS_GATE:
                tl.store(DZ + rows64[:, None] * N + pc, cvt(dz, DZ.dtype.element_ty, RNE), mask=m)
            if NEED_DW:
                if LLAMA:
                    vhat = rnd(vhat, IN, RNE)
                dw_acc += tl.where(m, dn * vhat, 0.0)
            if NEED_DB:
                db_acc += tl.where(m, dn, 0.0)
        # the BLOCK_M rows of a tile that share a group, summed: (GP, BLOCK_G) partials
        gm = (tl.arange(0, GP) < G)[:, None] & (cols < GS)[None, :]
        gc = (tl.arange(0, GP) * GS)[:, None] + cols[None, :]
        if NEED_DW:
            dw = tl.sum(tl.reshape(dw_acc, [BLOCK_M, GP, BLOCK_G]), axis=0)
            tl.store(part_row + gc, dw, mask=gm)
        if NEED_DB:
            db = tl.sum(tl.reshape(db_acc, [BLOCK_M, GP, BLOCK_G]), axis=0)
            tl.store(db_row + gc, db, mask=gm)
