"""Distributed training with this library's norms, on 2 local processes (gloo): DDP and FSDP2 end
with the parameters of single-process training on the same global batch; sequence parallelism on
plain tensors gives the whole sequence's d weight after all_reduce_norm_grads; on DTensors
(``parallelize_module`` plans, direct calls, torch.compile) the ops' sharding rules give what
``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm`` give in the same plan; beyond torch, plain weights
are taken as replicated and inputs sharded on a normalized dim are normalized in place with one
collective of the row statistics, forward and backward, as whole tensors are; grouped and gated
inputs sharded on group boundaries with no collective, across them refused."""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import socket
import subprocess
import sys
import time
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import rmsnorm
from rmsnorm import _dtensor
from rmsnorm.integrations.distributed import all_reduce_norm_grads, norm_parameters

WORLD = 2
STEPS = 3
BATCH, SEQ, DIM = 4, 6, 24  # global batch, tokens per sequence, hidden size
TIMEOUT_S = 240  # whole launch, both processes (2 torch imports on a busy 2-core machine)
CHECKS = (
    "ddp",
    "fsdp2",
    "sequence_parallel",
    "dtensor_plan",
    "dtensor_add_rms_norm",
    "dtensor_functional",
    "dtensor_compile",
    "dtensor_plain_parameters",
    "dtensor_normalized_dim_sharded",
    "dtensor_normalized_dim_low_precision",
    "dtensor_normalized_dim_double_backward",
    "dtensor_normalized_dim_2d_mesh",
    "dtensor_normalized_dim_compile",
    "dtensor_partial_and_sharded_parameters",
    "dtensor_gated_rows_sharded",
    "dtensor_gated_groups_sharded",
    "dtensor_gated_one_group_sharded",
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = rmsnorm.RMSNorm(DIM, eps=1e-6, bias=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    """Pre-norm residual blocks using the library's RMSNorm (with bias) and LayerNorm, then a
    linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.norm_f = rmsnorm.LayerNorm(DIM)
        self.head = nn.Linear(DIM, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm_f(x))


def data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, SEQ, DIM, generator=g), torch.randn(BATCH, SEQ, 8, generator=g)


def make_model() -> TinyLM:
    torch.manual_seed(0)
    model = TinyLM()
    with torch.no_grad():  # norm parameters away from their init, so their gradients matter
        for p in norm_parameters(model):
            p.add_(0.3 * torch.randn_like(p))
    return model


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()  # mean: DDP/FSDP average across ranks
        opt.step()


def assert_params_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, p in want.items():
        torch.testing.assert_close(
            got[name], p, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
        )


def single_process_reference() -> dict:
    model = make_model()
    train(model, *data())
    return {n: p.detach() for n, p in model.named_parameters()}


def check_ddp(rank: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = data()
    rows = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)  # this rank's half
    ddp = DDP(make_model())
    train(ddp, x[rows], y[rows])
    got = {n.removeprefix("module."): p.detach() for n, p in ddp.named_parameters()}
    assert_params_close(got, single_process_reference())


def check_fsdp2(rank: int) -> None:
    from torch.distributed.fsdp import fully_shard

    x, y = data()
    rows = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    model = make_model()
    for block in model.blocks:
        fully_shard(block)  # norm weights are sharded DTensors between steps
    fully_shard(model)
    train(model, x[rows], y[rows])
    got = {n: p.full_tensor().detach() for n, p in model.named_parameters()}
    assert_params_close(got, single_process_reference())


def check_sequence_parallel(rank: int) -> None:
    """Each rank normalizes half of every sequence; d input is local, d weight / d bias are partial
    sums until all_reduce_norm_grads adds them up."""
    x, _ = data()
    cot = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    cols = slice(rank * SEQ // WORLD, (rank + 1) * SEQ // WORLD)
    norms = [make_model().blocks[0].norm, make_model().norm_f]
    for norm in norms:
        full = copy.deepcopy(norm)
        x_full = x.clone().requires_grad_(True)
        (full(x_full) * cot).sum().backward()
        x_local = x[:, cols].clone().requires_grad_(True)
        (norm(x_local) * cot[:, cols]).sum().backward()
        assert all_reduce_norm_grads(norm) == len(list(norm.parameters()))
        torch.testing.assert_close(x_local.grad, x_full.grad[:, cols], rtol=1e-5, atol=1e-6)
        for p, p_full in zip(norm.parameters(), full.parameters(), strict=True):
            torch.testing.assert_close(p.grad, p_full.grad, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# DTensor: the ops' sharding rules under tensor / sequence parallel plans
# ----------------------------------------------------------------------------------------------
def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD,))


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


def _op_node(t: torch.Tensor) -> bool:
    """Whether t was made by a custom op's registered autograd (not the eager autograd.Function
    path, which only plain tensors take)."""
    return "rmsnorm_" in type(t.grad_fn).__name__


class SPBlock(nn.Module):
    """A pre-norm MLP block laid out as torchtitan parallelizes one: the norm sequence-parallel,
    the MLP column- then row-parallel, the residual stream each rank's slice of the sequence."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class SPModel(nn.Module):
    def __init__(self, rms_cls: type, ln_cls: type) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([SPBlock(rms_cls(DIM, eps=1e-6)), SPBlock(ln_cls(DIM))])
        self.norm_f = rms_cls(DIM, eps=1e-6)
        self.head = nn.Linear(DIM, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm_f(x))


def sp_model(ours: bool) -> SPModel:
    """The same model with this library's norms or torch's (same initial parameters)."""
    torch.manual_seed(0)
    model = (
        SPModel(rmsnorm.RMSNorm, rmsnorm.LayerNorm) if ours else SPModel(nn.RMSNorm, nn.LayerNorm)
    )
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in norm_parameters(model):
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def sp_plan() -> dict:
    """A torchtitan-style plan: norms SequenceParallel, MLPs Colwise/Rowwise, the head gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {
        "norm_f": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(2):
        plan[f"blocks.{i}.norm"] = SequenceParallel()
        plan[f"blocks.{i}.up"] = ColwiseParallel(input_layouts=Shard(1))
        plan[f"blocks.{i}.down"] = RowwiseParallel(output_layouts=Shard(1))
    return plan


def check_dtensor_plan(rank: int) -> None:
    """parallelize_module with SequenceParallel norms: this library's RMSNorm / LayerNorm give
    torch's outputs (Shard(1)), gradients (d weight Partial(sum)) and parameters after training
    (SGD: Adam's first steps would turn rounding-level differences of tiny gradients into lr-size
    ones)."""
    from torch.distributed.tensor import Partial, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    x, y = data()
    cols = slice(rank * SEQ // WORLD, (rank + 1) * SEQ // WORLD)
    runs = []
    for ours in (True, False):
        model = parallelize_module(sp_model(ours), _mesh(), sp_plan())
        norm_outputs = []
        for m in model.modules():
            if isinstance(m, (nn.RMSNorm, nn.LayerNorm)):
                m.register_forward_hook(lambda mod, args, out, outs=norm_outputs: outs.append(out))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            logits = model(x[:, cols])
            nn.functional.mse_loss(logits, y).backward()
            if step == 0:
                first = logits.detach(), list(norm_outputs)
                grads = {n: p.grad.detach() for n, p in model.named_parameters()}
            opt.step()
        params = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
        runs.append((*first, grads, params))
    (logits, outs, grads, params), (logits_t, outs_t, grads_t, params_t) = runs
    _close(logits, logits_t, "logits")
    assert len(outs) == len(outs_t) == 3
    for out, out_t in zip(outs, outs_t, strict=True):
        assert out.placements == out_t.placements == (Shard(1),), (out.placements, out_t.placements)
        assert _op_node(out), type(out.grad_fn).__name__
        _close(out.full_tensor(), out_t.full_tensor(), "norm output")
    for name in norm_names(grads):
        g, g_t = grads[name], grads_t[name]
        assert g.placements == g_t.placements == (Partial("sum"),), (name, g, g_t)
        _close(g.full_tensor(), g_t.full_tensor(), f"{name}.grad")
    for name, p_t in params_t.items():
        _close(params[name], p_t, name)


def norm_names(grads: dict) -> list[str]:
    names = [n for n in grads if "norm" in n]
    assert len(names) == 4, names  # 2 RMSNorm weights, 1 LayerNorm weight and bias
    return names


def check_dtensor_add_rms_norm(rank: int) -> None:
    """AddRMSNorm takes two inputs (SequenceParallel converts only the first): distributed with
    both inputs Shard(1), it gives what torch.nn.RMSNorm of their sum gives."""
    from torch.distributed.tensor import DTensor, Shard, distribute_module

    x, _ = data()
    res, cot = data(2)[0], data(3)[0]
    cols = slice(rank * SEQ // WORLD, (rank + 1) * SEQ // WORLD)

    def shard_inputs(module, inputs, mesh):
        return tuple(DTensor.from_local(t, mesh, [Shard(1)], run_check=False) for t in inputs)

    class TorchAddRMSNorm(nn.RMSNorm):
        def forward(self, x, residual):
            h = x + residual
            return super().forward(h), h

    runs = []
    for norm in (rmsnorm.AddRMSNorm(DIM, eps=1e-6), TorchAddRMSNorm(DIM, eps=1e-6)):
        with torch.no_grad():
            norm.weight.add_(0.3 * torch.randn(DIM, generator=torch.Generator().manual_seed(4)))
        distribute_module(norm, _mesh(), input_fn=shard_inputs)
        x_local = x[:, cols].clone().requires_grad_(True)
        res_local = res[:, cols].clone().requires_grad_(True)
        out, h = norm(x_local, res_local)
        assert out.placements == h.placements == (Shard(1),), (out.placements, h.placements)
        cot_d = DTensor.from_local(cot[:, cols], out.device_mesh, [Shard(1)])
        ((out * cot_d).sum() + (h * h).sum()).backward()
        runs.append((out, h, x_local.grad, res_local.grad, norm.weight.grad))
    assert _op_node(runs[0][0])
    names = ("out", "h", "d input", "d residual")
    for what, got, want in zip(names, runs[0][:4], runs[1][:4], strict=True):
        _close(_full(got), _full(want), what)
    assert runs[0][4].placements == runs[1][4].placements, (runs[0][4], runs[1][4])
    _close(runs[0][4].full_tensor(), runs[1][4].full_tensor(), "d weight")


_X_SHAPE = (3, 5, 4, 6)  # 3 and 5 rows do not split evenly over 2 ranks


def _functional_cases(shape: tuple[int, ...]) -> dict:
    """name -> fn(x, residual, weight, bias) returning a tuple of outputs, over ``shape``."""
    return {
        "rms_norm": lambda x, r, w, b: (
            rmsnorm.rms_norm(x, shape, w, 1e-6, eps_mode="rms", offset=0.5, bias=b),
        ),
        "add_rms_norm": lambda x, r, w, b: rmsnorm.add_rms_norm(x, r, shape, w, 1e-6, bias=b),
        "layer_norm": lambda x, r, w, b: (rmsnorm.layer_norm(x, shape, w, b),),
    }


def _run_functional(fn, tensors, cot, placements):
    """fn's outputs and the gradients of its inputs, on plain tensors (placements None) or on
    DTensors laid out as ``placements`` (one per input) over the mesh."""
    from torch.distributed.tensor import distribute_tensor

    if placements is None:
        inputs = [t.clone().requires_grad_(True) for t in tensors]
    else:
        mesh = _mesh()
        inputs = [
            distribute_tensor(t, mesh, [p]).requires_grad_(True)
            for t, p in zip(tensors, placements, strict=True)
        ]
    outs = fn(*inputs)
    loss = sum(
        (o * (cot if placements is None else distribute_tensor(cot, mesh, o.placements))).sum()
        for o in outs
    )
    loss.backward()
    return outs, [t.grad for t in inputs]


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check_dtensor_functional(rank: int) -> None:
    """rms_norm / add_rms_norm / layer_norm on DTensors whose rows are sharded (evenly or not)
    or replicated: outputs and d input sharded as the input, d weight / d bias Partial(sum) when
    the rows are sharded, values those of the same call on whole tensors."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    g = torch.Generator().manual_seed(5)
    x, res, cot = (torch.randn(_X_SHAPE, generator=g) for _ in range(3))
    for shape in ((6,), (4, 6)):
        w, b = 1 + 0.3 * torch.randn(shape, generator=g), 0.1 * torch.randn(shape, generator=g)
        rows = len(_X_SHAPE) - len(shape)
        for p in [Shard(d) for d in range(rows)] + [Replicate()]:
            for name, fn in _functional_cases(shape).items():
                what = f"{name} over {shape}, input {p}"
                want, want_grads = _run_functional(fn, (x, res, w, b), cot, None)
                got, grads = _run_functional(
                    fn, (x, res, w, b), cot, (p, p, Replicate(), Replicate())
                )
                for o, o_want in zip(got, want, strict=True):
                    assert o.placements == (p,), (what, o.placements)
                    assert _op_node(o), (what, type(o.grad_fn).__name__)
                    _close(o.full_tensor(), o_want, what)
                param_grad = Partial("sum") if isinstance(p, Shard) else Replicate()
                expected = (p, p, param_grad, param_grad)
                for i, (gr, gr_want) in enumerate(zip(grads, want_grads, strict=True)):
                    if gr_want is None:  # rms_norm / layer_norm do not read the residual
                        assert gr is None, what
                        continue
                    assert gr.placements == (expected[i],), (what, i, gr.placements)
                    _close(gr.full_tensor(), gr_want, f"{what}, gradient {i}")


def check_dtensor_compile(rank: int) -> None:
    """torch.compile(fullgraph=True) of the sequence-parallel model: each op one graph node on
    DTensors; outputs and gradients those of eager."""
    from torch.distributed.tensor.parallel import parallelize_module

    x, y = data()
    cols = slice(rank * SEQ // WORLD, (rank + 1) * SEQ // WORLD)
    runs = []
    for compiled in (False, True):
        model = parallelize_module(sp_model(True), _mesh(), sp_plan())
        fn = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
        logits = fn(x[:, cols])
        nn.functional.mse_loss(logits, y).backward()
        runs.append((logits, {n: p.grad.full_tensor() for n, p in model.named_parameters()}))
    (logits, grads), (logits_c, grads_c) = runs
    _close(logits_c, logits, "compiled logits")
    for name, grad in grads.items():
        _close(grads_c[name], grad, f"compiled {name}.grad")


# ----------------------------------------------------------------------------------------------
# DTensor beyond torch's rules: plain parameters, and inputs sharded on a normalized dim
# normalized with one collective of the row statistics instead of gathering the rows
# ----------------------------------------------------------------------------------------------
def _rms_options():
    """name -> rms_norm's keywords (``with_bias``: pass the bias), for the options that change
    what is computed or reduced."""
    return {
        "default": {},
        "eps_rms_offset_bias": dict(eps_mode="rms", offset=0.5, with_bias=True),
        "partial_spanning_shards": dict(partial=0.8),  # k = 4 of 5 (3 + 2), 16 of 20
        "partial_within_a_shard": dict(partial=0.25, eps_mode="rms"),  # k = 1 of 5, 5 of 20
        "llama": dict(casting_mode="llama", with_bias=True),
        "none": dict(casting_mode="none", offset=1.0),
    }


def _rms_call(options, shape):
    options = dict(options)
    with_bias = options.pop("with_bias", False)

    def rms(x, r, w, b):
        return (rmsnorm.rms_norm(x, shape, w, 1e-6, bias=b if with_bias else None, **options),)

    def add(x, r, w, b):
        return rmsnorm.add_rms_norm(x, r, shape, w, 1e-6, bias=b if with_bias else None, **options)

    return rms, add


def _sharded_cases(shape):
    """name -> fn(x, residual, weight, bias) for every function and option set over ``shape``."""
    cases = {}
    for name, options in _rms_options().items():
        rms, add = _rms_call(options, shape)
        cases[f"rms_norm {name}"] = rms
        if name in ("default", "eps_rms_offset_bias", "partial_spanning_shards"):
            cases[f"add_rms_norm {name}"] = add
    cases["layer_norm"] = lambda x, r, w, b: (rmsnorm.layer_norm(x, shape, w, b),)
    cases["layer_norm no affine"] = lambda x, r, w, b: (rmsnorm.layer_norm(x, shape),)
    return cases


def _comms(mode) -> dict[str, int]:
    return {str(op).rsplit(".", 1)[-1]: n for op, n in mode.get_comm_counts().items()}


def _distributed_run(
    fn, tensors, cot, placements, params_plain=False, create_graph=False, count=True
):
    """fn on DTensors laid out as ``placements`` (x, residual, weight, bias; weight and bias plain
    tensors with ``params_plain``): outputs, gradients, the inputs, and the collectives of forward
    and backward (names -> counts)."""
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = _mesh()
    inputs = [
        distribute_tensor(t, mesh, [p]) for t, p in zip(tensors[:2], placements[:2], strict=True)
    ]
    if params_plain:
        inputs += [t.clone() for t in tensors[2:]]
    else:
        inputs += [
            distribute_tensor(t, mesh, [p])
            for t, p in zip(tensors[2:], placements[2:], strict=True)
        ]
    for t in inputs:
        t.requires_grad_(True)
    # (torch.compile refuses to run under a dispatch mode such as CommDebugMode)
    with CommDebugMode() if count else contextlib.nullcontext() as fwd:
        outs = fn(*inputs)
    cots = [distribute_tensor(cot.to(o.dtype), mesh, o.placements) for o in outs]
    loss = sum((o * c).sum() for o, c in zip(outs, cots, strict=True))  # reduced: not counted
    with CommDebugMode() if count else contextlib.nullcontext() as bwd:
        grads = torch.autograd.grad(loss, inputs, allow_unused=True, create_graph=create_graph)
    return outs, grads, inputs, count and _comms(fwd), count and _comms(bwd)


def _whole_run(fn, tensors, cot, create_graph=False):
    inputs = [t.clone().requires_grad_(True) for t in tensors]
    outs = fn(*inputs)
    loss = sum((o * cot.to(o.dtype)).sum() for o in outs)
    grads = torch.autograd.grad(loss, inputs, allow_unused=True, create_graph=create_graph)
    return outs, grads, inputs


def check_dtensor_normalized_dim_sharded(rank: int) -> None:
    """Inputs sharded on a normalized dim (evenly or not, the outer or the inner of two): output
    and d input stay sharded as the input; the forward runs exactly one collective of the row
    statistics (an all-reduce of Σx² for RMSNorm, an all-gather of each rank's count, mean and
    Σ(x − mean)² for LayerNorm) and no gather of the rows; the backward one more, its adjoint;
    d weight / d bias are partial sums; values and gradients those of whole tensors, for every
    option."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    g = torch.Generator().manual_seed(6)
    x_shape = (3, 5, 4, 5)  # 5 = 3 + 2 on two ranks
    x = torch.randn(x_shape, generator=g, dtype=torch.float64) + 1.5  # a mean: LN ≠ RMS
    res, cot = (torch.randn(x_shape, generator=g, dtype=torch.float64) for _ in range(2))
    for shape, p in (((5,), Shard(3)), ((4, 5), Shard(2)), ((4, 5), Shard(3))):
        w = 1 + 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
        b = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        for name, fn in _sharded_cases(shape).items():
            what = f"{name} over {shape}, input {p}"
            want, want_grads, _ = _whole_run(fn, (x, res, w, b), cot)
            outs, grads, _, fwd, bwd = _distributed_run(
                fn, (x, res, w, b), cot, (p, p, Replicate(), Replicate())
            )
            stat = "all_gather_into_tensor" if name.startswith("layer_norm") else "all_reduce"
            assert fwd == {stat: 1}, (what, fwd)
            adjoint = "reduce_scatter_tensor" if stat != "all_reduce" else "all_reduce"
            assert bwd == {adjoint: 1}, (what, bwd)
            for o, o_want in zip(outs, want, strict=True):
                assert o.placements == (p,), (what, o.placements)
                _close(o.full_tensor(), o_want, what)
            for i, (gr, gr_want) in enumerate(zip(grads, want_grads, strict=True)):
                if gr_want is None:
                    assert gr is None, (what, i)
                    continue
                assert gr.placements == ((p,) if i < 2 else (Partial("sum"),)), (what, i, gr)
                _close(gr.full_tensor(), gr_want, f"{what}, gradient {i}")


def check_dtensor_normalized_dim_low_precision(rank: int) -> None:
    """bfloat16 inputs with a float32 weight (the casting modes differ there) sharded on the
    normalized dim: within the shared tolerance rule of the float64 result, as the whole-tensor
    call in bfloat16 is; float32 rows whose statistics overflow float32 too."""
    from torch.distributed.tensor import Replicate, Shard

    from rmsnorm.testing import assert_close_to_reference

    g = torch.Generator().manual_seed(7)
    x64 = torch.randn(6, 4, 48, generator=g, dtype=torch.float64) * 3 + 1
    res64, cot64 = (torch.randn(6, 4, 48, generator=g, dtype=torch.float64) for _ in range(2))
    w64 = 1 + 0.3 * torch.randn(48, generator=g, dtype=torch.float64)
    b64 = 0.1 * torch.randn(48, generator=g, dtype=torch.float64)
    for name, fn in _sharded_cases((48,)).items():
        tensors = (x64.bfloat16(), res64.bfloat16(), w64.float(), b64.float())
        outs, grads, _, _, _ = _distributed_run(
            fn, tensors, cot64, (Shard(2), Shard(2), Replicate(), Replicate())
        )
        eager, eager_grads, _ = _whole_run(fn, tensors, cot64)
        want, want_grads, _ = _whole_run(fn, tuple(t.double() for t in tensors), cot64)
        for o, e, o_want in zip(outs, eager, want, strict=True):
            assert_close_to_reference(o.full_tensor(), o_want, e, name=f"{name} output")
        for i, (gr, e, gr_want) in enumerate(zip(grads, eager_grads, want_grads, strict=True)):
            if gr is not None:
                rows = 24 if i >= 2 else 1
                assert_close_to_reference(
                    gr.full_tensor(), gr_want, e, name=f"{name} grad {i}", rows=rows
                )
    # float32 rows near float32's largest value, whose statistics (and x − μ) overflow float32:
    # finite, as the spec's rescaled rows are.
    big = torch.randn(3, 48, generator=g, dtype=torch.float64)
    big[0] *= 1e37  # Σx² past float32's range
    big[1] = 3e38 + 1e36 * big[1]  # x − μ fine, μ near the top
    big[2] = 3e38 + 1e36 * big[2]
    big[2, ::16] = -3e38  # 3 of 48: μ ≈ 2.6e38, x − μ ≈ -5.6e38 past float32's range
    mesh = _mesh()
    from torch.distributed.tensor import distribute_tensor

    for name in ("rms_norm default", "layer_norm"):
        fn = _sharded_cases((48,))[name]
        got = fn(distribute_tensor(big.float(), mesh, [Shard(1)]), None, None, None)[0]
        eager = fn(big.float(), None, None, None)[0]
        want = fn(big, None, None, None)[0]
        assert torch.isfinite(got.full_tensor()).all(), name
        assert_close_to_reference(got.full_tensor(), want, eager, name=f"{name} near overflow")


def check_dtensor_plain_parameters(rank: int) -> None:
    """A plain weight / bias with a DTensor input is taken as replicated on the input's mesh: the
    results are those of whole tensors and the plain parameters' gradients arrive summed over the
    mesh, the same on every rank. A plain residual is refused, saying what to do."""
    from torch.distributed.tensor import Replicate, Shard

    g = torch.Generator().manual_seed(8)
    x, res, cot = (torch.randn(_X_SHAPE, generator=g) for _ in range(3))
    w, b = 1 + 0.3 * torch.randn(6, generator=g), 0.1 * torch.randn(6, generator=g)
    for p in (Shard(0), Shard(1), Replicate(), Shard(3)):
        for name, fn in _functional_cases((6,)).items():
            what = f"{name}, input {p}, plain weight and bias"
            want, want_grads, _ = _whole_run(fn, (x, res, w, b), cot)
            outs, grads, _, _, _ = _distributed_run(
                fn, (x, res, w, b), cot, (p, p), params_plain=True
            )
            for o, o_want in zip(outs, want, strict=True):
                _close(o.full_tensor(), o_want, what)
            for i in (2, 3):
                assert type(grads[i]) is torch.Tensor, (what, type(grads[i]))
                _close(grads[i], want_grads[i], f"{what}, gradient {i}")
    mesh = _mesh()
    from torch.distributed.tensor import distribute_tensor

    with pytest.raises(TypeError, match="residual must be a DTensor when input is one"):
        rmsnorm.add_rms_norm(distribute_tensor(x, mesh, [Shard(0)]), res, 6)
    with pytest.raises(TypeError, match="input must be a DTensor when residual is one"):
        rmsnorm.add_rms_norm(x, distribute_tensor(res, mesh, [Shard(0)]), 6)


def check_dtensor_normalized_dim_double_backward(rank: int) -> None:
    """create_graph=True through the collectives: second-order gradients those of whole
    tensors."""
    from torch.distributed.tensor import Replicate, Shard

    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, 4, 5, generator=g, dtype=torch.float64) + 1
    res, cot = (torch.randn(3, 4, 5, generator=g, dtype=torch.float64) for _ in range(2))
    w = 1 + 0.3 * torch.randn(5, generator=g, dtype=torch.float64)
    b = 0.1 * torch.randn(5, generator=g, dtype=torch.float64)
    cases = _sharded_cases((5,))
    names = (
        "rms_norm eps_rms_offset_bias",
        "rms_norm partial_spanning_shards",
        "rms_norm llama",
        "rms_norm none",
        "add_rms_norm default",
        "layer_norm",
    )
    for name in names:
        fn = cases[name]
        _, want_grads, inputs = _whole_run(fn, (x, res, w, b), cot, create_graph=True)
        want = torch.autograd.grad(want_grads[0].sin().sum(), inputs[0])[0]
        _, grads, inputs, _, _ = _distributed_run(
            fn,
            (x, res, w, b),
            cot,
            (Shard(2), Shard(2), Replicate(), Replicate()),
            create_graph=True,
        )
        got = torch.autograd.grad(grads[0].sin().sum(), inputs[0])[0]
        _close(grads[0].full_tensor(), want_grads[0], f"{name}, first order")
        _close(got.full_tensor(), want, f"{name}, second order")


def check_dtensor_normalized_dim_2d_mesh(rank: int) -> None:
    """A 2-D mesh (2 × 1): the normalized dim sharded on one mesh dim, the rows on the other:
    output sharded as the input, d weight partial over both, values those of whole tensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (WORLD, 1))
    g = torch.Generator().manual_seed(10)
    x, cot = (torch.randn(4, 3, 6, generator=g) for _ in range(2))
    w = 1 + 0.3 * torch.randn(6, generator=g)
    for name, fn in (
        ("rms_norm", lambda x, w: rmsnorm.rms_norm(x, 6, w, partial=0.5)),
        ("layer_norm", lambda x, w: rmsnorm.layer_norm(x, 6, w)),
    ):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        (fn(xr, wr) * cot).sum().backward()
        xd = distribute_tensor(x, mesh, [Shard(2), Shard(0)]).requires_grad_()
        wd = distribute_tensor(w, mesh, [Replicate(), Replicate()]).requires_grad_()
        y = fn(xd, wd)
        assert y.placements == (Shard(2), Shard(0)), (name, y.placements)
        (y * distribute_tensor(cot, mesh, y.placements)).sum().backward()
        _close(y.full_tensor(), fn(x, w), name)
        _close(xd.grad.full_tensor(), xr.grad, f"{name} d input")
        assert wd.grad.placements == (Partial("sum"),) * 2, (name, wd.grad.placements)
        _close(wd.grad.full_tensor(), wr.grad, f"{name} d weight")


def check_dtensor_normalized_dim_compile(rank: int) -> None:
    """torch.compile(fullgraph=True, aot_eager) of the functions on inputs sharded on the
    normalized dim: no graph break; outputs and gradients those of eager."""
    from torch.distributed.tensor import Replicate, Shard

    g = torch.Generator().manual_seed(11)
    x, res, cot = (torch.randn(2, 3, 8, generator=g) for _ in range(3))
    w, b = 1 + 0.3 * torch.randn(8, generator=g), 0.1 * torch.randn(8, generator=g)
    cases = {name: (fn, False) for name, fn in _functional_cases((8,)).items()}
    cases["rms_norm llama"] = (_sharded_cases((8,))["rms_norm llama"], False)  # _ValueOf
    cases["rms_norm, plain weight and bias"] = (_functional_cases((8,))["rms_norm"], True)
    for name, (fn, plain) in cases.items():
        runs = []
        for compiled in (False, True):
            torch._dynamo.reset()
            f = torch.compile(fn, backend="aot_eager", fullgraph=True) if compiled else fn
            outs, grads, _, _, _ = _distributed_run(
                f,
                (x, res, w, b),
                cot,
                (Shard(2), Shard(2), Replicate(), Replicate()),
                params_plain=plain,
                count=False,
            )
            runs.append([*outs, *(gr for gr in grads if gr is not None)])
        for i, (got, want) in enumerate(zip(*runs, strict=True)):
            assert type(got) is type(want), (name, i)
            if plain and i >= 1:
                _close(got, want, f"compiled {name}, tensor {i}")
                continue
            assert got.placements == want.placements, (name, i)
            _close(got.full_tensor(), want.full_tensor(), f"compiled {name}, tensor {i}")


def check_dtensor_partial_and_sharded_parameters(rank: int) -> None:
    """Partial inputs (a row-parallel matmul's output) are reduced first; a weight and bias
    sharded differently from the input are redistributed to match it."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    g = torch.Generator().manual_seed(12)
    x, res, cot = (torch.randn(_X_SHAPE, generator=g) for _ in range(3))
    w, b = 1 + 0.3 * torch.randn(6, generator=g), 0.1 * torch.randn(6, generator=g)
    for p, p_param in ((Shard(0), Shard(0)), (Shard(3), Shard(0))):
        for name, fn in _functional_cases((6,)).items():
            what = f"{name}, input {p}, weight and bias {p_param}"
            want, want_grads, _ = _whole_run(fn, (x, res, w, b), cot)
            outs, grads, _, _, _ = _distributed_run(
                fn, (x, res, w, b), cot, (p, p, p_param, p_param)
            )
            for o, o_want in zip(outs, want, strict=True):
                _close(o.full_tensor(), o_want, what)
            for i, (gr, gr_want) in enumerate(zip(grads, want_grads, strict=True)):
                if gr_want is not None:
                    _close(gr.full_tensor(), gr_want, f"{what}, gradient {i}")
    mesh = _mesh()
    share = (rank + 1) / (WORLD * (WORLD + 1) / 2)  # the ranks' shares add up to 1
    for name, fn in _functional_cases((6,)).items():
        got = fn(
            *(DTensor.from_local(t * share, mesh, [Partial()]) for t in (x, res)),
            *(DTensor.from_local(t, mesh, [Replicate()]) for t in (w, b)),
        )
        want = fn(x, res, w, b)
        for o, o_want in zip(got, want, strict=True):
            assert not any(isinstance(q, Partial) for q in o.placements), (name, o.placements)
            _close(o.full_tensor(), o_want, f"{name}, partial input")


# ----------------------------------------------------------------------------------------------
# Grouped and gated RMSNorm on DTensors (the gate takes the residual's place in the helpers)
# ----------------------------------------------------------------------------------------------
def _gated_cases(shape, group_size):
    """name -> fn(x, gate, weight, bias) over ``shape`` in groups of ``group_size``."""

    def call(**kw):
        return lambda x, z, w, b: (
            rmsnorm.gated_rms_norm(x, z, shape, w, 1e-6, group_size=group_size, **kw),
        )

    return {
        "norm, then gate": call(),
        "gate, then norm, llama": call(norm_before_gate=False, casting_mode="llama"),
        "sigmoid, rms, bias": lambda x, z, w, b: (
            rmsnorm.gated_rms_norm(
                x,
                z,
                shape,
                w,
                1e-6,
                group_size=group_size,
                activation="sigmoid",
                eps_mode="rms",
                bias=b,
            ),
        ),
        "none, partial": call(casting_mode="none", partial=0.5, norm_before_gate=False),
        "grouped, no gate": lambda x, z, w, b: (
            rmsnorm.rms_norm(x, shape, w, 1e-6, group_size=group_size),
        ),
    }


def _check_gated(x, z, w, b, cot, shape, group_size, p, collectives):
    from torch.distributed.tensor import Partial, Replicate

    for name, fn in _gated_cases(shape, group_size).items():
        what = f"{name} over {shape} in groups of {group_size}, input {p}"
        want, want_grads, _ = _whole_run(fn, (x, z, w, b), cot)
        outs, grads, _, fwd, bwd = _distributed_run(
            fn, (x, z, w, b), cot, (p, p, Replicate(), Replicate())
        )
        if collectives is not None:
            assert fwd == collectives, (what, fwd)
        for o, o_want in zip(outs, want, strict=True):
            assert o.placements == (p,), (what, o.placements)
            _close(o.full_tensor(), o_want, what)
        for i, (gr, gr_want) in enumerate(zip(grads, want_grads, strict=True)):
            if gr_want is None:
                continue
            assert gr.placements == ((p,) if i < 2 else (Partial("sum"),)), (what, i, gr)
            _close(gr.full_tensor(), gr_want, f"{what}, gradient {i}")


def check_dtensor_gated_rows_sharded(rank: int) -> None:
    """Rows sharded (sequence parallel): the gated op's sharding rules, no collective in the
    forward, d weight / d bias partial sums; values and gradients those of whole tensors."""
    from torch.distributed.tensor import Shard

    g = torch.Generator().manual_seed(8)
    x, z, cot = (torch.randn(4, 6, 24, generator=g, dtype=torch.float64) for _ in range(3))
    w, b = 1 + 0.3 * torch.randn(24, generator=g, dtype=torch.float64), torch.randn(24) * 0.1
    _check_gated(x, z, w, b.double(), cot, 24, 8, Shard(1), {})


def check_dtensor_gated_groups_sharded(rank: int) -> None:
    """The hidden dim sharded on group boundaries (Mamba2's n_groups over tensor-parallel ranks;
    heads of a per-head norm): each rank normalizes its own groups, no collective in the
    forward; a sharding that cuts a group is refused, naming group_size."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(9)
    x, z, cot = (torch.randn(3, 5, 24, generator=g, dtype=torch.float64) for _ in range(3))
    w, b = 1 + 0.3 * torch.randn(24, generator=g, dtype=torch.float64), torch.randn(24) * 0.1
    _check_gated(x, z, w, b.double(), cot, 24, 12, Shard(2), {})  # one group a rank
    _check_gated(x, z, w, b.double(), cot, 24, 4, Shard(2), {})  # three groups a rank
    heads = [t.reshape(3, 5, 4, 6) for t in (x, z, cot)]  # 4 heads of 6: 2 a rank
    _check_gated(
        *heads[:2], w.reshape(4, 6), b.double().reshape(4, 6), heads[2], (4, 6), 6, Shard(2), {}
    )
    mesh = _mesh()
    xd = distribute_tensor(x, mesh, [Shard(2)])
    zd = distribute_tensor(z, mesh, [Shard(2)])
    try:
        rmsnorm.gated_rms_norm(xd, zd, 24, distribute_tensor(w, mesh, [Replicate()]), group_size=8)
    except ValueError as exc:
        assert "group_size=8" in str(exc) and "whole groups" in str(exc), str(exc)
    else:
        raise AssertionError("a sharding that cuts a group of 8 was not refused")


def check_dtensor_gated_one_group_sharded(rank: int) -> None:
    """One group (no group_size) with the hidden dim sharded: the plain norm's path, one
    all-reduce of the row statistics in the forward, for each order, activation and mode."""
    from torch.distributed.tensor import Shard

    g = torch.Generator().manual_seed(10)
    x, z, cot = (torch.randn(3, 5, 24, generator=g, dtype=torch.float64) for _ in range(3))
    w, b = 1 + 0.3 * torch.randn(24, generator=g, dtype=torch.float64), torch.randn(24) * 0.1
    _check_gated(x, z, w, b.double(), cot, 24, None, Shard(2), {"all_reduce": 1})


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)  # two processes on two cores
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    results = {}
    try:
        for name in CHECKS:
            try:
                globals()[f"check_{name}"](rank)
                results[name] = "ok"
            except Exception:  # reported per check by the tests below
                results[name] = traceback.format_exc()
            dist.barrier()
    finally:
        dist.destroy_process_group()
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(results, fh)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    """Launch the two processes once for all checks (each launch pays two torch imports)."""
    out = tmp_path_factory.mktemp("dist")
    ctx = mp.start_processes(
        _worker,
        args=(WORLD, _free_port(), str(out)),
        nprocs=WORLD,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"distributed workers still running after {TIMEOUT_S} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("check", CHECKS)
def test_distributed(results, check):
    for rank, res in enumerate(results):
        assert res.get(check) == "ok", f"rank {rank}, {check}:\n{res.get(check)}"


def test_all_reduce_norm_grads_needs_a_process_group():
    with pytest.raises(RuntimeError, match="initialized process group"):
        all_reduce_norm_grads(make_model())


def test_norm_parameters_finds_every_norm():
    model = make_model()
    model.extra = nn.RMSNorm(DIM)
    expected = [
        p
        for m in model.modules()
        if "norm" in type(m).__name__.lower()
        for p in m.parameters(recurse=False)
    ]
    assert {id(p) for p in norm_parameters(model)} == {id(p) for p in expected}
    assert len(norm_parameters(model)) == 2 * 2 + 2 + 1


# The DTensor rules are registered without the user calling anything, whichever of rmsnorm and
# torch.distributed.tensor is imported first, and calling the op directly (not through rmsnorm's
# functions). A fresh interpreter each, single-process gloo group.
_IMPORT_ORDER = """
import sys
import torch
{first}
{second}
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
x = distribute_tensor(torch.randn(2, 4, 8), init_device_mesh("cpu", (1,)), [Shard(1)])
y, rstd = torch.ops.rmsnorm.rms_norm_fwd(x, 1, None, None, 1e-6, "mean_square", "gemma", 0.0, 8)
assert y.placements == rstd.placements == (Shard(1),), (y.placements, rstd.placements)
dist.destroy_process_group()
"""
_IMPORT_RMSNORM = "import rmsnorm"
_NOT_YET = (  # and a find_spec probe (an availability check) must not use the import hook up
    "assert 'torch.distributed.tensor' not in sys.modules, 'import rmsnorm imported DTensor'\n"
    "import importlib.util; assert importlib.util.find_spec('torch.distributed.tensor')"
)
_IMPORT_DTENSOR = "from torch.distributed.tensor import Shard, distribute_tensor"


@pytest.mark.parametrize("rmsnorm_first", [True, False], ids=["rmsnorm_first", "dtensor_first"])
def test_sharding_rules_registered_whatever_the_import_order(rmsnorm_first):
    imports = (_IMPORT_RMSNORM, _IMPORT_DTENSOR)
    first, second = (imports[0] + "\n" + _NOT_YET, imports[1]) if rmsnorm_first else imports[::-1]
    code = _IMPORT_ORDER.format(first=first, second=second)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_distributed_support_means_no_rules(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    hooks = [f for f in sys.meta_path if not isinstance(f, _dtensor._AfterImport)]
    monkeypatch.setattr(sys, "meta_path", hooks)
    monkeypatch.setattr(_dtensor, "_registered", False)
    monkeypatch.setattr(_dtensor, "_register", lambda: pytest.fail("registered without DTensor"))
    before = list(sys.meta_path)
    _dtensor.install()
    assert sys.meta_path == before


def test_a_failed_registration_is_a_warning(monkeypatch):
    def incompatible():
        raise ImportError("no register_sharding")

    monkeypatch.setattr(_dtensor, "_registered", False)
    monkeypatch.setattr(_dtensor, "_register", incompatible)
    with pytest.warns(RuntimeWarning, match="could not register the DTensor sharding rules"):
        _dtensor.register()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _dtensor.register()  # once
