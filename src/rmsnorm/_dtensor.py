"""DTensor sharding rules for the custom ops, so tensor- and sequence-parallel plans run this
library's norms: rows sharded or replicated, outputs and statistics following them, weight and bias
replicated, their gradients partial sums over sharded rows (inputs sharded on a normalized dim, or
partial, match no rule, so DTensor redistributes them; grouped and gated inputs sharded on group
boundaries are normalized on each rank's groups). Importing ``torch.distributed.tensor`` takes
about 1 s, so ``import rmsnorm`` never does: the rules are registered as soon as it is imported.
"""

from __future__ import annotations

import importlib.abc
import math
import sys
import threading
import warnings

import torch

_MODULE = "torch.distributed.tensor"
_lock = threading.Lock()
_registered = False


def install() -> None:
    """Register the rules now if ``torch.distributed.tensor`` is imported, else right after it is.
    Builds without distributed support have no DTensor, and nothing is done."""
    if not torch.distributed.is_available():
        return
    if _MODULE in sys.modules:
        register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that finds nothing itself: for ``torch.distributed.tensor`` it
    takes the spec the other finders give and makes that spec's loader register the rules once
    the module has run. It stays until then (a ``find_spec`` probe that does not import must not
    use it up); :func:`register` removes it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        for finder in sys.meta_path:
            find_spec = None if finder is self else getattr(finder, "find_spec", None)
            spec = None if find_spec is None else find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_register(module):
            exec_module(module)
            register()

        try:
            spec.loader.exec_module = exec_then_register  # this spec's own loader instance
        except AttributeError:  # a loader that takes no attributes: import it untouched
            pass
        return spec


def ensure() -> None:
    """Register the rules if ``torch.distributed.tensor`` is imported and they are not yet: the
    functional API calls this before handing a tensor subclass to the ops, in case an import
    route bypassed the finder above."""
    if not _registered and _MODULE in sys.modules:
        register()


def register() -> None:
    """Register the rules for the seven ops (once; later calls return at once). A failure is
    reported as a warning: the library works without them, only not on DTensors."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]
        try:
            _register()
        except Exception as exc:  # an incompatible torch: say so once, keep plain tensors working
            warnings.warn(
                f"rmsnorm: could not register the DTensor sharding rules of its ops ({exc!r}); "
                "its norms will fail on DTensor inputs",
                RuntimeWarning,
                stacklevel=2,
            )


def _register() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    ops = torch.ops.rmsnorm
    replicate = Replicate()

    def param(p):
        """A weight or bias: replicated, or absent (None) when the op gets None."""
        return None if p is None else replicate

    def grad(p, need: bool):
        """d weight / d bias with the rows sharded: a partial sum over this rank's rows. Without
        the parameter (or need_weight_grad) the op returns an empty tensor, replicated."""
        return Partial("sum") if p is not None and need else replicate

    def rows(x, norm_dims: int) -> range:
        return range(x.ndim - norm_dims)

    # Each rule returns (output placements, input placements) pairs, one input placement per
    # argument of the schema (None for non-tensor arguments and absent optional tensors), for
    # one mesh dim; register_sharding expands them over the mesh and DTensor redistributes
    # the inputs to the cheapest pair.
    @register_sharding(ops.rms_norm_fwd.default)
    def _(x, norm_dims, weight, bias, *scalars):
        def pair(p):
            return [p, p], [p, None, param(weight), param(bias)] + [None] * len(scalars)

        return [pair(Shard(d)) for d in rows(x, norm_dims)] + [pair(replicate)]

    @register_sharding(ops.add_rms_norm_fwd.default)
    def _(x, residual, norm_dims, weight, bias, *scalars):
        def pair(p):
            inputs = [p, p, None, param(weight), param(bias)] + [None] * len(scalars)
            return [p, p, p], inputs

        return [pair(Shard(d)) for d in rows(x, norm_dims)] + [pair(replicate)]

    @register_sharding(ops.layer_norm_fwd.default)
    def _(x, norm_dims, weight, bias, eps):
        def pair(p):
            return [p, p, p], [p, None, param(weight), param(bias), None]

        return [pair(Shard(d)) for d in rows(x, norm_dims)] + [pair(replicate)]

    @register_sharding(ops.rms_norm_bwd.default)
    def _(dy, x, norm_dims, weight, bias, rstd, dresidual, *scalars):
        need = scalars[-1]  # need_weight_grad

        def pair(p, sharded):
            dw = grad(weight, need) if sharded else replicate
            db = grad(bias, need) if sharded else replicate
            dres = None if dresidual is None else p
            inputs = [p, p, None, param(weight), param(bias), p, dres] + [None] * len(scalars)
            return [p, dw, db], inputs

        return [pair(Shard(d), True) for d in rows(x, norm_dims)] + [pair(replicate, False)]

    @register_sharding(ops.layer_norm_bwd.default)
    def _(dy, x, norm_dims, weight, bias, mean, rstd, need_weight_grad):
        def pair(p, sharded):
            dw = grad(weight, need_weight_grad) if sharded else replicate
            db = grad(bias, need_weight_grad) if sharded else replicate
            return [p, dw, db], [p, p, None, param(weight), param(bias), p, p, None]

        return [pair(Shard(d), True) for d in rows(x, norm_dims)] + [pair(replicate, False)]

    @register_sharding(ops.gated_rms_norm_fwd.default)
    def _(x, gate, norm_dims, weight, bias, *scalars):
        def pair(p):
            z = None if gate is None else p
            return [p, p], [p, z, None, param(weight), param(bias)] + [None] * len(scalars)

        return [pair(Shard(d)) for d in rows(x, norm_dims)] + [pair(replicate)]

    @register_sharding(ops.gated_rms_norm_bwd.default)
    def _(dy, x, gate, norm_dims, weight, bias, rstd, dresidual, *scalars):
        need = scalars[-1]  # need_weight_grad

        def pair(p, sharded):
            dw = grad(weight, need) if sharded else replicate
            db = grad(bias, need) if sharded else replicate
            dz = replicate if gate is None else p  # no gate: an empty tensor
            z, dres = None if gate is None else p, None if dresidual is None else p
            inputs = [p, p, z, None, param(weight), param(bias), p, dres] + [None] * len(scalars)
            return [p, dz, dw, db], inputs

        return [pair(Shard(d), True) for d in rows(x, norm_dims)] + [pair(replicate, False)]


# ----------------------------------------------------------------------------------------------
# Grouped and gated calls on DTensors (from the functional API). Rows sharded or replicated run
# the op under the rules above. Normalized dims sharded so that every rank holds whole groups
# (Mamba2's n_groups split over tensor-parallel ranks; a per-head norm with the heads sharded) are
# normalized where they lie: each rank runs the op on its own groups, with its slice of the
# weight, and no collective. Normalized dims sharded across group boundaries are refused.
# ----------------------------------------------------------------------------------------------
def is_dtensor(t: object) -> bool:
    """Whether t is a DTensor (False, without importing it, when DTensor was never imported)."""
    module = sys.modules.get(_MODULE)
    return module is not None and isinstance(t, module.DTensor)


def _on_mesh(p, x, name: str):
    """A weight or bias as a DTensor on x's mesh (a plain tensor is taken as replicated); a gate
    must be a DTensor laid out as x."""
    if p is None:
        return None
    from torch.distributed.tensor import DTensor, Replicate

    mesh = x.device_mesh
    if not is_dtensor(p):
        if name == "gate":
            raise TypeError(
                "gate must be a DTensor when input is one (got a torch.Tensor): make it one on "
                "input's mesh, e.g. DTensor.from_local(gate, mesh, placements)"
            )
        return DTensor.from_local(p, mesh, [Replicate()] * mesh.ndim, run_check=False)
    if name == "gate" and tuple(p.placements) != tuple(x.placements):
        p = p.redistribute(mesh, x.placements)
    return p


def _normalized_shards(x, norm_dims: int) -> bool:
    """Whether a mesh dim shards a normalized dim of x."""
    lead = x.ndim - norm_dims
    return any(p.is_shard() and p.dim >= lead for p in x.placements)


def gated_rms_norm(x, gate, norm_dims, weight, bias, eps, eps_mode, casting_mode, offset, k,
                   group_size, norm_before_gate, activation, input_dtype):  # fmt: skip
    """(y, rstd) of the grouped / gated op on the DTensor x (see the section comment)."""
    gate = _on_mesh(gate, x, "gate")
    weight, bias = _on_mesh(weight, x, "weight"), _on_mesh(bias, x, "bias")
    options = (eps, eps_mode, casting_mode, offset, k, group_size, norm_before_gate, activation,
               input_dtype)  # fmt: skip
    if not _normalized_shards(x, norm_dims):
        return torch.ops.rmsnorm.gated_rms_norm_fwd(x, gate, norm_dims, weight, bias, *options)
    return _local_groups(x, gate, norm_dims, weight, bias, *options)


def _local_groups(x, gate, norm_dims, weight, bias, eps, eps_mode, casting_mode, offset, k,
                  group_size, norm_before_gate, activation, input_dtype):  # fmt: skip
    from torch.distributed.tensor import DTensor, Partial, Replicate
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    lead = x.ndim - norm_dims
    big_n = math.prod(x.shape[lead:])
    g = big_n if group_size is None else group_size
    mesh = x.device_mesh
    local_shape, offsets = compute_local_shape_and_global_offset(x.shape, mesh, x.placements)
    index = _flat_index(x.shape[lead:], local_shape[lead:], offsets[lead:], x.device)
    n = index.numel()
    # whole groups, in order: every run of g local elements is one group of the row
    starts = index.reshape(-1, g)[:, 0] if n and n % g == 0 else None
    if n and (
        starts is None
        or not torch.equal(index.reshape(-1, g) - starts[:, None], torch.arange(g, device=x.device))
        or bool((starts % g).any())
    ):
        raise ValueError(
            f"gated_rms_norm / grouped rms_norm: input is a DTensor sharded on its normalized "
            f"dims (placements {list(x.placements)}, shape {list(x.shape)}) so that a rank holds "
            f"part of a group of group_size={g}; each rank must hold whole groups (shard at "
            "multiples of group_size), or redistribute the normalized dims to Replicate() first"
        )
    grad_placements = [Partial("sum") if p.is_shard() else Replicate() for p in x.placements]

    def local_param(p):
        if p is None:
            return None
        if not all(q.is_replicate() for q in p.placements):
            p = p.redistribute(mesh, [Replicate()] * mesh.ndim)
        return p.to_local(grad_placements=grad_placements).reshape(-1).index_select(0, index)

    m = math.prod(local_shape[:lead])
    xl = x.to_local().reshape(m, n)
    zl = None if gate is None else gate.to_local().reshape(m, n)
    local_group = None if n == g else g
    y, rstd = torch.ops.rmsnorm.gated_rms_norm_fwd(
        xl, zl, 1, local_param(weight), local_param(bias), eps, eps_mode, casting_mode, offset,
        k, local_group, norm_before_gate, activation, input_dtype,
    )  # fmt: skip
    y = DTensor.from_local(y.reshape(local_shape), mesh, x.placements, run_check=False,
                           shape=x.shape, stride=_contiguous(x.shape))  # fmt: skip
    return y, rstd


def _flat_index(shape, local_shape, offsets, device) -> torch.Tensor:
    """The indices, in the flattened normalized dims of ``shape``, of the local block of
    ``local_shape`` at ``offsets``, in the block's own row-major order."""
    index = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        pos = torch.arange(local_shape[d], device=device) + offsets[d]
        index = (pos * stride).reshape(-1, *([1] * index.dim())) + index.unsqueeze(0)
        stride *= shape[d]
    return index.reshape(-1)


def _contiguous(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
