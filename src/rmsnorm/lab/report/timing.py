"""A quick, honest timing of RMSNorm vs LayerNorm forward + backward on this machine, with this
library (``rmsnorm.rms_norm`` / ``layer_norm``, whatever backend is in force) and with torch
(``F.rms_norm`` / ``F.layer_norm``), for the report. The benchmarks/ suite is the thorough one."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ... import functional, info
from ..._progress import ensure
from ..._timing import interleaved
from ..stats.rows import median

__all__ = ["SHAPES", "METHOD", "time_norms", "timing_ratios"]

# (name, rows, hidden): hidden sizes of GPT-2 small and of Llama-2 7B
SHAPES = (("2048 × 768 (GPT-2 small)", 2048, 768), ("512 × 4096 (Llama-2 7B)", 512, 4096))


def _impls(n: int, eps: float):
    return (
        ("rmsnorm.rms_norm", lambda x, w, b: functional.rms_norm(x, (n,), w, eps), "xw"),
        ("rmsnorm.layer_norm", lambda x, w, b: functional.layer_norm(x, (n,), w, b, eps), "xwb"),
        ("torch F.rms_norm", lambda x, w, b: F.rms_norm(x, (n,), w, eps), "xw"),
        ("torch F.layer_norm", lambda x, w, b: F.layer_norm(x, (n,), w, b, eps), "xwb"),
    )


def _fwd_bwd(fn, x, w, b, dy, inputs):
    return lambda: torch.autograd.grad(fn(x, w, b), inputs, dy)


METHOD = (
    "one call = the forward and torch.autograd.grad with respect to the input and the "
    "parameters; median seconds per call from torch.utils.benchmark's blocked_autorange at the "
    "process's thread count, the four implementations taking turns in each round "
    "(rmsnorm._timing, the loop `rmsnorm bench` and `rmsnorm compare` use)"
)


def time_norms(
    shapes=SHAPES,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    rounds: int = 5,
    min_run_time: float = 0.02,
    progress=None,
) -> dict:
    """Time per forward + backward call of the four implementations at each (name, rows, hidden)
    shape: the median and the fastest of ``rounds`` interleaved samples (each a
    ``blocked_autorange`` median over at least ``min_run_time`` seconds of calls). LayerNorm gets
    a bias, RMSNorm does not (as in the models that use them)."""
    progress = ensure(progress)
    gen = torch.Generator().manual_seed(0)
    results = []
    with progress.task("timing: forward + backward", total=len(shapes) * rounds) as advance:
        for shape_name, m, n in shapes:
            x = torch.randn(m, n, generator=gen).to(device=device, dtype=dtype)
            dy = torch.randn(m, n, generator=gen).to(device=device, dtype=dtype)
            x.requires_grad_(True)
            w = torch.ones(n, device=device, dtype=dtype, requires_grad=True)
            b = torch.zeros(n, device=device, dtype=dtype, requires_grad=True)
            calls = {
                impl: _fwd_bwd(fn, x, w, b, dy, [x, w, b] if wrt == "xwb" else [x, w])
                for impl, fn, wrt in _impls(n, 1e-5)
            }
            samples = interleaved(calls, rounds=rounds, min_run_time=min_run_time, on_round=advance)
            for impl, secs in samples.items():
                results.append(
                    {
                        "shape_name": shape_name,
                        "rows": m,
                        "hidden": n,
                        "impl": impl,
                        "median_ms": median(secs) * 1e3,
                        "min_ms": min(secs) * 1e3,
                        "rounds": rounds,
                    }
                )
    return {
        "machine": info.machine_description(),
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "backend": info.describe_backend(device),
        "torch": torch.__version__,
        "method": METHOD,
        "results": results,
    }


def timing_ratios(timing: dict) -> dict:
    """Geometric means over shapes of time ratios: RMSNorm / LayerNorm per library ("rmsnorm",
    "torch"), and this library's rms_norm / each of torch's norms ("ours_over_torch_rms_norm",
    "ours_over_torch_layer_norm")."""
    out = {}
    for lib, rms, ln in (
        ("rmsnorm", "rmsnorm.rms_norm", "rmsnorm.layer_norm"),
        ("torch", "torch F.rms_norm", "torch F.layer_norm"),
        ("ours_over_torch_rms_norm", "rmsnorm.rms_norm", "torch F.rms_norm"),
        ("ours_over_torch_layer_norm", "rmsnorm.rms_norm", "torch F.layer_norm"),
    ):
        logs = []
        for shape in dict.fromkeys(r["shape_name"] for r in timing["results"]):
            t = {r["impl"]: r["median_ms"] for r in timing["results"] if r["shape_name"] == shape}
            if rms in t and ln in t and t[ln] > 0:
                logs.append(math.log(t[rms] / t[ln]))
        out[lib] = math.exp(sum(logs) / len(logs)) if logs else math.nan
    return out
