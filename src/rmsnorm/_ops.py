"""The ``torch.library`` custom ops: schemas, fake (meta) implementations, autograd, per-device
kernels.

Every op takes 2-D (M, N) tensors (last dim contiguous) and returns fresh tensors, so ranks never
change across calls and ``torch.compile`` / ``torch.export`` see one opaque node per op. The
low-level ``torch.library.Library`` registration is used instead of the ``@custom_op`` decorator:
its per-call Python overhead is several times smaller, and decoding-size calls are launch-bound (see
PERF.md). Which implementation runs is decided per call by :mod:`rmsnorm._backend`.
"""

from __future__ import annotations

import torch

from . import _backend
from .reference import compute_dtype, output_dtype

_lib = torch.library.Library("rmsnorm", "DEF")  # noqa: TOR901 (module-lifetime registration)

_RMS_ARGS = "float eps, str eps_mode, str casting_mode, float offset, int k"
_lib.define(
    f"rms_norm_fwd(Tensor x, Tensor? weight, Tensor? bias, {_RMS_ARGS}) -> (Tensor, Tensor)"
)
_lib.define(
    "add_rms_norm_fwd(Tensor x, Tensor residual, Tensor? weight, Tensor? bias, "
    f"{_RMS_ARGS}) -> (Tensor, Tensor, Tensor)"
)
_lib.define(
    "rms_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor rstd, "
    f"Tensor? dresidual, {_RMS_ARGS}, ScalarType input_dtype, bool need_weight_grad) "
    "-> (Tensor, Tensor, Tensor)"
)
_lib.define(
    "layer_norm_fwd(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)"
)
_lib.define(
    "layer_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd, "
    "bool need_weight_grad) -> (Tensor, Tensor, Tensor)"
)

OP_NAMES = ("rms_norm_fwd", "add_rms_norm_fwd", "rms_norm_bwd", "layer_norm_fwd", "layer_norm_bwd")


# ----------------------------------------------------------------------------------------------
# Device implementations: look up the backend for the tensor's device, call its launcher.
# ----------------------------------------------------------------------------------------------
def _device_impl(name: str):
    def impl(*args):
        return getattr(_backend.launchers(args[0].device.type), name)(*args)

    impl.__name__ = f"{name}_impl"
    return impl


for _name in OP_NAMES:
    # CPU and CUDA (ROCm too) have kernels; every other device runs the reference on the device.
    _lib.impl(_name, _device_impl(_name), "CPU")
    _lib.impl(_name, _device_impl(_name), "CUDA")
    _lib.impl(_name, _device_impl(_name), "CompositeExplicitAutograd")


# ----------------------------------------------------------------------------------------------
# Fake implementations: shapes and dtypes only (torch.compile, export, opcheck).
# ----------------------------------------------------------------------------------------------
def _stat_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """Per-row statistics: fp32, fp64 when any involved dtype is fp64."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _param_grad(x: torch.Tensor, p: torch.Tensor | None, need: bool) -> torch.Tensor:
    if p is None or not need:
        return x.new_empty((0,), dtype=compute_dtype(x.dtype))
    return p.new_empty(p.shape)


@torch.library.register_fake("rmsnorm::rms_norm_fwd")
def _(x, weight, bias, eps, eps_mode, casting_mode, offset, k):
    y = x.new_empty(x.shape, dtype=output_dtype(x.dtype, weight, casting_mode))
    return y, x.new_empty(x.shape[:1], dtype=_stat_dtype(x.dtype))


@torch.library.register_fake("rmsnorm::add_rms_norm_fwd")
def _(x, residual, weight, bias, eps, eps_mode, casting_mode, offset, k):
    y = x.new_empty(x.shape, dtype=output_dtype(x.dtype, weight, casting_mode))
    h = residual.new_empty(residual.shape)
    return y, h, x.new_empty(x.shape[:1], dtype=_stat_dtype(x.dtype, residual.dtype))


@torch.library.register_fake("rmsnorm::rms_norm_bwd")
def _(
    dy,
    x,
    weight,
    bias,
    rstd,
    dresidual,
    eps,
    eps_mode,
    casting_mode,
    offset,
    k,
    input_dtype,
    need_weight_grad,
):
    dx = x.new_empty(x.shape)
    return dx, _param_grad(x, weight, need_weight_grad), _param_grad(x, bias, need_weight_grad)


@torch.library.register_fake("rmsnorm::layer_norm_fwd")
def _(x, weight, bias, eps):
    stat = x.new_empty(x.shape[:1], dtype=_stat_dtype(x.dtype))
    return x.new_empty(x.shape), stat, stat.new_empty(stat.shape)


@torch.library.register_fake("rmsnorm::layer_norm_bwd")
def _(dy, x, weight, bias, mean, rstd, need_weight_grad):
    dx = x.new_empty(x.shape)
    return dx, _param_grad(x, weight, need_weight_grad), _param_grad(x, bias, need_weight_grad)


# ----------------------------------------------------------------------------------------------
# Autograd: the forward ops save x (or h) and the per-row statistics; the backward ops recompute x̂.
# ----------------------------------------------------------------------------------------------
def _rowwise(t: torch.Tensor) -> torch.Tensor:
    # Incoming gradients may be expanded (stride 0) or transposed; kernels need a unit last stride.
    return t if t.stride(-1) == 1 else t.contiguous()


def _maybe(grad: torch.Tensor, needed: bool) -> torch.Tensor | None:
    return grad if needed else None


def _rms_setup(ctx, inputs, output):
    x, weight, bias, *params = inputs
    ctx.save_for_backward(x, weight, bias, output[1])
    ctx.params = params


def _rms_backward(ctx, dy, _drstd):
    x, weight, bias, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = torch.ops.rmsnorm.rms_norm_bwd(
        _rowwise(dy), x, weight, bias, rstd, None, *ctx.params, x.dtype, need[1] or need[2]
    )
    return (
        _maybe(dx, need[0]),
        _maybe(dw, need[1]),
        _maybe(db, need[2]),
        None,
        None,
        None,
        None,
        None,
    )


def _add_setup(ctx, inputs, output):
    x, residual, weight, bias, *params = inputs
    ctx.save_for_backward(output[1], weight, bias, output[2])
    ctx.params = params
    ctx.input_dtype = x.dtype


def _add_backward(ctx, dy, dh, _drstd):
    h, weight, bias, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    dh = None if dh is None else _rowwise(dh)
    dx, dw, db = torch.ops.rmsnorm.rms_norm_bwd(
        _rowwise(dy), h, weight, bias, rstd, dh, *ctx.params, ctx.input_dtype, need[2] or need[3]
    )
    # d input = d residual = dx (the gradient reaching h); each in its own tensor's dtype.
    dinput = dx.to(ctx.input_dtype) if need[0] else None
    return dinput, _maybe(dx, need[1]), _maybe(dw, need[2]), _maybe(db, need[3]), *(None,) * 5


def _ln_setup(ctx, inputs, output):
    x, weight, bias, _eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])


def _ln_backward(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = torch.ops.rmsnorm.layer_norm_bwd(
        _rowwise(dy), x, weight, bias, mean, rstd, need[1] or need[2]
    )
    return _maybe(dx, need[0]), _maybe(dw, need[1]), _maybe(db, need[2]), None


def _no_double_backward(ctx, *grads):
    raise NotImplementedError(
        "rmsnorm: double backward (create_graph=True through the backward) is not supported"
    )


def _no_setup(ctx, inputs, output):
    pass


torch.library.register_autograd("rmsnorm::rms_norm_fwd", _rms_backward, setup_context=_rms_setup)
torch.library.register_autograd(
    "rmsnorm::add_rms_norm_fwd", _add_backward, setup_context=_add_setup
)
torch.library.register_autograd("rmsnorm::layer_norm_fwd", _ln_backward, setup_context=_ln_setup)
for _name in ("rms_norm_bwd", "layer_norm_bwd"):
    torch.library.register_autograd(
        f"rmsnorm::{_name}", _no_double_backward, setup_context=_no_setup
    )
