"""Per-channel outliers and the blind spot of |μ|/σ: its part of ``report.json`` (:func:`data`,
from :func:`numbers`), the figure (:func:`figures`, drawn by :func:`blind_spot_figure`) and the
words."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from ...figures import legend_below, pyplot, save_figure
from ...models.transformer import NORM_NAMES
from ...page import Page
from ...stats.iid import iid_reference
from ...stats.outliers import iid_max_over_rms
from .common import range_text

if TYPE_CHECKING:
    from ..run import ReportResults


def numbers(blind_spot: list, d: int) -> dict:
    """The blind spot's rows (:func:`~rmsnorm.lab.stats.outliers.blind_spot`) at the simulation's
    width ``d``, with the limit of |μ|/σ for a row dominated by one channel."""
    return {
        "blind_spot": blind_spot,
        "d": d,
        "one_channel_limit": 1 / math.sqrt(d - 1),
    }


def blind_spot_figure(rows: list[dict], d: int, path: Path) -> Path:
    """Rows of d i.i.d. Gaussian entries with m channels set to a large amplitude: |μ|/σ (left)
    stays at the i.i.d. level for one channel and for mixed signs and rises as √(m/(d − m)) for
    m same-sign channels; the share of Σx² in those channels (right) sees every case."""
    plt = pyplot()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12.5, 5.4), layout="constrained")
    ax1b = ax1.twinx()
    ms = sorted({r["m"] for r in rows})
    pos = {m: i for i, m in enumerate(ms)}
    ref = iid_reference(d)
    ax0.axhspan(ref.q05, ref.q95, color="gray", alpha=0.15, label="i.i.d. rows: 5–95%")
    ax0.axhline(ref.median, color="gray", ls=":", lw=1.5, label="i.i.d. rows: median")
    for signs, marker, color, dx in (
        ("none", "o", "black", 0.0),
        ("same", "o", "#d62728", -0.1),
        ("mixed", "s", "#1f77b4", 0.1),
    ):
        pts = [r for r in rows if r["signs"] == signs]
        if not pts:
            continue
        label = {
            "none": "no outlier channel",
            "same": "m channels, same sign",
            "mixed": "m channels, half +A, half −A",
        }[signs]
        xs = [pos[r["m"]] + dx for r in pts]
        ax0.plot(
            xs,
            [max(r["median_mu_over_sigma"], 1e-4) for r in pts],
            marker,
            color=color,
            ms=7,
            ls="none",
            label=f"{label}: measured median",
        )
        ax1.plot(xs, [100 * r["top_m_share"] for r in pts], marker, color=color, ms=7, ls="none")
        ax1b.plot(
            xs,
            [r["max_over_rms_median"] for r in pts],
            marker,
            color=color,
            ms=7,
            ls="none",
            mfc="none",
        )
    same = [r for r in rows if r["signs"] == "same"]
    ax0.plot(
        [pos[r["m"]] for r in same],
        [r["limit_mu_over_sigma"] for r in same],
        "--",
        color="#d62728",
        lw=1,
        label="√(m/(d − m)), the large-amplitude limit",
    )
    for ax in (ax0, ax1):
        ax.set_xticks(range(len(ms)))
        ax.set_xticklabels([str(m) for m in ms])
        ax.set_xlabel("m, number of outlier channels (amplitude A = 100 × the others' σ)")
        ax.grid(alpha=0.3, which="both")
    ax0.set_yscale("log")
    ax0.set_ylabel("median |μ|/σ over rows (log)")
    ax0.set_title("What |μ|/σ sees", fontsize=10)
    ax1.set_ylabel("share of Σx² in the top m channels (%, filled; m = 0: top 1)")
    ax1b.set_ylabel("median max|xᵢ|/RMS (open markers, log)")
    ax1b.set_yscale("log")
    ax1b.axhline(iid_max_over_rms(d), color="gray", ls="--", lw=0.8)
    ax1.set_title("What the channel statistics see (dashed: i.i.d. max|xᵢ|/RMS)", fontsize=10)
    legend_below(fig, ax0, ncol=3)
    return save_figure(fig, path, f"The blind spot: massive channels in rows of d = {d}")


def data(r: ReportResults) -> dict:
    """``outliers``: :func:`numbers` of the run's blind spot at the simulation's width."""
    return {"outliers": numbers(r.blind_spot, r.study.config.d_model)}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``blind_spot``: :func:`blind_spot_figure`."""
    d = r.study.config.d_model
    return {"blind_spot": blind_spot_figure(r.blind_spot, d, out / "blind_spot.png")}


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    o = j["outliers"]
    page.h2("Per-channel outliers, and what |μ|/σ cannot see")
    page.p(
        "A massive activation (one channel far larger than the rest) dominates both norms' "
        "divisors, but |μ|/σ cannot see it. Derived: a row x ≈ A·e_i has μ = A/d and σ = "
        "A·√(d − 1)/d, so |μ|/σ → 1/√(d − 1) = "
        f"{o['one_channel_limit']:.4f} at d = {o['d']}, inside the i.i.d. band; m channels of the "
        "same sign give √(m/(d − m)), and mixed signs cancel. Measured on rows of i.i.d. Gaussian "
        "entries with m channels set to A = 100 × their σ:"
    )
    page.table(
        [
            "m channels",
            "signs",
            "median |μ|/σ",
            "√(m/(d − m))",
            "mean cos(LN, RMS)",
            "median max|xᵢ|/RMS",
            "share of Σx² in the top m",
        ],
        [
            [
                str(r["m"]),
                r["signs"],
                f"{r['median_mu_over_sigma']:.4f}",
                f"{r['limit_mu_over_sigma']:.4f}",
                f"{r['mean_cosine']:.4f}",
                f"{r['max_over_rms_median']:.2f}",
                f"{100 * r['top_m_share']:.1f}%",
            ]
            for r in o["blind_spot"]
        ],
    )
    page.figure(
        figures["blind_spot"],
        "|μ|/σ (left) and the top channels' share of Σx² (right) for rows with m massive channels.",
    )
    tr = j.get("training")
    if tr is None:
        return
    rows = []
    for n, p in tr["per_norm"].items():
        rows.append(
            [
                NORM_NAMES[n],
                range_text(p["max_over_rms_median"], ".2f"),
                range_text(p["excess_kurtosis_median"], ".2f"),
                range_text(p["top1_share_pct"], ".1f", "%"),
                range_text(p["top_k_share_pct"], ".1f", "%"),
            ]
        )
    page.p(
        "So the lab also measures the channels: per layer, max|xᵢ|/RMS (median over tokens; "
        f"i.i.d. Gaussian rows: {tr['outlier_iid_max_over_rms']:.2f}), the excess kurtosis of a "
        "row's entries (median; Gaussian: 0), and the share of Σx² carried by the top channel "
        f"(i.i.d.: {tr['outlier_iid_top1_share_pct']:.2f}%) and by the top "
        f"{tr['outlier_top_k']} (1% of the channels; i.i.d. "
        f"{tr['outlier_iid_top_k_share_pct']:.1f}%). "
        "In the trained models (range over blocks and seeds):"
    )
    page.table(
        ["model", "max|xᵢ|/RMS", "excess kurtosis", "top channel's share", "top 1%'s share"], rows
    )
    factor = tr["outlier_top1_over_iid_max"]
    if factor < tr["massive_share_factor"]:
        said = (
            f"No channel carries more than {factor:.1f}× its i.i.d. share (a dominant one would "
            f"carry {tr['massive_share_factor']:.0f}× or more): these models grew no massive "
            "activation."
        )
    else:
        said = (
            f"A channel carries up to {factor:.1f}× its i.i.d. share: at least one layer has a "
            "dominant channel, which |μ|/σ cannot show."
        )
    page.p(
        said + " `rmsnorm inspect` prints the same columns, with the dominant channels, for any "
        "model."
    )
