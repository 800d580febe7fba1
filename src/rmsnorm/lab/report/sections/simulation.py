"""The chapter's experiment, a transformer at initialization over seeds: its part of
``report.json`` (:func:`data`: :func:`numbers`, with the headline of each seed), its figures
(:func:`figures`: the simulation's own, :mod:`rmsnorm.lab.experiments.simulation.render`) and its
words, the verdict against i.i.d. Gaussian rows included."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...experiments.simulation import SimulationResult
from ...experiments.simulation.render import cosine_by_layer, mean_histograms, seed_ratio_by_layer
from ...experiments.simulation.seeds import SeedStudy
from ...models.transformer import NORM_NAMES
from ...page import Page
from ...stats.rows import median
from .common import fmt, verdict_sentence

if TYPE_CHECKING:
    from ..run import ReportResults


def seed_headline(result: SimulationResult, stage: str = "init") -> dict:
    """One run's numbers over every token of every layer: |μ|/σ median, 5% and 95% points, mean;
    the predicted cosine's mean and minimum; how far predicted and measured cosines are apart;
    and per layer the mean μ, mean σ, median and 95% |μ|/σ, mean and minimum cosine."""
    st = result.stages[stage]
    ratio = st.ratio[torch.isfinite(st.ratio)]
    layers = []
    for name, s in zip(result.layer_names, st.summary(), strict=True):
        layers.append(
            {
                "name": name,
                "mean_mu": s["mu"]["mean"],
                "mean_sigma": s["sigma"]["mean"],
                "median_ratio": s["mu_over_sigma"]["q50"],
                "q95_ratio": s["mu_over_sigma"]["q95"],
                "mean_cosine": s["predicted_cosine"]["mean"],
                "min_cosine": s["predicted_cosine"]["min"],
                "cosine_max_abs_diff": s["cosine_max_abs_diff"],
            }
        )
    return {
        "seed": result.config.seed,
        "median_mu_over_sigma": median(ratio),
        "q05_mu_over_sigma": float(torch.quantile(ratio, 0.05)),
        "q95_mu_over_sigma": float(torch.quantile(ratio, 0.95)),
        "mean_mu_over_sigma": float(ratio.mean()),
        "mean_cosine": float(st.cosine.mean()),
        "min_cosine": float(st.cosine.min()),
        "max_cosine_pred_vs_measured": float((st.cosine - st.measured_cosine).abs().max()),
        "layers": layers,
    }


def numbers(study: SeedStudy) -> dict:
    ref = study.reference
    d = study.config.d_model
    cos = [s.mean_cosine for s in study.summaries]
    mean_cos = statistics.fmean(cos)
    verdict = study.verdict
    seed_v = study.seed_verdicts
    token_v = study.token_test_verdicts
    ratio_band = study.band("median_ratio")
    share_band = study.band("shared_share")
    layers = []
    for i, name in enumerate(study.layer_names):
        v = study.layer_verdicts[i]
        layers.append(
            {
                "name": name,
                "median_ratio_median": ratio_band["median"][i],
                "median_ratio_min": ratio_band["min"][i],
                "median_ratio_max": ratio_band["max"][i],
                "vs_iid": v.ratio,
                "vs_iid_ci_low": v.ci_low,
                "vs_iid_ci_high": v.ci_high,
                "verdict": v.verdict,
                "shared_share_median": share_band["median"][i],
                "shared_share_min": share_band["min"][i],
                "shared_share_max": share_band["max"][i],
            }
        )
    return {
        "config": study.config.to_dict(),
        "d": d,
        "n_seeds": len(study.seeds),
        "tokens_per_layer": study.tokens_per_layer,
        "tokens_per_seed": study.tokens_per_layer * len(study.layer_names),
        "iid_gaussian": ref.to_dict(),
        "iid_sqrt_2_over_pi_d": math.sqrt(2 / (math.pi * d)),
        "iid_mean_one_minus_cos": 1 / (2 * (d - 3)),
        "seed0": seed_headline(study.results[0]),
        "seeds": study.to_dict(),
        "pooled_median": verdict.ratio * ref.median,
        "pooled_median_ci": [verdict.ci_low * ref.median, verdict.ci_high * ref.median],
        "verdict": verdict.to_dict(),
        "seed_sd_pct": 100 * verdict.seed_sd,
        "median_ratio_min": min(study.ratios),
        "median_ratio_max": max(study.ratios),
        "mean_cosine": mean_cos,
        "apart_pct": 100 * math.sqrt(max(0.0, 2 - 2 * mean_cos)),
        "seed_verdict_as_centered": None if seed_v is None else seed_v.count("as centered"),
        "token_test_flagged": len(token_v) - token_v.count("as centered"),
        "token_test_tolerance_pct": 100 * study.to_dict()["token_test_tolerance"],
        "layer_confidence": 1 - (1 - verdict.confidence) / len(study.layer_names),
        "layers": layers,
    }


def data(r: ReportResults) -> dict:
    """``simulation``: :func:`numbers` of the study over seeds."""
    return {"simulation": numbers(r.study)}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """The simulation's own figures (:mod:`rmsnorm.lab.experiments.simulation.render`):
    ``mean_histograms`` and ``cosine_by_layer`` of the first seed, ``ratio_by_layer`` over seeds."""
    return {
        "mean_histograms": mean_histograms(r.simulation, out / "mean_histograms.png"),
        "ratio_by_layer": seed_ratio_by_layer(r.study, out / "ratio_by_layer.png"),
        "cosine_by_layer": cosine_by_layer(r.simulation, out / "cosine_by_layer.png"),
    }


def centering_vs_iid(j: dict) -> str:
    """The paragraph that sets the simulation's |μ|/σ against rows of i.i.d. Gaussian entries of
    the same width, median with median, over seeds."""
    sim = j["simulation"]
    ref, v, s0 = sim["iid_gaussian"], sim["verdict"], sim["seed0"]
    d = sim["d"]
    text = (
        "How centered is centered? Each coordinate of the residual stream at initialization is a "
        "sum of many zero-mean terms, so compare it with rows of d i.i.d. Gaussian entries, whose "
        "|μ|/σ·√(d − 1) is the absolute value of a Student t with d − 1 degrees of freedom. At "
        f"d = {d} that gives a median of {ref['median']:.4f}, a 5–95% band of "
        f"{ref['q05']:.4f}–{ref['q95']:.3f} and a mean of {ref['mean']:.4f} (≈ √(2/(πd)) = "
        f"{sim['iid_sqrt_2_over_pi_d']:.4f}); seed {s0['seed']}'s tokens have a median of "
        f"{s0['median_mu_over_sigma']:.4f}, a band of {s0['q05_mu_over_sigma']:.4f}–"
        f"{s0['q95_mu_over_sigma']:.3f} and a mean of {s0['mean_mu_over_sigma']:.4f}. The tokens "
        "of one run share one random network, so they are not independent draws: the median "
        "varies from seed to seed, and only the seeds' spread can say whether a difference is "
        f"real. Over {v['n']} seeds the median |μ|/σ ÷ the i.i.d. median ranges from "
        f"{sim['median_ratio_min']:.3f} to {sim['median_ratio_max']:.3f} (seed-to-seed SD "
        f"{sim['seed_sd_pct']:.0f}%, geometric mean {v['ratio']:.3f}): "
    )
    text += verdict_sentence(v, "the residual stream at initialization") + "."
    if sim["seed_verdict_as_centered"] is not None:
        text += (
            f" Seed by seed, against a band around the i.i.d. level as wide as the other seeds' "
            f"spread, {sim['seed_verdict_as_centered']} of {v['n']} seeds are as centered as "
            f"i.i.d. rows; a test that took the {sim['tokens_per_layer']:,} tokens of a layer as "
            f"independent (±{sim['token_test_tolerance_pct']:.0f}%, three standard errors of "
            f"their median) would call {sim['token_test_flagged']} of the {v['n']} seeds more or "
            "less centered: its null is wrong."
        )
    return text


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    sim = j["simulation"]
    sc, s0 = sim["config"], sim["seed0"]
    page.h2(
        "The chapter's experiment: a transformer at initialization, over seeds", key="simulation"
    )
    page.p(
        f"A GPT-style decoder with residual connections and standard initialization "
        f"(weights N(0, {sc['init_std']}²), output projections scaled by 1/√(2·layers)): "
        f"{sc['n_layers']} layers, width {sc['d_model']}, {sc['n_heads']} heads, "
        f"{sc['norm_position']}-norm {NORM_NAMES[sc['norm']]}, {sc['activation']} MLPs, fed "
        f"{sc['batch']} × {sc['seq_len']} random tokens through its random embeddings, at "
        f"{sim['n_seeds']} seeds (weights and tokens drawn from seeds {sim['seeds']['seeds'][0]}–"
        f"{sim['seeds']['seeds'][-1]}). At every layer the residual stream of each of the "
        f"{sim['tokens_per_layer']:,} tokens of a seed gives one row; the chapter's figure is the "
        f"histogram of the rows' means, one panel per layer (seed {s0['seed']})."
    )
    page.figure(
        figures["mean_histograms"],
        f"Per-token mean μ of the residual stream, one panel per layer, seed {s0['seed']}; each "
        "panel also gives the layer's average σ and median |μ|/σ.",
    )
    page.p(centering_vs_iid(j))
    page.figure(
        figures["ratio_by_layer"],
        "Median |μ|/σ per layer for each seed (thin lines), the median and min–max over seeds, "
        "and the first seed's 5–95% band over its tokens, against i.i.d. Gaussian rows of the "
        "same width.",
    )
    conf = 100 * sim["layer_confidence"]
    page.p(
        "Per layer, over seeds: the median |μ|/σ (median and range over seeds), its ratio to the "
        f"i.i.d. median (geometric mean with a {conf:.1f}% interval, "
        f"{sim['verdict']['confidence']:.0%} over the {len(sim['layers'])} layers together), "
        "the verdict, and the token-shared share of E[μ²] (next section)."
    )
    page.table(
        [
            "residual after",
            "median |μ|/σ",
            "range over seeds",
            "÷ i.i.d. median",
            "interval",
            "verdict",
            "shared share of E[μ²]",
        ],
        [
            [
                row["name"],
                f"{row['median_ratio_median']:.4f}",
                f"{row['median_ratio_min']:.4f}–{row['median_ratio_max']:.4f}",
                f"{row['vs_iid']:.3f}",
                f"{fmt(row['vs_iid_ci_low'], '.3f')}–{fmt(row['vs_iid_ci_high'], '.3f')}",
                row["verdict"],
                f"{100 * row['shared_share_median']:.1f}% ({100 * row['shared_share_min']:.1f}–"
                f"{100 * row['shared_share_max']:.1f}%)",
            ]
            for row in sim["layers"]
        ],
    )
    page.p(
        f"Seed {s0['seed']}: mean cosine {s0['mean_cosine']:.5f}, worst token "
        f"{s0['min_cosine']:.4f}; the predicted σ/RMS agrees with the cosine measured between this "
        f"library's `layer_norm` and `rms_norm` outputs of the same rows (float64) to "
        f"{s0['max_cosine_pred_vs_measured']:.0e}. A mean cosine of {sim['mean_cosine']:.5f} "
        f"(over seeds) leaves the two unit-RMS outputs {sim['apart_pct']:.1f}% apart per element "
        f"(RMS of the difference); rows of i.i.d. Gaussian entries give a mean 1 − cos of "
        f"1/(2(d − 3)) = {sim['iid_mean_one_minus_cos']:.5f}, the grey line below."
    )
    page.figure(
        figures["cosine_by_layer"],
        f"1 − cos(LayerNorm, RMSNorm) per layer on a log axis, seed {s0['seed']}: predicted mean "
        "and 95th percentile, the measured mean (crosses) from the actual outputs, and the i.i.d. "
        "Gaussian mean.",
    )
