"""The GPU configuration of the throughput mode of ``rmsnorm bench`` (run by ``harness.py``): this
library against its peers on one CUDA device, in one process.

Providers: ``rmsnorm`` (this library), ``torch`` (F.rms_norm / F.layer_norm),
``torch_compile_reference`` (torch.compile of :mod:`rmsnorm.reference`), ``hf_llama_eager`` (a
Hugging Face Llama-style eager RMSNorm), ``liger`` (Liger-Kernel, when importable; "gemma" casting,
the same math as ours), for the fused residual form ``torch_add`` (eager add + F.rms_norm), and for
the gated norms the Hugging Face forwards (Qwen3-Next, Mamba2) and ``torch_compile_hf``.
Timing: ``triton.testing.do_bench`` medians after warm-up on random data; decoding sizes as wall
time per call (eager) and per replayed call inside a CUDA graph. A time budget skips (and logs)
whatever does not fit, lowest priority last.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from . import harness
from .harness import DryTimer, Item, Setup, Timer
from .providers import liger_functions
from .rows import check_device, machine

_FULL_NS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
_MN = 2**27


class _DoBench(Timer):
    device = "cuda"

    def __init__(self, quick: bool) -> None:
        super().__init__()
        from triton.testing import do_bench

        self._do_bench = do_bench
        self.warmup, self.rep = (5, 20) if quick else (10, 40)

    def median_ms(self, fn: Callable) -> float:
        return float(self._do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median"))


class _WarmTimer(DryTimer):
    """One untimed call per measurement on the GPU: compiles (and caches) what a timed run uses."""

    device = "cuda"


def _plan(quick: bool) -> list[Item]:
    """The plan in priority order."""
    fb = ("forward", "backward", "forward_backward")
    f_b = ("forward", "backward")
    bf16, fp32 = torch.bfloat16, torch.float32
    if quick:
        plan = [
            ("rms_norm", bf16, _MN // 4096, 4096, f_b, "sweep"),
            ("rms_norm", bf16, _MN // 65536, 65536, f_b, "sweep"),
            ("rms_norm", bf16, 2**20, 128, f_b, "sweep"),
            ("rms_norm", bf16, 1, 4096, ("forward",), "decode"),
            ("rms_norm", bf16, 128, 4096, ("forward",), "decode"),
            ("add_rms_norm", bf16, 32768, 4096, f_b, "sweep"),
            ("layer_norm", bf16, 32768, 4096, f_b, "sweep"),
            ("gated_rms_norm", bf16, 32768, 4096, f_b, "sweep"),
            ("gated_rms_norm_grouped", bf16, 32768, 4096, f_b, "sweep"),
            ("gated_rms_norm", bf16, 1, 4096, ("forward",), "decode"),
        ]
        return [Item(*entry) for entry in plan]
    plan = [("rms_norm", bf16, _MN // n, n, fb, "sweep") for n in _FULL_NS]
    plan.append(("rms_norm", bf16, 2**20, 128, f_b, "sweep"))  # QK-norm
    plan += [("rms_norm", bf16, m, 4096, ("forward",), "decode") for m in (1, 32, 128)]
    plan += [("add_rms_norm", bf16, m, n, f_b, "sweep") for m, n in ((32768, 4096), (16384, 8192))]
    plan += [("layer_norm", bf16, _MN // n, n, f_b, "sweep") for n in (1024, 4096, 16384, 65536)]
    plan += [("rms_norm", fp32, _MN // n, n, f_b, "sweep") for n in (2048, 4096, 32768, 131072)]
    plan.append(("add_rms_norm", bf16, 2048, 65536, f_b, "sweep"))
    plan.append(("rms_norm", bf16, 128, 4096, ("backward",), "decode"))
    plan += _gated_plan()
    return [Item(*entry) for entry in plan]


def _gated_plan() -> list[tuple]:
    """The gated norms against the Hugging Face forwards and torch.compile of them: Qwen3-Next's
    per-head norm (N = 128, a row per head and token), rows of 4096 and of 8192 (Mamba2's
    d_inner, 8 groups), decoding steps."""
    f_b, bf16 = ("forward", "backward"), torch.bfloat16
    plan = [("gated_rms_norm", bf16, 2**20, 128, f_b, "sweep")]
    for op in ("gated_rms_norm", "gated_rms_norm_grouped"):
        plan += [(op, bf16, _MN // n, n, f_b, "sweep") for n in (4096, 8192)]
        plan += [(op, bf16, m, 4096, ("forward",), "decode") for m in (1, 128)]
    return plan


def setup(quick: bool = False, dry_run: bool = False, warm: tuple[int, int] | None = None) -> Setup:
    """The GPU run: ``do_bench`` medians, CUDA graphs at decoding sizes, Liger where importable and
    a 90 s (quick) or 270 s budget. ``dry_run``: the same plan and providers at tiny shapes on CPU
    tensors (no GPU needed). ``warm=(i, n)``: items i, i + n, ... once each, untimed, without a
    budget (:func:`_main`)."""
    plan = _plan(quick or dry_run)
    if dry_run:
        plan = [item.shrunk() for item in plan]
    if warm is not None:
        plan = plan[warm[0] :: warm[1]]
    if dry_run:
        timer: Timer = DryTimer()
    elif warm is not None:
        timer = _WarmTimer()
    else:
        timer = _DoBench(quick)
    liger, why = (None, "dry run") if dry_run else liger_functions()
    budget_s = 90.0 if quick else 270.0

    def variants(meta: dict, timer: Timer, start: float, budget_s: float, log) -> list:
        from .variants import run_variants

        extra = 60.0 if quick else 90.0  # past the main plan's budget
        return run_variants(meta, timer, start, budget_s + extra, log, shard=warm or (0, 1))

    return Setup(
        title="bench (cpu)" if dry_run else "bench (cuda)",
        meta=machine("cpu" if dry_run else "cuda"),
        timer=timer,
        plan=plan,
        budget_s=float("inf") if warm is not None else budget_s,
        copy_numel=2**12 if dry_run else _MN,
        graphs=True,
        liger=liger,
        compile=not dry_run,
        strict=dry_run,
        after_item=(lambda: None) if dry_run else torch.cuda.empty_cache,
        variants=None if dry_run else variants,
        notes=[] if liger else [f"liger: not available ({why}); its columns are left out"],
    )


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
    check_device("cuda")
    harness.run(setup(quick=a.quick, warm=(i, n)), a.variants, log=lambda s: None)
    print(f"warm shard {i}/{n}: {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    _main()
