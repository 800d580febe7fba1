"""Launch configurations: one heuristic config per shape class, cached; no autotuning on the hot
path.

A config says how a kernel tiles the (M, N) problem (see the layouts in ``_common.py``): the tile
(BLOCK_M rows × BLOCK_N columns), whether a row is walked in column blocks (``loop``) or split over
cooperating programs (``split``), the warps per program, and the grid cap for persistent kernels.
Tests force the looped and split layouts at small N with :func:`override`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

KINDS = ("fwd", "bwd", "ln_fwd", "ln_bwd", "gated_fwd", "gated_bwd")


@dataclass(frozen=True)
class Config:
    block_m: int  # rows per tile (power of two)
    block_n: int  # columns per tile (power of two)
    num_warps: int
    loop: bool = False  # N > block_n: one program walks the row in block_n column blocks
    split: int = 1  # N > block_n: `split` programs hold one column chunk each (ceil(N / block_n))
    programs: int = 0  # grid cap in programs (persistent kernels); 0 = one per row block
    num_stages: int = 1  # software pipelining of loop loads (1 = none)

    def slots(self, m: int) -> int:
        """Programs per column chunk: one per row block, or at most programs // split."""
        blocks = -(-m // self.block_m)
        if self.programs <= 0:
            return blocks
        return max(1, min(blocks, self.programs // self.split))


def _pow2(n: int) -> int:
    """The least power of two ≥ n (1 for n ≤ 1): a block's size; the launchers use it too."""
    return 1 << max(0, (n - 1).bit_length())


# ----------------------------------------------------------------------------------------------
# The shape classes, in "units": columns × element size / 2, i.e. bf16 columns (an fp32 row of
# 4096 is the class of a bf16 row of 8192: registers hold fp32 copies, loads move bytes).
# Register counts quoted are ptxas's for sm_90 (benchmarks/probes/static_check.py, Triton 3.9); a
# CTA of 512 threads fits once per SM above 64 registers, twice up to 64.
# ----------------------------------------------------------------------------------------------
_FWD_CHUNK = 16384  # units per program in a split forward row (RMSNorm: 117 regs with prefetch)
_LN_FWD_CHUNK = 8192  # LayerNorm keeps x and x − μ: 16384 units already need 128 regs
_BWD_CHUNK = 8192  # backward: x, dy, their prefetch, γ and the d weight accumulator (114 regs)
_LOOP_UNITS = 8192  # column block of the looped fallback


@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_split_refused = False


def refuse_split() -> None:
    """No split layouts from now on in this process (the driver refused a cooperative launch)."""
    global _split_refused
    _split_refused = True
    gpu_config.cache_clear()


def _split_allowed() -> bool:
    # The split layout spins on a counter; it needs every program of a row resident at once. The
    # grid is at most one program per SM (each fits an SM alone) and the launch is cooperative,
    # so the driver guarantees it (see the launchers). RMSNORM_TRITON_SPLIT=0 opts out.
    return not _split_refused and os.environ.get("RMSNORM_TRITON_SPLIT", "1") != "0"


def _wide(n: int, elem: int, chunk_units: int, sms: int) -> Config:
    """Rows longer than one program holds: split over cooperating programs while they fit on the
    device (grid ≤ SMs), else loop over column blocks."""
    chunk = chunk_units * 2 // elem
    split = -(-n // chunk)
    if _split_allowed() and split <= sms:
        # Balance the chunks: the smallest power of two covering N in `split` pieces.
        block_n = _pow2(-(-n // split))
        split = -(-n // block_n)
        return Config(1, block_n, 16, split=split, programs=(sms // split) * split)
    return Config(1, _LOOP_UNITS * 2 // elem, 16, loop=True, programs=sms)


@functools.lru_cache(maxsize=512)
def gpu_config(kind: str, n: int, elem: int, sms: int) -> Config:
    """The config of kernel ``kind`` for rows of n elements of ``elem`` bytes on a GPU of ``sms``
    SMs (what :func:`choose` gives on CUDA; benchmarks and tests ask for other GPUs' too)."""
    bn = _pow2(n)
    units = bn * elem // 2
    if kind in ("fwd", "ln_fwd"):
        if units <= 4096:
            # One program per row block, several blocks resident per SM (53–80 regs). Short rows
            # are packed 4096 units to a tile (8 KiB of bf16), ~16 values per thread.
            bm = max(1, 4096 // units)
            return Config(bm, bn, 4 if bm * units <= 2048 else 8)
        if units == 8192:
            return Config(1, bn, 16)  # 55 regs: two 16 KiB rows in flight per SM
        if units == 16384 and kind == "fwd":
            # 93 regs: one CTA per SM, so persistent with prefetch (117 regs) rather than a
            # launch bubble between rows.
            return Config(1, bn, 16, programs=sms)
        return _wide(n, elem, _FWD_CHUNK if kind == "fwd" else _LN_FWD_CHUNK, sms)
    # Backward: persistent, every program sums d weight over its rows in registers; programs per
    # SM from the register count (with prefetch: 64–80 regs at 8 values per thread, ~115 at 16).
    if units <= 2048:
        return Config(max(1, 2048 // units), bn, 8, programs=sms * 3)
    if units == 4096:
        return Config(1, bn, 8, programs=sms * 2)  # 113 regs × 256 threads: 2 per SM
    if units == 8192:
        return Config(1, bn, 16, programs=sms)  # 114 regs × 512 threads: 1 per SM
    return _wide(n, elem, _BWD_CHUNK, sms)


@functools.lru_cache(maxsize=512)
def _interpreter_config(kind: str, n: int, elem: int) -> Config:
    # The interpreter pays per program and per tile operation, not per byte: big tiles, few
    # programs (each walks several row blocks, which also exercises the persistent loop).
    bn = _pow2(n)
    if bn > 8192:
        return Config(1, 2048, 4, loop=True, programs=2)
    return Config(max(1, min(64, 4096 // bn)), bn, 4, programs=4)


# ----------------------------------------------------------------------------------------------
# Grouped and gated kernels (_gated.py): a tile holds block_m rows of GP = pow2(G) groups of
# block_n = pow2(g) columns; rows longer than 4096 padded elements loop over each group in column
# blocks. Register counts are ptxas's for sm_90 (benchmarks/probes/static_check.py --kinds gated,
# Triton 3.9, "llama" SiLU, the heaviest variant): forward tiles of 4096 elements on 16 warps take
# 55–62 registers (2 CTAs an SM), of 2048 on 8 warps 55 (4); backward tiles of 2048 on 8 warps
# 80–109 (2 an SM), of 4096 on 16 warps 83–107 (1; on 8 warps 164–187).
# ----------------------------------------------------------------------------------------------
_GATED_TILE = 4096  # padded elements of one tile, forward and backward
_GATED_LOOP = 2048  # column block of the looped layout


@functools.lru_cache(maxsize=512)
def gated_gpu_config(kind: str, n: int, g: int, elem: int, sms: int) -> Config:
    """The config of the gated kernel ``kind`` ("gated_fwd", "gated_bwd") for rows of n elements
    in groups of g, of ``elem`` bytes, on a GPU of ``sms`` SMs. The forward runs one program per
    row block, packing short rows up to a tile; the backward is persistent, as many programs as
    fit on the device at once, each keeping one partial d weight row."""
    row = _pow2(n // g) * _pow2(g)  # the padded tile of one row
    if row > _GATED_TILE:
        return Config(1, min(_pow2(g), _GATED_LOOP), 8, loop=True, programs=sms * 2)
    if kind == "gated_fwd":
        bm = _GATED_TILE // row
        tile = bm * row
        return Config(bm, _pow2(g), 4 if tile <= 1024 else 8 if tile <= 2048 else 16)
    bm = max(1, (_GATED_TILE // 2) // row)
    if bm * row <= _GATED_TILE // 2:
        return Config(bm, _pow2(g), 8, programs=sms * 2)
    return Config(1, _pow2(g), 16, programs=sms)


@functools.lru_cache(maxsize=512)
def _gated_interpreter_config(kind: str, n: int, g: int) -> Config:
    row = _pow2(n // g) * _pow2(g)
    if row > 8192:
        return Config(1, min(_pow2(g), 2048), 4, loop=True, programs=2)
    return Config(max(1, min(64, 4096 // row)), _pow2(g), 4, programs=4)


def choose_gated(kind: str, n: int, g: int, dtype: torch.dtype, device: torch.device) -> Config:
    """The config for the gated kernel ``kind`` on rows of n elements in groups of g."""
    forced = _overrides.get(kind)
    if forced is not None:
        return forced(n, dtype) if callable(forced) else forced
    if device.type != "cuda":
        return _gated_interpreter_config(kind, n, g)
    return gated_gpu_config(kind, n, g, dtype.itemsize, _sm_count(device.index or 0))


_overrides: dict[str, Config | Callable[[int, torch.dtype], Config]] = {}


def overridden() -> bool:
    """True inside :func:`override` (launch plans are then not cached)."""
    return bool(_overrides)


def choose(kind: str, n: int, dtype: torch.dtype, device: torch.device) -> Config:
    """The config for kernel `kind` ("fwd", "bwd", "ln_fwd", "ln_bwd") on rows of n elements."""
    forced = _overrides.get(kind)
    if forced is not None:
        return forced(n, dtype) if callable(forced) else forced
    elem = dtype.itemsize
    if device.type != "cuda":
        return _interpreter_config(kind, n, elem)
    return gpu_config(kind, n, elem, _sm_count(device.index or 0))


@contextlib.contextmanager
def override(**configs: Config | Callable[[int, torch.dtype], Config]) -> Iterator[None]:
    """Force configs for the block, e.g. ``override(fwd=Config(2, 16, 4, loop=True))``; a callable
    receives (n, dtype). Used by tests (looped / split layouts at small N) and benchmark
    variants."""
    unknown = set(configs) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kernel kinds {sorted(unknown)}; expected some of {KINDS}")
    saved = dict(_overrides)
    _overrides.update(configs)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)
