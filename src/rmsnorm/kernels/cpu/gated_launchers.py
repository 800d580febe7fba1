"""The grouped / gated launchers of the backend contract (:class:`rmsnorm._contract.Backend`) for
the CPU kernels of :mod:`.gated`: rows and parameters read in place, outputs allocated, the call
shared between threads as the plain launchers share theirs (:func:`.pool.shared`).

float64 rows (input, or a ``"llama"`` product with a float64 weight) and empty tensors go to the
reference, as in the plain launchers; a float64 gate of a float32 input is read by the kernels
(rounded to float32, as the spec reads it). Importing this module loads the kernels from numba's
on-disk cache, or compiles them (saying so once).
"""

from __future__ import annotations

import logging

import torch

from ... import reference as ref
from . import flags as flag
from . import gated as G
from . import launchers as L
from . import runtime as rt

__all__ = ["gated_rms_norm_fwd", "gated_rms_norm_bwd"]

log = logging.getLogger("rmsnorm")
_CAST = flag.CASTING_MODES


STATUS = rt.load("the grouped and gated RMSNorm kernels", G.ENTRIES)
_forward, _backward = (rt.entry_point(d) for d in (G.forward, G.backward))
_FWD_BLOCK, _BWD_BLOCK = G.FWD_BLOCK.address, G.BWD_BLOCK.address

# Plans, keyed by the dtypes and the RMSOptions and GateOptions values: (the output (forward) or
# dx (backward) dtype, the kernel flags, k, and eps (forward only) and offset as the kernel takes
# them), as in launchers.py
_fwd_plans: dict[tuple, tuple] = {}
_bwd_plans: dict[tuple, tuple] = {}
_REFERENCE = L._RMS_REFERENCE
_BWD_REFERENCE = L._RMS_BWD_REFERENCE


def _rms_options(opts, gating, in_dt, wdt, bdt, zdt) -> tuple:
    """The options as the numba kernels take them (a kernel cannot take the NamedTuples), for
    the input dtype ``in_dt`` (the one the casting mode rounds to), the parameters' and the
    gate's: (the flag fields the forward and backward share, or None where the norm's output
    dtype has no kernel; that dtype; the scalar arguments (k, eps, offset)). The one place this
    module reads the options: a new option is read here, and computed in gated.py."""
    eps_mode, casting_mode, activation = opts.eps_mode, opts.casting_mode, gating.activation
    L._check_modes(eps_mode, casting_mode)
    ref.check_activation(activation)
    scalars = (opts.k, float(opts.eps), float(opts.offset))
    # the norm's output dtype (reference.output_dtype): promote(input, weight) in "llama"
    norm_out = in_dt
    if casting_mode == "llama" and wdt is not None:
        norm_out = torch.promote_types(in_dt, wdt)
    cin, cout = L._CODES.get(in_dt), L._CODES.get(norm_out)
    if cin is None or cout is None:
        return None, norm_out, scalars
    param = {"gemma": flag.F32, "llama": cout, "none": cin}[casting_mode]
    gate_first = zdt is not None and not gating.norm_before_gate
    fields = dict(
        z=L._pc(zdt), c_in=cin, c_out=cout, cast=_CAST[casting_mode], has_gate=zdt is not None,
        first=gate_first, sigmoid=activation == "sigmoid", eps=eps_mode == "rms",
        w=L._pc(wdt), has_w=wdt is not None, b=L._pc(bdt), has_b=bdt is not None,
        c_param=param, gated=1,
    )  # fmt: skip
    return fields, norm_out, scalars


def _fwd_plan(key: tuple) -> tuple:
    xdt, zdt, wdt, bdt, in_dt, opts, gating = key
    fields, norm_out, (k, eps, offset) = _rms_options(opts, gating, in_dt, wdt, bdt, zdt)
    plan = _REFERENCE
    if L._kernel_dtypes(xdt, in_dt, params=(wdt, bdt, zdt)):
        if fields is not None:
            # (the options as _rms_options gives them to the kernel)
            cast, gate_first, sigmoid = (fields[f] for f in ("cast", "first", "sigmoid"))
            gate_last = zdt is not None and not gate_first
            out = in_dt if gate_last else norm_out
            cin, cx = L._CODES[in_dt], L._CODES[xdt]
            # the fused loops of gated.py: the output loop reads the raw gate where it has the
            # input's dtype; gate-first's input loop reads x and the gate, both of that dtype
            raw = gate_last and zdt == in_dt == xdt
            gate = G.NO_GATE if not gate_last else G.PRE
            if raw:
                gate = G.RAW_SIGMOID if sigmoid else G.RAW_SILU
            outv = G.out_variant(cast, cin, L._CODES[norm_out], gate)
            if raw and outv < 0:  # no raw-gate loop for these dtypes: the precomputed one
                raw, outv = False, G.out_variant(cast, cin, L._CODES[norm_out], G.PRE)
            inv = -1
            if gate_first and zdt == in_dt == xdt:
                inv = G.in_variant(cx, sigmoid, cast == flag.NONE)
            flags = flag.GATED.pack(
                x=cx, y=L._CODES[out], out_variant=outv + 1, in_variant=inv + 1, raw=raw,
                **fields,
            )  # fmt: skip
            plan = (out, flags, k, eps, offset)
    return L._keep(_fwd_plans, key, plan, (eps, offset))


def gated_rms_norm_fwd(x, gate, weight, bias, opts, gating, input_dtype=None, stats=True):
    """Grouped and gated RMSNorm forward (:func:`rmsnorm.reference.gated_rms_norm_fwd`)."""
    in_dt = x.dtype if input_dtype is None else input_dtype
    key = (
        x.dtype, None if gate is None else gate.dtype, None if weight is None else weight.dtype,
        None if bias is None else bias.dtype, in_dt, opts, gating,
    )  # fmt: skip
    out, flags, k, eps, offset = _fwd_plans.get(key) or _fwd_plan(key)
    n = x.shape[-1]
    m = x.numel() // n if n else 0
    if out is None or not m:
        L._to_reference("gated_rms_norm_fwd", out is None)
        return ref.gated_rms_norm_fwd(x, gate, weight, bias, opts, gating, input_dtype, stats)
    group_size = gating.group_size
    g = n if group_size is None else group_size
    if x.is_contiguous():
        xs = n
    else:
        x, xs = L._row_layout(x, n)
    zp = zs = wp = ws = bp = bs = 0
    if gate is not None:
        gate, zs = L._row_layout(gate, n)
        zp = gate.data_ptr()
    if weight is not None:
        wp, ws = weight.data_ptr(), weight.stride(0)
    if bias is not None:
        bp, bs = bias.data_ptr(), bias.stride(0)
    y = torch.empty_like(x) if out is x.dtype else torch.empty_like(x, dtype=out)
    count = m * (n // g)
    if stats:
        rstd = L._F32_CPU.new_empty(count)
        rp = rstd.data_ptr()
    else:
        rstd = None
        rp = L._scratch(count)
    args = (
        _FWD_BLOCK, x.data_ptr(), xs, zp, zs, y.data_ptr(), wp, ws, bp, bs, rp, m, n, g, k, eps,
        offset, flags,
    )  # fmt: skip
    if m * n < L.PARALLEL_MIN:
        _forward(0, *args)
    else:
        L._shared(_forward, *args, elements=m * n)
    return y, rstd


def _bwd_plan(key: tuple) -> tuple:
    dydt, xdt, zdt, wdt, bdt, drdt, in_dt, sdt, opts, gating = key
    fields, _, (k, eps, offset) = _rms_options(opts, gating, in_dt, wdt, bdt, zdt)
    plan = _BWD_REFERENCE
    if sdt == torch.float32 and L._kernel_dtypes(dydt, xdt, drdt, in_dt, params=(wdt, bdt, zdt)):
        if fields is not None:
            flags = flag.GATED.pack(
                x=L._CODES[xdt], dy=L._CODES[dydt], dr=L._CODES[drdt] if drdt else 0,
                has_dr=drdt is not None, dz=L._pc(zdt), **fields,
            )  # fmt: skip
            plan = (xdt, flags, k, offset)
    return L._keep(_bwd_plans, key, plan, (eps, offset))


_NEED_DW = flag.GATED.pack(need_dw=1)
_NEED_DB = flag.GATED.pack(need_db=1)


def gated_rms_norm_bwd(
    dy, x, gate, weight, bias, rstd, dresidual, opts, gating, input_dtype, need_weight_grad=True
):
    """Grouped and gated RMSNorm backward (:func:`rmsnorm.reference.gated_rms_norm_bwd`)."""
    key = (
        dy.dtype, x.dtype, None if gate is None else gate.dtype,
        None if weight is None else weight.dtype, None if bias is None else bias.dtype,
        None if dresidual is None else dresidual.dtype, input_dtype, rstd.dtype, opts, gating,
    )  # fmt: skip
    dxdt, flags, k, offset = _bwd_plans.get(key) or _bwd_plan(key)
    if dxdt is None or not x.numel():
        L._to_reference("gated_rms_norm_bwd", dxdt is None)
        return ref.gated_rms_norm_bwd(
            dy, x, gate, weight, bias, rstd, dresidual, opts, gating, input_dtype, need_weight_grad
        )
    n = x.shape[-1]
    m = x.numel() // n
    group_size = gating.group_size
    g = n if group_size is None else group_size
    x, xs = L._row_layout(x, n)
    dy, dys = L._row_layout(dy, n)
    zp = zs = drp = drs = wp = ws = bp = bs = 0
    if gate is not None:
        gate, zs = L._row_layout(gate, n)
        zp = gate.data_ptr()
    if dresidual is not None:
        dresidual, drs = L._row_layout(dresidual, n)
        drp = dresidual.data_ptr()
    if not rstd.is_contiguous():
        rstd = rstd.contiguous()
    empty = L._F32_CPU.new_empty(0)
    dx = torch.empty_like(x)
    dz = torch.empty_like(x, dtype=gate.dtype) if gate is not None else L._F32_CPU.new_empty(0)
    if need_weight_grad and weight is not None:
        dw = weight.new_empty(n)
        flags |= _NEED_DW
    else:
        dw = empty
    if need_weight_grad and bias is not None:
        db = bias.new_empty(n)
        flags |= _NEED_DB
    else:
        db = L._F32_CPU.new_empty(0)
    if weight is not None:
        wp, ws = weight.data_ptr(), weight.stride(0)
    if bias is not None:
        bp, bs = bias.data_ptr(), bias.stride(0)
    args = (
        _BWD_BLOCK, dy.data_ptr(), dys, x.data_ptr(), xs, zp, zs, drp, drs, dx.data_ptr(),
        dz.data_ptr(), wp, ws, bp, bs, rstd.data_ptr(), dw.data_ptr(), db.data_ptr(), m, n, g,
        k, offset, flags,
    )  # fmt: skip
    if m * n < L.PARALLEL_MIN:
        _backward(0, *args)
    else:
        L._shared(_backward, *args, elements=m * n)
    return dx, dz, dw, db
