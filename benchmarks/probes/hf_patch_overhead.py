"""Per-call cost of a patched Hugging Face norm at a decoding shape (1 × 64): the class's own
forward, the patched module, a plain ``rmsnorm.rms_norm`` call (the floor), the same patched
forward bound per instance (the earlier way of patching) and, where the ``kernels`` package is
installed, the module kernelized with ``rmsnorm.integrations.kernels.kernel_mapping()``
(transformers' kernel route), timed in turns in one process.

    PYTHONPATH=src python benchmarks/probes/hf_patch_overhead.py [--rounds 15] [--number 2000]
"""

from __future__ import annotations

import argparse
import statistics
import timeit
import types

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import rmsnorm
from rmsnorm.integrations import hf


def measure(dtype: torch.dtype, rounds: int, number: int) -> None:
    x = torch.randn(1, 64, dtype=dtype)
    original = LlamaRMSNorm(64).to(dtype)
    patched = LlamaRMSNorm(64).to(dtype)
    hf.patch(patched)
    bound = LlamaRMSNorm(64).to(dtype)
    bound.forward = types.MethodType(type(patched).forward, bound)
    w, eps = patched.weight, patched.variance_epsilon
    kernelized = _kernelized(LlamaRMSNorm(64).to(dtype))
    calls = {
        "unpatched (LlamaRMSNorm.forward)": lambda: original(x),
        "patched (hf.patch)": lambda: patched(x),
        "patched forward bound per instance": lambda: bound(x),
        "rmsnorm.rms_norm (floor)": lambda: rmsnorm.rms_norm(
            x, (64,), w, eps, casting_mode="llama"
        ),
    }
    if kernelized is not None:
        calls["kernelized (kernels route)"] = lambda: kernelized(x)
    with torch.no_grad():
        for fn in calls.values():  # warm-up: kernel compilation, caches
            for _ in range(50):
                fn()
        times = {name: [] for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                times[name].append(timeit.timeit(fn, number=number) / number)
    base = statistics.median(times["unpatched (LlamaRMSNorm.forward)"])
    print(f"{dtype}, x (1, 64), median of {rounds} rounds of {number} calls:")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:38s} {med * 1e6:7.2f} µs   {med / base:5.2f}x unpatched")


def _kernelized(module: torch.nn.Module) -> torch.nn.Module | None:
    try:
        from kernels import Mode, kernelize, use_kernel_mapping
    except ImportError:
        return None
    from rmsnorm.integrations.kernels import kernel_mapping

    with use_kernel_mapping(kernel_mapping(), inherit_mapping=False):
        return kernelize(module, mode=Mode.INFERENCE, device="cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.bfloat16):
        measure(dtype, args.rounds, args.number)


if __name__ == "__main__":
    main()
