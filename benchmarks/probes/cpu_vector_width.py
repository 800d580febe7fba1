"""What the vector width changes in the CPU kernels: this tree against another, or this tree's
kernels compiled for two widths.

    git worktree add /tmp/before <commit without the change>
    PYTHONPATH=/tmp/before/src python -m rmsnorm warmup     # compile that tree's kernels once
    PYTHONPATH=src python benchmarks/probes/cpu_vector_width.py --before /tmp/before/src \
        [--out FILE]
    PYTHONPATH=src python benchmarks/probes/cpu_vector_width.py --widths 512,256 [--out FILE]

With ``--widths A,B`` (AVX-512 hosts) the children set ``RMSNORM_CPU_VECTOR_BITS`` to A, then B,
each width with its own numba cache under ``--cache-dir`` (the first child of each compiles its
kernels, 1-2 min): "before" is A, "this" is B.

The vector width is decided when the kernels are compiled, not per call, so one process cannot
time both: the two kinds run in alternating child processes (``--rounds`` of each), and each child
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
import tempfile
import time
from pathlib import Path

VECTOR_BITS_ENV = "RMSNORM_CPU_VECTOR_BITS"  # (runtime.VECTOR_BITS_ENV: not imported here, so
# that the parent process never loads numba)

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
    b = torch.randn(n, dtype=dtype)
    copy = _time(lambda: torch.add(x, 1.0))
    case = f"{name} {m} × {n}"
    out = {
        f"F.layer_norm forward (same in both) | {case}": _time(
            lambda: F.layer_norm(x, (n,), w, b, 1e-5)
        ),
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


def child(cases: str, threads: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    out = {}
    for m, n, name in _parse_cases(cases):
        out.update(_case(m, n, name))
    return out


def _run(src: str, cases: str, threads: int, env_extra: dict[str, str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src, **env_extra}
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--cases", cases, "--threads", str(threads)],
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
    parser.add_argument("--widths", help="A,B: this tree at A bits against B bits (256, 512)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "rmsnorm-vector-width",
        help="with --widths: one numba cache per width under it (default: %(default)s)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each child")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cases", default=CASES, help="dtype:MxN,... (default: %(default)s)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads < 1:
        parser.error(f"--threads must be a positive integer, got {args.threads}")
    if args.child:
        print(json.dumps(child(args.cases, args.threads)))
        return
    _parse_cases(args.cases)
    here = str(Path(__file__).resolve().parents[2] / "src")
    if args.widths is not None:
        widths = args.widths.split(",")
        if len(widths) != 2 or not all(w in ("256", "512") for w in widths):
            parser.error(f"--widths must be two of 256 and 512, e.g. 512,256; got {args.widths!r}")
        kinds = [
            (w, here, {VECTOR_BITS_ENV: w, "NUMBA_CACHE_DIR": str(args.cache_dir / w)})
            for w in widths
        ]
        title = f"# {widths[1]}-bit against {widths[0]}-bit vectors: commit {_commit(here)}"
    elif not args.before or not Path(args.before, "rmsnorm").is_dir():
        parser.error("--before must be the src directory of another checkout of rmsnorm")
    else:
        kinds = [("before", args.before, {}), ("this", here, {})]
        title = f"# Vector width: commit {_commit(here)} against {_commit(args.before)}"
    if args.out and args.out.exists() and not args.overwrite:
        parser.error(f"--out {args.out} exists; pass --overwrite to replace it")
    from rmsnorm import info

    load_before = info.load_average()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "this": []}
    for r in range(args.rounds):
        for label, (name, src, env) in zip(("before", "this"), kinds, strict=True):
            print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            runs[label].append(_run(src, args.cases, args.threads, env))
    from rmsnorm.kernels.cpu import runtime as rt

    lines = [
        title,
        "",
        f"{args.rounds} alternating processes of each; every time ÷ a same-process reference "
        "(launchers: `torch.add(x, 1)`; functions: `F.rms_norm`), median over the processes; "
        f"{args.threads} torch thread{'s' * (args.threads > 1)}; {info.cpu_model()} "
        f"(the rule's choice: {rt.VECTOR_BITS or 'none'}, {rt.VECTOR_WHY}); load average "
        f"(1, 5, 15 min) {load_before} at the start, {info.load_average()} at the end.",
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
