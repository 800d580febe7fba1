"""How the CPU kernels share a call between threads, measured: this library's helper-thread pool
against numba's own threading layers running the same serial kernel.

    PYTHONPATH=src python benchmarks/probes/cpu_threading.py [--rounds 5]

Each layer runs in its own interpreter (numba's threading layer is chosen once per process).
Every process times the float32 RMSNorm forward at N = 1024 for M·N from 2^16 to 2^22 and at
8192 × 4096: the serial kernel on one thread, and the same kernel split over two threads (the same
blocks of ~16 K elements) by this library's shared call (its adaptive choice off) on an OpenMP team
of torch's own runtime (``openmp``) or on its helper pool (``pool``), or by a numba ``prange`` over
the blocks under numba's ``omp`` / ``workqueue`` / ``tbb`` layer. Single serial and parallel calls
alternate, so both see the same load; ``--after-matmul`` puts a torch matmul before each, as in a
model. The table shows the lower quartile and the median per call, the machine's load average and
whether torch's thread count survived.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import json, os, statistics, sys, time
import torch
layer, rounds, after = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
torch.set_num_threads(2)
from rmsnorm.kernels import cpu
cpu.warmup()
from rmsnorm.kernels.cpu import launchers as L, kernels as K, pool as P
from rmsnorm.reference import RMSOptions
shapes = [(64, 1024), (128, 1024), (256, 1024), (1024, 1024), (4096, 1024), (8192, 4096)]

def serial(args):
    L._forward(0, *args)

if layer in ("openmp", "pool"):
    P.USE_OPENMP = layer == "openmp"
    def parallel(args):
        P.shared(L._forward, *args)
else:
    import numba
    from numba import njit, prange

    @njit(parallel=True, nogil=True)
    def blocks(xp, yp, wp, rp, m, n, flags):
        rpb = max(1, 16384 // n)
        for b in prange((m + rpb - 1) // rpb):
            lo = b * rpb
            hi = min(m, lo + rpb)
            K.forward(0, xp + 4 * lo * n, n, 0, 0, 0, yp + 4 * lo * n, wp, 1, 0, 0, 0,
                      rp + 4 * lo, hi - lo, n, n, 1e-6, 0.0, flags)

    def parallel(args):
        blocks(args[0], args[5], args[6], args[11], args[12], args[13], args[17])

out = []
for m, n in shapes:
    x, w = torch.randn(m, n), torch.randn(n)
    opts = RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    y, r = L.rms_norm_fwd(x, w, None, opts)
    flags = L._rms_fwd_plans[(x.dtype, w.dtype, None, None, opts)][1]
    args = (x.data_ptr(), n, 0, 0, 0, y.data_ptr(), w.data_ptr(), 1, 0, 0, 0, r.data_ptr(), m, n,
            n, 1e-6, 0.0, flags)
    want = y.clone()
    a, b = torch.randn(m, n), torch.randn(n, 256)
    calls = max(3, min(rounds * 200, int(rounds * 2e6 / (m * n))))
    t = {"serial": [], "parallel": []}
    for _ in range(calls):  # alternating single calls: both ways see the same load
        for name, fn in (("serial", serial), ("parallel", parallel)):
            if after:
                a @ b  # as in a model: torch's own OpenMP threads have just run
            t0 = time.perf_counter()
            fn(args)
            t[name].append(time.perf_counter() - t0)
    assert torch.equal(y, want)
    out.append({"m": m, "n": n, **{k + "_us": [statistics.quantiles(v, n=4)[0] * 1e6,
                                              statistics.median(v) * 1e6] for k, v in t.items()}})
threading_layer = layer if layer in ("openmp", "pool") else "numba " + numba.threading_layer()
print(json.dumps({"layer": threading_layer, "rows": out, "load": os.getloadavg()[0],
                  "torch_threads_after": torch.get_num_threads()}))
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", default="openmp,pool,omp,workqueue,tbb")
    ap.add_argument(
        "--after-matmul", action="store_true", help="run a torch matmul before every timed call"
    )
    args = ap.parse_args(argv)
    results = []
    for layer in args.layers.split(","):
        env = dict(os.environ)
        if layer not in ("openmp", "pool"):
            env["NUMBA_THREADING_LAYER"] = layer
        res = subprocess.run(
            [sys.executable, "-c", _CHILD, layer, str(args.rounds), str(int(args.after_matmul))],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        if res.returncode != 0:
            print(f"{layer}: failed ({res.stderr.strip().splitlines()[-1:]})")
            continue
        results.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print("µs per call: lower quartile / median of alternating single calls; speed-up of medians")
    print("| layer | M×N | elements | 1 thread | 2 threads | speed-up | load | torch threads |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        for row in r["rows"]:
            m, n = row["m"], row["n"]
            (s25, s50), (p25, p50) = row["serial_us"], row["parallel_us"]
            print(
                f"| {r['layer']} | {m}×{n} | 2^{(m * n).bit_length() - 1} | {s25:.1f} / {s50:.1f} "
                f"| {p25:.1f} / {p50:.1f} | {s50 / p50:.2f} | {r['load']:.1f} "
                f"| {r['torch_threads_after']} |"
            )


if __name__ == "__main__":
    main()
