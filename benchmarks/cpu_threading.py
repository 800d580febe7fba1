"""How the CPU kernels share a call between threads, measured: this library's helper-thread pool
against numba's own threading layers running the same serial kernel.

    PYTHONPATH=src python benchmarks/cpu_threading.py [--rounds 5]

Each layer runs in its own interpreter (numba's threading layer is chosen once per process).
Every process times the float32 RMSNorm forward at N = 1024 for M·N from 2^16 to 2^22 and at
8192 × 4096: the serial kernel on one thread, and the same kernel split over two threads (blocks of
16 rows) by the pool (``rmsnorm``'s own launcher) or by a numba ``prange`` over the blocks under
the ``omp`` / ``workqueue`` / ``tbb`` layer. Rounds alternate serial and parallel calls; the table
shows the median per call and its ratio to serial in the same process. After each process the
script also reports whether torch's thread count survived.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import json, statistics, sys, time
import torch
layer, rounds = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(2)
from rmsnorm.kernels import cpu
cpu.warmup()
from rmsnorm.kernels.cpu import launchers as L, kernels as K
shapes = [(64, 1024), (128, 1024), (256, 1024), (1024, 1024), (4096, 1024), (8192, 4096)]
flags = None

def serial(x, w, y, r, m, n):
    K.forward(0, x.data_ptr(), n, 0, 0, 0, y.data_ptr(), w.data_ptr(), 1, 0, 0, 0, r.data_ptr(),
              m, n, n, 1e-6, 0.0, flags)

if layer == "pool":
    def parallel(x, w, y, r, m, n):
        L._shared(L._forward, x.data_ptr(), n, 0, 0, 0, y.data_ptr(), w.data_ptr(), 1, 0, 0, 0,
                  r.data_ptr(), m, n, n, 1e-6, 0.0, flags)
else:
    import numba
    from numba import njit, prange

    @njit(parallel=True, nogil=True)
    def blocks(xp, yp, wp, rp, m, n, flags):
        rpb = 16
        for b in prange((m + rpb - 1) // rpb):
            lo = b * rpb
            hi = min(m, lo + rpb)
            K.forward(0, xp + 4 * lo * n, n, 0, 0, 0, yp + 4 * lo * n, wp, 1, 0, 0, 0,
                      rp + 4 * lo, hi - lo, n, n, 1e-6, 0.0, flags)

    def parallel(x, w, y, r, m, n):
        blocks(x.data_ptr(), y.data_ptr(), w.data_ptr(), r.data_ptr(), m, n, flags)

def per_call(fn, *args, budget=0.05):
    fn(*args)
    t0 = time.perf_counter(); fn(*args); one = time.perf_counter() - t0
    reps = max(1, int(budget / max(one, 1e-7)))
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    return (time.perf_counter() - t0) / reps * 1e6

out = []
for m, n in shapes:
    x, w = torch.randn(m, n), torch.randn(n)
    y, r = L.rms_norm_fwd(x, w, None, 1e-6, "mean_square", "gemma", 0.0, n)
    flags = L._rms_fwd_plans[(x.dtype, w.dtype, None, None, "gemma", "mean_square")][1]
    want = y.clone()
    s, p = [], []
    for _ in range(rounds):
        s.append(per_call(serial, x, w, y, r, m, n))
        p.append(per_call(parallel, x, w, y, r, m, n))
    assert torch.equal(y, want)
    out.append({"m": m, "n": n, "serial_us": statistics.median(s),
                "parallel_us": statistics.median(p)})
threading_layer = "pool" if layer == "pool" else numba.threading_layer()
print(json.dumps({"layer": threading_layer, "rows": out,
                  "torch_threads_after": torch.get_num_threads()}))
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", default="pool,omp,workqueue,tbb")
    args = ap.parse_args(argv)
    results = []
    for layer in args.layers.split(","):
        env = dict(os.environ)
        if layer != "pool":
            env["NUMBA_THREADING_LAYER"] = layer
        res = subprocess.run(
            [sys.executable, "-c", _CHILD, layer, str(args.rounds)],
            capture_output=True, text=True, env=env, timeout=1800,
        )  # fmt: skip
        if res.returncode != 0:
            print(f"{layer}: failed ({res.stderr.strip().splitlines()[-1:]})")
            continue
        results.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print("| layer | M×N | elements | serial µs | 2 threads µs | speed-up | torch threads after |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        for row in r["rows"]:
            m, n = row["m"], row["n"]
            s, p = row["serial_us"], row["parallel_us"]
            print(
                f"| {r['layer']} | {m}×{n} | 2^{(m * n).bit_length() - 1} | {s:.1f} | {p:.1f} "
                f"| {s / p:.2f} | {r['torch_threads_after']} |"
            )


if __name__ == "__main__":
    main()
