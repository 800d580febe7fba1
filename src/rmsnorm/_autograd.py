"""The backward of every op, shared by the custom ops' registered autograd and the eager path, and
the eager path's ``autograd.Function`` classes.

Without ``create_graph`` the backward runs the backward kernels. With ``create_graph=True`` (double
backward: gradient penalties, Hessian-vector products, MAML) it runs the spec's written-out backward
(:func:`rmsnorm.reference.rms_norm_bwd`, :func:`~rmsnorm.reference.layer_norm_bwd`) as torch
operations, with the per-row statistics recomputed from the input, so autograd can differentiate it
again.
"""

from __future__ import annotations

import math

import torch

from . import _launch, _layout
from . import reference as ref


def saveable(x: torch.Tensor) -> torch.Tensor:
    """x, or a copy of it when it is an inference tensor (created under ``torch.inference_mode``),
    which autograd refuses to save; torch's own norms accept such inputs with a trainable weight."""
    return x.clone() if x.is_inference() else x


def _row_size(x: torch.Tensor, norm_dims: int) -> int:
    return math.prod(x.shape[x.dim() - norm_dims :])


def _in_shapes(dx, dw, db, x, weight, bias):
    """The spec's (dx, d weight, d bias), computed on rows, in the shapes of x and the parameters
    (an empty gradient stays empty)."""
    dw = dw.reshape(weight.shape) if dw.numel() else dw
    db = db.reshape(bias.shape) if db.numel() else db
    return dx.reshape(x.shape), dw, db


def _spec_rms_backward(dy, dh, x, norm_dims, weight, bias, opts, input_dtype, need_params):
    """The written-out RMSNorm backward as differentiable torch operations of (dy, x, weight)."""
    n = _row_size(x, norm_dims)
    x2 = ref.row_matrix(x, n)
    cd = torch.promote_types(ref.compute_dtype(x.dtype), ref.compute_dtype(input_dtype))
    # rstd recomputed: its derivative in x is needed
    rstd = ref.rms_rstd(x2.to(cd), opts)
    w, b = ref.param_vector(weight), ref.param_vector(bias)
    dy2, dh2 = ref.row_matrix(dy, n), ref.row_matrix(dh, n)
    dx, dw, db = ref.rms_norm_bwd(dy2, x2, w, b, rstd, dh2, opts, input_dtype, need_params)
    return _in_shapes(dx, dw, db, x, weight, bias)


def _spec_ln_backward(dy, x, norm_dims, weight, bias, eps, need_params):
    """The written-out LayerNorm backward as differentiable torch operations of (dy, x, weight)."""
    n = _row_size(x, norm_dims)
    x2 = ref.row_matrix(x, n)
    _, mean, rstd = ref.layer_norm_fwd(x2, None, None, eps)  # recomputed, differentiable in x
    w, b = ref.param_vector(weight), ref.param_vector(bias)
    dx, dw, db = ref.layer_norm_bwd(ref.row_matrix(dy, n), x2, w, b, mean, rstd, need_params)
    return _in_shapes(dx, dw, db, x, weight, bias)


def _spec_gated_backward(
    dy, x, gate, norm_dims, weight, bias, opts, gating, input_dtype, need_params
):
    """The written-out grouped / gated backward as differentiable torch operations of
    (dy, x, gate, weight, bias), the statistics recomputed (their derivative is needed)."""
    n = _row_size(x, norm_dims)
    x2, z2 = ref.row_matrix(x, n), ref.row_matrix(gate, n)
    w, b = ref.param_vector(weight), ref.param_vector(bias)
    _, rstd = ref.gated_rms_norm_fwd(x2, z2, w, b, opts, gating, input_dtype)
    dx, dz, dw, db = ref.gated_rms_norm_bwd(
        ref.row_matrix(dy, n), x2, z2, w, b, rstd, None, opts, gating, input_dtype, need_params
    )
    dx, dw, db = _in_shapes(dx, dw, db, x, weight, bias)
    return dx, None if gate is None else dz.reshape(x.shape), dw, db


def gated_rms_norm_backward(
    ops, dy, x, gate, norm_dims, weight, bias, rstd, opts, gating, input_dtype, need
):
    """(d x, d gate, d weight, d bias) of gated_rms_norm (and grouped rms_norm) at x; as
    :func:`rms_norm_backward`, ``gating`` the op's :class:`~rmsnorm.reference.GateOptions` and
    ``need`` whether each of the four is wanted."""
    need_x, need_z, need_w, need_b = need
    if not (need_x or need_z or need_w or need_b):
        return None, None, None, None
    args = (dy, x, gate, norm_dims, weight, bias)
    if torch.is_grad_enabled():  # create_graph=True: keep the backward differentiable
        dx, dz, dw, db = _spec_gated_backward(*args, opts, gating, input_dtype, need_w or need_b)
    else:
        dx, dz, dw, db = ops.gated_rms_norm_bwd(
            *args, rstd, None, opts, gating, input_dtype, need_w or need_b
        )
    # dx and d gate come back contiguous; torch's composite backward gives them dy's layout.
    dx = _layout.input_grad(dx, dy) if need_x else None
    dz = _layout.input_grad(dz, dy) if need_z and gate is not None else None
    return dx, dz, dw if need_w else None, db if need_b else None


def rms_norm_backward(ops, dy, dh, x, norm_dims, weight, bias, rstd, opts, input_dtype, need):
    """(d x, d weight, d bias) of rms_norm at x, or of add_rms_norm at its sum h = x (then dh, the
    gradient reaching h directly, is added to d x); ``need`` whether each of the three is wanted.
    ``ops`` runs the backward kernel: the custom ops (:class:`rmsnorm._opcall.call`) or
    :mod:`rmsnorm._launch`, which have the same signatures."""
    need_x, need_w, need_b = need
    if not (need_x or need_w or need_b):
        return None, None, None
    dy_given = dy
    if dy is None:  # only h's gradient reached add_rms_norm
        dy = torch.zeros_like(x, dtype=ref.output_dtype(input_dtype, weight, opts.casting_mode))
    if torch.is_grad_enabled():  # create_graph=True: keep the backward differentiable
        dx, dw, db = _spec_rms_backward(
            dy, dh, x, norm_dims, weight, bias, opts, input_dtype, need_w or need_b
        )
    else:
        dx, dw, db = ops.rms_norm_bwd(
            dy, x, norm_dims, weight, bias, rstd, dh, opts, input_dtype, need_w or need_b
        )
    # dx comes back contiguous; torch's composite backward gives it dy's layout (channels_last).
    dx = _layout.input_grad(dx, dy_given, dh) if need_x else None
    return dx, dw if need_w else None, db if need_b else None


def add_rms_norm_backward(ops, dy, dh, h, norm_dims, weight, bias, rstd, opts, input_dtype, need):
    """(d input, d residual, d weight, d bias) of add_rms_norm from its sum h (``need``: whether
    each is wanted): d input and d residual are both the gradient reaching h, each in its own
    tensor's dtype."""
    need_input, need_residual, need_w, need_b = need
    args = (ops, dy, dh, h, norm_dims, weight, bias, rstd, opts, input_dtype)
    dx, dw, db = rms_norm_backward(*args, (need_input or need_residual, need_w, need_b))
    dinput = dx.to(input_dtype) if need_input else None
    return dinput, dx if need_residual else None, dw, db


def layer_norm_backward(ops, dy, x, norm_dims, weight, bias, mean, rstd, eps, need):
    """(d x, d weight, d bias) of layer_norm; as :func:`rms_norm_backward`."""
    need_x, need_w, need_b = need
    if not (need_x or need_w or need_b):
        return None, None, None
    if torch.is_grad_enabled():
        dx, dw, db = _spec_ln_backward(dy, x, norm_dims, weight, bias, eps, need_w or need_b)
    else:
        dx, dw, db = ops.layer_norm_bwd(
            dy, x, norm_dims, weight, bias, mean, rstd, need_w or need_b
        )
    return dx if need_x else None, dw if need_w else None, db if need_b else None


# ----------------------------------------------------------------------------------------------
# The eager path: plain tensors with gradients, outside compile, modes and transforms. A Python
# autograd.Function calling the launchers costs a fraction of the dispatcher plus the custom op's
# autograd wrapper, and is what a decoding- or training-size eager call pays on every step.
# ----------------------------------------------------------------------------------------------
class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, norm_dims, opts):
        y, rstd = _launch.rms_norm_fwd(x, norm_dims, weight, bias, opts)
        ctx.save_for_backward(saveable(x), weight, bias)
        ctx.rstd, ctx.norm_dims, ctx.opts = rstd, norm_dims, opts
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias = ctx.saved_tensors
        args = (x, ctx.norm_dims, weight, bias, ctx.rstd, ctx.opts, x.dtype)
        dx, dw, db = rms_norm_backward(_launch, dy, None, *args, ctx.needs_input_grad[:3])
        return dx, dw, db, None, None


class AddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, bias, norm_dims, opts):
        y, h, rstd = _launch.add_rms_norm_fwd(x, residual, norm_dims, weight, bias, opts)
        ctx.save_for_backward(h, weight, bias)
        ctx.rstd, ctx.norm_dims, ctx.opts, ctx.input_dtype = rstd, norm_dims, opts, x.dtype
        ctx.set_materialize_grads(False)
        return y, h

    @staticmethod
    def backward(ctx, dy, dh):
        h, weight, bias = ctx.saved_tensors
        args = (h, ctx.norm_dims, weight, bias, ctx.rstd, ctx.opts, ctx.input_dtype)
        grads = add_rms_norm_backward(_launch, dy, dh, *args, ctx.needs_input_grad[:4])
        return *grads, None, None


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, norm_dims, eps):
        y, mean, rstd = _launch.layer_norm_fwd(x, norm_dims, weight, bias, eps)
        ctx.save_for_backward(saveable(x), weight, bias)
        ctx.stats, ctx.norm_dims, ctx.eps = (mean, rstd), norm_dims, eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias = ctx.saved_tensors
        args = (x, ctx.norm_dims, weight, bias, *ctx.stats, ctx.eps)
        dx, dw, db = layer_norm_backward(_launch, dy, *args, ctx.needs_input_grad[:3])
        return dx, dw, db, None, None


class GatedRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate, weight, bias, norm_dims, opts, gating, input_dtype):
        y, rstd = _launch.gated_rms_norm_fwd(
            x, gate, norm_dims, weight, bias, opts, gating, input_dtype
        )
        ctx.save_for_backward(saveable(x), gate, weight, bias)
        ctx.rstd, ctx.norm_dims, ctx.input_dtype = rstd, norm_dims, input_dtype
        ctx.opts, ctx.gating = opts, gating
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gate, weight, bias = ctx.saved_tensors
        args = (x, gate, ctx.norm_dims, weight, bias, ctx.rstd, ctx.opts, ctx.gating)
        grads = gated_rms_norm_backward(
            _launch, dy, *args, ctx.input_dtype, ctx.needs_input_grad[:4]
        )
        return *grads, None, None, None, None


# The eager path calls the classes' apply without ``autograd.Function.apply``'s Python wrapper,
# which binds default arguments for a ``setup_context`` (these classes define none) and unwraps
# functorch's dead wrappers (the eager path never runs under a functorch transform: the functional
# API sends those calls to the spec): ~1.3 µs of a ~37 µs forward + backward at decoding sizes.
# Where a torch lacks the C entry point, the wrapper serves.
def _c_apply(fn_class: type[torch.autograd.Function]):
    entry = getattr(torch._C, "_FunctionBase", None)
    entry = entry.__dict__.get("apply") if entry is not None else None
    return fn_class.apply if entry is None else entry.__get__(None, fn_class)


rms_norm_apply = _c_apply(RMSNormFunction)
add_rms_norm_apply = _c_apply(AddRMSNormFunction)
layer_norm_apply = _c_apply(LayerNormFunction)
gated_rms_norm_apply = _c_apply(GatedRMSNormFunction)
