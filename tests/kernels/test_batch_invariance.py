"""Batch invariance: a row's forward output is bitwise the same whatever batch it is in (M from 1
to thousands, any position, a 2-D or 3-D batch, with or without gradients, on one, two or three
threads), on every backend (the Triton kernels interpreted on CPU tensors, in each layout). The
backward's d input of a row is too; d weight, a sum over the batch's rows, is bitwise the same run
to run and on any thread count for a given batch (docs/spec.md, "Batch invariance")."""

from __future__ import annotations

import contextlib

import pytest
import torch

import rmsnorm
from launcher_support import ALL, target, triton_layouts

# (N, batch sizes): rows of one block and of many, short rows packed several to a tile, and
# N = 40000 (past the 32768 elements from which torch splits one row's reduction over threads).
SIZES = {
    "cpu": (
        (48, (1, 2, 3, 16, 17, 1000, 4096)),
        (768, (1, 2, 7, 100, 3000)),
        (4096, (1, 2, 7, 64, 700)),
        (40000, (1, 2, 3, 9)),
    ),
    "triton": ((48, (1, 2, 3, 17, 40)), (768, (1, 2, 5)), (10000, (1, 2))),
}
SIZES["reference"] = SIZES["cpu"]
THREADS = {"cpu": (1, 2, 3), "reference": (1, 2), "triton": (2,)}
OPS = ("rms_norm", "rms_norm_rms_partial_llama", "add_rms_norm", "layer_norm")


def _call(op, x, r, w, b, n):
    """The op's outputs on rows x (residual r), as a tuple."""
    if op == "rms_norm":
        return (rmsnorm.rms_norm(x, (n,), w, 1e-6),)
    if op == "rms_norm_rms_partial_llama":
        wf = w.float()  # a float32 weight: "llama" then returns float32 rows
        y = rmsnorm.rms_norm(x, (n,), wf, 1e-6, eps_mode="rms", casting_mode="llama", partial=0.4)
        return (y,)
    if op == "add_rms_norm":
        return rmsnorm.add_rms_norm(x, r, (n,), w, 1e-6)
    return (rmsnorm.layer_norm(x, (n,), w, b, 1e-5),)


def _threads(count: int):
    @contextlib.contextmanager
    def ctx():
        before = torch.get_num_threads()
        torch.set_num_threads(count)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    return ctx()


def _backend(name: str):
    backend, _, layout = name.partition("-")
    target(backend)  # skips where the backend cannot run
    if not layout:
        return backend, contextlib.nullcontext
    mod = target(backend).mod
    cfg = triton_layouts(64)[layout]
    return backend, lambda: mod.override(fwd=cfg, bwd=cfg, ln_fwd=cfg, ln_bwd=cfg)


CASES = [(b, op, dt) for b in ALL for op in OPS for dt in (torch.float32, torch.bfloat16)]
# The Triton kernels' looped and split layouts (forced, on rows of 48) as further backends.
CASES += [(f"triton-{lay}", "rms_norm", torch.bfloat16) for lay in ("loop", "split")]
CASES += [(f"triton-{lay}", "layer_norm", torch.float32) for lay in ("loop", "split")]


@pytest.mark.parametrize(
    ("name", "op", "dtype"), CASES, ids=[f"{b}-{o}-{str(d)[6:]}" for b, o, d in CASES]
)
def test_a_rows_output_is_the_same_in_any_batch(name, op, dtype):
    backend, layout = _backend(name)
    sizes = SIZES[backend] if "-" not in name else ((48, (1, 2, 5)),)
    g = torch.Generator().manual_seed(11)
    for n, ms in sizes:
        rows = max(ms) + 5
        x = torch.randn(rows, n, generator=g).to(dtype)
        r = torch.randn(rows, n, generator=g).to(dtype)
        w = (torch.rand(n, generator=g) + 0.5).to(dtype)
        b = torch.randn(n, generator=g).to(dtype)
        watched = (0, 1, 2, rows - 1)  # rows compared in every batch that holds them
        with rmsnorm.use_backend(backend), layout(), torch.no_grad():
            with _threads(1):
                alone = {i: _call(op, x[i : i + 1], r[i : i + 1], w, b, n) for i in watched}
            for threads in THREADS[backend]:
                with _threads(threads):
                    for m in ms:
                        for start in {0, 1, rows - m}:  # first, second and last position
                            got = _call(op, x[start : start + m], r[start : start + m], w, b, n)
                            for i in watched:
                                if start <= i < start + m:
                                    for a, e in zip(got, alone[i], strict=True):
                                        assert torch.equal(a[i - start : i - start + 1], e), (
                                            f"{name} {op} N={n}: row {i} alone differs from row "
                                            f"{i - start} of a batch of {m} ({threads} threads)"
                                        )
            # a 3-D batch, and the autograd path (statistics kept), give the same rows
            m = ms[-1] - ms[-1] % 2
            flat = _call(op, x[:m], r[:m], w, b, n)
            cube = _call(op, x[:m].reshape(2, m // 2, n), r[:m].reshape(2, m // 2, n), w, b, n)
            for a, c in zip(flat, cube, strict=True):
                assert torch.equal(a, c.reshape(m, n)), f"{name} {op} N={n}: 3-D batch"
        if backend != "triton":  # (the interpreter is slow; its autograd path is the launchers')
            with rmsnorm.use_backend(backend), layout(), torch.enable_grad():
                xg = x[:m].clone().requires_grad_()
                graded = _call(op, xg, r[:m], w, b, n)
            for a, c in zip(flat, graded, strict=True):
                assert torch.equal(a, c.detach()), f"{name} {op} N={n}: with gradients"


@pytest.mark.parametrize("name", (*ALL, "triton-split"))
def test_a_rows_d_input_is_the_same_in_any_batch_and_d_weight_is_reproducible(name):
    backend, layout = _backend(name)
    n, ms = (48, (1, 2, 9)) if backend == "triton" else (768, (1, 2, 17, 300, 2000))
    g = torch.Generator().manual_seed(5)
    rows = max(ms)
    x = torch.randn(rows, n, generator=g)
    dy = torch.randn(rows, n, generator=g)
    w = torch.rand(n, generator=g) + 0.5
    b = torch.randn(n, generator=g)

    def grads(lo, hi, threads):
        xs = x[lo:hi].clone().requires_grad_()
        wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
        with rmsnorm.use_backend(backend), layout(), _threads(threads):
            out = {}
            y = rmsnorm.rms_norm(xs, (n,), wg, 1e-6)
            out["rms"] = torch.autograd.grad(y, (xs, wg), dy[lo:hi])
            y = rmsnorm.layer_norm(xs, (n,), wg, bg, 1e-5)
            out["ln"] = torch.autograd.grad(y, (xs, wg, bg), dy[lo:hi])
        return out

    alone = grads(0, 1, 1)
    threads = (1, 2) if backend != "triton" else (2,)
    for t in threads:
        for m in ms:
            got = grads(0, m, t)
            for op in got:
                assert torch.equal(got[op][0][:1], alone[op][0]), f"{name} {op}: dx, M = {m}"
    # d weight / d bias of one batch: the same bits run to run and on any number of threads
    first = grads(0, rows, threads[0])
    for t in threads:
        again = grads(0, rows, t)
        for op in first:
            for a, c in zip(first[op][1:], again[op][1:], strict=True):
                assert torch.equal(a, c), f"{name} {op}: d weight with {t} threads"
