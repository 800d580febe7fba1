"""LayerNorm forward + backward at large sizes against ``F.layer_norm``, under glibc's default
allocator and with glibc keeping freed memory (the setting of ``rmsnorm bench``): whether the
latency grid's few-percent misses there hold for a process as users run it.

    PYTHONPATH=src python benchmarks/probes/cpu_layer_norm_heap.py [--rounds 9]

Each setting runs in a child process of its own (the allocator setting cannot be undone). In a
child, for each cell, ``F.layer_norm`` and ``rmsnorm.layer_norm`` take turns over the rounds, each
turn a block of calls of forward + ``torch.autograd.grad`` of the input, weight and bias (all in the
cell's dtype); medians of the rounds, milliseconds per call.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import rmsnorm
from rmsnorm.bench.cpu import keep_freed_memory

CELLS = ((8192, 4096), (1024, 4096), (8192, 128))
DTYPES = (torch.bfloat16, torch.float32)


def _cell(m: int, n: int, dtype: torch.dtype, rounds: int) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, n, generator=gen).to(dtype).requires_grad_()
    w = (torch.randn(n, generator=gen) * 0.1 + 1).to(dtype).requires_grad_()
    b = (torch.randn(n, generator=gen) * 0.1).to(dtype).requires_grad_()
    dy = torch.randn(m, n, generator=gen).to(dtype)
    grad = torch.autograd.grad
    calls = (
        lambda: grad(F.layer_norm(x, (n,), w, b, 1e-6), (x, w, b), dy),
        lambda: grad(rmsnorm.layer_norm(x, n, w, b, 1e-6), (x, w, b), dy),
    )
    block = 3 if m * n > 10_000_000 else 50
    times: tuple[list[float], list[float]] = ([], [])
    for fn in calls * 2:  # warm-up
        fn()
    for _ in range(rounds):
        for fn, out in zip(calls, times, strict=True):
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            out.append((time.perf_counter() - t0) / block * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def child(keep: bool, rounds: int) -> None:
    if keep and not keep_freed_memory():
        print("| (glibc's allocator setting is not available here) | | | | |")
        return
    heap = "kept" if keep else "default"
    for dtype in DTYPES:
        for m, n in CELLS:
            ref, ours = _cell(m, n, dtype, rounds)
            name = str(dtype).removeprefix("torch.")
            print(f"| {heap} | {name} {m} × {n} | {ref:.3f} | {ours:.3f} | {ours / ref:.2f}× |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="turns per cell (medians)")
    parser.add_argument("--child", choices=("default", "kept"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child == "kept", args.rounds)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| freed memory | dtype, M × N | F.layer_norm ms | rmsnorm.layer_norm ms | ratio |")
    print("|---|---|---|---|---|")
    for heap in ("default", "kept"):
        cmd = [sys.executable, __file__, "--child", heap, "--rounds", str(args.rounds)]
        sys.stdout.write(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
