"""Pieces the RMSNorm, gated RMSNorm and LayerNorm kernels share: the tile layouts' conventions,
scalar and rounding helpers, tile loads and stores, the split layout's cross-program exchange, and
the backward's per-program d weight / d bias partials with their fixed-order sum.

Every kernel works on (BLOCK_M, BLOCK_N) tiles of rows and walks row blocks with a grid stride,
so one kernel body serves three layouts (chosen by the launch config, see ``_config.py``):

- single tile (``LOOP=False, SPLIT=1``): a whole row block lives in registers; BLOCK_M > 1 packs
  several short rows (QK-norm) into one tile.
- looped (``LOOP=True``): one program walks a row in BLOCK_N column blocks, a first pass for the
  statistics and a second pass (re-reading from L2) for the output.
- split (``SPLIT=P > 1``): P cooperating programs each hold one BLOCK_N column chunk of the same
  rows in registers; they exchange per-row partial sums through a small workspace, synchronised by
  a per-row-block arrival counter (all programs are co-resident: see ``_config.py``). Partials are
  summed in a fixed order, so results are deterministic. ``PHASE`` 1 / 2 run the publish and the
  finish halves as two launches: the Triton interpreter runs programs one after another, where the
  spin-wait of ``PHASE`` 0 would never end.

Helpers that need several of a launch's options take its ``FLAGS`` constexpr (bits in
``_flags.py``) and decode them as the kernels do. Helper parameters in capitals are compile-time
constants: Triton specialises a helper on the constants it is called with, annotated or not.
Statistics and all arithmetic are in ``ACC`` (float32, float64 for float64 inputs); row offsets
are int64 (``rows.to(tl.int64) * stride``) so tensors past 2^31 elements address correctly.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import _flags as flag


@triton.jit
def as_acc(v, ACC: tl.constexpr):
    """A scalar argument as a 1-element ACC tensor: exact for the fp64 float arguments, and safe for
    int arguments that Triton specialises to constants (== 1)."""
    return (tl.zeros([1], ACC) + v).to(ACC)


@triton.jit
def div(a, b, ACC: tl.constexpr):
    """Correctly rounded division (IEEE in float64 already; div_rn is float32-only)."""
    if ACC == tl.float64:
        return a / b
    else:
        return tl.div_rn(a, b)


@triton.jit
def sqrt(a, ACC: tl.constexpr):
    if ACC == tl.float64:
        return tl.sqrt(a)
    else:
        return tl.sqrt_rn(a)


@triton.jit
def cvt(v, DT: tl.constexpr, RNE: tl.constexpr):
    """v.to(DT), rounding to nearest even by hand for bf16 when RNE (see _flags.INTERPRETED)."""
    if (RNE and DT == tl.bfloat16) and v.dtype != tl.bfloat16:  # Triton < 3.4: no A and B and C
        bits = v.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(DT)


@triton.jit
def up(v, DT: tl.constexpr, RNE: tl.constexpr):
    """v.to(DT), a widening conversion; under the interpreter (RNE) a bfloat16 v is widened through
    its bits, because the interpreter's own conversion gets subnormals wrong (triton 3.9: bf16
    1.01e-39 became 4.4e-39, 9.2e-41 became 0), where a GPU's is exact."""
    if RNE and v.dtype == tl.bfloat16:
        bits = v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
        return bits.to(tl.float32, bitcast=True).to(DT)
    else:
        return v.to(DT)


@triton.jit
def rnd(v, DT: tl.constexpr, RNE: tl.constexpr):
    """Round v to DT's precision and back (a no-op when DT is v's dtype)."""
    return up(cvt(v, DT, RNE), v.dtype, RNE)


@triton.jit
def first_chunk(r_idx, part, BLOCK_M: tl.constexpr):
    """``part == 0`` as a (BLOCK_M,) mask: only chunk 0 of a split row writes the row statistics.
    (A vector, because the interpreter mis-types ``vector_mask & scalar_mask``.)"""
    return (r_idx + part * BLOCK_M) < BLOCK_M


@triton.jit
def grid_slot(M, BLOCK_M: tl.constexpr, SPLIT: tl.constexpr):
    """(slot, part, n_slots, num_rb, r_idx): this program's row-block slot, its column chunk of a
    split row, the number of slots (SPLIT programs a slot), of row blocks, and the row indices
    within a block."""
    pid = tl.program_id(0)
    n_slots = tl.num_programs(0) // SPLIT
    return pid // SPLIT, pid % SPLIT, n_slots, tl.cdiv(M, BLOCK_M), tl.arange(0, BLOCK_M)


@triton.jit
def row_block(rb, r_idx, BLOCK_M: tl.constexpr, M):
    """(rows, rmask, rows64) of row block rb: int32 rows, their mask and their int64 form."""
    rows = rb * BLOCK_M + r_idx
    return rows, rows < M, rows.to(tl.int64)


@triton.jit
def col_chunk(c0, BLOCK_N: tl.constexpr, N, rmask):
    """(cols, cmask, mask) of the BLOCK_N columns from c0: the columns, their mask, the tile's."""
    cols = c0 + tl.arange(0, BLOCK_N)
    cmask = cols < N
    return cols, cmask, rmask[:, None] & cmask[None, :]


@triton.jit
def rowptr(P, rows64, stride):
    """(BLOCK_M, 1) pointers to the rows rows64 of P (row stride `stride`, offsets in int64)."""
    return P + rows64[:, None] * stride


@triton.jit
def load_acc(p, cols, mask, EVICT: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr):
    """The (BLOCK_M, BLOCK_N) tile at row pointers p and columns cols, in ACC (0 outside mask)."""
    return up(tl.load(p + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT), ACC, RNE)


@triton.jit
def store_cvt(p, cols, mask, v, RNE: tl.constexpr):
    """Store the ACC tile v at row pointers p and columns cols, rounded to p's dtype."""
    tl.store(p + cols[None, :], cvt(v, p.dtype.element_ty, RNE), mask=mask)


@triton.jit
def opt_param(P, cols, cmask, HAS: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr):
    """A weight or bias chunk (BLOCK_N,) in ACC (0 outside cmask), or 0.0 when absent."""
    if HAS:
        return up(tl.load(P + cols, mask=cmask, other=0.0), ACC, RNE)
    else:
        return 0.0


@triton.jit
def param(P, offs, mask, HAS: tl.constexpr):
    """The raw weight or bias tile at offs (any shape), or 0.0 when absent."""
    if HAS:
        return tl.load(P + offs, mask=mask, other=0.0)
    else:
        return 0.0


@triton.jit
def weighted(dy, w, HAS_W: tl.constexpr):
    """g = dy ⊙ w for a (BLOCK_N,) ACC chunk w of the weight (offset + γ in RMSNorm), or dy
    without a weight."""
    if HAS_W:
        return dy * w[None, :]
    else:
        return dy


@triton.jit
def grad_tile(xp, dyp, w, cols, mask, EVICT, HAS_W, ACC, RNE):
    """(x, dy, g = dy ⊙ w) in ACC of a backward's tile at the rows xp, dyp and the columns cols
    (w: the weight chunk, see weighted)."""
    x = load_acc(xp, cols, mask, EVICT, ACC, RNE)
    dy = load_acc(dyp, cols, mask, EVICT, ACC, RNE)
    return x, dy, weighted(dy, w, HAS_W)


@triton.jit
def bwd_row_block(X, DY, RSTD, stride_x, stride_dy, rb, r_idx, BLOCK_M, M, ACC):
    """A backward's row block rb: (rows, rmask, rows64) (see row_block), the row pointers of x and
    dy, and r in ACC."""
    rows, rmask, rows64 = row_block(rb, r_idx, BLOCK_M, M)
    r = tl.load(RSTD + rows, mask=rmask, other=0.0).to(ACC)
    return rows, rmask, rows64, rowptr(X, rows64, stride_x), rowptr(DY, rows64, stride_dy), r


@triton.jit
def head(x, cols, K, PARTIAL: tl.constexpr):
    """The tile x with its columns ≥ K zeroed when PARTIAL (the RMS is over the first K)."""
    if PARTIAL:
        return tl.where((cols < K)[None, :], x, 0.0)
    else:
        return x


@triton.jit
def tile(P, rows, stride, cols, M, cmask):
    """The raw (BLOCK_M, BLOCK_N) tile of rows `rows` (int32; offsets formed in int64), zeros
    outside [0, M) × cmask. Kept in the tensor's own dtype: a prefetched bf16 tile costs half the
    registers of its fp32 copy."""
    mask = (rows < M)[:, None] & cmask[None, :]
    return tl.load(P + rows.to(tl.int64)[:, None] * stride + cols[None, :], mask=mask, other=0.0)


# ----------------------------------------------------------------------------------------------
# Rows whose statistics overflow ACC (Σx² past 3.4e38 in float32: |x| ≳ 1e19). As in the spec
# (reference.py), such a row's statistics are recomputed from s·x, s = 2^-80 (2^-560 in float64),
# and the per-row results carry sc = s (1 for every other row). The recomputation sits behind a
# branch on "does this tile hold such a row", so ordinary rows pay a few per-row operations and no
# per-element work or memory traffic.
# ----------------------------------------------------------------------------------------------
@triton.jit
def over_scale(over, ACC: tl.constexpr):
    """Per row: s where `over`, else 1, in ACC (a power of two: scaling by it is exact)."""
    if ACC == tl.float64:
        return tl.where(over, 2.0**-560, 1.0).to(ACC)
    else:
        return tl.where(over, 2.0**-80, 1.0).to(ACC)


@triton.jit
def overflowed(v, ACC: tl.constexpr):
    """Per row: v is inf or NaN (NaN too: an overflowed sum of both signs is inf − inf)."""
    if ACC == tl.float64:
        return (v != v) | (tl.abs(v) > 1.7976931348623157e308)
    else:
        return (v != v) | (tl.abs(v) > 3.4028234663852886e38)


@triton.jit
def any_row(v):
    """A scalar: some entry of the (BLOCK_M,) boolean v is set (the condition of a rare branch)."""
    return tl.max(v.to(tl.int32), axis=0) > 0


@triton.jit
def sum_squares(x, ACC: tl.constexpr):
    """(ss, sc) per row of the ACC tile x (BLOCK_M, BLOCK_N): ss = Σx² and sc = 1, or, where Σx²
    overflows, ss = Σ(s·x)² and sc = s. A row holding inf or NaN keeps ss = inf or NaN (torch's
    result follows from it)."""
    ss = tl.sum(x * x, axis=1)
    over = overflowed(ss, ACC)
    sc = over_scale(over, ACC)
    if any_row(over):
        xs = x * sc[:, None]
        ss = tl.where(over, tl.sum(xs * xs, axis=1), ss)
    return ss, sc


@triton.jit
def encode_partial(ss, sc):
    """A split row's partial sum of squares for the workspace: ss, or −ss where it is rescaled
    (a rescaled partial is ≥ 2^-32, never 0, so the sign is the flag)."""
    return tl.where(sc < 1.0, -ss, ss)


@triton.jit
def combine_partials(v, ACC: tl.constexpr):
    """(ss, sc) per row from the (BLOCK_M, SPLIT_P2) gathered partials of :func:`encode_partial`
    (0 past SPLIT): the plain total where it is finite and no partial was rescaled, else the
    total in the rescaled unit. Per row, so this costs nothing next to the row's elements."""
    neg = v < 0
    plain = tl.sum(tl.where(neg, 0.0, v), axis=1)
    over = (tl.max(neg.to(tl.int32), axis=1) > 0) | overflowed(plain, ACC)
    sc = over_scale(over, ACC)
    # × s twice: s² itself (2^-160) is below float32's range.
    scaled = tl.sum(tl.where(neg, -v, v * sc[:, None] * sc[:, None]), axis=1)
    return tl.where(over, scaled, plain), sc


# ----------------------------------------------------------------------------------------------
# Cross-program exchange for the split layout
# ----------------------------------------------------------------------------------------------
@triton.jit
def publish(ws, rmask, part, j: tl.constexpr, v, SPLIT: tl.constexpr):
    """Store this program's per-row partial v (BLOCK_M,) as value j of chunk `part`; ws points at
    the rows of the (M, NV, SPLIT) ACC workspace."""
    tl.store(ws + j * SPLIT + part, v, mask=rmask)


@triton.jit
def arrive_and_wait(cnt, SPLIT: tl.constexpr):
    """Count this program in at its row block's arrival counter cnt, then wait until all SPLIT
    chunks have published. The barrier orders every thread's workspace stores before the release;
    the acquire orders the workspace loads after the last arrival. All SPLIT programs are
    co-resident (grid ≤ SMs)."""
    tl.debug_barrier()
    seen = tl.atomic_add(cnt, 1, sem="acq_rel") + 1
    while seen < SPLIT:
        seen = tl.atomic_add(cnt, 0, sem="acquire")


@triton.jit
def gather(ws, rmask, j: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr):
    """The SPLIT partials of value j for each row, as a (BLOCK_M, SPLIT_P2) tile (0 past SPLIT);
    loaded from L2 (.cg) so no stale L1 line is ever read."""
    p = tl.arange(0, SPLIT_P2)
    m = rmask[:, None] & (p < SPLIT)[None, :]
    return tl.load(ws[:, None] + j * SPLIT + p[None, :], mask=m, other=0.0, cache_modifier=".cg")


@triton.jit
def exchange(ws, cnt, rmask, part, v0, v1, v2, USE, SPLIT, SPLIT_P2, PHASE):
    """Publish this chunk's first USE of the per-row values v0, v1, v2 (ws: the rows of the
    workspace), wait for every chunk of the row block (PHASE 0, cnt its counter), and return the
    gathered (BLOCK_M, SPLIT_P2) tiles of all chunks (PHASE != 1; v0 in place of unused ones)."""
    if PHASE != 2:
        publish(ws, rmask, part, 0, v0, SPLIT)
        if USE > 1:
            publish(ws, rmask, part, 1, v1, SPLIT)
        if USE > 2:
            publish(ws, rmask, part, 2, v2, SPLIT)
    if PHASE == 0:
        arrive_and_wait(cnt, SPLIT)
    g0 = v0
    g1 = v0
    g2 = v0
    if PHASE != 1:
        g0 = gather(ws, rmask, 0, SPLIT, SPLIT_P2)
        if USE > 1:
            g1 = gather(ws, rmask, 1, SPLIT, SPLIT_P2)
        if USE > 2:
            g2 = gather(ws, rmask, 2, SPLIT, SPLIT_P2)
    return g0, g1, g2


# ----------------------------------------------------------------------------------------------
# d weight / d bias: per-program partial rows, then their fixed-order sum
# ----------------------------------------------------------------------------------------------
@triton.jit
def partial_rows(PART, slot, N, FLAGS: tl.constexpr):
    """Pointers to program `slot`'s partial d weight and d bias rows (FLAGS: DW, DB): PART is
    (slots, DW·N + DB·N) in ACC, d weight first."""
    if (FLAGS & flag.DW) != 0 and (FLAGS & flag.DB) != 0:
        stride_part = 2 * N
    else:
        stride_part = N
    dw_row = PART + slot.to(tl.int64) * stride_part
    if (FLAGS & flag.DW) != 0:
        return dw_row, dw_row + N
    else:
        return dw_row, dw_row


@triton.jit
def store_partials(dw_row, db_row, offs, mask, dw, db, FLAGS: tl.constexpr):
    """Write this program's d weight / d bias partials dw, db (FLAGS: DW, DB) at offs."""
    if (FLAGS & flag.DW) != 0:
        tl.store(dw_row + offs, dw, mask=mask)
    if (FLAGS & flag.DB) != 0:
        tl.store(db_row + offs, db, mask=mask)


@triton.jit
def add_partials(dw_row, db_row, offs, mask, later, dw, db, FLAGS: tl.constexpr):
    """Add dw, db into this program's partial rows (looped layout): the program's first row block
    writes them, `later` ones (a vector, see first_chunk) read, add and write (program-private)."""
    if (FLAGS & flag.DW) != 0:
        dw += tl.load(dw_row + offs, mask=mask & later, other=0.0)
    if (FLAGS & flag.DB) != 0:
        db += tl.load(db_row + offs, mask=mask & later, other=0.0)
    store_partials(dw_row, db_row, offs, mask, dw, db, FLAGS)


@triton.jit
def later_block(rb, slot, BLOCK_N: tl.constexpr):
    """(BLOCK_N,) mask: row block rb is not this program's first (a vector: see first_chunk)."""
    return (tl.zeros([BLOCK_N], tl.int32) + rb) != slot


@triton.jit
def sum_partials_kernel(
    PART,  # (n_rows, NEED_DW·N + NEED_DB·N) ACC
    DW,  # (N,) weight dtype (NEED_DW) else unused
    DB,  # (N,) bias dtype (NEED_DB) else unused
    n_rows,
    N,
    stride_part,
    NEED_DW: tl.constexpr,
    NEED_DB: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ACC: tl.constexpr,
    RNE: tl.constexpr,  # see cvt
):
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
        acc += tl.load(
            rowptr(base, rows.to(tl.int64), stride_part) + cols[None, :], mask=m, other=0.0
        )
    tot = tl.sum(acc, axis=0)
    if NEED_DW:
        if NEED_DB:
            if which == 0:
                tl.store(DW + cols, cvt(tot, DW.dtype.element_ty, RNE), mask=cmask)
            else:
                tl.store(DB + cols, cvt(tot, DB.dtype.element_ty, RNE), mask=cmask)
        else:
            tl.store(DW + cols, cvt(tot, DW.dtype.element_ty, RNE), mask=cmask)
    else:
        tl.store(DB + cols, cvt(tot, DB.dtype.element_ty, RNE), mask=cmask)
