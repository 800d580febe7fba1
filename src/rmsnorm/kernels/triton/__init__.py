"""Triton kernels for CUDA (and ROCm) tensors; on CPU tensors they run under Triton's interpreter.

The five launchers have the signatures and return tuples of :mod:`rmsnorm.reference`: they take
2-D (M, N) tensors with a unit last stride (rows may be strided; nothing is copied), allocate the
outputs, pick a cached launch config (``_config.py``) and launch. No autograd, no torch.library.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ...reference import compute_dtype, output_dtype
from . import _config
from ._config import Config, override
from ._kernels import (
    _INTERPRETED,
    _layer_norm_bwd_kernel,
    _layer_norm_fwd_kernel,
    _rms_norm_bwd_kernel,
    _rms_norm_fwd_kernel,
    _sum_partials_kernel,
)

__all__ = [
    "rms_norm_fwd",
    "add_rms_norm_fwd",
    "rms_norm_bwd",
    "layer_norm_fwd",
    "layer_norm_bwd",
    "Config",
    "override",
]

_TL = {
    torch.float32: tl.float32,
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
    torch.float64: tl.float64,
}
_CAST = {"gemma": 0, "llama": 1, "none": 2}
_EPS_MODES = ("mean_square", "rms")


def _check_mode(eps_mode: str, casting_mode: str) -> None:
    if eps_mode not in _EPS_MODES:
        raise ValueError(f"eps_mode must be one of {_EPS_MODES}, got {eps_mode!r}")
    if casting_mode not in _CAST:
        raise ValueError(f"casting_mode must be one of {tuple(_CAST)}, got {casting_mode!r}")


def _acc(*dtypes: torch.dtype) -> tuple[torch.dtype, tl.dtype]:
    """The compute dtype (torch, triton): float64 when any input is float64, else float32."""
    return (torch.float64, tl.float64) if torch.float64 in dtypes else (torch.float32, tl.float32)


@functools.lru_cache(maxsize=256)
def _layout(cfg: Config) -> dict:
    """The constexprs and launch options a config contributes (shared dict: never mutated)."""
    return {
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "LOOP": cfg.loop,
        "SPLIT": cfg.split,
        "SPLIT_P2": 1 << max(0, (cfg.split - 1).bit_length()),
        # Only a persistent grid has a next row block to fetch early.
        "PREFETCH": cfg.programs > 0,
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
    }


def _launch(kernel, cfg: Config, m: int, args: tuple, meta: dict) -> None:
    """Launch `kernel` over `cfg.slots(m)` program slots (× split chunks). Under the interpreter,
    programs run one after another, so a split layout runs as a publish launch then a finish launch
    instead of spinning on its counter."""
    grid = (cfg.slots(m) * cfg.split,)
    if cfg.split > 1 and _INTERPRETED.value:
        kernel[grid](*args, PHASE=1, **_layout(cfg), **meta)
        kernel[grid](*args, PHASE=2, **_layout(cfg), **meta)
    else:
        kernel[grid](*args, PHASE=0, **_layout(cfg), **meta)


def _workspace(cfg: Config, m: int, nv: int, acc: torch.dtype, x: torch.Tensor):
    """(WS, CNT) for a split layout: per-row partials and zeroed per-row-block arrival counters;
    the unused pointers are any tensor otherwise."""
    if cfg.split == 1:
        return x, x
    ws = torch.empty((m, nv, cfg.split), dtype=acc, device=x.device)
    cnt = torch.zeros((-(-m // cfg.block_m),), dtype=torch.int32, device=x.device)
    return ws, cnt


# ----------------------------------------------------------------------------------------------
# RMSNorm
# ----------------------------------------------------------------------------------------------
def _rms_fwd(x, residual, weight, bias, eps, eps_mode, casting_mode, offset, k):
    _check_mode(eps_mode, casting_mode)
    m, n = x.shape
    dtypes = (x.dtype,) if residual is None else (x.dtype, residual.dtype)
    acc, acc_tl = _acc(*dtypes)
    y = torch.empty((m, n), dtype=output_dtype(x.dtype, weight, casting_mode), device=x.device)
    h = None if residual is None else torch.empty((m, n), dtype=residual.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=acc, device=x.device)
    if m == 0:
        return y, h, rstd
    # Registers hold the widest input's tile: an fp32 residual sizes the tile as fp32.
    cfg = _config.choose("fwd", n, max(dtypes, key=lambda d: d.itemsize), x.device)
    ws, cnt = _workspace(cfg, m, 1, acc, x)
    res = x if residual is None else residual
    hh = y if h is None else h
    args = (
        x, res, y, hh, x if weight is None else weight, x if bias is None else bias, rstd, ws, cnt,
        x.stride(0), res.stride(0), y.stride(0), hh.stride(0), m, n, k, float(eps), float(offset),
    )  # fmt: skip
    meta = {
        "HAS_RES": residual is not None,
        "HAS_W": weight is not None,
        "HAS_B": bias is not None,
        "RMS_EPS": eps_mode == "rms",
        "PARTIAL": k < n,
        "CAST": _CAST[casting_mode],
        "ACC": acc_tl,
    }
    _launch(_rms_norm_fwd_kernel, cfg, m, args, meta)
    return y, h, rstd


def rms_norm_fwd(
    x: torch.Tensor,  # (M, N)
    weight: torch.Tensor | None,  # (N,)
    bias: torch.Tensor | None,  # (N,)
    eps: float,
    eps_mode: str,
    casting_mode: str,
    offset: float,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm forward (see :func:`rmsnorm.reference.rms_norm_fwd`): returns (y, rstd)."""
    y, _, rstd = _rms_fwd(x, None, weight, bias, eps, eps_mode, casting_mode, offset, k)
    return y, rstd


def add_rms_norm_fwd(
    x: torch.Tensor,  # (M, N)
    residual: torch.Tensor,  # (M, N)
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    eps_mode: str,
    casting_mode: str,
    offset: float,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm (see :func:`rmsnorm.reference.add_rms_norm_fwd`):
    returns (y, h, rstd)."""
    return _rms_fwd(x, residual, weight, bias, eps, eps_mode, casting_mode, offset, k)


def _param_grads(x, weight, bias, need: bool):
    """(dw, db, partial columns): outputs to fill, or empty tensors where not wanted."""
    empty = x.new_empty((0,), dtype=compute_dtype(x.dtype))
    need_dw = need and weight is not None
    need_db = need and bias is not None
    dw = torch.empty_like(weight) if need_dw else empty
    db = torch.empty_like(bias) if need_db else empty
    return dw, db, need_dw, need_db


def _reduce_partials(part: torch.Tensor, dw, db, need_dw: bool, need_db: bool, n: int, acc_tl):
    """d weight / d bias = the fixed-order sum of the partial rows."""
    rows = part.shape[0]
    if part.device.type == "cpu":
        block_n, block_r, warps = min(_pow2(n), 1024), min(_pow2(rows), 64), 4
    else:
        # Enough programs to stream the (rows, N) fp32 buffer at full bandwidth.
        block_n = max(32, min(256, _pow2(-(-n // 512))))
        block_r, warps = 32, 4
    grid = (triton.cdiv(n, block_n), int(need_dw) + int(need_db))
    _sum_partials_kernel[grid](
        part, dw, db, rows, n, part.stride(0),
        NEED_DW=need_dw, NEED_DB=need_db, BLOCK_R=block_r, BLOCK_N=block_n, ACC=acc_tl,
        num_warps=warps,
    )  # fmt: skip


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _zero_grads(dw, db, need_dw, need_db):
    if need_dw:
        dw.zero_()
    if need_db:
        db.zero_()


def rms_norm_bwd(
    dy: torch.Tensor,  # (M, N)
    x: torch.Tensor,  # (M, N): x, or h for add_rms_norm
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    rstd: torch.Tensor,  # (M,)
    dresidual: torch.Tensor | None,  # (M, N)
    eps: float,
    eps_mode: str,
    casting_mode: str,
    offset: float,
    k: int,
    input_dtype: torch.dtype,
    need_weight_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm backward (see :func:`rmsnorm.reference.rms_norm_bwd`): returns (dx, dw, db)."""
    _check_mode(eps_mode, casting_mode)
    m, n = x.shape
    acc, acc_tl = _acc(x.dtype, input_dtype)
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    dw, db, need_dw, need_db = _param_grads(x, weight, bias, need_weight_grad)
    if m == 0:
        _zero_grads(dw, db, need_dw, need_db)
        return dx, dw, db
    cfg = _config.choose("bwd", n, x.dtype, x.device)
    ws, cnt = _workspace(cfg, m, 2, acc, x)
    slots = cfg.slots(m)
    ncols = n * (int(need_dw) + int(need_db))
    part = torch.empty((slots, ncols), dtype=acc, device=x.device) if ncols else x
    dres = x if dresidual is None else dresidual
    args = (
        dy, x, x if weight is None else weight, rstd, dres, dx, part, ws, cnt,
        dy.stride(0), x.stride(0), dres.stride(0), dx.stride(0), part.stride(0) if ncols else 0,
        m, n, k, float(eps), float(offset),
    )  # fmt: skip
    meta = {
        "HAS_W": weight is not None,
        "HAS_DRES": dresidual is not None,
        "NEED_DW": need_dw,
        "NEED_DB": need_db,
        "RMS_EPS": eps_mode == "rms",
        "PARTIAL": k < n,
        "LLAMA": casting_mode == "llama",
        "IN": _TL[input_dtype],
        "ACC": acc_tl,
    }
    _launch(_rms_norm_bwd_kernel, cfg, m, args, meta)
    if ncols:
        _reduce_partials(part, dw, db, need_dw, need_db, n, acc_tl)
    return dx, dw, db


# ----------------------------------------------------------------------------------------------
# LayerNorm
# ----------------------------------------------------------------------------------------------
def layer_norm_fwd(
    x: torch.Tensor,  # (M, N)
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm forward (see :func:`rmsnorm.reference.layer_norm_fwd`): returns (y, mean, rstd)."""
    m, n = x.shape
    acc, acc_tl = _acc(x.dtype)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    mean = torch.empty((m,), dtype=acc, device=x.device)
    rstd = torch.empty((m,), dtype=acc, device=x.device)
    if m == 0:
        return y, mean, rstd
    cfg = _config.choose("ln_fwd", n, x.dtype, x.device)
    ws, cnt = _workspace(cfg, m, 2, acc, x)
    args = (
        x, y, x if weight is None else weight, x if bias is None else bias, mean, rstd, ws, cnt,
        x.stride(0), y.stride(0), m, n, float(eps),
    )  # fmt: skip
    meta = {"HAS_W": weight is not None, "HAS_B": bias is not None, "ACC": acc_tl}
    _launch(_layer_norm_fwd_kernel, cfg, m, args, meta)
    return y, mean, rstd


def layer_norm_bwd(
    dy: torch.Tensor,  # (M, N)
    x: torch.Tensor,  # (M, N)
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor,  # (M,)
    rstd: torch.Tensor,  # (M,)
    need_weight_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm backward (see :func:`rmsnorm.reference.layer_norm_bwd`): returns (dx, dw, db)."""
    m, n = x.shape
    acc, acc_tl = _acc(x.dtype)
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    dw, db, need_dw, need_db = _param_grads(x, weight, bias, need_weight_grad)
    if m == 0:
        _zero_grads(dw, db, need_dw, need_db)
        return dx, dw, db
    cfg = _config.choose("ln_bwd", n, x.dtype, x.device)
    ws, cnt = _workspace(cfg, m, 2, acc, x)
    slots = cfg.slots(m)
    ncols = n * (int(need_dw) + int(need_db))
    part = torch.empty((slots, ncols), dtype=acc, device=x.device) if ncols else x
    args = (
        dy, x, x if weight is None else weight, mean, rstd, dx, part, ws, cnt,
        dy.stride(0), x.stride(0), dx.stride(0), part.stride(0) if ncols else 0, m, n,
    )  # fmt: skip
    meta = {"HAS_W": weight is not None, "NEED_DW": need_dw, "NEED_DB": need_db, "ACC": acc_tl}
    _launch(_layer_norm_bwd_kernel, cfg, m, args, meta)
    if ncols:
        _reduce_partials(part, dw, db, need_dw, need_db, n, acc_tl)
    return dx, dw, db
