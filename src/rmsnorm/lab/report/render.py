"""What the report writes, all from one :class:`~.run.ReportResults`: its figures, ``report.md``,
the self-contained ``report.html`` and ``report.json``. Every figure has a title, labelled axes
with units, a colour bar where colour encodes a number, and its legend outside the data."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ..._progress import ensure
from ..experiments.inspection import inspect_layers
from ..experiments.simulation import cosine_by_layer, mean_histograms
from ..experiments.simulation.render import decomposition_figure, iid_lines, seed_ratio_by_layer
from ..figures import layer_ticks, legend_below, pyplot, save_figure
from ..io import write_json, write_text
from ..models.transformer import NORM_NAMES
from ..stats.iid import iid_reference
from ..stats.outliers import iid_max_over_rms
from ..stats.rows import median
from . import real_figures
from .prose import report_page
from .run import ReportConfig, ReportResults, run_report

__all__ = [
    "divergence_curve",
    "sigma_mu_plane",
    "timing_bars",
    "seed_ratio_by_layer",
    "decomposition_figure",
    "sweep_figure",
    "trained_mu_sigma",
    "swap_figure",
    "blind_spot_figure",
    "write_figures",
    "write_report",
]

NORM_COLORS = {"layernorm": "#1f77b4", "rmsnorm": "#d62728"}
STYLE_NAMES = {"--": "dashed", "-": "solid"}


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


def trained_mu_sigma(training, path: Path) -> Path:
    """Per layer, before and after training, for the LayerNorm and the RMSNorm models: median σ,
    median |μ| and median |μ|/σ over tokens (lines: median over seeds; bands: min–max)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.4), layout="constrained")
    names = training.layer_names()
    x = list(range(len(names)))
    keys = (
        ("median_sigma", "median σ (activation units, log)"),
        ("median_abs_mu", "median |μ| (activation units, log)"),
        ("median_ratio", "median |μ|/σ (dimensionless, log)"),
    )
    for ax, (key, ylabel) in zip(axes, keys, strict=True):
        for norm in training.config.norms:
            runs = training.of(norm)
            for stage, ls in (("init", "--"), ("trained", "-")):
                t = torch.tensor([getattr(r, stage)[key] for r in runs], dtype=torch.float64)
                c = NORM_COLORS.get(norm, "black")
                ax.fill_between(
                    x,
                    t.min(0).values,
                    t.max(0).values,
                    color=c,
                    alpha=0.12 if stage == "init" else 0.22,
                )
                ax.plot(
                    x,
                    torch.quantile(t, 0.5, dim=0),
                    ls=ls,
                    color=c,
                    marker="o",
                    ms=3,
                    label=f"{NORM_NAMES.get(norm, norm)}, {stage} ({STYLE_NAMES[ls]})",
                )
        ax.set_yscale("log")
        layer_ticks(ax, names, short=True)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    iid_lines(axes[2], iid_reference(training.config.d_model), band=False)
    axes[0].set_title("σ: the spread of each token's entries", fontsize=10)
    axes[1].set_title("|μ|: each token's mean", fontsize=10)
    axes[2].set_title("their ratio", fontsize=10)
    legend_below(fig, axes[2], ncol=5)
    cfg = training.config
    return save_figure(
        fig,
        path,
        f"Before and after {cfg.steps} training steps: {cfg.n_layers}-layer pre-norm models, "
        f"d = {cfg.d_model}, {cfg.seeds} seeds each (lines: median over seeds; bands: min–max)",
    )


def swap_figure(swap: dict, path: Path) -> Path:
    """KL(original ‖ swapped) per token for every LayerNorm swapped alone and for all at once,
    naive and exact, one point per seed (log axis; exact zeros drawn at the floor)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.4), layout="constrained")
    names = ["all at once"] + swap["norms"]
    floor = 1e-20
    for kind, color, dx in (("naive", "#ff7f0e", -0.12), ("exact", "#2ca02c", 0.12)):
        for j, c in enumerate(swap["per_seed"]):
            values = [c[kind]["all"]["kl_mean"]] + [c[kind]["one"][n]["kl_mean"] for n in names[1:]]
            ax.plot(
                [i + dx for i in range(len(names))],
                [max(v, floor) for v in values],
                "o",
                color=color,
                ms=5,
                alpha=0.8,
                mec="black",
                mew=0.3,
                label=f"{kind} swap, one point per seed" if j == 0 else None,
            )
    ax.axhline(floor, color="gray", lw=0.6, ls=":", label=f"0 is drawn at {floor:g}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("which LayerNorm is replaced by RMSNorm")
    ax.set_ylabel("KL(original ‖ swapped), mean over tokens (nats, log)")
    ax.set_title(
        "The swap's end-to-end cost on the trained LayerNorm models\n"
        "naive: same γ, β, ε; exact: residual writers centered first",
        fontsize=10,
    )
    ax.grid(alpha=0.3, which="both", axis="y")
    legend_below(fig, ax, ncol=3)
    return save_figure(fig, path)


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


def divergence_curve(points: list[dict], tokens: dict | None, path: Path) -> Path:
    """cos(LN, RMSNorm) = 1/sqrt(1 + r²) against r = |μ|/σ: the analytic curve, with each layer of a
    run as a point coloured by its depth (colour bar) and shaped by its run (``points``: dicts
    with ``group``, ``r`` (the layer's median |μ|/σ) and ``depth`` in [0, 1]). Left: the whole
    curve, linear cosine; right: 1 − cos on log-log axes, where the curve is r²/2 for small r,
    with ``tokens`` (``r`` and measured ``cos`` per token, ``label``) as grey dots."""
    plt = pyplot()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 5.8), layout="constrained")
    r = torch.logspace(-4, 1.5, 400, dtype=torch.float64)
    cos = 1 / torch.sqrt(1 + r * r)
    ax0.plot(r, cos, color="black", lw=1.5, label="analytic: 1/√(1 + (μ/σ)²)")
    ax1.plot(r, 1 - cos, color="black", lw=1.5)
    cmap = plt.get_cmap("viridis")
    if tokens is not None:
        rr, cc = tokens["r"], tokens["cos"]
        ok = torch.isfinite(rr)
        ax1.plot(
            rr[ok],
            (1 - cc[ok]).clamp_min(1e-16),
            ".",
            color="gray",
            ms=1.5,
            alpha=0.4,
            label=f"{tokens['label']}: every token (measured cosine)",
        )
    markers = ["o", "s", "^", "D", "v", "P"]
    groups = list(dict.fromkeys(p["group"] for p in points))
    for gi, group in enumerate(groups):
        pts = [p for p in points if p["group"] == group and math.isfinite(p["r"])]
        if not pts:
            continue
        rs = [p["r"] for p in pts]
        cs = [1 / math.sqrt(1 + v * v) for v in rs]
        kw = {
            "marker": markers[gi % len(markers)],
            "c": [p["depth"] for p in pts],
            "cmap": cmap,
            "vmin": 0,
            "vmax": 1,
            "s": 40,
            "edgecolors": "black",
            "linewidths": 0.5,
        }
        sc = ax0.scatter(rs, cs, label=group, **kw)
        ax1.scatter(rs, [1 - c for c in cs], **kw)
    for ax in (ax0, ax1):
        ax.set_xscale("log")
        ax.set_xlabel("|μ| / σ of the row (dimensionless, log scale)")
        ax.grid(alpha=0.3, which="both")
    ax0.axvline(1.0, color="gray", ls=":", lw=0.8)
    ax0.set_ylabel("cos(LayerNorm(x), RMSNorm(x))")
    ax0.set_title("The divergence curve: cosine between the two outputs", fontsize=10)
    ax1.set_yscale("log")
    ax1.set_ylim(1e-9, 2)
    ax1.set_ylabel("1 − cos  (log scale)")
    ax1.set_title("Zoom on the centered end: 1 − cos ≈ (μ/σ)²/2", fontsize=10)
    if points:
        bar = fig.colorbar(sc, ax=[ax0, ax1], shrink=0.85, pad=0.01)
        bar.set_label("depth of the layer (0: embedding, 1: last block)")
    from matplotlib.lines import Line2D

    # the markers' shape says the run; their colour belongs to the bar, so the legend's are white
    handles = (
        [ax0.get_legend_handles_labels()[0][0]]
        + [
            Line2D(
                [],
                [],
                marker=markers[gi % len(markers)],
                ls="none",
                mfc="white",
                mec="black",
                ms=7,
                label=group,
            )
            for gi, group in enumerate(groups)
        ]
        + ax1.get_legend_handles_labels()[0]
    )
    legend_below(fig, ax0, ncol=3, handles=handles)
    return save_figure(
        fig, path, "Each point: one layer's median token (shape: the run; colour: depth)"
    )


def sigma_mu_plane(panels: list[tuple[str, object]], path: Path, layers: list[int] | None = None):
    """Each token as a point (σ, μ). LayerNorm divides a row by its horizontal coordinate σ,
    RMSNorm by its distance from the origin RMS = sqrt(σ² + μ²); the angle θ of the point above
    the σ axis has cos θ = σ/RMS, the cosine between the two outputs. Dashed circles are rows of
    equal RMS. ``panels``: (title, StageStats) pairs, drawn with equal axis scales."""
    plt = pyplot()
    from matplotlib.patches import Arc

    fig, axes = plt.subplots(
        2,
        len(panels),
        figsize=(6.8 * len(panels), 7.6),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": (4, 1.3)},
    )
    cmap = plt.get_cmap("viridis")
    for col, (title, st) in enumerate(panels):
        ax, legend_ax = axes[0][col], axes[1][col]
        n = st.mean.shape[0]
        chosen = layers if layers is not None else sorted({0, n // 2, n - 1})
        for k, i in enumerate(chosen):
            ax.plot(
                st.std[i][:400],
                st.mean[i][:400],
                ".",
                ms=3,
                alpha=0.6,
                color=cmap(k / max(1, len(chosen) - 1)),
                label=f"tokens after {'embedding' if i == 0 else f'block {i}'}",
            )
        sig = torch.cat([st.std[i] for i in chosen])
        mu = torch.cat([st.mean[i] for i in chosen])
        rms = torch.sqrt(sig * sig + mu * mu)
        smax = float(rms.max()) * 1.15
        for j, radius in enumerate(
            torch.quantile(rms, torch.tensor([0.1, 0.5, 0.9], dtype=rms.dtype))
        ):
            t = torch.linspace(-math.pi / 2, math.pi / 2, 200)
            ax.plot(
                float(radius) * torch.cos(t),
                float(radius) * torch.sin(t),
                "--",
                color="gray",
                lw=0.8,
                label="circles of constant RMS (10/50/90% of tokens)" if j == 0 else None,
            )
        ratio = mu.abs() / sig
        ratio = torch.where(torch.isfinite(ratio), ratio, torch.zeros_like(ratio))
        k = int(ratio.argmax())
        s0, m0 = float(sig[k]), float(mu[k])
        r0 = math.hypot(s0, m0)
        ax.plot(
            [0, s0], [0, m0], color="#d62728", lw=1.8, label=f"RMSNorm divides by RMS = {r0:.3g}"
        )
        ax.plot(
            [0, s0], [0, 0], color="#1f77b4", lw=2.5, label=f"LayerNorm divides by σ = {s0:.3g}"
        )
        ax.plot([s0, s0], [0, m0], color="#ff7f0e", lw=1.5, label=f"μ = {m0:.3g}")
        theta = math.degrees(math.atan2(m0, s0))
        ax.add_patch(
            Arc(
                (0, 0),
                0.5 * r0,
                0.5 * r0,
                theta1=min(0, theta),
                theta2=max(0, theta),
                color="black",
                lw=1.0,
            )
        )
        ax.plot(
            [s0],
            [m0],
            "k*",
            ms=10,
            label=f"largest-angle token: θ = {theta:.2f}°, cos θ = σ/RMS = {s0 / r0:.4f}",
        )
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xlim(0, smax)
        half = max(smax / 2, float(mu.abs().max()) * 1.15)
        ax.set_ylim(-half, half)
        ax.set_aspect("equal")
        ax.set_xlabel("σ, per-token standard deviation (activation units)")
        ax.set_ylabel("μ, per-token mean (activation units)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        legend_ax.axis("off")
        legend_ax.legend(*ax.get_legend_handles_labels(), loc="upper center", fontsize=7.5)
    return save_figure(
        fig,
        path,
        "The (σ, μ) plane: LayerNorm divides by the horizontal coordinate,\n"
        "RMSNorm by the distance from the origin",
    )


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


def _divergence_points(r: ReportResults) -> tuple[list[dict], dict]:
    """Each layer of each run as a point of the divergence curve, and the first seed's embedding
    tokens with their measured cosine."""
    base = r.simulation
    n = len(base.layer_names)
    points = [
        {
            "group": "simulated, init (seed 0)",
            "r": median(base.init.ratio[i]),
            "depth": i / max(1, n - 1),
        }
        for i in range(n)
    ]
    if r.training is not None:
        for norm in r.training.config.norms:
            runs = r.training.of(norm)
            layers = len(runs[0].trained["median_ratio"])
            for i in range(layers):
                points.append(
                    {
                        "group": f"{NORM_NAMES.get(norm, norm)} model, trained, "
                        f"seed {runs[0].seed}",
                        "r": runs[0].trained["median_ratio"][i],
                        "depth": i / max(1, layers - 1),
                    }
                )
    if r.planted is not None:
        rs = [x for x in r.planted["runs"] if x["norm"] == "rmsnorm"]
        if rs:
            med = rs[0]["median_ratio_planted"]
            points += [
                {
                    "group": f"RMSNorm net, bias {r.planted['bias']:g} planted in block 1",
                    "r": v,
                    "depth": i / max(1, len(med) - 1),
                }
                for i, v in enumerate(med)
            ]
    if r.inspected is not None:
        layers = r.inspected["layers"]
        for i, layer in enumerate(layers):
            q = layer["mu_over_sigma"]["q50"]
            if q is not None:
                points.append(
                    {
                        "group": f"model {r.inspected['model']}",
                        "r": q,
                        "depth": i / max(1, len(layers) - 1),
                    }
                )
    tokens = {
        "r": base.init.ratio[0],
        "cos": base.init.measured_cosine[0],
        "label": "simulated, init, embedding",
    }
    return points, tokens


def write_figures(r: ReportResults, fig_dir: Path, progress=None) -> dict[str, Path]:
    """Every figure the report shows, into ``fig_dir``; returns {name: path}."""
    progress = ensure(progress)
    base = r.simulation
    jobs = [
        (
            "sigma_mu_plane",
            lambda p: sigma_mu_plane(
                [(f"simulated transformer at init (seed {base.config.seed})", base.init)], p
            ),
        ),
        ("mean_histograms", lambda p: mean_histograms(base, p)),
        ("ratio_by_layer", lambda p: seed_ratio_by_layer(r.study, p)),
        ("decomposition", lambda p: decomposition_figure(r.study, r.sweep, p)),
        ("cosine_by_layer", lambda p: cosine_by_layer(base, p)),
        ("divergence_curve", lambda p: divergence_curve(*_divergence_points(r), p)),
        ("blind_spot", lambda p: blind_spot_figure(r.blind_spot, r.study.config.d_model, p)),
        ("timing", lambda p: timing_bars(r.timing, p)),
    ]
    if r.sweep is not None:
        jobs.append(("sweep", lambda p: sweep_figure(r.sweep, p)))
    if r.training is not None:
        jobs.append(("trained_mu_sigma", lambda p: trained_mu_sigma(r.training, p)))
    if r.swap is not None:
        jobs.append(("swap", lambda p: swap_figure(r.swap, p)))
    if r.inspected is not None:
        jobs.append(("model_layers", lambda p: inspect_layers(r.inspected, p)))
    if r.real is not None and real_figures.measured(r.real):
        jobs.append(("real_ratio", lambda p: real_figures.ratio_by_block(r.real, p)))
        jobs.append(("real_largest", lambda p: real_figures.largest_by_block(r.real, p)))
        jobs.append(("real_predictor", lambda p: real_figures.predictor_scatter(r.real, p)))
    files = {}
    fig_dir.mkdir(parents=True, exist_ok=True)
    with progress.task("report: figures", total=len(jobs)) as advance:
        for name, job in jobs:
            files[name] = job(fig_dir / f"{name}.png")
            advance()
    return files


def write_report(r: ReportResults, out: str | Path = "report", progress=None) -> dict:
    """The figures, ``report.md``, ``report.html`` and ``report.json`` into ``out``; returns the
    summary dict (``report.json``'s content) with the list of files under ``"files"``."""
    t_start = time.perf_counter()
    out = Path(out)
    files = write_figures(r, out / "figures", progress)
    r.seconds["figures"] = time.perf_counter() - t_start
    r.seconds["total_before_pages"] = r.seconds.get("runs", 0.0) + r.seconds["figures"]
    r.provenance.finish()
    summary = r.to_dict()
    page = report_page(summary, files)
    files["report.md"] = out / "report.md"
    write_text(page.markdown(out), files["report.md"])
    files["report.html"] = out / "report.html"
    write_text(page.html(), files["report.html"])
    summary["seconds"]["total"] = r.seconds.get("runs", 0.0) + time.perf_counter() - t_start
    summary["files"] = {k: str(v.relative_to(out)) for k, v in files.items()}
    summary["files"]["report.json"] = "report.json"
    write_json(summary, out / "report.json")
    return summary


def build_report(cfg: ReportConfig, out: str | Path = "report", progress=None) -> dict:
    """Run everything in ``cfg`` (:func:`~rmsnorm.lab.report.run.run_report`) and write the report
    into ``out`` (:func:`write_report`); returns the summary dict (also written as
    ``report.json``) with the list of files under ``"files"``."""
    return write_report(run_report(cfg, progress), out, progress)
