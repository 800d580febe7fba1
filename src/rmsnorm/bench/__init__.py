"""The benchmark harness shared by the GPU and CPU modes: the bytes model, one long-form row per
measurement, machine metadata, and the CSV / markdown / plot writers.

A mode (``gpu.py``, ``cpu.py``; ``latency.py`` for time per call) times providers and returns
:class:`Row` objects built by :func:`make_row`; :func:`run` writes them under ``out`` as
``<device>_bench.csv``, ``.md`` and ``.png`` (``<device>_latency.*`` for the latency mode). Every
number is effective GB/s from :func:`bytes_moved` and a percentage of the copy bandwidth measured in
the same process over the same number of elements.
"""

from __future__ import annotations

import csv
import datetime
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from .. import _validate, info

__all__ = [
    "COLUMNS",
    "OPS",
    "MODES",
    "VARIANTS",
    "Row",
    "bytes_moved",
    "machine",
    "make_row",
    "write_csv",
    "read_csv",
    "write_markdown",
    "write_plot",
    "summary",
    "run",
    "DEVICES",
    "check_device",
    "resolve_device",
]

# "generate": greedy generate() of a whole model per token (latency mode; no bytes model)
OPS = (
    "rms_norm", "add_rms_norm", "layer_norm", "gated_rms_norm", "gated_rms_norm_grouped", "copy",
    "generate",
)  # fmt: skip
# forward_backward_leaf: forward + backward into the leaves' .grad (latency mode)
MODES = ("forward", "backward", "forward_backward", "forward_backward_leaf")
VARIANTS = ("eager", "cuda_graph")

# Minimal traffic in units of M·N elements (docs/performance.md). Weights and per-row statistics are
# negligible at benchmark sizes and not counted.
_UNITS = {
    # read x + write y
    ("rms_norm", "forward"): 2,
    ("layer_norm", "forward"): 2,
    # read x, dy + write dx
    ("rms_norm", "backward"): 3,
    ("layer_norm", "backward"): 3,
    # read x, residual + write y, h
    ("add_rms_norm", "forward"): 4,
    # read h, dy, dh + write dx (d residual aliases d input)
    ("add_rms_norm", "backward"): 4,
    # gated (norm then gate, Qwen3-Next; gate then norm in groups, Mamba2): read x, z + write y
    ("gated_rms_norm", "forward"): 3,
    ("gated_rms_norm_grouped", "forward"): 3,
    # read x, z, dy + write dx, dz
    ("gated_rms_norm", "backward"): 5,
    ("gated_rms_norm_grouped", "backward"): 5,
    # read + write
    ("copy", "forward"): 2,
}


def bytes_moved(op: str, mode: str, m: int, n: int, elem: int) -> int:
    """Bytes an ideal kernel moves for (op, mode) on an (m, n) problem of `elem`-byte elements;
    forward_backward (and forward_backward_leaf) is the sum of the two."""
    if mode in ("forward_backward", "forward_backward_leaf"):
        return bytes_moved(op, "forward", m, n, elem) + bytes_moved(op, "backward", m, n, elem)
    try:
        return _UNITS[(op, mode)] * m * n * elem
    except KeyError:
        raise ValueError(f"no bytes model for op {op!r} in mode {mode!r}") from None


@dataclass
class Row:
    """One measurement: the long-form CSV schema shared by every mode (column order = fields)."""

    device: str  # "cuda" or "cpu"
    device_name: str
    torch: str
    triton: str
    commit: str
    timestamp: str
    op: str  # one of OPS
    mode: str  # one of MODES
    provider: str  # rmsnorm, torch, torch_compile_reference, hf_llama_eager, liger, torch_add, ...
    dtype: str  # "bfloat16", "float32", ...
    M: int
    N: int
    variant: str  # one of VARIANTS
    ms: float  # median time per call, milliseconds
    gbps: float  # bytes / time, GB/s (1e9 bytes)
    copy_gbps: float  # copy bandwidth over the same M·N elements, same process
    pct_copy: float  # 100 · gbps / copy_gbps
    bytes: int  # from bytes_moved


COLUMNS = tuple(f.name for f in fields(Row))


def _version(dist: str) -> str:
    return info.package_version(dist) or "none"


def _commit() -> str:
    """The git commit measured (:func:`rmsnorm.info.source_commit`, 12 hex digits), else
    "unknown"."""
    return info.source_commit(short=True) or "unknown"


def machine(device: str) -> dict:
    """The metadata columns of every row: device, its name, torch / triton versions, commit and
    time."""
    return {
        "device": device,
        "device_name": (info.gpu_name() if device == "cuda" else None) or info.cpu_model(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "commit": _commit(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def make_row(
    meta: dict, op: str, mode: str, provider: str, dtype: torch.dtype, m: int, n: int,
    variant: str, ms: float, copy_gbps: float,
) -> Row:  # fmt: skip
    """A row from a median time; GB/s and % of copy follow from the bytes model (0 GB/s and no
    bytes for ``generate``, a whole model's step)."""
    if op not in OPS or mode not in MODES or variant not in VARIANTS:
        raise ValueError(f"unknown op/mode/variant {op!r}/{mode!r}/{variant!r}")
    nbytes = 0 if op == "generate" else bytes_moved(op, mode, m, n, dtype.itemsize)
    gbps = nbytes / (ms * 1e-3) / 1e9
    pct = 100.0 * gbps / copy_gbps if copy_gbps > 0 else float("nan")
    return Row(
        **meta, op=op, mode=mode, provider=provider, dtype=str(dtype).removeprefix("torch."),
        M=m, N=n, variant=variant, ms=ms, gbps=gbps, copy_gbps=copy_gbps, pct_copy=pct,
        bytes=nbytes,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------------
def write_csv(rows: Iterable[Row], path: str | os.PathLike) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


def read_csv(path: str | os.PathLike) -> list[Row]:
    """Rows back from :func:`write_csv`."""
    types = {f.name: f.type for f in fields(Row)}
    conv = {"int": int, "float": float, "str": str}
    with open(path, newline="") as f:
        return [Row(**{k: conv[types[k]](v) for k, v in rec.items()}) for rec in csv.DictReader(f)]


def run_header(rows: Sequence[Row]) -> str:
    """What the rows were measured on: device, torch, triton, commit and time (a title line)."""
    r = rows[0]
    return (
        f"{r.device_name} ({r.device}) · torch {r.torch} · triton {r.triton} · "
        f"commit {r.commit} · {r.timestamp}"
    )


def _groups(rows: Sequence[Row]) -> dict:
    """{(op, mode, dtype, M, N, variant): {provider: Row}} in first-seen order."""
    out: dict = {}
    for r in rows:
        if r.op == "copy":
            continue
        out.setdefault((r.op, r.mode, r.dtype, r.M, r.N, r.variant), {})[r.provider] = r
    return out


def format_gbps(gbps: float) -> str:
    """A bandwidth in GB/s as printed in the tables."""
    # GPU numbers are in the thousands, CPU numbers in single digits: keep two significant figures
    return f"{gbps:.0f}" if gbps >= 100 else f"{gbps:.1f}"


def _is_latency(m: int) -> bool:
    # Decoding-size calls are launch-bound: report microseconds per call, not bandwidth.
    return m <= 128


def write_markdown(rows: Sequence[Row], path: str | os.PathLike) -> None:
    """One table per op: a line per (mode, dtype, M, N, variant), a column per provider with
    GB/s and % of copy (µs per call for decoding sizes, M ≤ 128); the best cell in bold."""
    if not rows:
        Path(path).write_text("No measurements.\n")
        return
    groups = _groups(rows)
    copies = sorted(
        {(r.dtype, r.M * r.N, format_gbps(r.copy_gbps)) for r in rows if r.copy_gbps > 0}
    )
    lines = [f"# Benchmark: {run_header(rows)}", ""]
    lines.append(
        "Effective GB/s from the bytes model (fwd 2·M·N·elem, bwd 3·M·N·elem; add_rms_norm 4 and "
        "4; the gated ops 3 and 5) and % of the copy bandwidth measured in the same process over "
        "the same elements; decoding sizes (M ≤ 128) in µs per call. Bold: best provider on the "
        "line."
    )
    lines.append("")
    lines.append(
        "Copy bandwidth: "
        + "; ".join(f"{dt} {numel:,} elements: {gb} GB/s" for dt, numel, gb in copies)
    )
    for op in OPS:
        keys = [k for k in groups if k[0] == op]
        if not keys:
            continue
        providers: list[str] = []
        for k in keys:
            for p in groups[k]:
                if p not in providers:
                    providers.append(p)
        lines += ["", f"## {op}", ""]
        lines.append("| mode | dtype | M | N | variant | " + " | ".join(providers) + " |")
        lines.append("|---" * (5 + len(providers)) + "|")
        for k in keys:
            cells = groups[k]
            lat = _is_latency(k[3])
            best = (
                min(cells.values(), key=lambda r: r.ms) if cells else None
            )  # lowest time = best, whatever the unit
            row = [k[1], k[2], str(k[3]), str(k[4]), k[5]]
            for p in providers:
                r = cells.get(p)
                if r is None:
                    row.append("–")
                    continue
                text = (
                    f"{r.ms * 1e3:.1f} µs" if lat else f"{format_gbps(r.gbps)} ({r.pct_copy:.0f}%)"
                )
                row.append(f"**{text}**" if r is best else text)
            lines.append("| " + " | ".join(row) + " |")
    Path(path).write_text("\n".join(lines) + "\n")


def write_plot(rows: Sequence[Row], path: str | os.PathLike) -> bool:
    """% of copy bandwidth against N for the sweeps with several N at one (op, mode, dtype)
    (decoding sizes excluded): one panel per (op, mode, dtype), one line per provider.
    Returns False (and writes nothing) without matplotlib or without such sweeps."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels: dict = {}
    for r in rows:
        if r.op == "copy" or _is_latency(r.M) or r.variant != "eager":
            continue
        panels.setdefault((r.op, r.mode, r.dtype), {}).setdefault(r.provider, []).append(r)
    panels = {k: v for k, v in panels.items() if len({r.N for rs in v.values() for r in rs}) > 2}
    if not panels:
        return False
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False)
    for ax, ((op, mode, dtype), provs) in zip(axes.flat, panels.items(), strict=False):
        for prov, rs in sorted(provs.items()):
            rs = sorted(rs, key=lambda r: r.N)
            ax.plot([r.N for r in rs], [r.pct_copy for r in rs], marker="o", label=prov)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 110)
        ax.axhline(100, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{op} {mode} ({dtype})")
        ax.set_xlabel("hidden size N (columns per row)")
        ax.set_ylabel("% of measured copy bandwidth")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"Effective bandwidth vs copy — {run_header(rows)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def summary(rows: Sequence[Row], provider: str = "rmsnorm") -> str:
    """A short text table: per (op, mode, dtype, M, N, variant), this library's number, the best
    other provider and the ratio (ours / best other time; < 1 is faster)."""
    lines = [
        f"{'op':13} {'mode':16} {'dtype':8} {'M':>8} {'N':>7} {'variant':10} "
        f"{'ours':>12} {'best other':>28} {'time ratio':>10}"
    ]
    for k, cells in _groups(rows).items():
        ours = cells.get(provider)
        others = [r for p, r in cells.items() if p != provider and not p.startswith(provider + "[")]
        if ours is None:
            continue
        lat = _is_latency(k[3])

        def fmt(r: Row, lat: bool = lat) -> str:
            return f"{r.ms * 1e3:.1f}us" if lat else f"{format_gbps(r.gbps)}GB/s {r.pct_copy:.0f}%"

        best = min(others, key=lambda r: r.ms) if others else None
        other = f"{best.provider} {fmt(best)}" if best else "-"
        ratio = f"{ours.ms / best.ms:.3f}" if best else "-"
        lines.append(
            f"{k[0]:13} {k[1]:16} {k[2]:8} {k[3]:>8} {k[4]:>7} {k[5]:10} {fmt(ours):>12} "
            f"{other:>28} {ratio:>10}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Entry point (``rmsnorm bench``)
# ----------------------------------------------------------------------------------------------
def run(
    device: str = "cuda",
    quick: bool = False,
    out: str | os.PathLike = "benchmarks/results",
    variants: bool = False,
    budget_s: float | None = None,
    log=print,
    latency: bool = False,
    progress=None,
    ops: Sequence[str] | None = None,
) -> list[Row]:
    """Run the benchmark for `device` ("cuda" or "cpu"), write ``<stem>_bench.{csv,md,png}``
    under `out` (stem ``gpu`` or ``cpu``), and return the rows. `quick` runs a handful of shapes;
    `ops` keeps the plan's items of those ops only (all by default);
    `variants` also times forced kernel layouts of this library (tuning data, providers named
    ``rmsnorm[...]``); `budget_s` bounds the run's wall time (items that do not fit are skipped and
    logged). `latency` times the per-call grid of :mod:`rmsnorm.bench.latency` instead and writes
    ``<stem>_latency.{csv,md,png}``; `progress` (an :mod:`rmsnorm.lab.progress` object)
    shows its advance."""
    from .loop import measure

    if latency:
        return _run_latency(device, quick, out, budget_s, log, progress)
    rows = measure(device, quick=quick, variants=variants, budget_s=budget_s, log=log, ops=ops)
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    stem = "gpu" if device == "cuda" else "cpu"
    write_csv(rows, outdir / f"{stem}_bench.csv")
    write_markdown(rows, outdir / f"{stem}_bench.md")
    if write_plot(rows, outdir / f"{stem}_bench.png"):
        log(f"wrote {outdir / f'{stem}_bench.png'}")
    log(f"wrote {outdir / f'{stem}_bench.csv'} and {outdir / f'{stem}_bench.md'}")
    return rows


DEVICES = ("cuda", "cpu")


def check_device(device: str) -> str:
    """``device`` if it is one of :data:`DEVICES` and torch can run it, else ArgumentError."""
    _validate.one_of("device", device, DEVICES)
    if device == "cuda" and not torch.cuda.is_available():
        raise _validate.ArgumentError("device", "'cuda' was asked for but torch sees no GPU")
    return device


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"``; checks explicit choices."""
    _validate.one_of("device", device, ("auto", *DEVICES))
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return check_device(device)


def _load_average() -> float | None:
    load = info.load_average()
    return None if load is None else load[0]


def _run_latency(device, quick, out, budget_s, log, progress) -> list[Row]:
    from . import latency

    load = [_load_average()]
    rows = latency.run(device=device, quick=quick, budget_s=budget_s, log=log, progress=progress)
    load.append(_load_average())
    # Other processes stall torch's threads: a reader must see how busy the machine was.
    note = (
        f"Load average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end, on "
        f"{info.cpu_cores()} logical cores."
        if None not in load
        else ""
    )
    log(note)
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    stem = outdir / ("gpu_latency" if device == "cuda" else "cpu_latency")
    write_csv(rows, stem.with_suffix(".csv"))
    latency.write_markdown(rows, stem.with_suffix(".md"), note=note)
    wrote = [stem.with_suffix(".csv"), stem.with_suffix(".md")]
    if latency.write_plot(rows, stem.with_suffix(".png")):
        wrote.append(stem.with_suffix(".png"))
    log(latency.summary(rows))
    log("wrote " + ", ".join(str(p) for p in wrote))
    return rows
