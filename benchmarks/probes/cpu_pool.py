"""What the CPU kernels' helper-thread pool buys where torch's OpenMP team cannot take a call: a
process forked after torch ran multi-threaded work (a DataLoader worker, a multiprocessing fork).

    PYTHONPATH=src python benchmarks/probes/cpu_pool.py [--rounds 15] [--threads 2]

The parent runs a matmul on every core, then forks; the child sets ``--threads`` torch threads and
times, in alternating single calls, the float32 and bfloat16 RMSNorm and LayerNorm forward and
backward launchers at N = 1024 from 2^16 to 2^22 elements and at 8192 × 4096: shared with the pool
(what the library does there) and on the calling thread alone (what it would do without the
pool), next to torch's own ``native_layer_norm`` forward and backward in the same child on one
thread (torch's multi-threaded ops hang in such a child: GNU OpenMP cannot start a team the fork
did not copy). Prints a markdown table of medians (µs) and the speed-up of the pool, with the
load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

SHAPES = ((64, 1024), (256, 1024), (1024, 1024), (4096, 1024), (8192, 4096))


def _calls(dt, m: int, n: int):
    """({op: this library's launcher call}, {op: torch's call}) on (m, n) rows of dtype dt."""
    import torch

    from rmsnorm.kernels.cpu import launchers as L
    from rmsnorm.reference import RMSOptions

    aten = torch.ops.aten
    x, dy = torch.randn(m, n).to(dt), torch.randn(m, n).to(dt)
    w, b = (torch.rand(n) + 0.5).to(dt), torch.rand(n).to(dt)
    opts = RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    _, rs = L.rms_norm_fwd(x, w, None, opts)
    _, mu, lr = L.layer_norm_fwd(x, w, b, 1e-5)
    _, tmu, tr = aten.native_layer_norm(x, (n,), w, b, 1e-5)
    ours = {
        "rms fwd": lambda: L.rms_norm_fwd(x, w, None, opts),
        "rms bwd": lambda: L.rms_norm_bwd(dy, x, w, None, rs, None, opts, dt),
        "ln fwd": lambda: L.layer_norm_fwd(x, w, b, 1e-5),
        "ln bwd": lambda: L.layer_norm_bwd(dy, x, w, b, mu, lr),
    }
    theirs = {
        "ln fwd": lambda: aten.native_layer_norm(x, (n,), w, b, 1e-5),
        "ln bwd": lambda: aten.native_layer_norm_backward(
            dy, x, (n,), tmu, tr, w, b, (True, True, True)
        ),
    }
    return ours, theirs


def _child(rounds: int, threads: int, out) -> None:
    import faulthandler

    import torch

    faulthandler.dump_traceback_later(int(os.environ.get("HANG_S", "100000")), exit=True)
    from rmsnorm.bench.cpu import keep_freed_memory
    from rmsnorm.kernels.cpu import pool as P

    keep_freed_memory()
    torch.set_num_threads(threads)
    pooled = P._gomp == 0  # a forked child never uses the parent's OpenMP runtime
    print(f"child: torch threads {torch.get_num_threads()}, OpenMP sharing off: {pooled}", file=out)
    lines = [
        "| dtype | M × N | op | alone | pool | pool speed-up | torch, 1 thread |",
        "|---|---|---|---|---|---|---|",
    ]
    for dt in (torch.float32, torch.bfloat16):
        for m, n in SHAPES:
            torch.set_num_threads(1)  # torch's own ops (inputs, statistics), here too
            ours, theirs = _calls(dt, m, n)
            for op, fn in ours.items():
                t = {"alone": [], "pool": [], "torch": []}
                for _ in range(rounds):
                    for way in ("alone", "pool", "torch"):
                        if way == "torch" and op not in theirs:
                            continue
                        # alone: the launcher calls the kernel on this thread; torch: its
                        # multi-threaded ops hang in such a child (GNU OpenMP), one thread runs
                        torch.set_num_threads(threads if way == "pool" else 1)
                        f = theirs[op] if way == "torch" else fn
                        f()
                        t0 = time.perf_counter()
                        f()
                        t[way].append((time.perf_counter() - t0) * 1e6)
                med = {k: statistics.median(v) for k, v in t.items() if v}
                tt = f"{med['torch']:.0f}" if "torch" in med else "–"
                lines.append(
                    f"| {str(dt)[6:]} | {m} × {n} | {op} | {med['alone']:.0f} | {med['pool']:.0f} "
                    f"| {med['alone'] / med['pool']:.2f}× | {tt} |"
                )
    print("\n".join(lines), file=out)
    print(f"load average {os.getloadavg()[0]:.2f}", file=out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    from rmsnorm.kernels import cpu

    cpu.warmup()
    torch.set_num_threads(os.cpu_count() or 2)
    a = torch.randn(512, 512)
    for _ in range(10):
        a @ a  # the parent's OpenMP team has run: the child cannot use it
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            _child(args.rounds, args.threads, sys.stdout)
            sys.stdout.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
