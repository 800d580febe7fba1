"""The architecture sweep at initialization: its verdicts per setting (:func:`data`, from
:func:`numbers`), its figure (:func:`figures`, drawn by :func:`sweep_figure`) and its words."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...experiments.simulation.seeds import CONFIDENCE, centering_verdict
from ...experiments.sweep import SweepResult
from ...figures import legend_below, pyplot, save_figure
from ...page import Page
from ...stats.iid import iid_reference
from .common import chapter, fmt

if TYPE_CHECKING:
    from ..run import ReportResults


def numbers(sweep: SweepResult) -> dict:
    """The sweep's cells and the counts the text states: verdicts of the settings whose stream
    carries its residual sum (pre-norm and norm-free) and of post-LN."""
    out = sweep.to_dict()
    residual = [
        c for c in sweep.cells if c.config.norm_position == "pre" or c.config.norm == "none"
    ]
    residual = list({repr(c.config): c for c in residual}.values())  # the default counted once
    counts: dict[str, int] = {}
    for c in residual:
        counts[c.study.verdict.verdict] = counts.get(c.study.verdict.verdict, 0) + 1
    widths = sweep.group("width")
    post = [c for c in sweep.group("placement") if c.label == "post-LN"]
    # Each cell's interval is at 95%, so among n settings about n/20 exclude 1 by chance alone; a
    # Bonferroni-adjusted interval keeps that chance at 5% for the whole sweep.
    unique = list({repr(c.config): c for c in sweep.cells}.values())
    conf = 1 - (1 - CONFIDENCE) / len(unique)
    adjusted = {c.label: centering_verdict(c.study.ratios, conf).verdict for c in unique}
    out["summary"] = {
        "residual_settings": len(residual),
        "residual_verdicts": counts,
        "residual_more_centered": [
            c.label for c in residual if c.study.verdict.verdict == "more centered"
        ],
        "residual_less_centered": [
            c.label for c in residual if c.study.verdict.verdict == "less centered"
        ],
        "widths_as_centered": sum(c.study.verdict.verdict == "as centered" for c in widths),
        "widths": len(widths),
        "post_ln": None if not post else post[0].study.verdict.to_dict(),
        "settings": len(unique),
        "chance_flags": (1 - CONFIDENCE) * len(unique),
        "bonferroni_confidence": conf,
        "bonferroni_flagged": {
            label: v for label, v in adjusted.items() if v in ("more centered", "less centered")
        },
    }
    return out


def _ratio_panel(ax, cells, title: str, log: bool = True) -> None:
    """One group of the sweep: per-seed ratios (dots) and the geometric mean with its 95% interval,
    against the i.i.d. level (1) and the ±25% equivalence band."""
    margin = cells[0].study.verdict.margin
    ax.axhspan(1 / (1 + margin), 1 + margin, color="gray", alpha=0.12)
    ax.axhline(1.0, color="gray", ls=":", lw=1.4)
    for i, cell in enumerate(cells):
        ratios = cell.study.ratios
        n = len(ratios)
        xs = [i + 0.25 * ((j + 0.5) / n - 0.5) for j in range(n)]
        ax.plot(xs, ratios, ".", color="#1f77b4", alpha=0.6, ms=5)
        v = cell.study.verdict
        lo = v.ratio - v.ci_low if math.isfinite(v.ci_low) else 0
        hi = v.ci_high - v.ratio if math.isfinite(v.ci_high) else 0
        ax.errorbar(
            [i + 0.22], [v.ratio], yerr=[[lo], [hi]], fmt="D", color="black", ms=5, capsize=3
        )
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c.label.replace(", ", ",\n") for c in cells], fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("median |μ|/σ ÷ i.i.d. median (log)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both", axis="y")


def sweep_figure(sweep, path: Path) -> Path:
    """The architecture sweep: per group, the seeds' median |μ|/σ ÷ the i.i.d. median at the same
    width, with the geometric mean and its 95% interval; the width panel in absolute terms against
    the i.i.d. curve, which falls as 1/√d."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(2, 2, figsize=(12.5, 9.2), layout="constrained")
    panels = (
        ("activation", "MLP activation"),
        ("placement", "norm and its placement"),
        ("depth", "depth"),
    )
    for ax, (group, title) in zip((axes[0][0], axes[0][1], axes[1][1]), panels, strict=True):
        cells = sweep.group(group)
        if cells:
            _ratio_panel(ax, cells, title)
    ax = axes[1][0]
    cells = sweep.group("width")
    if cells:
        ds = [c.config.d_model for c in cells]
        grid = torch.logspace(math.log10(min(ds) / 1.3), math.log10(max(ds) * 1.3), 60).tolist()
        refs = [iid_reference(round(g)) for g in grid]
        ax.fill_between(
            grid, [r.q25 for r in refs], [r.q75 for r in refs], color="gray", alpha=0.15
        )
        ax.plot(grid, [r.median for r in refs], color="gray", ls=":", lw=1.6)
        ax.plot(grid, [0.6745 / math.sqrt(g) for g in grid], color="black", lw=0.7, ls="--")
        for c in cells:
            meds = [s.pooled_median_ratio for s in c.study.summaries]
            n = len(meds)
            d = c.config.d_model
            ax.plot(
                [d * (1 + 0.12 * ((j + 0.5) / n - 0.5)) for j in range(n)],
                meds,
                ".",
                color="#1f77b4",
                alpha=0.6,
                ms=5,
            )
            v = c.study.verdict
            ref = c.study.reference.median
            ax.errorbar(
                [d * 1.1],
                [v.ratio * ref],
                yerr=[[(v.ratio - v.ci_low) * ref], [(v.ci_high - v.ratio) * ref]],
                fmt="D",
                color="black",
                ms=5,
                capsize=3,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ds)
        ax.set_xticklabels([str(d) for d in ds])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("width d (log)")
        ax.set_ylabel("median |μ|/σ over all tokens (log)")
        ax.set_title("width: against the i.i.d. curve", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    handles = [
        Line2D([], [], marker=".", ls="none", color="#1f77b4", ms=8, label="one seed"),
        Line2D(
            [],
            [],
            marker="D",
            color="black",
            ms=5,
            label="geometric mean over seeds, 95% interval (t)",
        ),
        Line2D([], [], color="gray", ls=":", lw=1.6, label="i.i.d. Gaussian rows: median"),
        Patch(
            color="gray",
            alpha=0.15,
            label="ratio panels: ±25% of the i.i.d. median; width: i.i.d. 25–75%",
        ),
        Line2D([], [], color="black", lw=0.7, ls="--", label="0.674/√d (normal limit)"),
    ]
    legend_below(fig, axes[1][0], ncol=3, handles=handles)
    seeds = sweep.cells[0].study.seeds if sweep.cells else []
    base = sweep.base
    return save_figure(
        fig,
        path,
        f"Architecture sweep at initialization ({len(seeds)} seeds per setting; default "
        f"{base.n_layers}-layer pre-LN GELU, d = {base.d_model}; one setting changed per point)",
    )


def data(r: ReportResults) -> dict:
    """``sweep``: :func:`numbers` of the sweep ({} when it did not run)."""
    return {} if r.sweep is None else {"sweep": numbers(r.sweep)}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``sweep``: :func:`sweep_figure` ({} when the sweep did not run)."""
    return {} if r.sweep is None else {"sweep": sweep_figure(r.sweep, out / "sweep.png")}


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    sw = j.get("sweep")
    if sw is None:
        return
    page.h2("Architecture sweep at initialization")
    page.p(
        f"{chapter(page)} says residual connections keep activations centered. Each setting below "
        "changes one thing from the default and runs at "
        f"{len(sw['seeds'])} seeds; the verdict is the seed-calibrated one of "
        f"{page.ref('simulation')} at the "
        "setting's own width. Post-LN rows are those its norms read (x + f(x)), since its stream "
        "is a norm's output; 'none' has no norm at all."
    )
    rows = []
    for c in sw["cells"]:
        v = c["verdict"]
        rows.append(
            [
                c["group"],
                c["label"],
                f"{c['pooled_median_geomean']:.4f}",
                f"{c['iid_median']:.4f}",
                f"{v['ratio']:.3f}",
                f"{fmt(v['ci_low'], '.3f')}–{fmt(v['ci_high'], '.3f')}",
                f"{100 * v['seed_sd']:.0f}%",
                f"{100 * c['last_layer_shared_share_median']:.1f}%",
                v["verdict"],
            ]
        )
    page.table(
        [
            "group",
            "setting",
            "median |μ|/σ",
            "i.i.d. median",
            "÷ i.i.d.",
            "95% interval",
            "seed SD",
            "shared share, last layer",
            "verdict",
        ],
        rows,
    )
    summ = sw["summary"]
    counts = ", ".join(f"{n} {v}" for v, n in summ["residual_verdicts"].items())
    text = (
        f"Of the {summ['residual_settings']} settings with a residual stream that no norm "
        f"rewrites (pre-norm or no norm): {counts}. "
    )
    if not summ["residual_more_centered"]:
        text += (
            "None is more centered than i.i.d. rows: the residual connections do not center the "
            "stream beyond chance, which is all that the chapter's 'residual connections keep "
            "activations centered' can claim. "
        )
    else:
        text += f"More centered than i.i.d. rows: {', '.join(summ['residual_more_centered'])}. "
    if summ["residual_less_centered"]:
        text += f"Less centered: {', '.join(summ['residual_less_centered'])}. "
    if summ["widths"]:
        text += (
            f"{summ['widths_as_centered']} of the {summ['widths']} widths are as centered as "
            "i.i.d. rows, whose |μ|/σ falls as 1/√d. "
        )
    flagged = summ["bonferroni_flagged"]
    said = ", ".join(f"{label} ({v})" for label, v in flagged.items()) or "none"
    text += (
        f"Each interval is at 95%, so among the {summ['settings']} settings about "
        f"{summ['chance_flags']:.1f} would exclude 1 by chance alone; at the Bonferroni-adjusted "
        f"{100 * summ['bonferroni_confidence']:.1f}% the intervals still exclude it for: {said}. "
    )
    post = summ["post_ln"]
    if post is not None:
        text += (
            f"Post-LN's norms read rows that a norm has just centered plus one block's write: "
            f"{post['ratio']:.3f}× the i.i.d. median ({post['verdict']}). "
        )
    page.p(text)
    page.figure(
        figures["sweep"],
        "Per setting: the seeds' median |μ|/σ ÷ the i.i.d. median at the same width (dots), the "
        "geometric mean with its 95% interval; the width panel in absolute terms.",
    )
