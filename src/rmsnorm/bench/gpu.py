"""The GPU benchmark: this library against its peers on one CUDA device, in one process.

Providers: ``rmsnorm`` (this library), ``torch`` (F.rms_norm / F.layer_norm),
``torch_compile_reference`` (torch.compile of :mod:`rmsnorm.reference`), ``hf_llama_eager`` (a
Hugging Face Llama-style eager RMSNorm), ``liger`` (Liger-Kernel, when importable; "gemma" casting,
the same math as ours) and, for the fused residual form, ``torch_add`` (eager add + F.rms_norm).
Timing: ``triton.testing.do_bench`` medians after warm-up on random data; decoding sizes as wall
time per call (eager) and per replayed call inside a CUDA graph. A time budget skips (and logs)
whatever does not fit, lowest priority last.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from . import Row, machine, make_row
from .providers import _inputs, _liger, _mode_fn, _providers

_FULL_NS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
_MN = 2**27


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------
class _Timer:
    device = "cuda"

    def __init__(self, quick: bool):
        from triton.testing import do_bench

        self._do_bench = do_bench
        self.warmup, self.rep = (5, 20) if quick else (10, 40)
        self._copy: dict = {}

    def median_ms(self, fn: Callable) -> float:
        return float(self._do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median"))

    @staticmethod
    def sync() -> None:
        torch.cuda.synchronize()

    def copy_gbps(self, numel: int, dtype: torch.dtype) -> tuple[float, float]:
        """(GB/s, ms) of dst.copy_(src) over `numel` elements (read + write), cached."""
        key = (numel, dtype)
        if key not in self._copy:
            src = torch.randn(numel, device=self.device, dtype=torch.float32).to(dtype)
            dst = torch.empty_like(src)
            ms = self.median_ms(lambda: dst.copy_(src))
            self._copy[key] = (2 * numel * dtype.itemsize / (ms * 1e-3) / 1e9, ms)
            del src, dst
        return self._copy[key]

    def per_call_ms_eager(self, fn: Callable, calls: int = 200, repeats: int = 5) -> float:
        """Wall time per back-to-back call (host overhead included), median of `repeats`."""
        for _ in range(10):
            fn()
        times = []
        for _ in range(repeats):
            self.sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            self.sync()
            times.append((time.perf_counter() - t0) / calls * 1e3)
        return sorted(times)[len(times) // 2]

    def per_call_ms_graph(self, fn: Callable, calls: int = 50) -> float:
        """Device time per call replayed from a CUDA graph holding `calls` calls."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        return self.median_ms(graph.replay) / calls


class _DryTimer(_Timer):
    """CPU tensors, one call per measurement, no CUDA graphs: exercises the harness (tests)."""

    device = "cpu"

    def __init__(self, quick: bool):
        self._copy = {}

    def median_ms(self, fn: Callable) -> float:
        t0 = time.perf_counter()
        fn()
        return max(time.perf_counter() - t0, 1e-9) * 1e3

    @staticmethod
    def sync() -> None:
        pass

    def per_call_ms_eager(self, fn: Callable, calls: int = 2, repeats: int = 1) -> float:
        return super().per_call_ms_eager(fn, calls, repeats)

    def per_call_ms_graph(self, fn: Callable, calls: int = 1) -> float:
        return self.median_ms(fn)


class _WarmTimer(_DryTimer):
    """One untimed call per measurement on the GPU: compiles (and caches) what a timed run uses."""

    device = "cuda"

    @staticmethod
    def sync() -> None:
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------------------------
def _plan(quick: bool) -> list[tuple]:
    """(op, dtype, M, N, modes, kind) in priority order; kind "sweep" or "decode"."""
    fb = ("forward", "backward", "forward_backward")
    f_b = ("forward", "backward")
    bf16, fp32 = torch.bfloat16, torch.float32
    if quick:
        return [
            ("rms_norm", bf16, _MN // 4096, 4096, f_b, "sweep"),
            ("rms_norm", bf16, _MN // 65536, 65536, f_b, "sweep"),
            ("rms_norm", bf16, 2**20, 128, f_b, "sweep"),
            ("rms_norm", bf16, 1, 4096, ("forward",), "decode"),
            ("rms_norm", bf16, 128, 4096, ("forward",), "decode"),
            ("add_rms_norm", bf16, 32768, 4096, f_b, "sweep"),
            ("layer_norm", bf16, 32768, 4096, f_b, "sweep"),
        ]
    plan = [("rms_norm", bf16, _MN // n, n, fb, "sweep") for n in _FULL_NS]
    plan.append(("rms_norm", bf16, 2**20, 128, f_b, "sweep"))  # QK-norm
    plan += [("rms_norm", bf16, m, 4096, ("forward",), "decode") for m in (1, 32, 128)]
    plan += [("add_rms_norm", bf16, m, n, f_b, "sweep") for m, n in ((32768, 4096), (16384, 8192))]
    plan += [("layer_norm", bf16, _MN // n, n, f_b, "sweep") for n in (1024, 4096, 16384, 65536)]
    plan += [("rms_norm", fp32, _MN // n, n, f_b, "sweep") for n in (2048, 4096, 32768, 131072)]
    plan.append(("add_rms_norm", bf16, 2048, 65536, f_b, "sweep"))
    plan.append(("rms_norm", bf16, 128, 4096, ("backward",), "decode"))
    return plan


def run(
    quick: bool = False,
    variants: bool = False,
    budget_s: float | None = None,
    log=print,
    dry_run: bool = False,
    warm: tuple[int, int] | None = None,
) -> list[Row]:
    """Time every planned (op, dtype, shape, mode, provider); returns the rows (copy rows too).

    `dry_run` runs the quick plan at tiny shapes on CPU tensors with one call per timing and
    without torch.compile: a check of the harness itself where there is no GPU. `warm=(i, n)` runs
    plan items i, i + n, ... once each, untimed and without a budget, and returns no rows: it fills
    Triton's and inductor's on-disk caches, so that n such processes run in parallel before a timed
    run make that run load its kernels instead of compiling them (benchmarks/gpu_check.sh)."""
    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("--device cuda needs a CUDA device")
    budget_s = (90.0 if quick else 270.0) if budget_s is None else budget_s
    if warm is not None:
        budget_s = float("inf")
    start = time.monotonic()
    meta = machine("cpu" if dry_run else "cuda")
    if dry_run:
        timer = _DryTimer(quick)
    elif warm is not None:
        timer = _WarmTimer(quick)
    else:
        timer = _Timer(quick)
    liger, why = (None, "dry run") if dry_run else _liger()
    if liger is None:
        log(f"liger: not available ({why}); its columns are left out")
    rows: list[Row] = []
    ops = ("rms_norm", "add_rms_norm", "layer_norm")
    providers = {op: _providers(op, liger, compile=not dry_run) for op in ops}
    plan = _plan(quick or dry_run)
    mn = _MN
    if dry_run:
        plan = [(op, dt, min(m, 8), min(n, 256), modes, kind) for op, dt, m, n, modes, kind in plan]
        mn = 2**12
    if warm is not None:
        plan = plan[warm[0] :: warm[1]]

    # The copy ceiling first, over the sweep's element count, once per dtype.
    for dtype in (torch.bfloat16, torch.float32):
        gbps, ms = timer.copy_gbps(mn, dtype)
        rows.append(make_row(meta, "copy", "forward", "torch", dtype, 1, mn, "eager", ms, gbps))
        log(f"copy {dtype}: {gbps:.0f} GB/s over {mn:,} elements")

    for op, dtype, m, n, modes, kind in plan:
        if time.monotonic() - start > budget_s:
            log(f"skipped {op} {dtype} ({m}, {n}): time budget {budget_s:.0f} s spent")
            continue
        copy_gbps, _ = timer.copy_gbps(m * n, dtype)
        for name, fn in providers[op].items():
            try:
                if kind == "decode":
                    rows += _decode(meta, timer, op, name, fn, dtype, m, n, modes, copy_gbps)
                else:
                    inputs = _inputs(op, m, n, dtype, grad=True, dev=timer.device)
                    for mode in modes:
                        ms = timer.median_ms(_mode_fn(fn, inputs, mode))
                        rows.append(
                            make_row(meta, op, mode, name, dtype, m, n, "eager", ms, copy_gbps)
                        )
                    del inputs
            except Exception as exc:  # a peer that cannot run a shape (Liger past 65536)
                if dry_run:
                    raise
                log(f"{op} {name} {dtype} ({m}, {n}): failed: {type(exc).__name__}: {exc}"[:300])
            if not dry_run:
                torch.cuda.empty_cache()
        log(_progress(rows, op, dtype, m, n, time.monotonic() - start))

    if variants:
        from .variants import run_variants

        extra = 60.0 if quick else 90.0
        rows += run_variants(meta, timer, start, budget_s + extra, log, shard=warm or (0, 1))
    return [] if warm is not None else rows


def _decode(meta, timer, op, name, fn, dtype, m, n, modes, copy_gbps) -> list[Row]:
    out = []
    if modes == ("forward",):
        inputs = _inputs(op, m, n, dtype, grad=False, dev=timer.device)
        with torch.no_grad():
            call = lambda: fn(*inputs)  # noqa: E731
            ms = timer.per_call_ms_eager(call)
            out.append(make_row(meta, op, "forward", name, dtype, m, n, "eager", ms, copy_gbps))
            ms = timer.per_call_ms_graph(call)
            out.append(
                make_row(meta, op, "forward", name, dtype, m, n, "cuda_graph", ms, copy_gbps)
            )
    else:
        inputs = _inputs(op, m, n, dtype, grad=True, dev=timer.device)
        for mode in modes:
            ms = timer.per_call_ms_eager(_mode_fn(fn, inputs, mode))
            out.append(make_row(meta, op, mode, name, dtype, m, n, "eager", ms, copy_gbps))
    return out


def _progress(rows, op, dtype, m, n, elapsed) -> str:
    mine = [r for r in rows if (r.op, r.M, r.N) == (op, m, n) and r.dtype == str(dtype)[6:]]
    parts = []
    for r in mine:
        if r.provider == "rmsnorm":
            val = f"{r.ms * 1e3:.1f}us" if m <= 128 else f"{r.pct_copy:.0f}%"
            parts.append(f"{r.mode}/{r.variant} {val}")
    return f"[{elapsed:5.0f}s] {op} {str(dtype)[6:]} ({m}, {n}): rmsnorm " + ", ".join(parts)


def _main() -> None:
    """``python -m rmsnorm.bench.gpu --warm I/N [--quick] [--variants]``: one cache-warming
    shard."""
    import argparse

    ap = argparse.ArgumentParser(description=_main.__doc__)
    ap.add_argument("--warm", required=True, help="shard I/N of the plan, e.g. 0/4")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variants", action="store_true")
    a = ap.parse_args()
    i, n = (int(v) for v in a.warm.split("/"))
    t0 = time.monotonic()
    run(quick=a.quick, variants=a.variants, warm=(i, n), log=lambda s: None)
    print(f"warm shard {i}/{n}: {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    _main()
