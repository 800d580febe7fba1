"""How far the two norms' outputs diverge as |μ|/σ grows, and what ε and β change: the curve at
a few ratios (:func:`derivations`) beside the conventions measured on the simulation and a worked ε
example (:func:`data`; both measured by :mod:`rmsnorm.lab.experiments.conventions`), the figure
of the curve with every measured point on it (:func:`figures`), and the words."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...figures import legend_below, pyplot, save_figure
from ...models.transformer import NORM_NAMES
from ...page import Page
from ...stats.rows import median
from .common import chapter, fmt, range_text

if TYPE_CHECKING:
    from ..run import ReportResults


def derivations() -> dict:
    """The divergence curve at a few r = |μ|/σ: cos = 1/√(1 + r²) and the share of cosine lost."""
    rs = [0.1, 0.3, 1.0]
    cos = [1 / math.sqrt(1 + r * r) for r in rs]
    return {
        "r": rs,
        "cosine": cos,
        "cosine_loss_pct": [100 * (1 - c) for c in cos],
        "angle_deg_at_1": math.degrees(math.acos(cos[-1])),
    }


def data(r: ReportResults) -> dict:
    """``derivations`` (the curve at a few ratios), ``conventions`` (the ε placements and β measured
    on the simulation: :func:`~rmsnorm.lab.experiments.conventions.measure_conventions`) and
    ``eps_demo`` (the worked ε example: :func:`~rmsnorm.lab.experiments.conventions.eps_demo`)."""
    return {"derivations": derivations(), "conventions": r.conventions, "eps_demo": r.eps_demo}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``divergence_curve``: the curve with every run's layers on it."""
    return {
        "divergence_curve": divergence_curve(*divergence_points(r), out / "divergence_curve.png")
    }


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


def divergence_points(r: ReportResults) -> tuple[list[dict], dict]:
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


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    der = j["derivations"]
    page.h2("The divergence curve, ε, and β", key="divergence")
    page.p(
        "The cosine depends on nothing but r = |μ|/σ: cos = 1/√(1 + r²) ≈ 1 − r²/2 for small r. "
        f"So |μ|/σ = {der['r'][0]:g} costs {der['cosine_loss_pct'][0]:.1f}% of cosine, "
        f"{der['r'][1]:g} about {der['cosine_loss_pct'][1]:.0f}%, and at |μ| = σ the outputs are "
        f"{der['angle_deg_at_1']:.0f}° apart (cos {der['cosine'][2]:.3f}). Each layer of each run "
        "is a point on the curve; the grey dots are the first seed's embedding tokens with their "
        "measured cosine, which sit on the curve exactly."
    )
    page.figure(
        figures["divergence_curve"],
        "cos(LayerNorm, RMSNorm) against |μ|/σ; points: layers (colour: depth, shape: run).",
    )
    demo = j["eps_demo"]
    rows = []
    for case in demo["cases"]:
        for k in range(demo["rows"]):
            rows.append(
                [
                    fmt(case["eps"], "g"),
                    f"{case['mu_over_sigma'][k]:.3f}",
                    f"{case['cos_measured'][k]:.6f}",
                    f"{case['sq_dist_measured'][k]:.5f}",
                    f"{case['sq_dist_eps_free'][k]:.5f}",
                    f"{case['sq_dist_eps_aware'][k]:.5f}",
                ]
            )
    page.p(
        "ε does not move the cosine: with ε > 0 each output is its ε-free value times one positive "
        "number per row (a = σ/√(σ² + ε) for LayerNorm, b = RMS/√(RMS² + ε) for torch's RMSNorm). "
        "It does move the distance, to a² + b² − 2ab·σ/RMS, which the library predicts exactly. "
        f"{demo['rows']} rows of d = {demo['d']} with σ ≈ {demo['sigma']:g}:"
    )
    page.table(
        ["ε", "|μ|/σ", "cos (measured)", "‖Δ‖²/d measured", "2 − 2σ/RMS", "ε-aware prediction"],
        rows,
    )
    conv = j["conventions"]
    page.p(
        'The seeds write RMSNorm as x/(RMS + ε) (the paper\'s PyTorch code, `eps_mode="rms"`); '
        "torch and Hugging Face as x/√(mean(x²) + ε). ε is added to a quantity in units of x in "
        "the first and of x² in the second, so the same ε is not the same regularization: the ε′ "
        "of the first form that shrinks a row as much as ε in the second is √(RMS² + ε) − RMS ≈ "
        "ε/(2·RMS). Output scale of a centered row (predicted; measured from this library's "
        "outputs):"
    )
    page.table(
        [
            "ε",
            "row RMS",
            "LayerNorm",
            "x/√(mean(x²) + ε)",
            "x/(RMS + ε)",
            "measured",
            "ε′ equivalent in x/(RMS + ε)",
        ],
        [
            [
                fmt(e["eps"], "g"),
                fmt(e["rms"], "g"),
                f"{e['layernorm']:.5f}",
                f"{e['mean_square']:.5f}",
                f"{e['rms_mode']:.5f}",
                f"{e['measured_mean_square']:.5f} / {e['measured_rms_mode']:.5f}",
                f"{e['equivalent_rms_eps']:.2e}",
            ]
            for e in conv["eps_table"]
        ],
    )
    st = {s["eps"]: s for s in conv["stream"]}
    s5, s6 = st[1e-5], st[1e-6]
    page.p(
        f"On the simulated stream at initialization (seed {j['simulation']['seed0']['seed']}, "
        f"median RMS {s5['median_rms']:.4f}): at ε = {s5['eps']:g} LayerNorm shrinks the median "
        f"token by {s5['layernorm_shrink']:.2e}, x/√(mean(x²) + ε) by "
        f"{s5['mean_square_shrink']:.2e} and x/(RMS + ε) by {s5['rms_mode_shrink']:.2e}; at the "
        f"chapter's ε = {s6['eps']:g}: {s6['layernorm_shrink']:.2e}, "
        f"{s6['mean_square_shrink']:.2e} and {s6['rms_mode_shrink']:.2e}."
    )
    beta = conv["beta_mean_term_left_pct_init"]
    text = (
        f"β. {chapter(page)} says a network that learns β = μ undoes the centering. β is one "
        "vector per "
        "feature and μ one number per token, so it cannot: the least-squares β over tokens is the "
        "token-mean of RMSNorm(x) − LN(x), which removes only the token-shared part. Measured on "
        "the mean term (μ/RMS)·𝟙 of RMSNorm(x) = (σ/RMS)·LN(x) + (μ/RMS)·𝟙, the best β leaves "
        f"{range_text(beta, '.0f', '%')} of its energy (median {beta['median']:.0f}%) over the "
        "layers and seeds at initialization"
    )
    tr = j.get("training")
    if tr is not None:
        parts = [
            f"{range_text(p['beta_mean_term_left_pct'], '.0f', '%')} in the trained "
            f"{NORM_NAMES[n]} models"
            for n, p in tr["per_norm"].items()
        ]
        text += ", and " + " and ".join(parts) + " (blocks 1 to the last, all seeds)"
    page.p(text + ".")
