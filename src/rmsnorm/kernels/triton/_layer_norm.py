"""The LayerNorm kernels, forward and backward, in the three layouts described in
``_common.py``."""

from __future__ import annotations

import triton
import triton.language as tl

from . import _flags as flag
from ._common import (
    add_partials,
    any_row,
    as_acc,
    bwd_row_block,
    col_chunk,
    div,
    exchange,
    first_chunk,
    grad_tile,
    grid_slot,
    later_block,
    load_acc,
    opt_param,
    over_scale,
    overflowed,
    partial_rows,
    row_block,
    rowptr,
    sqrt,
    store_cvt,
    store_partials,
    tile,
    up,
    weighted,
)


@triton.jit
def _first(X, rows, stride_x, M, ACC: tl.constexpr, RNE: tl.constexpr):
    """c, each row's first element (BLOCK_M,), in ACC (0 past M)."""
    return up(tl.load(X + rows.to(tl.int64) * stride_x, mask=rows < M, other=0.0), ACC, RNE)


@triton.jit
def _centre(x, c, cmask, nb, ACC: tl.constexpr):
    """(μ, x − μ, M2 = Σ (x − μ)²) per row of an ACC tile holding nb columns (two-pass in
    registers: exact centring before squaring). μ = Σx / nb, or c (the row's first element) where
    Σ (x − c) = 0: a constant row's μ is then exactly its value, x − μ = 0 and σ² = 0, as torch's
    (a float32 mean of 64 × 0.1 rounds, and eps = 0 then gave finite values for torch's NaN)."""
    same = tl.sum(tl.where(cmask[None, :], x - c[:, None], 0.0), axis=1) == 0.0
    mean = tl.where(same, c, div(tl.sum(x, axis=1), nb, ACC))
    xc = tl.where(cmask[None, :], x - mean[:, None], 0.0)
    return mean, xc, tl.sum(xc * xc, axis=1)


@triton.jit
def _centre_safe(
    x, c, cmask, nb, xp, cols, mask, RELOAD: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr
):
    """(μ, x − μ, M2, sc) of :func:`_centre` per row of the tile x, and sc = 1, or, for a row whose
    sum, x − μ or M2 overflows, those of s·x and sc = s (see _common.sum_squares): μ in units of
    1/sc, M2 in units of 1/sc². x − μ is exact only with RELOAD, whose rare branch reloads the tile
    (at xp + cols) rather than keep x live next to x − μ; without, the caller forms x − μ from x,
    which saves registers where a tile holds several rows (see the forward kernel)."""
    mean, xc, m2 = _centre(x, c, cmask, nb, ACC)
    over = overflowed(m2, ACC)
    sc = over_scale(over, ACC)
    if any_row(over):
        if RELOAD:
            xs = load_acc(xp, cols, mask, "", ACC, RNE) * sc[:, None]
        else:
            xs = x * sc[:, None]
        mean_s, xc_s, m2_s = _centre(xs, c * sc, cmask, nb, ACC)
        mean = tl.where(over, mean_s, mean)
        m2 = tl.where(over, m2_s, m2)
        if RELOAD:
            xc = tl.where(over[:, None], xc_s, xc)
    return mean, xc, m2, sc


@triton.jit
def _chan_pass(xp, rmask, c, sc, N, BLOCK_N, EVICT, SCALED, ACC, RNE):
    """μ and M2 = Σ (x − μ)² of looped rows: per column block (two-pass inside the block, in
    registers, see _centre), merged across blocks with Chan's pairwise formula: stable for any
    mean/std ratio, unlike Σx² − (Σx)²/N. SCALED: those of s·x (sc = s per row; c is s·c)."""
    mean = tl.zeros(c.shape, ACC)
    m2 = tl.zeros(c.shape, ACC)
    na = tl.zeros(c.shape, ACC)  # columns merged so far
    for c0 in tl.range(0, N, BLOCK_N):
        cols, cmask, mask = col_chunk(c0, BLOCK_N, N, rmask)
        x = load_acc(xp, cols, mask, EVICT, ACC, RNE)
        if SCALED:
            x = x * sc[:, None]
        nb = tl.minimum(N - c0, BLOCK_N).to(ACC)
        bmean, _, bm2 = _centre(x, c, cmask, nb, ACC)
        delta = bmean - mean
        tot = na + nb
        mean = mean + delta * div(nb, tot, ACC)
        m2 = m2 + bm2 + delta * delta * div(na * nb, tot, ACC)
        na = tot
    return mean, m2


@triton.jit
def _store_stats(MEAN, RSTD, rows, mask, mean, m2, sc, nf, eps, ACC: tl.constexpr):
    """r for x − μ in the row's units (1/sc), returned; μ and r·sc, the row's own r, stored."""
    r = div(tl.full(m2.shape, 1.0, ACC), sqrt(div(m2, nf, ACC) + eps * sc * sc, ACC), ACC)
    tl.store(MEAN + rows, mean / sc, mask=mask)
    tl.store(RSTD + rows, r * sc, mask=mask)
    return r


@triton.jit
def _affine(y, w, b, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """y ⊙ γ + β for the ACC chunks w, b (BLOCK_N,) of the weight and bias (unused when absent)."""
    if HAS_W:
        y = y * w[None, :]
    if HAS_B:
        y = y + b[None, :]
    return y


@triton.jit
def _xhat(x, mu, r, mask, ACC: tl.constexpr):
    """x̂ = (x − μ)·r on the tile (0 outside mask). Rows with r < 2^-100 (σ > 1e30: x − μ may
    overflow) take (s·x − s·μ)·(r/s), the same value (as reference.layer_norm_bwd); only tiles
    holding such a row pay for it."""
    xhat = tl.where(mask, (x - mu[:, None]) * r[:, None], 0.0)
    risk = (r > 0) & (r < 2.0**-100)
    if any_row(risk):
        sc = over_scale(risk, ACC)
        xs = (x * sc[:, None] - (mu * sc)[:, None]) * (r / sc)[:, None]
        xhat = tl.where(mask & risk[:, None], xs, xhat)
    return xhat


@triton.jit
def _merge_chunks(mu_p, m2_p, c_p, nf, P2: tl.constexpr, ACC: tl.constexpr):
    """μ and M2 of whole rows from per-chunk means mu_p, M2s m2_p and column counts c_p (0 for
    absent chunks), in a fixed order: μ = μ_0 + Σ c_p (μ_p − μ_0) / N (chunks of a constant row all
    have μ_p = μ_0, exactly: see _centre), M2 = Σ m2_p + Σ c_p (μ_p − μ)²."""
    has = (c_p > 0)[None, :]
    first = (tl.arange(0, P2) == 0)[None, :]
    mu_0 = tl.sum(tl.where(first, mu_p, 0.0), axis=1)
    mean = mu_0 + div(
        tl.sum(tl.where(has, c_p[None, :] * (mu_p - mu_0[:, None]), 0.0), axis=1), nf, ACC
    )
    d = tl.where(has, mu_p - mean[:, None], 0.0)
    return mean, tl.sum(m2_p, axis=1) + tl.sum(c_p[None, :] * d * d, axis=1)


@triton.jit
def _ln_dx(g, xhat, r, mg, mgx):
    """dx = r·(g − mean(g) − x̂·mean(g ⊙ x̂)) from the row means mg, mgx."""
    return r[:, None] * (g - mg[:, None] - xhat * mgx[:, None])


# ----------------------------------------------------------------------------------------------
# LayerNorm forward
# ----------------------------------------------------------------------------------------------
@triton.jit
def layer_norm_fwd_kernel(
    X,  # (M, N)
    Y,  # (M, N), x's dtype
    W,  # (N,) (FLAGS: W) else unused
    B,  # (N,) (FLAGS: B) else unused
    MEAN,  # (M,) ACC
    RSTD,  # (M,) ACC
    WS,  # (M, 3, SPLIT) ACC (SPLIT > 1) else unused
    CNT,  # (cdiv(M, BLOCK_M),) int32 zeros (SPLIT > 1) else unused
    stride_x,  # row stride of x, in elements (Y is contiguous)
    M,
    N,
    eps: tl.float64,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    FLAGS: tl.constexpr,  # LOOP, PREFETCH, PHASE, W, B, RNE (_flags)
    ACC: tl.constexpr,
):
    PHASE: tl.constexpr = (FLAGS >> flag.PHASE_SHIFT) & flag.FIELD_MASK
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    slot, part, n_slots, num_rb, r_idx = grid_slot(M, BLOCK_M, SPLIT)
    eps_a = as_acc(eps, ACC)
    nf = as_acc(N, ACC)
    if (FLAGS & flag.LOOP) != 0:
        for rb in tl.range(slot, num_rb, n_slots):
            rows, rmask, rows64 = row_block(rb, r_idx, BLOCK_M, M)
            xp = rowptr(X, rows64, stride_x)
            # Pass 1: mean and M2 (loads ask L2 to keep the row for pass 2).
            c = _first(X, rows, stride_x, M, ACC, RNE)  # see _centre
            mean, m2 = _chan_pass(xp, rmask, c, c, N, BLOCK_N, "evict_last", False, ACC, RNE)
            over = overflowed(m2, ACC)
            sc = over_scale(over, ACC)
            any_over = any_row(over)
            if any_over:  # rare: a sum overflowed; pass 1 again on s·x (statistics in 1/s units)
                mean_s, m2_s = _chan_pass(xp, rmask, c * sc, sc, N, BLOCK_N, "", True, ACC, RNE)
                mean = tl.where(over, mean_s, mean)
                m2 = tl.where(over, m2_s, m2)
            r = _store_stats(MEAN, RSTD, rows, rmask, mean, m2, sc, nf, eps_a, ACC)
            yp = rowptr(Y, rows64, N)
            for c0 in tl.range(0, N, BLOCK_N):
                cols, cmask, mask = col_chunk(c0, BLOCK_N, N, rmask)
                x = load_acc(xp, cols, mask, "evict_first", ACC, RNE)
                if any_over:
                    y = (x * sc[:, None] - mean[:, None]) * r[:, None]
                else:
                    y = (x - mean[:, None]) * r[:, None]
                w = opt_param(W, cols, cmask, FLAGS & flag.W, ACC, RNE)
                b = opt_param(B, cols, cmask, FLAGS & flag.B, ACC, RNE)
                store_cvt(yp, cols, mask, _affine(y, w, b, FLAGS & flag.W, FLAGS & flag.B), RNE)
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        w = opt_param(W, cols, cmask, FLAGS & flag.W, ACC, RNE)
        b = opt_param(B, cols, cmask, FLAGS & flag.B, ACC, RNE)
        # Columns this program holds (its chunk of the row).
        nb = tl.minimum(N - part * BLOCK_N, BLOCK_N).to(ACC)
        if (FLAGS & flag.PREFETCH) != 0:  # see the RMSNorm forward
            x_nx = tile(X, slot * BLOCK_M + r_idx, stride_x, cols, M, cmask)
        for rb in tl.range(slot, num_rb, n_slots):
            rows, rmask, rows64 = row_block(rb, r_idx, BLOCK_M, M)
            mask = rmask[:, None] & cmask[None, :]
            if (FLAGS & flag.PREFETCH) != 0:
                x_raw = x_nx
                x_nx = tile(X, rows + n_slots * BLOCK_M, stride_x, cols, M, cmask)
            else:
                x_raw = tile(X, rows, stride_x, cols, M, cmask)
            x = up(x_raw, ACC, RNE)
            # Registers at sm_90 (bf16 / fp32): one row per tile holds x − μ and reloads x in the
            # rare branch (78 / 59 at N = 4096, as without the branch; keeping x instead: 91),
            # several rows per tile keep x (78 / 54 at N = 128; the reload form: 94 / 63).
            ONE_ROW: tl.constexpr = SPLIT == 1 and BLOCK_M == 1
            c = _first(X, rows, stride_x, M, ACC, RNE)  # see _centre
            xp = rowptr(X, rows64, stride_x)
            mean, xc, m2, sc = _centre_safe(x, c, cmask, nb, xp, cols, mask, ONE_ROW, ACC, RNE)
            if SPLIT > 1:
                # Chunk means, M2s and units (sc), merged in a fixed order (_merge_chunks).
                ws = WS + rows64 * (3 * SPLIT)
                mu_p, m2_p, sc_p = exchange(
                    ws, CNT + rb, rmask, part, mean, m2, sc, 3, SPLIT, SPLIT_P2, PHASE
                )
                if PHASE != 1:
                    p_idx = tl.arange(0, SPLIT_P2)
                    c_p = tl.minimum(tl.maximum(N - p_idx * BLOCK_N, 0), BLOCK_N).to(ACC)
                    mean, m2 = _merge_chunks(mu_p, m2_p, c_p, nf, SPLIT_P2, ACC)
                    scaled_p = (sc_p < 1.0) & (c_p > 0)[None, :]
                    over = (tl.max(scaled_p.to(tl.int32), axis=1) > 0) | overflowed(m2, ACC)
                    sc = over_scale(over, ACC)
                    if any_row(over):  # rare: merge again with every chunk in units of 1/s
                        f = tl.where(scaled_p, 1.0, sc[:, None])
                        mean_s, m2_s = _merge_chunks(mu_p * f, m2_p * f * f, c_p, nf, SPLIT_P2, ACC)
                        mean = tl.where(over, mean_s, mean)
                        m2 = tl.where(over, m2_s, m2)
            if PHASE != 1:
                if not ONE_ROW:
                    if any_row(sc < 1.0):  # rare: x − μ in the rescaled rows' units
                        xc = tl.where(cmask[None, :], x * sc[:, None] - mean[:, None], 0.0)
                    else:
                        xc = tl.where(cmask[None, :], x - mean[:, None], 0.0)
                first = rmask & first_chunk(r_idx, part, BLOCK_M)
                r = _store_stats(MEAN, RSTD, rows, first, mean, m2, sc, nf, eps_a, ACC)
                y = _affine(xc * r[:, None], w, b, FLAGS & flag.W, FLAGS & flag.B)
                store_cvt(rowptr(Y, rows64, N), cols, mask, y, RNE)


# ----------------------------------------------------------------------------------------------
# LayerNorm backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def layer_norm_bwd_kernel(
    DY,  # (M, N)
    X,  # (M, N)
    W,  # (N,) (FLAGS: W) else unused
    MEAN,  # (M,) saved by the forward
    RSTD,  # (M,) saved by the forward
    DX,  # (M, N)
    PART,  # (slots, NEED_DW·N + NEED_DB·N) ACC partials
    WS,  # (M, 2, SPLIT) ACC (SPLIT > 1) else unused
    CNT,  # (cdiv(M, BLOCK_M),) int32 zeros (SPLIT > 1) else unused
    stride_dy,  # input row strides, in elements (DX is contiguous)
    stride_x,
    M,
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    FLAGS: tl.constexpr,  # LOOP, PREFETCH, PHASE, W, DW, DB, RNE (_flags)
    ACC: tl.constexpr,
):
    PHASE: tl.constexpr = (FLAGS >> flag.PHASE_SHIFT) & flag.FIELD_MASK
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    # dx = r·(g − mean(g) − x̂·mean(g ⊙ x̂)), g = dy ⊙ γ, x̂ = (x − μ)·r.
    slot, part, n_slots, num_rb, r_idx = grid_slot(M, BLOCK_M, SPLIT)
    nf = as_acc(N, ACC)
    dw_row, db_row = partial_rows(PART, slot, N, FLAGS)
    if (FLAGS & flag.LOOP) != 0:
        for rb in tl.range(slot, num_rb, n_slots):
            rows, rmask, rows64, xp, dyp, r = bwd_row_block(
                X, DY, RSTD, stride_x, stride_dy, rb, r_idx, BLOCK_M, M, ACC
            )
            mu = tl.load(MEAN + rows, mask=rmask, other=0.0).to(ACC)
            # Pass 1: the row sums (loads ask L2 to keep x, dy for pass 2).
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], ACC)
            acc_gx = tl.zeros([BLOCK_M, BLOCK_N], ACC)
            for c0 in tl.range(0, N, BLOCK_N):
                cols, cmask, mask = col_chunk(c0, BLOCK_N, N, rmask)
                w = opt_param(W, cols, cmask, FLAGS & flag.W, ACC, RNE)
                x, dy, g = grad_tile(xp, dyp, w, cols, mask, "evict_last", FLAGS & flag.W, ACC, RNE)
                xhat = _xhat(x, mu, r, mask, ACC)
                acc_g += g
                acc_gx += g * xhat
            mg = div(tl.sum(acc_g, axis=1), nf, ACC)
            mgx = div(tl.sum(acc_gx, axis=1), nf, ACC)
            # Pass 2: dx, and the d weight / d bias contributions added into this program's
            # partial rows.
            later = later_block(rb, slot, BLOCK_N)
            dxp = rowptr(DX, rows64, N)
            for c0 in tl.range(0, N, BLOCK_N):
                cols, cmask, mask = col_chunk(c0, BLOCK_N, N, rmask)
                w = opt_param(W, cols, cmask, FLAGS & flag.W, ACC, RNE)
                x, dy, g = grad_tile(
                    xp, dyp, w, cols, mask, "evict_first", FLAGS & flag.W, ACC, RNE
                )
                xhat = _xhat(x, mu, r, mask, ACC)
                store_cvt(dxp, cols, mask, _ln_dx(g, xhat, r, mg, mgx), RNE)
                dw = tl.sum(dy * xhat, axis=0)
                add_partials(dw_row, db_row, cols, cmask, later, dw, tl.sum(dy, axis=0), FLAGS)
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        w = opt_param(W, cols, cmask, FLAGS & flag.W, ACC, RNE)
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        # Prefetch the next row block (see the RMSNorm forward).
        if (FLAGS & flag.PREFETCH) != 0:
            rows = slot * BLOCK_M + r_idx
            x_nx = tile(X, rows, stride_x, cols, M, cmask)
            dy_nx = tile(DY, rows, stride_dy, cols, M, cmask)
            mu_nx = tl.load(MEAN + rows, mask=rows < M, other=0.0)
            r_nx = tl.load(RSTD + rows, mask=rows < M, other=0.0)
        for rb in tl.range(slot, num_rb, n_slots):
            rows, rmask, rows64 = row_block(rb, r_idx, BLOCK_M, M)
            mask = rmask[:, None] & cmask[None, :]
            if (FLAGS & flag.PREFETCH) != 0:
                x_raw, dy_raw, mu_raw, r_raw = x_nx, dy_nx, mu_nx, r_nx
                rows_nx = rows + n_slots * BLOCK_M
                x_nx = tile(X, rows_nx, stride_x, cols, M, cmask)
                dy_nx = tile(DY, rows_nx, stride_dy, cols, M, cmask)
                mu_nx = tl.load(MEAN + rows_nx, mask=rows_nx < M, other=0.0)
                r_nx = tl.load(RSTD + rows_nx, mask=rows_nx < M, other=0.0)
            else:
                x_raw = tile(X, rows, stride_x, cols, M, cmask)
                dy_raw = tile(DY, rows, stride_dy, cols, M, cmask)
                mu_raw = tl.load(MEAN + rows, mask=rmask, other=0.0)
                r_raw = tl.load(RSTD + rows, mask=rmask, other=0.0)
            dy = up(dy_raw, ACC, RNE)
            r = r_raw.to(ACC)
            xhat = _xhat(up(x_raw, ACC, RNE), mu_raw.to(ACC), r, mask, ACC)
            g = weighted(dy, w, FLAGS & flag.W)
            sg = tl.sum(g, axis=1)
            sgx = tl.sum(g * xhat, axis=1)
            if SPLIT > 1:
                ws = WS + rows64 * (2 * SPLIT)
                p_sg, p_sgx, _ = exchange(
                    ws, CNT + rb, rmask, part, sg, sgx, sg, 2, SPLIT, SPLIT_P2, PHASE
                )
                if PHASE != 1:
                    sg = tl.sum(p_sg, axis=1)
                    sgx = tl.sum(p_sgx, axis=1)
            if PHASE != 1:
                dx = _ln_dx(g, xhat, r, div(sg, nf, ACC), div(sgx, nf, ACC))
                store_cvt(rowptr(DX, rows64, N), cols, mask, dx, RNE)
                if (FLAGS & flag.DW) != 0:
                    dw_acc += dy * xhat
                if (FLAGS & flag.DB) != 0:
                    db_acc += dy
        if PHASE != 1:
            dw = tl.sum(dw_acc, axis=0)
            store_partials(dw_row, db_row, cols, cmask, dw, tl.sum(db_acc, axis=0), FLAGS)
