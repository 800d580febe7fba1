"""Memory layouts of gradients: the strides torch's own elementwise arithmetic (TensorIterator)
gives its result, so that d input of ``rms_norm`` / ``add_rms_norm`` has the layout torch's
composite ``rms_norm`` backward gives it (a channels_last gradient stays channels_last)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Dims from the innermost out in the channels_last layouts: (N, C, H, W) stored as N, H, W, C.
_CHANNELS_LAST_ORDER = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}
_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def channels_last_format(t: torch.Tensor) -> torch.memory_format | None:
    """``torch.channels_last`` (4-D) or ``torch.channels_last_3d`` (5-D) when t's strides order
    its dims as that layout does, gaps allowed (a slice of a channels_last tensor counts), else
    None: what ``Tensor.suggest_memory_format()`` says, with its tie-breaks (a size-1 or 0-stride
    channel dim is contiguous)."""
    order = _CHANNELS_LAST_ORDER.get(t.dim())
    if order is None:
        return None
    shape, strides = t.shape, t.stride()
    if strides[1] == 0:
        return None
    least = 0
    for d in order:
        if shape[d] == 0 or strides[d] < least:
            return None
        if d == 0 and least == strides[1]:  # N111-like strides: ambiguous, contiguous wins
            return None
        least = strides[d] * shape[d] if shape[d] > 1 else strides[d]
    return _CHANNELS_LAST[t.dim()]


def iteration_order(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> list[int]:
    """The dims of an elementwise result over operands of ``shape`` with these ``strides``, from
    the innermost (stride 1) out: TensorIterator's ``reorder_dimensions``. Each pair of dims is
    ordered by the first operand whose strides tell them apart (a 0 stride tells nothing; equal
    strides put the smaller dim inside); dims no operand orders keep their contiguous order."""
    ndim = len(shape)
    perm = list(range(ndim - 1, -1, -1))

    def should_swap(d0: int, d1: int) -> int:
        for st in strides:
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    # An insertion sort that stops at the first dim known to be inside (ambiguous pairs move on).
    for i in range(1, ndim):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            order = should_swap(perm[d0], perm[d1])
            if order > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif order < 0:
                break
    return perm


def dense_strides(shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    """Strides of a dense tensor of ``shape`` whose dims lie in memory in ``order`` (innermost
    first)."""
    strides = [0] * len(shape)
    step = 1
    for d in order:
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def in_order(t: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
    """``t`` copied to the dense layout with dims in ``order`` (innermost first); ``t`` itself
    when it has that layout already. Permute, copy, permute back: the same on plain
    tensors, fake ones under compile and DTensors, and differentiable."""
    ndim = t.dim()
    if all(d == ndim - 1 - i for i, d in enumerate(order)) or t.stride() == dense_strides(
        t.shape, order
    ):
        return t
    outer = list(reversed(order))
    back = [0] * ndim
    for i, d in enumerate(outer):
        back[d] = i
    return t.permute(outer).contiguous().permute(back)


def input_grad(
    dx: torch.Tensor, dy: torch.Tensor | None, dresidual: torch.Tensor | None = None
) -> torch.Tensor:
    """d input of rms_norm (``dx``, computed contiguous) in the layout torch's composite backward
    gives it: the layout of elementwise arithmetic on ``dy`` (dy's own strides when dy is dense,
    so a channels_last dy gives a channels_last dx, and contiguous for a contiguous or expanded
    one). For add_rms_norm with ``dresidual`` (the gradient reaching the sum directly), the
    layout of ``dresidual + (that gradient)``, which is what autograd computes there. A
    ``dy`` of None (only the sum's gradient arrived) counts as contiguous."""
    if (dy is None or dy.is_contiguous()) and (dresidual is None or dresidual.is_contiguous()):
        return dx
    shape = dx.shape
    order = iteration_order(shape, [dy.stride()]) if dy is not None else None
    if dresidual is not None:
        through_norm = dense_strides(shape, order) if order is not None else dx.stride()
        order = iteration_order(shape, [dresidual.stride(), through_norm])
    return dx if order is None else in_order(dx, order)
