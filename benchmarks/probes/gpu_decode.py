"""Per-call cost at decoding shapes (bf16, N = 4096, M = 1 … 128) on a CUDA device: wall time per
back-to-back eager call of this library's ops next to torch's (and the gated norm next to Hugging
Face's Qwen3-Next forward), and device time per call replayed in a CUDA graph. Prints a table and
writes it as JSON.

    PYTHONPATH=src python benchmarks/probes/gpu_decode.py [--out decode.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import rmsnorm
from rmsnorm._timing import cuda_graph_replay
from rmsnorm.bench.providers import hf_qwen3_next_gated

N = 4096
ROWS = (1, 8, 32, 128)


def _eager_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def _graph_us(fn, per_graph: int = 20, replays: int = 50) -> float:
    replay = cuda_graph_replay(fn, per_graph)
    replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * per_graph)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON file for the table")
    args = ap.parse_args()
    rows = []
    for m in ROWS:
        x = torch.randn(m, N, dtype=torch.bfloat16, device="cuda")
        res = torch.randn_like(x)
        z = torch.randn_like(x)
        w = torch.randn(N, dtype=torch.bfloat16, device="cuda")
        b = torch.randn_like(w)
        cases = {
            "rmsnorm.rms_norm": lambda: rmsnorm.rms_norm(x, N, w, 1e-6),  # noqa: B023
            "F.rms_norm": lambda: F.rms_norm(x, (N,), w, 1e-6),  # noqa: B023
            "rmsnorm.add_rms_norm": lambda: rmsnorm.add_rms_norm(x, res, N, w, 1e-6),  # noqa: B023
            "rmsnorm.layer_norm": lambda: rmsnorm.layer_norm(x, N, w, b),  # noqa: B023
            "F.layer_norm": lambda: F.layer_norm(x, (N,), w, b),  # noqa: B023
            "rmsnorm.gated_rms_norm": lambda x=x, z=z, w=w: rmsnorm.gated_rms_norm(
                x, z, N, w, 1e-6, casting_mode="llama"
            ),
            "HF Qwen3NextRMSNormGated": lambda x=x, z=z, w=w: hf_qwen3_next_gated(x, z, w),
        }
        for name, fn in cases.items():
            row = {"op": name, "M": m, "N": N, "eager_us": round(_eager_us(fn), 2)}
            if name.startswith(("rmsnorm.rms", "rmsnorm.gated", "HF")) or name == "F.rms_norm":
                row["cuda_graph_us"] = round(_graph_us(fn), 2)
            rows.append(row)
            print(
                f"{name:26} M={m:4d}  eager {row['eager_us']:7.2f} us/call"
                + (
                    f"  graph {row['cuda_graph_us']:6.2f} us/call" if "cuda_graph_us" in row else ""
                ),
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
