"""The ``torch.library`` custom ops: schemas, the checks their kernels rely on, fake (meta)
implementations and autograd.

Every op takes its tensors in their own shape, with ``norm_dims`` trailing dims normalized (one row
of N elements per position of the leading dims), and returns fresh tensors: outputs keep the
input's shape and the per-row statistics have the leading shape, so ``torch.compile`` /
``torch.export`` see one opaque node per op and DTensor can shard the leading dims. The low-level
``torch.library.Library`` registration is used instead of the ``@custom_op`` decorator: its per-call
Python overhead is several times smaller. Which implementation runs is decided per call by
:mod:`rmsnorm._backend`; :mod:`rmsnorm._launch` calls it.
"""

from __future__ import annotations

from typing import get_args, get_type_hints

import torch

from . import _autograd, _dtensor, _launch
from ._contract import LAUNCHERS
from ._opcall import call
from .reference import (
    GateOptions,
    RMSOptions,
    check_activation,
    check_casting_mode,
    check_eps_mode,
    compute_dtype,
    gated_output_dtype,
    output_dtype,
)

_lib = torch.library.Library("rmsnorm", "DEF")  # noqa: TOR901 (module-lifetime registration)


def _schema_args(value: type) -> str:
    """A NamedTuple's fields as schema arguments, one per field (a schema has no record type):
    ``float eps``, and ``int? group_size`` for an ``int | None``."""
    args = []
    for name, t in get_type_hints(value).items():
        kinds = [a for a in get_args(t) if a is not type(None)] or [t]
        args.append(f"{kinds[0].__name__}{'?' if kinds[0] is not t else ''} {name}")
    return ", ".join(args)


# The schemas take RMSOptions and GateOptions flattened, one argument per field: these strings,
# and rmsnorm._opcall, are the one place that flattens them.
_RMS_ARGS = _schema_args(RMSOptions)
_NOPTS, _NGATE = len(RMSOptions._fields), len(GateOptions._fields)
_NO_OPTION_GRADS = (None,) * _NOPTS
_lib.define(
    "rms_norm_fwd(Tensor x, int norm_dims, Tensor? weight, Tensor? bias, "
    f"{_RMS_ARGS}) -> (Tensor, Tensor)"
)
_lib.define(
    "add_rms_norm_fwd(Tensor x, Tensor residual, int norm_dims, Tensor? weight, Tensor? bias, "
    f"{_RMS_ARGS}) -> (Tensor, Tensor, Tensor)"
)
_lib.define(
    "rms_norm_bwd(Tensor dy, Tensor x, int norm_dims, Tensor? weight, Tensor? bias, Tensor rstd, "
    f"Tensor? dresidual, {_RMS_ARGS}, ScalarType input_dtype, bool need_weight_grad) "
    "-> (Tensor, Tensor, Tensor)"
)
_lib.define(
    "layer_norm_fwd(Tensor x, int norm_dims, Tensor? weight, Tensor? bias, float eps) "
    "-> (Tensor, Tensor, Tensor)"
)
_lib.define(
    "layer_norm_bwd(Tensor dy, Tensor x, int norm_dims, Tensor? weight, Tensor? bias, "
    "Tensor mean, Tensor rstd, bool need_weight_grad) -> (Tensor, Tensor, Tensor)"
)

_GATED_ARGS = f"{_RMS_ARGS}, {_schema_args(GateOptions)}"
_lib.define(
    "gated_rms_norm_fwd(Tensor x, Tensor? gate, int norm_dims, Tensor? weight, Tensor? bias, "
    f"{_GATED_ARGS}, ScalarType? input_dtype) -> (Tensor, Tensor)"
)
_lib.define(
    "gated_rms_norm_bwd(Tensor dy, Tensor x, Tensor? gate, int norm_dims, Tensor? weight, "
    f"Tensor? bias, Tensor rstd, Tensor? dresidual, {_GATED_ARGS}, ScalarType input_dtype, "
    "bool need_weight_grad) -> (Tensor, Tensor, Tensor, Tensor)"
)

OP_NAMES = LAUNCHERS  # one op per launcher of the backend contract

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


# ----------------------------------------------------------------------------------------------
# Checks: the ops are public through torch.ops, so they verify what their kernels rely on (a
# weight shorter than a row would otherwise be read past its end). The functional API validates
# with friendlier messages first and calls the kernels without repeating these.
# ----------------------------------------------------------------------------------------------
def _fail(op: str, message: str) -> None:
    raise ValueError(f"rmsnorm.{op}: {message}")


def _check_rows(op: str, x: torch.Tensor, norm_dims: int, name: str = "x") -> int:
    """N, the elements of one row; x must be floating point with at least norm_dims dims."""
    if x.dtype not in _FLOATS:
        _fail(op, f"{name} must be float32, bfloat16, float16 or float64, got {x.dtype}")
    if not 1 <= norm_dims <= x.dim():
        _fail(op, f"norm_dims must be in [1, {name}.dim()={x.dim()}], got {norm_dims}")
    n = 1
    for d in x.shape[x.dim() - norm_dims :]:
        n *= d
    if n == 0:
        _fail(op, f"the normalized dims of {name} {list(x.shape)} hold no elements")
    return n


def _check_same(op: str, t: torch.Tensor | None, x: torch.Tensor, name: str) -> None:
    if t is None:
        return
    if t.shape != x.shape:
        _fail(op, f"{name} must have the shape of x {list(x.shape)}, got {list(t.shape)}")
    if t.dtype not in _FLOATS:
        _fail(op, f"{name} must be a floating-point tensor, got {t.dtype}")
    if t.device != x.device:
        _fail(op, f"{name} is on {t.device} but x is on {x.device}")


def _check_param(op: str, p: torch.Tensor | None, x: torch.Tensor, n: int, name: str) -> None:
    if p is None:
        return
    if p.numel() != n:
        _fail(op, f"{name} must hold one element per row element (N={n}), got {p.numel()}")
    if p.dtype not in _FLOATS:
        _fail(op, f"{name} must be a floating-point tensor, got {p.dtype}")
    if p.device != x.device:
        _fail(op, f"{name} is on {p.device} but x is on {x.device}")


def _check_stat(op: str, s: torch.Tensor, x: torch.Tensor, n: int, name: str) -> None:
    """s must hold one float32/float64 value per row of x (rows of n elements), on x's device."""
    rows = x.numel() // n
    if s.numel() != rows:
        _fail(op, f"{name} must hold one value per row ({rows}), got {s.numel()}")
    if s.dtype not in (torch.float32, torch.float64):
        _fail(op, f"{name} must be float32 or float64, got {s.dtype}")
    if s.device != x.device:
        _fail(op, f"{name} is on {s.device} but x is on {x.device}")


def _check_rms(op: str, opts: RMSOptions, n: int) -> None:
    eps, eps_mode, casting_mode, _, k = opts
    check_eps_mode(eps_mode, f"rmsnorm.{op}: ")
    check_casting_mode(casting_mode, f"rmsnorm.{op}: ")
    if not 1 <= k <= n:
        _fail(op, f"k must be in [1, N={n}], got {k}")
    if not eps >= 0.0:
        _fail(op, f"eps must be >= 0, got {eps}")


# ----------------------------------------------------------------------------------------------
# Device implementations: check, then launch on the backend chosen for the tensor's device.
# ----------------------------------------------------------------------------------------------
def _rms_norm_fwd(x, norm_dims, weight, bias, *options):
    opts = RMSOptions._make(options)
    n = _check_rows("rms_norm_fwd", x, norm_dims)
    _check_param("rms_norm_fwd", weight, x, n, "weight")
    _check_param("rms_norm_fwd", bias, x, n, "bias")
    _check_rms("rms_norm_fwd", opts, n)
    y, rstd = _launch.rms_norm_fwd(x, norm_dims, weight, bias, opts)
    return y, _launch.leading(rstd, x, norm_dims)


def _add_rms_norm_fwd(x, residual, norm_dims, weight, bias, *options):
    opts = RMSOptions._make(options)
    n = _check_rows("add_rms_norm_fwd", x, norm_dims)
    _check_same("add_rms_norm_fwd", residual, x, "residual")
    _check_param("add_rms_norm_fwd", weight, x, n, "weight")
    _check_param("add_rms_norm_fwd", bias, x, n, "bias")
    _check_rms("add_rms_norm_fwd", opts, n)
    y, h, rstd = _launch.add_rms_norm_fwd(x, residual, norm_dims, weight, bias, opts)
    return y, h, _launch.leading(rstd, x, norm_dims)


def _rms_norm_bwd(dy, x, norm_dims, weight, bias, rstd, dresidual, *rest):
    opts, (input_dtype, need_weight_grad) = RMSOptions._make(rest[:_NOPTS]), rest[_NOPTS:]
    n = _check_rows("rms_norm_bwd", x, norm_dims)
    _check_same("rms_norm_bwd", dy, x, "dy")
    _check_same("rms_norm_bwd", dresidual, x, "dresidual")
    _check_param("rms_norm_bwd", weight, x, n, "weight")
    _check_param("rms_norm_bwd", bias, x, n, "bias")
    _check_stat("rms_norm_bwd", rstd, x, n, "rstd")
    _check_rms("rms_norm_bwd", opts, n)
    return _launch.rms_norm_bwd(
        dy, x, norm_dims, weight, bias, rstd, dresidual, opts, input_dtype, need_weight_grad
    )


def _layer_norm_fwd(x, norm_dims, weight, bias, eps):
    n = _check_rows("layer_norm_fwd", x, norm_dims)
    _check_param("layer_norm_fwd", weight, x, n, "weight")
    _check_param("layer_norm_fwd", bias, x, n, "bias")
    if not eps >= 0.0:
        _fail("layer_norm_fwd", f"eps must be >= 0, got {eps}")
    y, mean, rstd = _launch.layer_norm_fwd(x, norm_dims, weight, bias, eps)
    return y, _launch.leading(mean, x, norm_dims), _launch.leading(rstd, x, norm_dims)


def _layer_norm_bwd(dy, x, norm_dims, weight, bias, mean, rstd, need_weight_grad):
    n = _check_rows("layer_norm_bwd", x, norm_dims)
    _check_same("layer_norm_bwd", dy, x, "dy")
    _check_param("layer_norm_bwd", weight, x, n, "weight")
    _check_param("layer_norm_bwd", bias, x, n, "bias")
    _check_stat("layer_norm_bwd", mean, x, n, "mean")
    _check_stat("layer_norm_bwd", rstd, x, n, "rstd")
    return _launch.layer_norm_bwd(dy, x, norm_dims, weight, bias, mean, rstd, need_weight_grad)


def _check_gated(op: str, x, n: int, opts: RMSOptions, gating: GateOptions) -> int:
    """G, the groups of a row of n elements; group_size must divide n, k fit in a group."""
    group_size, _, activation = gating
    check_activation(activation, f"rmsnorm.{op}: ")
    if group_size is None:
        return 1
    if group_size < 1 or n % group_size:
        _fail(op, f"group_size must divide the row size N={n}, got {group_size}")
    if opts.k > group_size:
        _fail(op, f"k must be in [1, group_size={group_size}], got {opts.k}")
    return n // group_size


def _gated_split(rest: tuple) -> tuple[RMSOptions, GateOptions, tuple]:
    """(options, gating, what follows) of a gated op's arguments after its tensors."""
    end = _NOPTS + _NGATE
    return RMSOptions._make(rest[:_NOPTS]), GateOptions._make(rest[_NOPTS:end]), rest[end:]


def _gated_rms_norm_fwd(x, gate, norm_dims, weight, bias, *rest):
    opts, gating, (input_dtype,) = _gated_split(rest)
    op = "gated_rms_norm_fwd"
    n = _check_rows(op, x, norm_dims)
    _check_same(op, gate, x, "gate")
    _check_param(op, weight, x, n, "weight")
    _check_param(op, bias, x, n, "bias")
    _check_rms(op, opts, n)
    g = _check_gated(op, x, n, opts, gating)
    y, rstd = _launch.gated_rms_norm_fwd(
        x, gate, norm_dims, weight, bias, opts, gating, input_dtype
    )
    return y, _launch.leading_groups(rstd, x, norm_dims, g)


def _gated_rms_norm_bwd(dy, x, gate, norm_dims, weight, bias, rstd, dresidual, *rest):
    opts, gating, (input_dtype, need_weight_grad) = _gated_split(rest)
    op = "gated_rms_norm_bwd"
    n = _check_rows(op, x, norm_dims)
    _check_same(op, dy, x, "dy")
    _check_same(op, gate, x, "gate")
    _check_same(op, dresidual, x, "dresidual")
    _check_param(op, weight, x, n, "weight")
    _check_param(op, bias, x, n, "bias")
    _check_rms(op, opts, n)
    g = _check_gated(op, x, n, opts, gating)
    _check_stat(op, rstd, x, n // g, "rstd")
    tensors = (dy, x, gate, norm_dims, weight, bias, rstd, dresidual)
    return _launch.gated_rms_norm_bwd(*tensors, opts, gating, input_dtype, need_weight_grad)


_IMPLS = {
    "gated_rms_norm_fwd": _gated_rms_norm_fwd,
    "gated_rms_norm_bwd": _gated_rms_norm_bwd,
    "rms_norm_fwd": _rms_norm_fwd,
    "add_rms_norm_fwd": _add_rms_norm_fwd,
    "rms_norm_bwd": _rms_norm_bwd,
    "layer_norm_fwd": _layer_norm_fwd,
    "layer_norm_bwd": _layer_norm_bwd,
}
for _name, _impl in _IMPLS.items():
    # CPU and CUDA (ROCm too) have kernels; every other device runs the reference on the device.
    for _key in ("CPU", "CUDA", "CompositeExplicitAutograd"):
        _lib.impl(_name, _impl, _key)


# ----------------------------------------------------------------------------------------------
# Fake implementations: shapes and dtypes only (torch.compile, export, opcheck).
# ----------------------------------------------------------------------------------------------
def _stat_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """Per-row statistics: fp32, fp64 when any involved dtype is fp64."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _stat(x: torch.Tensor, norm_dims: int, dtype: torch.dtype) -> torch.Tensor:
    return x.new_empty(x.shape[: x.dim() - norm_dims], dtype=dtype)


def _param_grad(x: torch.Tensor, p: torch.Tensor | None, need: bool) -> torch.Tensor:
    if p is None or not need:
        return x.new_empty((0,), dtype=compute_dtype(x.dtype))
    return p.new_empty(p.shape)


@torch.library.register_fake("rmsnorm::rms_norm_fwd")
def _(x, norm_dims, weight, bias, *options):
    casting_mode = RMSOptions._make(options).casting_mode
    y = x.new_empty(x.shape, dtype=output_dtype(x.dtype, weight, casting_mode))
    return y, _stat(x, norm_dims, _stat_dtype(x.dtype))


@torch.library.register_fake("rmsnorm::add_rms_norm_fwd")
def _(x, residual, norm_dims, weight, bias, *options):
    casting_mode = RMSOptions._make(options).casting_mode
    y = x.new_empty(x.shape, dtype=output_dtype(x.dtype, weight, casting_mode))
    h = residual.new_empty(residual.shape)
    return y, h, _stat(x, norm_dims, _stat_dtype(x.dtype, residual.dtype))


@torch.library.register_fake("rmsnorm::rms_norm_bwd")
def _(dy, x, norm_dims, weight, bias, rstd, dresidual, *rest):
    need_weight_grad = rest[-1]
    dx = x.new_empty(x.shape)
    return dx, _param_grad(x, weight, need_weight_grad), _param_grad(x, bias, need_weight_grad)


@torch.library.register_fake("rmsnorm::layer_norm_fwd")
def _(x, norm_dims, weight, bias, eps):
    mean = _stat(x, norm_dims, _stat_dtype(x.dtype))
    return x.new_empty(x.shape), mean, mean.new_empty(mean.shape)


@torch.library.register_fake("rmsnorm::layer_norm_bwd")
def _(dy, x, norm_dims, weight, bias, mean, rstd, need_weight_grad):
    dx = x.new_empty(x.shape)
    return dx, _param_grad(x, weight, need_weight_grad), _param_grad(x, bias, need_weight_grad)


@torch.library.register_fake("rmsnorm::gated_rms_norm_fwd")
def _(x, gate, norm_dims, weight, bias, *rest):
    opts, (group_size, norm_before_gate, _), (input_dtype,) = _gated_split(rest)
    in_dtype = x.dtype if input_dtype is None else input_dtype
    gate_last = gate is not None and norm_before_gate
    out = gated_output_dtype(in_dtype, weight, opts.casting_mode, gate_last)
    y = x.new_empty(x.shape, dtype=out)
    g = 1 if group_size is None else _launch.groups(x, norm_dims, group_size)
    rstd = x.new_empty((*x.shape[: x.dim() - norm_dims], g), dtype=_stat_dtype(x.dtype, in_dtype))
    return y, rstd


@torch.library.register_fake("rmsnorm::gated_rms_norm_bwd")
def _(dy, x, gate, norm_dims, weight, bias, rstd, dresidual, *rest):
    need_weight_grad = rest[-1]
    dx = x.new_empty(x.shape)
    if gate is None:
        dgate = x.new_empty((0,), dtype=compute_dtype(x.dtype))
    else:
        dgate = gate.new_empty(x.shape)
    dw = _param_grad(x, weight, need_weight_grad)
    return dx, dgate, dw, _param_grad(x, bias, need_weight_grad)


# ----------------------------------------------------------------------------------------------
# Autograd of the ops (what compiled graphs, exported programs, dispatch modes and tensor
# subclasses run). The backward formulas are shared with the eager path in rmsnorm._autograd.
# ----------------------------------------------------------------------------------------------
def _rms_setup(ctx, inputs, output):
    x, norm_dims, weight, bias, *options = inputs
    ctx.save_for_backward(_autograd.saveable(x), weight, bias, output[1])
    ctx.norm_dims, ctx.opts = norm_dims, RMSOptions._make(options)


def _rms_backward(ctx, dy, _drstd):
    x, weight, bias, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    args = (x, ctx.norm_dims, weight, bias, rstd, ctx.opts, x.dtype)
    dx, dw, db = _autograd.rms_norm_backward(call, dy, None, *args, (need[0], need[2], need[3]))
    return dx, None, dw, db, *_NO_OPTION_GRADS


def _add_setup(ctx, inputs, output):
    x, residual, norm_dims, weight, bias, *options = inputs
    ctx.save_for_backward(output[1], weight, bias, output[2])
    ctx.norm_dims, ctx.opts, ctx.input_dtype = norm_dims, RMSOptions._make(options), x.dtype


def _add_backward(ctx, dy, dh, _drstd):
    h, weight, bias, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    args = (h, ctx.norm_dims, weight, bias, rstd, ctx.opts, ctx.input_dtype)
    grads = _autograd.add_rms_norm_backward(call, dy, dh, *args, (*need[:2], *need[3:5]))
    dinput, dresidual, dw, db = grads
    return dinput, dresidual, None, dw, db, *_NO_OPTION_GRADS


def _ln_setup(ctx, inputs, output):
    x, norm_dims, weight, bias, _eps = inputs
    ctx.save_for_backward(_autograd.saveable(x), weight, bias, output[1], output[2])
    ctx.norm_dims, ctx.eps = norm_dims, _eps


def _ln_backward(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    args = (x, ctx.norm_dims, weight, bias, mean, rstd, ctx.eps)
    dx, dw, db = _autograd.layer_norm_backward(call, dy, *args, (need[0], need[2], need[3]))
    return dx, None, dw, db, None


def _gated_setup(ctx, inputs, output):
    x, gate, norm_dims, weight, bias, *rest = inputs
    opts, gating, (input_dtype,) = _gated_split(tuple(rest))
    ctx.save_for_backward(_autograd.saveable(x), gate, weight, bias, output[1])
    ctx.norm_dims, ctx.opts, ctx.gating = norm_dims, opts, gating
    ctx.input_dtype = x.dtype if input_dtype is None else input_dtype


def _gated_backward(ctx, dy, _drstd):
    x, gate, weight, bias, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    args = (x, gate, ctx.norm_dims, weight, bias, rstd, ctx.opts, ctx.gating, ctx.input_dtype)
    grads = _autograd.gated_rms_norm_backward(call, dy, *args, (*need[:2], *need[3:5]))
    dx, dz, dw, db = grads
    # None for norm_dims, the options, the gating arguments and input_dtype
    return dx, dz, None, dw, db, *_NO_OPTION_GRADS, *(None,) * _NGATE, None


def _bwd_not_differentiable(ctx, *grads):
    raise NotImplementedError(
        "rmsnorm: the backward ops (rms_norm_bwd, layer_norm_bwd, gated_rms_norm_bwd) are not "
        "differentiable themselves; double backward through rms_norm / add_rms_norm / "
        "gated_rms_norm / layer_norm works (with create_graph=True their backward runs as "
        "differentiable torch operations)"
    )


def _no_setup(ctx, inputs, output):
    pass


torch.library.register_autograd("rmsnorm::rms_norm_fwd", _rms_backward, setup_context=_rms_setup)
torch.library.register_autograd(
    "rmsnorm::add_rms_norm_fwd", _add_backward, setup_context=_add_setup
)
torch.library.register_autograd("rmsnorm::layer_norm_fwd", _ln_backward, setup_context=_ln_setup)
torch.library.register_autograd(
    "rmsnorm::gated_rms_norm_fwd", _gated_backward, setup_context=_gated_setup
)
for _name in ("rms_norm_bwd", "layer_norm_bwd", "gated_rms_norm_bwd"):
    torch.library.register_autograd(
        f"rmsnorm::{_name}", _bwd_not_differentiable, setup_context=_no_setup
    )


# DTensor sharding rules, registered once torch.distributed.tensor is imported (not by this import).
_dtensor.install()
