"""Triton kernels for CUDA (and ROCm) tensors; on CPU tensors they run under Triton's interpreter.

The seven launchers of the backend contract (:class:`rmsnorm._contract.Backend`) read the rows in
place (nothing is copied), allocate the outputs, pick a cached launch config (``_config.py``) and
launch. No autograd, no torch.library.
"""

from __future__ import annotations

import contextlib
import functools
import re

import torch
import triton
import triton.language as tl

from ..._contract import LAUNCHERS
from ...reference import (
    check_activation,
    check_casting_mode,
    check_eps_mode,
    compute_dtype,
    output_dtype,
)

# Triton 3.3 passes the kernels' dtype-annotated scalars (eps, offset: tl.float64) as float32,
# which float64 inputs need exactly, and rejects chained boolean operators; both checked by
# compiling every kernel for sm_90 with Triton 3.3.1 and 3.4.0. 3.4 ships with torch 2.8.
MIN_TRITON = (3, 4)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


if _version(triton.__version__) < MIN_TRITON:
    raise ImportError(
        f"rmsnorm's Triton kernels need triton >= {'.'.join(map(str, MIN_TRITON))}, found "
        f"triton {triton.__version__} (torch 2.8 and later bring a recent enough one); upgrade "
        "triton, or run another backend: RMSNORM_BACKEND=reference (any device) or cpu"
    )
# The kernels are imported after the version check, so an old Triton fails with the message above.
from . import _config  # noqa: E402
from . import _flags as flag  # noqa: E402
from ._common import sum_partials_kernel  # noqa: E402
from ._config import Config, _pow2, override  # noqa: E402
from ._gated import gated_rms_norm_bwd_kernel, gated_rms_norm_fwd_kernel  # noqa: E402
from ._layer_norm import layer_norm_bwd_kernel, layer_norm_fwd_kernel  # noqa: E402
from ._rms import rms_norm_bwd_kernel, rms_norm_fwd_kernel  # noqa: E402

__all__ = [*LAUNCHERS, "Config", "override"]

_TL = {
    torch.float32: tl.float32,
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
    torch.float64: tl.float64,
}
_CAST = {"gemma": flag.CAST_GEMMA, "llama": flag.CAST_LLAMA, "none": flag.CAST_NONE}


def _check_mode(eps_mode: str, casting_mode: str) -> None:
    check_eps_mode(eps_mode)
    check_casting_mode(casting_mode)


def _rms_options(opts, size: int, in_dtype: torch.dtype, weight) -> tuple:
    """The RMS options as the jit kernels take them (checked here), for rows or groups of
    ``size`` elements and the input dtype ``in_dtype`` the casting mode rounds to: (the kernel
    flags of the ε form, a partial RMS (k below ``size``) and the casting mode, OR-ed with a
    launch's other flags; the norm's output dtype (:func:`rmsnorm.reference.output_dtype`); the
    scalar arguments (k, eps, offset)). The one place the launchers read the options: a launch
    plan is keyed by the value and keeps what this returns."""
    eps_mode, casting_mode = opts.eps_mode, opts.casting_mode
    _check_mode(eps_mode, casting_mode)
    rms_eps, partial = eps_mode == "rms", opts.k < size
    flags = flag.flags(rms_eps=rms_eps, partial=partial, cast=_CAST[casting_mode])
    scalars = (opts.k, float(opts.eps), float(opts.offset))
    return flags, output_dtype(in_dtype, weight, casting_mode), scalars


def _unit_stride(t: torch.Tensor | None) -> torch.Tensor | None:
    """A (N,) or (M,) vector as the kernels read it, with unit stride. A strided, expanded
    (stride 0) or sliced weight is copied (N elements, nothing next to the M·N of a launch); a
    contiguous one is returned as is (~0.05 µs). Cheaper than a stride argument per vector, which
    every launch would bind and every kernel would multiply by."""
    return None if t is None else t.contiguous()


def _row_layout(t: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """(t, its row stride) as the kernels read rows: a 2-D tensor with a unit last stride keeps
    its row stride (strided rows are read in place); anything else is read contiguous."""
    if t.dim() == 2 and (t.stride(1) == 1 or n == 1):
        return t, t.stride(0)
    return (t if t.is_contiguous() else t.contiguous()), n


def _acc(*dtypes: torch.dtype) -> tuple[torch.dtype, tl.dtype]:
    """The compute dtype (torch, triton): float64 when any input is float64, else float32."""
    return (torch.float64, tl.float64) if torch.float64 in dtypes else (torch.float32, tl.float32)


# ----------------------------------------------------------------------------------------------
# Launch plans: everything about a launch that depends only on the call's signature (N, dtypes,
# options, device), computed once. A call then allocates, looks up its plan and launches.
# ----------------------------------------------------------------------------------------------
_launch_plans: dict = {}
# A bound on the plans kept (the RMSNorm plans are keyed by the options value, so distinct ε,
# offset and k values each have theirs): the cache starts over when it reaches it
_MAX_PLANS = 1024


def _launch_plan(key: tuple, build):
    """The cached plan for `key`, built by `build()` on a miss; not cached while a test or a
    benchmark overrides configs."""
    plan = _launch_plans.get(key)
    if plan is None or _config.overridden():
        plan = build()
        if not _config.overridden():
            if len(_launch_plans) >= _MAX_PLANS:
                _launch_plans.clear()
            _launch_plans[key] = plan
    return plan


def _launches(cfg: Config, option_flags: int, extra: dict) -> list[dict]:
    """The keyword arguments of each launch of a config: its tile and layout constexprs, FLAGS
    (options + layout bits), the extra constexprs and the launch options."""
    common = {
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "SPLIT": cfg.split,
        "SPLIT_P2": 1 << max(0, (cfg.split - 1).bit_length()),
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
        **extra,
    }
    base = option_flags | flag.flags(loop=cfg.loop, prefetch=cfg.programs > 0)
    if cfg.split > 1 and flag.INTERPRETED:
        # The interpreter runs programs one after another: a split row runs as a publish launch
        # and a finish launch instead of spinning on its counter.
        return [dict(common, FLAGS=base | flag.flags(phase=ph)) for ph in (1, 2)]
    if cfg.split > 1:
        # The programs of a split row spin on each other, so they must all be resident at once.
        # A cooperative launch makes that the driver's guarantee rather than an assumption
        # (grid <= SMs on an otherwise idle GPU): kernels of other streams, a second split
        # launch or an MPS share of the SMs then delay the launch instead of deadlocking it, and
        # one that can never fit is refused at launch (see _SplitRefused).
        common["launch_cooperative_grid"] = True
    return [dict(common, FLAGS=base)]


class _SplitRefused(Exception):
    """The driver refused a cooperative (split-layout) launch: it can never be co-resident."""


def _launch(kernel, cfg: Config, launches: list, m: int, args: tuple) -> None:
    grid = (cfg.slots(m) * cfg.split,)
    for kwargs in launches:
        try:
            with _quiet():
                kernel[grid](*args, **kwargs)
        except RuntimeError as e:
            if cfg.split > 1 and "cooperative" in str(e).lower():
                raise _SplitRefused(str(e)) from e
            raise


def _quiet():
    """Under the interpreter, NumPy's warnings off for a launch: a row with eps = 0 divides by 0,
    an inf row makes NaN, and the gate's exp(−z) overflows to inf for z < −88 by design (σ(z) is
    then 0), as torch's ops and a GPU do without a word (IEEE results are the answer, torch's);
    NumPy would warn on each. Nothing on a GPU."""
    if not flag.INTERPRETED:
        return contextlib.nullcontext()
    import numpy as np

    return np.errstate(all="ignore")


def _split_fallback(fn):
    """Run launcher `fn`; if the driver refuses a split-layout launch (an MPS share of the SMs
    too small for the grid, say), switch the process to the looped layout and run it again."""

    @functools.wraps(fn)
    def launcher(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _SplitRefused as e:
            import warnings

            warnings.warn(
                f"rmsnorm: the GPU refused a cooperative launch ({e}); using the looped layout "
                "for long rows from now on",
                RuntimeWarning,
                stacklevel=2,
            )
            _config.refuse_split()
            _launch_plans.clear()
            return fn(*args, **kwargs)

    return launcher


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
def _rms_fwd(x, residual, weight, bias, opts):
    n = x.shape[-1]
    m = x.numel() // n
    x, xs = _row_layout(x, n)
    rs = 0
    if residual is not None:
        residual, rs = _row_layout(residual, n)
    dev = x.device
    rdt = None if residual is None else residual.dtype
    wdt = None if weight is None else weight.dtype
    key = ("fwd", n, x.dtype, rdt, wdt, bias is not None, opts, dev)

    def build():
        option_flags, y_dtype, scalars = _rms_options(opts, n, x.dtype, weight)
        acc, acc_tl = _acc(x.dtype) if rdt is None else _acc(x.dtype, rdt)
        # Registers hold the widest input's tile: an fp32 residual sizes the tile as fp32.
        size_dtype = x.dtype if rdt is None or rdt.itemsize <= x.dtype.itemsize else rdt
        cfg = _config.choose("fwd", n, size_dtype, dev)
        option_flags |= flag.flags(res=rdt is not None, w=wdt is not None, b=bias is not None)
        return cfg, _launches(cfg, option_flags, {"ACC": acc_tl}), y_dtype, acc, scalars

    cfg, launches, y_dtype, acc, (k, eps, offset) = _launch_plan(key, build)
    weight, bias = _unit_stride(weight), _unit_stride(bias)
    y = torch.empty_like(x, dtype=y_dtype)
    h = None if rdt is None else torch.empty_like(x, dtype=rdt)
    rstd = torch.empty((m,), dtype=acc, device=dev)
    if m == 0:
        return y, h, rstd
    ws, cnt = (x, x) if cfg.split == 1 else _workspace(cfg, m, 1, acc, x)
    res = x if residual is None else residual
    args = (
        x, res, y, y if h is None else h, x if weight is None else weight,
        x if bias is None else bias, rstd, ws, cnt, xs, rs, m, n, k, eps,
        offset,
    )  # fmt: skip
    _launch(rms_norm_fwd_kernel, cfg, launches, m, args)
    return y, h, rstd


@_split_fallback
def rms_norm_fwd(x, weight, bias, opts, stats=True):
    """RMSNorm forward (:func:`rmsnorm.reference.rms_norm_fwd`). The kernels write the statistics
    also with ``stats=False`` (a cached GPU allocation)."""
    y, _, rstd = _rms_fwd(x, None, weight, bias, opts)
    return y, rstd


@_split_fallback
def add_rms_norm_fwd(x, residual, weight, bias, opts, stats=True):
    """Fused residual add + RMSNorm (:func:`rmsnorm.reference.add_rms_norm_fwd`)."""
    return _rms_fwd(x, residual, weight, bias, opts)


def _param_grads(x, weight, bias, need: bool):
    """(dw, db, partial columns): outputs to fill, or empty tensors where not wanted."""
    empty = x.new_empty((0,), dtype=compute_dtype(x.dtype))
    need_dw = need and weight is not None
    need_db = need and bias is not None
    # Fresh unit-stride outputs (empty_like would copy a view's layout, which the kernel ignores).
    dw = torch.empty(weight.shape, dtype=weight.dtype, device=x.device) if need_dw else empty
    db = torch.empty(bias.shape, dtype=bias.dtype, device=x.device) if need_db else empty
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
    with _quiet():
        sum_partials_kernel[grid](
            part, dw, db, rows, n, part.stride(0),
            NEED_DW=need_dw, NEED_DB=need_db, BLOCK_R=block_r, BLOCK_N=block_n, ACC=acc_tl,
            RNE=flag.INTERPRETED,
            num_warps=warps,
        )  # fmt: skip


def _bwd_buffers(cfg: Config, m: int, n: int, need_dw: bool, need_db: bool, acc, x: torch.Tensor):
    """The backward's split-row workspace and counter, and its per-program d weight / d bias
    partials (slots, N·#grads) in the accumulator dtype (x stands in when no partials are kept)."""
    ws, cnt = _workspace(cfg, m, 2, acc, x)
    ncols = n * (int(need_dw) + int(need_db))
    part = torch.empty((cfg.slots(m), ncols), dtype=acc, device=x.device) if ncols else x
    return ws, cnt, part


def _zero_grads(dw, db, need_dw, need_db):
    if need_dw:
        dw.zero_()
    if need_db:
        db.zero_()


@_split_fallback
def rms_norm_bwd(dy, x, weight, bias, rstd, dresidual, opts, input_dtype, need_weight_grad=True):
    """RMSNorm backward (:func:`rmsnorm.reference.rms_norm_bwd`)."""
    n = x.shape[-1]
    m = x.numel() // n
    x, xs = _row_layout(x, n)
    dy, dys = _row_layout(dy, n)
    drs = 0
    if dresidual is not None:
        dresidual, drs = _row_layout(dresidual, n)
    dx = torch.empty_like(x)
    dw, db, need_dw, need_db = _param_grads(x, weight, bias, need_weight_grad)
    has_w, has_dres = weight is not None, dresidual is not None
    key = ("bwd", n, x.dtype, input_dtype, has_w, has_dres, need_dw, need_db, opts, x.device)

    def build():
        option_flags, _, scalars = _rms_options(opts, n, input_dtype, weight)
        acc, acc_tl = _acc(x.dtype, input_dtype)
        cfg = _config.choose("bwd", n, x.dtype, x.device)
        option_flags |= flag.flags(res=has_dres, w=has_w, dw=need_dw, db=need_db)
        extra = {"IN": _TL[input_dtype], "ACC": acc_tl}
        return cfg, _launches(cfg, option_flags, extra), acc, acc_tl, scalars

    cfg, launches, acc, acc_tl, (k, _, offset) = _launch_plan(key, build)
    if m == 0:
        _zero_grads(dw, db, need_dw, need_db)
        return dx, dw, db
    ws, cnt, part = _bwd_buffers(cfg, m, n, need_dw, need_db, acc, x)
    weight, rstd = _unit_stride(weight), _unit_stride(rstd)
    dres = x if dresidual is None else dresidual
    args = (
        dy, x, weight if has_w else x, rstd, dres, dx, part, ws, cnt,
        dys, xs, drs, m, n, k, offset,
    )  # fmt: skip
    _launch(rms_norm_bwd_kernel, cfg, launches, m, args)
    if need_dw or need_db:
        _reduce_partials(part, dw, db, need_dw, need_db, n, acc_tl)
    return dx, dw, db


# ----------------------------------------------------------------------------------------------
# LayerNorm
# ----------------------------------------------------------------------------------------------
@_split_fallback
def layer_norm_fwd(x, weight, bias, eps, stats=True):
    """LayerNorm forward (:func:`rmsnorm.reference.layer_norm_fwd`)."""
    n = x.shape[-1]
    m = x.numel() // n
    x, xs = _row_layout(x, n)
    has_w, has_b = weight is not None, bias is not None
    key = ("ln_fwd", n, x.dtype, has_w, has_b, x.device)

    def build():
        acc, acc_tl = _acc(x.dtype)
        cfg = _config.choose("ln_fwd", n, x.dtype, x.device)
        return cfg, _launches(cfg, flag.flags(w=has_w, b=has_b), {"ACC": acc_tl}), acc

    cfg, launches, acc = _launch_plan(key, build)
    weight, bias = _unit_stride(weight), _unit_stride(bias)
    y = torch.empty_like(x)
    mean = torch.empty((m,), dtype=acc, device=x.device)
    rstd = torch.empty((m,), dtype=acc, device=x.device)
    if m == 0:
        return y, mean, rstd
    ws, cnt = _workspace(cfg, m, 3, acc, x)  # per chunk: sum, M2 and its unit
    args = (
        x, y, weight if has_w else x, bias if has_b else x, mean, rstd, ws, cnt, xs, m, n, eps,
    )  # fmt: skip
    _launch(layer_norm_fwd_kernel, cfg, launches, m, args)
    return y, mean, rstd


@_split_fallback
def layer_norm_bwd(dy, x, weight, bias, mean, rstd, need_weight_grad=True):
    """LayerNorm backward (:func:`rmsnorm.reference.layer_norm_bwd`)."""
    n = x.shape[-1]
    m = x.numel() // n
    x, xs = _row_layout(x, n)
    dy, dys = _row_layout(dy, n)
    dx = torch.empty_like(x)
    dw, db, need_dw, need_db = _param_grads(x, weight, bias, need_weight_grad)
    has_w = weight is not None
    key = ("ln_bwd", n, x.dtype, has_w, need_dw, need_db, x.device)

    def build():
        acc, acc_tl = _acc(x.dtype)
        cfg = _config.choose("ln_bwd", n, x.dtype, x.device)
        option_flags = flag.flags(w=has_w, dw=need_dw, db=need_db)
        return cfg, _launches(cfg, option_flags, {"ACC": acc_tl}), acc, acc_tl

    cfg, launches, acc, acc_tl = _launch_plan(key, build)
    if m == 0:
        _zero_grads(dw, db, need_dw, need_db)
        return dx, dw, db
    ws, cnt, part = _bwd_buffers(cfg, m, n, need_dw, need_db, acc, x)
    weight, mean, rstd = _unit_stride(weight), _unit_stride(mean), _unit_stride(rstd)
    args = (
        dy, x, weight if has_w else x, mean, rstd, dx, part, ws, cnt, dys, xs, m, n,
    )  # fmt: skip
    _launch(layer_norm_bwd_kernel, cfg, launches, m, args)
    if need_dw or need_db:
        _reduce_partials(part, dw, db, need_dw, need_db, n, acc_tl)
    return dx, dw, db


# ----------------------------------------------------------------------------------------------
# Grouped and gated RMSNorm
# ----------------------------------------------------------------------------------------------
def _gated_setup(kernel, x, in_dtype, n, g):
    """What a gated kernel's build starts from, forward and backward alike: the accumulation dtype
    (torch's, triton's) and a launch config whose block holds a group."""
    acc, acc_tl = _acc(x.dtype, in_dtype)
    cfg = _config.choose_gated(kernel, n, g, x.dtype, x.device)
    if not cfg.loop and cfg.block_n < g:
        raise ValueError(f"{cfg} holds {cfg.block_n} columns of a group of {g}: use loop=True")
    return acc, acc_tl, cfg


def _gating(gate, norm_before_gate: bool, activation: str) -> int:
    check_activation(activation)
    if gate is None:
        return 0
    return (1 if norm_before_gate else 2) + (4 if activation == "sigmoid" else 0)


def gated_rms_norm_fwd(x, gate, weight, bias, opts, gating, input_dtype=None, stats=True):
    """Grouped and gated RMSNorm forward (:func:`rmsnorm.reference.gated_rms_norm_fwd`)."""
    group_size, norm_before_gate, activation = gating
    n = x.shape[-1]
    m = x.numel() // n
    g = n if group_size is None else group_size
    in_dt = x.dtype if input_dtype is None else input_dtype
    x, xs = _row_layout(x, n)
    zs = 0
    if gate is not None:
        gate, zs = _row_layout(gate, n)
    wdt = None if weight is None else weight.dtype
    gate_code = _gating(gate, norm_before_gate, activation)
    key = (
        "gated_fwd", n, g, x.dtype, None if gate is None else gate.dtype, in_dt, wdt,
        bias is not None, opts, gate_code, x.device,
    )  # fmt: skip

    def build():
        option_flags, norm_out, scalars = _rms_options(opts, g, in_dt, weight)
        acc, acc_tl, cfg = _gated_setup("gated_fwd", x, in_dt, n, g)
        option_flags |= flag.flags(w=wdt is not None, b=bias is not None, loop=cfg.loop)
        # (reference.gated_output_dtype: the input dtype where the gate product comes last)
        y_dtype = in_dt if gate_code % 4 == 1 else norm_out
        extra = {
            "BLOCK_M": cfg.block_m, "GP": 1 if cfg.loop else _pow2(n // g),
            "BLOCK_G": cfg.block_n, "FLAGS": option_flags, "GATING": gate_code,
            "IN": _TL[in_dt], "OUT": _TL[norm_out], "ACC": acc_tl,
            "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
        }  # fmt: skip
        return cfg, extra, y_dtype, acc, scalars

    cfg, extra, y_dtype, acc, (k, eps, offset) = _launch_plan(key, build)
    weight, bias = _unit_stride(weight), _unit_stride(bias)
    y = torch.empty_like(x, dtype=y_dtype)
    rstd = torch.empty((m * (n // g),), dtype=acc, device=x.device)
    if m == 0:
        return y, rstd
    z = x if gate is None else gate
    grid = (cfg.slots(m),)
    with _quiet():
        gated_rms_norm_fwd_kernel[grid](
            x, z, y, x if weight is None else weight, x if bias is None else bias, rstd, xs, zs,
            m, n, n // g, g, k, eps, offset, **extra,
        )  # fmt: skip
    return y, rstd


def gated_rms_norm_bwd(
    dy, x, gate, weight, bias, rstd, dresidual, opts, gating, input_dtype, need_weight_grad=True
):
    """Grouped and gated RMSNorm backward (:func:`rmsnorm.reference.gated_rms_norm_bwd`)."""
    group_size, norm_before_gate, activation = gating
    n = x.shape[-1]
    m = x.numel() // n
    g = n if group_size is None else group_size
    x, xs = _row_layout(x, n)
    dy, dys = _row_layout(dy, n)
    zs = drs = 0
    if gate is not None:
        gate, zs = _row_layout(gate, n)
    if dresidual is not None:
        dresidual, drs = _row_layout(dresidual, n)
    dx = torch.empty_like(x)
    dz = x.new_empty((0,), dtype=compute_dtype(x.dtype))
    if gate is not None:
        dz = torch.empty_like(x, dtype=gate.dtype)
    dw, db, need_dw, need_db = _param_grads(x, weight, bias, need_weight_grad)
    has_w, has_b = weight is not None, bias is not None
    gate_code = _gating(gate, norm_before_gate, activation)
    key = (
        "gated_bwd", n, g, x.dtype, None if gate is None else gate.dtype, input_dtype,
        None if weight is None else weight.dtype, has_b, dresidual is not None, need_dw, need_db,
        opts, gate_code, x.device,
    )  # fmt: skip

    def build():
        option_flags, norm_out, scalars = _rms_options(opts, g, input_dtype, weight)
        acc, acc_tl, cfg = _gated_setup("gated_bwd", x, input_dtype, n, g)
        option_flags |= flag.flags(
            res=dresidual is not None, w=has_w, b=has_b, dw=need_dw, db=need_db, loop=cfg.loop
        )
        extra = {
            "BLOCK_M": cfg.block_m, "GP": 1 if cfg.loop else _pow2(n // g),
            "BLOCK_G": cfg.block_n, "FLAGS": option_flags, "GATING": gate_code,
            "IN": _TL[input_dtype], "OUT": _TL[norm_out], "ACC": acc_tl,
            "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
        }  # fmt: skip
        return cfg, extra, acc, acc_tl, scalars

    cfg, extra, acc, acc_tl, (k, _, offset) = _launch_plan(key, build)
    if m == 0:
        _zero_grads(dw, db, need_dw, need_db)
        return dx, dz, dw, db
    programs = cfg.slots(m)
    ncols = n * (int(need_dw) + int(need_db))
    part = torch.empty((programs, ncols), dtype=acc, device=x.device) if ncols else x
    weight, bias, rstd = _unit_stride(weight), _unit_stride(bias), _unit_stride(rstd)
    with _quiet():
        gated_rms_norm_bwd_kernel[(programs,)](
            dy, x, x if gate is None else gate, x if weight is None else weight,
            x if bias is None else bias, rstd, x if dresidual is None else dresidual, dx,
            dx if gate is None else dz, part, dys, xs, zs, drs, m, n, n // g, g, k, offset,
            **extra,
        )  # fmt: skip
    if need_dw or need_db:
        _reduce_partials(part, dw, db, need_dw, need_db, n, acc_tl)
    return dx, dz, dw, db
