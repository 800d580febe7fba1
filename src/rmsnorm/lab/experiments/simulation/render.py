"""The simulation's figures and files: per-layer histograms of the token means (the chapter's
figure), |μ|/σ per layer against i.i.d. Gaussian rows, the LayerNorm-vs-RMSNorm cosine per layer,
and ``simulation.json``. Each figure has a title, labelled axes with units and a legend."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ...._progress import ensure
from ...figures import layer_ticks, legend_below, pyplot, save_figure
from ...io import write_json
from ...models.transformer import NORM_NAMES
from ...stats.iid import iid_reference
from ...stats.rows import median
from .run import SimulationResult

__all__ = [
    "seed_ratio_by_layer",
    "iid_lines",
    "decomposition_figure",
    "write_seed_study",
    "mean_histograms",
    "ratio_by_layer",
    "ratio_by_layer_figure",
    "cosine_by_layer",
    "write_simulation",
]

STAGE_COLORS = {"init": "#1f77b4", "trained": "#d62728", "planted": "#ff7f0e"}

# The norms' names where they qualify "transformer" in a title: no norm is "norm-free".
NORM_ADJECTIVES = {**NORM_NAMES, "none": "norm-free"}
INPUT_NAMES = {"tokens": "random tokens", "gaussian": "Gaussian embeddings", "text": "text"}


def _describe(cfg) -> str:
    text = (
        f"{cfg.n_layers}-layer {cfg.norm_position}-norm {NORM_ADJECTIVES[cfg.norm]} transformer, "
        f"d = {cfg.d_model}, {INPUT_NAMES[cfg.resolved_inputs]}"
    )
    return text + (f", planted mean {cfg.planted_mean:g}" if cfg.planted_mean else "")


def mean_histograms(result, path: Path, stage: str = "init") -> Path:
    """The chapter's figure: one panel per layer, the histogram over tokens of the per-token mean μ
    of the residual stream, with that layer's average σ and median |μ|/σ in the panel title."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    st = result.stages[stage]
    n = st.mean.shape[0]
    ncols = min(5, n)
    nrows = math.ceil(n / ncols)
    height = 2.4 * nrows + 1.7
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(3.0 * ncols, height), sharex=True, squeeze=False
    )
    # fixed margins: constrained layout took seconds on this many panels
    fig.subplots_adjust(
        left=0.06,
        right=0.98,
        top=1 - 1.05 / height,  # room for the two-line suptitle above the panel titles
        bottom=0.85 / height,
        hspace=0.45,
        wspace=0.28,
    )
    lim = float(st.mean.abs().max()) * 1.05 or 1.0
    bins = torch.linspace(-lim, lim, 41).tolist()
    color = STAGE_COLORS.get(stage, "#1f77b4")
    for i in range(nrows * ncols):
        ax = axes[i // ncols][i % ncols]
        if i >= n:
            ax.axis("off")
            continue
        mu = st.mean[i]
        # one step artist per panel instead of 40 bar patches
        counts = torch.histogram(mu, bins=torch.tensor(bins, dtype=mu.dtype)).hist
        ax.stairs(
            counts.numpy(),
            bins,
            fill=True,
            color=color,
            alpha=0.8,
            label=f"μ of the {mu.numel()} tokens",
        )
        ax.set_ylim(0, max(1.0, float(counts.max())) * 1.1)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.axvline(0.0, color="black", lw=0.8, ls="--", label="μ = 0")
        ratio = median(st.ratio[i])
        ax.set_title(
            f"{result.layer_names[i]}\nσ̄ = {float(st.std[i].mean()):.3g}, "
            f"median |μ|/σ = {ratio:.3g}",
            fontsize=8,
        )
        ax.tick_params(labelsize=7)
        if i % ncols == 0:
            ax.set_ylabel("tokens (count)", fontsize=8)
        if i // ncols == nrows - 1 or i + ncols >= n:
            ax.set_xlabel("per-token mean μ (activation units)", fontsize=8)
            ax.tick_params(labelbottom=True)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", fontsize=8, ncol=2)
    title = f"Per-token mean of the residual stream at each layer ({stage})"
    return save_figure(fig, path, f"{title}\n{_describe(result.config)}")


IID_LABEL = "i.i.d. Gaussian rows"


def iid_lines(ax, ref, band: bool = True) -> None:
    """|μ|/σ of rows of ``ref.d`` i.i.d. Gaussian entries (``ref``: an
    :class:`~rmsnorm.lab.stats.iid.IIDReference`) as grey lines on ``ax``: its median, dotted, and
    with ``band`` its 5% and 95% points, dash-dotted; labelled with their values."""
    median_label = f"{IID_LABEL}, d = {ref.d}: median {ref.median:.3g}"
    ax.axhline(ref.median, color="gray", ls=":", lw=1.6, label=median_label)
    if band:
        band_label = f"{IID_LABEL}: 5% and 95% ({ref.q05:.3g}, {ref.q95:.3g})"
        ax.axhline(ref.q05, color="gray", ls="-.", lw=1.0, label=band_label)
        ax.axhline(ref.q95, color="gray", ls="-.", lw=1.0)


def ratio_by_layer_figure(result, extra: dict | None = None):
    """The figure of :func:`ratio_by_layer`, not yet saved (a matplotlib Figure)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 6.2), layout="constrained")
    stages = dict(result.stages)
    stages.update(extra or {})
    for name, st in stages.items():
        r = st.ratio
        r = torch.where(torch.isfinite(r), r, torch.nan)
        q = torch.nanquantile(r, torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=r.dtype), dim=1)
        x = list(range(r.shape[0]))
        c = STAGE_COLORS.get(name, None)
        ax.fill_between(x, q[0], q[4], color=c, alpha=0.15, label=f"{name}: 5–95% of tokens")
        ax.fill_between(x, q[1], q[3], color=c, alpha=0.3, label=f"{name}: 25–75%")
        ax.plot(x, q[2], color=c, marker="o", ms=3, label=f"{name}: median")
    # The same statistics of rows of d i.i.d. Gaussian entries: median against median, band
    # against band (not the i.i.d. mean, which is about 1.2× the median).
    iid_lines(ax, iid_reference(result.config.d_model))
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="|μ| = σ (cos = 0.707)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(result.layer_names)))
    ax.set_xticklabels(["emb"] + [str(i) for i in range(1, len(result.layer_names))], fontsize=8)
    ax.set_xlabel("residual stream after layer (emb = embedding, then block number)")
    ax.set_ylabel("|μ| / σ per token (dimensionless, log scale)")
    ax.set_title(f"How far each token is from centered\n{_describe(result.config)}", fontsize=10)
    fig.legend(loc="outside lower center", fontsize=7, ncol=2, frameon=False)
    ax.grid(alpha=0.3, which="both")
    return fig


def ratio_by_layer(result, path: Path, extra: dict | None = None) -> Path:
    """|μ|/σ per layer: the median and the 5–95% and 25–75% bands over tokens for each stage
    (plus ``extra`` stages, e.g. a planted-mean run), against the median and the 5% and 95%
    points of the same statistic for rows of d i.i.d. Gaussian entries
    (:func:`~rmsnorm.lab.stats.iid.iid_reference`)."""
    return save_figure(ratio_by_layer_figure(result, extra), path)


def cosine_by_layer(result, path: Path, extra: dict | None = None) -> Path:
    """The predicted LN-vs-RMS cosine σ/RMS per layer, drawn as 1 − cos on a log axis (cos is
    within 1e-2 of 1 when rows are centered): mean and worst 5% of tokens, with the measured cosine
    of the actual outputs as markers."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 6.2), layout="constrained")
    stages = dict(result.stages)
    stages.update(extra or {})
    floor = 1e-12
    for name, st in stages.items():
        gap = (1 - st.cosine).clamp_min(floor)
        x = list(range(gap.shape[0]))
        c = STAGE_COLORS.get(name, None)
        ax.plot(
            x,
            gap.mean(dim=1),
            color=c,
            marker="o",
            ms=3,
            label=f"{name}: mean over tokens of 1 − σ/RMS (predicted)",
        )
        ax.plot(
            x,
            torch.quantile(gap, 0.95, dim=1),
            color=c,
            ls="--",
            label=f"{name}: 95th percentile (predicted)",
        )
        meas = (1 - st.measured_cosine).clamp_min(floor).mean(dim=1)
        ax.plot(
            x,
            meas,
            color=c,
            ls="none",
            marker="x",
            ms=7,
            label=f"{name}: mean 1 − cos of the actual outputs (measured)",
        )
    d = result.config.d_model
    if d > 3:  # E[1 − cos] for i.i.d. Gaussian rows: E[(μ/σ)²]/2 = 1/(2(d − 3))
        ax.axhline(
            1 / (2 * (d - 3)),
            color="gray",
            ls=":",
            lw=1.5,
            label=f"i.i.d. Gaussian rows, d = {d}: mean 1 − cos ≈ 1/(2(d − 3))",
        )
    ax.set_yscale("log")
    ax.set_xticks(range(len(result.layer_names)))
    ax.set_xticklabels(["emb"] + [str(i) for i in range(1, len(result.layer_names))], fontsize=8)
    ax.set_xlabel("residual stream after layer (emb = embedding, then block number)")
    ax.set_ylabel("1 − cos(LayerNorm(x), RMSNorm(x))  (log scale)")
    ax.set_title(
        "How far RMSNorm's output turns from LayerNorm's, per layer (cos = σ/RMS)\n"
        + _describe(result.config),
        fontsize=10,
    )
    fig.legend(loc="outside lower center", fontsize=7, ncol=2, frameon=False)
    ax.grid(alpha=0.3, which="both")
    return save_figure(fig, path)


def seed_ratio_by_layer(study, path: Path) -> Path:
    """Median |μ|/σ per layer for every seed (thin lines), their median and min–max band across
    seeds, the first seed's 5–95% band over tokens, and the i.i.d. Gaussian median and 5–95%
    points at the same width."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 6.2), layout="constrained")
    names = study.layer_names
    x = list(range(len(names)))
    first = study.results[0].init.ratio
    first = torch.where(torch.isfinite(first), first, torch.nan)
    q = torch.nanquantile(first, torch.tensor([0.05, 0.95], dtype=first.dtype), dim=1)
    ax.fill_between(
        x,
        q[0],
        q[1],
        color="#1f77b4",
        alpha=0.10,
        label=f"seed {study.seeds[0]}: 5–95% of its tokens",
    )
    for j, s in enumerate(study.summaries):
        ax.plot(
            x,
            s.median_ratio,
            color="#1f77b4",
            lw=0.7,
            alpha=0.45,
            label="each seed: median over its tokens" if j == 0 else None,
        )
    band = study.band("median_ratio")
    ax.fill_between(
        x,
        band["min"],
        band["max"],
        color="#1f77b4",
        alpha=0.30,
        label=f"min–max of the per-seed medians ({len(study.seeds)} seeds)",
    )
    ax.plot(x, band["median"], color="#0b3d91", marker="o", ms=4, lw=2, label="median over seeds")
    iid_lines(ax, study.reference)
    ax.set_yscale("log")
    layer_ticks(ax, names)
    ax.set_ylabel("|μ| / σ per token (dimensionless, log scale)")
    cfg = study.config
    ax.set_title(
        f"How far the tokens are from centered, over {len(study.seeds)} seeds\n"
        f"{cfg.n_layers}-layer {cfg.norm_position}-norm {NORM_ADJECTIVES[cfg.norm]} "
        f"transformer, {cfg.activation}, d = {cfg.d_model}, {study.tokens_per_layer} random "
        "tokens per seed",
        fontsize=10,
    )
    ax.grid(alpha=0.3, which="both")
    legend_below(fig, ax)
    return save_figure(fig, path)


def decomposition_figure(study, sweep, path: Path) -> Path:
    """Left: the token-shared part's share of E[μ²] per layer (median over seeds, min–max band),
    for the default GELU network and the other activations of the sweep. Right: per seed, the
    last layer's token-shared offset m̄ against the part of it the MLPs wrote (the diagonal: all
    of it)."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12.5, 5.6), layout="constrained")
    studies = [("GELU (default)", study)]
    if sweep is not None:
        studies += [(c.label, c.study) for c in sweep.group("activation") if c.label != "GELU"]
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    markers = ["o", "s", "^", "D"]
    names = study.layer_names
    x = list(range(len(names)))
    lim = 0.0
    for k, (label, st) in enumerate(studies):
        if len(st.layer_names) != len(names):
            continue
        band = st.band("shared_share")
        c = colors[k % len(colors)]
        ax0.fill_between(
            x, [100 * v for v in band["min"]], [100 * v for v in band["max"]], color=c, alpha=0.15
        )
        ax0.plot(
            x,
            [100 * v for v in band["median"]],
            color=c,
            marker=markers[k % 4],
            ms=4,
            label=f"{label}: median over seeds (band: min–max)",
        )
        pts = [(s.last_from_mlp, s.shared_mean[-1]) for s in st.summaries]
        if pts[0][0] is not None:
            ax1.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                markers[k % 4],
                color=c,
                ms=6,
                mec="black",
                mew=0.4,
                ls="none",
                label=f"{label}: one seed",
            )
            lim = max(lim, *(abs(v) for p in pts for v in p))
    layer_ticks(ax0, names)
    ax0.set_ylabel("token-shared share of E[μ²] (%)")
    ax0.set_ylim(0, 100)
    ax0.set_title("How much of μ is one offset every token shares", fontsize=10)
    ax0.grid(alpha=0.3)
    lim = 1.1 * lim or 1.0
    ax1.plot(
        [-lim, lim],
        [-lim, lim],
        color="black",
        lw=0.8,
        ls="--",
        label="m̄ = MLPs' part (the MLPs wrote all of it)",
    )
    ax1.axhline(0, color="gray", lw=0.5)
    ax1.axvline(0, color="gray", lw=0.5)
    ax1.set_xlim(-lim, lim)
    ax1.set_ylim(-lim, lim)
    ax1.set_aspect("equal")
    ax1.xaxis.set_major_locator(MaxNLocator(5))  # long tick labels of a square panel: fewer
    ax1.set_xlabel("part written by the MLPs, Σ mean(W₂·ā + b₂) (activation units)")
    ax1.set_ylabel(f"token-shared offset m̄ at {names[-1]} (activation units)")
    ax1.set_title("Where the last layer's offset comes from, one point per seed", fontsize=10)
    ax1.grid(alpha=0.3)
    handles = ax0.get_legend_handles_labels()[0] + ax1.get_legend_handles_labels()[0]
    legend_below(fig, ax0, ncol=3, handles=handles)
    cfg = study.config
    return save_figure(
        fig,
        path,
        f"The token-shared part of μ: {cfg.n_layers}-layer {cfg.norm_position}-norm "
        f"{NORM_ADJECTIVES[cfg.norm]} transformer, d = {cfg.d_model}, at initialization",
    )


def write_simulation(result: SimulationResult, out: str | Path, progress=None) -> dict[str, Path]:
    """The figures and ``simulation.json`` into ``out``; returns {name: path}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    progress = ensure(progress)
    files = {}
    jobs = [
        ("mean_histograms", mean_histograms),
        ("ratio_by_layer", ratio_by_layer),
        ("cosine_by_layer", cosine_by_layer),
    ]
    with progress.task("simulate: figures", total=len(jobs)) as advance:
        for name, fn in jobs:
            files[name] = fn(result, out / f"{name}.png")
            advance()
    files["json"] = write_json(result.to_dict(), out / "simulation.json")
    return files


def write_seed_study(study, out: str | Path, progress=None) -> dict[str, Path]:
    """A :class:`~rmsnorm.lab.experiments.simulation.seeds.SeedStudy`'s figures (|μ|/σ per layer
    over seeds, the token-shared part of μ) and ``seeds.json`` into ``out``; returns {name:
    path}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    progress = ensure(progress)
    files = {}
    jobs = [
        ("ratio_by_layer_seeds", lambda p: seed_ratio_by_layer(study, p)),
        ("decomposition", lambda p: decomposition_figure(study, None, p)),
    ]
    with progress.task("simulate: seed figures", total=len(jobs)) as advance:
        for name, job in jobs:
            files[name] = job(out / f"{name}.png")
            advance()
    files["seeds_json"] = write_json(study.to_dict(), out / "seeds.json")
    return files
