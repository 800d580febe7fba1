"""The throughput mode of ``rmsnorm bench``: every planned (op, dtype, shape, mode) over the
providers on one device, as effective GB/s from the bytes model and a percentage of the copy
bandwidth measured in the same process over the same number of elements (µs per call at decoding
sizes), written as ``<device>_bench.{csv,md,png}``."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from .. import _validate
from .._files import write_text
from . import cpu, gpu, harness
from .rows import DEVICES, OPS, Row, check_device, format_gbps, run_header, save_plot

__all__ = ["PLAN_OPS", "measure", "write_markdown", "write_plot", "summary"]

# the ops a plan can hold (--ops)
PLAN_OPS = ("rms_norm", "add_rms_norm", "layer_norm", "gated_rms_norm", "gated_rms_norm_grouped")


def measure(
    device: str,
    *,
    quick: bool = False,
    variants: bool = False,
    budget_s: float | None = None,
    log: Callable[[str], object] = print,
    dry_run: bool = False,
    warm: tuple[int, int] | None = None,
    ops: Sequence[str] | None = None,
    progress=None,
) -> list[Row]:
    """Time every planned (op, dtype, shape, mode, provider) on ``device``; returns the rows (copy
    rows too).

    ``quick``: a handful of shapes. ``variants``: also forced kernel layouts (GPU only).
    ``budget_s``: seconds for the main plan (default: the device's). ``dry_run``: the quick plan
    at tiny shapes on CPU tensors, one call per timing, no torch.compile: a check of the harness
    itself. ``warm=(i, n)`` (GPU): plan items i, i + n, ... once each, untimed, no rows; fills the
    on-disk kernel caches for a timed run that follows. ``ops``: the plan's items of these ops
    only. ``progress``: an :mod:`rmsnorm._progress` object."""
    setups = {"cuda": gpu.setup, "cpu": cpu.setup}
    if dry_run:
        _validate.one_of("device", device, DEVICES)
        setup = setups[device](quick=True, dry_run=True, warm=warm)
    else:
        setup = setups[check_device(device)](quick=quick, dry_run=False, warm=warm)
    if budget_s is not None and warm is None:
        setup.budget_s = _validate.positive_number("budget_s", budget_s)
    if ops is not None:
        for op in ops:
            _validate.one_of("ops", op, PLAN_OPS)
        setup.plan = [item for item in setup.plan if item.op in ops]
    rows = harness.run(setup, variants, log, progress)
    return [] if warm is not None else rows


def _groups(rows: Sequence[Row]) -> dict:
    """{(op, mode, dtype, M, N, variant): {provider: Row}} in first-seen order."""
    out: dict = {}
    for r in rows:
        if r.op == "copy":
            continue
        out.setdefault((r.op, r.mode, r.dtype, r.M, r.N, r.variant), {})[r.provider] = r
    return out


def _is_latency(m: int) -> bool:
    # Decoding-size calls are launch-bound: report microseconds per call, not bandwidth.
    return m <= 128


def write_markdown(rows: Sequence[Row], path: str | os.PathLike) -> None:
    """One table per op: a line per (mode, dtype, M, N, variant), a column per provider with
    GB/s and % of copy (µs per call for decoding sizes, M ≤ 128); the best cell in bold."""
    if not rows:
        write_text("No measurements.\n", path)
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
    write_text("\n".join(lines) + "\n", path)


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
    return save_plot(fig, f"Effective bandwidth vs copy — {run_header(rows)}", path)


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
