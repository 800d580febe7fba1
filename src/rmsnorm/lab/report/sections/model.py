"""An inspected model (``--model``): its part of ``report.json`` (:func:`data`: the inspection's
own numbers, :meth:`~rmsnorm.lab.experiments.inspection.run.InspectResult.to_dict`), its figure
(:func:`figures`: the inspection's) and its words."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...experiments.inspection.render import inspect_layers, kind_label, kind_notes
from ...page import Page
from .common import fmt

if TYPE_CHECKING:
    from ..run import ReportResults


def data(r: ReportResults) -> dict:
    """``model``: the inspection's own numbers ({} without ``--model``)."""
    return {} if r.inspected is None else {"model": r.inspected}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``model_layers``: the inspection's figure ({} without ``--model``)."""
    if r.inspected is None:
        return {}
    return {"model_layers": inspect_layers(r.inspected, out / "model_layers.png")}


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    inspected = j.get("model")
    if inspected is None:
        return
    page.h2(f"Model: {inspected['model']}")
    page.p(
        f"Forward hooks on all {inspected['norm_layers']} norm layers, input "
        f"{inspected['inputs']}. ‘swap’ is the output difference if the layer were the other "
        "kind with the same γ, β, ε (a LayerNorm replaced by RMSNorm, or an RMSNorm by "
        "LayerNorm): largest absolute difference and ‖Δy‖/‖y‖. The last columns are the input's "
        "per-channel outliers."
    )
    page.table(
        [
            "layer",
            "kind",
            "median |μ|/σ",
            "95% |μ|/σ",
            "mean cos",
            "max |Δy|",
            "rel ‖Δy‖",
            "max|xᵢ|/RMS",
            "top channel (share)",
        ],
        [
            [
                layer["name"],
                kind_label(layer),
                fmt(layer["mu_over_sigma"]["q50"]),
                fmt(layer["mu_over_sigma"]["q95"]),
                fmt(layer["predicted_cosine"]["mean"], ".5f"),
                fmt(layer["swap_max_abs_diff"]),
                fmt(layer["swap_rel_diff"]),
                fmt(layer["outliers"].get("max_over_rms_median"), ".2f"),
                (
                    f"{layer['outliers']['dominant_channels'][0]['channel']} "
                    f"({100 * layer['outliers']['dominant_channels'][0]['share']:.1f}%)"
                )
                if layer["outliers"]
                else "–",
            ]
            for layer in inspected["layers"]
        ],
    )
    notes = kind_notes(inspected["layers"])
    if notes:  # gated and grouped norms, and layers without a swap
        page.p("Kinds: LN, RMS; " + "; ".join(notes) + ".")
    page.figure(figures["model_layers"], f"Centering of the norm inputs of {inspected['model']}.")
