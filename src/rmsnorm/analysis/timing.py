"""A quick, honest timing of RMSNorm vs LayerNorm forward + backward on this machine, with this
library (``rmsnorm.rms_norm`` / ``layer_norm``, whatever backend is in force) and with torch
(``F.rms_norm`` / ``F.layer_norm``), for the report. The benchmarks/ suite is the thorough one."""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import _backend, functional
from .progress import ensure

__all__ = ["SHAPES", "machine_name", "time_norms"]

# (name, rows, hidden): hidden sizes of GPT-2 small and of Llama-2 7B
SHAPES = (("2048 × 768 (GPT-2 small)", 2048, 768), ("512 × 4096 (Llama-2 7B)", 512, 4096))


def machine_name() -> str:
    """CPU model, logical cores and torch threads (or the GPU name)."""
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    threads = torch.get_num_threads()
    text = f"{cpu}, {os.cpu_count()} logical cores, {threads} torch thread{'s' * (threads > 1)}"
    if torch.cuda.is_available():
        text += f"; GPU {torch.cuda.get_device_name(0)}"
    return text


def _impls(n: int, eps: float):
    return (
        ("rmsnorm.rms_norm", lambda x, w, b: functional.rms_norm(x, (n,), w, eps)),
        ("rmsnorm.layer_norm", lambda x, w, b: functional.layer_norm(x, (n,), w, b, eps)),
        ("torch F.rms_norm", lambda x, w, b: F.rms_norm(x, (n,), w, eps)),
        ("torch F.layer_norm", lambda x, w, b: F.layer_norm(x, (n,), w, b, eps)),
    )


def time_norms(
    shapes=SHAPES,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    reps: int = 10,
    warmup: int = 2,
    progress=None,
) -> dict:
    """Median wall time (ms) of ``y = norm(x); y.backward(dy)`` over ``reps`` runs after
    ``warmup``, for the four implementations and each (name, rows, hidden) shape. LayerNorm gets a
    bias, RMSNorm does not (as in the models that use them)."""
    progress = ensure(progress)
    gen = torch.Generator().manual_seed(0)
    results = []
    total = len(shapes) * 4
    with progress.task("timing: forward + backward", total=total) as advance:
        for shape_name, m, n in shapes:
            x0 = torch.randn(m, n, generator=gen).to(device=device, dtype=dtype)
            dy = torch.randn(m, n, generator=gen).to(device=device, dtype=dtype)
            w0 = torch.ones(n, device=device, dtype=dtype)
            b0 = torch.zeros(n, device=device, dtype=dtype)
            for impl, fn in _impls(n, 1e-5):
                x = x0.clone().requires_grad_(True)
                w = w0.clone().requires_grad_(True)
                b = b0.clone().requires_grad_(True)
                times = []
                for i in range(warmup + reps):
                    x.grad = w.grad = b.grad = None
                    if device != "cpu":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn(x, w, b).backward(dy)
                    if device != "cpu":
                        torch.cuda.synchronize()
                    if i >= warmup:
                        times.append((time.perf_counter() - t0) * 1e3)
                results.append(
                    {
                        "shape_name": shape_name,
                        "rows": m,
                        "hidden": n,
                        "impl": impl,
                        "median_ms": statistics.median(times),
                        "min_ms": min(times),
                        "reps": reps,
                    }
                )
                advance()
    return {
        "machine": machine_name(),
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "backend": _backend.describe(device),
        "torch": torch.__version__,
        "results": results,
    }
