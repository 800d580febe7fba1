"""Forced launch configs of this library's kernels, timed side by side on the same shapes: the
measurements the config table in ``kernels/triton/_config.py`` is tuned from. Rows carry the
provider ``rmsnorm[<layout>]``; ``rmsnorm bench --variants`` adds them after the main run."""

from __future__ import annotations

import time

import torch

import rmsnorm

from ..kernels.triton import Config, _config, override
from .rows import Row, make_row

_MN = 2**27


def _splits(kind: str, n: int, chunks: tuple[int, ...], sms: int) -> list:
    """A row of N split into chunks over programs, for each chunk that needs 2 to ``sms`` of
    them; the grid is a whole number of rows' programs."""
    out = []
    for chunk in chunks:
        split = -(-n // chunk)
        if 1 < split <= sms:
            progs = (sms // split) * split
            cfg = Config(1, chunk, 16, split=split, programs=progs)
            out.append((kind, n, f"split{chunk}", cfg))
    return out


def variant_configs(sms: int) -> list[tuple[str, int, str, Config]]:
    """(kind, N, label, config) candidates around the defaults, widest rows first."""
    out: list[tuple[str, int, str, Config]] = []
    for n in (262144, 65536, 32768, 16384, 8192):
        # forward: one program per row in registers, split over programs, or looped
        for warps in (16, 32):
            if n <= 32768:
                out.append(("fwd", n, f"single.w{warps}", Config(1, n, warps)))
        if n <= 16384:
            out.append(("fwd", n, "single.persist", Config(1, n, 16, programs=sms)))
        # Split grids stay within one program per SM: these kernels need > 64 registers per
        # thread, so a second one would not be co-resident and the row exchange would then rely
        # on the hardware dispatching blocks in order.
        out += _splits("fwd", n, (8192, 16384, 32768), sms)
        for stages in (1, 2):
            cfg = Config(1, 8192, 16, loop=True, programs=sms * 2, num_stages=stages)
            out.append(("fwd", n, f"loop8192.s{stages}", cfg))
        # backward (d input + d weight)
        if n <= 16384:
            for per_sm in (1, 2):
                out.append(("bwd", n, f"single.x{per_sm}", Config(1, n, 16, programs=sms * per_sm)))
        out += _splits("bwd", n, (4096, 8192, 16384), sms)
        cfg = Config(1, 4096, 16, loop=True, programs=sms, num_stages=2)
        out.append(("bwd", n, "loop4096", cfg))
    # QK-norm (N = 128): rows per tile, warps and programs per SM
    for bm, warps in ((16, 4), (32, 4), (32, 8), (64, 8)):
        out.append(("fwd", 128, f"bm{bm}.w{warps}", Config(bm, 128, warps)))
    for bm in (8, 16, 32):
        for per_sm in (2, 4, 8):
            cfg = Config(bm, 128, 4, programs=sms * per_sm)
            out.append(("bwd", 128, f"bm{bm}.x{per_sm}", cfg))
    # the common hidden size: warps and persistence of the backward
    for warps in (8, 16):
        for per_sm in (1, 2, 4):
            cfg = Config(1, 4096, warps, programs=sms * per_sm)
            out.append(("bwd", 4096, f"w{warps}.x{per_sm}", cfg))
    # Every group also times the default config, in the same conditions as its alternatives.
    for kind, n in dict.fromkeys((k, n) for k, n, _, _ in out):
        default = _config.gpu_config(kind, n, 2, sms)
        if not any(c == default for k, m, _, c in out if (k, m) == (kind, n)):
            out.append((kind, n, "default", default))
    return out


def _timed(mode: str, x: torch.Tensor, w: torch.Tensor):
    n = x.shape[-1]
    if mode == "forward":
        return lambda: rmsnorm.rms_norm(x, (n,), w, 1e-6)
    y = rmsnorm.rms_norm(x, (n,), w, 1e-6)
    dy = torch.randn_like(y)
    return lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True)


def run_variants(
    meta: dict, timer, start: float, deadline_s: float, log, shard: tuple[int, int] = (0, 1)
) -> list[Row]:
    """Time each variant (shard i of n: variants i, i + n, ...) until `deadline_s` after `start`."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[Row] = []
    dtype = torch.bfloat16
    inputs_for: dict = {}
    for kind, n, label, cfg in variant_configs(sms)[shard[0] :: shard[1]]:
        if time.monotonic() - start > deadline_s:
            log(f"variants: stopped at {kind} N={n} {label}: time budget spent")
            break
        m = 2**20 if n == 128 else _MN // n
        if n not in inputs_for:
            inputs_for.clear()
            torch.cuda.empty_cache()
            x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
            w = (torch.randn(n, device="cuda", dtype=dtype) * 0.1 + 1).requires_grad_()
            inputs_for[n] = (x, w)
        x, w = inputs_for[n]
        copy_gbps, _ = timer.copy_gbps(m * n, dtype)
        try:
            with override(**{kind: cfg}):
                mode = "forward" if kind == "fwd" else "backward"
                ms = timer.median_ms(_timed(mode, x, w))
        except Exception as exc:
            log(f"variant {kind} N={n} {label}: failed: {type(exc).__name__}: {exc}"[:300])
            continue
        default = _config.gpu_config(kind, n, dtype.itemsize, sms)
        name = f"rmsnorm[{label}{'*' if cfg == default else ''}]"
        row = make_row(meta, "rms_norm", mode, name, dtype, m, n, "eager", ms, copy_gbps)
        rows.append(row)
        log(f"variant {mode:8} N={n:6} {name:28} {row.gbps:6.0f} GB/s {row.pct_copy:5.1f}%")
    return rows
