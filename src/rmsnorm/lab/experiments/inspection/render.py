"""What an inspection shows: the per-layer table on the terminal (rich) and the figure of the
centering of every norm layer's input."""

from __future__ import annotations

import math
from pathlib import Path

from ...figures import pyplot, save_figure
from .run import InspectResult

__all__ = ["render_table", "render_outlier_table", "inspect_layers", "kind_label", "kind_notes"]


def _fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec)


def kind_label(layer: dict) -> str:
    """LN or RMS; RMS→z (norm, then gate) or z→RMS (gate, then norm) where a gate entered; /G for
    G groups per row."""
    if layer["kind"] == "layernorm":
        return "LN"
    label = "RMS"
    if layer.get("gated_calls"):
        label = {"norm_then_gate": "RMS→z", "gate_then_norm": "z→RMS"}.get(layer["gate"], label)
    groups = layer.get("groups")
    return f"{label}/{groups}" if groups and groups > 1 else label


def kind_notes(layers: list[dict]) -> list[str]:
    """What the gated (RMS→z, z→RMS) and grouped (/G) labels of :func:`kind_label` mean, for the
    labels that occur among ``layers``, and why a layer has no swap."""
    lines = []
    labels = {kind_label(layer) for layer in layers}
    if any("z" in label for label in labels):
        lines.append(
            "RMS→z: y = RMS(x)·act(z), statistics of x, swap LN(x)·act(z); z→RMS: y = "
            "RMS(x·act(z)), statistics and swap of x·act(z)"
        )
    if any("/" in label for label in labels):
        lines.append("/G: G groups per row, each normalized alone: statistics and swap per group")
    for layer in layers:
        if layer.get("swap_error"):
            lines.append(f"{layer['name']}: no swap ({layer['swap_error']})")
    return lines


def _caption(result: InspectResult) -> str:
    classes = sorted({layer["class"] for layer in result.layers})
    lines = [f"norm classes: {', '.join(classes)}; swap: LN→RMS or RMS→LN, same γ, β, ε"]
    return "\n".join(lines + kind_notes(result.layers))


def render_table(result: InspectResult):
    """A rich Table of the per-layer numbers (rich is imported here, not at module import). Narrow
    enough for 80 columns: long layer names fold, the numbers never do; the classes, the gated and
    grouped kinds and why a layer has no swap are listed under the table."""
    from rich.table import Table

    table = Table(
        title=f"{result.model} — {result.inputs}",
        title_justify="left",
        caption=_caption(result),
        caption_justify="left",
    )
    table.add_column("layer", overflow="fold")
    table.add_column("kind", no_wrap=True)
    for header in (
        "|μ|/σ\nmedian",
        "|μ|/σ\nq95",
        "μ²/RMS²\nmean",
        "cos\nLN, RMS",
        "swap\nmax|Δy|",
        "swap\nrel‖Δy‖",
    ):
        table.add_column(header, justify="right", no_wrap=True)
    for layer in result.layers:
        r, cos = layer["mu_over_sigma"], layer["predicted_cosine"]
        table.add_row(
            layer["name"],
            kind_label(layer),
            _fmt(r["q50"], ".3g"),
            _fmt(r["q95"], ".3g"),
            _fmt(layer["mean_energy_share"]["mean"], ".1e"),
            _fmt(cos["mean"], ".5f"),
            _fmt(layer["swap_max_abs_diff"], ".3g"),
            _fmt(layer["swap_rel_diff"], ".3g"),
        )
    return table


def _outliers(result: InspectResult) -> list[dict]:
    return [layer["outliers"] for layer in result.layers if layer.get("outliers")]


def render_outlier_table(result: InspectResult):
    """A rich Table of each norm layer's input channels: max|xᵢ|/RMS (median over tokens, and its
    i.i.d. Gaussian median), median excess kurtosis, the top channel's and the top 1%'s share of
    Σx² (i.i.d.: 1/d and k/d), and the dominant channels. |μ|/σ cannot see one massive channel;
    these columns can."""
    from rich.table import Table

    iid = {o["d"]: o["iid_max_over_rms_median"] for o in _outliers(result)}
    caption = "per-channel outliers of what each norm layer normalizes (its input, or x·act(z))"
    if iid:  # the i.i.d. reference of every width, not only the first layer's
        refs = [
            f"d = {d}: max|x|/RMS ≈ {iid[d]:.2f}, top share {100 / d:.2f}%" for d in sorted(iid)
        ]
        caption += "; i.i.d. Gaussian rows of " + "; ".join(refs)
    table = Table(
        title=f"{result.model} — channels",
        title_justify="left",
        caption=caption,
        caption_justify="left",
    )
    table.add_column("layer", overflow="fold")
    for header in (
        "max|x|/RMS\nmedian",
        "excess\nkurtosis",
        "top ch.\nshare",
        "top 1%\nshare",
        "dominant channels\n(share)",
    ):
        table.add_column(header, justify="right", no_wrap=header.startswith("max"))
    for layer in result.layers:
        o = layer.get("outliers") or {}
        if not o:
            table.add_row(layer["name"], "–", "–", "–", "–", "–")
            continue
        dominant = ", ".join(
            f"{c['channel']} ({100 * c['share']:.1f}%)" for c in o["dominant_channels"]
        )
        table.add_row(
            layer["name"],
            _fmt(o["max_over_rms_median"], ".2f"),
            _fmt(o["excess_kurtosis_median"], ".2f"),
            f"{100 * o['top1_share']:.1f}%",
            f"{100 * o['top_k_share']:.1f}%",
            dominant,
        )
    return table


def inspect_layers(result: dict, path: Path) -> Path:
    """Per norm layer of an inspected model: |μ|/σ of what it normalizes (its input, x·act(z) for
    gate-then-norm; per group with groups; median with 5–95% bars) and the predicted 1 − cos
    between LayerNorm and RMSNorm outputs."""
    plt = pyplot()
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
        label="median over rows (tokens, or groups), bars 5–95%",
    )
    ax0.axhline(1.0, color="black", lw=0.8, ls="--", label="|μ| = σ")
    ax0.set_yscale("log")
    ax0.set_ylabel("|μ| / σ of what it normalizes (log)")
    ax0.legend(fontsize=8)
    ax0.grid(alpha=0.3, which="both")
    ax1.plot(x, gap, "s-", ms=4, color="#d62728", label="mean over rows of 1 − σ/RMS")
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
    return save_figure(fig, path)
