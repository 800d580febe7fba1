"""The RMSNorm kernels (plain and fused residual add), forward and backward, in the three layouts
described in ``_common.py``, and the RMSNorm device math the grouped and gated kernels reuse."""

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
    combine_partials,
    cvt,
    div,
    encode_partial,
    exchange,
    first_chunk,
    grad_tile,
    grid_slot,
    head,
    later_block,
    load_acc,
    opt_param,
    over_scale,
    overflowed,
    param,
    partial_rows,
    rnd,
    row_block,
    rowptr,
    sqrt,
    store_cvt,
    store_partials,
    sum_squares,
    tile,
    up,
    weighted,
)


# ----------------------------------------------------------------------------------------------
# The RMSNorm family's device math, shared with the grouped and gated kernels (_gated.py): the
# normalized input v, its sum of squares in the looped layout, r, the output and the input gradient
# ----------------------------------------------------------------------------------------------
@triton.jit
def act(z, SIGMOID: tl.constexpr, ACC: tl.constexpr):
    """act(z) as torch computes it: σ(z) = 1/(1 + exp(−z)), SiLU = z/(1 + exp(−z)) (NaN at −inf,
    as there)."""
    e = tl.exp(-z) + 1.0
    if SIGMOID:
        return div(tl.full(z.shape, 1.0, ACC), e, ACC)
    else:
        return div(z, e, ACC)


@triton.jit
def gated_input(x, a, CAST: tl.constexpr, IN: tl.constexpr, RNE: tl.constexpr):
    """u = x ⊙ act(z) (gate, then norm): in ACC, or in "none" mode rounded to the input dtype (x
    rounded to it first; a already is)."""
    if CAST == flag.CAST_NONE:
        return rnd(rnd(x, IN, RNE) * a, IN, RNE)
    else:
        return x * a


@triton.jit
def add_residual(x, res, hp, c, mask, STORE_H: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr):
    """h = x + residual rounded to the residual's dtype (stored at hp + c when STORE_H), in ACC:
    the statistics are those of the h returned."""
    h = cvt(x + res, hp.dtype.element_ty, RNE)
    if STORE_H:
        tl.store(hp + c, h, mask=mask)
    return up(h, ACC, RNE)


@triton.jit
def load_input(xp, ap, hp, c, mask, EVICT, RES, FLAGS, GATING, IN, ACC):
    """(v, a) in ACC of the tile at the 2-D columns c of the rows at xp (x), ap (the residual, or
    the gate z) and hp (h). v is the normalized input: x; h = x + residual (RES 1; RES 2 also
    stores h); or x ⊙ act(z) gate first (GATING as the gated kernels'). a = act(z) (v without a
    gate)."""
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    CAST: tl.constexpr = (FLAGS >> flag.CAST_SHIFT) & flag.FIELD_MASK
    x = up(tl.load(xp + c, mask=mask, other=0.0, eviction_policy=EVICT), ACC, RNE)
    if RES:
        res = up(tl.load(ap + c, mask=mask, other=0.0, eviction_policy=EVICT), ACC, RNE)
        x = add_residual(x, res, hp, c, mask, RES == 2, ACC, RNE)
    v = x
    a = x
    if GATING % 4 != 0:
        a = act(
            up(tl.load(ap + c, mask=mask, other=0.0, eviction_policy=EVICT), ACC, RNE),
            GATING >= 4,
            ACC,
        )
        if CAST == flag.CAST_NONE:
            a = rnd(a, IN, RNE)
        if GATING % 4 == 2:
            v = gated_input(x, a, CAST, IN, RNE)
    return v, a


@triton.jit
def _sum_v2(xp, ap, hp, rmask, N, K, sc, BLOCK_N, RES, RESCALE, FLAGS, GATING, IN, ACC):
    """Per row of a looped row block, Σv² over the first K columns, walked in BLOCK_N column
    blocks whose loads ask L2 to keep the row for the next pass. The first pass walks all N
    columns with a residual (RES) and stores h; the RESCALE pass sums (sc·v)² and reads v only
    (a gate applied after the norm does not enter it)."""
    PARTIAL: tl.constexpr = (FLAGS & flag.PARTIAL) != 0
    n1 = K
    if RES and not RESCALE:
        n1 = N
    acc = tl.zeros([rmask.shape[0], BLOCK_N], ACC)
    for c0 in tl.range(0, n1, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        m = rmask[:, None] & (cols < n1)[None, :]
        if RESCALE:
            ONLY_V: tl.constexpr = GATING % 4 // 2 * 2 + GATING // 4 * 4
            v, _ = load_input(
                xp, ap, hp, cols[None, :], m, "evict_last", RES, FLAGS, ONLY_V, IN, ACC
            )
            v = v * sc[:, None]
        else:
            v, _ = load_input(
                xp, ap, hp, cols[None, :], m, "evict_last", RES * 2, FLAGS, GATING, IN, ACC
            )
            v = head(v, cols, K, PARTIAL and RES)
        acc += v * v
    return tl.sum(acc, axis=1)


@triton.jit
def rescaled(ss, xp, ap, hp, rmask, K, BLOCK_N, RES, FLAGS, GATING, IN, ACC):
    """(ss, sc) of a looped row block from its Σv² ss: sc = 1, or where ss overflowed (rare, see
    sum_squares), sc = s and Σ(s·v)², read again."""
    over = overflowed(ss, ACC)
    sc = over_scale(over, ACC)
    if any_row(over):
        ss_s = _sum_v2(xp, ap, hp, rmask, K, K, sc, BLOCK_N, RES, True, FLAGS, GATING, IN, ACC)
        ss = tl.where(over, ss_s, ss)
    return ss, sc


@triton.jit
def loop_sum_squares(xp, ap, hp, rmask, N, K, BLOCK_N, RES, FLAGS, GATING, IN, ACC):
    """(ss, sc) of a looped row block (see _sum_v2 and rescaled)."""
    ss = _sum_v2(xp, ap, hp, rmask, N, K, 1.0, BLOCK_N, RES, False, FLAGS, GATING, IN, ACC)
    return rescaled(ss, xp, ap, hp, rmask, K, BLOCK_N, RES, FLAGS, GATING, IN, ACC)


@triton.jit
def inv_rms(ss, sc, kf, eps, FLAGS: tl.constexpr, ACC: tl.constexpr):
    """r from the sum of squares of the first k elements: 1/sqrt(ms + eps) ("mean_square") or
    1/(sqrt(ms) + eps) ("rms"); from a rescaled sum (sc = s, see sum_squares) sc/sqrt(ms + eps·s²)
    or sc/(sqrt(ms) + eps·s). Per row, so the correctly rounded forms cost nothing."""
    ms = div(ss, kf, ACC)
    if (FLAGS & flag.RMS_EPS) != 0:
        return div(tl.full(ss.shape, 1.0, ACC), sqrt(ms, ACC) + eps * sc, ACC) * sc
    else:
        return div(tl.full(ss.shape, 1.0, ACC), sqrt(ms + eps * sc * sc, ACC), ACC) * sc


@triton.jit
def rms_apply(
    v, r, w, b, off, FLAGS: tl.constexpr, IN: tl.constexpr, OUT: tl.constexpr, ACC: tl.constexpr
):
    """n = (offset + γ) ⊙ v·r + β for an ACC tile v and its per-tile-row r, rounded where the
    casting mode rounds (``reference.rms_norm_apply``); w, b are the raw weight / bias tiles
    (broadcastable to v; unused when absent). OUT is the output dtype (promote(input, weight) in
    "llama")."""
    HAS_W: tl.constexpr = (FLAGS & flag.W) != 0
    HAS_B: tl.constexpr = (FLAGS & flag.B) != 0
    CAST: tl.constexpr = (FLAGS >> flag.CAST_SHIFT) & flag.FIELD_MASK
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    if CAST == flag.CAST_GEMMA:
        # "gemma": everything in the compute dtype, one cast at the end (by the caller's store).
        y = v * r[:, None]
        if HAS_W:
            y = y * (up(w, ACC, RNE) + off)
        if HAS_B:
            y = y + up(b, ACC, RNE)
    elif CAST == flag.CAST_LLAMA:
        # "llama": normalize, round to the input dtype, then × weight in promote(input, weight).
        if OUT == tl.float64:
            P: tl.constexpr = tl.float64
        else:
            P: tl.constexpr = tl.float32
        y = cvt(v * r[:, None], IN, RNE).to(P)
        if HAS_W:
            y = rnd(y * rnd(up(w, P, RNE) + off.to(P), OUT, RNE), OUT, RNE)
        if HAS_B:
            y = rnd(y + rnd(up(b, P, RNE), OUT, RNE), OUT, RNE)
    else:
        # "none": r rounded to the input dtype, each product rounded in the input dtype.
        if IN == tl.float64:
            P: tl.constexpr = tl.float64
        else:
            P: tl.constexpr = tl.float32
        y = rnd(rnd(v.to(P), IN, RNE) * rnd(r.to(P), IN, RNE)[:, None], IN, RNE)
        if HAS_W:
            y = rnd(y * rnd(rnd(up(w, P, RNE), IN, RNE) + off.to(P), IN, RNE), IN, RNE)
        if HAS_B:
            y = rnd(y + rnd(up(b, P, RNE), IN, RNE), IN, RNE)
    return y


@triton.jit
def finite_r(r, ACC: tl.constexpr):
    """r, or 1 where r = inf (eps = 0 on a row whose squares underflow): such a row's Σ g·x̂ is
    summed as Σ g·x and multiplied by r afterwards (in rms_dx), so it is ±inf where torch's
    autograd has ±inf rather than inf − inf = NaN."""
    return tl.where(overflowed(r, ACC), 1.0, r)


@triton.jit
def rms_row_sums(x, g, r, cols, K, FLAGS: tl.constexpr, ACC: tl.constexpr):
    """Per row of one tile: Σ g·x̂ (Σ g·x where r = inf, see finite_r), g = dy ⊙ (offset + γ), and
    (for "rms") (ss, sc) = sum_squares of x_j, j < K (ss and sc are that sum when unused)."""
    sg = tl.sum(g * (x * finite_r(r, ACC)[:, None]), axis=1)
    if (FLAGS & flag.RMS_EPS) != 0:
        ss, sc = sum_squares(head(x, cols, K, (FLAGS & flag.PARTIAL) != 0), ACC)
    else:
        ss = sg
        sc = sg
    return sg, ss, sc


@triton.jit
def rms_dx(x, g, r, sgx, ss, sc, kf, cols, K, FLAGS: tl.constexpr, ACC: tl.constexpr):
    """dx = r·g − m·x̂·coef with g = dy ⊙ (offset + γ), S = Σ g·x̂ (from the partial sums of
    :func:`rms_row_sums`), coef = r·S/k ("mean_square") or S/(k·s) where s = sqrt(ss/k) > 0,
    else 0 ("rms"; from a rescaled ss, s is the RMS times sc and coef is multiplied by sc); m masks
    columns ≥ K."""
    xhat = x * r[:, None]
    sg = tl.where(overflowed(r, ACC), sgx * r, sgx)
    if (FLAGS & flag.RMS_EPS) != 0:
        root = sqrt(div(ss, kf, ACC), ACC)
        pos = root > 0
        coef = tl.where(pos, div(sg, kf * tl.where(pos, root, 1.0), ACC), 0.0) * sc
    else:
        coef = r * sg / kf
    return r[:, None] * g - head(xhat * coef[:, None], cols, K, (FLAGS & flag.PARTIAL) != 0)


@triton.jit
def dw_term(dy, x, r, FLAGS: tl.constexpr, IN: tl.constexpr):
    """dy ⊙ x̂, a tile's d weight contribution: x̂ = x·r, rounded to IN in "llama" (whose forward
    multiplies the weight by the rounded x̂)."""
    xhat = x * r[:, None]
    if ((FLAGS >> flag.CAST_SHIFT) & flag.FIELD_MASK) == flag.CAST_LLAMA:
        xhat = rnd(xhat, IN, (FLAGS & flag.RNE) != 0)
    return dy * xhat


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
