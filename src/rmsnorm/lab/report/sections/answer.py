"""The report's answer, first on the page: the question in one identity, then what the
pretrained models, the simulation at initialization, training and the swap say, each in the
words its section's numbers in ``report.json`` support."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...page import Page
from .common import range_text, verdict_sentence
from .decomposition import ablation_sentence
from .real_models import real_answer

if TYPE_CHECKING:
    from ..run import ReportResults


def recovered_cells(j: dict) -> dict:
    """The verdict table's recovered-cost cells, from the fine-tuning section when it ran."""
    rec = j.get("recovery")
    if not rec or "skipped" in rec:
        return {}
    from . import recovery

    return recovery.verdict_cells(j)


def data(r: ReportResults) -> dict:
    """None of its own: the answer speaks from the other sections' numbers."""
    return {}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """None."""
    return {}


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    sim, sc = j["simulation"], j["simulation"]["config"]
    v = sim["verdict"]
    page.h2("The answer", numbered=False)
    page.p(
        "LayerNorm subtracts each row's mean μ and divides by its standard deviation σ; RMSNorm "
        "skips the subtraction and divides by the root mean square RMS = √(σ² + μ²). With γ = 1 "
        "and β = 0 the two outputs differ only through the ratio μ/σ: RMSNorm(x) = "
        "(σ/RMS)·LN(x) + (μ/RMS)·𝟙, so the cosine between them is σ/RMS = 1/√(1 + (μ/σ)²)."
    )
    for part in real_answer(j, recovered_cells(j)):
        if isinstance(part, tuple):
            page.table(*part)
        else:
            page.p(part)
    text = (
        f"**At initialization.** In the simulated {sc['n_layers']}-layer {sc['norm_position']}-LN "
        f"transformer (d = {sim['d']}, {v['n']} seeds) the median token has |μ|/σ = "
        f"**{sim['pooled_median']:.4f}**, {v['ratio']:.2f}× the median of i.i.d. Gaussian rows "
        f"of its width, so {verdict_sentence(v, 'the stream')}. The two norms then agree to a "
        f"mean cosine of **{sim['mean_cosine']:.5f}**."
    )
    dec = j["decomposition"]
    share = dec["last_layer_share_pct"]
    text += (
        f" Part of μ is not chance: an offset that every token shares holds "
        f"{range_text(share, '.1f', '%')} of E[μ²] at {dec['last_layer']} across seeds (median "
        f"{share['median']:.1f}%)."
    )
    text += " " + ablation_sentence(dec)
    page.p(text)
    tr = j.get("training")
    if tr is not None:
        ln = tr["per_norm"]["layernorm"]
        cfg = tr["config"]
        text = (
            f"**After training** ({cfg['steps']} steps, {cfg['seeds']} seeds per norm). In the "
            f"LayerNorm models the pooled median |μ|/σ went from "
            f"{ln['pooled_ratio_init_mean']:.3f} to {ln['pooled_ratio_trained_mean']:.3f}; per "
            f"block σ grew {range_text(ln['sigma_growth'], '.0f')}× and |μ| "
            f"{range_text(ln['mu_growth'], '.0f')}×"
        )
        if ln["sigma_growth"]["median"] > ln["mu_growth"]["median"]:
            text += ", so the ratio fell because σ grew faster, not because μ shrank"
        text += (
            f". The loss has no gradient along 𝟙 in such a network (at most "
            f"{ln['grad_ones_share_trained']['max']:.0e} of ∂L/∂residual's energy: rounding), so "
            "its mean moves only as a side effect."
        )
        rms = tr["per_norm"].get("rmsnorm")
        if rms is not None:
            share = range_text(rms["grad_ones_share_trained"], ".0e")
            pull = (
                f", whose loss does pull on the mean ({share} of the gradient's energy along 𝟙),"
                if rms["grad_ones_share_trained"]["min"] > 1e-12
                else ","
            )
            text += (
                f" In the RMSNorm models{pull} it went from "
                f"{rms['pooled_ratio_init_mean']:.3f} to {rms['pooled_ratio_trained_mean']:.3f}; "
                f"it rose in {rms['trained_rose']} of {len(rms['seeds'])} seeds and ended above "
                f"the i.i.d. {tr['iid_median']:.3f} in {rms['trained_above_iid']}: "
                + verdict_sentence(
                    rms["trained_verdict"],
                    "a trained RMSNorm stream",
                    "i.i.d. rows",
                    "more training seeds (`--train-seeds`)",
                )
                + "."
            )
        page.p(text)
    sw = j.get("swap")
    if sw is not None:
        page.p(
            f"**The swap.** Replacing every LayerNorm of the trained LayerNorm models by an "
            "RMSNorm with the same γ, β and ε costs KL "
            f"{range_text(sw['naive_all']['kl_mean'], '.1e')} nats per token (Δ loss "
            f"{range_text(sw['naive_all']['delta_loss'], '+.1e')} nats/byte); the exact "
            "conversion, "
            "which centers the layers writing into the stream first, differs by at most "
            f"{sw['exact_max_abs']:.0e} (rounding)."
        )
    text = (
        "**So.** RMSNorm can replace LayerNorm exactly in a pre-LN network once the writers of "
        "its residual stream are centered (`rmsnorm convert`)"
    )
    text += ", and naively at the measured cost above. " if sw is not None else ". "
    if v["verdict"] in ("as centered", "less centered"):
        level = (
            "only as centered as chance makes them"
            if v["verdict"] == "as centered"
            else "less centered than chance"
        )
        text += (
            "It does not work because activations are kept centered: at initialization they "
            f"are {level}"
        )
        rms = tr["per_norm"].get("rmsnorm") if tr is not None else None
        if rms is not None and rms["trained_rose"] == len(rms["seeds"]):
            text += (
                ", and training raised the ratio in every one of the "
                f"{len(rms['seeds'])} RMSNorm models"
            )
        text += ". "
    text += (
        "Whether RMSNorm trains as well as LayerNorm is what `rmsnorm compare` measures, not "
        "this report."
    )
    page.p(text)
