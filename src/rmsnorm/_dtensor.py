"""DTensor sharding rules for the custom ops, so tensor- and sequence-parallel plans run this
library's norms: rows sharded or replicated, outputs and statistics following them, weight and bias
replicated, their gradients partial sums over sharded rows (inputs sharded on a normalized dim, or
partial, match no rule, so DTensor redistributes them). Importing ``torch.distributed.tensor`` takes
about 1 s, so ``import rmsnorm`` never does: the rules are registered as soon as it is imported.
"""

from __future__ import annotations

import importlib.abc
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
    """Register the rules for the five ops (once; later calls return at once). A failure is
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
