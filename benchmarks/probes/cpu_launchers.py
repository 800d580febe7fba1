"""Per-call cost of the CPU launchers against torch's own norms, in one process, interleaved.

    PYTHONPATH=src python benchmarks/probes/cpu_launchers.py [--quick] [--threads T]
        [--shapes 1x768,...] [--timer wall|cpu]

For each shape and dtype: the launcher alone (``rmsnorm.kernels.cpu.rms_norm_fwd`` / ``_bwd``,
``layer_norm_fwd`` / ``_bwd``) and ``F.layer_norm`` / ``F.rms_norm`` (forward under ``no_grad``;
backward = ``torch.autograd.grad`` of a retained graph). Providers take turns for several rounds and
the median of the per-round medians is printed, in µs per call. ``--peers`` adds to the forward
``x.clone()`` (the ceiling of an op that reads x and writes a fresh output of its size) and
``torch.compile`` of the spec's RMSNorm forward, and two columns: RMSNorm's and LayerNorm's speed
as a share of the clone's (clone's time ÷ theirs). ``--stores`` adds the launchers with ordinary
stores whatever the size (``ordinary rms`` / ``ordinary ln``: the host's rule for streaming the
outputs, ``runtime.stream_rule``, set aside for the call) and their time ÷ the launchers' as the
rule has them (above 1: the rule's choice is faster). ``--keep-freed-memory`` asks glibc
to keep freed memory (as ``rmsnorm bench`` does) so that large outputs are not faulted in on every
call; by default the allocator is left as a user's process has it. ``--timer cpu``
times the process's CPU time instead of the wall clock: on a machine shared with other work it is
the steadier measure of single-threaded calls (``--threads 1``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = ((1, 768), (1, 4096), (8, 128), (128, 768), (1024, 128), (2048, 768), (8192, 4096))


_clock = time.perf_counter


def _per_call(fn, budget: float) -> float:
    """Median µs per call of fn over a few blocks that together take about `budget` seconds."""
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, min(20000, int(budget / 5 / one)))
    times = []
    for _ in range(5):
        t0 = _clock()
        for _ in range(reps):
            fn()
        times.append((_clock() - t0) / reps)
    return statistics.median(times) * 1e6


def _ordinary(f):
    """f run with the CPU launchers' ordinary stores whatever the call's size."""
    from rmsnorm.kernels.cpu import launchers

    def run():
        saved, launchers._STREAM_AT = launchers._STREAM_AT, 1 << 62
        try:
            f()
        finally:
            launchers._STREAM_AT = saved

    return run


def _providers(m: int, n: int, dtype: torch.dtype, peers: bool = False, stores: bool = False):
    from rmsnorm.kernels import cpu
    from rmsnorm.reference import RMSOptions

    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, n, generator=g).to(dtype)
    dy = torch.randn(m, n, generator=g).to(dtype)
    w = torch.randn(n, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    eps = 1e-6
    opts = RMSOptions(eps, "mean_square", "gemma", 0.0, n)
    y, rstd = cpu.rms_norm_fwd(x, w, None, opts)
    yl, mean, rl = cpu.layer_norm_fwd(x, w, b, eps)

    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    bg = b.clone().requires_grad_()
    y_ln = F.layer_norm(xg, (n,), wg, bg, eps)
    y_rms = F.rms_norm(xg, (n,), wg, eps)

    def no_grad(f):
        def run():
            with torch.no_grad():
                f()

        return run

    fwd = {
        "ours rms": no_grad(lambda: cpu.rms_norm_fwd(x, w, None, opts)),
        "ours ln": no_grad(lambda: cpu.layer_norm_fwd(x, w, b, eps)),
        "F.layer_norm": no_grad(lambda: F.layer_norm(x, (n,), w, b, eps)),
        "F.rms_norm": no_grad(lambda: F.rms_norm(x, (n,), w, eps)),
    }
    if peers:
        from rmsnorm import reference

        compiled = torch.compile(lambda v: reference.rms_norm(v, w, eps), dynamic=False)
        fwd["x.clone()"] = no_grad(lambda: x.clone())
        fwd["torch.compile"] = no_grad(lambda: compiled(x))
    bwd = {
        "ours rms": lambda: cpu.rms_norm_bwd(dy, x, w, None, rstd, None, opts, dtype, True),
        "ours ln": lambda: cpu.layer_norm_bwd(dy, x, w, b, mean, rl, True),
        "F.layer_norm": lambda: torch.autograd.grad(y_ln, (xg, wg, bg), dy, retain_graph=True),
        "F.rms_norm": lambda: torch.autograd.grad(y_rms, (xg, wg), dy, retain_graph=True),
    }
    if stores:
        for provs in (fwd, bwd):
            provs["ordinary rms"] = _ordinary(provs["ours rms"])
            provs["ordinary ln"] = _ordinary(provs["ours ln"])
    return fwd, bwd


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter blocks")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads first")
    ap.add_argument("--shapes", default=None, help="MxN,MxN,... (default: the standard grid)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--timer", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--keep-freed-memory", action="store_true", help="glibc: never trim or mmap")
    ap.add_argument("--peers", action="store_true", help="forward: also clone and torch.compile")
    ap.add_argument("--stores", action="store_true", help="also the launchers' ordinary stores")
    args = ap.parse_args(argv)
    global _clock
    _clock = time.process_time if args.timer == "cpu" else time.perf_counter

    from rmsnorm.bench.cpu import keep_freed_memory

    if args.keep_freed_memory:
        keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    rounds, budget = (3, 0.05) if args.quick else (5, 0.15)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; µs per call "
        f"({args.timer} time), median"
    )
    # the providers' columns in their order, then the ratios
    names = ["ours rms", "ours ln", "F.layer_norm", "F.rms_norm"]
    names += ["x.clone()", "torch.compile"] * args.peers
    names += ["ordinary rms", "ordinary ln"] * args.stores
    extra = ["rms: clone ÷ it", "ln: clone ÷ it"] * args.peers
    extra += ["rms: ordinary ÷ rule", "ln: ordinary ÷ rule"] * args.stores
    print(f"| mode | dtype | M×N | {' | '.join(names + extra)} | rms ÷ best torch |")
    print("|---" * (len(names) + len(extra) + 4) + "|")
    for m, n in shapes:
        for dname in args.dtypes.split(","):
            dtype = getattr(torch, dname)
            fwd, bwd = _providers(m, n, dtype, args.peers, args.stores)
            for mode, provs in (("fwd", fwd), ("bwd", bwd)):
                if mode not in args.modes:
                    continue
                res: dict[str, list[float]] = {k: [] for k in provs}
                for _ in range(rounds):
                    for k, f in provs.items():
                        res[k].append(_per_call(f, budget))
                med = {k: statistics.median(v) for k, v in res.items()}
                best = min(med["F.layer_norm"], med["F.rms_norm"])
                # (the backward has no clone nor compile: their cells stay empty)
                cells = " | ".join(f"{med[k]:.1f}" if k in med else "" for k in names)
                if args.peers and mode == "fwd":
                    clone = med["x.clone()"]
                    cells += f" | {clone / med['ours rms']:.2f} | {clone / med['ours ln']:.2f}"
                elif args.peers:
                    cells += " | |"
                if args.stores:
                    cells += f" | {med['ordinary rms'] / med['ours rms']:.2f}"
                    cells += f" | {med['ordinary ln'] / med['ours ln']:.2f}"
                print(
                    f"| {mode} | {dname} | {m}×{n} | {cells} | {med['ours rms'] / best:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
