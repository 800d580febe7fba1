"""What fresh output pages cost on CPU: forward GB/s of this library's RMSNorm / LayerNorm,
F.layer_norm, torch.compile(reference), ``x.clone()`` and ``y.copy_(x)`` at (8192, 4096), with
glibc's default allocator (a 128 MiB output is a new mmap, faulted in on every call) and with
freed memory kept
(``rmsnorm.bench.cpu.keep_freed_memory``, what ``rmsnorm bench --device cpu`` uses).

    PYTHONPATH=src python benchmarks/probes/cpu_allocator.py
"""

from __future__ import annotations

import argparse
import subprocess
import sys

_CHILD = r"""
import sys, torch, torch.nn.functional as F
from torch.utils.benchmark import Timer
from rmsnorm import reference as R
from rmsnorm.bench.cpu import keep_freed_memory
from rmsnorm.kernels.cpu import launchers as L
kept = keep_freed_memory() if sys.argv[1] == "kept" else False
M, N = 8192, 4096
for dt in (torch.float32, torch.bfloat16):
    x = torch.randn(M, N, dtype=dt); w = torch.randn(N, dtype=dt) * 0.1 + 1; y = torch.empty_like(x)
    comp = torch.compile(lambda x, w: R.rms_norm(x, w, 1e-6), dynamic=False)
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, N)
    fns = {
        "copy_": lambda: y.copy_(x), "clone": lambda: x.clone(),
        "rmsnorm rms_norm": lambda: L.rms_norm_fwd(x, w, None, opts),
        "rmsnorm layer_norm": lambda: L.layer_norm_fwd(x, w, None, 1e-5),
        "F.layer_norm": lambda: F.layer_norm(x, (N,), w, None),
        "torch.compile(reference)": lambda: comp(x, w),
    }
    times = {k: [] for k in fns}
    for _ in range(3):  # providers take turns: load changes hit all alike
        for k, f in fns.items():
            f()
            t = Timer("f()", globals={"f": f}).blocked_autorange(min_run_time=0.5)
            times[k].append(t.median)
    gb = 2 * M * N * dt.itemsize / 1e9
    print(f"{sys.argv[1]:8} {str(dt)[6:]:9} " + "  ".join(
        f"{k} {gb / sorted(v)[1]:.1f}" for k, v in times.items()), flush=True)
"""


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # --help, no options
    print("GB/s (2·M·N·elem / median time), (8192, 4096), forward")
    for mode in ("default", "kept"):
        subprocess.run([sys.executable, "-c", _CHILD, mode], check=True)


if __name__ == "__main__":
    main()
