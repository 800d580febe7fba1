"""DTensor support: sharding rules for the custom ops (rows sharded or replicated, outputs and
statistics following them, weight and bias replicated, their gradients partial sums), and the
functional API's DTensor calls, which also take plain weights and normalize inputs sharded on a
normalized dim in place with one collective of the row statistics (grouped and gated inputs
sharded on group boundaries with none). Importing ``torch.distributed.tensor`` takes about 1 s,
so ``import rmsnorm`` never does: the rules are registered as soon as it is imported."""

from __future__ import annotations

import importlib.abc
import math
import sys
import threading
import warnings

import torch

from . import reference as ref

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
# Calls on DTensors from the functional API. A plain weight or bias is taken as replicated on the
# input's mesh. Rows sharded or replicated run the ops under the rules above. An input sharded on
# a normalized dim is normalized where it lies: each rank reduces its part of every row, one
# collective combines the row statistics, and the normalization runs on the local shards
# (torch operations and differentiable functional collectives, so autograd, double backward
# and torch.compile follow; the backward's row reductions are combined by the collective's
# own backward).
# ----------------------------------------------------------------------------------------------
def is_dtensor(t: object) -> bool:
    """Whether t is a DTensor (False, without importing it, when DTensor was never imported)."""
    module = sys.modules.get(_MODULE)
    return module is not None and isinstance(t, module.DTensor)


def _as_dtensor(p, x, name: str):
    """p (a weight, bias or residual) as a DTensor on x's mesh: a plain weight or bias is taken
    as replicated (its gradient then arrives summed over the mesh, on every rank)."""
    if p is None or is_dtensor(p):
        return p
    from torch.distributed.tensor import DTensor, Replicate

    if name == "residual":
        raise TypeError(
            "residual must be a DTensor when input is one (got a torch.Tensor): make it one on "
            "input's mesh, e.g. DTensor.from_local(residual, mesh, placements)"
        )
    mesh = x.device_mesh
    return DTensor.from_local(p, mesh, [Replicate()] * mesh.ndim, run_check=False)


def _without_partial(x):
    """x with each Partial placement reduced (Replicate): a sum of partial rows is normalized
    only once it is summed."""
    from torch.distributed.tensor import Replicate

    if not any(p.is_partial() for p in x.placements):
        return x
    return x.redistribute(
        x.device_mesh, [Replicate() if p.is_partial() else p for p in x.placements]
    )


def _normalized_mesh_dims(x, norm_dims: int) -> list[int] | None:
    """The mesh dims that shard a normalized dim of x (each by a plain Shard), or None when no
    mesh dim does, or one shards it in another way (DTensor then redistributes under the ops'
    rules)."""
    from torch.distributed.tensor import Shard

    lead = x.ndim - norm_dims
    dims = []
    for i, p in enumerate(x.placements):
        if p.is_shard() and p.dim >= lead:
            if type(p) is not Shard:
                return None
            dims.append(i)
    return dims or None


def rms_norm(x, norm_dims, weight, bias, opts):
    """rms_norm of the DTensor x (see the section comment); ``opts`` a
    :class:`rmsnorm.reference.RMSOptions`."""
    from ._opcall import call

    weight, bias = _as_dtensor(weight, x, "weight"), _as_dtensor(bias, x, "bias")
    x = _without_partial(x)
    mesh_dims = _normalized_mesh_dims(x, norm_dims)
    if mesh_dims is None:
        return call.rms_norm_fwd(x, norm_dims, weight, bias, opts)[0]
    rows = _Rows(x, norm_dims, mesh_dims)
    return rows.dtensor(rows.rms_norm(rows.local(x), x.dtype, weight, bias, opts))


def add_rms_norm(x, residual, norm_dims, weight, bias, opts):
    """add_rms_norm of the DTensors x and residual (see the section comment)."""
    if not is_dtensor(x):
        raise TypeError(
            "input must be a DTensor when residual is one (got a torch.Tensor): make it one on "
            "residual's mesh, e.g. DTensor.from_local(input, mesh, placements)"
        )
    residual = _as_dtensor(residual, x, "residual")
    weight, bias = _as_dtensor(weight, x, "weight"), _as_dtensor(bias, x, "bias")
    x = _without_partial(x)
    residual = residual.redistribute(x.device_mesh, x.placements)
    mesh_dims = _normalized_mesh_dims(x, norm_dims)
    if mesh_dims is None:
        from ._opcall import call

        y, h, _ = call.add_rms_norm_fwd(x, residual, norm_dims, weight, bias, opts)
        return y, h
    rows = _Rows(x, norm_dims, mesh_dims)
    cd = torch.promote_types(ref.compute_dtype(x.dtype), ref.compute_dtype(residual.dtype))
    # As the spec: summed in the compute dtype, stored (and normalized) in the residual's dtype.
    h = (rows.local(x).to(cd) + rows.local(residual).to(cd)).to(residual.dtype)
    return rows.dtensor(rows.rms_norm(h, x.dtype, weight, bias, opts)), rows.dtensor(h)


def layer_norm(x, norm_dims, weight, bias, eps):
    """layer_norm of the DTensor x (see the section comment)."""
    weight, bias = _as_dtensor(weight, x, "weight"), _as_dtensor(bias, x, "bias")
    x = _without_partial(x)
    mesh_dims = _normalized_mesh_dims(x, norm_dims)
    if mesh_dims is None:
        return torch.ops.rmsnorm.layer_norm_fwd(x, norm_dims, weight, bias, eps)[0]
    rows = _Rows(x, norm_dims, mesh_dims)
    xc = rows.local(x).to(ref.compute_dtype(x.dtype))  # gradients meet here, in fp32 or fp64
    xd = xc.to(torch.float64)
    mean, var = rows.mean_var(xd)
    # (x − μ)·r in float64, rounded once: x − μ cannot overflow there as it can in float32.
    y = ((xd - mean[:, None]) * torch.rsqrt(var + eps)[:, None]).to(xc.dtype)
    w, b = rows.param(weight), rows.param(bias)
    if w is not None:
        y = y * w.to(xc.dtype)
    if b is not None:
        y = y + b.to(xc.dtype)
    return rows.dtensor(y.to(x.dtype))


class _Rows:
    """A DTensor x whose normalized dims are sharded over the mesh dims ``mesh_dims``, seen as
    this rank's (M, n) block of rows: M local rows, n of each row's N elements."""

    def __init__(self, x, norm_dims: int, mesh_dims: list[int]) -> None:
        from torch.distributed.tensor import Partial, Replicate
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        self.x, self.mesh, self.mesh_dims = x, x.device_mesh, mesh_dims
        self.lead = lead = x.ndim - norm_dims
        self.local_shape, self.offset = compute_local_shape_and_global_offset(
            x.shape, self.mesh, x.placements
        )
        self.m = math.prod(self.local_shape[:lead])
        self.n = math.prod(self.local_shape[lead:])
        self.big_n = math.prod(x.shape[lead:])
        # d weight / d bias: this rank's rows and this rank's slice of the row, a partial sum on
        # every mesh dim that shards x (zero outside the slice), as the ops' rules give it.
        self.grad_placements = [
            Partial("sum") if p.is_shard() else Replicate() for p in x.placements
        ]

    def local(self, t) -> torch.Tensor:
        """t's local shard (t laid out as x) as (M, n) rows."""
        return t.to_local().reshape(self.m, self.n)

    def param(self, p) -> torch.Tensor | None:
        """This rank's slice of a weight or bias, as an (n,) vector."""
        if p is None:
            return None
        from torch.distributed.tensor import Replicate

        if not all(q.is_replicate() for q in p.placements):
            p = p.redistribute(self.mesh, [Replicate()] * self.mesh.ndim)
        local = p.to_local(grad_placements=self.grad_placements)
        for d in range(self.lead, self.x.ndim):
            if self.local_shape[d] != self.x.shape[d]:
                local = local.narrow(d - self.lead, self.offset[d], self.local_shape[d])
        return local.reshape(self.n)

    def dtensor(self, rows: torch.Tensor):
        """(M, n) local rows as a DTensor laid out as x (contiguous)."""
        from torch.distributed.tensor import DTensor

        shape = self.x.shape
        return DTensor.from_local(
            rows.reshape(self.local_shape),
            self.mesh,
            self.x.placements,
            run_check=False,
            shape=shape,
            stride=_contiguous_strides(shape),
        )

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        for i in self.mesh_dims:
            t = _Collective.apply(t, "all_reduce", self.mesh, i)
        return t

    def index(self) -> torch.Tensor:
        """(n,) the position of each of this rank's elements in the row (flattened normalized
        dims), in local order."""
        device = self.x.device
        index = torch.zeros((), dtype=torch.int64, device=device)
        stride = 1
        for d in range(self.x.ndim - 1, self.lead - 1, -1):
            pos = torch.arange(self.local_shape[d], device=device) + self.offset[d]
            index = index.unsqueeze(0) + (pos * stride).reshape(-1, *([1] * index.dim()))
            stride *= self.x.shape[d]
        return index.reshape(self.n)

    def _first_k(self, k: int) -> torch.Tensor | None:
        """(n,) mask of this rank's elements among the first k of the row (flattened normalized
        dims, in order), or None when k = N."""
        if k >= self.big_n:
            return None
        return self.index() < k

    def rms_norm(self, xl, in_dtype, weight, bias, opts):
        """RMSNorm of the local rows xl with ``in_dtype`` the input dtype of the casting mode.
        The value is the spec's (:func:`rmsnorm.reference.rms_norm_apply`, its roundings
        included); the gradient is the spec's backward (docs/spec.md, section 3): that of the
        unrounded function in the compute dtype, with x̂ rounded to the input dtype for d weight
        in ``"llama"`` mode."""
        casting_mode = opts.casting_mode
        cd = torch.promote_types(ref.compute_dtype(xl.dtype), ref.compute_dtype(in_dtype))
        xc = xl.to(cd)  # gradients meet here, in fp32 or fp64
        r = self.rms_rstd(xc.to(torch.float64), opts).to(cd)
        w, b = self.param(weight), self.param(bias)
        xhat = xc * r[:, None]
        if casting_mode == "llama":  # d weight sees x̂ as the forward rounded it
            xhat = xhat + (xhat.detach().to(in_dtype).to(cd) - xhat.detach())
        y = xhat
        if w is not None:
            offset = opts.offset
            y = y * (w.to(cd) + offset if offset != 0.0 else w.to(cd))
        if b is not None:
            y = y + b.to(cd)
        out_dtype = ref.output_dtype(in_dtype, weight, casting_mode)
        y = y.to(out_dtype)
        if casting_mode == "gemma":  # rounded once, at the end: its own value
            return y
        with torch.no_grad():
            value = ref.rms_norm_apply(
                xl.detach(),
                r.detach(),
                None if w is None else w.detach(),
                None if b is None else b.detach(),
                opts,
                in_dtype,
            )
        return _ValueOf.apply(value, y)

    def rms_rstd(self, xd: torch.Tensor, opts) -> torch.Tensor:
        """r per row from the first k elements (ε, its form and k from ``opts``), x given in
        float64 (squares of any float32 value and their sums cannot overflow there): Σx² of this
        rank's part of each row, all-reduced, then the spec's ε form
        (:func:`rmsnorm.reference.rstd_from_mean_square`)."""
        k = opts.k
        sq = xd.square()
        mask = self._first_k(k)
        if mask is not None:
            sq = sq * mask
        ms = self._all_reduce(sq.sum(dim=-1)) / k  # (M,)
        return ref.rstd_from_mean_square(ms, opts.eps, opts.eps_mode)

    def mean_var(self, xd: torch.Tensor):
        """(μ, σ²) per row in float64: each rank's count, mean and Σ(x − mean)² of its part
        (two-pass), gathered and merged in rank order (Chan et al.'s pairwise update), so that
        no Σx² − (Σx)²/N cancellation enters."""
        count = torch.full((self.m,), float(self.n), dtype=torch.float64, device=xd.device)
        if self.n:
            mean = xd.mean(dim=-1)
            m2 = (xd - mean[:, None]).square().sum(dim=-1)
        else:  # an empty shard (uneven sharding): nothing to add
            mean = m2 = torch.zeros_like(count)
        for i in self.mesh_dims:
            world = self.mesh.size(i)
            stats = torch.stack([count, mean, m2])  # (3, M)
            parts = _Collective.apply(stats, "all_gather", self.mesh, i).reshape(world, 3, self.m)
            count, mean, m2 = parts[0]
            for j in range(1, world):
                count_j, mean_j, m2_j = parts[j]
                total = count + count_j
                share = torch.where(total > 0, count_j / total.clamp_min(1.0), 0.0)
                delta = mean_j - mean
                mean = mean + delta * share
                m2 = m2 + m2_j + delta * delta * count * share
                count = total
        return mean, m2 / self.big_n


# ----------------------------------------------------------------------------------------------
# Grouped and gated calls on DTensors. Rows sharded or replicated run the op under the rules above.
# Normalized dims sharded so that every rank holds whole groups (Mamba2's n_groups split over
# tensor-parallel ranks; a per-head norm with the heads sharded) are normalized where they lie:
# each rank runs the op on its own groups with its slice of the weight, and no collective. One
# group (no group_size) sharded takes the plain norm's path: one all-reduce of the row statistics.
# Groups cut by the sharding are refused, naming the shard boundaries a group must not cross.
# ----------------------------------------------------------------------------------------------
def gated_rms_norm(x, gate, norm_dims, weight, bias, opts, gating, input_dtype):
    """y of the grouped / gated op on the DTensor x (see the section comment)."""
    if gate is not None and not is_dtensor(gate):
        raise TypeError(
            "gate must be a DTensor when input is one (got a torch.Tensor): make it one on "
            "input's mesh, e.g. DTensor.from_local(gate, mesh, placements)"
        )
    if not is_dtensor(x):
        raise TypeError(
            "input must be a DTensor when gate is one (got a torch.Tensor): make it one on "
            "gate's mesh, e.g. DTensor.from_local(input, mesh, placements)"
        )
    weight, bias = _as_dtensor(weight, x, "weight"), _as_dtensor(bias, x, "bias")
    x = _without_partial(x)
    if gate is not None:
        gate = gate.redistribute(x.device_mesh, x.placements)
    from ._opcall import call

    mesh_dims = _normalized_mesh_dims(x, norm_dims)
    if mesh_dims is None:
        return call.gated_rms_norm_fwd(x, gate, norm_dims, weight, bias, opts, gating, input_dtype)[
            0
        ]
    rows = _Rows(x, norm_dims, mesh_dims)
    index = rows.index()
    group_size = gating.group_size
    g = rows.big_n if group_size is None else group_size
    if rows.n == 0 or _whole_groups(index, g):
        return _local_groups(rows, index, x, gate, weight, bias, opts, gating, input_dtype)
    if group_size is None:
        return _one_group(rows, x, gate, weight, bias, opts, gating, input_dtype)
    raise ValueError(
        f"gated_rms_norm / grouped rms_norm: input is a DTensor sharded on its normalized dims "
        f"(placements {list(x.placements)}, shape {list(x.shape)}) so that a rank holds part of "
        f"a group of group_size={g}; each rank must hold whole groups (shard boundaries at "
        "multiples of group_size in the flattened normalized dims), or redistribute the "
        "normalized dims to Replicate() first"
    )


def _whole_groups(index: torch.Tensor, g: int) -> bool:
    """Whether the local elements (their indices in the flattened row, in local order) are whole
    groups of g, each in order."""
    n = index.numel()
    if n % g:
        return False
    runs = index.reshape(-1, g)
    starts = runs[:, 0]
    step = torch.arange(g, device=index.device).expand_as(runs)
    return bool(((starts % g) == 0).all()) and torch.equal(runs - starts[:, None], step)


def _local_groups(rows, index, x, gate, weight, bias, opts, gating, input_dtype):
    """Each rank's whole groups through the op, its slice of the weight gathered by index."""

    def local_param(p):
        if p is None:
            return None
        from torch.distributed.tensor import Replicate

        if not all(q.is_replicate() for q in p.placements):
            p = p.redistribute(rows.mesh, [Replicate()] * rows.mesh.ndim)
        local = p.to_local(grad_placements=rows.grad_placements).reshape(-1)
        return local.index_select(0, index)

    from ._opcall import call

    g = rows.big_n if gating.group_size is None else gating.group_size
    xl = rows.local(x)
    zl = None if gate is None else rows.local(gate)
    local_gating = gating._replace(group_size=None if rows.n == g else g)
    y, _ = call.gated_rms_norm_fwd(
        xl, zl, 1, local_param(weight), local_param(bias), opts, local_gating, input_dtype
    )
    return rows.dtensor(y)


def _one_group(rows, x, gate, weight, bias, opts, gating, input_dtype):
    """One group (the whole row) sharded: the plain norm's one all-reduce (``_Rows.rms_norm``),
    with the gate applied as the spec applies it (docs/conventions.md, the gated casting table):
    before the norm, u = x ⊙ act(z) is normalized; after it, n (unrounded in "gemma") times
    act(z) in the compute dtype, rounded to the input dtype ("none": all in the input dtype)."""
    _, norm_before_gate, activation = gating
    casting_mode = opts.casting_mode
    in_dtype = x.dtype if input_dtype is None else input_dtype
    xl = rows.local(x)
    cd = torch.promote_types(ref.compute_dtype(xl.dtype), ref.compute_dtype(in_dtype))
    if gate is None:
        return rows.dtensor(rows.rms_norm(xl, in_dtype, weight, bias, opts))
    a = ref.gate_activation(rows.local(gate).to(cd), activation)
    if not norm_before_gate:
        if casting_mode == "none":
            u = xl.to(in_dtype) * a.to(in_dtype)
        else:
            u = xl.to(cd) * a
        return rows.dtensor(rows.rms_norm(u, in_dtype, weight, bias, opts))
    if casting_mode == "none":
        n = rows.rms_norm(xl, in_dtype, weight, bias, opts)
        return rows.dtensor(n * a.to(in_dtype))
    n = rows.rms_norm(xl, cd if casting_mode == "gemma" else in_dtype, weight, bias, opts)
    return rows.dtensor((n.to(cd) * a).to(in_dtype))


class _ValueOf(torch.autograd.Function):
    """``value`` forward, the gradient of ``graph`` backward (the same shape and dtype): the
    spec's rounded output with the spec's derivative."""

    @staticmethod
    def forward(ctx, value, graph):
        return value

    @staticmethod
    def backward(ctx, grad):
        return None, grad


# The collectives as one autograd function, each the adjoint of another (torch registers these
# formulas for its functional collectives only in recent versions): an all-reduce's backward
# all-reduces the gradient; an all-gather's reduce-scatters it; a reduce-scatter's all-gathers it.
_ADJOINT = {
    "all_reduce": "all_reduce",
    "all_gather": "reduce_scatter",
    "reduce_scatter": "all_gather",
}


def _collective(kind: str, t: torch.Tensor, mesh, dim: int) -> torch.Tensor:
    """``kind`` of t over mesh dim ``dim``, summing; gathered and scattered along dim 0, in rank
    order."""
    from torch.distributed import _functional_collectives as funcol

    group = (mesh, dim)
    if kind == "all_reduce":
        out = funcol.all_reduce(t, "sum", group)
    elif kind == "all_gather":
        gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
        out = gather(t.contiguous(), 0, group)
    else:
        scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
        out = scatter(t.contiguous(), "sum", 0, group)
    return funcol.wait_tensor(out)


class _Collective(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, kind, mesh, dim):
        ctx.adjoint = (_ADJOINT[kind], mesh, dim)
        return _collective(kind, t, mesh, dim)

    @staticmethod
    def backward(ctx, grad):
        return _Collective.apply(grad, *ctx.adjoint), None, None, None


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
