"""The LayerNorm kernels, forward and backward, in the three layouts described in
``_common.py``."""

from __future__ import annotations

import triton
import triton.language as tl

from . import _flags as flag
from ._common import (
    any_row,
    arrive_and_wait,
    as_acc,
    cvt,
    div,
    first_chunk,
    gather,
    over_scale,
    overflowed,
    publish,
    sqrt,
    tile,
    up,
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
def _centre_safe(x, c, cmask, nb, ACC: tl.constexpr):
    """μ and M2 of :func:`_centre` per row of the tile x, and sc = 1, or, for a row whose sum,
    x − μ or M2 overflows, those of s·x and sc = s (see _common.sum_squares): μ in units of 1/sc,
    M2 in units of 1/sc². x − μ is left to the caller: keeping x live rather than x − μ next to
    it saves registers where a tile holds several rows (see the forward kernel)."""
    mean, _, m2 = _centre(x, c, cmask, nb, ACC)
    over = overflowed(m2, ACC)
    sc = over_scale(over, ACC)
    if any_row(over):
        mean_s, _, m2_s = _centre(x * sc[:, None], c * sc, cmask, nb, ACC)
        mean = tl.where(over, mean_s, mean)
        m2 = tl.where(over, m2_s, m2)
    return mean, m2, sc


@triton.jit
def _centre_safe_reload(
    x, c, X, rows, stride_x, cols, M, cmask, nb, ACC: tl.constexpr, RNE: tl.constexpr
):
    """(μ, x − μ, M2, sc) as :func:`_centre_safe`, with x − μ; the rare branch reloads the tile
    instead of keeping x live next to x − μ."""
    mean, xc, m2 = _centre(x, c, cmask, nb, ACC)
    over = overflowed(m2, ACC)
    sc = over_scale(over, ACC)
    if any_row(over):
        xs = up(tile(X, rows, stride_x, cols, M, cmask), ACC, RNE) * sc[:, None]
        mean_s, xc_s, m2_s = _centre(xs, c * sc, cmask, nb, ACC)
        mean = tl.where(over, mean_s, mean)
        xc = tl.where(over[:, None], xc_s, xc)
        m2 = tl.where(over, m2_s, m2)
    return mean, xc, m2, sc


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
    mean = mu_0 + div(tl.sum(tl.where(has, c_p[None, :] * (mu_p - mu_0[:, None]), 0.0), axis=1),
                      nf, ACC)  # fmt: skip
    d = tl.where(has, mu_p - mean[:, None], 0.0)
    return mean, tl.sum(m2_p, axis=1) + tl.sum(c_p[None, :] * d * d, axis=1)


# ----------------------------------------------------------------------------------------------
# LayerNorm forward
# ----------------------------------------------------------------------------------------------
@triton.jit
def layer_norm_fwd_kernel(
    X,  # (M, N)
    Y,  # (M, N), x's dtype
    W,  # (N,) (HAS_W) else unused
    B,  # (N,) (HAS_B) else unused
    MEAN,  # (M,) ACC
    RSTD,  # (M,) ACC
    WS,  # (M, 3, SPLIT) ACC (SPLIT > 1) else unused
    CNT,  # (cdiv(M, BLOCK_M),) int32 zeros (SPLIT > 1) else unused
    stride_x,  # row stride of x, in elements (Y is contiguous)
    M, N,
    eps: tl.float64,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
    FLAGS: tl.constexpr,  # LOOP, PREFETCH, PHASE, W, B, RNE (_flags)
    ACC: tl.constexpr,
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & flag.LOOP) != 0
    PREFETCH: tl.constexpr = (FLAGS & flag.PREFETCH) != 0
    PHASE: tl.constexpr = (FLAGS >> flag.PHASE_SHIFT) & flag.FIELD_MASK
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    HAS_W: tl.constexpr = (FLAGS & flag.W) != 0
    HAS_B: tl.constexpr = (FLAGS & flag.B) != 0
    stride_y = N
    pid = tl.program_id(0)
    slot = pid // SPLIT
    part = pid % SPLIT
    n_slots = tl.num_programs(0) // SPLIT
    eps_a = as_acc(eps, ACC)
    nf = as_acc(N, ACC)
    num_rb = tl.cdiv(M, BLOCK_M)
    r_idx = tl.arange(0, BLOCK_M)
    if LOOP:
        for rb in tl.range(slot, num_rb, n_slots):
            rows = rb * BLOCK_M + r_idx
            rmask = rows < M
            rows64 = rows.to(tl.int64)
            # Pass 1: mean and M2 = Σ (x − μ)² per column block (two-pass inside the block, in
            # registers), merged across blocks with Chan's pairwise formula: stable for any
            # mean/std ratio, unlike Σx² − (Σx)²/N.
            c = _first(X, rows, stride_x, M, ACC, RNE)  # see _centre
            mean = tl.zeros([BLOCK_M], ACC)
            m2 = tl.zeros([BLOCK_M], ACC)
            na = tl.zeros([BLOCK_M], ACC)  # columns merged so far
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = up(tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_last"), ACC, RNE)  # fmt: skip
                nb = tl.minimum(N - c0, BLOCK_N).to(ACC)
                bmean, _, bm2 = _centre(x, c, cmask, nb, ACC)
                delta = bmean - mean
                tot = na + nb
                mean = mean + delta * div(nb, tot, ACC)
                m2 = m2 + bm2 + delta * delta * div(na * nb, tot, ACC)
                na = tot
            over = overflowed(m2, ACC)
            sc = over_scale(over, ACC)
            any_over = any_row(over)
            if any_over:  # rare: a sum overflowed; pass 1 again on s·x (statistics in 1/s units)
                mean_s = tl.zeros([BLOCK_M], ACC)
                m2_s = tl.zeros([BLOCK_M], ACC)
                na = tl.zeros([BLOCK_M], ACC)
                for c0 in tl.range(0, N, BLOCK_N):
                    c_s = c0 + tl.arange(0, BLOCK_N)
                    m_s = rmask[:, None] & (c_s < N)[None, :]
                    xs = up(tl.load(X + rows64[:, None] * stride_x + c_s[None, :], mask=m_s,
                                 other=0.0), ACC, RNE) * sc[:, None]  # fmt: skip
                    nb = tl.minimum(N - c0, BLOCK_N).to(ACC)
                    bmean, _, bm2 = _centre(xs, c * sc, c_s < N, nb, ACC)
                    delta = bmean - mean_s
                    tot = na + nb
                    mean_s = mean_s + delta * div(nb, tot, ACC)
                    m2_s = m2_s + bm2 + delta * delta * div(na * nb, tot, ACC)
                    na = tot
                mean = tl.where(over, mean_s, mean)
                m2 = tl.where(over, m2_s, m2)
            # r for x − μ in the row's units (1/sc), and r·sc, the r of the row itself.
            r = div(tl.full([BLOCK_M], 1.0, ACC), sqrt(div(m2, nf, ACC) + eps_a * sc * sc, ACC),
                    ACC)  # fmt: skip
            tl.store(MEAN + rows, mean / sc, mask=rmask)
            tl.store(RSTD + rows, r * sc, mask=rmask)
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = up(tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_first"), ACC, RNE)  # fmt: skip
                if any_over:
                    y = (x * sc[:, None] - mean[:, None]) * r[:, None]
                else:
                    y = (x - mean[:, None]) * r[:, None]
                if HAS_W:
                    y = y * up(tl.load(W + cols, mask=cmask, other=0.0), ACC, RNE)[None, :]
                if HAS_B:
                    y = y + up(tl.load(B + cols, mask=cmask, other=0.0), ACC, RNE)[None, :]
                tl.store(Y + rows64[:, None] * stride_y + cols[None, :],
                         cvt(y, Y.dtype.element_ty, RNE), mask=mask)  # fmt: skip
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        if HAS_W:
            w = up(tl.load(W + cols, mask=cmask, other=0.0), ACC, RNE)
        if HAS_B:
            b = up(tl.load(B + cols, mask=cmask, other=0.0), ACC, RNE)
        # Columns this program holds (its chunk of the row).
        nb = tl.minimum(N - part * BLOCK_N, BLOCK_N).to(ACC)
        if PREFETCH:  # see the RMSNorm forward
            x_nx = tile(X, slot * BLOCK_M + r_idx, stride_x, cols, M, cmask)
        for rb in tl.range(slot, num_rb, n_slots):
            rows = rb * BLOCK_M + r_idx
            rmask = rows < M
            rows64 = rows.to(tl.int64)
            mask = rmask[:, None] & cmask[None, :]
            if PREFETCH:
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
            if ONE_ROW:
                mean, xc, m2, sc = _centre_safe_reload(x, c, X, rows, stride_x, cols, M, cmask,
                                                       nb, ACC, RNE)  # fmt: skip
            else:
                mean, m2, sc = _centre_safe(x, c, cmask, nb, ACC)
            if SPLIT > 1:
                # Chunk means, M2s and units (sc), merged in a fixed order (_merge_chunks).
                if PHASE != 2:
                    publish(WS, rows64, rmask, part, 0, mean, 3, SPLIT)
                    publish(WS, rows64, rmask, part, 1, m2, 3, SPLIT)
                    publish(WS, rows64, rmask, part, 2, sc, 3, SPLIT)
                if PHASE == 0:
                    arrive_and_wait(CNT, rb, SPLIT)
                if PHASE != 1:
                    mu_p = gather(WS, rows64, rmask, 0, 3, SPLIT, SPLIT_P2)
                    m2_p = gather(WS, rows64, rmask, 1, 3, SPLIT, SPLIT_P2)
                    sc_p = gather(WS, rows64, rmask, 2, 3, SPLIT, SPLIT_P2)
                    p_idx = tl.arange(0, SPLIT_P2)
                    c_p = tl.minimum(tl.maximum(N - p_idx * BLOCK_N, 0), BLOCK_N).to(ACC)
                    mean, m2 = _merge_chunks(mu_p, m2_p, c_p, nf, SPLIT_P2, ACC)
                    scaled_p = (sc_p < 1.0) & (c_p > 0)[None, :]
                    over = (tl.max(scaled_p.to(tl.int32), axis=1) > 0) | overflowed(m2, ACC)
                    sc = over_scale(over, ACC)
                    if any_row(over):  # rare: merge again with every chunk in units of 1/s
                        f = tl.where(scaled_p, 1.0, sc[:, None])
                        mean_s, m2_s = _merge_chunks(mu_p * f, m2_p * f * f, c_p, nf, SPLIT_P2,
                                                     ACC)  # fmt: skip
                        mean = tl.where(over, mean_s, mean)
                        m2 = tl.where(over, m2_s, m2)
            if PHASE != 1:
                if not ONE_ROW:
                    if any_row(sc < 1.0):  # rare: x − μ in the rescaled rows' units
                        xc = tl.where(cmask[None, :], x * sc[:, None] - mean[:, None], 0.0)
                    else:
                        xc = tl.where(cmask[None, :], x - mean[:, None], 0.0)
                # r for x − μ in the row's units (1/sc), and r·sc, the r of the row itself.
                r = div(tl.full([BLOCK_M], 1.0, ACC),
                        sqrt(div(m2, nf, ACC) + eps_a * sc * sc, ACC), ACC)  # fmt: skip
                first = rmask & first_chunk(r_idx, part, BLOCK_M)
                tl.store(MEAN + rows, mean / sc, mask=first)
                tl.store(RSTD + rows, r * sc, mask=first)
                y = xc * r[:, None]
                if HAS_W:
                    y = y * w[None, :]
                if HAS_B:
                    y = y + b[None, :]
                tl.store(Y + rows64[:, None] * stride_y + cols[None, :],
                         cvt(y, Y.dtype.element_ty, RNE), mask=mask)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# LayerNorm backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def layer_norm_bwd_kernel(
    DY,  # (M, N)
    X,  # (M, N)
    W,  # (N,) (HAS_W) else unused
    MEAN, RSTD,  # (M,) saved by the forward
    DX,  # (M, N)
    PART,  # (slots, NEED_DW·N + NEED_DB·N) ACC partials
    WS,  # (M, 2, SPLIT) ACC (SPLIT > 1) else unused
    CNT,  # (cdiv(M, BLOCK_M),) int32 zeros (SPLIT > 1) else unused
    stride_dy, stride_x,  # input row strides, in elements (DX is contiguous)
    M, N,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
    FLAGS: tl.constexpr,  # LOOP, PREFETCH, PHASE, W, DW, DB, RNE (_flags)
    ACC: tl.constexpr,
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & flag.LOOP) != 0
    PREFETCH: tl.constexpr = (FLAGS & flag.PREFETCH) != 0
    PHASE: tl.constexpr = (FLAGS >> flag.PHASE_SHIFT) & flag.FIELD_MASK
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    HAS_W: tl.constexpr = (FLAGS & flag.W) != 0
    NEED_DW: tl.constexpr = (FLAGS & flag.DW) != 0
    NEED_DB: tl.constexpr = (FLAGS & flag.DB) != 0
    stride_dx = N
    if NEED_DW and NEED_DB:
        stride_part = 2 * N
    else:
        stride_part = N
    # dx = r·(g − mean(g) − x̂·mean(g ⊙ x̂)), g = dy ⊙ γ, x̂ = (x − μ)·r.
    pid = tl.program_id(0)
    slot = pid // SPLIT
    part = pid % SPLIT
    n_slots = tl.num_programs(0) // SPLIT
    nf = as_acc(N, ACC)
    num_rb = tl.cdiv(M, BLOCK_M)
    r_idx = tl.arange(0, BLOCK_M)
    if NEED_DW:
        DB_PART = PART + N
    else:
        DB_PART = PART
    part_row = PART + slot.to(tl.int64) * stride_part
    db_row = DB_PART + slot.to(tl.int64) * stride_part
    if LOOP:
        for rb in tl.range(slot, num_rb, n_slots):
            rows = rb * BLOCK_M + r_idx
            rmask = rows < M
            rows64 = rows.to(tl.int64)
            mu = tl.load(MEAN + rows, mask=rmask, other=0.0).to(ACC)
            r = tl.load(RSTD + rows, mask=rmask, other=0.0).to(ACC)
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], ACC)
            acc_gx = tl.zeros([BLOCK_M, BLOCK_N], ACC)
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = up(tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_last"), ACC, RNE)  # fmt: skip
                dy = up(tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask,
                             other=0.0, eviction_policy="evict_last"), ACC, RNE)  # fmt: skip
                xhat = _xhat(x, mu, r, mask, ACC)
                if HAS_W:
                    g = dy * up(tl.load(W + cols, mask=cmask, other=0.0), ACC, RNE)[None, :]
                else:
                    g = dy
                acc_g += g
                acc_gx += g * xhat
            mg = div(tl.sum(acc_g, axis=1), nf, ACC)
            mgx = div(tl.sum(acc_gx, axis=1), nf, ACC)
            # Not this program's first row block (a vector: see first_chunk).
            later = (tl.zeros([BLOCK_N], tl.int32) + rb) != slot
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = up(tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_first"), ACC, RNE)  # fmt: skip
                dy = up(tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask,
                             other=0.0, eviction_policy="evict_first"), ACC, RNE)  # fmt: skip
                xhat = _xhat(x, mu, r, mask, ACC)
                if HAS_W:
                    g = dy * up(tl.load(W + cols, mask=cmask, other=0.0), ACC, RNE)[None, :]
                else:
                    g = dy
                dx = r[:, None] * (g - mg[:, None] - xhat * mgx[:, None])
                tl.store(DX + rows64[:, None] * stride_dx + cols[None, :],
                         cvt(dx, DX.dtype.element_ty, RNE), mask=mask)  # fmt: skip
                if NEED_DW:
                    prev = tl.load(part_row + cols, mask=cmask & later, other=0.0)
                    tl.store(part_row + cols, prev + tl.sum(dy * xhat, axis=0), mask=cmask)
                if NEED_DB:
                    prev = tl.load(db_row + cols, mask=cmask & later, other=0.0)
                    tl.store(db_row + cols, prev + tl.sum(dy, axis=0), mask=cmask)
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        if HAS_W:
            w = up(tl.load(W + cols, mask=cmask, other=0.0), ACC, RNE)
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        # Prefetch the next row block (see the RMSNorm forward).
        if PREFETCH:
            rows = slot * BLOCK_M + r_idx
            x_nx = tile(X, rows, stride_x, cols, M, cmask)
            dy_nx = tile(DY, rows, stride_dy, cols, M, cmask)
            mu_nx = tl.load(MEAN + rows, mask=rows < M, other=0.0)
            r_nx = tl.load(RSTD + rows, mask=rows < M, other=0.0)
        for rb in tl.range(slot, num_rb, n_slots):
            rows = rb * BLOCK_M + r_idx
            rmask = rows < M
            rows64 = rows.to(tl.int64)
            mask = rmask[:, None] & cmask[None, :]
            if PREFETCH:
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
            x = up(x_raw, ACC, RNE)
            dy = up(dy_raw, ACC, RNE)
            mu = mu_raw.to(ACC)
            r = r_raw.to(ACC)
            xhat = _xhat(x, mu, r, mask, ACC)
            if HAS_W:
                g = dy * w[None, :]
            else:
                g = dy
            sg = tl.sum(g, axis=1)
            sgx = tl.sum(g * xhat, axis=1)
            if SPLIT > 1:
                if PHASE != 2:
                    publish(WS, rows64, rmask, part, 0, sg, 2, SPLIT)
                    publish(WS, rows64, rmask, part, 1, sgx, 2, SPLIT)
                if PHASE == 0:
                    arrive_and_wait(CNT, rb, SPLIT)
                if PHASE != 1:
                    sg = tl.sum(gather(WS, rows64, rmask, 0, 2, SPLIT, SPLIT_P2), axis=1)
                    sgx = tl.sum(gather(WS, rows64, rmask, 1, 2, SPLIT, SPLIT_P2), axis=1)
            if PHASE != 1:
                mg = div(sg, nf, ACC)
                mgx = div(sgx, nf, ACC)
                dx = r[:, None] * (g - mg[:, None] - xhat * mgx[:, None])
                tl.store(DX + rows64[:, None] * stride_dx + cols[None, :],
                         cvt(dx, DX.dtype.element_ty, RNE), mask=mask)  # fmt: skip
                if NEED_DW:
                    dw_acc += dy * xhat
                if NEED_DB:
                    db_acc += dy
        if PHASE != 1:
            if NEED_DW:
                tl.store(part_row + cols, tl.sum(dw_acc, axis=0), mask=cmask)
            if NEED_DB:
                tl.store(db_row + cols, tl.sum(db_acc, axis=0), mask=cmask)
