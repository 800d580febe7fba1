"""What the report writes, all from one :class:`~.run.ReportResults`: its figures (its own three,
the divergence curve, the (σ, μ) plane and the timing bars, beside those of the simulation and the
inspection), ``report.md``, the self-contained ``report.html`` and ``report.json``."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ..figures import pyplot, save_figure
from ..inspection import inspect_layers
from ..io import write_json
from ..progress import ensure
from ..simulation import cosine_by_layer, mean_histograms, ratio_by_layer
from .prose import report_page
from .run import ReportResults

__all__ = ["divergence_curve", "sigma_mu_plane", "timing_bars", "write_figures", "write_report"]


def divergence_curve(points: list[dict], path: Path) -> Path:
    """cos(LN, RMSNorm) = 1/sqrt(1 + r²) against r = |μ|/σ: the analytic curve, with each layer of a
    run as a point (``points``: dicts with ``label``, ``r`` (per-token |μ|/σ), ``cos`` (per-token
    measured cosine), ``group``). Left: the whole curve, linear cosine; right: 1 − cos on log-log
    axes, where the curve is r²/2 for small r."""
    plt = pyplot()
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
    return save_figure(fig, path)


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
    return save_figure(fig, path)


def timing_bars(timing: dict, path: Path) -> Path:
    """Forward+backward time per shape for RMSNorm and LayerNorm, this library and torch."""
    plt = pyplot()
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
    return save_figure(fig, path)


def _divergence_points(r: ReportResults) -> list[dict]:
    """Each layer of each run as a point of the divergence curve (the first run also with its
    tokens' measured cosine)."""
    base, cfg = r.simulation, r.config
    points = [
        {
            "label": n,
            "group": "simulated, init",
            "r": base.init.ratio[i],
            "cos": base.init.measured_cosine[i],
        }
        for i, n in enumerate(base.layer_names)
    ]
    if r.planted is not None:
        points += [
            {
                "label": n,
                "group": f"planted mean {cfg.planted_mean:g}",
                "r": r.planted.init.ratio[i],
            }
            for i, n in enumerate(r.planted.layer_names)
        ]
    if r.trained is not None:
        points += [
            {"label": n, "group": "small model, trained", "r": r.trained.trained.ratio[i]}
            for i, n in enumerate(r.trained.layer_names)
        ]
    if r.inspected is not None:
        for layer in r.inspected["layers"]:
            q = layer["mu_over_sigma"]["q50"]
            if q is not None:
                points.append(
                    {
                        "label": layer["name"],
                        "group": f"model {r.inspected['model']}",
                        "r": torch.tensor([q], dtype=torch.float64),
                    }
                )
    return points


def write_figures(r: ReportResults, fig_dir: Path, progress=None) -> dict[str, Path]:
    """Every figure the report shows, into ``fig_dir``; returns {name: path}."""
    progress = ensure(progress)
    base, planted, trained = r.simulation, r.planted, r.trained
    plane_panels = [("simulated transformer at init (centered)", base.init)]
    if planted is not None:
        plane_panels.append((f"same model, planted mean {r.config.planted_mean:g}", planted.init))
    extra = {"planted": planted.init} if planted is not None else None
    jobs = [
        ("mean_histograms", lambda p: mean_histograms(base, p)),
        ("ratio_by_layer", lambda p: ratio_by_layer(base, p, extra)),
        ("cosine_by_layer", lambda p: cosine_by_layer(base, p, extra)),
        ("divergence_curve", lambda p: divergence_curve(_divergence_points(r), p)),
        ("sigma_mu_plane", lambda p: sigma_mu_plane(plane_panels, p)),
        ("timing", lambda p: timing_bars(r.timing, p)),
    ]
    if trained is not None:
        jobs += [
            ("trained_mean_histograms", lambda p: mean_histograms(trained, p, "trained")),
            ("trained_ratio_by_layer", lambda p: ratio_by_layer(trained, p)),
        ]
    if r.inspected is not None:
        jobs.append(("model_layers", lambda p: inspect_layers(r.inspected, p)))
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
    r.seconds["total_before_pages"] = r.seconds.get("runs", 0.0) + time.perf_counter() - t_start
    page = report_page(r, files)
    files["report.md"] = out / "report.md"
    files["report.md"].write_text(page.markdown(out))
    files["report.html"] = out / "report.html"
    files["report.html"].write_text(page.html())
    r.seconds["total"] = r.seconds.get("runs", 0.0) + time.perf_counter() - t_start
    summary = r.to_dict()
    summary["files"] = {k: str(v.relative_to(out)) for k, v in files.items()}
    summary["files"]["report.json"] = "report.json"
    write_json(summary, out / "report.json")
    return summary
