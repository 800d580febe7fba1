"""The lab's figures, each a PNG with a title, labelled axes (with units) and a legend. Every
function takes results, writes one file and returns its path; matplotlib is imported lazily with the
non-interactive Agg backend."""

from __future__ import annotations

import math
from pathlib import Path

import torch

__all__ = [
    "mean_histograms",
    "ratio_by_layer",
    "cosine_by_layer",
    "divergence_curve",
    "sigma_mu_plane",
    "timing_bars",
    "inspect_layers",
]

STAGE_COLORS = {"init": "#1f77b4", "trained": "#d62728", "planted": "#ff7f0e"}
DPI = 110


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    _plt().close(fig)
    return path


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
    plt = _plt()
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
    return _save(fig, path)


def ratio_by_layer(result, path: Path, extra: dict | None = None) -> Path:
    """|μ|/σ per layer: the median and the 5–95% and 25–75% bands over tokens for each stage
    (plus ``extra`` stages, e.g. a planted-mean run), against the level i.i.d. Gaussian rows give,
    E|μ|/σ ≈ sqrt(2/(π d))."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.2), layout="constrained")
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
    d = result.config.d_model
    ax.axhline(
        math.sqrt(2 / (math.pi * d)),
        color="gray",
        ls=":",
        label=f"i.i.d. Gaussian row, d={d}: √(2/(πd)) = {math.sqrt(2 / (math.pi * d)):.3f}",
    )
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="|μ| = σ (cos = 0.707)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(result.layer_names)))
    ax.set_xticklabels(["emb"] + [str(i) for i in range(1, len(result.layer_names))], fontsize=8)
    ax.set_xlabel("residual stream after layer (emb = embedding, then block number)")
    ax.set_ylabel("|μ| / σ per token (dimensionless, log scale)")
    ax.set_title(f"How far each token is from centered\n{_describe(result.config)}", fontsize=10)
    ax.legend(fontsize=7, loc="best", ncol=2)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def cosine_by_layer(result, path: Path, extra: dict | None = None) -> Path:
    """The predicted LN-vs-RMS cosine σ/RMS per layer, drawn as 1 − cos on a log axis (cos is
    within 1e-2 of 1 when rows are centered): mean and worst 5% of tokens, with the measured cosine
    of the actual outputs as markers."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.2), layout="constrained")
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
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def divergence_curve(points: list[dict], path: Path) -> Path:
    """cos(LN, RMSNorm) = 1/sqrt(1 + r²) against r = |μ|/σ: the analytic curve, with each layer of a
    run as a point (``points``: dicts with ``label``, ``r`` (per-token |μ|/σ), ``cos`` (per-token
    measured cosine), ``group``). Left: the whole curve, linear cosine; right: 1 − cos on log-log
    axes, where the curve is r²/2 for small r."""
    plt = _plt()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 5.2), layout="constrained")
    r = torch.logspace(-4, 1.5, 400, dtype=torch.float64)
    cos = 1 / torch.sqrt(1 + r * r)
    ax0.plot(r, cos, color="black", lw=1.5, label="analytic: 1/√(1 + (μ/σ)²)")
    ax1.plot(r, 1 - cos, color="black", lw=1.5, label="analytic: 1 − 1/√(1 + (μ/σ)²)")
    cmap = plt.get_cmap("viridis")
    groups = list(dict.fromkeys(p["group"] for p in points))
    tokens_drawn = False
    markers = ["o", "s", "^", "D", "v"]
    for gi, group in enumerate(groups):
        pts = [p for p in points if p["group"] == group]
        for j, p in enumerate(pts):
            rr = p["r"][torch.isfinite(p["r"])]
            if rr.numel() == 0:
                continue
            rmed = float(rr.median())
            cmed = 1 / math.sqrt(1 + rmed * rmed)
            color = cmap(j / max(1, len(pts) - 1))
            kw = {
                "marker": markers[gi % len(markers)],
                "color": color,
                "ms": 6,
                "mec": "black",
                "mew": 0.5,
                "ls": "none",
            }
            label = f"{group}: median token per layer (colour = depth)" if j == 0 else None
            ax0.plot([rmed], [cmed], label=label, **kw)
            ax1.plot([rmed], [1 - cmed], label=label, **kw)
            if not tokens_drawn and "cos" in p:
                tokens_drawn = True
                # every token, measured from the two outputs: they sit on the curve
                c = p["cos"][torch.isfinite(p["r"])]
                ax1.plot(
                    rr,
                    (1 - c).clamp_min(1e-16),
                    ".",
                    color="gray",
                    ms=1.5,
                    alpha=0.4,
                    label=f"{group}, {p['label']}: every token (measured cosine)",
                )
    for ax in (ax0, ax1):
        ax.set_xscale("log")
        ax.set_xlabel("|μ| / σ of the row (dimensionless, log scale)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
    ax0.axvline(1.0, color="gray", ls=":", lw=0.8)
    ax0.set_ylabel("cos(LayerNorm(x), RMSNorm(x))")
    ax0.set_title("The divergence curve: cosine between the two outputs", fontsize=10)
    ax1.set_yscale("log")
    ax1.set_ylim(1e-9, 2)
    ax1.set_ylabel("1 − cos  (log scale)")
    ax1.set_title("Zoom on the centered end: 1 − cos ≈ (μ/σ)²/2", fontsize=10)
    return _save(fig, path)


def sigma_mu_plane(panels: list[tuple[str, object]], path: Path, layers: list[int] | None = None):
    """Each token as a point (σ, μ). LayerNorm divides a row by its horizontal coordinate σ,
    RMSNorm by its distance from the origin RMS = sqrt(σ² + μ²); the angle θ of the point above
    the σ axis has cos θ = σ/RMS, the cosine between the two outputs. Dashed circles are rows of
    equal RMS. ``panels``: (title, StageStats) pairs, drawn with equal axis scales."""
    plt = _plt()
    from matplotlib.patches import Arc

    fig, axes = plt.subplots(
        2,
        len(panels),
        figsize=(6.2 * len(panels), 7.6),
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
        # the geometry on the token with the largest angle
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
    fig.suptitle(
        "The (σ, μ) plane: LayerNorm divides by the horizontal coordinate, "
        "RMSNorm by the distance from the origin",
        fontsize=11,
    )
    return _save(fig, path)


def timing_bars(timing: dict, path: Path) -> Path:
    """Forward+backward time per shape for RMSNorm and LayerNorm, this library and torch."""
    plt = _plt()
    rows = timing["results"]
    shapes = list(dict.fromkeys(r["shape_name"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    width = 0.8 / len(impls)
    colors = ["#d62728", "#1f77b4", "#ff9896", "#aec7e8"]
    for j, impl in enumerate(impls):
        ys = []
        for s in shapes:
            match = [r["median_ms"] for r in rows if r["shape_name"] == s and r["impl"] == impl]
            ys.append(match[0] if match else 0.0)
        xs = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(shapes))]
        bars = ax.bar(xs, ys, width, label=impl, color=colors[j % len(colors)])
        ax.bar_label(bars, fmt="%.2g", fontsize=7)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, fontsize=8)
    ax.set_ylabel("forward + backward time, median (ms)")
    ax.set_xlabel("input shape (rows × hidden size), " + timing["dtype"])
    ax.set_title(f"RMSNorm vs LayerNorm, forward + backward\n{timing['machine']}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def inspect_layers(result: dict, path: Path) -> Path:
    """Per norm layer of an inspected model: |μ|/σ of its input (median with 5–95% bars) and the
    predicted 1 − cos between LayerNorm and RMSNorm outputs."""
    plt = _plt()
    layers = result["layers"]
    x = list(range(len(layers)))

    def col(key, q):
        return [float("nan") if v[key][q] is None else v[key][q] for v in layers]

    med, lo, hi = (
        col("mu_over_sigma", "q50"),
        col("mu_over_sigma", "q05"),
        col("mu_over_sigma", "q95"),
    )
    gap = [max(1e-12, 1 - c) for c in col("predicted_cosine", "mean")]
    fig, (ax0, ax1) = plt.subplots(
        2, 1, figsize=(max(8, 0.3 * len(x)), 7), sharex=True, layout="constrained"
    )
    ax0.errorbar(
        x,
        med,
        yerr=[
            [m - a for m, a in zip(med, lo, strict=True)],
            [b - m for m, b in zip(med, hi, strict=True)],
        ],
        fmt="o",
        ms=4,
        capsize=2,
        label="median over tokens, bars 5–95%",
    )
    ax0.axhline(1.0, color="black", lw=0.8, ls="--", label="|μ| = σ")
    ax0.set_yscale("log")
    ax0.set_ylabel("|μ| / σ of the input (log)")
    ax0.legend(fontsize=8)
    ax0.grid(alpha=0.3, which="both")
    ax1.plot(x, gap, "s-", ms=4, color="#d62728", label="mean over tokens of 1 − σ/RMS")
    ax1.set_yscale("log")
    ax1.set_ylabel("1 − cos(LN, RMSNorm) (log)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3, which="both")
    names = [v["name"] for v in layers]
    if len(x) <= 40:
        ax1.set_xticks(x)
        ax1.set_xticklabels(names, rotation=70, ha="right", fontsize=7)
    ax1.set_xlabel("norm layer (in model order)")
    fig.suptitle(
        f"Norm layers of {result['model']}: centering of their inputs\n{result['inputs']}",
        fontsize=10,
    )
    return _save(fig, path)
