"""The simulation's figures and files: per-layer histograms of the token means (the chapter's
figure), |μ|/σ per layer against i.i.d. Gaussian rows, the LayerNorm-vs-RMSNorm cosine per layer,
and ``simulation.json``. Each figure has a title, labelled axes with units and a legend."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..figures import pyplot, save_figure
from ..iid import iid_reference
from ..io import write_json
from ..progress import ensure
from .run import SimulationResult

__all__ = [
    "mean_histograms",
    "ratio_by_layer",
    "ratio_by_layer_figure",
    "cosine_by_layer",
    "write_simulation",
]

STAGE_COLORS = {"init": "#1f77b4", "trained": "#d62728", "planted": "#ff7f0e"}

NORM_NAMES = {
    "layernorm": "LayerNorm",
    "rmsnorm": "RMSNorm",
    "prmsnorm": "pRMSNorm",
    "none": "norm-free",
}
INPUT_NAMES = {"tokens": "random tokens", "gaussian": "Gaussian embeddings", "text": "text"}


def _describe(cfg) -> str:
    text = (
        f"{cfg.n_layers}-layer {cfg.norm_position}-norm {NORM_NAMES[cfg.norm]} transformer, "
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
        ratio = float(st.ratio[i].nanmedian())
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
    fig.suptitle(f"{title}\n{_describe(result.config)}", fontsize=11)
    return save_figure(fig, path)


IID_LABEL = "i.i.d. Gaussian rows"


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
    d = result.config.d_model
    ref = iid_reference(d)
    median_label = f"{IID_LABEL}, d = {d}: median {ref.median:.3f}"
    band_label = f"{IID_LABEL}, d = {d}: 5% and 95% ({ref.q05:.2g}, {ref.q95:.3f})"
    ax.axhline(ref.median, color="gray", ls=":", lw=1.5, label=median_label)
    ax.axhline(ref.q05, color="gray", ls="-.", lw=1.0, label=band_label)
    ax.axhline(ref.q95, color="gray", ls="-.", lw=1.0)
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
    (:func:`~rmsnorm.lab.iid.iid_reference`)."""
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
