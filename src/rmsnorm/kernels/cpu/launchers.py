"""The five launchers of the backend contract (:class:`rmsnorm._contract.Backend`) for the CPU
kernels: each reads the rows and parameters in place (nothing is copied), allocates the outputs,
and hands the kernel their addresses, strides and sizes.

float64 anywhere but in a parameter (input, residual, the output of a "llama" product with a float64
weight) and empty tensors go to the reference: the kernels compute in float32. Importing this module
loads the kernels from numba's on-disk cache, or compiles them (saying so once).
"""

from __future__ import annotations

import logging
import sys

import torch

from ... import _calls
from ... import reference as ref
from ..._contract import LAUNCHERS
from . import flags as flag
from . import kernels as K
from . import pool as _pool
from . import runtime as rt
from .pool import shared as _shared

__all__ = [name for name in LAUNCHERS if not name.startswith("gated_")]

log = logging.getLogger("rmsnorm")

_CODES = {torch.float32: flag.F32, torch.bfloat16: flag.BF16, torch.float16: flag.F16}
_PARAM_CODES = {**_CODES, torch.float64: flag.F64}  # weights and biases may also be float64
_F32 = torch.float32
# Outputs come from Tensor.new_empty / torch.empty_like (~0.55 µs) rather than torch.empty (~0.8
# µs): they also ignore torch.set_default_device, which would put an output on another device.
_F32_CPU = torch.empty(0, dtype=_F32, device="cpu")

# Below this many elements (up to four blocks of ~16 K) a call runs on its own thread: sharing it
# saves less than starting a team costs (measured in docs/cpu.md). From there on every call is
# shared by torch.get_num_threads() threads: the choice depends on the sizes and the thread count
# alone, never on a timing (which a noisy neighbour would flip).
PARALLEL_MIN = 1 << 16


def threading() -> str:
    """One line for ``rmsnorm info``: how the CPU path splits a call between threads here and now
    (torch's thread count read at this call), and from what size it streams its outputs."""
    threads = torch.get_num_threads()
    low, high = PARALLEL_MIN.bit_length() - 1, _pool.POOL_FROM.bit_length() - 1
    stores = (
        f"streaming stores from {rt.STREAM_BYTES >> 20} MiB of input and output"
        if rt.STREAM_BYTES is not None
        else "ordinary stores"
    )
    if threads < 2:
        return f"the calling thread alone (1 thread: torch.get_num_threads()); {stores}"
    team = _pool.USE_OPENMP and _pool._gomp
    where = (
        f"2^{low} to 2^{high} elements on torch's OpenMP team, from 2^{high} on the helper pool "
        "(the caller waits for no thread that has not begun a block)"
        if team
        else f"from 2^{low} elements on the helper pool ("
        + (
            "a forked process: torch's OpenMP team cannot run here"
            if sys.modules[__package__].forked
            else "USE_OPENMP is off"
            if not _pool.USE_OPENMP
            else "no OpenMP runtime of torch's found"
        )
        + ")"
    )
    return (
        f"{where}, below 2^{low} the calling thread; {threads} threads (torch.get_num_threads()), "
        "blocks of ~16 K elements (backward: ≥ 16 rows) claimed dynamically from one range per "
        f"thread, results independent of the split; {stores}"
    )


STATUS = rt.load("the CPU kernels", K.ENTRIES, rt.ENTRIES)
# The compiled entry points, called without the dispatcher's type resolution (~0.2 µs a call)
_forward, _backward = (rt.entry_point(d) for d in (K.forward, K.backward))


# ----------------------------------------------------------------------------------------------
# Plans: the output dtype, kernel flags and scalar arguments of each combination of dtypes and
# options, built once. The RMSNorm plans are keyed by the dtypes and the RMSOptions value itself
# and hold its fields as the kernel takes them: a launcher reads no option of its own.
# ----------------------------------------------------------------------------------------------
_REFERENCE = (None, 0)
_RMS_REFERENCE = (None, 0, 0, 0.0, 0.0)  # (a forward's out dtype, flags, k, eps, offset)
_RMS_BWD_REFERENCE = (None, 0, 0, 0.0)  # (a backward's dx dtype, flags, k, offset)
_rms_fwd_plans: dict[tuple, tuple] = {}
_rms_bwd_plans: dict[tuple, tuple] = {}
_ln_fwd_plans: dict[tuple, tuple] = {}
_ln_bwd_plans: dict[tuple, tuple] = {}
# A bound on the plans kept per cache (distinct ε, offset and k values each have theirs): a cache
# that reaches it starts over
_MAX_PLANS = 1024


def _keep(plans: dict, key: tuple, plan: tuple, scalars: tuple) -> tuple:
    """plans[key] = plan, unless a scalar of the key is NaN (no later key would equal it)."""
    if all(v == v for v in scalars):
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plans[key] = plan
    return plan


def _check_modes(eps_mode: str, casting_mode: str) -> None:
    ref.check_eps_mode(eps_mode)
    ref.check_casting_mode(casting_mode)


def _to_reference(op: str, dtypes: bool) -> None:
    """Say (:func:`rmsnorm._calls.fallback`) that ``op`` runs the reference: for its dtypes (a
    float64 tensor or statistic: the kernels compute in float32) or for an empty tensor."""
    why = "a float64 tensor or statistic (the kernels compute in float32)" if dtypes else "no rows"
    _calls.fallback("cpu", op, why)


def _pc(dtype: torch.dtype | None) -> int:
    """A parameter's dtype code (0 where there is none)."""
    return 0 if dtype is None else _PARAM_CODES[dtype]


def _kernel_dtypes(*dtypes: torch.dtype | None, params: tuple = ()) -> bool:
    return all(d is None or d in _CODES for d in dtypes) and all(
        p is None or p in _PARAM_CODES for p in params
    )


def _fwd_flags(xdt, ydt, wdt, bdt, norm: int, **fields) -> int:
    """The forward kernel's flags for these dtypes and norm, with RMSNorm's further ``fields``."""
    return flag.FORWARD.pack(
        x=_CODES[xdt], y=_CODES[ydt], norm=norm, w=_pc(wdt), has_w=wdt is not None,
        b=_pc(bdt), has_b=bdt is not None, **fields,
    )  # fmt: skip


def _bwd_flags(dydt, xdt, wdt, bdt, norm: int, **fields) -> int:
    """The backward kernel's flags for these dtypes and norm, with RMSNorm's further ``fields``."""
    return flag.BACKWARD.pack(
        dy=_CODES[dydt], x=_CODES[xdt], norm=norm, w=_pc(wdt), has_w=wdt is not None,
        dw=_pc(wdt), db=_pc(bdt), **fields,
    )  # fmt: skip


def _rms_options(opts: ref.RMSOptions, in_dt, wdt, backward: bool = False) -> tuple:
    """The RMS options as the numba kernels take them (a kernel cannot take the NamedTuple), for
    the input dtype ``in_dt`` (the one the casting mode rounds to) and the weight dtype ``wdt``:
    (the output dtype, the forward's or the ``backward``'s option flag fields, and the scalar
    arguments (k, eps, offset)). The one place this module reads the options: a new option is
    read here, and computed in kernels.py."""
    eps_mode, casting_mode = opts.eps_mode, opts.casting_mode
    _check_modes(eps_mode, casting_mode)
    llama = casting_mode == "llama"
    out = torch.promote_types(in_dt, wdt) if llama and wdt is not None else in_dt
    cin, cout = _CODES.get(in_dt), _CODES.get(out)  # (None: a dtype the reference serves)
    form = flag.RMS if eps_mode == "rms" else flag.MEAN_SQUARE
    if backward:
        fields = dict(eps=form, c_xhat=cin if llama else flag.F32)
    else:
        # rounding points as in reference.rms_norm_apply: "gemma" rounds once at the store;
        # "llama" rounds x·r to the input dtype and the products to the output dtype; "none"
        # rounds the input, r and every product to the input dtype. The parameters are rounded
        # to the dtype their product is taken in.
        pre, r, mul, last = {
            "gemma": (flag.F32,) * 4,
            "llama": (flag.F32, flag.F32, cin, cout),
            "none": (cin,) * 4,
        }[casting_mode]
        param = {"gemma": flag.F32, "llama": cout, "none": cin}[casting_mode]
        fields = dict(eps=form, c_pre=pre, c_r=r, c_mul=mul, c_out=last, c_param=param)
    return out, fields, (opts.k, float(opts.eps), float(opts.offset))


def _rms_fwd_plan(key: tuple) -> tuple:
    xdt, wdt, bdt, rdt, opts = key
    out, fields, (k, eps, offset) = _rms_options(opts, xdt, wdt)
    plan = _RMS_REFERENCE
    if _kernel_dtypes(xdt, rdt, out, params=(wdt, bdt)):
        flags = _fwd_flags(
            xdt, out, wdt, bdt, flag.RMS_NORM,
            r=_CODES[rdt] if rdt else 0, has_res=rdt is not None, **fields,
        )  # fmt: skip
        plan = (out, flags, k, eps, offset)
    return _keep(_rms_fwd_plans, key, plan, (eps, offset))


def _rms_bwd_plan(key: tuple) -> tuple:
    dydt, xdt, wdt, bdt, drdt, input_dtype, sdt, opts = key
    _, fields, (k, eps, offset) = _rms_options(opts, input_dtype, wdt, backward=True)
    plan = _RMS_BWD_REFERENCE
    stats_ok = sdt == _F32
    if stats_ok and _kernel_dtypes(dydt, xdt, drdt, input_dtype, params=(wdt, bdt)):
        flags = _bwd_flags(
            dydt, xdt, wdt, bdt, flag.RMS_NORM,
            dr=_CODES[drdt] if drdt else 0, has_dr=drdt is not None, **fields,
        )  # fmt: skip
        plan = (xdt, flags, k, offset)
    return _keep(_rms_bwd_plans, key, plan, (eps, offset))


def _row_layout(t: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """(t, its row stride) as the kernels read rows: a 2-D tensor with a unit last stride keeps
    its row stride (strided rows are read in place); anything else is read contiguous."""
    if t.dim() == 2 and (t.stride(1) == 1 or n == 1):
        return t, t.stride(0)
    return (t if t.is_contiguous() else t.contiguous()), n


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """(x, its row stride, n, m): x's m rows of n as the kernels read them."""
    n = x.shape[-1]
    if x.is_contiguous():  # (the common case first: a decoding-size call is mostly such code)
        return x, n, n, x.numel() // n
    x, xs = _row_layout(x, n)
    return x, xs, n, x.numel() // n


_scratch_rows = torch.empty(1024, dtype=_F32)


def _scratch(count: int) -> int:
    """The address of ``count`` float32s the kernel may write and nobody reads: the per-row
    statistics of a forward whose caller said it needs none (``stats=False``; an eager call without
    gradients), which then costs no allocation. Calls on several threads may share it: the values
    written there are never read."""
    global _scratch_rows
    rows = _scratch_rows
    if rows.shape[0] < count:
        rows = _scratch_rows = torch.empty(max(count, 2 * rows.numel()), dtype=_F32)
    return rows.data_ptr()


_NEED_DW = flag.BACKWARD.pack(need_dw=1)
_STREAM = flag.FORWARD.pack(stream=1)
_STREAM_BWD = flag.BACKWARD.pack(stream=1)
# From this many bytes of input and output together, a call streams its outputs past the caches
# (runtime.stream_rule); never where it is None
_STREAM_AT = rt.STREAM_BYTES if rt.STREAM_BYTES is not None else 1 << 62
_NEED_DB = flag.BACKWARD.pack(need_db=1)


def _ln_fwd_plan(key: tuple) -> tuple:
    xdt, wdt, bdt = key
    plan = _REFERENCE
    if _kernel_dtypes(xdt, params=(wdt, bdt)):
        flags = _fwd_flags(xdt, xdt, wdt, bdt, flag.LAYER_NORM)
        plan = (xdt, flags)
    _ln_fwd_plans[key] = plan
    return plan


# The launchers below are written nearly flat (one helper call for x's rows; two more in the
# backward, for the parameter gradients): at decoding sizes each Python-level step (~0.05-0.2 µs)
# is a visible part of the call.
# ----------------------------------------------------------------------------------------------
# RMSNorm
# ----------------------------------------------------------------------------------------------
def _fwd(x, residual, weight, bias, out, k, eps, offset, flags, stats, layer_norm=False):
    """The forward kernel's call for the three forward launchers: (y, h, mean, rstd) with h None
    without a residual, mean None for RMSNorm, and the statistics None where ``stats`` is false
    (the kernel then writes them to scratch). ``eps`` and ``offset`` are Python floats."""
    x, xs, n, m = _rows(x)
    rp = rs = hp = mp = wp = ws = bp = bs = 0
    h = mean = rstd = None
    if residual is not None:
        residual, rs = _row_layout(residual, n)
        h = torch.empty_like(x, dtype=residual.dtype)
        rp, hp = residual.data_ptr(), h.data_ptr()
    if weight is not None:
        wp, ws = weight.data_ptr(), weight.stride(0)
    if bias is not None:
        bp, bs = bias.data_ptr(), bias.stride(0)
    y = torch.empty_like(x) if out is x.dtype else torch.empty_like(x, dtype=out)
    if stats:
        rstd = _F32_CPU.new_empty(m)
        sp = rstd.data_ptr()
        if layer_norm:
            mean = _F32_CPU.new_empty(m)
            mp = mean.data_ptr()
    else:
        sp = _scratch(2 * m)
        mp = sp + 4 * m if layer_norm else 0
    # (the first test spares a decoding-size call the element sizes: 24 bytes bounds the element
    # of any call's tensors together)
    if m * n * 24 >= _STREAM_AT and m * n * (x.element_size() + y.element_size()) >= _STREAM_AT:
        flags |= _STREAM
    if m * n < PARALLEL_MIN:  # the decoding-size case: called directly, no argument tuple
        _forward(
            0, x.data_ptr(), xs, rp, rs, hp, y.data_ptr(), wp, ws, bp, bs, mp, sp, m, n, k, eps,
            offset, flags,
        )  # fmt: skip
    else:
        _shared(
            _forward, x.data_ptr(), xs, rp, rs, hp, y.data_ptr(), wp, ws, bp, bs, mp, sp, m, n,
            k, eps, offset, flags, elements=m * n,
        )  # fmt: skip
    return y, h, mean, rstd


def rms_norm_fwd(x, weight, bias, opts, stats=True):
    """RMSNorm forward (:func:`rmsnorm.reference.rms_norm_fwd`)."""
    key = (
        x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype,
        None, opts,
    )  # fmt: skip
    out, flags, k, eps, offset = _rms_fwd_plans.get(key) or _rms_fwd_plan(key)
    if out is None or not x.numel():
        _to_reference("rms_norm_fwd", out is None)
        return ref.rms_norm_fwd(x, weight, bias, opts)
    y, _, _, rstd = _fwd(x, None, weight, bias, out, k, eps, offset, flags, stats)
    return y, rstd


def add_rms_norm_fwd(x, residual, weight, bias, opts, stats=True):
    """Residual add + RMSNorm forward (:func:`rmsnorm.reference.add_rms_norm_fwd`)."""
    key = (
        x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype,
        residual.dtype, opts,
    )  # fmt: skip
    out, flags, k, eps, offset = _rms_fwd_plans.get(key) or _rms_fwd_plan(key)
    if out is None or not x.numel():
        _to_reference("add_rms_norm_fwd", out is None)
        return ref.add_rms_norm_fwd(x, residual, weight, bias, opts)
    y, h, _, rstd = _fwd(x, residual, weight, bias, out, k, eps, offset, flags, stats)
    return y, h, rstd


def _param_grad(param, need: bool, n: int) -> tuple[torch.Tensor, int]:
    """(the n-element gradient of param, in its dtype, and its address) where it is wanted; (an
    empty float32 tensor, 0) where not."""
    if need and param is not None:
        grad = param.new_empty(n)
        return grad, grad.data_ptr()
    return _F32_CPU.new_empty(0), 0


def _bwd(dy, x, weight, bias, mean, rstd, dresidual, k, offset, flags, need_weight_grad):
    """The backward kernel's call: (dx, dw, db) with empty float32 tensors for absent gradients
    (``offset`` a Python float)."""
    x, xs, n, m = _rows(x)
    dy, dys = (dy, n) if dy.is_contiguous() else _row_layout(dy, n)
    drp = drs = meanp = wp = ws = 0
    if dresidual is not None:
        dresidual, drs = _row_layout(dresidual, n)
        drp = dresidual.data_ptr()
    if not rstd.is_contiguous():
        rstd = rstd.contiguous()
    if mean is not None:
        mean = mean if mean.is_contiguous() else mean.contiguous()
        meanp = mean.data_ptr()
    dx = torch.empty_like(x)
    dw, dwp = _param_grad(weight, need_weight_grad, n)
    db, dbp = _param_grad(bias, need_weight_grad, n)
    flags |= (_NEED_DW if dwp else 0) | (_NEED_DB if dbp else 0)
    if m * n * 24 >= _STREAM_AT:  # (as in _fwd)
        if m * n * (2 * x.element_size() + dy.element_size()) >= _STREAM_AT:
            flags |= _STREAM_BWD
    if weight is not None:
        wp, ws = weight.data_ptr(), weight.stride(0)
    if m * n < PARALLEL_MIN:  # the decoding-size case: called directly, no argument tuple
        _backward(
            0, dy.data_ptr(), dys, x.data_ptr(), xs, drp, drs, dx.data_ptr(), wp, ws, meanp,
            rstd.data_ptr(), dwp, dbp, m, n, k, offset, flags,
        )  # fmt: skip
    else:
        _shared(
            _backward, dy.data_ptr(), dys, x.data_ptr(), xs, drp, drs, dx.data_ptr(), wp, ws,
            meanp, rstd.data_ptr(), dwp, dbp, m, n, k, offset, flags, elements=m * n,
        )  # fmt: skip
    return dx, dw, db


def rms_norm_bwd(dy, x, weight, bias, rstd, dresidual, opts, input_dtype, need_weight_grad=True):
    """RMSNorm backward (:func:`rmsnorm.reference.rms_norm_bwd`)."""
    key = (
        dy.dtype, x.dtype, None if weight is None else weight.dtype,
        None if bias is None else bias.dtype, None if dresidual is None else dresidual.dtype,
        input_dtype, rstd.dtype, opts,
    )  # fmt: skip
    dxdt, flags, k, offset = _rms_bwd_plans.get(key) or _rms_bwd_plan(key)
    if dxdt is None or not x.numel():
        _to_reference("rms_norm_bwd", dxdt is None)
        return ref.rms_norm_bwd(
            dy, x, weight, bias, rstd, dresidual, opts, input_dtype, need_weight_grad
        )
    return _bwd(dy, x, weight, bias, None, rstd, dresidual, k, offset, flags, need_weight_grad)


# ----------------------------------------------------------------------------------------------
# LayerNorm
# ----------------------------------------------------------------------------------------------
def layer_norm_fwd(x, weight, bias, eps, stats=True):
    """LayerNorm forward (:func:`rmsnorm.reference.layer_norm_fwd`)."""
    key = (x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype)
    out, flags = _ln_fwd_plans.get(key) or _ln_fwd_plan(key)
    if out is None or not x.numel():
        _to_reference("layer_norm_fwd", out is None)
        return ref.layer_norm_fwd(x, weight, bias, eps)
    n = x.shape[-1]
    y, _, mean, rstd = _fwd(x, None, weight, bias, out, n, float(eps), 0.0, flags, stats, True)
    return y, mean, rstd


def layer_norm_bwd(dy, x, weight, bias, mean, rstd, need_weight_grad=True):
    """LayerNorm backward (:func:`rmsnorm.reference.layer_norm_bwd`)."""
    key = (
        dy.dtype, x.dtype, None if weight is None else weight.dtype,
        None if bias is None else bias.dtype, mean.dtype, rstd.dtype,
    )  # fmt: skip
    dxdt, flags = _ln_bwd_plans.get(key) or _ln_bwd_plan(key)
    if dxdt is None or not x.numel():
        _to_reference("layer_norm_bwd", dxdt is None)
        return ref.layer_norm_bwd(dy, x, weight, bias, mean, rstd, need_weight_grad)
    return _bwd(dy, x, weight, bias, mean, rstd, None, x.shape[-1], 0.0, flags, need_weight_grad)


def _ln_bwd_plan(key: tuple) -> tuple:
    dydt, xdt, wdt, bdt, meandt, sdt = key
    plan = _REFERENCE
    if meandt == _F32 and sdt == _F32 and _kernel_dtypes(dydt, xdt, params=(wdt, bdt)):
        flags = _bwd_flags(dydt, xdt, wdt, bdt, flag.LAYER_NORM)
        plan = (xdt, flags)
    _ln_bwd_plans[key] = plan
    return plan
