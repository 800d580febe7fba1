"""LayerNorm and RMSNorm models trained over seeds: their part of ``report.json`` (:func:`data`,
from :func:`numbers`), the figure of |μ| and σ per block before and after (:func:`figures`, drawn
by :func:`trained_mu_sigma`) and the words."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...experiments.simulation.render import iid_lines
from ...experiments.simulation.seeds import centering_verdict
from ...experiments.trained import TrainStudy
from ...figures import layer_ticks, legend_below, pyplot, save_figure
from ...models.transformer import NORM_NAMES
from ...page import Page
from ...stats.iid import iid_reference
from ...stats.outliers import MASSIVE_SHARE_FACTOR
from ...stats.rows import median, spread
from .common import fmt, range_text, upper_first, verdict_sentence

if TYPE_CHECKING:
    from ..run import ReportResults


def numbers(study: TrainStudy) -> dict:
    cfg = study.config
    d = cfg.d_model
    ref = iid_reference(d)
    out: dict = {
        "config": cfg.to_dict(),
        "study": study.to_dict(),
        "iid_median": ref.median,
        "one_over_d": 1 / d,
        "per_norm": {},
    }
    for norm in cfg.norms:
        runs = study.of(norm)
        blocks = range(1, cfg.n_layers + 1)
        sigma_growth = [
            r.trained["median_sigma"][i] / r.init["median_sigma"][i] for r in runs for i in blocks
        ]
        mu_growth = [
            r.trained["median_abs_mu"][i] / r.init["median_abs_mu"][i] for r in runs for i in blocks
        ]
        ratios_init = [r.init["pooled_median_ratio"] for r in runs]
        ratios_trained = [r.trained["pooled_median_ratio"] for r in runs]
        grad = [g for r in runs for g in r.trained["grad_ones_share"]]
        grad_init = [g for r in runs for g in r.init["grad_ones_share"]]
        beta = [r.trained["beta_mean_term_left_share"][i] for r in runs for i in blocks]
        outl = [o for r in runs for o in r.trained["outliers"][1:]]
        trained_vs_iid = [x / ref.median for x in ratios_trained]
        out["per_norm"][norm] = {
            "seeds": [r.seed for r in runs],
            "pooled_ratio_init": ratios_init,
            "pooled_ratio_trained": ratios_trained,
            "pooled_ratio_init_mean": statistics.fmean(ratios_init),
            "pooled_ratio_trained_mean": statistics.fmean(ratios_trained),
            "trained_vs_iid": trained_vs_iid,
            "trained_above_iid": sum(x > 1 for x in trained_vs_iid),
            "trained_rose": sum(b > a for a, b in zip(ratios_init, ratios_trained, strict=True)),
            "trained_verdict": centering_verdict(trained_vs_iid).to_dict(),
            "sigma_growth": spread(sigma_growth),
            "mu_growth": spread(mu_growth),
            "grad_ones_share_trained": spread(grad),
            "grad_ones_share_init": spread(grad_init),
            "beta_mean_term_left_pct": {k: 100 * v for k, v in spread(beta).items()},
            "val_loss_init": [r.val_loss["init"] for r in runs],
            "val_loss_trained": [r.val_loss["trained"] for r in runs],
            "val_loss_trained_range": spread([r.val_loss["trained"] for r in runs]),
            "layers": {
                stage: {
                    key: [
                        median([getattr(r, stage)[key][i] for r in runs])
                        for i in range(cfg.n_layers + 1)
                    ]
                    for key in ("median_sigma", "median_abs_mu", "median_ratio")
                }
                for stage in ("init", "trained")
            },
            "max_over_rms_median": spread([o["max_over_rms_median"] for o in outl]),
            "excess_kurtosis_median": spread([o["excess_kurtosis_median"] for o in outl]),
            "top1_share_pct": {
                k: 100 * v for k, v in spread([o["top1_share"] for o in outl]).items()
            },
            "top_k_share_pct": {
                k: 100 * v for k, v in spread([o["top_k_share"] for o in outl]).items()
            },
            "train_seconds": sum(r.train_seconds for r in runs),
        }
    if "rmsnorm" in out["per_norm"]:
        ln, rms = out["per_norm"]["layernorm"], out["per_norm"]["rmsnorm"]
        paired = [
            b / a
            for a, b in zip(ln["pooled_ratio_trained"], rms["pooled_ratio_trained"], strict=True)
        ]
        out["paired_rms_over_ln"] = paired
        out["paired_verdict"] = centering_verdict(paired).to_dict()
    ln0 = study.of("layernorm")[0] if study.of("layernorm") else None
    if ln0 is not None:
        out["outlier_iid_max_over_rms"] = ln0.trained["outliers"][0]["iid_max_over_rms_median"]
        out["outlier_top_k"] = ln0.trained["outliers"][0]["top_k"]
        out["outlier_iid_top_k_share_pct"] = 100 * ln0.trained["outliers"][0]["iid_top_k_share"]
        out["outlier_iid_top1_share_pct"] = 100 / d
        out["outlier_top1_over_iid_max"] = max(
            p["top1_share_pct"]["max"] for p in out["per_norm"].values()
        ) / (100 / d)
        out["n_params"] = sum(p.numel() for p in ln0.model.parameters())
        out["massive_share_factor"] = MASSIVE_SHARE_FACTOR
    return out


NORM_COLORS = {"layernorm": "#1f77b4", "rmsnorm": "#d62728"}


STYLE_NAMES = {"--": "dashed", "-": "solid"}


def trained_mu_sigma(training, path: Path) -> Path:
    """Per layer, before and after training, for the LayerNorm and the RMSNorm models: median σ,
    median |μ| and median |μ|/σ over tokens (lines: median over seeds; bands: min–max)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.4), layout="constrained")
    names = training.layer_names()
    x = list(range(len(names)))
    keys = (
        ("median_sigma", "median σ (activation units, log)"),
        ("median_abs_mu", "median |μ| (activation units, log)"),
        ("median_ratio", "median |μ|/σ (dimensionless, log)"),
    )
    for ax, (key, ylabel) in zip(axes, keys, strict=True):
        for norm in training.config.norms:
            runs = training.of(norm)
            for stage, ls in (("init", "--"), ("trained", "-")):
                t = torch.tensor([getattr(r, stage)[key] for r in runs], dtype=torch.float64)
                c = NORM_COLORS.get(norm, "black")
                ax.fill_between(
                    x,
                    t.min(0).values,
                    t.max(0).values,
                    color=c,
                    alpha=0.12 if stage == "init" else 0.22,
                )
                ax.plot(
                    x,
                    torch.quantile(t, 0.5, dim=0),
                    ls=ls,
                    color=c,
                    marker="o",
                    ms=3,
                    label=f"{NORM_NAMES.get(norm, norm)}, {stage} ({STYLE_NAMES[ls]})",
                )
        ax.set_yscale("log")
        layer_ticks(ax, names, short=True)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    iid_lines(axes[2], iid_reference(training.config.d_model), band=False)
    axes[0].set_title("σ: the spread of each token's entries", fontsize=10)
    axes[1].set_title("|μ|: each token's mean", fontsize=10)
    axes[2].set_title("their ratio", fontsize=10)
    legend_below(fig, axes[2], ncol=5)
    cfg = training.config
    return save_figure(
        fig,
        path,
        f"Before and after {cfg.steps} training steps: {cfg.n_layers}-layer pre-norm models, "
        f"d = {cfg.d_model}, {cfg.seeds} seeds each (lines: median over seeds; bands: min–max)",
    )


def data(r: ReportResults) -> dict:
    """``training``: :func:`numbers` of the training study ({} when it did not run)."""
    return {} if r.training is None else {"training": numbers(r.training)}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``trained_mu_sigma``: :func:`trained_mu_sigma` ({} when training did not run)."""
    if r.training is None:
        return {}
    return {"trained_mu_sigma": trained_mu_sigma(r.training, out / "trained_mu_sigma.png")}


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    tr = j.get("training")
    if tr is None:
        return
    cfg = tr["config"]
    names = tr["study"]["layers"]
    page.h2("Trained networks of both kinds")
    per = tr["per_norm"]
    losses = "; ".join(
        f"{NORM_NAMES[n]} {range_text(p['val_loss_trained_range'], '.2f')}" for n, p in per.items()
    )
    page.p(
        f"The same model ({cfg['n_layers']} layers, width {cfg['d_model']}, {cfg['n_heads']} "
        f"heads) trained with {' and with '.join(NORM_NAMES[n] for n in cfg['norms'])}: "
        f"{cfg['seeds']} seeds each, every seed with the same initial weights and data order for "
        f"both norms, {cfg['steps']} steps of {cfg['train_batch']} × {cfg['seq_len']} bytes of "
        f"{tr['study']['corpus']} (AdamW, peak learning rate {cfg['lr']:g}, {cfg['warmup']} "
        f"warm-up steps). Validation loss after training, nats/byte: {losses}. Before and after, "
        f"each model runs the same {tr['study']['eval_tokens'][0]} × "
        f"{tr['study']['eval_tokens'][1]} held-out bytes; μ and σ per layer, apart (medians over "
        "tokens, then the median over seeds):"
    )
    head = ["residual after"]
    for n in cfg["norms"]:
        head += [f"{NORM_NAMES[n]} σ init → trained", "|μ| init → trained", "|μ|/σ init → trained"]
    rows = []
    for i, name in enumerate(names):
        row = [name]
        for n in cfg["norms"]:
            layers = per[n]["layers"]
            for key, spec in (
                ("median_sigma", ".3g"),
                ("median_abs_mu", ".3g"),
                ("median_ratio", ".3f"),
            ):
                a, b = layers["init"][key][i], layers["trained"][key][i]
                row.append(f"{a:{spec}} → {b:{spec}}")
        rows.append(row)
    page.table(head, rows)
    page.figure(
        figures["trained_mu_sigma"],
        "σ, |μ| and their ratio per layer before (dashed) and after (solid) training, LayerNorm "
        "(blue) and RMSNorm (red) models; lines: median over seeds, bands: min–max.",
    )
    ln = per["layernorm"]
    text = (
        f"LayerNorm models: the pooled median |μ|/σ went from {ln['pooled_ratio_init_mean']:.3f} "
        f"to {ln['pooled_ratio_trained_mean']:.3f} (mean over seeds; per seed "
        f"{', '.join(f'{x:.3f}' for x in ln['pooled_ratio_trained'])}). Per block σ grew "
        f"{range_text(ln['sigma_growth'], '.0f')}× and |μ| {range_text(ln['mu_growth'], '.1f')}× "
        "(range over seeds and blocks): "
    )
    if ln["sigma_growth"]["median"] > ln["mu_growth"]["median"]:
        text += "the ratio fell because σ grew faster, not because the mean went away."
    else:
        text += "σ did not outgrow |μ|."
    page.p(text)
    grad_rows = []
    for n, p in per.items():
        grad_rows.append(
            [
                NORM_NAMES[n],
                range_text(p["grad_ones_share_init"], ".1e"),
                range_text(p["grad_ones_share_trained"], ".1e"),
            ]
        )
    page.p(
        "The loss's pull on the mean: the share of ∂L/∂residual's energy along 𝟙, "
        "Σ_t(Σ_i g_ti)²/d ÷ Σ_t Σ_i g_ti², per layer (range over layers and seeds; a gradient of "
        f"random direction gives 1/d = {tr['one_over_d']:.4f}). In a pre-LN LayerNorm network "
        "every path from the stream to the loss passes a LayerNorm, and LN(x + c𝟙) = LN(x), so "
        "this is zero up to rounding: the loss never pulls on the mean, which moves only as a "
        "side effect (AdamW's per-element steps do not keep updates orthogonal to 𝟙)."
    )
    page.table(["model", "share along 𝟙 at init", "share along 𝟙 trained"], grad_rows)
    rms = per.get("rmsnorm")
    if rms is not None:
        text = (
            f"RMSNorm models: the pooled median went from {rms['pooled_ratio_init_mean']:.3f} to "
            f"{rms['pooled_ratio_trained_mean']:.3f}; per seed ÷ the i.i.d. median "
            f"{tr['iid_median']:.3f}: {', '.join(f'{x:.2f}' for x in rms['trained_vs_iid'])} "
            f"({rms['trained_above_iid']} of {len(rms['seeds'])} above 1). "
            + upper_first(
                verdict_sentence(
                    rms["trained_verdict"],
                    "a trained RMSNorm stream",
                    "i.i.d. rows",
                    "more training seeds (`--train-seeds`)",
                )
            )
            + "."
        )
        if "paired_verdict" in tr:
            pv = tr["paired_verdict"]
            text += (
                f" Paired by seed (same initial weights and data), the RMSNorm stream ends "
                f"{pv['ratio']:.1f}× as far from centered as the LayerNorm one (per seed "
                f"{', '.join(f'{x:.1f}' for x in tr['paired_rms_over_ln'])}×; 95% interval "
                f"{fmt(pv['ci_low'], '.1f')}–{fmt(pv['ci_high'], '.1f')}). "
            )
            if pv["verdict"] == "less centered":
                text += "RMSNorm-trained streams are less centered than LayerNorm-trained ones."
            elif pv["verdict"] == "more centered":
                text += "RMSNorm-trained streams are more centered than LayerNorm-trained ones."
            else:
                text += (
                    f"With {pv['n']} seeds we cannot tell whether the two differ in general; "
                    "more seeds would tell."
                )
        page.p(text)
    page.p(
        f"These are {cfg['steps']}-step models of {tr['n_params']:,} parameters, not trained "
        "language models: run `rmsnorm inspect --model DIR` on a real checkpoint to see where its "
        "norm inputs sit."
    )
