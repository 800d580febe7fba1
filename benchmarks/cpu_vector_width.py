"""What asking LLVM for 512-bit vectors changes in the CPU kernels: this tree against another.

    git worktree add /tmp/before <commit without the change>
    PYTHONPATH=/tmp/before/src python -m rmsnorm warmup     # compile that tree's kernels once
    PYTHONPATH=src python benchmarks/cpu_vector_width.py --before /tmp/before/src [--out FILE]

The vector width is decided when the kernels are compiled, not per call, so one process cannot
time both: the two trees run in alternating child processes (``--rounds`` of each), and each child
reports every kernel's time divided by a reference timed in the same process (``torch.add(x, 1)``
for the launchers, a copy-like op of the same bytes read; ``F.rms_norm`` for the functions), which
cancels most of the machine's drift between processes. Printed (and written to ``--out`` as
markdown): the median ratio per tree and their quotient (this tree ÷ the other; below 1: faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = "bfloat16:2048x4096,bfloat16:128x4096,float32:2048x4096"


def _time(fn, reps: int = 25) -> float:
    """Median seconds per call over ``reps`` batches of ≥ 20 ms."""
    fn()
    start = time.perf_counter()
    fn()
    inner = max(1, int(0.02 / max(time.perf_counter() - start, 1e-7)))
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def _case(m: int, n: int, name: str) -> dict[str, float]:
    """One shape's ratios (see the module's docstring)."""
    import torch
    import torch.nn.functional as F

    import rmsnorm
    from rmsnorm import reference as ref
    from rmsnorm.kernels.cpu import launchers as L

    torch.manual_seed(0)
    dtype = getattr(torch, name)
    g = n // 2 if n % 2 == 0 else n
    x, z = torch.randn(m, n, dtype=dtype), torch.randn(m, n, dtype=dtype)
    w, dy = torch.rand(n, dtype=dtype) + 0.5, torch.randn(m, n, dtype=dtype)
    opts = ref.RMSOptions(1e-6, "mean_square", "gemma", 0.0, n)
    _, rstd = L.rms_norm_fwd(x, w, None, opts)
    _, mean, rstd2 = L.layer_norm_fwd(x, w, None, 1e-5)
    copy = _time(lambda: torch.add(x, 1.0))
    case = f"{name} {m} × {n}"
    out = {
        f"RMSNorm forward | {case}": _time(lambda: L.rms_norm_fwd(x, w, None, opts)),
        f"RMSNorm backward | {case}": _time(
            lambda: L.rms_norm_bwd(dy, x, w, None, rstd, None, opts, dtype)
        ),
        f"LayerNorm forward | {case}": _time(lambda: L.layer_norm_fwd(x, w, None, 1e-5)),
        f"LayerNorm backward | {case}": _time(
            lambda: L.layer_norm_bwd(dy, x, w, None, mean, rstd2)
        ),
    }
    out = {k: v / copy for k, v in out.items()}
    with torch.no_grad():
        base = _time(lambda: F.rms_norm(x, (n,), w, 1e-6))
        qwen = _time(lambda: rmsnorm.gated_rms_norm(x, z, (n,), w, 1e-6, casting_mode="llama"))
        mamba = _time(
            lambda: rmsnorm.gated_rms_norm(
                x, z, (n,), w, 1e-6, norm_before_gate=False, group_size=g
            )
        )
    out[f"gated forward, Qwen3-Next's order (÷ F.rms_norm) | {case}"] = qwen / base
    out[f"gated forward, Mamba2's order (÷ F.rms_norm) | {case}"] = mamba / base
    return out


def _parse_cases(text: str) -> list[tuple[int, int, str]]:
    """``"bfloat16:2048x4096,float32:128x768"`` → [(2048, 4096, "bfloat16"), (128, 768, ...)]."""
    cases = []
    for item in text.split(","):
        try:
            name, shape = item.strip().split(":")
            m, n = (int(v) for v in shape.split("x"))
        except ValueError:
            raise SystemExit(
                f"--cases: {item!r} is not dtype:MxN (e.g. bfloat16:2048x4096)"
            ) from None
        if name not in ("float32", "bfloat16", "float16") or m < 1 or n < 2:
            raise SystemExit(
                f"--cases: {item!r} needs a float32, bfloat16 or float16 dtype, M ≥ 1 and N ≥ 2"
            )
        cases.append((m, n, name))
    return cases


def child(cases: str) -> dict[str, float]:
    out = {}
    for m, n, name in _parse_cases(cases):
        out.update(_case(m, n, name))
    return out


def _run(src: str, cases: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--cases", cases],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _commit(src: str) -> str:
    done = subprocess.run(
        ["git", "-C", src, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", src, "status", "--porcelain", "--", "."], capture_output=True, text=True
    )
    return (done.stdout.strip() or src) + (" (with changes)" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="the other tree's src directory (kernels compiled)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cases", default=CASES, help="dtype:MxN,... (default: %(default)s)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.cases)))
        return
    _parse_cases(args.cases)
    if not args.before or not Path(args.before, "rmsnorm").is_dir():
        parser.error("--before must be the src directory of another checkout of rmsnorm")
    if args.out and args.out.exists() and not args.overwrite:
        parser.error(f"--out {args.out} exists; pass --overwrite to replace it")
    here = str(Path(__file__).resolve().parents[1] / "src")
    runs: dict[str, list[dict[str, float]]] = {"before": [], "this": []}
    for r in range(args.rounds):
        for label, src in (("before", args.before), ("this", here)):
            print(f"round {r + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
            runs[label].append(_run(src, args.cases))
    from rmsnorm.kernels.cpu import runtime as rt

    lines = [
        f"# 512-bit vectors: commit {_commit(here)} against {_commit(args.before)}",
        "",
        f"{args.rounds} alternating processes of each; every time ÷ a same-process reference "
        "(launchers: `torch.add(x, 1)`; functions: `F.rms_norm`), median over the processes; "
        f"2 torch threads; this host asks for 512-bit vectors: {rt.WIDE_VECTORS}.",
        "",
        "| kernel | shape | before | this tree | this ÷ before |",
        "|---|---|---|---|---|",
    ]
    for key in runs["this"][0]:
        before = statistics.median(r[key] for r in runs["before"])
        this = statistics.median(r[key] for r in runs["this"])
        kernel, shape = key.split(" | ")
        lines.append(f"| {kernel} | {shape} | {before:.3f} | {this:.3f} | {this / before:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
