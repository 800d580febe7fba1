"""Compile the Triton kernels for a GPU architecture on a machine without one and report each
launch config's registers, spills and shared memory (from the cubin, via Triton's cuobjdump).

A developer tool for tuning the config table in ``src/rmsnorm/kernels/triton/_config.py`` without a
GPU: spills ("LOCAL" > 0) or a register count that caps occupancy show before any benchmark run.
It swaps in a stand-in driver, so it depends on Triton internals (checked with Triton 3.9).

    PYTHONPATH=src python benchmarks/probes/static_check.py [--arch 90] [--sms 132]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction


class _StandInDriver:
    """Enough of a driver for JITFunction.run(warmup=True): a target, a device and a stream."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda


_compiled: list = []


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _original_run(self, *args, grid=grid, warmup=True, **kwargs)
    _compiled.append((self.__name__, kernel))
    return kernel


_original_run = JITFunction.run


def _usage(kernel) -> dict:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", out))
    return {k: int(v) for k, v in fields.items()} | {"smem": kernel.metadata.shared}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability × 10 (90 = H100/H200)")
    ap.add_argument("--sms", type=int, default=132, help="SM count the configs are sized for")
    ap.add_argument("--kinds", default="plain,gated", help="plain, gated or both (comma-separated)")
    args = ap.parse_args()
    # (the kernels are decorated when rmsnorm's Triton package is imported, below: the interpreter
    # would make them Python functions, with nothing to compile)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("static_check compiles real GPU code: unset TRITON_INTERPRET")

    driver.set_active(_StandInDriver(args.arch))
    JITFunction.run = _compile_only

    import rmsnorm.kernels.triton as T
    from rmsnorm.kernels.triton import _config
    from rmsnorm.reference import RMSOptions

    ap_kinds = args.kinds.split(",")
    cases = []
    for dtype in (torch.bfloat16, torch.float32):
        for n in (128, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 262144):
            cases.append((dtype, n))
    print(f"sm_{args.arch}, {args.sms} SMs; REG per thread, LOCAL = spill bytes per thread")
    print(f"{'kernel':24} {'dtype':9} {'N':>7}  config -> REG LOCAL smem  (max CTAs/SM by regs)")
    if "gated" in ap_kinds:
        _gated(T, _config, args)
    if "plain" not in ap_kinds:
        return
    for dtype, n in cases:
        for kind in ("fwd", "bwd", "ln_fwd", "ln_bwd", "add_fwd", "add_bwd"):
            add = kind.startswith("add_")
            kind = kind.removeprefix("add_")
            cfg = _config.gpu_config(kind, n, dtype.itemsize, args.sms)
            m = 4
            x = torch.randn(m, n, dtype=dtype)
            w = torch.randn(n, dtype=dtype)
            opts = RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
            _compiled.clear()
            with _config.override(**{kind: cfg}):
                if kind == "fwd" and add:
                    T.add_rms_norm_fwd(x, x, w, None, opts)
                elif kind == "fwd":
                    T.rms_norm_fwd(x, w, None, opts)
                elif kind == "bwd":
                    r = torch.ones(m)
                    T.rms_norm_bwd(x, x, w, None, r, x if add else None, opts, dtype, True)
                elif kind == "ln_fwd":
                    T.layer_norm_fwd(x, w, w, 1e-5)
                else:
                    r = torch.ones(m)
                    T.layer_norm_bwd(x, x, w, w, r, r, True)
            name, kernel = _compiled[0]
            u = _usage(kernel)
            threads = cfg.num_warps * 32
            ctas = min(65536 // max(1, u["REG"] * threads), 2048 // threads)
            layout = "split" if cfg.split > 1 else "loop" if cfg.loop else "single"
            name = ("add:" if add else "") + name.removeprefix("_").removesuffix("_kernel")
            print(
                f"{name:24} {str(dtype)[6:]:9} {n:>7}  {layout}:{cfg.block_m}x{cfg.block_n} "
                f"w{cfg.num_warps} s{cfg.split} -> {u['REG']:3d} {u['LOCAL']:5d} {u['smem']:6d}"
                f"  ({ctas})"
            )


def _gated(T, _config, args) -> None:
    """The grouped / gated kernels at the shapes of the models that use them: Qwen3-Next's
    per-head norm (N = 128), Mamba2's n_groups (N = 8192 in 8 groups) and one group of a wide row
    (N = 32768, the looped layout), each order and both activations."""
    from rmsnorm.reference import GateOptions, RMSOptions

    shapes = ((128, None), (4096, None), (8192, 1024), (32768, None))
    gatings = (("last", "silu"), ("first", "silu"), ("last", "sigmoid"), ("none", "silu"))
    for dtype in (torch.bfloat16, torch.float32):
        for n, g in shapes:
            for gate, act in gatings:
                for kind in ("gated_fwd", "gated_bwd"):
                    cfg = _config.gated_gpu_config(kind, n, g or n, dtype.itemsize, args.sms)
                    m = 4
                    x = torch.randn(m, n, dtype=dtype)
                    z = None if gate == "none" else torch.randn(m, n, dtype=dtype)
                    w = torch.randn(n, dtype=dtype)
                    opts = RMSOptions(1e-6, "mean_square", "llama", 0.0, g or n)
                    gating = GateOptions(g, gate != "first", act)
                    _compiled.clear()
                    with _config.override(**{kind: cfg}):
                        if kind == "gated_fwd":
                            T.gated_rms_norm_fwd(x, z, w, None, opts, gating)
                        else:
                            r = torch.ones(m * n // (g or n))
                            args = (x, x, z, w, None, r, None, opts, gating, dtype, True)
                            T.gated_rms_norm_bwd(*args)
                    name, kernel = next(c for c in _compiled if c[0].startswith("gated"))
                    u = _usage(kernel)
                    threads = cfg.num_warps * 32
                    ctas = min(65536 // max(1, u["REG"] * threads), 2048 // threads)
                    layout = "loop" if cfg.loop else "single"
                    label = f"{kind}:{gate}/{act}"
                    print(
                        f"{label:24} {str(dtype)[6:]:9} {n:>7}  {layout}:{cfg.block_m}x"
                        f"{cfg.block_n} w{cfg.num_warps} g{g or n} -> {u['REG']:3d} "
                        f"{u['LOCAL']:5d} {u['smem']:6d}  ({ctas})"
                    )


if __name__ == "__main__":
    main()
