"""Launchers for the CPU kernels: the five functions of :mod:`rmsnorm.reference` with the same
arguments and return tuples. Each takes 2-D (M, N) tensors with a unit last stride (rows may be
strided; nothing is copied), allocates the outputs, calls one numba kernel and returns fresh
tensors.

float64 anywhere (input, residual, the output of a "llama" product with a float64 weight) and empty
tensors go to the reference: the kernels compute in float32.
"""

from __future__ import annotations

import os
import warnings

import numba
import numpy as np
import torch

from ... import reference as ref
from . import kernels as K

__all__ = [
    "rms_norm_fwd",
    "add_rms_norm_fwd",
    "rms_norm_bwd",
    "layer_norm_fwd",
    "layer_norm_bwd",
]

_CODES = {torch.float32: K.F32, torch.bfloat16: K.BF16, torch.float16: K.F16}
_EPS_MODES = {"mean_square": K.MEAN_SQUARE, "rms": K.RMS}
_NO_F32 = np.empty(0, np.float32)
_NO_U16 = np.empty(0, np.uint16)
_MAX_THREADS = numba.config.NUMBA_NUM_THREADS
_SERIAL_BELOW = 65536  # elements (M·N)


def _supported(*dtypes: torch.dtype | None) -> bool:
    return _fork_safe() and all(d is None or d in _CODES for d in dtypes)


_pool_pid: int | None = None  # the process whose kernel call started numba's thread pool


def _fork_safe() -> bool:
    """False in a process forked after its parent ran the kernels with numba's OpenMP thread pool:
    GNU OpenMP is not fork-safe and numba aborts such a child at its first parallel region (a
    DataLoader worker, for one). The reference runs there instead, after a warning."""
    global _pool_pid
    pid = os.getpid()
    if _pool_pid is None:
        _pool_pid = pid
    if _pool_pid == pid:
        return True
    try:
        if numba.threading_layer() != "omp":
            return True
    except ValueError:  # the parent never started the pool
        return True
    if not _warned_fork:
        _warn_fork()
    return False


_warned_fork = False


def _warn_fork() -> None:
    global _warned_fork
    _warned_fork = True
    warnings.warn(
        "rmsnorm: this process was forked after its parent used the CPU kernels, and numba's "
        "OpenMP threading layer cannot run in such a child; using the reference implementation "
        "(start workers with 'spawn', or set NUMBA_THREADING_LAYER=workqueue or tbb)",
        RuntimeWarning,
        stacklevel=4,
    )


class _Memory:
    """A tensor's memory as numpy sees it, by address. ``Tensor.numpy()`` would mark the tensor's
    storage as never resizable again (FSDP2 resizes parameter storages to free them; that failed),
    so the kernels get their arrays this way; the array keeps the tensor alive through this."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor, numel: int, typestr: str):
        self.tensor = t
        self.__array_interface__ = {
            "data": (t.data_ptr(), False), "shape": (numel,), "typestr": typestr, "version": 3,
        }  # fmt: skip


def _array(t: torch.Tensor, numel: int | None = None) -> np.ndarray:
    """numel elements from t's first one, as float32, float64 or raw 16-bit patterns (uint16)."""
    typestr = {torch.float32: "<f4", torch.float64: "<f8"}.get(t.dtype, "<u2")
    return np.asarray(_Memory(t, t.numel() if numel is None else numel, typestr))


def _rows(t: torch.Tensor) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(float32 view, uint16 view, row stride, dtype code) of a 2-D tensor's storage, no copy.

    The flat view spans from the first element to the last one the rows use, so strided rows (and a
    row stride of 0) are read in place. N = 1 columns may have any last stride: only the row stride
    is used.
    """
    m, n = t.shape
    if n > 1 and t.stride(1) != 1:
        t = t.contiguous()
    stride = t.stride(0) if m > 1 else n
    flat = _array(t, (m - 1) * stride + n)
    code = _CODES[t.dtype]
    if code == K.F32:
        return flat, _NO_U16, stride, code
    return _NO_F32, flat, stride, code


def _out(t: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(float32 view, uint16 view) of a fresh contiguous output."""
    if t.dtype == torch.float32:
        return _array(t), _NO_U16
    return _NO_F32, _array(t)


def _vec(t: torch.Tensor | None, n: int) -> np.ndarray:
    """A (N,) float32 parameter as a contiguous array (ones when absent: × 1 is exact)."""
    if t is None:
        return np.ones(n, np.float32)
    return _array(t.detach().to(torch.float32).contiguous())


def _threads(elements: int) -> None:
    """Use as many threads as torch does (``torch.set_num_threads`` governs this library too), but
    one below 64 K elements: waking the pool costs several µs on an idle machine and a whole
    scheduler slice (ms) on a busy one, more than such a call's work."""
    want = 1 if elements < _SERIAL_BELOW else max(1, min(torch.get_num_threads(), _MAX_THREADS))
    if numba.get_num_threads() != want:
        numba.set_num_threads(want)


def _fwd_rows_per_block(m: int, n: int) -> int:
    # ~16 K elements a block: big enough that a block's scratch allocation is noise, small enough
    # that M·N = 2^25 has thousands of blocks to spread over the threads.
    return max(1, min(m, 16384 // n))


def _bwd_rows_per_block(m: int) -> int:
    # Fixed by M alone, so d weight is summed in the same order on any number of threads. At least
    # 32 rows a block keeps the fp32 partials (blocks × N) at ≤ 1/32 of the input; ≤ 1024 blocks.
    return max(32, -(-m // 1024))


def _empty_grad(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((0,), dtype=ref.compute_dtype(x.dtype))


# ----------------------------------------------------------------------------------------------
# RMSNorm
# ----------------------------------------------------------------------------------------------
def _rounding(casting_mode: str, in_dtype: torch.dtype, out_dtype: torch.dtype) -> tuple[int, ...]:
    """Rounding points (c_pre, c_r, c_mul, c_out) of the casting mode, as in
    ``reference._rms_norm_apply``: "gemma" rounds once at the store; "llama" rounds x·r to the input
    dtype and the products to the output dtype; "none" rounds the input, r and every product to the
    input dtype."""
    cin = _CODES[in_dtype]
    if casting_mode == "gemma":
        return K.F32, K.F32, K.F32, K.F32
    if casting_mode == "llama":
        return K.F32, K.F32, cin, _CODES[out_dtype]
    return cin, cin, cin, cin


def _rms_params(weight, bias, offset, casting_mode, in_dtype, out_dtype, n):
    """The (N,) float32 scale and bias, rounded as the reference rounds them in the casting mode."""
    dtype = {"gemma": torch.float32, "llama": out_dtype, "none": in_dtype}[casting_mode]
    scale = ref._scale(weight, offset, dtype)
    return _vec(scale, n), _NO_F32 if bias is None else _vec(bias.to(dtype), n)


def _rms_fwd(x, residual, weight, bias, eps, eps_mode, casting_mode, offset, k):
    m, n = x.shape
    out_dtype = ref.output_dtype(x.dtype, weight, casting_mode)
    y = torch.empty((m, n), dtype=out_dtype)
    rstd = torch.empty((m,), dtype=torch.float32)
    xf, xu, xs, xc = _rows(x)
    if residual is not None:
        rf, ru, rs, rc = _rows(residual)
        h = torch.empty((m, n), dtype=residual.dtype)
        hf, hu = _out(h)
    else:
        rf, ru, rs, rc, h, hf, hu = _NO_F32, _NO_U16, 0, K.F32, None, _NO_F32, _NO_U16
    yf, yu = _out(y)
    s, b = _rms_params(weight, bias, offset, casting_mode, x.dtype, out_dtype, n)
    _threads(m * n)
    K.forward(
        xf, xu, xs, xc, rf, ru, rs, rc, residual is not None, hf, hu, yf, yu, _CODES[out_dtype],
        s, b, bias is not None, _NO_F32, _array(rstd), m, n, k, float(eps), K.RMS_NORM,
        _EPS_MODES[eps_mode], *_rounding(casting_mode, x.dtype, out_dtype),
        _fwd_rows_per_block(m, n),
    )  # fmt: skip
    return y, h, rstd


def _check_modes(eps_mode: str, casting_mode: str) -> None:
    if eps_mode not in ref.EPS_MODES:
        raise ValueError(f"eps_mode must be one of {ref.EPS_MODES}, got {eps_mode!r}")
    if casting_mode not in ref.CASTING_MODES:
        raise ValueError(f"casting_mode must be one of {ref.CASTING_MODES}, got {casting_mode!r}")


def rms_norm_fwd(x, weight, bias, eps, eps_mode, casting_mode, offset, k):
    """RMSNorm forward; see :func:`rmsnorm.reference.rms_norm_fwd`."""
    _check_modes(eps_mode, casting_mode)
    out_dtype = ref.output_dtype(x.dtype, weight, casting_mode)
    if x.numel() == 0 or not _supported(x.dtype, out_dtype):
        return ref.rms_norm_fwd(x, weight, bias, eps, eps_mode, casting_mode, offset, k)
    y, _, rstd = _rms_fwd(x, None, weight, bias, eps, eps_mode, casting_mode, offset, k)
    return y, rstd


def add_rms_norm_fwd(x, residual, weight, bias, eps, eps_mode, casting_mode, offset, k):
    """Residual add + RMSNorm forward; see :func:`rmsnorm.reference.add_rms_norm_fwd`."""
    _check_modes(eps_mode, casting_mode)
    out_dtype = ref.output_dtype(x.dtype, weight, casting_mode)
    if x.numel() == 0 or not _supported(x.dtype, residual.dtype, out_dtype):
        return ref.add_rms_norm_fwd(
            x, residual, weight, bias, eps, eps_mode, casting_mode, offset, k
        )
    return _rms_fwd(x, residual, weight, bias, eps, eps_mode, casting_mode, offset, k)


def _bwd(dy, x, scale, mean, rstd, dresidual, norm, eps_mode, k, c_xhat, dw_p, db_p, need):
    """Shared launcher of the backward kernel; returns (dx, dw, db)."""
    m, n = x.shape
    dx = torch.empty((m, n), dtype=x.dtype)
    need_dw = need and dw_p is not None
    need_db = need and db_p is not None
    dw64 = torch.empty(n if need_dw else 0, dtype=torch.float64)
    db64 = torch.empty(n if need_db else 0, dtype=torch.float64)
    dyf, dyu, dys, dyc = _rows(dy)
    xf, xu, xs, xc = _rows(x)
    if dresidual is not None:
        drf, dru, drs, drc = _rows(dresidual)
    else:
        drf, dru, drs, drc = _NO_F32, _NO_U16, 0, K.F32
    dxf, dxu = _out(dx)
    mean_np = _NO_F32 if mean is None else _vec(mean, m)
    _threads(m * n)
    K.backward(
        dyf, dyu, dys, dyc, xf, xu, xs, xc, drf, dru, drs, drc, dresidual is not None, dxf, dxu,
        scale, mean_np, _vec(rstd, m), m, n, k, norm, eps_mode, c_xhat, need_dw, need_db,
        _bwd_rows_per_block(m), _array(dw64), _array(db64),
    )  # fmt: skip
    dw = dw64.to(dw_p.dtype) if need_dw else _empty_grad(x)
    db = db64.to(db_p.dtype) if need_db else _empty_grad(x)
    return dx, dw, db


def rms_norm_bwd(
    dy, x, weight, bias, rstd, dresidual, eps, eps_mode, casting_mode, offset, k, input_dtype,
    need_weight_grad=True,
):  # fmt: skip
    """RMSNorm backward; see :func:`rmsnorm.reference.rms_norm_bwd`."""
    _check_modes(eps_mode, casting_mode)
    dr_dtype = None if dresidual is None else dresidual.dtype
    if x.numel() == 0 or not _supported(dy.dtype, x.dtype, dr_dtype, input_dtype, rstd.dtype):
        return ref.rms_norm_bwd(
            dy, x, weight, bias, rstd, dresidual, eps, eps_mode, casting_mode, offset, k,
            input_dtype, need_weight_grad,
        )  # fmt: skip
    n = x.shape[1]
    scale = _vec(ref._scale(weight, offset, torch.float32), n)
    c_xhat = _CODES[input_dtype] if casting_mode == "llama" else K.F32
    return _bwd(
        dy, x, scale, None, rstd, dresidual, K.RMS_NORM, _EPS_MODES[eps_mode], k, c_xhat,
        weight, bias, need_weight_grad,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# LayerNorm
# ----------------------------------------------------------------------------------------------
def layer_norm_fwd(x, weight, bias, eps):
    """LayerNorm forward; see :func:`rmsnorm.reference.layer_norm_fwd`."""
    if x.numel() == 0 or not _supported(x.dtype):
        return ref.layer_norm_fwd(x, weight, bias, eps)
    m, n = x.shape
    y = torch.empty((m, n), dtype=x.dtype)
    mean = torch.empty((m,), dtype=torch.float32)
    rstd = torch.empty((m,), dtype=torch.float32)
    xf, xu, xs, xc = _rows(x)
    yf, yu = _out(y)
    _threads(m * n)
    K.forward(
        xf, xu, xs, xc, _NO_F32, _NO_U16, 0, K.F32, False, _NO_F32, _NO_U16, yf, yu, xc,
        _vec(weight, n), _NO_F32 if bias is None else _vec(bias, n), bias is not None,
        _array(mean), _array(rstd),
        m, n, n, float(eps), K.LAYER_NORM, K.MEAN_SQUARE, K.F32, K.F32, K.F32, K.F32,
        _fwd_rows_per_block(m, n),
    )  # fmt: skip
    return y, mean, rstd


def layer_norm_bwd(dy, x, weight, bias, mean, rstd, need_weight_grad=True):
    """LayerNorm backward; see :func:`rmsnorm.reference.layer_norm_bwd`."""
    if x.numel() == 0 or not _supported(dy.dtype, x.dtype, rstd.dtype, mean.dtype):
        return ref.layer_norm_bwd(dy, x, weight, bias, mean, rstd, need_weight_grad)
    n = x.shape[1]
    return _bwd(
        dy, x, _vec(weight, n), mean, rstd, None, K.LAYER_NORM, K.MEAN_SQUARE, n, K.F32,
        weight, bias, need_weight_grad,
    )  # fmt: skip
