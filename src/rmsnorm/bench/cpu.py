"""The CPU configuration of the throughput mode of ``rmsnorm bench`` (run by ``harness.py``): this
library's CPU kernels against the peers that run on CPU, in one process.

Providers as in the GPU mode: ``rmsnorm``, ``torch`` (F.rms_norm / F.layer_norm),
``torch_compile_reference``, ``hf_llama_eager`` and, for the residual form, ``torch_add``; for the
gated norms the Hugging Face forwards (``hf_qwen3_next_eager``, ``hf_mamba2_eager``) and
``torch_compile_hf``. Shapes: M·N = 2^25 for N in {512, 1024, 4096, 16384}, float32 and bfloat16,
forward / backward / both, plus per-call latency at decoding sizes; the gated norms at N = 4096
(2048 rows, 2^25 elements, decoding sizes). Timing: ``torch.utils.benchmark.Timer``'s
``blocked_autorange`` medians after a warm-up call, the providers taking turns over three rounds;
the copy ceiling is ``dst.copy_(src)`` over the same elements in the same process.

Fresh outputs of 2^25 elements are past glibc's largest mmap threshold (32 MiB), so by default every
call of every provider maps new pages and faults them in, which on these machines costs about as
much as the kernel itself. The benchmark therefore asks glibc to keep freed memory for reuse (as
jemalloc / tcmalloc do), for every provider alike; ``benchmarks/results/CPU_NOTES.md`` shows both.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from .. import info
from .._timing import per_call_s
from .harness import DryTimer, Item, Setup, Timer
from .rows import machine

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
    """'<model name>, <n> cores, <vector unit>' (:mod:`rmsnorm.info`): one model name covers hosts
    with and without AVX-512, which time differently."""
    return f"{info.cpu_model()}, {info.cpu_cores()} cores, {info.cpu_vector_unit()}"


def _numba_version() -> str:
    return info.package_version("numba") or "none"


def device_name(kept_freed_memory: bool = False) -> str:
    """The ``device_name`` column of CPU rows: model, cores, torch threads, numba version and
    whether glibc keeps freed memory (:func:`keep_freed_memory`)."""
    return f"{cpu_name()}, {torch.get_num_threads()} threads, numba {_numba_version()}" + (
        ", glibc malloc keeps freed memory" if kept_freed_memory else ""
    )


class _Autorange(Timer):
    repeats = 7

    def __init__(self, quick: bool) -> None:
        super().__init__()
        self.min_run_time = 0.3 if quick else 0.5

    def median_ms(self, fn: Callable) -> float:
        return per_call_s(fn, self.min_run_time) * 1e3


def _plan(quick: bool) -> list[Item]:
    """The plan in priority order."""
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
    # The gated norms of the hybrid models against the Hugging Face forwards and torch.compile of
    # them: a prefill of 2048 tokens, the sweep's elements, decoding steps.
    for op in ("gated_rms_norm", "gated_rms_norm_grouped"):
        plan.append((op, bf16, 2048, 4096, fb, "sweep"))
        if not quick:
            plan += [(op, dtype, _MN // 4096, 4096, fb, "sweep") for dtype in (bf16, f32)]
        plan += [(op, bf16, m, 4096, ("forward",), "decode") for m in (1, 128)]
    return [Item(*entry) for entry in plan]


def setup(quick: bool = False, dry_run: bool = False, warm: tuple[int, int] | None = None) -> Setup:
    """The CPU run: ``blocked_autorange`` medians over three interleaved rounds (one when
    ``quick``), glibc keeping freed memory, a 300 s (quick) or 1800 s budget. ``dry_run``: the
    quick plan at tiny shapes, one call per timing, no torch.compile, the allocator untouched.
    ``warm`` has no meaning here (nothing is compiled ahead) and is refused."""
    if warm is not None:
        raise ValueError("warm: only the GPU run has kernel caches to fill")
    plan = _plan(quick or dry_run)
    if dry_run:
        plan = [item.shrunk() for item in plan]
    kept = False if dry_run else keep_freed_memory()
    meta = machine("cpu")
    meta["device_name"] = device_name(kept)
    return Setup(
        title="bench (cpu)",
        meta=meta,
        timer=DryTimer() if dry_run else _Autorange(quick),
        plan=plan,
        budget_s=300.0 if quick else 1800.0,
        copy_numel=2**11 if dry_run else _MN,
        rounds=1 if quick or dry_run else 3,
        compile=not dry_run,
        strict=dry_run,
        notes=[f"{meta['device_name']}; torch {meta['torch']}; commit {meta['commit']}"],
    )
