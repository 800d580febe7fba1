"""The option bits of the Triton kernels' FLAGS constexpr, shared by the launchers (which encode
them with :func:`flags`) and the kernels (which decode them by these names)."""

from __future__ import annotations

import os
import zlib

# Under the interpreter (chosen before triton is imported, so fixed for the process) fp32 -> bf16
# casts truncate; GPUs round to nearest even. Kernels then round bf16 by hand (RNE), so that
# interpreted results, which feed later arithmetic (h of add_rms_norm, the llama/none roundings),
# are the ones a GPU computes. On a GPU every cast is the native cvt.rn.
INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Casting modes, as integers for the kernels (docs/spec.md, "Casting modes").
CAST_GEMMA = 0
CAST_LLAMA = 1
CAST_NONE = 2

# The options of a launch travel as bits of one FLAGS constexpr: Triton binds every launch argument
# in Python, each constexpr costing about as much as a tensor, and decoding-size calls are
# launch-bound. Kernels decode them as ``(FLAGS & flag.RES) != 0``: attributes of this module are
# plain ints that Triton folds at compile time and, unlike global constexprs (~0.5 µs each per
# launch, measured for 12), does not re-validate on every launch.
LOOP = 1 << 0  # N > BLOCK_N: walk the row in column blocks
PREFETCH = 1 << 1  # persistent grid: load row block i + 1 while computing i
PHASE_SHIFT = 2  # 2-bit field: 0 full, 1 publish only, 2 finish only (split rows, interpreter)
RES = 1 << 4  # forward: a residual to add; backward: a d residual to add
W = 1 << 5  # a weight γ
B = 1 << 6  # a bias β (forward)
DW = 1 << 7  # backward: write d weight partials
DB = 1 << 8  # backward: write d bias partials
RMS_EPS = 1 << 9  # eps_mode "rms": r = 1/(sqrt(ms) + eps)
PARTIAL = 1 << 10  # K < N
CAST_SHIFT = 11  # 2-bit field: CAST_GEMMA / CAST_LLAMA / CAST_NONE
RNE = 1 << 13  # round fp32 -> bf16 to nearest even by hand (INTERPRETED)
FIELD_MASK = 3  # width of the PHASE and CAST fields

BITS = {
    "LOOP": LOOP,
    "PREFETCH": PREFETCH,
    "PHASE": FIELD_MASK << PHASE_SHIFT,
    "RES": RES,
    "W": W,
    "B": B,
    "DW": DW,
    "DB": DB,
    "RMS_EPS": RMS_EPS,
    "PARTIAL": PARTIAL,
    "CAST": FIELD_MASK << CAST_SHIFT,
    "RNE": RNE,
}
# Bits 16 and up carry a fingerprint of the table above. FLAGS is part of the key of Triton's
# on-disk kernel cache but these values are not part of the kernels' source hash: renumbering a bit
# changes the fingerprint, so no kernel compiled under the old numbering is ever reused.
FINGERPRINT_SHIFT = 16
FINGERPRINT = zlib.crc32(repr(sorted(BITS.items())).encode()) & 0xFFFF


def flags(
    *,
    loop=False,
    prefetch=False,
    phase=0,
    res=False,
    w=False,
    b=False,
    dw=False,
    db=False,
    rms_eps=False,
    partial=False,
    cast=CAST_GEMMA,
) -> int:
    """The FLAGS value of a launch (host side); RNE is set whenever the interpreter runs."""
    return (
        int(loop) * LOOP
        | int(prefetch) * PREFETCH
        | phase << PHASE_SHIFT
        | int(res) * RES
        | int(w) * W
        | int(b) * B
        | int(dw) * DW
        | int(db) * DB
        | int(rms_eps) * RMS_EPS
        | int(partial) * PARTIAL
        | cast << CAST_SHIFT
        | int(INTERPRETED) * RNE
        | FINGERPRINT << FINGERPRINT_SHIFT
    )
