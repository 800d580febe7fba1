"""Calls of the backend launchers on tensors in their own shape: present the rows as the launchers
read them, launch on the backend in force for the device, give the outputs the input's shape.

The functions have the signatures of the ops in :mod:`rmsnorm._ops` and check nothing: the ops check
their arguments before calling these, and the functional API validates its own and calls these
directly when the dispatcher has nothing to add (eager calls on plain tensors).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from . import _backend
from .reference import param_vector

if TYPE_CHECKING:
    from ._contract import Backend

_below_views = torch._C._AutoDispatchBelowADInplaceOrView


def backend_for(x: torch.Tensor) -> Backend:
    """The backend that runs ops on x's device under the current choice."""
    return _backend.launchers("cpu" if x.is_cpu else x.device.type)


def _as_rows(t: torch.Tensor, norm_dims: int) -> torch.Tensor:
    """t as the launchers read rows (*, N): as it is when contiguous (outputs then come back in
    t's own shape, no view needed), else as (M, N) rows with a unit last stride — a view where the
    rows are equally spaced (the launchers read strided rows in place), a copy otherwise."""
    if norm_dims == 1:
        if t.is_contiguous():
            return t
        if t.dim() != 2:
            t = t.reshape(-1, t.shape[-1])
        return t if t.stride(1) == 1 or t.shape[1] == 1 else t.contiguous()
    return t.reshape(-1, math.prod(t.shape[t.dim() - norm_dims :]))


def _flat(stat: torch.Tensor) -> torch.Tensor:
    return stat if stat.dim() == 1 else stat.reshape(-1)


def _shaped(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """t (fresh) in like's shape, as a tensor of its own rather than a view: a view would make the
    output of a norm look like a view to autograd (FSDP warns on modules that return one)."""
    if t.dim() == like.dim() and t.shape == like.shape:
        return t
    with _below_views():
        return t.view(like.shape)


def leading(stat: torch.Tensor, x: torch.Tensor, norm_dims: int) -> torch.Tensor:
    """A per-row statistic (M,) in x's leading shape."""
    if x.dim() == norm_dims + 1:
        return stat
    with _below_views():
        return stat.view(x.shape[: x.dim() - norm_dims])


def _param_grad(g: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor:
    if p is None or p.dim() == 1 or g.numel() == 0:
        return g
    with _below_views():
        return g.view(p.shape)


def _rows(norm_dims: int, *ts: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Each of ts as the launchers read rows (:func:`_as_rows`); None stays None."""
    return [None if t is None else _as_rows(t, norm_dims) for t in ts]


def _grads(x, weight, bias, dx, dw, db):
    """A backward launcher's (dx, d weight, d bias) in the shapes of x and the parameters."""
    return _shaped(dx, x), _param_grad(dw, weight), _param_grad(db, bias)


# Each launch below starts with the common case — one normalized dim, contiguous rows — handed to
# the backend as it is: its outputs then come back in x's shape, and a parameter of one normalized
# dim is a vector already. Both eager paths take it (the forwards with ``stats=False`` where no
# backward will ask for the statistics: the backends then keep none). The general path's calls
# cost 5-10 µs of CPU time in a one-row forward + backward on the 2-core Intel host (of ~90-110
# µs), more than the rest of this layer.
def rms_norm_fwd(x, norm_dims, weight, bias, opts, stats=True):
    if norm_dims == 1 and x.is_contiguous():
        return backend_for(x).rms_norm_fwd(x, weight, bias, opts, stats)
    y, rstd = backend_for(x).rms_norm_fwd(
        _as_rows(x, norm_dims), param_vector(weight), param_vector(bias), opts, stats
    )
    return _shaped(y, x), rstd


def add_rms_norm_fwd(x, residual, norm_dims, weight, bias, opts, stats=True):
    if norm_dims == 1 and x.is_contiguous() and residual.is_contiguous():
        return backend_for(x).add_rms_norm_fwd(x, residual, weight, bias, opts, stats)
    rows = _as_rows(x, norm_dims), _as_rows(residual, norm_dims)
    w, b = param_vector(weight), param_vector(bias)
    y, h, rstd = backend_for(x).add_rms_norm_fwd(*rows, w, b, opts, stats)
    return _shaped(y, x), _shaped(h, x), rstd


def rms_norm_bwd(dy, x, norm_dims, weight, bias, rstd, dresidual, opts, input_dtype, need_wgrad):
    if (
        norm_dims == 1
        and x.is_contiguous()
        and dy.is_contiguous()
        and (dresidual is None or dresidual.is_contiguous())
    ):
        return backend_for(x).rms_norm_bwd(
            dy, x, weight, bias, _flat(rstd), dresidual, opts, input_dtype, need_wgrad
        )
    dy2, x2, dr = _rows(norm_dims, dy, x, dresidual)
    w, b = param_vector(weight), param_vector(bias)
    grads = backend_for(x).rms_norm_bwd(
        dy2, x2, w, b, _flat(rstd), dr, opts, input_dtype, need_wgrad
    )
    return _grads(x, weight, bias, *grads)


def layer_norm_fwd(x, norm_dims, weight, bias, eps, stats=True):
    if norm_dims == 1 and x.is_contiguous():
        return backend_for(x).layer_norm_fwd(x, weight, bias, eps, stats)
    y, mean, rstd = backend_for(x).layer_norm_fwd(
        _as_rows(x, norm_dims), param_vector(weight), param_vector(bias), eps, stats
    )
    return _shaped(y, x), mean, rstd


def layer_norm_bwd(dy, x, norm_dims, weight, bias, mean, rstd, need_weight_grad):
    stats = _flat(mean), _flat(rstd)
    if norm_dims == 1 and x.is_contiguous() and dy.is_contiguous():
        return backend_for(x).layer_norm_bwd(dy, x, weight, bias, *stats, need_weight_grad)
    dy2, x2 = _rows(norm_dims, dy, x)
    w, b = param_vector(weight), param_vector(bias)
    grads = backend_for(x).layer_norm_bwd(dy2, x2, w, b, *stats, need_weight_grad)
    return _grads(x, weight, bias, *grads)


def gated_rms_norm_fwd(x, gate, norm_dims, weight, bias, opts, gating, input_dtype, stats=True):
    """y in x's shape and the (M·G,) statistics (None where ``stats`` is false and the backend
    skips them). ``gating`` is a :class:`~rmsnorm.reference.GateOptions`."""
    if norm_dims == 1 and x.is_contiguous():  # the backend reads the gate in any layout
        return backend_for(x).gated_rms_norm_fwd(
            x, gate, weight, bias, opts, gating, input_dtype, stats
        )
    rows = _rows(norm_dims, x, gate)
    w, b = param_vector(weight), param_vector(bias)
    y, rstd = backend_for(x).gated_rms_norm_fwd(*rows, w, b, opts, gating, input_dtype, stats)
    return _shaped(y, x), rstd


def gated_rms_norm_bwd(
    dy, x, gate, norm_dims, weight, bias, rstd, dresidual, opts, gating, input_dtype, need_wgrad
):
    if (
        norm_dims == 1
        and x.is_contiguous()
        and dy.is_contiguous()
        and (gate is None or gate.is_contiguous())
        and (dresidual is None or dresidual.is_contiguous())
    ):
        return backend_for(x).gated_rms_norm_bwd(
            dy, x, gate, weight, bias, _flat(rstd), dresidual, opts, gating, input_dtype, need_wgrad
        )
    dy2, x2, z, dr = _rows(norm_dims, dy, x, gate, dresidual)
    w, b, r = param_vector(weight), param_vector(bias), _flat(rstd)
    dx, dz, dw, db = backend_for(x).gated_rms_norm_bwd(
        dy2, x2, z, w, b, r, dr, opts, gating, input_dtype, need_wgrad
    )
    dx, dw, db = _grads(x, weight, bias, dx, dw, db)
    return dx, dz if gate is None else _shaped(dz, x), dw, db


def groups(x: torch.Tensor, norm_dims: int, group_size: int | None) -> int:
    """G, the groups of one row of x (1 for ``group_size=None``)."""
    if group_size is None:
        return 1
    return math.prod(x.shape[x.dim() - norm_dims :]) // group_size


def leading_groups(stat: torch.Tensor, x: torch.Tensor, norm_dims: int, g: int) -> torch.Tensor:
    """Per-group statistics (M·G,) in x's leading shape with a trailing dim of the G groups."""
    shape = tuple(x.shape[: x.dim() - norm_dims]) + (g,)
    if stat.shape == shape:
        return stat
    with _below_views():
        return stat.view(shape)
