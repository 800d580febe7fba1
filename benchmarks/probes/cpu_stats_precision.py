"""What float64 row statistics cost the CPU kernels, and what float32 sums would give up.

    PYTHONPATH=src python benchmarks/probes/cpu_stats_precision.py [--quick]

The CPU kernels accumulate each row's statistics (Σx², the backward's Σg·x) in float64 and form the
backward's dx = a·g − b·x in float64, rounding once. This script times the row loops of the float32
RMSNorm forward and backward in three forms, on one thread, compiled by numba as the kernels are:

- ``float64``: as the kernels do (float64 sums, reassociated so that they vectorize; dx in float64);
- ``float32``: the forward's Σx² as one reassociated float32 sum (LLVM keeps a few vector lanes of
  partial sums), forward only;
- ``blocked``: float32 sums over chunks of 256 elements, the chunks' sums carried in float64 (the
  error does not grow with N); in the backward also dx in float32 with fused multiply-adds.

It prints ns per element in process CPU time (steadier than the wall clock on a shared machine; the
forms take turns for several rounds, medians) for rows that stay in cache (M·N = 2^16) and rows
streamed from memory (M·N = 2^24), then the error of each form against float64 on the tolerance rule
of :mod:`rmsnorm.testing` (error ÷ allowed; ≤ 1 passes) for y and r of the forward and dx of the
backward, on centred rows, rows with a large mean (|μ|/σ = 100) and rows with one dominant element,
N from 128 to 65,536.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from numba import njit

from rmsnorm import reference as ref
from rmsnorm.testing import max_abs_error, tolerance

_FM = {"reassoc", "contract"}
CHUNK = 256


# ---- forward: r = 1/√(Σx²/n + ε), y = (x·r)·s ------------------------------------------------
@njit(fastmath=_FM, error_model="numpy")
def _ss64(x):
    acc = 0.0
    for j in range(x.shape[0]):
        v = np.float64(x[j])
        acc += v * v
    return acc


@njit(fastmath=_FM, error_model="numpy")
def _ss32(x):
    acc = np.float32(0.0)
    for j in range(x.shape[0]):
        acc += x[j] * x[j]
    return np.float64(acc)


@njit(error_model="numpy")
def _ss_blocked(x):
    acc = 0.0
    n = x.shape[0]
    for lo in range(0, n, CHUNK):
        acc += _ss32(x[lo : min(n, lo + CHUNK)])
    return acc


@njit(error_model="numpy")
def _normalize(x, r, s, y):
    for j in range(x.shape[0]):
        y[j] = (x[j] * r) * s[j]


def _forward(ss):
    @njit(error_model="numpy")
    def fwd(x, s, eps, y, rstd):
        m, n = x.shape
        for i in range(m):
            r = np.float32(1.0 / np.sqrt(ss(x[i]) / n + eps))
            rstd[i] = r
            _normalize(x[i], r, s, y[i])

    return fwd


# ---- backward: S = r·Σ g·x (g = dy·s), dx = r·g − (r·r·S/n)·x, d weight partial += dy·x·r ------
@njit(fastmath=_FM, error_model="numpy")
def _sgx64(dy, x, s64):
    acc = 0.0
    for j in range(x.shape[0]):
        acc += (np.float64(dy[j]) * s64[j]) * np.float64(x[j])
    return acc


@njit(fastmath=_FM, error_model="numpy")
def _sgx32(dy, x, s):
    acc = np.float32(0.0)
    for j in range(x.shape[0]):
        acc += (dy[j] * s[j]) * x[j]
    return np.float64(acc)


@njit(error_model="numpy")
def _sgx_blocked(dy, x, s):
    acc = 0.0
    n = x.shape[0]
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        acc += _sgx32(dy[lo:hi], x[lo:hi], s[lo:hi])
    return acc


@njit(fastmath={"contract"}, error_model="numpy")
def _dx64(dy, x, s64, a, b, out):
    for j in range(x.shape[0]):
        out[j] = np.float32(a * (np.float64(dy[j]) * s64[j]) - b * np.float64(x[j]))


@njit(fastmath={"contract"}, error_model="numpy")
def _dx32(dy, x, s, a, b, out):
    a32, b32 = np.float32(a), np.float32(b)
    for j in range(x.shape[0]):
        out[j] = a32 * (dy[j] * s[j]) - b32 * x[j]


@njit(error_model="numpy")
def _dw(dy, x, r, pw):
    for j in range(x.shape[0]):
        pw[j] += dy[j] * (x[j] * r)


def _backward(wide):
    @njit(error_model="numpy")
    def bwd(dy, x, s, rstd, dx, pw):
        m, n = x.shape
        s64 = s.astype(np.float64)
        for i in range(m):
            rd = np.float64(rstd[i])
            if wide:
                sx = rd * _sgx64(dy[i], x[i], s64)
            else:
                sx = rd * _sgx_blocked(dy[i], x[i], s)
            b = rd * (rd * sx / n)
            if wide:
                _dx64(dy[i], x[i], s64, rd, b, dx[i])
            else:
                _dx32(dy[i], x[i], s, rd, b, dx[i])
            _dw(dy[i], x[i], rstd[i], pw)

    return bwd


FORMS = {
    "float64": (_forward(_ss64), _backward(True)),
    "float32": (_forward(_ss32), None),
    "blocked": (_forward(_ss_blocked), _backward(False)),
}


def _cpu_ns_per_element(fn, args, elements: int, budget: float) -> float:
    """Process CPU time per element of fn(*args): the best of three blocks of about budget / 3."""
    fn(*args)
    t0 = time.process_time()
    fn(*args)
    one = max(time.process_time() - t0, 1e-6)
    reps = max(1, int(budget / 3 / one))
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time_ns()
        for _ in range(reps):
            fn(*args)
        best = min(best, (time.process_time_ns() - t0) / reps)
    return best / elements


def timings(ns: tuple[int, ...], budget: float, rounds: int) -> list[str]:
    """The forms take turns for `rounds` rounds (a change of the machine's load hits all alike);
    each cell is the median over the rounds, and the ratio the median of the per-round ratios."""
    rows = [
        "| rows | M × N | pass | float64 | float32 | blocked | float64 ÷ blocked |",
        "|---|---|---|---|---|---|---|",
    ]
    rng = np.random.default_rng(0)
    for total, where in ((1 << 16, "in cache"), (1 << 24, "from memory")):
        for n in ns:
            m = max(1, total // n)
            x = rng.standard_normal((m, n)).astype(np.float32)
            dy = rng.standard_normal((m, n)).astype(np.float32)
            s = (rng.random(n) + 0.5).astype(np.float32)
            y, dx = np.empty_like(x), np.empty_like(x)
            rstd, pw = np.empty(m, np.float32), np.zeros(n, np.float32)
            for name, slot, args in (
                ("forward", 0, (x, s, 1e-6, y, rstd)),
                ("backward", 1, (dy, x, s, rstd, dx, pw)),
            ):
                forms = {k: f[slot] for k, f in FORMS.items() if f[slot] is not None}
                runs: dict[str, list[float]] = {k: [] for k in forms}
                for _ in range(rounds):
                    for k, fn in forms.items():
                        runs[k].append(_cpu_ns_per_element(fn, args, m * n, budget))
                t = {k: statistics.median(v) for k, v in runs.items()}
                ratio = statistics.median(
                    a / b for a, b in zip(runs["float64"], runs["blocked"], strict=True)
                )
                f32 = f"{t['float32']:.3f}" if "float32" in t else "—"
                rows.append(
                    f"| {where} | {m} × {n} | {name} | {t['float64']:.3f} | {f32} | "
                    f"{t['blocked']:.3f} | {ratio:.2f}× |"
                )
    return rows


def _rows(kind: str, m: int, n: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(m, n, generator=gen, dtype=torch.float64)
    if kind == "large mean":
        x = x + 100.0
    elif kind == "one dominant":
        x[:, 0] = 1e4
    return x.to(torch.float32)


def accuracy(ns: tuple[int, ...]) -> list[str]:
    """error ÷ tolerance of each form against float64 (the rule of rmsnorm.testing)."""
    rows = [
        "| rows | N | output | float64 | float32 | blocked |",
        "|---|---|---|---|---|---|",
    ]
    gen = torch.Generator().manual_seed(0)
    for kind in ("centred", "large mean", "one dominant"):
        for n in ns:
            m = max(8, min(256, (1 << 18) // n))
            x = _rows(kind, m, n, gen)
            dy = torch.randn(m, n, generator=gen).to(torch.float32)
            w = (torch.rand(n, generator=gen) + 0.5).to(torch.float32)
            opts = ref.RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
            y64, r64 = ref.rms_norm_fwd(x.double(), w.double(), None, opts)
            y_eager, r_eager = ref.rms_norm_fwd(x, w, None, opts)
            dx64, _, _ = ref.rms_norm_bwd(
                dy.double(), x.double(), w.double(), None, r64, None, opts, torch.float64
            )
            dx_eager, _, _ = ref.rms_norm_bwd(dy, x, w, None, r_eager, None, opts, torch.float32)
            ratios: dict[str, tuple[float, ...]] = {}
            for form, (fwd, bwd) in FORMS.items():
                xn, sn = x.numpy(), w.numpy()
                y, rstd = np.empty_like(xn), np.empty(m, np.float32)
                fwd(xn, sn, 1e-6, y, rstd)
                out = [(torch.from_numpy(y), y64, y_eager), (torch.from_numpy(rstd), r64, r_eager)]
                if bwd is not None:
                    dx, pw = np.empty_like(xn), np.zeros(n, np.float32)
                    bwd(dy.numpy(), xn, sn, rstd, dx, pw)
                    out.append((torch.from_numpy(dx), dx64, dx_eager))
                ratios[form] = tuple(
                    max_abs_error(a, e) / tolerance(e, g, torch.float32) for a, e, g in out
                )
            for i, name in enumerate(("y", "rstd", "dx")):
                cells = [f"{ratios[f][i]:.3f}" if i < len(ratios[f]) else "—" for f in FORMS]
                rows.append(f"| {kind} | {n} | {name} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter timings")
    args = parser.parse_args()
    ns = (128, 4096) if args.quick else (128, 768, 4096, 16384, 65536)
    budget, rounds = (0.05, 3) if args.quick else (0.1, 7)
    print("## CPU time per element (ns), one thread\n")
    print("\n".join(timings(ns if args.quick else ns[:4], budget, rounds)))
    print("\n## Error ÷ the tolerance of rmsnorm.testing (≤ 1 passes)\n")
    print("\n".join(accuracy(ns)))


if __name__ == "__main__":
    main()
