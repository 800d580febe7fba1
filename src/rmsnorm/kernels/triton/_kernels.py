"""The @triton.jit kernels: RMSNorm (plain and fused residual add) and LayerNorm, forward and
backward, plus the fixed-order sum of the backward's per-program d weight / d bias partials.

Every kernel works on (BLOCK_M, BLOCK_N) tiles of rows and walks row blocks with a grid stride,
so one kernel body serves three layouts (chosen by the launch config, see ``_config.py``):

- single tile (``LOOP=False, SPLIT=1``): a whole row block lives in registers; BLOCK_M > 1 packs
  several short rows (QK-norm) into one tile.
- looped (``LOOP=True``): one program walks a row in BLOCK_N column blocks, a first pass for the
  statistics and a second pass (re-reading from L2) for the output.
- split (``SPLIT=P > 1``): P cooperating programs each hold one BLOCK_N column chunk of the same
  rows in registers; they exchange per-row partial sums through a small workspace, synchronised by
  a per-row-block arrival counter (all programs are co-resident: the grid never exceeds the SM
  count). Partials are summed in a fixed order, so results are deterministic. ``PHASE`` 1 / 2 run
  the publish and the finish halves as two launches: the Triton interpreter runs programs one after
  another, where the spin-wait of ``PHASE`` 0 would never end.

Statistics and all arithmetic are in ``ACC`` (float32, float64 for float64 inputs); row offsets are
int64 (``rows.to(tl.int64) * stride``) so tensors past 2^31 elements address correctly.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Under the interpreter (chosen before triton is imported, so fixed for the process) fp32 -> bf16
# casts truncate; GPUs round to nearest even. Kernels then round bf16 by hand (_cvt, flag F_RNE),
# so that interpreted results, which feed later arithmetic (h of add_rms_norm, the llama/none
# roundings), are the ones a GPU computes. On a GPU every cast is the native cvt.rn.
_INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Casting modes, as integers for the kernels (see CONVENTIONS.md, "Casting modes").
CAST_GEMMA: int = 0
CAST_LLAMA: int = 1
CAST_NONE: int = 2

# The options of a launch travel as bits of one FLAGS constexpr: Triton binds every launch argument
# in Python, each constexpr costing about as much as a tensor, and decoding-size calls are
# launch-bound. Kernels test the bits with literals (noted by name): a global constexpr would be
# re-validated by Triton on every launch, which costs more than the constexprs saved.
F_LOOP = 1 << 0  # N > BLOCK_N: walk the row in column blocks
F_PREFETCH = 1 << 1  # persistent grid: load row block i + 1 while computing i
PHASE_SHIFT = 2  # 2 bits: 0 full, 1 publish only, 2 finish only (split rows, interpreter)
F_RES = 1 << 4  # forward: a residual to add; backward: a d residual to add
F_W = 1 << 5  # a weight γ
F_B = 1 << 6  # a bias β (forward)
F_DW = 1 << 7  # backward: write d weight partials
F_DB = 1 << 8  # backward: write d bias partials
F_RMS_EPS = 1 << 9  # eps_mode "rms": r = 1/(sqrt(ms) + eps)
F_PARTIAL = 1 << 10  # K < N
CAST_SHIFT = 11  # 2 bits: CAST_GEMMA / CAST_LLAMA / CAST_NONE
F_RNE = 1 << 13  # round fp32 -> bf16 to nearest even by hand (see _cvt)


def flags(
    *, loop=False, prefetch=False, phase=0, res=False, w=False, b=False, dw=False, db=False,
    rms_eps=False, partial=False, cast=CAST_GEMMA,
) -> int:  # fmt: skip
    """The FLAGS value of a launch (host side); F_RNE is set whenever the interpreter runs."""
    return (
        int(loop) * F_LOOP | int(prefetch) * F_PREFETCH | phase << PHASE_SHIFT | int(res) * F_RES
        | int(w) * F_W | int(b) * F_B | int(dw) * F_DW | int(db) * F_DB
        | int(rms_eps) * F_RMS_EPS | int(partial) * F_PARTIAL | cast << CAST_SHIFT
        | int(_INTERPRETED) * F_RNE
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _as_acc(v, ACC: tl.constexpr):
    """A scalar argument as a 1-element ACC tensor: exact for the fp64 float arguments, and safe for
    int arguments that Triton specialises to constants (== 1)."""
    return (tl.zeros([1], ACC) + v).to(ACC)


@triton.jit
def _div(a, b, ACC: tl.constexpr):
    """Correctly rounded division (IEEE in float64 already; div_rn is float32-only)."""
    if ACC == tl.float64:
        return a / b
    else:
        return tl.div_rn(a, b)


@triton.jit
def _sqrt(a, ACC: tl.constexpr):
    if ACC == tl.float64:
        return tl.sqrt(a)
    else:
        return tl.sqrt_rn(a)


@triton.jit
def _cvt(v, DT: tl.constexpr, RNE: tl.constexpr):
    """v.to(DT), rounding to nearest even by hand for bf16 when RNE (see _INTERPRETED)."""
    if RNE and DT == tl.bfloat16 and v.dtype != tl.bfloat16:
        bits = v.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(DT)


@triton.jit
def _rnd(v, DT: tl.constexpr, RNE: tl.constexpr):
    """Round v to DT's precision and back (a no-op when DT is v's dtype)."""
    return _cvt(v, DT, RNE).to(v.dtype)


@triton.jit
def _first_chunk(r_idx, part, BLOCK_M: tl.constexpr):
    """``part == 0`` as a (BLOCK_M,) mask: only chunk 0 of a split row writes the row statistics.
    (A vector, because the interpreter mis-types ``vector_mask & scalar_mask``.)"""
    return (r_idx + part * BLOCK_M) < BLOCK_M


@triton.jit
def _inv_rms(ss, kf, eps, RMS_EPS: tl.constexpr, ACC: tl.constexpr):
    """r from the sum of squares of the first k elements: 1/sqrt(ms + eps) ("mean_square") or
    1/(sqrt(ms) + eps) ("rms"); per row, so the correctly rounded forms cost nothing."""
    ms = _div(ss, kf, ACC)
    if RMS_EPS:
        return _div(tl.full(ss.shape, 1.0, ACC), _sqrt(ms, ACC) + eps, ACC)
    else:
        return _div(tl.full(ss.shape, 1.0, ACC), _sqrt(ms + eps, ACC), ACC)


@triton.jit
def _tile(P, rows, stride, cols, M, cmask):
    """The raw (BLOCK_M, BLOCK_N) tile of rows `rows` (int32; offsets formed in int64), zeros
    outside [0, M) × cmask. Kept in the tensor's own dtype: a prefetched bf16 tile costs half the
    registers of its fp32 copy."""
    mask = (rows < M)[:, None] & cmask[None, :]
    return tl.load(P + rows.to(tl.int64)[:, None] * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _load_x(X, RES, H, rows64, cols, mask, stride_x, stride_res, stride_h,
            HAS_RES: tl.constexpr, STORE_H: tl.constexpr, ACC: tl.constexpr,
            EVICT: tl.constexpr, RNE: tl.constexpr):  # fmt: skip
    """The normalized input tile in ACC: x, or h = x + residual rounded to the residual's dtype
    (stored to H when STORE_H) so the statistics are those of the h returned."""
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy=EVICT).to(ACC)  # fmt: skip
    if HAS_RES:
        res = tl.load(RES + rows64[:, None] * stride_res + cols[None, :], mask=mask, other=0.0,
                      eviction_policy=EVICT).to(ACC)  # fmt: skip
        h = _cvt(x + res, H.dtype.element_ty, RNE)
        if STORE_H:
            tl.store(H + rows64[:, None] * stride_h + cols[None, :], h, mask=mask)
        x = h.to(ACC)
    return x


@triton.jit
def _rms_apply(x, r, w, b, off, HAS_W: tl.constexpr, HAS_B: tl.constexpr, CAST: tl.constexpr,
               IN: tl.constexpr, OUT: tl.constexpr, ACC: tl.constexpr,
               RNE: tl.constexpr):  # fmt: skip
    """y for an (BLOCK_M, BLOCK_N) ACC tile x and its (BLOCK_M,) r, rounded where the casting
    mode rounds (w, b are the raw (BLOCK_N,) loads; unused when absent)."""
    if CAST == 0:
        # "gemma": everything in the compute dtype, one cast at the end (by the caller's store).
        y = x * r[:, None]
        if HAS_W:
            y = y * (w.to(ACC) + off)[None, :]
        if HAS_B:
            y = y + b.to(ACC)[None, :]
    elif CAST == 1:
        # "llama": normalize, round to the input dtype, then × weight in promote(input, weight).
        if OUT == tl.float64:
            P: tl.constexpr = tl.float64
        else:
            P: tl.constexpr = tl.float32
        y = _cvt(x * r[:, None], IN, RNE).to(P)
        if HAS_W:
            s = _rnd(w.to(P) + off.to(P), OUT, RNE)
            y = _rnd(y * s[None, :], OUT, RNE)
        if HAS_B:
            y = _rnd(y + _rnd(b.to(P), OUT, RNE)[None, :], OUT, RNE)
    else:
        # "none": r rounded to the input dtype, each product rounded in the input dtype.
        if IN == tl.float64:
            P: tl.constexpr = tl.float64
        else:
            P: tl.constexpr = tl.float32
        y = _rnd(_rnd(x.to(P), IN, RNE) * _rnd(r.to(P), IN, RNE)[:, None], IN, RNE)
        if HAS_W:
            s = _rnd(_rnd(w.to(P), IN, RNE) + off.to(P), IN, RNE)
            y = _rnd(y * s[None, :], IN, RNE)
        if HAS_B:
            y = _rnd(y + _rnd(b.to(P), IN, RNE)[None, :], IN, RNE)
    return y


# ----------------------------------------------------------------------------------------------
# Cross-program exchange for the split layout
# ----------------------------------------------------------------------------------------------
@triton.jit
def _publish(WS, rows64, rmask, part, j: tl.constexpr, v, NV: tl.constexpr,
             SPLIT: tl.constexpr):  # fmt: skip
    """Store this program's per-row partial v (BLOCK_M,) as value j of chunk `part`.
    WS is (M, NV, SPLIT) in ACC."""
    tl.store(WS + rows64 * (NV * SPLIT) + j * SPLIT + part, v, mask=rmask)


@triton.jit
def _arrive_and_wait(CNT, rb, SPLIT: tl.constexpr):
    """Count this program in for row block rb, then wait until all SPLIT chunks have published.
    The barrier orders every thread's workspace stores before the release; the acquire orders the
    workspace loads after the last arrival. All SPLIT programs are co-resident (grid ≤ SMs)."""
    tl.debug_barrier()
    seen = tl.atomic_add(CNT + rb, 1, sem="acq_rel") + 1
    while seen < SPLIT:
        seen = tl.atomic_add(CNT + rb, 0, sem="acquire")


@triton.jit
def _gather(WS, rows64, rmask, j: tl.constexpr, NV: tl.constexpr, SPLIT: tl.constexpr,
            SPLIT_P2: tl.constexpr):  # fmt: skip
    """The SPLIT partials of value j for each row, as a (BLOCK_M, SPLIT_P2) tile (0 past SPLIT);
    loaded from L2 (.cg) so no stale L1 line is ever read."""
    p = tl.arange(0, SPLIT_P2)
    m = rmask[:, None] & (p < SPLIT)[None, :]
    return tl.load(WS + rows64[:, None] * (NV * SPLIT) + j * SPLIT + p[None, :], mask=m,
                   other=0.0, cache_modifier=".cg")  # fmt: skip


# ----------------------------------------------------------------------------------------------
# RMSNorm forward (plain and fused residual add)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _rms_norm_fwd_kernel(
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
    FLAGS: tl.constexpr,  # F_LOOP, F_PREFETCH, phase, F_RES, F_W, F_B, F_RMS_EPS, F_PARTIAL, cast
    ACC: tl.constexpr,  # tl.float32, or tl.float64 for float64 inputs
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & 1) != 0  # F_LOOP
    PREFETCH: tl.constexpr = (FLAGS & 2) != 0  # F_PREFETCH
    PHASE: tl.constexpr = (FLAGS >> 2) & 3  # PHASE_SHIFT
    RNE: tl.constexpr = (FLAGS & 8192) != 0  # F_RNE
    HAS_RES: tl.constexpr = (FLAGS & 16) != 0  # F_RES
    HAS_W: tl.constexpr = (FLAGS & 32) != 0  # F_W
    HAS_B: tl.constexpr = (FLAGS & 64) != 0  # F_B
    RMS_EPS: tl.constexpr = (FLAGS & 512) != 0  # F_RMS_EPS
    PARTIAL: tl.constexpr = (FLAGS & 1024) != 0  # F_PARTIAL
    CAST: tl.constexpr = (FLAGS >> 11) & 3  # CAST_SHIFT
    stride_y = N
    stride_h = N
    IN = X.dtype.element_ty
    OUT = Y.dtype.element_ty
    pid = tl.program_id(0)
    slot = pid // SPLIT
    part = pid % SPLIT
    n_slots = tl.num_programs(0) // SPLIT
    eps_a = _as_acc(eps, ACC)
    off = _as_acc(offset, ACC)
    kf = _as_acc(K, ACC)
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
            r = _inv_rms(tl.sum(acc, axis=1), kf, eps_a, RMS_EPS, ACC)
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
                    Y + rows64[:, None] * stride_y + cols[None, :], _cvt(y, OUT, RNE), mask=mask
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
            x_nx = _tile(X, slot * BLOCK_M + r_idx, stride_x, cols, M, cmask)
            if HAS_RES:
                res_nx = _tile(RES, slot * BLOCK_M + r_idx, stride_res, cols, M, cmask)
        for rb in tl.range(slot, num_rb, n_slots):
            rows = rb * BLOCK_M + r_idx
            rmask = rows < M
            rows64 = rows.to(tl.int64)
            mask = rmask[:, None] & cmask[None, :]
            if PREFETCH:
                x_raw = x_nx
                x_nx = _tile(X, rows + n_slots * BLOCK_M, stride_x, cols, M, cmask)
                if HAS_RES:
                    res_raw = res_nx
                    res_nx = _tile(RES, rows + n_slots * BLOCK_M, stride_res, cols, M, cmask)
            else:
                x_raw = _tile(X, rows, stride_x, cols, M, cmask)
                if HAS_RES:
                    res_raw = _tile(RES, rows, stride_res, cols, M, cmask)
            x = x_raw.to(ACC)
            if HAS_RES:
                h = _cvt(x + res_raw.to(ACC), H.dtype.element_ty, RNE)
                if PHASE != 1:
                    tl.store(H + rows64[:, None] * stride_h + cols[None, :], h, mask=mask)
                x = h.to(ACC)
            if PARTIAL:
                xs = tl.where((cols < K)[None, :], x, 0.0)
                ss = tl.sum(xs * xs, axis=1)
            else:
                ss = tl.sum(x * x, axis=1)
            if SPLIT > 1:
                if PHASE != 2:
                    _publish(WS, rows64, rmask, part, 0, ss, 1, SPLIT)
                if PHASE == 0:
                    _arrive_and_wait(CNT, rb, SPLIT)
                if PHASE != 1:
                    ss = tl.sum(_gather(WS, rows64, rmask, 0, 1, SPLIT, SPLIT_P2), axis=1)
            if PHASE != 1:
                r = _inv_rms(ss, kf, eps_a, RMS_EPS, ACC)
                tl.store(RSTD + rows, r, mask=rmask & _first_chunk(r_idx, part, BLOCK_M))
                y = _rms_apply(x, r, w, b, off, HAS_W, HAS_B, CAST, IN, OUT, ACC, RNE)
                tl.store(
                    Y + rows64[:, None] * stride_y + cols[None, :], _cvt(y, OUT, RNE), mask=mask
                )


# ----------------------------------------------------------------------------------------------
# RMSNorm backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _rms_dx(x, dy, r, wo, sg, ss, kf, cols, K, HAS_W: tl.constexpr, RMS_EPS: tl.constexpr,
            PARTIAL: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """dx = r·g − m·x̂·coef with g = dy ⊙ (offset + γ), coef = r·S/k ("mean_square") or
    S/(k·s) where s = sqrt(ss/k) > 0, else 0 ("rms"); m masks columns ≥ K."""
    xhat = x * r[:, None]
    if HAS_W:
        g = dy * wo[None, :]
    else:
        g = dy
    if RMS_EPS:
        root = _sqrt(_div(ss, kf, ACC), ACC)
        pos = root > 0
        coef = tl.where(pos, _div(sg, kf * tl.where(pos, root, 1.0), ACC), 0.0)
    else:
        coef = r * sg / kf
    corr = xhat * coef[:, None]
    if PARTIAL:
        corr = tl.where((cols < K)[None, :], corr, 0.0)
    return r[:, None] * g - corr


@triton.jit
def _rms_bwd_row_sums(x, dy, r, wo, cols, K, HAS_W: tl.constexpr, RMS_EPS: tl.constexpr,
                      PARTIAL: tl.constexpr):  # fmt: skip
    """Per-row S = Σ g·x̂ and (for "rms") ss = Σ_{j<K} x_j² of one tile."""
    if HAS_W:
        g = dy * wo[None, :]
    else:
        g = dy
    sg = tl.sum(g * (x * r[:, None]), axis=1)
    if RMS_EPS:
        if PARTIAL:
            xs = tl.where((cols < K)[None, :], x, 0.0)
        else:
            xs = x
        ss = tl.sum(xs * xs, axis=1)
    else:
        ss = sg
    return sg, ss


@triton.jit
def _rms_norm_bwd_kernel(
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
    FLAGS: tl.constexpr,  # F_LOOP, F_PREFETCH, phase, F_RES (d residual), F_W, F_DW, F_DB,
    #                       F_RMS_EPS, F_PARTIAL, cast (llama: d weight uses x̂ rounded to IN)
    IN: tl.constexpr,  # the forward's input dtype
    ACC: tl.constexpr,
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & 1) != 0  # F_LOOP
    PREFETCH: tl.constexpr = (FLAGS & 2) != 0  # F_PREFETCH
    PHASE: tl.constexpr = (FLAGS >> 2) & 3  # PHASE_SHIFT
    RNE: tl.constexpr = (FLAGS & 8192) != 0  # F_RNE
    HAS_DRES: tl.constexpr = (FLAGS & 16) != 0  # F_RES
    HAS_W: tl.constexpr = (FLAGS & 32) != 0  # F_W
    NEED_DW: tl.constexpr = (FLAGS & 128) != 0  # F_DW
    NEED_DB: tl.constexpr = (FLAGS & 256) != 0  # F_DB
    RMS_EPS: tl.constexpr = (FLAGS & 512) != 0  # F_RMS_EPS
    PARTIAL: tl.constexpr = (FLAGS & 1024) != 0  # F_PARTIAL
    LLAMA: tl.constexpr = ((FLAGS >> 11) & 3) == 1  # CAST_SHIFT
    stride_dx = N
    if NEED_DW and NEED_DB:
        stride_part = 2 * N
    else:
        stride_part = N
    pid = tl.program_id(0)
    slot = pid // SPLIT
    part = pid % SPLIT
    n_slots = tl.num_programs(0) // SPLIT
    off = _as_acc(offset, ACC)
    kf = _as_acc(K, ACC)
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
                x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_last").to(ACC)  # fmt: skip
                dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask,
                             other=0.0, eviction_policy="evict_last").to(ACC)  # fmt: skip
                if HAS_W:
                    wo = tl.load(W + cols, mask=cmask, other=0.0).to(ACC) + off
                else:
                    wo = 0.0
                g = dy * wo[None, :] if HAS_W else dy
                acc_sg += g * (x * r[:, None])
                if RMS_EPS:
                    xs = tl.where((cols < K)[None, :], x, 0.0) if PARTIAL else x
                    acc_ss += xs * xs
            sg = tl.sum(acc_sg, axis=1)
            ss = tl.sum(acc_ss, axis=1)
            # Pass 2: dx, and the d weight / d bias contributions added into this program's
            # partial row (program-private: first visit writes, later visits read-modify-write).
            # Not this program's first row block (a vector: see _first_chunk).
            later = (tl.zeros([BLOCK_N], tl.int32) + rb) != slot
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_first").to(ACC)  # fmt: skip
                dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask,
                             other=0.0, eviction_policy="evict_first").to(ACC)  # fmt: skip
                if HAS_W:
                    wo = tl.load(W + cols, mask=cmask, other=0.0).to(ACC) + off
                else:
                    wo = 0.0
                dx = _rms_dx(x, dy, r, wo, sg, ss, kf, cols, K, HAS_W, RMS_EPS, PARTIAL, ACC)
                if HAS_DRES:
                    dx += tl.load(DRES + rows64[:, None] * stride_dres + cols[None, :], mask=mask,
                                  other=0.0, eviction_policy="evict_first").to(ACC)  # fmt: skip
                tl.store(DX + rows64[:, None] * stride_dx + cols[None, :],
                         _cvt(dx, DX.dtype.element_ty, RNE), mask=mask)  # fmt: skip
                if NEED_DW:
                    xhat = x * r[:, None]
                    if LLAMA:
                        xhat = _cvt(xhat, IN, RNE).to(ACC)
                    prev = tl.load(part_row + cols, mask=cmask & later, other=0.0)
                    tl.store(part_row + cols, prev + tl.sum(dy * xhat, axis=0), mask=cmask)
                if NEED_DB:
                    prev = tl.load(db_row + cols, mask=cmask & later, other=0.0)
                    tl.store(db_row + cols, prev + tl.sum(dy, axis=0), mask=cmask)
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        if HAS_W:
            wo = tl.load(W + cols, mask=cmask, other=0.0).to(ACC) + off
        else:
            wo = 0.0
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        # Prefetch the next row block (see the forward): x, dy, d residual and r.
        if PREFETCH:
            rows = slot * BLOCK_M + r_idx
            x_nx = _tile(X, rows, stride_x, cols, M, cmask)
            dy_nx = _tile(DY, rows, stride_dy, cols, M, cmask)
            if HAS_DRES:
                dres_nx = _tile(DRES, rows, stride_dres, cols, M, cmask)
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
                x_nx = _tile(X, rows_nx, stride_x, cols, M, cmask)
                dy_nx = _tile(DY, rows_nx, stride_dy, cols, M, cmask)
                if HAS_DRES:
                    dres_nx = _tile(DRES, rows_nx, stride_dres, cols, M, cmask)
                r_nx = tl.load(RSTD + rows_nx, mask=rows_nx < M, other=0.0)
            else:
                x_raw = _tile(X, rows, stride_x, cols, M, cmask)
                dy_raw = _tile(DY, rows, stride_dy, cols, M, cmask)
                if HAS_DRES:
                    dres = _tile(DRES, rows, stride_dres, cols, M, cmask)
                r_raw = tl.load(RSTD + rows, mask=rmask, other=0.0)
            x = x_raw.to(ACC)
            dy = dy_raw.to(ACC)
            r = r_raw.to(ACC)
            sg, ss = _rms_bwd_row_sums(x, dy, r, wo, cols, K, HAS_W, RMS_EPS, PARTIAL)
            if SPLIT > 1:
                if PHASE != 2:
                    _publish(WS, rows64, rmask, part, 0, sg, 2, SPLIT)
                    if RMS_EPS:
                        _publish(WS, rows64, rmask, part, 1, ss, 2, SPLIT)
                if PHASE == 0:
                    _arrive_and_wait(CNT, rb, SPLIT)
                if PHASE != 1:
                    sg = tl.sum(_gather(WS, rows64, rmask, 0, 2, SPLIT, SPLIT_P2), axis=1)
                    if RMS_EPS:
                        ss = tl.sum(_gather(WS, rows64, rmask, 1, 2, SPLIT, SPLIT_P2), axis=1)
            if PHASE != 1:
                dx = _rms_dx(x, dy, r, wo, sg, ss, kf, cols, K, HAS_W, RMS_EPS, PARTIAL, ACC)
                if HAS_DRES:
                    dx += dres.to(ACC)
                tl.store(DX + rows64[:, None] * stride_dx + cols[None, :],
                         _cvt(dx, DX.dtype.element_ty, RNE), mask=mask)  # fmt: skip
                if NEED_DW:
                    xhat = x * r[:, None]
                    if LLAMA:
                        xhat = _cvt(xhat, IN, RNE).to(ACC)
                    dw_acc += dy * xhat
                if NEED_DB:
                    db_acc += dy
        if PHASE != 1:
            if NEED_DW:
                tl.store(part_row + cols, tl.sum(dw_acc, axis=0), mask=cmask)
            if NEED_DB:
                tl.store(db_row + cols, tl.sum(db_acc, axis=0), mask=cmask)


# ----------------------------------------------------------------------------------------------
# LayerNorm forward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _layer_norm_fwd_kernel(
    X,  # (M, N)
    Y,  # (M, N), x's dtype
    W,  # (N,) (HAS_W) else unused
    B,  # (N,) (HAS_B) else unused
    MEAN,  # (M,) ACC
    RSTD,  # (M,) ACC
    WS,  # (M, 2, SPLIT) ACC (SPLIT > 1) else unused
    CNT,  # (cdiv(M, BLOCK_M),) int32 zeros (SPLIT > 1) else unused
    stride_x,  # row stride of x, in elements (Y is contiguous)
    M, N,
    eps: tl.float64,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
    FLAGS: tl.constexpr,  # F_LOOP, F_PREFETCH, phase, F_W, F_B
    ACC: tl.constexpr,
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & 1) != 0  # F_LOOP
    PREFETCH: tl.constexpr = (FLAGS & 2) != 0  # F_PREFETCH
    PHASE: tl.constexpr = (FLAGS >> 2) & 3  # PHASE_SHIFT
    RNE: tl.constexpr = (FLAGS & 8192) != 0  # F_RNE
    HAS_W: tl.constexpr = (FLAGS & 32) != 0  # F_W
    HAS_B: tl.constexpr = (FLAGS & 64) != 0  # F_B
    stride_y = N
    pid = tl.program_id(0)
    slot = pid // SPLIT
    part = pid % SPLIT
    n_slots = tl.num_programs(0) // SPLIT
    eps_a = _as_acc(eps, ACC)
    nf = _as_acc(N, ACC)
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
            mean = tl.zeros([BLOCK_M], ACC)
            m2 = tl.zeros([BLOCK_M], ACC)
            na = tl.zeros([BLOCK_M], ACC)  # columns merged so far
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_last").to(ACC)  # fmt: skip
                nb = tl.minimum(N - c0, BLOCK_N).to(ACC)
                bmean = _div(tl.sum(x, axis=1), nb, ACC)
                xc = tl.where(cmask[None, :], x - bmean[:, None], 0.0)
                bm2 = tl.sum(xc * xc, axis=1)
                delta = bmean - mean
                tot = na + nb
                mean = mean + delta * _div(nb, tot, ACC)
                m2 = m2 + bm2 + delta * delta * _div(na * nb, tot, ACC)
                na = tot
            r = _div(tl.full([BLOCK_M], 1.0, ACC), _sqrt(_div(m2, nf, ACC) + eps_a, ACC), ACC)
            tl.store(MEAN + rows, mean, mask=rmask)
            tl.store(RSTD + rows, r, mask=rmask)
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_first").to(ACC)  # fmt: skip
                y = (x - mean[:, None]) * r[:, None]
                if HAS_W:
                    y = y * tl.load(W + cols, mask=cmask, other=0.0).to(ACC)[None, :]
                if HAS_B:
                    y = y + tl.load(B + cols, mask=cmask, other=0.0).to(ACC)[None, :]
                tl.store(Y + rows64[:, None] * stride_y + cols[None, :],
                         _cvt(y, Y.dtype.element_ty, RNE), mask=mask)  # fmt: skip
    else:
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        if HAS_W:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
        if HAS_B:
            b = tl.load(B + cols, mask=cmask, other=0.0).to(ACC)
        # Columns this program holds (its chunk of the row).
        nb = tl.minimum(N - part * BLOCK_N, BLOCK_N).to(ACC)
        if PREFETCH:  # see the RMSNorm forward
            x_nx = _tile(X, slot * BLOCK_M + r_idx, stride_x, cols, M, cmask)
        for rb in tl.range(slot, num_rb, n_slots):
            rows = rb * BLOCK_M + r_idx
            rmask = rows < M
            rows64 = rows.to(tl.int64)
            mask = rmask[:, None] & cmask[None, :]
            if PREFETCH:
                x_raw = x_nx
                x_nx = _tile(X, rows + n_slots * BLOCK_M, stride_x, cols, M, cmask)
            else:
                x_raw = _tile(X, rows, stride_x, cols, M, cmask)
            x = x_raw.to(ACC)
            # Two-pass in registers: exact centring before squaring.
            mean = _div(tl.sum(x, axis=1), nb, ACC)
            xc = tl.where(cmask[None, :], x - mean[:, None], 0.0)
            m2 = tl.sum(xc * xc, axis=1)
            if SPLIT > 1:
                # Chunk sums and M2s, merged in a fixed order: μ = Σ s_p / N,
                # M2 = Σ m2_p + Σ c_p (s_p / c_p − μ)².
                if PHASE != 2:
                    _publish(WS, rows64, rmask, part, 0, mean * nb, 2, SPLIT)
                    _publish(WS, rows64, rmask, part, 1, m2, 2, SPLIT)
                if PHASE == 0:
                    _arrive_and_wait(CNT, rb, SPLIT)
                if PHASE != 1:
                    s_p = _gather(WS, rows64, rmask, 0, 2, SPLIT, SPLIT_P2)
                    m2_p = _gather(WS, rows64, rmask, 1, 2, SPLIT, SPLIT_P2)
                    p_idx = tl.arange(0, SPLIT_P2)
                    c_p = tl.minimum(tl.maximum(N - p_idx * BLOCK_N, 0), BLOCK_N).to(ACC)
                    has = c_p > 0
                    mean = _div(tl.sum(s_p, axis=1), nf, ACC)
                    mu_p = _div(s_p, tl.where(has, c_p, 1.0)[None, :], ACC)
                    d = tl.where(has[None, :], mu_p - mean[:, None], 0.0)
                    m2 = tl.sum(m2_p, axis=1) + tl.sum(c_p[None, :] * d * d, axis=1)
                    xc = tl.where(cmask[None, :], x - mean[:, None], 0.0)
            if PHASE != 1:
                r = _div(tl.full([BLOCK_M], 1.0, ACC), _sqrt(_div(m2, nf, ACC) + eps_a, ACC), ACC)
                tl.store(MEAN + rows, mean, mask=rmask & _first_chunk(r_idx, part, BLOCK_M))
                tl.store(RSTD + rows, r, mask=rmask & _first_chunk(r_idx, part, BLOCK_M))
                y = xc * r[:, None]
                if HAS_W:
                    y = y * w[None, :]
                if HAS_B:
                    y = y + b[None, :]
                tl.store(Y + rows64[:, None] * stride_y + cols[None, :],
                         _cvt(y, Y.dtype.element_ty, RNE), mask=mask)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# LayerNorm backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _layer_norm_bwd_kernel(
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
    FLAGS: tl.constexpr,  # F_LOOP, F_PREFETCH, phase, F_W, F_DW, F_DB
    ACC: tl.constexpr,
):  # fmt: skip
    LOOP: tl.constexpr = (FLAGS & 1) != 0  # F_LOOP
    PREFETCH: tl.constexpr = (FLAGS & 2) != 0  # F_PREFETCH
    PHASE: tl.constexpr = (FLAGS >> 2) & 3  # PHASE_SHIFT
    RNE: tl.constexpr = (FLAGS & 8192) != 0  # F_RNE
    HAS_W: tl.constexpr = (FLAGS & 32) != 0  # F_W
    NEED_DW: tl.constexpr = (FLAGS & 128) != 0  # F_DW
    NEED_DB: tl.constexpr = (FLAGS & 256) != 0  # F_DB
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
    nf = _as_acc(N, ACC)
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
                x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_last").to(ACC)  # fmt: skip
                dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask,
                             other=0.0, eviction_policy="evict_last").to(ACC)  # fmt: skip
                xhat = tl.where(mask, (x - mu[:, None]) * r[:, None], 0.0)
                if HAS_W:
                    g = dy * tl.load(W + cols, mask=cmask, other=0.0).to(ACC)[None, :]
                else:
                    g = dy
                acc_g += g
                acc_gx += g * xhat
            mg = _div(tl.sum(acc_g, axis=1), nf, ACC)
            mgx = _div(tl.sum(acc_gx, axis=1), nf, ACC)
            # Not this program's first row block (a vector: see _first_chunk).
            later = (tl.zeros([BLOCK_N], tl.int32) + rb) != slot
            for c0 in tl.range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                cmask = cols < N
                mask = rmask[:, None] & cmask[None, :]
                x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_first").to(ACC)  # fmt: skip
                dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask,
                             other=0.0, eviction_policy="evict_first").to(ACC)  # fmt: skip
                xhat = tl.where(mask, (x - mu[:, None]) * r[:, None], 0.0)
                if HAS_W:
                    g = dy * tl.load(W + cols, mask=cmask, other=0.0).to(ACC)[None, :]
                else:
                    g = dy
                dx = r[:, None] * (g - mg[:, None] - xhat * mgx[:, None])
                tl.store(DX + rows64[:, None] * stride_dx + cols[None, :],
                         _cvt(dx, DX.dtype.element_ty, RNE), mask=mask)  # fmt: skip
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
            w = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        # Prefetch the next row block (see the RMSNorm forward).
        if PREFETCH:
            rows = slot * BLOCK_M + r_idx
            x_nx = _tile(X, rows, stride_x, cols, M, cmask)
            dy_nx = _tile(DY, rows, stride_dy, cols, M, cmask)
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
                x_nx = _tile(X, rows_nx, stride_x, cols, M, cmask)
                dy_nx = _tile(DY, rows_nx, stride_dy, cols, M, cmask)
                mu_nx = tl.load(MEAN + rows_nx, mask=rows_nx < M, other=0.0)
                r_nx = tl.load(RSTD + rows_nx, mask=rows_nx < M, other=0.0)
            else:
                x_raw = _tile(X, rows, stride_x, cols, M, cmask)
                dy_raw = _tile(DY, rows, stride_dy, cols, M, cmask)
                mu_raw = tl.load(MEAN + rows, mask=rmask, other=0.0)
                r_raw = tl.load(RSTD + rows, mask=rmask, other=0.0)
            x = x_raw.to(ACC)
            dy = dy_raw.to(ACC)
            mu = mu_raw.to(ACC)
            r = r_raw.to(ACC)
            xhat = tl.where(mask, (x - mu[:, None]) * r[:, None], 0.0)
            if HAS_W:
                g = dy * w[None, :]
            else:
                g = dy
            sg = tl.sum(g, axis=1)
            sgx = tl.sum(g * xhat, axis=1)
            if SPLIT > 1:
                if PHASE != 2:
                    _publish(WS, rows64, rmask, part, 0, sg, 2, SPLIT)
                    _publish(WS, rows64, rmask, part, 1, sgx, 2, SPLIT)
                if PHASE == 0:
                    _arrive_and_wait(CNT, rb, SPLIT)
                if PHASE != 1:
                    sg = tl.sum(_gather(WS, rows64, rmask, 0, 2, SPLIT, SPLIT_P2), axis=1)
                    sgx = tl.sum(_gather(WS, rows64, rmask, 1, 2, SPLIT, SPLIT_P2), axis=1)
            if PHASE != 1:
                mg = _div(sg, nf, ACC)
                mgx = _div(sgx, nf, ACC)
                dx = r[:, None] * (g - mg[:, None] - xhat * mgx[:, None])
                tl.store(DX + rows64[:, None] * stride_dx + cols[None, :],
                         _cvt(dx, DX.dtype.element_ty, RNE), mask=mask)  # fmt: skip
                if NEED_DW:
                    dw_acc += dy * xhat
                if NEED_DB:
                    db_acc += dy
        if PHASE != 1:
            if NEED_DW:
                tl.store(part_row + cols, tl.sum(dw_acc, axis=0), mask=cmask)
            if NEED_DB:
                tl.store(db_row + cols, tl.sum(db_acc, axis=0), mask=cmask)


# ----------------------------------------------------------------------------------------------
# d weight / d bias: the fixed-order sum of the per-program partials
# ----------------------------------------------------------------------------------------------
@triton.jit
def _sum_partials_kernel(
    PART,  # (n_rows, NEED_DW·N + NEED_DB·N) ACC
    DW,  # (N,) weight dtype (NEED_DW) else unused
    DB,  # (N,) bias dtype (NEED_DB) else unused
    n_rows, N, stride_part,
    NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    ACC: tl.constexpr,
    RNE: tl.constexpr,  # see _cvt
):  # fmt: skip
    # grid: (cdiv(N, BLOCK_N), NEED_DW + NEED_DB); axis 1 picks d weight (0) or d bias.
    # The summation order depends only on n_rows and the block sizes: bit-identical across runs.
    pid_n = tl.program_id(0)
    which = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    base = PART + which * N
    acc = tl.zeros([BLOCK_R, BLOCK_N], ACC)
    for r0 in tl.range(0, n_rows, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        m = (rows < n_rows)[:, None] & cmask[None, :]
        acc += tl.load(base + rows.to(tl.int64)[:, None] * stride_part + cols[None, :], mask=m,
                       other=0.0)  # fmt: skip
    tot = tl.sum(acc, axis=0)
    if NEED_DW:
        if NEED_DB:
            if which == 0:
                tl.store(DW + cols, _cvt(tot, DW.dtype.element_ty, RNE), mask=cmask)
            else:
                tl.store(DB + cols, _cvt(tot, DB.dtype.element_ty, RNE), mask=cmask)
        else:
            tl.store(DW + cols, _cvt(tot, DW.dtype.element_ty, RNE), mask=cmask)
    else:
        tl.store(DB + cols, _cvt(tot, DB.dtype.element_ty, RNE), mask=cmask)
