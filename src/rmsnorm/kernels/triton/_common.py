"""Pieces the RMSNorm and LayerNorm kernels share: the tile layouts' conventions, scalar and
rounding helpers, the split layout's cross-program exchange, and the fixed-order sum of the
backward's per-program d weight / d bias partials.

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

Statistics and all arithmetic are in ``ACC`` (float32, float64 for float64 inputs); row offsets are
int64 (``rows.to(tl.int64) * stride``) so tensors past 2^31 elements address correctly.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
def publish(WS, rows64, rmask, part, j: tl.constexpr, v, NV: tl.constexpr,
             SPLIT: tl.constexpr):  # fmt: skip
    """Store this program's per-row partial v (BLOCK_M,) as value j of chunk `part`.
    WS is (M, NV, SPLIT) in ACC."""
    tl.store(WS + rows64 * (NV * SPLIT) + j * SPLIT + part, v, mask=rmask)


@triton.jit
def arrive_and_wait(CNT, rb, SPLIT: tl.constexpr):
    """Count this program in for row block rb, then wait until all SPLIT chunks have published.
    The barrier orders every thread's workspace stores before the release; the acquire orders the
    workspace loads after the last arrival. All SPLIT programs are co-resident (grid ≤ SMs)."""
    tl.debug_barrier()
    seen = tl.atomic_add(CNT + rb, 1, sem="acq_rel") + 1
    while seen < SPLIT:
        seen = tl.atomic_add(CNT + rb, 0, sem="acquire")


@triton.jit
def gather(WS, rows64, rmask, j: tl.constexpr, NV: tl.constexpr, SPLIT: tl.constexpr,
            SPLIT_P2: tl.constexpr):  # fmt: skip
    """The SPLIT partials of value j for each row, as a (BLOCK_M, SPLIT_P2) tile (0 past SPLIT);
    loaded from L2 (.cg) so no stale L1 line is ever read."""
    p = tl.arange(0, SPLIT_P2)
    m = rmask[:, None] & (p < SPLIT)[None, :]
    return tl.load(WS + rows64[:, None] * (NV * SPLIT) + j * SPLIT + p[None, :], mask=m,
                   other=0.0, cache_modifier=".cg")  # fmt: skip


# ----------------------------------------------------------------------------------------------
# d weight / d bias: the fixed-order sum of the per-program partials
# ----------------------------------------------------------------------------------------------
@triton.jit
def sum_partials_kernel(
    PART,  # (n_rows, NEED_DW·N + NEED_DB·N) ACC
    DW,  # (N,) weight dtype (NEED_DW) else unused
    DB,  # (N,) bias dtype (NEED_DB) else unused
    n_rows, N, stride_part,
    NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    ACC: tl.constexpr,
    RNE: tl.constexpr,  # see cvt
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
                tl.store(DW + cols, cvt(tot, DW.dtype.element_ty, RNE), mask=cmask)
            else:
                tl.store(DB + cols, cvt(tot, DB.dtype.element_ty, RNE), mask=cmask)
        else:
            tl.store(DW + cols, cvt(tot, DW.dtype.element_ty, RNE), mask=cmask)
    else:
        tl.store(DB + cols, cvt(tot, DB.dtype.element_ty, RNE), mask=cmask)
