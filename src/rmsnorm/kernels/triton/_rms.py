"""The RMSNorm kernels (plain and fused residual add), forward and backward, in the three layouts
described in ``_common.py``."""

from __future__ import annotations

import triton
import triton.language as tl

from . import _flags as flag
from ._common import (
    any_row,
    arrive_and_wait,
    as_acc,
    combine_partials,
    cvt,
    div,
    encode_partial,
    first_chunk,
    gather,
    over_scale,
    overflowed,
    publish,
    rnd,
    sqrt,
    sum_squares,
    tile,
    up,
)


@triton.jit
def _inv_rms(ss, sc, kf, eps, RMS_EPS: tl.constexpr, ACC: tl.constexpr):
    """r from the sum of squares of the first k elements: 1/sqrt(ms + eps) ("mean_square") or
    1/(sqrt(ms) + eps) ("rms"); from a rescaled sum (sc = s, see sum_squares) sc/sqrt(ms + eps·s²)
    or sc/(sqrt(ms) + eps·s). Per row, so the correctly rounded forms cost nothing."""
    ms = div(ss, kf, ACC)
    if RMS_EPS:
        return div(tl.full(ss.shape, 1.0, ACC), sqrt(ms, ACC) + eps * sc, ACC) * sc
    else:
        return div(tl.full(ss.shape, 1.0, ACC), sqrt(ms + eps * sc * sc, ACC), ACC) * sc


@triton.jit
def _load_x(X, RES, H, rows64, cols, mask, stride_x, stride_res, stride_h,
            HAS_RES: tl.constexpr, STORE_H: tl.constexpr, ACC: tl.constexpr,
            EVICT: tl.constexpr, RNE: tl.constexpr):  # fmt: skip
    """The normalized input tile in ACC: x, or h = x + residual rounded to the residual's dtype
    (stored to H when STORE_H) so the statistics are those of the h returned."""
    x = up(tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy=EVICT), ACC, RNE)  # fmt: skip
    if HAS_RES:
        res = up(tl.load(RES + rows64[:, None] * stride_res + cols[None, :], mask=mask, other=0.0,
                      eviction_policy=EVICT), ACC, RNE)  # fmt: skip
        h = cvt(x + res, H.dtype.element_ty, RNE)
        if STORE_H:
            tl.store(H + rows64[:, None] * stride_h + cols[None, :], h, mask=mask)
        x = up(h, ACC, RNE)
    return x


@triton.jit
def _rms_apply(x, r, w, b, off, HAS_W: tl.constexpr, HAS_B: tl.constexpr, CAST: tl.constexpr,
               IN: tl.constexpr, OUT: tl.constexpr, ACC: tl.constexpr,
               RNE: tl.constexpr):  # fmt: skip
    """y for an (BLOCK_M, BLOCK_N) ACC tile x and its (BLOCK_M,) r, rounded where the casting
    mode rounds (w, b are the raw (BLOCK_N,) loads; unused when absent)."""
    if CAST == flag.CAST_GEMMA:
        # "gemma": everything in the compute dtype, one cast at the end (by the caller's store).
        y = x * r[:, None]
        if HAS_W:
            y = y * (up(w, ACC, RNE) + off)[None, :]
        if HAS_B:
            y = y + up(b, ACC, RNE)[None, :]
    elif CAST == flag.CAST_LLAMA:
        # "llama": normalize, round to the input dtype, then × weight in promote(input, weight).
        if OUT == tl.float64:
            P: tl.constexpr = tl.float64
        else:
            P: tl.constexpr = tl.float32
        y = cvt(x * r[:, None], IN, RNE).to(P)
        if HAS_W:
            s = rnd(up(w, P, RNE) + off.to(P), OUT, RNE)
            y = rnd(y * s[None, :], OUT, RNE)
        if HAS_B:
            y = rnd(y + rnd(up(b, P, RNE), OUT, RNE)[None, :], OUT, RNE)
    else:
        # "none": r rounded to the input dtype, each product rounded in the input dtype.
        if IN == tl.float64:
            P: tl.constexpr = tl.float64
        else:
            P: tl.constexpr = tl.float32
        y = rnd(rnd(x.to(P), IN, RNE) * rnd(r.to(P), IN, RNE)[:, None], IN, RNE)
        if HAS_W:
            s = rnd(rnd(up(w, P, RNE), IN, RNE) + off.to(P), IN, RNE)
            y = rnd(y * s[None, :], IN, RNE)
        if HAS_B:
            y = rnd(y + rnd(up(b, P, RNE), IN, RNE)[None, :], IN, RNE)
    return y


# ----------------------------------------------------------------------------------------------
# RMSNorm forward (plain and fused residual add)
# ----------------------------------------------------------------------------------------------
@triton.jit
def rms_norm_fwd_kernel(
    X,  # (M, N) input x
    RES,  # (M, N) residual (HAS_RES) else unused
    Y,  # (M, N) output y, in the casting mode's output dtype
    H,  # (M, N) h = x + residual in the residual's dtype (HAS_RES) else unused
    W,  # (N,) weight γ (HAS_W) else unused
    B,  # (N,) bias β (HAS_B) else unused
    RSTD,  # (M,) ACC: r per row
    WS,  # (M, 1, SPLIT) ACC workspace (SPLIT > 1) else unused
    CNT,  # (cdiv(M, BLOCK_M),) int32 zeros: arrivals per row block (SPLIT > 1) else unused
    stride_x, stride_res,  # input row strides, in elements (Y and H are contiguous)
    M, N, K,  # rows, columns, leading columns the RMS is taken over
    eps: tl.float64,
    offset: tl.float64,  # y = (offset + γ) ⊙ x̂ + β
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,  # cooperating programs per row (and next pow2)
    FLAGS: tl.constexpr,  # LOOP, PREFETCH, PHASE, RES, W, B, RMS_EPS, PARTIAL, CAST, RNE (_flags)
    ACC: tl.constexpr,  # tl.float32, or tl.float64 for float64 inputs
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & flag.LOOP) != 0
    PREFETCH: tl.constexpr = (FLAGS & flag.PREFETCH) != 0
    PHASE: tl.constexpr = (FLAGS >> flag.PHASE_SHIFT) & flag.FIELD_MASK
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    HAS_RES: tl.constexpr = (FLAGS & flag.RES) != 0
    HAS_W: tl.constexpr = (FLAGS & flag.W) != 0
    HAS_B: tl.constexpr = (FLAGS & flag.B) != 0
    RMS_EPS: tl.constexpr = (FLAGS & flag.RMS_EPS) != 0
    PARTIAL: tl.constexpr = (FLAGS & flag.PARTIAL) != 0
    CAST: tl.constexpr = (FLAGS >> flag.CAST_SHIFT) & flag.FIELD_MASK
    stride_y = N
    stride_h = N
    IN = X.dtype.element_ty
    OUT = Y.dtype.element_ty
    pid = tl.program_id(0)
    slot = pid // SPLIT
    part = pid % SPLIT
    n_slots = tl.num_programs(0) // SPLIT
    eps_a = as_acc(eps, ACC)
    off = as_acc(offset, ACC)
    kf = as_acc(K, ACC)
    num_rb = tl.cdiv(M, BLOCK_M)
    r_idx = tl.arange(0, BLOCK_M)
    if LOOP:
        for rb in tl.range(slot, num_rb, n_slots):
            rows = rb * BLOCK_M + r_idx
            rmask = rows < M
            rows64 = rows.to(tl.int64)
            # Pass 1: sum of squares over the first K columns (all N with a residual: h is
            # produced here). Loads ask L2 to keep the row for pass 2.
            acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
            if HAS_RES:
                n1 = N
            else:
                n1 = K
            for c0 in tl.range(0, n1, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                mask = rmask[:, None] & (cols < N)[None, :]
                x = _load_x(X, RES, H, rows64, cols, mask, stride_x, stride_res, stride_h,
                            HAS_RES, True, ACC, "evict_last", RNE)  # fmt: skip
                if PARTIAL:
                    x = tl.where((cols < K)[None, :], x, 0.0)
                acc += x * x
            ss = tl.sum(acc, axis=1)
            over = overflowed(ss, ACC)
            sc = over_scale(over, ACC)
            if any_row(over):  # rare: Σx² overflowed; pass 1 again on s·x
                acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
                for c0 in tl.range(0, K, BLOCK_N):
                    c_s = c0 + tl.arange(0, BLOCK_N)
                    m_s = rmask[:, None] & (c_s < K)[None, :]
                    xs = _load_x(X, RES, H, rows64, c_s, m_s, stride_x, stride_res, stride_h,
                                 HAS_RES, False, ACC, "evict_last", RNE) * sc[:, None]  # fmt: skip
                    acc += xs * xs
                ss = tl.where(over, tl.sum(acc, axis=1), ss)
            r = _inv_rms(ss, sc, kf, eps_a, RMS_EPS, ACC)
            tl.store(RSTD + rows, r, mask=rmask)
            # Pass 2: normalize (h is recomputed from x + residual: bit-identical, and no
            # read-after-write of H inside the kernel).
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = _load_x(X, RES, H, rows64, cols, mask, stride_x, stride_res, stride_h,
                            HAS_RES, False, ACC, "evict_first", RNE)  # fmt: skip
                w = tl.load(W + cols, mask=cmask, other=0.0) if HAS_W else 0.0
                b = tl.load(B + cols, mask=cmask, other=0.0) if HAS_B else 0.0
                y = _rms_apply(x, r, w, b, off, HAS_W, HAS_B, CAST, IN, OUT, ACC, RNE)
                tl.store(
                    Y + rows64[:, None] * stride_y + cols[None, :], cvt(y, OUT, RNE), mask=mask
                )
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        w = tl.load(W + cols, mask=cmask, other=0.0) if HAS_W else 0.0
        b = tl.load(B + cols, mask=cmask, other=0.0) if HAS_B else 0.0
        # PREFETCH (persistent grids): the next row block's tiles are requested before this one
        # is computed (Triton does not pipeline this loop); in a split row they are in flight
        # during the exchange. Kept in the input dtype until used.
        if PREFETCH:
            x_nx = tile(X, slot * BLOCK_M + r_idx, stride_x, cols, M, cmask)
            if HAS_RES:
                res_nx = tile(RES, slot * BLOCK_M + r_idx, stride_res, cols, M, cmask)
        for rb in tl.range(slot, num_rb, n_slots):
            rows = rb * BLOCK_M + r_idx
            rmask = rows < M
            rows64 = rows.to(tl.int64)
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
                h = cvt(x + up(res_raw, ACC, RNE), H.dtype.element_ty, RNE)
                if PHASE != 1:
                    tl.store(H + rows64[:, None] * stride_h + cols[None, :], h, mask=mask)
                x = up(h, ACC, RNE)
            if PARTIAL:
                ss, sc = sum_squares(tl.where((cols < K)[None, :], x, 0.0), ACC)
            else:
                ss, sc = sum_squares(x, ACC)
            if SPLIT > 1:
                if PHASE != 2:
                    publish(WS, rows64, rmask, part, 0, encode_partial(ss, sc), 1, SPLIT)
                if PHASE == 0:
                    arrive_and_wait(CNT, rb, SPLIT)
                if PHASE != 1:
                    v = gather(WS, rows64, rmask, 0, 1, SPLIT, SPLIT_P2)
                    ss, sc = combine_partials(v, ACC)
            if PHASE != 1:
                r = _inv_rms(ss, sc, kf, eps_a, RMS_EPS, ACC)
                tl.store(RSTD + rows, r, mask=rmask & first_chunk(r_idx, part, BLOCK_M))
                y = _rms_apply(x, r, w, b, off, HAS_W, HAS_B, CAST, IN, OUT, ACC, RNE)
                tl.store(
                    Y + rows64[:, None] * stride_y + cols[None, :], cvt(y, OUT, RNE), mask=mask
                )


# ----------------------------------------------------------------------------------------------
# RMSNorm backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _rms_dx(x, dy, r, wo, sgx, ss, sc, kf, cols, K, HAS_W: tl.constexpr, RMS_EPS: tl.constexpr,
            PARTIAL: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """dx = r·g − m·x̂·coef with g = dy ⊙ (offset + γ), S = Σ g·x̂ (from the partial sums of
    :func:`_rms_bwd_row_sums`), coef = r·S/k ("mean_square") or S/(k·s) where s = sqrt(ss/k) > 0,
    else 0 ("rms"; from a rescaled ss, s is the RMS times sc and coef is multiplied by sc); m masks
    columns ≥ K."""
    xhat = x * r[:, None]
    sg = tl.where(overflowed(r, ACC), sgx * r, sgx)
    if HAS_W:
        g = dy * wo[None, :]
    else:
        g = dy
    if RMS_EPS:
        root = sqrt(div(ss, kf, ACC), ACC)
        pos = root > 0
        coef = tl.where(pos, div(sg, kf * tl.where(pos, root, 1.0), ACC), 0.0) * sc
    else:
        coef = r * sg / kf
    corr = xhat * coef[:, None]
    if PARTIAL:
        corr = tl.where((cols < K)[None, :], corr, 0.0)
    return r[:, None] * g - corr


@triton.jit
def _finite_r(r, ACC: tl.constexpr):
    """r, or 1 where r = inf (eps = 0 on a row whose squares underflow): such a row's Σ g·x̂ is
    summed as Σ g·x and multiplied by r afterwards (in _rms_dx), so it is ±inf where torch's
    autograd has ±inf rather than inf − inf = NaN."""
    return tl.where(overflowed(r, ACC), 1.0, r)


@triton.jit
def _rms_bwd_row_sums(x, dy, r, wo, cols, K, HAS_W: tl.constexpr, RMS_EPS: tl.constexpr,
                      PARTIAL: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """Per-row Σ g·x̂ (Σ g·x where r = inf, see _finite_r) and (for "rms") (ss, sc) =
    sum_squares of x_j, j < K, of one tile (ss and sc are that sum when unused)."""
    if HAS_W:
        g = dy * wo[None, :]
    else:
        g = dy
    sg = tl.sum(g * (x * _finite_r(r, ACC)[:, None]), axis=1)
    if RMS_EPS:
        if PARTIAL:
            ss, sc = sum_squares(tl.where((cols < K)[None, :], x, 0.0), ACC)
        else:
            ss, sc = sum_squares(x, ACC)
    else:
        ss = sg
        sc = sg
    return sg, ss, sc


@triton.jit
def rms_norm_bwd_kernel(
    DY,  # (M, N) gradient of y
    X,  # (M, N) the normalized input (h for add_rms_norm)
    W,  # (N,) weight (HAS_W) else unused
    RSTD,  # (M,) r saved by the forward
    DRES,  # (M, N) gradient reaching h directly (HAS_DRES) else unused
    DX,  # (M, N) output, x's dtype
    PART,  # (slots, NEED_DW·N + NEED_DB·N) ACC: per-program partial d weight | d bias
    WS,  # (M, 2, SPLIT) ACC workspace (SPLIT > 1) else unused
    CNT,  # (cdiv(M, BLOCK_M),) int32 zeros (SPLIT > 1) else unused
    stride_dy, stride_x, stride_dres,  # input row strides, in elements (DX is contiguous)
    M, N, K,
    offset: tl.float64,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
    FLAGS: tl.constexpr,  # LOOP, PREFETCH, PHASE, RES (d residual), W, DW, DB, RMS_EPS,
    #                       PARTIAL, CAST (llama: d weight uses x̂ rounded to IN), RNE
    IN: tl.constexpr,  # the forward's input dtype
    ACC: tl.constexpr,
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & flag.LOOP) != 0
    PREFETCH: tl.constexpr = (FLAGS & flag.PREFETCH) != 0
    PHASE: tl.constexpr = (FLAGS >> flag.PHASE_SHIFT) & flag.FIELD_MASK
    RNE: tl.constexpr = (FLAGS & flag.RNE) != 0
    HAS_DRES: tl.constexpr = (FLAGS & flag.RES) != 0
    HAS_W: tl.constexpr = (FLAGS & flag.W) != 0
    NEED_DW: tl.constexpr = (FLAGS & flag.DW) != 0
    NEED_DB: tl.constexpr = (FLAGS & flag.DB) != 0
    RMS_EPS: tl.constexpr = (FLAGS & flag.RMS_EPS) != 0
    PARTIAL: tl.constexpr = (FLAGS & flag.PARTIAL) != 0
    LLAMA: tl.constexpr = ((FLAGS >> flag.CAST_SHIFT) & flag.FIELD_MASK) == flag.CAST_LLAMA
    stride_dx = N
    if NEED_DW and NEED_DB:
        stride_part = 2 * N
    else:
        stride_part = N
    pid = tl.program_id(0)
    slot = pid // SPLIT
    part = pid % SPLIT
    n_slots = tl.num_programs(0) // SPLIT
    off = as_acc(offset, ACC)
    kf = as_acc(K, ACC)
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
            r = tl.load(RSTD + rows, mask=rmask, other=0.0).to(ACC)
            # Pass 1: the row sums (loads ask L2 to keep x, dy for pass 2).
            acc_sg = tl.zeros([BLOCK_M, BLOCK_N], ACC)
            acc_ss = tl.zeros([BLOCK_M, BLOCK_N], ACC)
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = up(tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_last"), ACC, RNE)  # fmt: skip
                dy = up(tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask,
                             other=0.0, eviction_policy="evict_last"), ACC, RNE)  # fmt: skip
                if HAS_W:
                    wo = up(tl.load(W + cols, mask=cmask, other=0.0), ACC, RNE) + off
                else:
                    wo = 0.0
                g = dy * wo[None, :] if HAS_W else dy
                acc_sg += g * (x * _finite_r(r, ACC)[:, None])
                if RMS_EPS:
                    xs = tl.where((cols < K)[None, :], x, 0.0) if PARTIAL else x
                    acc_ss += xs * xs
            sg = tl.sum(acc_sg, axis=1)
            ss = tl.sum(acc_ss, axis=1)
            sc = tl.full([BLOCK_M], 1.0, ACC)
            if RMS_EPS:
                over = overflowed(ss, ACC)
                sc = over_scale(over, ACC)
                if any_row(over):  # rare: Σx² overflowed; sum it again from s·x
                    acc_ss = tl.zeros([BLOCK_M, BLOCK_N], ACC)
                    for c0 in tl.range(0, K, BLOCK_N):
                        c_s = c0 + tl.arange(0, BLOCK_N)
                        m_s = rmask[:, None] & (c_s < K)[None, :]
                        xs = up(tl.load(X + rows64[:, None] * stride_x + c_s[None, :], mask=m_s,
                                     other=0.0), ACC, RNE) * sc[:, None]  # fmt: skip
                        acc_ss += xs * xs
                    ss = tl.where(over, tl.sum(acc_ss, axis=1), ss)
            # Pass 2: dx, and the d weight / d bias contributions added into this program's
            # partial row (program-private: first visit writes, later visits read-modify-write).
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
                if HAS_W:
                    wo = up(tl.load(W + cols, mask=cmask, other=0.0), ACC, RNE) + off
                else:
                    wo = 0.0
                dx = _rms_dx(x, dy, r, wo, sg, ss, sc, kf, cols, K, HAS_W, RMS_EPS, PARTIAL, ACC)
                if HAS_DRES:
                    dres = tl.load(DRES + rows64[:, None] * stride_dres + cols[None, :],
                                   mask=mask, other=0.0, eviction_policy="evict_first")  # fmt: skip
                    dx += up(dres, ACC, RNE)
                tl.store(DX + rows64[:, None] * stride_dx + cols[None, :],
                         cvt(dx, DX.dtype.element_ty, RNE), mask=mask)  # fmt: skip
                if NEED_DW:
                    xhat = x * r[:, None]
                    if LLAMA:
                        xhat = up(cvt(xhat, IN, RNE), ACC, RNE)
                    prev = tl.load(part_row + cols, mask=cmask & later, other=0.0)
                    tl.store(part_row + cols, prev + tl.sum(dy * xhat, axis=0), mask=cmask)
                if NEED_DB:
                    prev = tl.load(db_row + cols, mask=cmask & later, other=0.0)
                    tl.store(db_row + cols, prev + tl.sum(dy, axis=0), mask=cmask)
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        if HAS_W:
            wo = up(tl.load(W + cols, mask=cmask, other=0.0), ACC, RNE) + off
        else:
            wo = 0.0
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
            rows = rb * BLOCK_M + r_idx
            rmask = rows < M
            rows64 = rows.to(tl.int64)
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
            sg, ss, sc = _rms_bwd_row_sums(x, dy, r, wo, cols, K, HAS_W, RMS_EPS, PARTIAL, ACC)
            if SPLIT > 1:
                if PHASE != 2:
                    publish(WS, rows64, rmask, part, 0, sg, 2, SPLIT)
                    if RMS_EPS:
                        publish(WS, rows64, rmask, part, 1, encode_partial(ss, sc), 2, SPLIT)
                if PHASE == 0:
                    arrive_and_wait(CNT, rb, SPLIT)
                if PHASE != 1:
                    sg = tl.sum(gather(WS, rows64, rmask, 0, 2, SPLIT, SPLIT_P2), axis=1)
                    if RMS_EPS:
                        v = gather(WS, rows64, rmask, 1, 2, SPLIT, SPLIT_P2)
                        ss, sc = combine_partials(v, ACC)
            if PHASE != 1:
                dx = _rms_dx(x, dy, r, wo, sg, ss, sc, kf, cols, K, HAS_W, RMS_EPS, PARTIAL, ACC)
                if HAS_DRES:
                    dx += up(dres, ACC, RNE)
                tl.store(DX + rows64[:, None] * stride_dx + cols[None, :],
                         cvt(dx, DX.dtype.element_ty, RNE), mask=mask)  # fmt: skip
                if NEED_DW:
                    xhat = x * r[:, None]
                    if LLAMA:
                        xhat = up(cvt(xhat, IN, RNE), ACC, RNE)
                    dw_acc += dy * xhat
                if NEED_DB:
                    db_acc += dy
        if PHASE != 1:
            if NEED_DW:
                tl.store(part_row + cols, tl.sum(dw_acc, axis=0), mask=cmask)
            if NEED_DB:
                tl.store(db_row + cols, tl.sum(db_acc, axis=0), mask=cmask)
