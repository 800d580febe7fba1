"""The report's pretrained-models section and its part of the answer, written from the
``real_models`` part of ``report.json`` (every number comes from there)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..page import Page
from .real_figures import PANELS, measured

__all__ = ["real_answer", "real_section", "model_markdown", "LITERATURE"]

LITERATURE = (
    "Gupta et al. 2024, *Geometric Interpretation of Layer Normalization and a Comparative "
    "Analysis with RMSNorm* (arXiv 2409.12951); Sun et al. 2024, *Massive Activations in Large "
    "Language Models* (arXiv 2402.17762); Baroni et al. 2025, *Transformers Don't Need LayerNorm "
    "at Inference Time* (arXiv 2507.02559); Jiang et al. 2023, *Pre-RMSNorm and Pre-CRMSNorm "
    "Transformers: Equivalent and Efficient Pre-LN Transformers* (arXiv 2305.14858)"
)


def _f(x, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)


def _ci(s: dict, spec: str = ".3g") -> str:
    return f"{_f(s['value'], spec)} [{_f(s['lo'], spec)}, {_f(s['hi'], spec)}]"


def _span(values: list[float], spec: str = ".3g") -> str:
    lo, hi = _f(min(values), spec), _f(max(values), spec)
    return lo if lo == hi else f"{lo}–{hi}"


def _kind_rows(m: dict) -> list[dict]:
    """Per kind of site: its sites' statistics (medians over sites, ranges over sites)."""
    out = []
    kinds: dict[str, list[dict]] = {}
    for s in m["stats"]["sites"]:
        kinds.setdefault(s["kind"], []).append(s)
    for kind, sites in kinds.items():

        def vals(var, stat, sites=sites):
            return [s["variants"][var][stat]["value"] for s in sites]

        ratio = vals("all", "ratio_median")
        iid = [s["iid"]["median"] for s in sites]
        out.append(
            {
                "kind": kind,
                "sites": len(sites),
                "width": sites[0]["width"],
                "ratio": ratio,
                "over_iid": [r / i for r, i in zip(ratio, iid, strict=True)],
                "no_first": vals("no_first", "ratio_median"),
                "no_outliers": vals("no_outliers", "ratio_median"),
                "one_minus_cos": vals("all", "one_minus_cos_mean"),
                "angle": vals("all", "angle_median"),
                "shift": vals("all", "shift_median"),
                "shared": vals("no_first", "shared_mu_share"),
                "outlier_sites": sum(bool(s["outliers"]) for s in sites),
                "first": max(s["max_abs_first_token"] for s in sites),
                "others": max(s["max_abs_other_tokens"] for s in sites),
            }
        )
    return out


def _med(values: list[float]) -> float:
    return statistics.median(values)


def _gguf_note(m: dict, quant: dict | None) -> str:
    fmt = m["stats"]["provenance"]["format"]
    if "dequantized" not in fmt:
        return f" Weights: {fmt}, the original checkpoint."
    text = f" Weights: {fmt}: quantized, so not the original checkpoint."
    if quant is None:
        return text + " How much that moves these numbers was not measured in this run."
    r, x, c = (
        quant["ratio_median_rel_change"],
        quant["max_abs_rel_change"],
        quant["naive_all_one_minus_cosine"],
    )
    return text + (
        f" An estimate of what such rounding does, on MiniLM's original weights rounded through "
        f"{quant['qtype']}: each site's median |μ|/σ moves by {_f(100 * r['median'], '.2g')}% "
        f"(median over sites; at most {_f(100 * r['max'], '.2g')}%), its largest |x| by "
        f"{_f(100 * x['median'], '.2g')}% (at most {_f(100 * x['max'], '.2g')}%), and the naive "
        f"swap's 1 − cosine goes from {_f(c['original'], '.3g')} to {_f(c['quantized'], '.3g')}. "
        "Another model and format may move more."
    )


def real_answer(j: dict) -> list[str]:
    """The answer's paragraphs on the pretrained models (none where the section did not run)."""
    real = j.get("real_models") or {}
    models = measured(real)
    if not models:
        return []
    parts = []
    for m in models:
        rows = {r["kind"]: r for r in _kind_rows(m)}
        bits = [
            f"{r['kind']} sites {_span(r['over_iid'], '.2g')}× the i.i.d. median"
            for r in rows.values()
        ]
        big = max(r["first"] for r in rows.values())
        other = max(r["others"] for r in rows.values())
        text = f"{m['model']}: median |μ|/σ at {', '.join(bits)}; largest |x| {big:.3g} on the "
        text += f"first token against {other:.3g} on the others"
        if m["cost"] == "kl":
            v = m["swap"]["variants"]["all"]
            text += (
                f"; adding the centering at every norm costs KL {_ci(v['kl'], '.2g')} nats/token "
                f"and Δ cross-entropy {_ci(v['delta_ce'], '+.2g')} nats/token"
            )
            kinds = {k[5:]: r for k, r in m["swap"]["variants"].items() if k.startswith("kind:")}
            worst = max(kinds, key=lambda k: kinds[k]["kl"]["value"])
            r = rows.get(worst)
            if r is not None:
                text += (
                    f"; most of it comes from the {worst} sites (alone: KL "
                    f"{_ci(kinds[worst]['kl'], '.2g')}, top-1 agreement "
                    f"{_f(kinds[worst]['top1']['value'], '.0%')}), where the shift the centering "
                    f"applies reaches {_f(max(r['shift']), '.2g')} of the ordinary channels' σ "
                    f"while |μ|/σ stays within {_span(r['over_iid'], '.2g')}× the i.i.d. median"
                )
        else:
            v = m["swap"]["variants"]["naive:all"]
            text += (
                f"; swapping every LayerNorm for RMSNorm naively leaves sentence embeddings at "
                f"cosine {_f(v['cosine_mean'], '.3f')} (min {_f(v['cosine_min'], '.3f')}) to the "
                "original, nearest neighbours agreeing for "
                f"{_f(v['nearest_neighbour_agreement'], '.0%')}"
            )
        parts.append(text + ".")
    pooled = real.get("pooled", {})
    best = _best(pooled.get("correlations", {}))
    lines = [
        "**In real pretrained transformers.** " + " ".join(parts),
    ]
    ratio = pooled.get("correlations", {}).get("|μ|/σ median", {})
    if best is not None:
        label, c = best
        lines.append(
            f"**Does a small |μ|/σ mean a small cost?** Over the {pooled['points']} blocks and "
            f"kinds of site centered alone in the RMSNorm models, |μ|/σ's rank correlation with "
            f"the measured KL is ρ = {_f(ratio.get('rho'), '.2f')} (p = "
            f"{_f(ratio.get('p'), '.2g')}); "
            f"the statistic that ranks the cost best is {label} (ρ = {c['rho']:.2f}, p = "
            f"{c['p']:.2g}). "
            + _verdict(c)
            + " Within one model: "
            + "; ".join(
                f"{m['model']} ρ = {_f(m['correlations'][label]['rho'], '+.2f')} "
                f"(n = {m['correlations'][label]['n']})"
                for m in models
            )
            + " (section 1)."
        )
    return lines


def _best(correlations: dict):
    found = [(k, c) for k, c in correlations.items() if c.get("rho") is not None]
    return max(found, key=lambda kc: abs(kc[1]["rho"])) if found else None


def _verdict(c: dict) -> str:
    if c["p"] is None or c["p"] > 0.05:
        return (
            "With these few points no statistic is distinguishable from none (p > 0.05): we "
            "cannot tell which one predicts the cost; more blocks swapped (`rmsnorm inspect "
            "--swap` swaps every block) and more models would."
        )
    return "Its ranking is unlikely to be chance (p ≤ 0.05) over these points."


def real_section(page: Page, j: dict, figures: dict[str, Path]) -> None:
    """The section itself: placed first after the answer."""
    real = j.get("real_models") or {}
    page.h2("Real pretrained transformers")
    if "skipped" in real:
        page.p(
            f"Not run ({real['skipped']}): run `rmsnorm report` without it (`make report` does) "
            "for the three pretrained models' statistics and the centering's cost."
        )
        return
    text = real["text"]
    cfg = real["config"]
    page.p(
        f"Text: {text['origin']} ({text['documents']} documents, {text['characters']:,} "
        f"characters, sha256 {text['sha256'][:12]}…); every fourth document is held out. "
        f"Statistics on {cfg['sequences']} windows × {cfg['seq_len']} tokens of the rest; the "
        f"centering's cost on {cfg['swap_sequences']} held-out windows × {cfg['seq_len']} tokens "
        f"(one block at a time for every {cfg['layer_stride']}th block and the last), and, for "
        f"the encoder, {cfg['sentences']} held-out sentences. Intervals are 95% bootstrap "
        "intervals over sequences; ranges are over the sites of a kind."
    )
    for m in real["models"]:
        if "missing" in m:
            page.p(f"**{m['model']}: missing.** {m['missing']}")
    quant = next((m["quantization"] for m in measured(real) if m.get("quantization")), None)
    for m in measured(real):
        _model_part(page, m, quant)
    if not measured(real):
        page.p("No pretrained model could be measured, so this section has no numbers.")
        return
    if figures.get("real_ratio"):
        page.figure(
            figures["real_ratio"],
            "|μ|/σ at each norm's input per block and kind of site (median: solid; without the "
            "first token: dashed; 95th percentile: dotted), against the i.i.d. median and 95% "
            "point at the residual width (QK-norm rows are per head, a narrower width whose "
            "i.i.d. median is higher).",
        )
    if figures.get("real_largest"):
        page.figure(
            figures["real_largest"],
            "The largest |x| entering a norm per block, on the first token and on the others.",
        )
    _predictor(page, real, figures)
    _beside_small(page, j, real)
    page.p(
        "Beside the published findings (" + LITERATURE + "): the per-token angle to the uniform "
        "vector is the measure of the first; the first token's few huge channels are the "
        "massive activations of the second; the third removes LayerNorm from GPT-2 with "
        "fine-tuning, where this report measures the cost without any; the exact pre-LN → "
        "pre-RMSNorm conversion of the fourth has no counterpart for MiniLM's post-LN blocks "
        "(measured above). These runs are 135M–270M models on 2k tokens of English "
        "docstrings, quantized where marked; the papers' models, text and sizes differ."
    )
    angle = _angle_against_cost(real)
    if angle:
        page.p(angle)


def _angle_against_cost(real: dict) -> str:
    """The pre-norm inputs' angle to 𝟙 beside what centering them costs, per model measured by KL:
    "orthogonal to the uniform vector on average" is not "free to center"."""
    bits = []
    for m in measured(real):
        if m["cost"] != "kl":
            continue
        rows = {r["kind"]: r for r in _kind_rows(m)}
        kind = m["swap"]["variants"].get("kind:pre-norm")
        if kind is None or "pre-norm" not in rows:
            continue
        bits.append(
            f"{m['model']}'s pre-norm inputs sit at {_span(rows['pre-norm']['angle'], '.3g')}° "
            f"to it (per-site medians over tokens), and centering those sites alone costs KL "
            f"{_ci(kind['kl'], '.2g')} nats/token"
        )
    if not bits:
        return ""
    return (
        "Orthogonal to the uniform vector on average is not free to center: "
        + "; ".join(bits)
        + ". The angle's cosine is μ / RMS over all of a token's channels, so a few huge "
        "channels, which set the RMS, hold it near 90°; the centering moves every channel by the "
        "same μ, which the ordinary channels feel against their own spread (the shift / σ of the "
        "ordinary channels, the better predictor above)."
    )


def _model_part(page: Page, m: dict, quant: dict | None = None) -> None:
    rows = _kind_rows(m)
    prov = m["stats"]["provenance"]
    page.p(
        f"**{m['model']}** ({m['config'].get('model_type')}, "
        f"{m['config'].get('num_hidden_layers')} blocks, d = {m['config'].get('hidden_size')})."
        + _gguf_note(m, quant)
        + f" First position: {m['stats']['text']['first_token']}."
        + (" From the cache." if m.get("cached") else "")
        + " Files (sha256): "
        + ", ".join(f"{k} ({v[:12]}…)" for k, v in _unique_digests(prov["digests"]).items())
        + "."
    )
    page.table(
        [
            "kind (sites, width)",
            "median |μ|/σ",
            "÷ i.i.d.",
            "no first token",
            "no outlier channels",
            "1 − σ/RMS",
            "angle to 𝟙 (°)",
            "shift / σ_ord",
            "shared μ²",
            "max |x| first / others",
        ],
        [
            [
                f"{r['kind']} ({r['sites']}, {r['width']})",
                _span(r["ratio"]),
                _span(r["over_iid"], ".2g"),
                _span(r["no_first"]),
                _span(r["no_outliers"]),
                _span(r["one_minus_cos"], ".2g"),
                _span(r["angle"], ".4g"),
                _span(r["shift"]),
                _span(r["shared"], ".2f"),
                f"{r['first']:.3g} / {r['others']:.3g}",
            ]
            for r in rows
        ],
    )
    _outliers(page, m)
    if m["cost"] == "kl":
        v = m["swap"]["variants"]
        page.p(
            f"Adding the centering (held-out loss {_ci(m['swap']['loss'], '.3f')} nats/token "
            "before):"
        )
        page.table(
            [
                "centered at",
                "sites",
                "KL (nats/token)",
                "KL, first token",
                "KL, others",
                "Δ cross-entropy",
                "top-1 agreement",
            ],
            [
                [
                    name,
                    len(r["sites"]),
                    _ci(r["kl"], ".2g"),
                    _f(r["kl_first"]["value"], ".2g"),
                    _f(r["kl_rest"]["value"], ".2g"),
                    _ci(r["delta_ce"], "+.2g"),
                    _f(r["top1"]["value"], ".3f"),
                ]
                for name, r in v.items()
            ],
        )
    else:
        v = m["swap"]["variants"]
        page.p(
            f"Every LayerNorm → RMSNorm with the same γ, β, ε, on {m['swap']['sentences']} "
            "held-out sentences' embeddings (mean over tokens, unit length). No exact conversion "
            "exists for these post-LN blocks: centering every writer (embedding tables, output "
            "projections) leaves the model unchanged (1 − cosine "
            f"{_f(v['centered-writers:all']['writers_alone']['one_minus_cosine_mean'], '.1e')}) "
            "but the residual each later norm reads is the previous norm's output γ·x̂ + β, "
            "whose mean is not zero once γ and β are trained, so the swap stays approximate:"
        )
        page.table(
            [
                "variant",
                "norms",
                "cosine mean",
                "cosine min",
                "nearest neighbour same",
                "similarity rank corr.",
            ],
            [
                [
                    name,
                    len(r["sites"]),
                    _f(r["cosine_mean"], ".4f"),
                    _f(r["cosine_min"], ".4f"),
                    _f(r["nearest_neighbour_agreement"], ".0%"),
                    _f(r["similarity_rank_correlation"], ".4f"),
                ]
                for name, r in v.items()
            ],
        )


def _outliers(page: Page, m: dict) -> None:
    by_channel: dict[int, list] = {}
    for s in m["stats"]["sites"]:
        for o in s["outliers"]:
            if s["rows_per_token"] == 1:  # residual-width channels only
                by_channel.setdefault(o["channel"], []).append((s, o))
    if not by_channel:
        page.p("No outlier channel at any residual-width site (rule: max |x| ≥ 20 × median |x|).")
        return
    top = sorted(by_channel.items(), key=lambda kv: -max(o["max_abs"] for _, o in kv[1]))[:8]
    page.p(
        f"Outlier channels (max |x| ≥ 20 × the site's median |x|): {len(by_channel)} channels "
        "at some residual-width site; the eight largest:"
    )
    page.table(
        [
            "channel",
            "sites",
            "blocks",
            "largest |x|",
            "at position (sites where largest)",
            "persistence (median)",
        ],
        [
            [
                c,
                len(hits),
                _span([s["layer"] for s, _ in hits if s["layer"] is not None] or [-1], ".0f"),
                _f(max(o["max_abs"] for _, o in hits), ".4g"),
                ", ".join(
                    f"{p}: {n}"
                    for p, n in sorted(
                        _count(o["top_positions"][0] for _, o in hits).items(),
                        key=lambda pn: -pn[1],
                    )[:3]
                ),
                _f(_med([o["persistence"] for _, o in hits]), ".2f"),
            ]
            for c, hits in top
        ],
    )


def _unique_digests(digests: dict) -> dict:
    """Each digest once, under its longest name (a package path rather than a bare file name)."""
    out: dict[str, str] = {}
    for name, digest in sorted(digests.items(), key=lambda kv: -len(kv[0])):
        if digest not in out.values():
            out[name] = digest
    return out


def _count(items) -> dict:
    out: dict = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _predictor(page: Page, real: dict, figures: dict[str, Path]) -> None:
    rows = []
    models = measured(real)
    labels = list(real["pooled"]["correlations"])
    for label in (*PANELS, *[k for k in labels if k not in PANELS]):
        row = [label]
        for m in models:
            c = m["correlations"][label]
            row.append("–" if c["rho"] is None else f"{c['rho']:+.2f} (p {c['p']:.2g}, n {c['n']})")
        c = real["pooled"]["correlations"][label]
        row.append("–" if c["rho"] is None else f"{c['rho']:+.2f} (p {c['p']:.2g}, n {c['n']})")
        rows.append(row)
    page.p(
        "**Does a per-site statistic predict the cost?** Spearman's ρ between each statistic "
        "(averaged over the sites centered together; the largest |x|: its maximum) and the "
        "measured cost of centering those sites alone (KL for the RMSNorm models; 1 − cosine for "
        "MiniLM), per model and pooled over the RMSNorm models:"
    )
    page.table(["statistic", *[m["model"] for m in models], "pooled (KL)"], rows)
    best = _best(real["pooled"]["correlations"])
    if best is not None:
        label, c = best
        within = [
            f"{m['model']} ρ = {_f(m['correlations'][label]['rho'], '+.2f')} (p = "
            f"{_f(m['correlations'][label]['p'], '.2g')})"
            for m in models
        ]
        page.p(
            f"Pooled, the best-ranking statistic is {label} (ρ = {c['rho']:+.2f}). "
            + _verdict(c)
            + f" Within each model: {'; '.join(within)}; a pooled ρ also ranks the models "
            "against each other, whose costs differ by orders of magnitude, so the within-model "
            "ρ are the stricter test, and with their few points each they say less."
            + " |μ|/σ misleads where a massive channel inflates σ: the row looks centered while "
            "the centering moves the ordinary channels by |μ|/σ_ord, several times more (the "
            "'shift / σ_ord' column)."
        )
    if figures.get("real_predictor"):
        page.figure(
            figures["real_predictor"],
            "Per-site statistics against the measured cost of centering those sites alone "
            "(log-log; ρ: Spearman per model).",
        )


def model_markdown(m: dict) -> str:
    """One model's study (:func:`~rmsnorm.lab.experiments.realmodels.run_model`) as Markdown: its
    statistics per kind of site, outlier channels, the centering's cost, and the predictors'
    correlations (what ``rmsnorm inspect --swap`` prints)."""
    page = Page(f"{m['model']}: norm sites and the centering's cost")
    if "missing" in m:
        page.p(m["missing"])
        return page.markdown(Path("."))
    _model_part(page, m)
    page.table(
        ["statistic", "Spearman ρ with the cost", "p", "points"],
        [
            [k, _f(c["rho"], "+.2f"), _f(c["p"], ".2g"), c["n"]]
            for k, c in m["correlations"].items()
        ],
    )
    return page.markdown(Path("."))


def _beside_small(page: Page, j: dict, real: dict) -> None:
    """The real models' residual-stream sites beside the lab's simulated and tiny trained models:
    the same statistic, |μ|/σ's median against the i.i.d. median at each width."""
    rows = []
    sim = j.get("simulation")
    if sim is not None:
        v = sim["verdict"]
        rows.append(
            [
                f"simulated {sim['config']['n_layers']}-layer pre-LN transformer at init "
                f"({v['n']} seeds)",
                sim["d"],
                _f(sim["pooled_median"], ".3g"),
                f"{v['ratio']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}] (over seeds)",
            ]
        )
    tr = j.get("training")
    if tr is not None:
        for norm, r in tr["per_norm"].items():
            rows.append(
                [
                    f"tiny {norm} model trained {tr['config']['steps']} steps "
                    f"({len(r['seeds'])} seeds)",
                    tr["config"]["d_model"],
                    _f(r["pooled_ratio_trained_mean"], ".3g"),
                    f"{r['pooled_ratio_trained_mean'] / tr['iid_median']:.2f} (seed mean)",
                ]
            )
    for m in measured(real):
        for r in _kind_rows(m):
            if r["kind"] in ("pre-norm", "post-ln"):
                rows.append(
                    [
                        f"{m['model']}, {r['kind']} sites ({r['sites']})",
                        r["width"],
                        f"{_f(_med(r['ratio']), '.3g')} ({_span(r['ratio'])})",
                        f"{_med(r['over_iid']):.2f} ({_span(r['over_iid'], '.2g')} over sites)",
                    ]
                )
    if rows:
        page.p(
            "Were the small models representative? The same statistic on the residual stream "
            "(the median over a site's rows; for the real models the median over sites, with "
            "their range):"
        )
        page.table(["model", "d", "median |μ|/σ", "÷ i.i.d. median"], rows)
