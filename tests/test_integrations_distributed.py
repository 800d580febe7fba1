"""Distributed training with this library's norms, on 2 local processes (gloo): DDP and FSDP2 end
with the parameters of single-process training on the same global batch, and sequence parallelism
gives the whole sequence's d weight after all_reduce_norm_grads."""

from __future__ import annotations

import copy
import datetime
import json
import socket
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import rmsnorm
from rmsnorm.integrations.distributed import all_reduce_norm_grads, norm_parameters

WORLD = 2
STEPS = 3
BATCH, SEQ, DIM = 4, 6, 24  # global batch, tokens per sequence, hidden size
TIMEOUT_S = 240  # whole launch, both processes (2 torch imports on a busy 2-core machine)
CHECKS = ("ddp", "fsdp2", "sequence_parallel")


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


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)  # two processes on two cores
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
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
        _worker, args=(WORLD, _free_port(), str(out)), nprocs=WORLD, join=False,
        start_method="spawn",
    )  # fmt: skip
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
    expected = [p for m in model.modules() if "norm" in type(m).__name__.lower() for p in
                m.parameters(recurse=False)]  # fmt: skip
    assert {id(p) for p in norm_parameters(model)} == {id(p) for p in expected}
    assert len(norm_parameters(model)) == 2 * 2 + 2 + 1
