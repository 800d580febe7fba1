"""Sequence-parallel training on plain tensors: when each rank normalizes its own slice of the
sequence, the norm weights see only part of the tokens, so their gradients must be summed over the
sequence-parallel group. DDP, FSDP2 and DTensor plans need nothing from here (see
docs/integrations.md)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from . import norm_kind

__all__ = ["norm_parameters", "all_reduce_norm_grads"]


def norm_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters (weight, bias) of every normalization layer in ``model``, as
    :func:`rmsnorm.integrations.norm_kind` recognises them: this library's, torch's, and the
    Hugging Face classes :mod:`rmsnorm.integrations.hf` recognises.

    Args:
        model (torch.nn.Module): the model.

    Returns:
        list[torch.nn.Parameter]: each parameter once, in module order.

    Example::

        >>> from rmsnorm.integrations.distributed import norm_parameters
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        >>> [tuple(p.shape) for p in norm_parameters(model)]  # LayerNorm's weight and bias
        [(8,), (8,)]
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    seen, params = set(), []
    for module in model.modules():
        if norm_kind(module) is not None:
            for p in module.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
    return params


@torch.no_grad()
def all_reduce_norm_grads(
    model_or_params: nn.Module | Iterable[torch.Tensor], group: dist.ProcessGroup | None = None
) -> int:
    """Sum the gradients of the norm parameters over ``group`` (the sequence-parallel group), in
    place, so every rank holds d weight / d bias of the whole sequence.

    Call it once per optimizer step, after the last backward (gradient accumulation included) and
    before the step; calling it after each micro-batch would sum earlier micro-batches twice.
    Accepts a model (its :func:`norm_parameters`) or the parameters themselves; parameters without
    a gradient are skipped, the same way on every rank. Gradients are flattened into one buffer per
    dtype and device, so a model costs one collective per dtype. Returns the number of gradients
    reduced.

    Args:
        model_or_params (torch.nn.Module or iterable of Tensor): a model, or the parameters.
        group (ProcessGroup, optional): the sequence-parallel group. Default: ``None``, the
            default group.

    Returns:
        int: the number of gradients reduced.

    Example::

        >>> import torch.distributed as dist
        >>> from rmsnorm.integrations.distributed import all_reduce_norm_grads
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), rmsnorm.RMSNorm(8))
        >>> model(torch.randn(4, 8)).sum().backward()  # this rank's slice of the sequence
        >>> all_reduce_norm_grads(model)  # RMSNorm's weight, summed over the group
        1
        >>> dist.destroy_process_group()
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "all_reduce_norm_grads needs an initialized process group "
            "(torch.distributed.init_process_group)"
        )
    params = (
        norm_parameters(model_or_params)
        if isinstance(model_or_params, nn.Module)
        else list(model_or_params)
    )
    grads = [p.grad for p in params if p.grad is not None]
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        if g.is_sparse:
            raise ValueError("all_reduce_norm_grads: sparse gradients are not supported")
        if hasattr(g, "to_local"):  # a DTensor: its placements already say how it is reduced
            raise TypeError(
                "all_reduce_norm_grads takes plain (replicated) gradients, got a DTensor; "
                "with FSDP2 / tensor parallelism let the DTensor placements do the reduction"
            )
        buckets.setdefault((g.dtype, g.device), []).append(g)
    for bucket in buckets.values():
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
    return len(grads)
