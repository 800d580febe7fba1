"""The RMSNorm kernels (plain and fused residual add), forward and backward, in the three layouts
described in ``_common.py``."""

from __future__ import annotations

import triton
import triton.language as tl

from . import _flags as flag
from ._common import (
    add_partials,
    add_residual,
    as_acc,
    bwd_row_block,
    col_chunk,
    combine_partials,
    dw_term,
    encode_partial,
    exchange,
    finite_r,
    first_chunk,
    grad_tile,
    grid_slot,
    head,
    inv_rms,
    later_block,
    load_acc,
    load_input,
    loop_sum_squares,
    opt_param,
    param,
    partial_rows,
    rescaled,
    rms_apply,
    rms_dx,
    rms_row_sums,
    row_block,
    rowptr,
    store_cvt,
    store_partials,
    sum_squares,
    tile,
    up,
    weighted,
)


# ----------------------------------------------------------------------------------------------
# RMSNorm forward (plain and fused residual add)
# ----------------------------------------------------------------------------------------------
@triton.jit
def rms_norm_fwd_kernel(
    X,  # (M, N) input x
    RES,  # (M, N) residual (HAS_RES) else unused
    Y,  # (M, N) output y, in the casting mode's output dtype
    H,  # (M, N) h = x + residual in the residual's dtype (HAS_RES) else unused
    W,  # (N,) weight γ (FLAGS: W) else unused
    B,  # (N,) bias β (FLAGS: B) else unused
    RSTD,  # (M,) ACC: r per row
    WS,  # (M, 1, SPLIT) ACC workspace (SPLIT > 1) else unused
    CNT,  # (cdiv(M, BLOCK_M),) int32 zeros: arrivals per row block (SPLIT > 1) else unused
    stride_x,  # input row strides, in elements (Y and H are contiguous)
    stride_res,
    M,  # rows
    N,  # columns
    K,  # leading columns the RMS is taken over
    eps: tl.float64,
    offset: tl.float64,  # y = (offset + γ) ⊙ x̂ + β
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,  # cooperating programs per row
    SPLIT_P2: tl.constexpr,  # the next power of two ≥ SPLIT
    FLAGS: tl.constexpr,  # LOOP, PREFETCH, PHASE, RES, W, B, RMS_EPS, PARTIAL, CAST, RNE (_flags)
    ACC: tl.constexpr,  # tl.float32, or tl.float64 for float64 inputs
):
    PREFETCH: tl.constexpr = (FLAGS & flag.PREFETCH) != 0
    PHASE: tl.constexpr = (FLAGS >> flag.PHASE_SHIFT) & flag.FIELD_MASK
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    HAS_RES: tl.constexpr = (FLAGS & flag.RES) != 0
    IN = X.dtype.element_ty
    OUT = Y.dtype.element_ty
    slot, part, n_slots, num_rb, r_idx = grid_slot(M, BLOCK_M, SPLIT)
    eps_a = as_acc(eps, ACC)
    off = as_acc(offset, ACC)
    kf = as_acc(K, ACC)
    if (FLAGS & flag.LOOP) != 0:
        for rb in tl.range(slot, num_rb, n_slots):
            rows, rmask, rows64 = row_block(rb, r_idx, BLOCK_M, M)
            xp = rowptr(X, rows64, stride_x)
            rp = rowptr(RES, rows64, stride_res)
            hp = rowptr(H, rows64, N)
            # Pass 1: the sum of squares over the first K columns (all N with a residual: h is
            # produced here).
            ss, sc = loop_sum_squares(xp, rp, hp, rmask, N, K, BLOCK_N, HAS_RES, FLAGS, 0, IN, ACC)
            r = inv_rms(ss, sc, kf, eps_a, FLAGS, ACC)
            tl.store(RSTD + rows, r, mask=rmask)
            # Pass 2: normalize (h is recomputed from x + residual: bit-identical, and no
            # read-after-write of H inside the kernel).
            yp = rowptr(Y, rows64, N)
            for c0 in tl.range(0, N, BLOCK_N):
                cols, cmask, mask = col_chunk(c0, BLOCK_N, N, rmask)
                c = cols[None, :]
                x, _ = load_input(xp, rp, hp, c, mask, "evict_first", HAS_RES, FLAGS, 0, IN, ACC)
                w = param(W, c, cmask[None, :], FLAGS & flag.W)
                b = param(B, c, cmask[None, :], FLAGS & flag.B)
                y = rms_apply(x, r, w, b, off, FLAGS, IN, OUT, ACC)
                store_cvt(yp, cols, mask, y, RNE)
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        w = param(W, cols[None, :], cmask[None, :], FLAGS & flag.W)
        b = param(B, cols[None, :], cmask[None, :], FLAGS & flag.B)
        # PREFETCH (persistent grids): the next row block's tiles are requested before this one
        # is computed (Triton does not pipeline this loop); in a split row they are in flight
        # during the exchange. Kept in the input dtype until used.
        if PREFETCH:
            x_nx = tile(X, slot * BLOCK_M + r_idx, stride_x, cols, M, cmask)
            if HAS_RES:
                res_nx = tile(RES, slot * BLOCK_M + r_idx, stride_res, cols, M, cmask)
        for rb in tl.range(slot, num_rb, n_slots):
            rows, rmask, rows64 = row_block(rb, r_idx, BLOCK_M, M)
            mask = rmask[:, None] & cmask[None, :]
            if PREFETCH:
                x_raw = x_nx
                x_nx = tile(X, rows + n_slots * BLOCK_M, stride_x, cols, M, cmask)
                if HAS_RES:
                    res_raw = res_nx
                    res_nx = tile(RES, rows + n_slots * BLOCK_M, stride_res, cols, M, cmask)
            else:
                x_raw = tile(X, rows, stride_x, cols, M, cmask)
                if HAS_RES:
                    res_raw = tile(RES, rows, stride_res, cols, M, cmask)
            x = up(x_raw, ACC, RNE)
            if HAS_RES:
                res = up(res_raw, ACC, RNE)
                hp = rowptr(H, rows64, N)
                x = add_residual(x, res, hp, cols[None, :], mask, PHASE != 1, ACC, RNE)
            ss, sc = sum_squares(head(x, cols, K, (FLAGS & flag.PARTIAL) != 0), ACC)
            if SPLIT > 1:
                e = encode_partial(ss, sc)
                ws = WS + rows64 * SPLIT
                v, _, _ = exchange(ws, CNT + rb, rmask, part, e, e, e, 1, SPLIT, SPLIT_P2, PHASE)
                if PHASE != 1:
                    ss, sc = combine_partials(v, ACC)
            if PHASE != 1:
                r = inv_rms(ss, sc, kf, eps_a, FLAGS, ACC)
                tl.store(RSTD + rows, r, mask=rmask & first_chunk(r_idx, part, BLOCK_M))
                y = rms_apply(x, r, w, b, off, FLAGS, IN, OUT, ACC)
                store_cvt(rowptr(Y, rows64, N), cols, mask, y, RNE)


# ----------------------------------------------------------------------------------------------
# RMSNorm backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def rms_norm_bwd_kernel(
    DY,  # (M, N) gradient of y
    X,  # (M, N) the normalized input (h for add_rms_norm)
    W,  # (N,) weight (FLAGS: W) else unused
    RSTD,  # (M,) r saved by the forward
    DRES,  # (M, N) gradient reaching h directly (HAS_DRES) else unused
    DX,  # (M, N) output, x's dtype
    PART,  # (slots, NEED_DW·N + NEED_DB·N) ACC: per-program partial d weight | d bias
    WS,  # (M, 2, SPLIT) ACC workspace (SPLIT > 1) else unused
    CNT,  # (cdiv(M, BLOCK_M),) int32 zeros (SPLIT > 1) else unused
    stride_dy,  # input row strides, in elements (DX is contiguous)
    stride_x,
    stride_dres,
    M,
    N,
    K,
    offset: tl.float64,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    # LOOP, PREFETCH, PHASE, RES (d residual), W, DW, DB, RMS_EPS, PARTIAL, CAST (llama: d weight
    # uses x̂ rounded to IN), RNE
    FLAGS: tl.constexpr,
    IN: tl.constexpr,  # the forward's input dtype
    ACC: tl.constexpr,
):
    PREFETCH: tl.constexpr = (FLAGS & flag.PREFETCH) != 0
    PHASE: tl.constexpr = (FLAGS >> flag.PHASE_SHIFT) & flag.FIELD_MASK
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    HAS_DRES: tl.constexpr = (FLAGS & flag.RES) != 0
    RMS_EPS: tl.constexpr = (FLAGS & flag.RMS_EPS) != 0
    slot, part, n_slots, num_rb, r_idx = grid_slot(M, BLOCK_M, SPLIT)
    off = as_acc(offset, ACC)
    kf = as_acc(K, ACC)
    dw_row, db_row = partial_rows(PART, slot, N, FLAGS)
    if (FLAGS & flag.LOOP) != 0:
        for rb in tl.range(slot, num_rb, n_slots):
            rows, rmask, rows64, xp, dyp, r = bwd_row_block(
                X, DY, RSTD, stride_x, stride_dy, rb, r_idx, BLOCK_M, M, ACC
            )
            # Pass 1: the row sums (loads ask L2 to keep x, dy for pass 2).
            acc_sg = tl.zeros([BLOCK_M, BLOCK_N], ACC)
            acc_ss = tl.zeros([BLOCK_M, BLOCK_N], ACC)
            for c0 in tl.range(0, N, BLOCK_N):
                cols, cmask, mask = col_chunk(c0, BLOCK_N, N, rmask)
                wo = opt_param(W, cols, cmask, FLAGS & flag.W, ACC, RNE) + off
                x, dy, g = grad_tile(
                    xp, dyp, wo, cols, mask, "evict_last", FLAGS & flag.W, ACC, RNE
                )
                acc_sg += g * (x * finite_r(r, ACC)[:, None])
                if RMS_EPS:
                    xs = head(x, cols, K, (FLAGS & flag.PARTIAL) != 0)
                    acc_ss += xs * xs
            sg = tl.sum(acc_sg, axis=1)
            ss = tl.sum(acc_ss, axis=1)
            sc = tl.full([BLOCK_M], 1.0, ACC)
            if RMS_EPS:
                ss, sc = rescaled(ss, xp, xp, xp, rmask, K, BLOCK_N, 0, FLAGS, 0, IN, ACC)
            # Pass 2: dx, and the d weight / d bias contributions added into this program's
            # partial rows.
            later = later_block(rb, slot, BLOCK_N)
            for c0 in tl.range(0, N, BLOCK_N):
                cols, cmask, mask = col_chunk(c0, BLOCK_N, N, rmask)
                wo = opt_param(W, cols, cmask, FLAGS & flag.W, ACC, RNE) + off
                x, dy, g = grad_tile(
                    xp, dyp, wo, cols, mask, "evict_first", FLAGS & flag.W, ACC, RNE
                )
                dx = rms_dx(x, g, r, sg, ss, sc, kf, cols, K, FLAGS, ACC)
                if HAS_DRES:
                    drp = rowptr(DRES, rows64, stride_dres)
                    dx += load_acc(drp, cols, mask, "evict_first", ACC, RNE)
                store_cvt(rowptr(DX, rows64, N), cols, mask, dx, RNE)
                dw = tl.sum(dw_term(dy, x, r, FLAGS, IN), axis=0)
                add_partials(dw_row, db_row, cols, cmask, later, dw, tl.sum(dy, axis=0), FLAGS)
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        wo = opt_param(W, cols, cmask, FLAGS & flag.W, ACC, RNE) + off
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        # Prefetch the next row block (see the forward): x, dy, d residual and r.
        if PREFETCH:
            rows = slot * BLOCK_M + r_idx
            x_nx = tile(X, rows, stride_x, cols, M, cmask)
            dy_nx = tile(DY, rows, stride_dy, cols, M, cmask)
            if HAS_DRES:
                dres_nx = tile(DRES, rows, stride_dres, cols, M, cmask)
            r_nx = tl.load(RSTD + rows, mask=rows < M, other=0.0)
        for rb in tl.range(slot, num_rb, n_slots):
            rows, rmask, rows64 = row_block(rb, r_idx, BLOCK_M, M)
            mask = rmask[:, None] & cmask[None, :]
            if PREFETCH:
                x_raw, dy_raw, r_raw = x_nx, dy_nx, r_nx
                if HAS_DRES:
                    dres = dres_nx
                rows_nx = rows + n_slots * BLOCK_M
                x_nx = tile(X, rows_nx, stride_x, cols, M, cmask)
                dy_nx = tile(DY, rows_nx, stride_dy, cols, M, cmask)
                if HAS_DRES:
                    dres_nx = tile(DRES, rows_nx, stride_dres, cols, M, cmask)
                r_nx = tl.load(RSTD + rows_nx, mask=rows_nx < M, other=0.0)
            else:
                x_raw = tile(X, rows, stride_x, cols, M, cmask)
                dy_raw = tile(DY, rows, stride_dy, cols, M, cmask)
                if HAS_DRES:
                    dres = tile(DRES, rows, stride_dres, cols, M, cmask)
                r_raw = tl.load(RSTD + rows, mask=rmask, other=0.0)
            x = up(x_raw, ACC, RNE)
            dy = up(dy_raw, ACC, RNE)
            r = r_raw.to(ACC)
            g = weighted(dy, wo, FLAGS & flag.W)
            sg, ss, sc = rms_row_sums(x, g, r, cols, K, FLAGS, ACC)
            if SPLIT > 1:
                e = encode_partial(ss, sc)
                ws = WS + rows64 * (2 * SPLIT)
                p_sg, p_ss, _ = exchange(
                    ws, CNT + rb, rmask, part, sg, e, e, 1 + RMS_EPS, SPLIT, SPLIT_P2, PHASE
                )
                if PHASE != 1:
                    sg = tl.sum(p_sg, axis=1)
                    if RMS_EPS:
                        ss, sc = combine_partials(p_ss, ACC)
            if PHASE != 1:
                dx = rms_dx(x, g, r, sg, ss, sc, kf, cols, K, FLAGS, ACC)
                if HAS_DRES:
                    dx += up(dres, ACC, RNE)
                store_cvt(rowptr(DX, rows64, N), cols, mask, dx, RNE)
                if (FLAGS & flag.DW) != 0:
                    dw_acc += dw_term(dy, x, r, FLAGS, IN)
                if (FLAGS & flag.DB) != 0:
                    db_acc += dy
        if PHASE != 1:
            dw = tl.sum(dw_acc, axis=0)
            store_partials(dw_row, db_row, cols, cmask, dw, tl.sum(db_acc, axis=0), FLAGS)
