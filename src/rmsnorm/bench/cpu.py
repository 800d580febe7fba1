"""The CPU benchmark: this library's CPU kernels against the peers that run on CPU, in one process.

Providers as in the GPU mode: ``rmsnorm``, ``torch`` (F.rms_norm / F.layer_norm),
``torch_compile_reference``, ``hf_llama_eager`` and, for the residual form, ``torch_add``. Shapes:
M·N = 2^25 for N in {512, 1024, 4096, 16384}, float32 and bfloat16, forward / backward / both,
plus per-call latency at decoding sizes. Timing: ``torch.utils.benchmark.Timer.blocked_autorange``
medians after a warm-up call; the copy ceiling is ``dst.copy_(src)`` over the same elements in the
same process.

Fresh outputs of 2^25 elements are past glibc's largest mmap threshold (32 MiB), so by default every
call of every provider maps new pages and faults them in, which on these machines costs about as
much as the kernel itself. The benchmark therefore asks glibc to keep freed memory for reuse (as
jemalloc / tcmalloc do), for every provider alike; ``benchmarks/results/CPU_NOTES.md`` shows both.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

import torch

from .. import info
from . import Row, machine, make_row
from .measure import per_call_s
from .providers import _inputs, _mode_fn, _providers

_NS = (512, 1024, 4096, 16384)
_MN = 2**25


def keep_freed_memory() -> bool:
    """glibc only: serve every allocation from the heap and never trim it, so that a freed output
    buffer is reused by the next call instead of being unmapped and faulted in again. Returns
    whether the setting took (False on other C libraries)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4  # mallopt parameters from <malloc.h>
        # (mallopt takes a C int: 2^31 − 1 bytes is the largest trim threshold)
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def cpu_name() -> str:
    """'<model name>, <n> cores' (:mod:`rmsnorm.info`)."""
    return f"{info.cpu_model()}, {info.cpu_cores()} cores"


def _numba_version() -> str:
    return info.package_version("numba") or "none"


def device_name(kept_freed_memory: bool = False) -> str:
    """The ``device_name`` column of CPU rows: model, cores, torch threads, numba version and
    whether glibc keeps freed memory (:func:`keep_freed_memory`)."""
    return f"{cpu_name()}, {torch.get_num_threads()} threads, numba {_numba_version()}" + (
        ", glibc malloc keeps freed memory" if kept_freed_memory else ""
    )


class _Timer:
    def __init__(self, quick: bool):
        self.min_run_time = 0.3 if quick else 0.5
        self._copy: dict = {}

    def median_ms(self, fn: Callable) -> float:
        fn()  # warm-up: JIT load / compile, first-touch of buffers
        return per_call_s(fn, self.min_run_time) * 1e3

    def copy_gbps(self, numel: int, dtype: torch.dtype) -> tuple[float, float]:
        key = (numel, dtype)
        if key not in self._copy:
            src = torch.randn(numel).to(dtype)
            dst = torch.empty_like(src)
            ms = self.median_ms(lambda: dst.copy_(src))
            self._copy[key] = (2 * numel * dtype.itemsize / (ms * 1e-3) / 1e9, ms)
        return self._copy[key]

    @staticmethod
    def per_call_ms(fn: Callable, calls: int = 200, repeats: int = 7) -> float:
        for _ in range(10):
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls * 1e3)
        return sorted(times)[len(times) // 2]


def _plan(quick: bool) -> list[tuple]:
    """(op, dtype, M, N, modes, kind) in priority order."""
    fb = ("forward", "backward", "forward_backward")
    f32, bf16 = torch.float32, torch.bfloat16
    ns = (4096,) if quick else _NS
    plan = []
    for n in ns:
        for dtype in (f32, bf16):
            plan.append(("rms_norm", dtype, _MN // n, n, fb, "sweep"))
            plan.append(("layer_norm", dtype, _MN // n, n, fb, "sweep"))
    for dtype in (bf16, f32):
        plan.append(("add_rms_norm", dtype, _MN // 4096, 4096, ("forward", "backward"), "sweep"))
    plan += [("rms_norm", bf16, m, 4096, ("forward",), "decode") for m in (1, 128)]
    return plan


class _DryTimer(_Timer):
    """One call per measurement: exercises the harness (tests)."""

    def median_ms(self, fn: Callable) -> float:
        t0 = time.perf_counter()
        fn()
        return max(time.perf_counter() - t0, 1e-9) * 1e3

    @staticmethod
    def per_call_ms(fn: Callable, calls: int = 2, repeats: int = 1) -> float:
        return _Timer.per_call_ms(fn, calls, repeats)


def run(
    quick: bool = False,
    variants: bool = False,
    budget_s: float | None = None,
    log=print,
    dry_run: bool = False,
) -> list[Row]:
    """Time every planned (op, dtype, shape, mode, provider) on CPU tensors; returns the rows (copy
    rows included). `variants` has no meaning on CPU (one kernel layout) and is ignored.
    `dry_run` runs the quick plan at tiny shapes, one call per timing, without torch.compile and
    without touching the allocator: a check of the harness itself."""
    budget_s = (300.0 if quick else 1800.0) if budget_s is None else budget_s
    start = time.monotonic()
    kept = False if dry_run else keep_freed_memory()
    meta = machine("cpu")
    meta["device_name"] = device_name(kept)
    log(f"{meta['device_name']}; torch {meta['torch']}; commit {meta['commit']}")
    timer = _DryTimer(quick) if dry_run else _Timer(quick)
    rounds = 1 if quick or dry_run else 3
    ops = ("rms_norm", "add_rms_norm", "layer_norm")
    providers = {op: _providers(op, None, compile=not dry_run) for op in ops}
    plan, mn = _plan(quick or dry_run), _MN
    if dry_run:
        plan = [(op, dt, min(m, 8), min(n, 256), modes, kind) for op, dt, m, n, modes, kind in plan]
        mn = 2**11
    rows: list[Row] = []
    for dtype in (torch.float32, torch.bfloat16):
        gbps, ms = timer.copy_gbps(mn, dtype)
        rows.append(make_row(meta, "copy", "forward", "torch", dtype, 1, mn, "eager", ms, gbps))
        log(f"copy {dtype}: {gbps:.1f} GB/s over {mn:,} elements")

    for op, dtype, m, n, modes, kind in plan:
        if time.monotonic() - start > budget_s:
            log(f"skipped {op} {dtype} ({m}, {n}): time budget {budget_s:.0f} s spent")
            continue
        copy_gbps, _ = timer.copy_gbps(m * n, dtype)
        if kind == "decode":
            inputs = _inputs(op, m, n, dtype, grad=False, dev="cpu")
            for name, fn in providers[op].items():
                with torch.no_grad():
                    ms = timer.per_call_ms(lambda fn=fn, inputs=inputs: fn(*inputs))
                rows.append(
                    make_row(meta, op, "forward", name, dtype, m, n, "eager", ms, copy_gbps)
                )
        else:
            inputs = _inputs(op, m, n, dtype, grad=True, dev="cpu")
            for mode in modes:
                times = _interleaved(timer, providers[op], inputs, mode, rounds, log)
                for name, ms in times.items():
                    rows.append(make_row(meta, op, mode, name, dtype, m, n, "eager", ms, copy_gbps))
        del inputs
        log(_progress(rows, op, dtype, m, n, time.monotonic() - start))
    return rows


def _interleaved(timer, providers: dict, inputs: list, mode: str, rounds: int, log) -> dict:
    """Median over `rounds` of each provider's median time, the providers taking turns within a
    round, so that a change in the machine's load (these machines are shared) hits all alike."""
    fns = {}
    for name, fn in providers.items():
        try:
            fns[name] = _mode_fn(fn, inputs, mode)
            fns[name]()  # warm-up: JIT load / torch.compile
        except Exception as exc:
            log(f"{name} {mode}: failed: {type(exc).__name__}: {exc}"[:300])
            fns.pop(name, None)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timer.median_ms(fn))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def _progress(rows, op, dtype, m, n, elapsed) -> str:
    mine = [r for r in rows if (r.op, r.M, r.N, r.dtype) == (op, m, n, str(dtype)[6:])]
    parts = [
        f"{r.provider}/{r.mode} {r.ms * 1e3:.0f}us" if m <= 128 else
        f"{r.provider}/{r.mode} {r.gbps:.1f}GB/s ({r.pct_copy:.0f}%)"
        for r in mine
    ]  # fmt: skip
    return f"[{elapsed:5.0f}s] {op} {str(dtype)[6:]} ({m}, {n}): " + ", ".join(parts)
