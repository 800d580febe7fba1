"""The timing: the run's times with the ratios of RMSNorm to LayerNorm time over shapes
(:func:`data`, the ratios from :func:`~rmsnorm.lab.report.timing.timing_ratios`), the figure
(:func:`figures`, drawn by :func:`timing_bars`) and the words."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...figures import legend_below, pyplot, save_figure
from ...page import Page
from ..timing import timing_ratios
from .common import fmt

if TYPE_CHECKING:
    from ..run import ReportResults


def timing_bars(timing: dict, path: Path) -> Path:
    """Forward+backward time per shape for RMSNorm and LayerNorm, this library and torch: the
    median of the rounds (bar) and the fastest round (tick)."""
    plt = pyplot()
    rows = timing["results"]
    shapes = list(dict.fromkeys(r["shape_name"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, ax = plt.subplots(figsize=(8.5, 5.4), layout="constrained")
    width = 0.8 / len(impls)
    colors = ["#d62728", "#1f77b4", "#ff9896", "#aec7e8"]
    for j, impl in enumerate(impls):
        ys, lows = [], []
        for s in shapes:
            match = [r for r in rows if r["shape_name"] == s and r["impl"] == impl]
            ys.append(match[0]["median_ms"] if match else 0.0)
            lows.append(match[0]["min_ms"] if match else 0.0)
        xs = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(shapes))]
        bars = ax.bar(xs, ys, width, label=impl, color=colors[j % len(colors)])
        ax.plot(xs, lows, "_", color="black", ms=12, label="fastest round" if j == 0 else None)
        ax.bar_label(bars, fmt="%.2g", fontsize=7)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, fontsize=8)
    ax.set_ylabel("forward + backward time per call (ms)")
    ax.set_xlabel("input shape (rows × hidden size), " + timing["dtype"])
    ax.set_title(f"RMSNorm vs LayerNorm, forward + backward\n{timing['machine']}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    legend_below(fig, ax, ncol=5)
    return save_figure(fig, path)


def data(r: ReportResults) -> dict:
    """``timing``: the run's timing with its ratios over shapes
    (:func:`~rmsnorm.lab.report.timing.timing_ratios`) under ``rms_over_ln``."""
    return {"timing": {**r.timing, "rms_over_ln": timing_ratios(r.timing)}}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``timing``: :func:`timing_bars`."""
    return {"timing": timing_bars(r.timing, out / "timing.png")}


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    timing = j["timing"]
    page.h2("Speed: RMSNorm vs LayerNorm, forward + backward")
    headers = ["shape"] + list(dict.fromkeys(t["impl"] for t in timing["results"]))
    rows = []
    for shape in dict.fromkeys(t["shape_name"] for t in timing["results"]):
        row = [shape]
        for impl in headers[1:]:
            ms = [t for t in timing["results"] if t["shape_name"] == shape and t["impl"] == impl]
            row.append(f"{ms[0]['median_ms']:.3g} ms ({ms[0]['min_ms']:.3g})" if ms else "–")
        rows.append(row)
    ratios = timing["rms_over_ln"]
    rounds = timing["results"][0]["rounds"]
    text = (
        f"Median of {rounds} interleaved samples of one forward + backward call (in brackets the "
        "fastest; `torch.autograd.grad` of the output with respect to the input and the "
        "parameters, each sample a `torch.utils.benchmark` `blocked_autorange` median, the "
        f"implementations taking turns), {timing['dtype']}, on {timing['machine']} (load "
        f"average {fmt(j['load_average'], '.2f')} when the report started); this library's "
        f"backend here: `{timing['backend']}`. This library's RMSNorm took "
        f"{fmt(ratios['rmsnorm'], '.2f')}× the time of its LayerNorm, and torch's `F.rms_norm` "
        f"{fmt(ratios['torch'], '.2f')}× its `F.layer_norm`; this library's `rms_norm` took "
        f"{fmt(ratios['ours_over_torch_rms_norm'], '.2f')}× the time of torch's `F.rms_norm` and "
        f"{fmt(ratios['ours_over_torch_layer_norm'], '.2f')}× that of its `F.layer_norm` "
        "(geometric means over shapes). RMSNorm skips one reduction (the mean) and the bias, so "
        "a fused kernel should be a little faster; where it is not, the implementation is why. "
    )
    if timing["backend"] == "reference":
        text += (
            "The `reference` backend is the plain-PyTorch spec (several elementwise passes, an "
            "explicit backward), not a kernel. "
        )
    text += (
        "Other processes share these cores, so treat the numbers as indicative; "
        "`rmsnorm bench --latency` times every path of this library against both torch norms "
        "over a grid of shapes, and `benchmarks/` holds the careful measurements."
    )
    page.p(text)
    page.table(headers, rows)
    page.figure(figures["timing"], "Forward + backward time per implementation and shape.")
