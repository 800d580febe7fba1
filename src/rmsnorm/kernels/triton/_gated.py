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
from ._common import (
    add_partials,
    as_acc,
    cvt,
    div,
    grid_slot,
    head,
    later_block,
    param,
    partial_rows,
    rnd,
    row_block,
    rowptr,
    store_partials,
    sum_squares,
    up,
)
from ._rms import (
    act,
    dw_term,
    finite_r,
    gated_input,
    inv_rms,
    load_input,
    loop_sum_squares,
    rescaled,
    rms_apply,
    rms_dx,
    rms_row_sums,
)


@triton.jit
def _act_grad(z, SIGMOID: tl.constexpr, ACC: tl.constexpr):
    """act'(z): σ·(1 − σ), or σ·(1 + z·(1 − σ)) for SiLU (the spec's expressions)."""
    s = div(tl.full(z.shape, 1.0, ACC), tl.exp(-z) + 1.0, ACC)
    if SIGMOID:
        return s * (1.0 - s)
    else:
        return s * (1.0 + z * (1.0 - s))


@triton.jit
def _out(n, a, GATING: tl.constexpr, ACC: tl.constexpr):
    """y from the norm's output n: n, or n ⊙ act(z) when the gate comes after the norm."""
    if GATING % 4 == 1:
        return n.to(ACC) * a
    else:
        return n


@triton.jit
def _group_tile(W, B, G, GS, BLOCK_M, GP, BLOCK_G, FLAGS):
    """The single-tile layout's tile of BLOCK_M rows × GP groups: (t, q, cols, cm, pc, w, b) —
    tile rows t and their groups q, the columns in a group and the tile's mask of real groups and
    columns, the parameters' columns pc (the same for every row) and the raw weight and bias."""
    t = tl.arange(0, BLOCK_M * GP)
    q = t % GP
    cols = tl.arange(0, BLOCK_G)
    cm = (q < G)[:, None] & (cols < GS)[None, :]
    pc = (q * GS)[:, None] + cols[None, :]
    w = param(W, pc, cm, FLAGS & flag.W)
    b = param(B, pc, cm, FLAGS & flag.B)
    return t, q, cols, cm, pc, w, b


@triton.jit
def _group_rows(X, Z, stride_x, stride_z, rb, t, q, cm, M, G, BLOCK_M, GP):
    """Row block rb of the single-tile layout: (rows64, rmask, m, xp, zp) — each tile row's row
    (int64), its mask and the tile's, and the row pointers of x and z."""
    rows = rb * BLOCK_M + t // GP
    rmask = (rows < M) & (q < G)
    rows64 = rows.to(tl.int64)
    xp = rowptr(X, rows64, stride_x)
    return rows64, rmask, rmask[:, None] & cm, xp, rowptr(Z, rows64, stride_z)


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------
@triton.jit
def gated_rms_norm_fwd_kernel(
    X,  # (M, N) input x (h for the residual form)
    Z,  # (M, N) gate z (GATING % 4 != 0) else unused
    Y,  # (M, N) output y, contiguous
    W,  # (N,) weight (FLAGS: W) else unused
    B,  # (N,) bias (FLAGS: B) else unused
    RSTD,  # (M·G,) ACC: r per group
    stride_x,  # row strides, in elements
    stride_z,
    M,  # rows
    N,  # columns
    G,  # groups a row
    GS,  # group size
    K,  # leading columns of a group the RMS is taken over
    eps: tl.float64,
    offset: tl.float64,
    BLOCK_M: tl.constexpr,
    GP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    FLAGS: tl.constexpr,  # LOOP, W, B, RMS_EPS, PARTIAL, CAST, RNE (_flags)
    GATING: tl.constexpr,  # 0 none, 1 norm then gate, 2 gate then norm; + 4: sigmoid
    IN: tl.constexpr,  # the casting mode's input dtype
    OUT: tl.constexpr,  # the norm's output dtype (promote(input, weight) in "llama")
    ACC: tl.constexpr,
):
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    pid, _, n_prog, num_rb, r_idx = grid_slot(M, BLOCK_M, 1)
    off = as_acc(offset, ACC)
    eps_a = as_acc(eps, ACC)
    kf = as_acc(K, ACC)
    if (FLAGS & flag.LOOP) != 0:
        cols = tl.arange(0, BLOCK_G)
        for rb in tl.range(pid, num_rb, n_prog):
            rows, rmask, rows64 = row_block(rb, r_idx, BLOCK_M, M)
            for q in tl.range(0, G):
                # the rows' group q
                xp = rowptr(X, rows64, stride_x) + q * GS
                zp = rowptr(Z, rows64, stride_z) + q * GS
                ss, sc = loop_sum_squares(
                    xp, zp, xp, rmask, K, K, BLOCK_G, 0, FLAGS, GATING, IN, ACC
                )
                r = inv_rms(ss, sc, kf, eps_a, FLAGS, ACC)
                tl.store(RSTD + rows64 * G + q, r, mask=rmask)
                yp = rowptr(Y, rows64, N) + q * GS
                for c0 in tl.range(0, GS, BLOCK_G):
                    c = (c0 + cols)[None, :]
                    cm = c < GS
                    m = rmask[:, None] & cm
                    v, a = load_input(xp, zp, xp, c, m, "", 0, FLAGS, GATING, IN, ACC)
                    w = param(W + q * GS, c, cm, FLAGS & flag.W)
                    b = param(B + q * GS, c, cm, FLAGS & flag.B)
                    y = _out(rms_apply(v, r, w, b, off, FLAGS, IN, OUT, ACC), a, GATING, ACC)
                    tl.store(yp + c, cvt(y, Y.dtype.element_ty, RNE), mask=m)
    else:
        t, q, cols, cm, pc, w, b = _group_tile(W, B, G, GS, BLOCK_M, GP, BLOCK_G, FLAGS)
        for rb in tl.range(pid, num_rb, n_prog):
            rows64, rmask, m, xp, zp = _group_rows(
                X, Z, stride_x, stride_z, rb, t, q, cm, M, G, BLOCK_M, GP
            )
            v, a = load_input(xp, zp, xp, pc, m, "", 0, FLAGS, GATING, IN, ACC)
            ss, sc = sum_squares(head(v, cols, K, (FLAGS & flag.PARTIAL) != 0), ACC)
            r = inv_rms(ss, sc, kf, eps_a, FLAGS, ACC)
            tl.store(RSTD + rows64 * G + q, r, mask=rmask)
            y = _out(rms_apply(v, r, w, b, off, FLAGS, IN, OUT, ACC), a, GATING, ACC)
            tl.store(rowptr(Y, rows64, N) + pc, cvt(y, Y.dtype.element_ty, RNE), mask=m)


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _bwd_terms(xp, zp, dyp, c, mask, r, w, b, off, FLAGS, GATING, IN, OUT, ACC):
    """Per tile at the rows xp, zp, dyp and 2-D columns c: (x, v, a, da, dn, gs, dz) in ACC. dn is
    the gradient reaching the norm's output n (dy, or dy·a norm-then-gate), gs = dn·(offset + γ)
    and dz = dy·n·act'(z) norm-then-gate (0 otherwise; gate-first's d gate needs dv first)."""
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    CAST: tl.constexpr = (FLAGS >> flag.CAST_SHIFT) & flag.FIELD_MASK
    x = up(tl.load(xp + c, mask=mask, other=0.0), ACC, RNE)
    dy = up(tl.load(dyp + c, mask=mask, other=0.0), ACC, RNE)
    a = x
    da = x
    v = x
    dn = dy
    dz = dy * 0.0
    if GATING % 4 != 0:
        z = up(tl.load(zp + c, mask=mask, other=0.0), ACC, RNE)
        a = act(z, GATING >= 4, ACC)
        da = _act_grad(z, GATING >= 4, ACC)
        if GATING % 4 == 2:
            if CAST == flag.CAST_NONE:
                v = gated_input(x, rnd(a, IN, RNE), CAST, IN, RNE)
            else:
                v = gated_input(x, a, CAST, IN, RNE)
        else:
            # n as the forward multiplied it by the gate: rounded in "llama", in ACC otherwise
            if CAST == flag.CAST_LLAMA:
                n = rms_apply(v, r, w, b, off, FLAGS, IN, OUT, ACC).to(ACC)
            else:
                GEMMA: tl.constexpr = FLAGS & ~(flag.FIELD_MASK << flag.CAST_SHIFT)
                n = rms_apply(v, r, w, b, off, GEMMA, IN, OUT, ACC)
            dz = dy * n * da
            dn = dy * a
    if (FLAGS & flag.W) != 0:
        gs = dn * (up(w, ACC, RNE) + off)
    else:
        gs = dn
    return x, v, a, da, dn, gs, dz


@triton.jit
def _loop_terms(xp, zp, dyp, W, B, cc, GS, rmask, r, off, FLAGS, GATING, IN, OUT, ACC):
    """The looped layout's _bwd_terms for the columns cc of a group (W, B at the group),
    and the tile's mask."""
    c = cc[None, :]
    cm = c < GS
    m = rmask[:, None] & cm
    w = param(W, c, cm, FLAGS & flag.W)
    b = param(B, c, cm, FLAGS & flag.B)
    x, v, a, da, dn, gs, dz = _bwd_terms(
        xp, zp, dyp, c, m, r, w, b, off, FLAGS, GATING, IN, OUT, ACC
    )
    return x, v, a, da, dn, gs, dz, m


@triton.jit
def _store_grads(dxp, dzp, drp, c, mask, dv, x, a, da, dz, FLAGS, GATING, ACC):
    """Store dx (plus the d residual, FLAGS: RES) and the d gate from dv, the gradient reaching the
    norm's input (gate first: dx = dv·a, dz = dv·x·act'(z); else dx = dv and dz as given)."""
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    if GATING % 4 == 2:
        dz = dv * x * da
        dx = dv * a
    else:
        dx = dv
    if (FLAGS & flag.RES) != 0:
        dx += up(tl.load(drp + c, mask=mask, other=0.0), ACC, RNE)
    tl.store(dxp + c, cvt(dx, dxp.dtype.element_ty, RNE), mask=mask)
    if GATING % 4 != 0:
        tl.store(dzp + c, cvt(dz, dzp.dtype.element_ty, RNE), mask=mask)


@triton.jit
def gated_rms_norm_bwd_kernel(
    DY,  # (M, N) gradient of y
    X,  # (M, N) the forward's x (h for the residual form)
    Z,  # (M, N) gate (GATING % 4 != 0) else unused
    W,  # (N,) weight (FLAGS: W) else unused
    B,  # (N,) bias (FLAGS: B; norm-then-gate's n needs it) else unused
    RSTD,  # (M·G,) r per group
    DRES,  # (M, N) gradient added to dx (HAS_DRES) else unused
    DX,  # (M, N) output, x's dtype
    DZ,  # (M, N) output, the gate's dtype (GATING % 4 != 0) else unused
    PART,  # (programs, NEED_DW·N + NEED_DB·N) ACC partial d weight | d bias
    stride_dy,
    stride_x,
    stride_z,
    stride_dres,
    M,
    N,
    G,
    GS,
    K,
    offset: tl.float64,
    BLOCK_M: tl.constexpr,
    GP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    FLAGS: tl.constexpr,  # LOOP, RES (d residual), W, B, DW, DB, RMS_EPS, PARTIAL, CAST, RNE
    GATING: tl.constexpr,
    IN: tl.constexpr,
    OUT: tl.constexpr,
    ACC: tl.constexpr,
):
    NEED_DW: tl.constexpr = (FLAGS & flag.DW) != 0
    NEED_DB: tl.constexpr = (FLAGS & flag.DB) != 0
    RMS_EPS: tl.constexpr = (FLAGS & flag.RMS_EPS) != 0
    pid, _, n_prog, num_rb, r_idx = grid_slot(M, BLOCK_M, 1)
    off = as_acc(offset, ACC)
    kf = as_acc(K, ACC)
    dw_row, db_row = partial_rows(PART, pid, N, FLAGS)
    if (FLAGS & flag.LOOP) != 0:
        cols = tl.arange(0, BLOCK_G)
        for rb in tl.range(pid, num_rb, n_prog):
            rows, rmask, rows64 = row_block(rb, r_idx, BLOCK_M, M)
            # not this program's first row block: its partial rows are added to, not written
            later = later_block(rb, pid, BLOCK_G)
            for q in tl.range(0, G):
                # the rows' group q
                xp = rowptr(X, rows64, stride_x) + q * GS
                zp = rowptr(Z, rows64, stride_z) + q * GS
                dyp = rowptr(DY, rows64, stride_dy) + q * GS
                wq = W + q * GS
                bq = B + q * GS
                r = tl.load(RSTD + rows64 * G + q, mask=rmask, other=0.0).to(ACC)
                # pass 1: Σ gs·v over the group, Σ v² over its first K ("rms")
                acc_g = tl.zeros([BLOCK_M, BLOCK_G], ACC)
                acc_s = tl.zeros([BLOCK_M, BLOCK_G], ACC)
                for c0 in tl.range(0, GS, BLOCK_G):
                    cc = c0 + cols
                    x, v, a, da, dn, gs, dz, m = _loop_terms(
                        xp, zp, dyp, wq, bq, cc, GS, rmask, r, off, FLAGS, GATING, IN, OUT, ACC
                    )
                    acc_g += gs * (v * finite_r(r, ACC)[:, None])
                    if RMS_EPS:
                        vk = head(v, cc, K, True)
                        acc_s += vk * vk
                sgv = tl.sum(acc_g, axis=1)
                ss = tl.sum(acc_s, axis=1)
                sc = tl.full([BLOCK_M], 1.0, ACC)
                if RMS_EPS:
                    ss, sc = rescaled(ss, xp, zp, xp, rmask, K, BLOCK_G, 0, FLAGS, GATING, IN, ACC)
                # pass 2: dx, d gate, and the partial d weight / d bias rows
                dxp = rowptr(DX, rows64, N) + q * GS
                dzp = rowptr(DZ, rows64, N) + q * GS
                drp = rowptr(DRES, rows64, stride_dres) + q * GS
                for c0 in tl.range(0, GS, BLOCK_G):
                    cc = c0 + cols
                    x, v, a, da, dn, gs, dz, m = _loop_terms(
                        xp, zp, dyp, wq, bq, cc, GS, rmask, r, off, FLAGS, GATING, IN, OUT, ACC
                    )
                    dv = rms_dx(v, gs, r, sgv, ss, sc, kf, cc, K, FLAGS, ACC)
                    _store_grads(
                        dxp, dzp, drp, cc[None, :], m, dv, x, a, da, dz, FLAGS, GATING, ACC
                    )
                    dw = tl.sum(tl.where(m, dw_term(dn, v, r, FLAGS, IN), 0.0), axis=0)
                    db = tl.sum(tl.where(m, dn, 0.0), axis=0)
                    add_partials(
                        dw_row + q * GS, db_row + q * GS, cc, cc < GS, later, dw, db, FLAGS
                    )
    else:
        t, q, cols, cm, pc, w, b = _group_tile(W, B, G, GS, BLOCK_M, GP, BLOCK_G, FLAGS)
        dw_acc = tl.zeros([BLOCK_M * GP, BLOCK_G], ACC)
        db_acc = tl.zeros([BLOCK_M * GP, BLOCK_G], ACC)
        for rb in tl.range(pid, num_rb, n_prog):
            rows64, rmask, m, xp, zp = _group_rows(
                X, Z, stride_x, stride_z, rb, t, q, cm, M, G, BLOCK_M, GP
            )
            dyp = rowptr(DY, rows64, stride_dy)
            r = tl.load(RSTD + rows64 * G + q, mask=rmask, other=0.0).to(ACC)
            x, v, a, da, dn, gs, dz = _bwd_terms(
                xp, zp, dyp, pc, m, r, w, b, off, FLAGS, GATING, IN, OUT, ACC
            )
            sgv, ss, sc = rms_row_sums(v, gs, r, cols, K, FLAGS, ACC)
            dv = rms_dx(v, gs, r, sgv, ss, sc, kf, cols, K, FLAGS, ACC)
            dxp = rowptr(DX, rows64, N)
            dzp = rowptr(DZ, rows64, N)
            drp = rowptr(DRES, rows64, stride_dres)
            _store_grads(dxp, dzp, drp, pc, m, dv, x, a, da, dz, FLAGS, GATING, ACC)
            if NEED_DW:
                dw_acc += tl.where(m, dw_term(dn, v, r, FLAGS, IN), 0.0)
            if NEED_DB:
                db_acc += tl.where(m, dn, 0.0)
        # the BLOCK_M rows of a tile that share a group, summed: (GP, BLOCK_G) partials
        gm = (tl.arange(0, GP) < G)[:, None] & (cols < GS)[None, :]
        gc = (tl.arange(0, GP) * GS)[:, None] + cols[None, :]
        dw = tl.sum(tl.reshape(dw_acc, [BLOCK_M, GP, BLOCK_G]), axis=0)
        db = tl.sum(tl.reshape(db_acc, [BLOCK_M, GP, BLOCK_G]), axis=0)
        store_partials(dw_row, db_row, gc, gm, dw, db, FLAGS)
