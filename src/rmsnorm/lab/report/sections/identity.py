"""The identity RMS² = σ² + μ²: its check on every row of the simulation and of an inspected model
(:func:`data`), the (σ, μ) plane that shows it as geometry (:func:`figures`, drawn by
:func:`sigma_mu_plane`), and its words."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...figures import pyplot, save_figure
from ...page import Page

if TYPE_CHECKING:
    from ..run import ReportResults


def data(r: ReportResults) -> dict:
    """``identity``: RMS² = σ² + μ² on every row of every seed (the run's
    :func:`~rmsnorm.lab.experiments.simulation.seeds.identity_over_seeds`), and on every norm input
    of the inspected model when there is one."""
    identity = dict(r.identity)
    if r.inspected is not None:
        identity["model_max_rel_error"] = max(
            layer["identity_max_rel_error"] for layer in r.inspected["layers"]
        )
    return {"identity": identity}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``sigma_mu_plane``: the first seed's tokens in the (σ, μ) plane."""
    base = r.simulation
    panel = (f"simulated transformer at init (seed {base.config.seed})", base.init)
    return {"sigma_mu_plane": sigma_mu_plane([panel], out / "sigma_mu_plane.png")}


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


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    page.h2("The identity RMS² = σ² + μ²")
    ident = j["identity"]
    text = (
        f"Checked on {ident['rows']:,} rows (every token at every layer of every seed of the "
        "simulation, μ and σ computed two-pass in float64, RMS directly): largest relative error "
        f"**{ident['max_rel_error']:.1e}**, i.e. rounding — a check of the code, not evidence."
    )
    if "model_max_rel_error" in ident:
        text += (
            f" On the inputs of every norm layer of {j['model']['model']}: "
            f"{ident['model_max_rel_error']:.1e}."
        )
    page.p(text)
    page.p(
        "Read it as geometry: put each row at the point (σ, μ). LayerNorm divides the row by the "
        "point's horizontal coordinate σ, RMSNorm by its distance from the origin RMS; the angle "
        "θ of the point above the σ axis has cos θ = σ/RMS, which is exactly the cosine between "
        "the two outputs. Centered rows lie on the σ axis, where the two divisors coincide."
    )
    page.figure(
        figures["sigma_mu_plane"],
        "Each token of three layers as a point (σ, μ). Dashed: circles of constant RMS. The "
        "starred token shows the two divisors (blue σ, red RMS) and the angle θ between them.",
    )
