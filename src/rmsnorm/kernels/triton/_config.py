"""Launch configurations: one heuristic config per shape class, cached; no autotuning on the hot
path.

A config says how a kernel tiles the (M, N) problem (see the layouts in ``_kernels.py``): the tile
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

KINDS = ("fwd", "bwd", "ln_fwd", "ln_bwd")


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
    return 1 << max(0, (n - 1).bit_length())


# ----------------------------------------------------------------------------------------------
# The shape classes. Numbers are per 2-byte element unless said otherwise; a wider dtype halves
# the columns a program holds, because registers hold the fp32 copy either way.
# ----------------------------------------------------------------------------------------------
# Largest row a single program keeps in registers. Forward: x plus y in flight; 32768 bf16 is 64
# fp32 values per thread at 16 warps, no spills (ptxas, sm_90). Backward holds x, dy, weight and the
# d weight accumulator (+ d bias): 8192 columns at 16 warps is 16 values of each per thread.
_FWD_SINGLE_MAX = {2: 32768, 4: 16384, 8: 8192}
_BWD_SINGLE_MAX = {2: 8192, 4: 8192, 8: 4096}
# Column block of the looped path: 16 KiB of input per load at 16 warps.
_LOOP_BLOCK = {2: 8192, 4: 4096, 8: 2048}


@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _split_allowed() -> bool:
    # The split layout spins on a counter; it needs every program resident at once, which holds
    # while the grid ≤ SM count and no other kernel monopolises SMs. RMSNORM_TRITON_SPLIT=0 opts
    # out.
    return os.environ.get("RMSNORM_TRITON_SPLIT", "1") != "0"


def _wide(n: int, elem: int, single_max: dict, sms: int, persistent_k: int, warps: int) -> Config:
    """Rows too long for one program: split over cooperating programs while they fit on the device
    (grid ≤ SMs), else loop over column blocks."""
    chunk = single_max[elem]
    split = -(-n // chunk)
    if _split_allowed() and split <= sms:
        # Balance the chunks: the smallest power of two that covers N in `split` pieces.
        block_n = _pow2(-(-n // split))
        split = -(-n // block_n)
        return Config(1, block_n, warps, split=split, programs=(sms // split) * split)
    return Config(1, _LOOP_BLOCK[elem], 16, loop=True, programs=sms * persistent_k, num_stages=2)


@functools.lru_cache(maxsize=512)
def _gpu_config(kind: str, n: int, elem: int, sms: int) -> Config:
    bn = _pow2(n)
    if kind in ("fwd", "ln_fwd"):
        if bn > _FWD_SINGLE_MAX[elem]:
            return _wide(n, elem, _FWD_SINGLE_MAX, sms, 1, 16)
        # Tiles of ≥ 4096 elements (8 KiB of bf16) so short rows still move enough bytes per
        # program; ~16 elements per thread.
        bm = max(1, 4096 // bn)
        tile = bm * bn * elem // 2
        warps = max(4, min(16, tile // 512))
        return Config(bm, bn, warps)
    # Backward: persistent grid, each program accumulates d weight over its rows in registers.
    if bn > _BWD_SINGLE_MAX[elem]:
        return _wide(n, elem, _BWD_SINGLE_MAX, sms, 1, 16)
    bm = max(1, 2048 // bn)
    tile = bm * bn * elem // 2
    warps = max(4, min(16, tile // 256))
    per_sm = max(1, min(4, 1024 // (warps * 32)))
    return Config(bm, bn, warps, programs=sms * per_sm)


@functools.lru_cache(maxsize=512)
def _interpreter_config(kind: str, n: int, elem: int) -> Config:
    # The interpreter pays per program and per tile operation, not per byte: big tiles, few
    # programs (each walks several row blocks, which also exercises the persistent loop).
    bn = _pow2(n)
    if bn > 8192:
        return Config(1, 2048, 4, loop=True, programs=2)
    return Config(max(1, min(64, 4096 // bn)), bn, 4, programs=4)


_overrides: dict[str, Config | Callable[[int, torch.dtype], Config]] = {}


def choose(kind: str, n: int, dtype: torch.dtype, device: torch.device) -> Config:
    """The config for kernel `kind` ("fwd", "bwd", "ln_fwd", "ln_bwd") on rows of n elements."""
    forced = _overrides.get(kind)
    if forced is not None:
        return forced(n, dtype) if callable(forced) else forced
    elem = dtype.itemsize
    if device.type != "cuda":
        return _interpreter_config(kind, n, elem)
    return _gpu_config(kind, n, elem, _sm_count(device.index or 0))


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
