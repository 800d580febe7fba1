"""Where μ comes from: the token-shared share of E[μ²] over seeds and the ablation that removes
the activation's token mean (:func:`data`, from :func:`numbers`), its figure (:func:`figures`: the
simulation's :func:`~rmsnorm.lab.experiments.simulation.render.decomposition_figure`) and its
words."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...experiments.simulation.render import decomposition_figure
from ...experiments.simulation.seeds import SeedStudy, paired_spread_test
from ...experiments.sweep import SweepResult
from ...page import Page
from ...stats.rows import spread
from .common import fmt, range_text, upper_first

if TYPE_CHECKING:
    from ..run import ReportResults


def numbers(study: SeedStudy, sweep: SweepResult | None) -> dict:
    shares = [s.shared_share[-1] for s in study.summaries]
    out: dict = {
        "last_layer": study.layer_names[-1],
        "last_layer_share_pct": {k: 100 * v for k, v in spread(shares).items()},
        "origin": study.origin(),
    }
    if out["origin"] is not None:
        out["mlp_explained_pct"] = 100 * out["origin"]["mlp_explained"]
    if sweep is not None:
        acts = {}
        for cell in sweep.group("activation"):
            v = cell.study.verdict
            origin = cell.study.origin() or {}
            acts[cell.label] = {
                "seed_sd_pct": 100 * v.seed_sd,
                "ratio": v.ratio,
                "verdict": v.verdict,
                "last_layer_share_median_pct": 100
                * spread([s.shared_share[-1] for s in cell.study.summaries])["median"],
                "activation_mean": origin.get("activation_mean"),
                "activation_mean_rms": origin.get("activation_mean_rms"),
            }
        out["activations"] = acts
        cells = {c.label: c.study for c in sweep.group("activation")}
        if "GELU" in cells and "GELU, token mean removed" in cells:
            test = paired_spread_test(
                cells["GELU"].ratios, cells["GELU, token mean removed"].ratios
            )
            out["ablation"] = {
                **test,
                "sd_gelu_pct": 100 * test["sd_a"],
                "sd_centered_pct": 100 * test["sd_b"],
                "narrower": test["p"] < 0.05 and test["sd_b"] < test["sd_a"],
                "wider": test["p"] < 0.05 and test["sd_b"] > test["sd_a"],
            }
    return out


def data(r: ReportResults) -> dict:
    """``decomposition``: :func:`numbers` of the study and the sweep's activation cells."""
    return {"decomposition": numbers(r.study, r.sweep)}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``decomposition``: the simulation's
    :func:`~rmsnorm.lab.experiments.simulation.render.decomposition_figure`."""
    return {"decomposition": decomposition_figure(r.study, r.sweep, out / "decomposition.png")}


def ablation_sentence(dec: dict) -> str:
    """What removing the activation's token mean does to the seed spread, in the words its paired
    test supports."""
    ab = dec.get("ablation")
    if ab is None:
        return ""
    numbers = (
        f"with the MLP activation's mean over tokens removed, the seed-to-seed SD of the median "
        f"is {ab['sd_centered_pct']:.0f}% against {ab['sd_gelu_pct']:.0f}% with it (the same "
        f"{ab['n']} seeds; Pitman–Morgan test p = {fmt(ab['p'], '.2g')})"
    )
    if ab["narrower"]:
        return (
            f"The MLPs write it, W₂ carrying their activation's mean over tokens into the stream: "
            f"{numbers}, so that offset is what makes the median vary from seed to seed."
        )
    if ab["wider"]:
        return upper_first(numbers) + ": removing it widens the spread."
    return (
        upper_first(numbers) + ": we cannot tell whether the spreads differ; more seeds would tell."
    )


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    dec, sim = j["decomposition"], j["simulation"]
    share = dec["last_layer_share_pct"]
    page.h2("Where μ comes from: an offset every token shares, and the rest")
    text = (
        "Split each layer's per-token means μ_t into their mean over the tokens m̄ (an offset "
        "every token carries) and the rest: E[μ²] = m̄² + var(μ_t), exactly. The per-token part is "
        "the noise of a mean over d coordinates; the shared part is not. At "
        f"{dec['last_layer']} it holds {range_text(share, '.1f', '%')} of E[μ²] across the "
        f"{sim['n_seeds']} seeds (median {share['median']:.1f}%)."
    )
    origin = dec.get("origin")
    if origin is not None:
        sign = "positive" if origin["activation_mean"] > 0 else "negative"
        text += (
            " In a pre-norm stack the stream is the sum of what the embedding, the attentions "
            "and the MLPs wrote, so m̄ is the sum of their means. An MLP's token-shared write is "
            "exact: mean_t(W₂a_t + b₂) = W₂·ā + b₂, with ā the activation's mean over tokens; "
            f"here ā is {sign} on average (mean over units and blocks "
            f"{origin['activation_mean']:.3f}, RMS over units {origin['activation_mean_rms']:.3f})."
            f" Over seeds the MLPs' part accounts for {dec['mlp_explained_pct']:.0f}% of "
            f"Σ m̄² at {dec['last_layer']} (RMS over seeds: m̄ {origin['rms_shared_last']:.1e}, "
            f"the MLPs' part {origin['rms_from_mlp_last']:.1e}, the attentions' "
            f"{origin['rms_from_attention_last']:.1e}, which pass the shared vector on through "
            "their values)."
        )
    acts = dec.get("activations", {})
    if acts:
        parts = [
            f"{name}: seed-to-seed SD {a['seed_sd_pct']:.0f}%, shared share "
            f"{a['last_layer_share_median_pct']:.1f}% (median), ā mean "
            f"{fmt(a['activation_mean'], '.3f')} and RMS {fmt(a['activation_mean_rms'], '.3f')}"
            for name, a in acts.items()
        ]
        text += (
            " The ablation: 'GELU, token mean removed' subtracts each MLP unit's mean over tokens "
            "before W₂, which leaves the MLPs no shared write. Per activation, at the last layer: "
            f"{'; '.join(parts)}. " + ablation_sentence(dec)
        )
    page.p(text)
    page.figure(
        figures["decomposition"],
        "Left: the token-shared share of E[μ²] per layer (median over seeds, band min–max). Right: "
        "per seed, the last layer's offset against the part the MLPs wrote.",
    )
