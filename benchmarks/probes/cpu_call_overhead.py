"""Where a CPU forward + backward call spends its time against ATen's fused LayerNorm, at the sizes
where the per-call targets are missed (2^16–2^17 elements).

    PYTHONPATH=src python benchmarks/probes/cpu_call_overhead.py [--rounds 7]

Three tables, every provider of a table taking turns in each round (medians over the rounds):

1. *The autograd floor*, one torch thread, process CPU time per call at 1 × 768 fp32: forward +
   ``torch.autograd.grad`` of ``F.layer_norm`` (ATen's C++ autograd node), of a Python
   ``autograd.Function`` that computes nothing (the floor of any Python-level op with a backward),
   of the same written as a C++ ``torch::autograd::Function`` (compiled here with
   ``torch.utils.cpp_extension.load_inline`` where a C++ compiler is found; the floor a compiled
   extension would have), of ``rmsnorm.rms_norm``, and this library's two CPU launchers alone.
2. *The library's layers*, the same call and clock: the same forward + backward built up one layer
   at a time — a minimal Python ``autograd.Function`` calling the CPU launchers, the same through
   ``rmsnorm._launch`` (rows, shapes, backend choice), the library's ``RMSNormFunction`` (saved
   statistics, the shared backward with its double-backward and layout rules), and the functional
   API (argument checks, path choice): what each layer adds is the difference of two rows.
3. *Two threads against one*, wall time per call of the forward and backward launchers against
   ATen's ``native_layer_norm`` and its backward at 128 × 768, 64 × 1024, 1024 × 128 and
   8192 × 128 fp32, each at one and at two torch threads (glibc keeps freed memory, as
   ``rmsnorm bench`` does).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

import rmsnorm
from rmsnorm import _autograd, _launch
from rmsnorm.bench.cpu import keep_freed_memory
from rmsnorm.kernels import cpu
from rmsnorm.reference import RMSOptions


class _Nothing(torch.autograd.Function):
    """Saves its inputs and returns fresh tensors: the cost of the autograd machinery alone."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return dy.new_empty(dy.shape), w.new_empty(w.shape)


_CXX_NOTHING = r"""
#include <torch/extension.h>
using namespace torch::autograd;
struct Nothing : public Function<Nothing> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w) {
    ctx->save_for_backward({x, w});
    return torch::empty_like(x);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list g) {
    auto s = ctx->get_saved_variables();
    return {torch::empty_like(g[0]), torch::empty_like(s[1])};
  }
};
torch::Tensor nothing(torch::Tensor x, torch::Tensor w) { return Nothing::apply(x, w); }
"""


def _cxx_nothing():
    """The C++ ``_Nothing`` (compiled into a temporary folder, ~20-60 s), or None without a C++
    compiler or where the build fails."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return None
    from torch.utils.cpp_extension import load_inline

    try:
        with tempfile.TemporaryDirectory() as build:
            mod = load_inline(
                "rmsnorm_bench_nothing",
                cpp_sources=[_CXX_NOTHING],
                functions=["nothing"],
                extra_cflags=["-O2"],
                build_directory=build,
            )
    except Exception as e:  # noqa: BLE001 - a benchmark row, not a requirement
        print(f"(no C++ row: the build failed: {e})")
        return None
    return mod.nothing


def _best_us(fn, reps: int, clock) -> float:
    """µs per call on `clock` (ns): the best of three blocks of `reps` calls (a block the scheduler
    or a page fault interrupts only reads longer)."""
    best = float("inf")
    for _ in range(3):
        t0 = clock()
        for _ in range(reps):
            fn()
        best = min(best, (clock() - t0) / reps / 1e3)
    return best


def _cpu_us(fn, reps: int) -> float:
    """This thread's CPU time per call, after reps // 10 + 1 warm-up calls."""
    for _ in range(reps // 10 + 1):
        fn()
    return _best_us(fn, reps, time.thread_time_ns)


def _wall_us(fn, threads: int, budget: float = 0.02) -> float:
    """Wall time per call at `threads` torch threads, in blocks of ~`budget` seconds."""
    torch.set_num_threads(threads)
    for _ in range(5):
        fn()
    t0 = time.perf_counter()
    fn()
    reps = max(5, int(budget / max(time.perf_counter() - t0, 1e-7)))
    return _best_us(fn, reps, time.perf_counter_ns)


def floor_table(rounds: int) -> list[str]:
    torch.set_num_threads(1)
    n = 768
    x = torch.randn(1, n, requires_grad=True)
    w = torch.ones(n, requires_grad=True)
    b = torch.zeros(n, requires_grad=True)
    dy = torch.randn(1, n)
    xd, wd = x.detach(), w.detach()
    opts = RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    _, rstd = cpu.rms_norm_fwd(xd, wd, None, opts)
    nothing = _autograd._c_apply(_Nothing)
    cxx = _cxx_nothing()
    cases = {
        "F.layer_norm, forward + autograd.grad": lambda: torch.autograd.grad(
            F.layer_norm(x, (n,), w, b, 1e-6), (x, w, b), dy
        ),
        "an empty Python autograd.Function, the same": lambda: torch.autograd.grad(
            nothing(x, w), (x, w), dy
        ),
        **(
            {}
            if cxx is None
            else {
                "the same empty Function in C++, the same": lambda: torch.autograd.grad(
                    cxx(x, w), (x, w), dy
                )
            }
        ),
        "rmsnorm.rms_norm, the same": lambda: torch.autograd.grad(
            rmsnorm.rms_norm(x, n, w, 1e-6), (x, w), dy
        ),
        "the two CPU launchers alone": lambda: (
            cpu.rms_norm_fwd(xd, wd, None, opts),
            cpu.rms_norm_bwd(dy, xd, wd, None, rstd, None, opts, torch.float32),
        ),
        "F.layer_norm forward alone (no grad)": lambda: F.layer_norm(xd, (n,), wd, None, 1e-6),
    }
    runs: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for k, fn in cases.items():
            runs[k].append(_cpu_us(fn, 500))
    rows = ["| call, 1 × 768 fp32, one thread | µs (CPU time) |", "|---|---|"]
    rows += [f"| {k} | {statistics.median(v):.1f} |" for k, v in runs.items()]
    return rows


class _Launchers(torch.autograd.Function):
    """The CPU launchers and nothing else: the least a Python op over these kernels can do."""

    @staticmethod
    def forward(ctx, x, w, opts):
        y, rstd = cpu.rms_norm_fwd(x, w, None, opts)
        ctx.save_for_backward(x, w)
        ctx.rstd, ctx.opts = rstd, opts
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw, _ = cpu.rms_norm_bwd(dy, x, w, None, ctx.rstd, None, ctx.opts, x.dtype)
        return dx, dw, None


class _Launched(torch.autograd.Function):
    """The same through :mod:`rmsnorm._launch`, which presents rows and picks the backend."""

    @staticmethod
    def forward(ctx, x, w, opts):
        y, rstd = _launch.rms_norm_fwd(x, 1, w, None, opts)
        ctx.save_for_backward(x, w)
        ctx.rstd, ctx.opts = rstd, opts
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw, _ = _launch.rms_norm_bwd(dy, x, 1, w, None, ctx.rstd, None, ctx.opts, x.dtype, True)
        return dx, dw, None


def layers_table(rounds: int) -> list[str]:
    torch.set_num_threads(1)
    n = 768
    x = torch.randn(1, n, requires_grad=True)
    w = torch.ones(n, requires_grad=True)
    b = torch.zeros(n, requires_grad=True)
    dy = torch.randn(1, n)
    opts = RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    nothing = _autograd._c_apply(_Nothing)
    launchers = _autograd._c_apply(_Launchers)
    launched = _autograd._c_apply(_Launched)
    cases = {
        "F.layer_norm (ATen's C++ node)": lambda: torch.autograd.grad(
            F.layer_norm(x, (n,), w, b, 1e-6), (x, w, b), dy
        ),
        "an empty Python autograd.Function": lambda: torch.autograd.grad(nothing(x, w), (x, w), dy),
        "+ the CPU launchers (kernels, outputs, flags)": lambda: torch.autograd.grad(
            launchers(x, w, opts), (x, w), dy
        ),
        "+ rmsnorm._launch (rows, shapes, backend choice)": lambda: torch.autograd.grad(
            launched(x, w, opts), (x, w), dy
        ),
        "+ RMSNormFunction (the library's Function and shared backward)": lambda: (
            torch.autograd.grad(_autograd.rms_norm_apply(x, w, None, 1, opts), (x, w), dy)
        ),
        "+ the functional API: rmsnorm.rms_norm": lambda: torch.autograd.grad(
            rmsnorm.rms_norm(x, n, w, 1e-6), (x, w), dy
        ),
    }
    runs: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for k, fn in cases.items():
            runs[k].append(_cpu_us(fn, 500))
    rows = ["| forward + autograd.grad, 1 × 768 fp32, one thread | µs (CPU time) | added |"]
    rows.append("|---|---|---|")
    before = None
    for i, (k, v) in enumerate(runs.items()):
        us = statistics.median(v)
        added = "" if i < 2 else f"{us - before:+.1f}"
        rows.append(f"| {k} | {us:.1f} | {added} |")
        before = us
    return rows


def _launch_calls(m: int, n: int) -> dict:
    """The forward and backward launchers and ATen's LayerNorm pair on one (M, N) fp32 input."""
    x, dy = torch.randn(m, n), torch.randn(m, n)
    w, b = torch.rand(n) + 0.5, torch.randn(n)
    opts = RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    _, rstd = cpu.rms_norm_fwd(x, w, None, opts)
    _, mean, rs = torch.native_layer_norm(x, (n,), w, b, 1e-6)
    mask = [True, True, True]
    backward = torch.ops.aten.native_layer_norm_backward
    return {
        "ours fwd": lambda: cpu.rms_norm_fwd(x, w, None, opts),
        "aten fwd": lambda: torch.native_layer_norm(x, (n,), w, b, 1e-6),
        "ours bwd": lambda: cpu.rms_norm_bwd(dy, x, w, None, rstd, None, opts, x.dtype),
        "aten bwd": lambda: backward(dy, x, (n,), mean, rs, w, b, mask),
    }


def threads_table(rounds: int) -> list[str]:
    rows = [
        "| fp32 M × N | ours fwd 1 → 2 threads | ATen fwd | ours bwd | ATen bwd |",
        "|---|---|---|---|---|",
    ]
    for m, n in ((128, 768), (64, 1024), (1024, 128), (8192, 128)):
        fns = _launch_calls(m, n)
        runs: dict[tuple, list[float]] = {(k, t): [] for k in fns for t in (1, 2)}
        for _ in range(rounds):
            for k, fn in fns.items():
                for t in (1, 2):
                    runs[k, t].append(_wall_us(fn, t))
        cells = []
        for k in fns:
            one, two = statistics.median(runs[k, 1]), statistics.median(runs[k, 2])
            cells.append(f"{one:.1f} → {two:.1f} µs ({one / two:.2f}×)")
        rows.append(f"| {m} × {n} | " + " | ".join(cells) + " |")
    torch.set_num_threads(2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds of turns (medians)")
    args = parser.parse_args()
    keep_freed_memory()
    print("## The autograd floor\n")
    print("\n".join(floor_table(args.rounds)))
    print("\n## The library's layers\n")
    print("\n".join(layers_table(args.rounds)))
    print("\n## Two threads against one (wall time, medians)\n")
    print("\n".join(threads_table(args.rounds)))


if __name__ == "__main__":
    main()
