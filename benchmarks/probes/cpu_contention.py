"""The CPU path against torch's own ops while other work shares the machine, with that work made
here, on purpose, so that a run can be repeated.

    PYTHONPATH=src python benchmarks/probes/cpu_contention.py --out benchmarks/results/<host>
        [--quick] [--threads 1,2] [--conditions quiet,busy,bandwidth]
        [--shapes 8192x4096,1024x4096,1x768] [--dtypes float32,bfloat16] [--rounds 9]
        [--variants] [--overwrite]

Conditions (each started before its cells and stopped after them by this script):

- ``quiet``: nothing started (other processes of the machine still run: the load average before
  and after each condition is recorded and printed with the results).
- ``busy``: one process spinning in a Python loop, pinned to the last core of this process's
  affinity with ``os.sched_setaffinity``.
- ``bandwidth``: one process pinned the same way, copying one 256 MiB array into another without
  end (numpy ``copyto``: a read and a write stream), so that it takes memory bandwidth as well as
  a core.

Each torch thread count runs in a fresh interpreter (``torch.set_num_threads`` before anything
else; torch.compile's C++ kernels are specialised on the thread count). In each cell (condition,
dtype, shape, forward or forward + backward) the providers take turns, one sample each per round,
in an order rotated every round: ``x.clone()`` (forward only: the ceiling of an op that reads x
and writes a fresh output of its size), ``F.layer_norm``, ``torch.compile`` of the spec's RMSNorm
(``rmsnorm.reference.rms_norm``), ``F.rms_norm``, and ``rmsnorm.rms_norm`` / ``rmsnorm.layer_norm``
on the CPU backend. A sample is one call at large shapes and a loop of calls lasting ≥ 2 ms at
small ones (the median of its calls, each timed). The forward runs under ``no_grad``; forward +
backward is one forward with gradients and ``torch.autograd.grad`` of x and the parameters. The
allocator is left as a user's process has it (every large output is a fresh mapping, faulted in),
unless ``--keep-freed-memory``.

``--variants`` adds rmsnorm's forward with its threading or stores changed for the call (to find
where time goes under load): ``one thread`` (the kernel on the calling thread alone), ``OpenMP
team`` (every shared call on torch's OpenMP team, whatever its size), ``pool`` (every shared call
on the helper pool), ``ordinary stores`` (no streaming stores).

Writes ``cpu_contention.csv`` (one row per provider and cell: median, quartiles, ratios) and
``cpu_contention.md`` (per cell: milliseconds per call and rmsnorm's speed as a share of each
peer's, peer time ÷ rmsnorm's time, so above 1 is faster) into ``--out``, atomically; an existing
pair is kept unless ``--overwrite``. The markdown starts with the targets met and missed per
thread count and condition. ``--from-csv FILE`` writes the markdown of an earlier run's csv again
(timing nothing).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = ((8192, 4096), (1024, 4096), (1, 768))
CONDITIONS = ("quiet", "busy", "bandwidth")
EPS = 1e-6
# rmsnorm's own columns, and the peers each is compared with (peer time ÷ rmsnorm's time)
OURS = ("rmsnorm.rms_norm", "rmsnorm.layer_norm")
PEERS = ("x.clone()", "F.layer_norm", "torch.compile(spec)", "F.rms_norm")

# The competitor stops by itself when the benchmark that started it is gone (a killed run leaves
# no spinning process behind).
_COMPETITOR = r"""
import os, sys
kind, core, parent = sys.argv[1], int(sys.argv[2]), os.getppid()
os.sched_setaffinity(0, {core})
if kind == "bandwidth":
    import numpy as np
    a = np.ones(64 << 20, np.float32)  # 256 MiB, read
    b = np.zeros_like(a)               # 256 MiB, written
    print("ready", flush=True)
    while os.getppid() == parent:
        np.copyto(b, a)
else:
    print("ready", flush=True)
    while os.getppid() == parent:
        for _ in range(100000):
            pass
"""


class Competitor:
    """A process started for one condition (None for ``quiet``) and stopped on leaving."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Competitor:
        if self.kind == "quiet":
            return self
        core = sorted(os.sched_getaffinity(0))[-1]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _COMPETITOR, self.kind, str(core)],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.__exit__()
            raise RuntimeError(f"the {self.kind} competitor did not start (said {line!r})")
        time.sleep(1.0)  # let it reach its steady state (the hog's arrays are faulted in by now)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _sample(fn, loops: int) -> float:
    """Seconds per call: one call's, or the median of a loop's calls each timed. (Another
    process's time slice, ~20 ms on this project's machines, in a loop of 0.1 ms calls would
    otherwise be most of that sample's mean.)"""
    if loops == 1:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    times = []
    for _ in range(loops):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_cell(providers: dict, rounds: int) -> dict:
    """{name: [seconds per call, one per round]}: one sample of each provider per round, the
    order rotated every round (so that none always follows the same one)."""
    names = list(providers)
    loops = {}
    for name in names:  # a warm-up call each, and the loop length of a sample (≥ 2 ms)
        one = max(_sample(providers[name], 1), 1e-7)
        loops[name] = max(1, min(5000, int(2e-3 / one)))
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(_sample(providers[name], loops[name]))
    return times


def _providers(m: int, n: int, dtype, backward: bool, variants: bool) -> dict:
    import torch
    import torch.nn.functional as F

    import rmsnorm
    from rmsnorm import reference

    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, n, generator=g).to(dtype)
    w = torch.randn(n, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    dy = torch.randn(m, n, generator=g).to(dtype)
    spec = torch.compile(lambda v, s: reference.rms_norm(v, s, EPS), dynamic=False)

    fns = {
        "x.clone()": lambda v, s, c: v.clone(),
        "F.layer_norm": lambda v, s, c: F.layer_norm(v, (n,), s, c, EPS),
        "torch.compile(spec)": lambda v, s, c: spec(v, s),
        "F.rms_norm": lambda v, s, c: F.rms_norm(v, (n,), s, EPS),
    }

    def rms(v, s, c):
        with rmsnorm.use_backend("cpu"):
            return rmsnorm.rms_norm(v, (n,), s, EPS)

    def ln(v, s, c):
        with rmsnorm.use_backend("cpu"):
            return rmsnorm.layer_norm(v, (n,), s, c, EPS)

    fns["rmsnorm.rms_norm"], fns["rmsnorm.layer_norm"] = rms, ln
    if variants:
        from rmsnorm.kernels.cpu import launchers, pool

        def changed(module, name, value):
            def run(v, s, c):
                saved = getattr(module, name)
                setattr(module, name, value)
                try:
                    return rms(v, s, c)
                finally:
                    setattr(module, name, saved)

            return run

        def one_thread(v, s, c):
            saved = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return rms(v, s, c)
            finally:
                torch.set_num_threads(saved)

        if torch.get_num_threads() > 1:
            fns["rms: one thread"] = one_thread
            fns["rms: OpenMP team"] = changed(pool, "POOL_FROM", 1 << 62)
            fns["rms: pool"] = changed(pool, "USE_OPENMP", False)
        fns["rms: ordinary stores"] = changed(launchers, "_STREAM_AT", 1 << 62)
    if not backward:

        def forward(f):
            def run():
                with torch.no_grad():
                    f(x, w, b)

            return run

        return {name: forward(f) for name, f in fns.items()}
    del fns["x.clone()"]
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))

    def fwd_bwd(f, with_bias):
        params = (xg, wg, bg) if with_bias else (xg, wg)

        def run():
            torch.autograd.grad(f(xg, wg, bg), params, dy)

        return run

    return {name: fwd_bwd(f, "layer_norm" in name) for name, f in fns.items()}


def child(args) -> list[dict]:
    """One thread count's grid, run in this interpreter; rows as in the CSV."""
    import torch

    torch.set_num_threads(args.threads)
    from rmsnorm.bench.cpu import keep_freed_memory

    if args.keep_freed_memory:
        keep_freed_memory()
    from rmsnorm.kernels import cpu

    cpu.warmup()
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    cells = [
        (dt, m, n, bwd)
        for dt in dtypes
        for m, n in args.shape_list
        for bwd in ([False, True] if args.directions == "both" else [args.directions == "bwd"])
    ]
    providers = {}
    t0 = time.perf_counter()
    for i, (dt, m, n, bwd) in enumerate(cells):  # built and compiled once, before any condition
        providers[dt, m, n, bwd] = p = _providers(m, n, dt, bwd, args.variants)
        for fn in p.values():
            fn()
        print(
            f"  [{args.threads} thr] prepared {i + 1}/{len(cells)} cells "
            f"({time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    rows = []
    for cond in args.conditions.split(","):
        with Competitor(cond):
            load0 = os.getloadavg()
            for i, (dt, m, n, bwd) in enumerate(cells):
                times = time_cell(providers[dt, m, n, bwd], args.rounds)
                for name, ts in times.items():
                    q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
                    rows.append({
                        "threads": args.threads, "condition": cond,
                        "dtype": str(dt).removeprefix("torch."), "shape": f"{m}x{n}",
                        "direction": "fwd+bwd" if bwd else "fwd", "provider": name,
                        "median_ms": statistics.median(ts) * 1e3, "q1_ms": q[0] * 1e3,
                        "q3_ms": q[2] * 1e3, "rounds": len(ts),
                    })  # fmt: skip
                print(
                    f"  [{args.threads} thr, {cond}] {i + 1}/{len(cells)} cells",
                    file=sys.stderr,
                    flush=True,
                )
            load1 = os.getloadavg()
        for row in rows:
            if row["condition"] == cond and row["threads"] == args.threads:
                row["load_before"], row["load_after"] = round(load0[0], 2), round(load1[0], 2)
    return rows


def _ratios(rows: list[dict]) -> None:
    """Each rmsnorm row gets ``vs <peer>``: the peer's median ÷ its own (above 1: faster)."""
    by_cell: dict = {}
    for row in rows:
        key = (row["threads"], row["condition"], row["dtype"], row["shape"], row["direction"])
        by_cell.setdefault(key, {})[row["provider"]] = row
    for cell in by_cell.values():
        for name, row in cell.items():
            if name in PEERS:
                continue
            for peer in PEERS:
                if peer in cell:
                    row[f"vs {peer}"] = round(cell[peer]["median_ms"] / row["median_ms"], 3)


def _machine() -> str:
    import torch

    from rmsnorm.info import cpu_model

    return (
        f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores, {platform.machine()}, "
        f"torch {torch.__version__}"
    )


LARGE = 1 << 25  # "large rows" (8192 x 4096): from here the clone and F.layer_norm targets apply


def summary(rows: list[dict]) -> str:
    """The targets per cell of rmsnorm.rms_norm and rmsnorm.layer_norm: at large shapes (≥ 2^25
    elements) forward ≥ 0.9 of the clone's speed, and never slower than F.layer_norm (forward and
    forward + backward); at every shape never slower than F.rms_norm. Misses are listed."""
    out = io.StringIO()
    p = out.write
    p("## Against the targets\n\n")
    p("Large rows (≥ 2^25 elements: 8192 × 4096): forward ≥ 0.9 of `x.clone()`'s speed and ")
    p("≥ 1.0 of ")
    p("`F.layer_norm`'s (forward + backward: ≥ 1.0 of `F.layer_norm`'s); every shape: ≥ 1.0 of ")
    p("`F.rms_norm`'s. rmsnorm's own two functions, every cell.\n\n")
    p("| threads | condition | checks | met | missed |\n|---|---|---|---|---|\n")
    groups: dict = {}
    for r in rows:
        if r["provider"] in OURS:
            groups.setdefault((r["threads"], r["condition"]), []).append(r)
    for (threads, cond), sub in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        checks, missed = 0, []
        for r in sub:
            m, n = (int(v) for v in r["shape"].split("x"))
            wanted = [("F.rms_norm", 1.0)]
            if m * n >= LARGE:
                wanted.append(("F.layer_norm", 1.0))
                if r["direction"] == "fwd":
                    wanted.append(("x.clone()", 0.9))
            for peer, floor in wanted:
                got = r.get(f"vs {peer}")
                if got is None or got == "":
                    continue
                checks += 1
                if float(got) < floor:
                    short = r["provider"].removeprefix("rmsnorm.")
                    missed.append(
                        f"{short} {r['dtype']} {r['shape']} {r['direction']} vs {peer} "
                        f"{float(got):.2f}"
                    )
        p(f"| {threads} | {cond} | {checks} | {checks - len(missed)} | ")
        p("; ".join(missed) + " |\n")
    p("\n")
    return out.getvalue()


def write_markdown(rows: list[dict], args, machine: str, started: str) -> str:
    out = io.StringIO()
    p = out.write
    p("# The CPU path under contention (`benchmarks/probes/cpu_contention.py`)\n\n")
    p(f"Machine: {machine}. Started {started}; {rows[0]['rounds']} rounds per cell, ")
    p("providers taking turns. Times are medians in ms per call with the lower and upper ")
    p("quartile; the ratio ")
    p("columns are the peer's median ÷ rmsnorm's (above 1: rmsnorm faster). Load: the 1-minute ")
    p("load average when the condition started → when it ended (this process's threads and the ")
    p("competitor included).\n\n")
    p(summary(rows))
    keys = sorted(
        {(r["threads"], r["condition"]) for r in rows},
        key=lambda k: (k[0], CONDITIONS.index(k[1]) if k[1] in CONDITIONS else 9),
    )
    for threads, cond in keys:
        sub = [r for r in rows if r["threads"] == threads and r["condition"] == cond]
        load = f"{sub[0].get('load_before', '?')} → {sub[0].get('load_after', '?')}"
        p(f"## {threads} torch thread{'s' * (threads > 1)}, {cond} (load {load})\n\n")
        p("| dtype | shape | dir | provider | ms (q1–q3) | vs clone | vs F.layer_norm | ")
        p("vs compile | vs F.rms_norm |\n|---|---|---|---|---|---|---|---|---|\n")
        for r in sub:
            ratio = [f"{r[f'vs {peer}']:.2f}" if f"vs {peer}" in r else "" for peer in PEERS]
            spread = f"{r['median_ms']:.3g} ({r['q1_ms']:.3g}–{r['q3_ms']:.3g})"
            p(f"| {r['dtype']} | {r['shape']} | {r['direction']} | {r['provider']} | {spread} | ")
            p(" | ".join(ratio) + " |\n")
        p("\n")
    return out.getvalue()


def _write_atomic(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    with os.fdopen(fd, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for cpu_contention.{csv,md}")
    ap.add_argument("--name", default="cpu_contention", help="the output files' stem")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing csv/md pair")
    ap.add_argument("--threads", default="1,2", help="torch thread counts, e.g. 1,2")
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--directions", choices=("fwd", "bwd", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="5 rounds")
    ap.add_argument("--variants", action="store_true", help="also rmsnorm's forward variants")
    ap.add_argument("--keep-freed-memory", action="store_true", help="glibc: never trim or mmap")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--started", default=None, help="with --from-csv: when that run started")
    ap.add_argument(
        "--from-csv", default=None, help="write the markdown of an earlier run's csv, time nothing"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds = 5
    if args.rounds < 2:
        ap.error(f"--rounds must be at least 2, got {args.rounds}")
    for cond in args.conditions.split(","):
        if cond not in CONDITIONS:
            ap.error(f"--conditions takes names from {','.join(CONDITIONS)}, got {cond!r}")
    try:
        args.shape_list = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        assert all(len(s) == 2 and min(s) > 0 for s in args.shape_list)
    except (ValueError, AssertionError):
        ap.error(f"--shapes must be MxN,MxN,... with positive M, N; got {args.shapes!r}")
    if args.child:
        args.threads = int(args.threads)
        json.dump(child(args), sys.stdout)
        return
    try:
        thread_counts = [int(t) for t in args.threads.split(",")]
        assert min(thread_counts) >= 1
    except (ValueError, AssertionError):
        ap.error(f"--threads must be positive integers separated by commas, got {args.threads!r}")
    paths = []
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        paths = [os.path.join(args.out, f"{args.name}.{ext}") for ext in ("csv", "md")]
        if not args.overwrite and any(os.path.exists(p) for p in paths):
            ap.error(f"{paths[0]} or {paths[1]} exists; pass --overwrite to replace them")
    if args.from_csv:
        with open(args.from_csv, newline="") as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            r["threads"] = int(r["threads"])
            for k in ("median_ms", "q1_ms", "q3_ms"):
                r[k] = float(r[k])
            for k in [k for k in r if k.startswith("vs ")]:
                if r[k] == "":
                    del r[k]
                else:
                    r[k] = float(r[k])
        md = write_markdown(rows, args, rows[0]["machine"], args.started or "?")
        if paths:
            _write_atomic(paths[1], md)
        print(md)
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    for t in thread_counts:
        cmd = [sys.executable, os.path.abspath(__file__), *passthrough, "--child"]
        cmd += ["--threads", str(t)]
        print(f"torch threads {t}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        rows += json.loads(done.stdout)
    _ratios(rows)
    machine = _machine()
    for row in rows:
        row["machine"] = machine
    md = write_markdown(rows, args, machine, started)
    print(md)
    if paths:
        fields = list(dict.fromkeys(k for row in rows for k in row))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        _write_atomic(paths[0], buf.getvalue())
        _write_atomic(paths[1], md)
        print(f"wrote {paths[0]} and {paths[1]}", file=sys.stderr)


if __name__ == "__main__":
    main()
