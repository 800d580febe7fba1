"""The report's pretrained-models section and the verdict it gives at the top of the page, written
from the ``real_models`` part of ``report.json`` (every number comes from there); its figures are
drawn by :mod:`.real_figures`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from ...page import Page
from ...stats.rows import median
from . import real_figures
from .common import fmt
from .real_figures import PANELS, measured, primary

if TYPE_CHECKING:
    from ..run import ReportResults

__all__ = [
    "real_answer",
    "data",
    "figures",
    "words",
    "model_markdown",
    "verdict_rows",
    "LITERATURE",
    "MECHANISM_WORDS",
]

LITERATURE = (
    "Gupta et al. 2024, *Geometric Interpretation of Layer Normalization and a Comparative "
    "Analysis with RMSNorm* (arXiv 2409.12951); Sun et al. 2024, *Massive Activations in Large "
    "Language Models* (arXiv 2402.17762); Baroni et al. 2025, *Transformers Don't Need LayerNorm "
    "at Inference Time* (arXiv 2507.02559); Jiang et al. 2023, *Pre-RMSNorm and Pre-CRMSNorm "
    "Transformers: Equivalent and Efficient Pre-LN Transformers* (arXiv 2305.14858)"
)

# What each intervention does at every norm, and what it tests.
MECHANISM_WORDS = {
    "mean of ordinary channels": (
        "μ taken over the ordinary channels only, subtracted from every channel",
        "is the cost the massive channels' share of μ?",
    ),
    "ordinary channels shifted": (
        "the full μ subtracted from the ordinary channels only, the massive ones untouched",
        "is it moving the massive channels, or the shift every other channel feels?",
    ),
    "massive clipped": (
        "the massive channels clipped to 30× the site's median |x|, no centering",
        "what the clipping alone costs",
    ),
    "massive clipped, centered": (
        "clipped as above, then centered",
        "does the centering still cost once the massive channels are tamed?",
    ),
    "first position only": (
        "the centering at the first position only",
        "how much of the cost the first token's rows carry",
    ),
    "other positions only": (
        "the centering at every position but the first",
        "the rest of it",
    ),
}


def _ci(s: dict | None, spec: str = ".2g", n: bool = False) -> str:
    if not s:
        return "–"
    text = f"{fmt(s['value'], spec)} [{fmt(s['lo'], spec)}, {fmt(s['hi'], spec)}]"
    return text + (f" (n = {s['n']})" if n and s.get("n") is not None else "")


def _span(values: list[float], spec: str = ".3g") -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "–"
    lo, hi = fmt(min(values), spec), fmt(max(values), spec)
    return lo if lo == hi else f"{lo}–{hi}"


def _med(values: list[float]) -> float:
    return median(values)


def _stats(m: dict) -> dict:
    return primary(m)["stats"]


def _swap(m: dict) -> dict:
    return primary(m)["swap"]


def _kind_rows(stats: dict) -> list[dict]:
    """Per kind of site: its sites' statistics (medians over sites, ranges over sites)."""
    out = []
    kinds: dict[str, list[dict]] = {}
    for s in stats["sites"]:
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
                "no_massive": vals("no_massive", "ratio_median"),
                "one_minus_cos": vals("all", "one_minus_cos_mean"),
                "angle": vals("all", "angle_median"),
                "shift": vals("all", "shift_median"),
                "shared": vals("no_first", "shared_mu_share"),
                "massive": [len(s.get("massive", [])) for s in sites],
                "first": max(s["max_abs_first_token"] for s in sites),
                "others": max(s["max_abs_other_tokens"] for s in sites),
            }
        )
    return out


def _residual_rows(stats: dict) -> list[dict]:
    """The kinds of site that read the residual stream (their width is the model's)."""
    rows = _kind_rows(stats)
    width = max(r["width"] for r in rows)
    return [r for r in rows if r["width"] == width and r["kind"] != "post-sublayer"] or rows


def _norm_word(m: dict) -> str:
    return "LayerNorm (post-LN)" if m["encoder"] else "RMSNorm (pre-norm)"


def _whole(m: dict) -> dict:
    """The cost of the change at every norm: the centering (RMSNorm models), the naive swap
    (MiniLM)."""
    v = _swap(m)["variants"]
    return v["all"]["kl"] if m["cost"] == "kl" else v["naive:all"]["one_minus_cosine"]


def verdict_rows(j: dict, recovered: dict | None = None) -> list[list[str]]:
    """The verdict table's rows: model | norm | |μ|/σ ÷ i.i.d. | largest |x| | cost of the change
    at every norm | recovered cost."""
    real = j.get("real_models") or {}
    recovered = recovered or {}
    rows = []
    for m in measured(real):
        stats = _stats(m)
        resid = _residual_rows(stats)
        over = [x for r in resid for x in r["over_iid"]]
        big = max(r["first"] for r in _kind_rows(stats))
        other = max(r["others"] for r in _kind_rows(stats))
        what = "KL" if m["cost"] == "kl" else "1 − cos"
        change = "centering added" if m["cost"] == "kl" else "naive swap to RMSNorm"
        rows.append(
            [
                m["model"],
                _norm_word(m),
                f"{fmt(_med(over), '.2f')}× ({_span(over, '.2g')})",
                f"{fmt(big, '.3g')} (others ≤ {fmt(other, '.3g')})",
                f"{change}: {what} {_ci(_whole(m), '.2g', n=True)}",
                recovered.get(m["model"], _not_recovered(recovered)),
            ]
        )
    return rows


def _not_recovered(recovered: dict) -> str:
    """The verdict's recovery cell for a model the recovery run did not fine-tune."""
    if not recovered:
        return "not measured in this run"
    return f"not in the recovery run ({', '.join(sorted(recovered))} only)"


def _ratio(a: dict | None, b: dict | None) -> float:
    if not a or not b or not b.get("value"):
        return math.nan
    return a["value"] / b["value"]


def _mechanism_findings(m: dict) -> dict:
    """The interventions' costs relative to the plain centering's (KL ratios, from one run)."""
    v = _swap(m)["variants"]
    base = v["all"]["kl"]

    def kl(name):
        r = v.get(f"mech:{name}")
        return r["kl"] if r else None

    return {
        "ordinary_mean": _ratio(kl("mean of ordinary channels"), base),
        "ordinary_shifted": _ratio(kl("ordinary channels shifted"), base),
        "clip": _ratio(kl("massive clipped"), base),
        "clip_center": _ratio(kl("massive clipped, centered"), base),
        "first": _ratio(kl("first position only"), base),
        "rest": _ratio(kl("other positions only"), base),
        "clip_top1": (v.get("mech:massive clipped") or {}).get("top1", {}).get("value", math.nan),
    }


def _share_words(r: float) -> str:
    if not math.isfinite(r):
        return "was not measured"
    if r < 0.2:
        return f"removes most of it ({fmt(100 * r, '.2g')}% remains)"
    if r <= 0.8:
        return f"removes part of it ({fmt(100 * r, '.2g')}% remains)"
    if r <= 1.25:
        return f"leaves it about as it was ({fmt(100 * r, '.3g')}%)"
    return f"makes it larger ({fmt(r, '.2g')}×)"


def real_answer(j: dict, recovered: dict | None = None) -> list:
    """The verdict at the top of the page: a few sentences and one table (none where the section
    did not run). Returns paragraphs and, last, the table as ``(headers, rows)``."""
    real = j.get("real_models") or {}
    models = measured(real)
    if not models:
        return []
    words = ["**Verdict on three real transformers.**"]
    enc = [m for m in models if m["encoder"]]
    dec = [m for m in models if not m["encoder"]]
    for m in enc:
        w = _whole(m)
        words.append(
            f"Swapping {m['model']}'s LayerNorms for RMSNorms without retraining moves its "
            f"sentence embeddings by 1 − cos = {_ci(w, '.2g')} (n = {w['n']} sentences)"
            + (
                f"; a short distillation recovers to {recovered[m['model']]}"
                if m["model"] in (recovered or {})
                else ""
            )
            + "."
        )
    for m in dec:
        w = _whole(m)
        f = _mechanism_findings(m)
        words.append(
            f"Adding the centering to {m['model']} costs KL {_ci(w, '.2g')} nats/token (n = "
            f"{w['n']}); taking μ over the ordinary channels instead "
            f"{_share_words(f['ordinary_mean'])}."
        )
    pred = real.get("prediction") or {}
    strat = (pred.get("stratified") or {}).get("|μ|/σ median") or {}
    if strat.get("rho") is not None:
        p = fmt(strat.get("p"), ".2g")
        words.append(
            f"|μ|/σ does not tell the cost: within models its rank correlation with the per-block "
            f"cost is ρ = {fmt(strat['rho'], '+.2f')} (stratified, p = {p})."
            if strat.get("p") is None or strat["p"] > 0.05
            else f"|μ|/σ ranks the per-block cost within models: ρ = {fmt(strat['rho'], '+.2f')} "
            f"(stratified, p = {fmt(strat['p'], '.2g')})."
        )
    headers = [
        "model",
        "norm",
        "|μ|/σ ÷ i.i.d. (median, range over residual sites)",
        "largest |x| (first token)",
        "cost of the change at every norm [95% CI] (n)",
        "after a short fine-tune",
    ]
    return [" ".join(words), (headers, verdict_rows(j, recovered))]


# ----------------------------------------------------------------------------------------------
# The section
# ----------------------------------------------------------------------------------------------
def _method(page: Page, real: dict) -> None:
    cfg = real["config"]
    texts = real["texts"]
    first = next(iter(texts.values()))
    check = real.get("interval_check") or {}
    coverage = ""
    if check:
        parts = [
            f"{c['planted']} at n = {c['n']}: {fmt(100 * c['coverage'], '.1f')}% "
            f"(± {fmt(100 * c['se'], '.1f')}%, {c['reps']} draws)"
            for c in check.get("checks", [])
        ]
        coverage = (
            f" The interval is {check.get('method_words', check.get('method', ''))}; its coverage "
            "of a known mean, checked on planted cases shaped like these costs (each model's own "
            f"per-sequence values resampled): {'; '.join(parts)}."
        )
    text_words = "; ".join(
        f"**{name}**: {t['origin']} ({t['documents']} documents, {t['characters']:,} characters, "
        f"sha256 {t['sha256'][:12]}…)"
        for name, t in texts.items()
    )
    page.p(
        f"Texts: {text_words}. In each, every fourth document is held out. Statistics on "
        f"{cfg['sequences']} windows × {cfg['seq_len']} tokens of the rest; every cost on "
        f"{cfg['cost_sequences']} held-out windows × {cfg['cost_seq_len']} tokens (n = "
        f"{cfg['cost_sequences']} sequences, the unit every interval resamples), and for the "
        f"encoder {cfg['sentences']} held-out sentences. Each block is centered alone on the "
        f"first text ({next(iter(texts))}: {first['documents']} documents)"
        + (", and on the others too" if cfg.get("blocks_on_every_text") else "")
        + f". The head is evaluated at the first position and every {cfg['head_stride']}th "
        "after it, the same positions in every variant, each sequence's mean weighting them as "
        "the positions they stand for (so Δ cross-entropy, a signed per-token quantity, is "
        "noisier per sequence than KL)."
        + coverage
        + (
            f" Torch threads: {real['threads']['used']} ({real['threads']['why']})."
            if real.get("threads")
            else ""
        )
    )


def data(r: ReportResults) -> dict:
    """``real_models``: the pretrained models' study as it ran
    (:func:`~rmsnorm.lab.experiments.realmodels.run_real_models`), or why it did not."""
    skipped = {"skipped": "--quick" if r.config.mode == "quick" else "--no-real"}
    return {"real_models": r.real or skipped}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """The figures of :mod:`.real_figures` ({} when no model was measured):
    ``real_ratio``, ``real_largest``, ``real_blocks``, ``real_mechanism`` (where a causal model
    was measured) and ``real_predictor``."""
    if r.real is None or not measured(r.real):
        return {}
    real = r.real
    files = {
        "real_ratio": real_figures.ratio_by_block(real, out / "real_ratio.png"),
        "real_largest": real_figures.largest_by_block(real, out / "real_largest.png"),
        "real_blocks": real_figures.block_costs(real, out / "real_blocks.png"),
    }
    if any(m["cost"] == "kl" for m in measured(real)):
        files["real_mechanism"] = real_figures.mechanism_bars(real, out / "real_mechanism.png")
    files["real_predictor"] = real_figures.predictor_scatter(real, out / "real_predictor.png")
    return files


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    """The section itself: placed first after the answer."""
    real = j.get("real_models") or {}
    page.h2("Real pretrained transformers")
    if "skipped" in real:
        page.p(
            f"Not run ({real['skipped']}): run `rmsnorm report` without it (`make report` does) "
            "for the three pretrained models' statistics and the centering's cost."
        )
        return
    for m in real["models"]:
        if "missing" in m:
            page.p(f"**{m['model']}: missing.** {m['missing']}")
    if not measured(real):
        page.p("No pretrained model could be measured, so this section has no numbers.")
        return
    _method(page, real)
    for m in measured(real):
        _model_part(page, m, real)
    for name, caption in (
        (
            "real_ratio",
            "|μ|/σ at each norm's input per block and kind of site (median: solid; without the "
            "first token: dashed; 95th percentile: dotted), against the i.i.d. median and 95% "
            "point at the residual width (QK-norm rows are per head, a narrower width whose "
            "i.i.d. median is higher).",
        ),
        (
            "real_largest",
            "The largest |x| entering a norm per block, on the first token and on the others.",
        ),
        (
            "real_blocks",
            "The cost of centering (MiniLM: swapping) the norms of one block alone, every block, "
            "with 95% intervals over sequences; dashed: all of them at once.",
        ),
        (
            "real_mechanism",
            "The interventions at every norm beside the plain centering (KL, 95% intervals).",
        ),
    ):
        if figures.get(name):
            page.figure(figures[name], caption)
    _mechanism(page, real)
    _second_text(page, real)
    _quantization(page, real)
    _predictor(page, real, figures)
    _counterfactual(page, real)
    _beside_small(page, j, real)
    page.p(
        "Beside the published findings (" + LITERATURE + "): the per-token angle to the uniform "
        "vector is the measure of the first; the huge channels are the massive activations of "
        "the second; the third removes every LayerNorm from GPT-2 and fine-tunes, a recovered "
        "cost (section 'What a short fine-tune recovers'); the exact pre-LN → pre-RMSNorm "
        "conversion of the fourth has no counterpart for MiniLM's post-LN blocks (measured "
        "above). These runs are 135M–270M models on a few thousand tokens of Python's own "
        "documentation, quantized where marked; the papers' models, text and sizes differ."
    )


def _unique_digests(digests: dict) -> dict:
    """Each digest once, under its longest name (a package path rather than a bare file name)."""
    out: dict[str, str] = {}
    for name, digest in sorted(digests.items(), key=lambda kv: -len(kv[0])):
        if digest not in out.values():
            out[name] = digest
    return out


def _variant_label(name: str) -> str:
    if name == "all":
        return "every norm"
    if name.startswith("kind:"):
        return f"{name[5:]} sites"
    if name.startswith("block:"):
        return f"block {name[6:]}"
    if name.startswith("mech:"):
        return f"every norm: {name[5:]}"
    return name


def _model_part(page: Page, m: dict, real: dict) -> None:
    stats = _stats(m)
    prov = stats["provenance"]
    fmt = prov["format"]
    quant = (
        " Weights: " + fmt + ": quantized, so not the original checkpoint (how far one more "
        "rounding moves the numbers is measured below)."
        if "dequantized" in fmt
        else f" Weights: {fmt}, the original checkpoint."
    )
    cfg = m["config"]
    page.p(
        f"**{m['model']}** ({cfg.get('model_type')}, {cfg.get('num_hidden_layers')} blocks, d = "
        f"{cfg.get('hidden_size')}, {_norm_word(m)})."
        + quant
        + f" First position: {stats['text']['first_token']}."
        + (" From the cache." if m.get("cached") and all(m["cached"].values()) else "")
        + " Files (sha256): "
        + ", ".join(f"{k} ({v[:12]}…)" for k, v in _unique_digests(prov["digests"]).items())
        + "."
    )
    rows = _kind_rows(stats)
    page.table(
        [
            "kind (sites, width)",
            "median |μ|/σ",
            "÷ i.i.d.",
            "no first token",
            "no massive channels",
            "1 − σ/RMS",
            "angle to 𝟙 (°)",
            "shift / σ_ord",
            "shared μ²",
            "massive channels per site",
            "max |x| first / others",
        ],
        [
            [
                f"{r['kind']} ({r['sites']}, {r['width']})",
                _span(r["ratio"]),
                _span(r["over_iid"], ".2g"),
                _span(r["no_first"]),
                _span(r["no_massive"]),
                _span(r["one_minus_cos"], ".2g"),
                _span(r["angle"], ".4g"),
                _span(r["shift"]),
                _span(r["shared"], ".2f"),
                _span(r["massive"], ".0f"),
                f"{r['first']:.3g} / {r['others']:.3g}",
            ]
            for r in rows
        ],
    )
    _massive(page, m)
    if m["cost"] == "kl":
        _cost_table(page, m)
    else:
        _encoder_table(page, m)


def _massive(page: Page, m: dict) -> None:
    stats = _stats(m)
    by_channel: dict[int, list] = {}
    for s in stats["sites"]:
        if s["rows_per_token"] != 1:
            continue  # residual-width channels only
        for o in s.get("massive", []):
            by_channel.setdefault(o["channel"], []).append((s, o))
    resid = [s for s in stats["sites"] if s["rows_per_token"] == 1]
    spikes = sum(len(s["outliers"]) for s in resid)
    spike_max = max((len(s["outliers"]) for s in resid), default=0)
    rare = sum(1 for s in resid for o in s["outliers"] if o["persistence"] < 0.05)
    if not by_channel:
        page.p(
            "No massive channel at any residual-width site (rule: median |x| over the tokens "
            f"after the first ≥ 30 × the site's median |x|); {spikes} (site, channel) pairs pass "
            "the looser rule of any one token ≥ 20 × the median."
        )
        return
    weights = {w["site"]: w for w in stats.get("massive_weights", [])}
    top = sorted(by_channel.items(), key=lambda kv: -max(o["median_ratio"] for _, o in kv[1]))[:6]
    page.p(
        f"Massive channels (median |x| over the tokens after the first ≥ 30 × the site's median "
        f"|x|: large on the typical token): {len(by_channel)} channels at some residual-width "
        f"site. The looser rule (any one token ≥ 20 × the median) flags up to {spike_max} "
        f"channels at one site, {spikes} (site, channel) pairs in all, {rare} of them past its "
        "threshold on fewer than 5% of the tokens: it names what is large somewhere (the first "
        "token, mostly), not on the typical token, so it does not define the ordinary channels. "
        "The weight each norm gives the massive ones is its effective scale at the channel "
        "(Gemma's 1 + γ) over the site's median |scale|:"
    )
    table = []
    for c, hits in top:
        ws = []
        for s, _ in hits:
            w = weights.get(s["name"])
            if w is None:
                continue
            for ch in w["channels"]:
                if ch["channel"] == c and ch["over_median"] is not None:
                    ws.append((s, ch["over_median"]))
        near_zero = sum(1 for _, r in ws if r < 0.05)
        by_kind: dict[str, list[float]] = {}
        for s, r in ws:
            by_kind.setdefault(s["kind"], []).append(r)
        table.append(
            [
                c,
                len(hits),
                _span([s["layer"] for s, _ in hits if s["layer"] is not None] or [-1], ".0f"),
                _span([o["median_ratio"] for _, o in hits], ".3g"),
                fmt(max(o["max_abs_first"] for _, o in hits), ".4g"),
                fmt(max(o["max_abs_others"] for _, o in hits), ".4g"),
                "; ".join(f"{k}: {_span(v, '.2g')}" for k, v in by_kind.items()) or "–",
                f"{near_zero} of {len(ws)}",
            ]
        )
    page.table(
        [
            "channel",
            "sites",
            "blocks",
            "median |x| ÷ site median",
            "largest |x|, first token",
            "largest |x|, others",
            "weight ÷ median |weight|, by kind",
            "sites weighting it < 0.05",
        ],
        table,
    )


def _cost_table(page: Page, m: dict) -> None:
    swap = _swap(m)
    v = swap["variants"]
    stride = swap.get("head_stride", 1)
    pos = "every position" if stride == 1 else f"the first position and every {stride}th after it"
    page.p(
        f"What changing its norms costs on the held-out windows (held-out loss "
        f"{_ci(swap['loss'], '.3f')} nats/token before; head evaluated at {pos}). 'KL at first "
        "position / others' is where the cost is measured, not where the centering acts: "
        "centering at the first position only is its own row."
    )
    rows = []
    for name, r in v.items():
        if name.startswith("block:"):
            continue
        rows.append(
            [
                _variant_label(name),
                len(r["sites"]),
                _ci(r["kl"], ".2g"),
                r["kl"]["n"],
                fmt(r["kl_first"]["value"], ".2g"),
                fmt(r["kl_rest"]["value"], ".2g"),
                _ci(r["delta_ce"], "+.2g"),
                fmt(r["top1"]["value"], ".3f"),
            ]
        )
    page.table(
        [
            "changed",
            "sites",
            "KL (nats/token) [95% CI]",
            "n",
            "KL at first position",
            "KL at others",
            "Δ cross-entropy [95% CI]",
            "top-1 agreement",
        ],
        rows,
    )
    blocks = [(int(k[6:]), r) for k, r in v.items() if k.startswith("block:")]
    if blocks:
        blocks.sort(key=lambda br: -br[1]["kl"]["value"])
        page.p(
            f"One block at a time ({len(blocks)} blocks, every one): the costliest are "
            + ", ".join(f"block {b} (KL {_ci(r['kl'], '.2g')})" for b, r in blocks[:3])
            + f"; the cheapest block {blocks[-1][0]} (KL {_ci(blocks[-1][1]['kl'], '.2g')}), "
            f"each n = {blocks[0][1]['kl']['n']}."
        )


def _encoder_table(page: Page, m: dict) -> None:
    swap = _swap(m)
    v = swap["variants"]
    writers = v.get("centered-writers:all", {}).get("writers_alone", {})
    page.p(
        f"Every LayerNorm → RMSNorm with the same γ, β, ε, on {swap['sentences']} held-out "
        "sentences' embeddings (mean over tokens, unit length). No exact conversion exists for "
        "these post-LN blocks: centering every writer (embedding tables, output projections) "
        f"leaves the model unchanged (1 − cosine {fmt(writers.get('one_minus_cosine_mean'), '.1e')}"
        ") but the residual each later norm reads is the previous norm's output γ·x̂ + β, whose "
        "mean is not zero once γ and β are trained, so the swap stays approximate:"
    )
    page.table(
        [
            "variant",
            "norms",
            "1 − cosine [95% CI] (n)",
            "cosine min",
            "nearest neighbour same",
            "similarity rank corr.",
        ],
        [
            [
                name,
                len(r["sites"]),
                _ci(r["one_minus_cosine"], ".2g", n=True),
                fmt(r["cosine_min"], ".4f"),
                fmt(r["nearest_neighbour_agreement"], ".0%"),
                fmt(r["similarity_rank_correlation"], ".4f"),
            ]
            for name, r in v.items()
        ],
    )


def _mechanism(page: Page, real: dict) -> None:
    decoders = [m for m in measured(real) if m["cost"] == "kl"]
    if not decoders:
        return
    page.p(
        "**Why the centering costs what it costs: interventions.** Each changes every norm's "
        "input in one way and is measured like the centering: "
        + "; ".join(f"*{k}*: {what} ({why})" for k, (what, why) in MECHANISM_WORDS.items())
        + ". The massive channels are each site's, found on the held-in text."
    )
    for m in decoders:
        v = _swap(m)["variants"]
        f = _mechanism_findings(m)

        def kl(name, v=v):
            return _ci(v[f"mech:{name}"]["kl"], ".2g") if f"mech:{name}" in v else "–"

        base = _ci(v["all"]["kl"], ".2g")
        parts = [
            f"centering every norm costs KL {base}",
            f"with μ over the ordinary channels: {kl('mean of ordinary channels')}, which "
            f"{_share_words(f['ordinary_mean'])}",
            f"the full μ shifting the ordinary channels only: {kl('ordinary channels shifted')} "
            f"({_share_words(f['ordinary_shifted'])})",
            f"clipping the massive channels alone costs {kl('massive clipped')}, and clipped then "
            f"centered {kl('massive clipped, centered')}",
            f"centering at the first position only costs {kl('first position only')} "
            f"({fmt(100 * f['first'], '.2g')}% of the whole), at the other positions only "
            f"{kl('other positions only')} ({fmt(100 * f['rest'], '.2g')}%)",
        ]
        page.p(f"{m['model']}: " + "; ".join(parts) + ". " + _mechanism_reading(f))


def _mechanism_reading(f: dict) -> str:
    """What the ratios say, in words chosen by the numbers (never typed in)."""
    out = []
    om, osh = f["ordinary_mean"], f["ordinary_shifted"]
    if math.isfinite(om) and om < 0.2:
        out.append(
            "The massive channels' part of μ is the cause: removing it from μ removes the cost"
        )
        if math.isfinite(osh) and osh > 0.5:
            out.append(
                "and it is the ordinary channels being shifted by that μ that costs, not the "
                "massive channels moving"
            )
    elif math.isfinite(om) and om > 0.8:
        out.append(
            "The massive channels' part of μ is not what costs: the mean of the ordinary "
            "channels alone does as much"
        )
    elif math.isfinite(om):
        out.append("The massive channels' part of μ carries part of the cost, not all of it")
    c, cc, top1 = f["clip"], f["clip_center"], f["clip_top1"]
    if (math.isfinite(c) and c >= 10) or (math.isfinite(top1) and top1 < 0.5):
        out.append(
            f"clipping the massive channels breaks the model by itself (top-1 agreement "
            f"{fmt(top1, '.2f')}, {fmt(c, '.2g')}× the centering's KL): they carry its function, "
            "so clipping cannot separate the centering's cost from theirs, which is why the "
            "mean over the ordinary channels is the test"
        )
    elif math.isfinite(c) and math.isfinite(cc) and c > 0:
        out.append(
            f"once they are clipped, centering multiplies the clipped model's KL by "
            f"{fmt(cc / c, '.2g')}"
        )
    return ("; ".join(out) + ".") if out else ""


def _second_text(page: Page, real: dict) -> None:
    texts = list(real["texts"])
    if len(texts) < 2:
        return
    a, b = texts[0], texts[1]
    rows, holds = [], []
    for m in measured(real):
        ta, tb = m["texts"].get(a), m["texts"].get(b)
        if not ta or not tb:
            continue
        va, vb = ta["swap"]["variants"], tb["swap"]["variants"]
        metric = m["cost"]
        for name in va:
            if name.startswith("block:") or name.startswith("naive:block:") or name not in vb:
                continue
            if metric not in va[name] or not isinstance(va[name][metric], dict):
                continue
            rows.append(
                [
                    m["model"],
                    _variant_label(name),
                    _ci(va[name][metric], ".2g"),
                    _ci(vb[name][metric], ".2g"),
                    fmt(_ratio(vb[name][metric], va[name][metric]), ".2f"),
                ]
            )
        if metric == "kl":
            kinds_a = {k: r["kl"]["value"] for k, r in va.items() if k.startswith("kind:")}
            kinds_b = {k: r["kl"]["value"] for k, r in vb.items() if k.startswith("kind:")}
            worst_a = max(kinds_a, key=kinds_a.get) if kinds_a else None
            worst_b = max(kinds_b, key=kinds_b.get) if kinds_b else None
            fa = _mechanism_findings({**m, "texts": {a: ta}})
            fb = _mechanism_findings({**m, "texts": {b: tb}})
            same_mech = all(
                math.isfinite(fa[k]) and math.isfinite(fb[k]) and (fa[k] < 0.5) == (fb[k] < 0.5)
                for k in ("ordinary_mean", "first")
            )
            holds.append(
                f"{m['model']}: the costliest kind of site is {_variant_label(worst_a or '')} on "
                f"{a} and {_variant_label(worst_b or '')} on {b}; the interventions' reading "
                + ("is the same on both" if same_mech else "differs between them")
            )
    if not rows:
        return
    page.p(
        f"**A second kind of text.** Every cost above again on {b} (statistics and costs from "
        f"its own held-in and held-out parts; no per-block sweep there), beside {a}:"
    )
    page.table(["model", "changed", f"on {a} [95% CI]", f"on {b} [95% CI]", "ratio"], rows)
    if holds:
        page.p("Do the conclusions hold? " + "; ".join(holds) + ".")


def _quantization(page: Page, real: dict) -> None:
    rows = []
    encoder_note = ""
    for m in measured(real):
        q = m.get("quantization")
        if not q:
            continue
        if m["encoder"]:
            c = q["naive_all_one_minus_cosine"]
            r = q["site_change"]["ratio_median"]
            encoder_note = (
                f"On {m['model']}'s original weights rounded through {q['qtype']} (an estimate "
                f"of what such rounding does to a model that never was quantized): each site's "
                f"median |μ|/σ moves by {fmt(100 * r['median'], '.2g')}% (median over sites; at "
                f"most {fmt(100 * r['max'], '.2g')}%), and the naive swap's 1 − cosine goes from "
                f"{_ci(c['original'], '.3g')} to {_ci(c['quantized'], '.3g')}."
            )
            continue
        r = q.get("shifted blocks")
        if not r or "loss" not in r:
            continue
        w = r["weights"]
        rows.append(
            [
                m["model"],
                f"{fmt(w['rel_rms_change'], '.2g')} (the file's own: "
                f"~{fmt(w['expected_rel_rms'], '.2g')})",
                f"{fmt(r['loss_before']['value'], '.3f')} → {fmt(r['loss']['value'], '.3f')}",
                _ci(r["loss_change"], "+.2g"),
                f"{fmt(100 * r['site_change']['ratio_median']['median'], '.2g')}% "
                f"(max {fmt(100 * r['site_change']['ratio_median']['max'], '.2g')}%)",
                f"{fmt(100 * r['site_change']['max_abs']['median'], '.2g')}%",
                f"{_ci(r['all_kl_before'], '.2g')} → {_ci(r['all_kl'], '.2g')}",
            ]
        )
    if rows:
        page.p(
            "**Quantization, measured on the quantized models themselves.** Each GGUF model's "
            "weights rounded once more through the file's own format, each tensor through its "
            "own type (Q4_K and Q6_K by llama.cpp's reference scale search, byte-identical to "
            "ggml's). In the file's own blocks that gives the file's bytes back (SmolLM2 every "
            "byte, Gemma 3 all but 0.01% of the weights' RMS: benchmarks/results/quantization/), "
            "so the measured form shifts every block by half its scale group, a fresh rounding "
            "of about the size of the file's own (the expected error of a weight spread "
            "uniformly in its grid cell). How far the held-out loss, the site statistics and "
            "the centering's cost at every norm move under it:"
        )
        page.table(
            [
                "model",
                "weights moved (relative RMS)",
                "held-out loss before → after",
                "Δ loss [95% CI]",
                "median |μ|/σ moved (median over sites)",
                "largest |x| moved",
                "centering's KL before → after",
            ],
            rows,
        )
    if encoder_note:
        page.p(encoder_note)


def _rho(c: dict | None, holm: bool = False) -> str:
    if not c or c.get("rho") is None:
        return "–"
    interval = f"[{fmt(c.get('lo'), '+.2f')}, {fmt(c.get('hi'), '+.2f')}]"
    text = f"{c['rho']:+.2f} {interval} p {fmt(c.get('p'), '.2g')}"
    if holm and c.get("p_holm") is not None:
        text += f" (Holm {fmt(c['p_holm'], '.2g')})"
    return text


def _predictor(page: Page, real: dict, figures: dict[str, Path]) -> None:
    pred = real.get("prediction") or {}
    per_model = pred.get("per_model") or {}
    if not per_model:
        return
    models = [m for m in measured(real) if m["model"] in per_model]
    n = {m["model"]: len(m["points"]) for m in models}
    labels = list(next(iter(per_model.values())))
    order = [*[p for p in PANELS if p in labels], *[p for p in labels if p not in PANELS]]
    page.p(
        "**Does a per-block statistic predict the cost?** The unit is one block, centered "
        "(MiniLM: swapped) alone: "
        + ", ".join(f"{k} {v} blocks" for k, v in n.items())
        + ". Each statistic is averaged over the block's sites (the largest |x|: its maximum), "
        "on the held-in text; the cost is the block's mean KL (MiniLM: 1 − cosine) on the "
        "held-out one. Spearman's ρ within each model with a 95% bootstrap interval over "
        "blocks and a permutation p (Holm's correction over the statistics tried in brackets); "
        "pooled, the within-model ρ stratified by model (ranks never compared across models, "
        "whose costs differ by orders of magnitude; permutations within each model):"
    )
    strat = pred.get("stratified") or {}
    page.table(
        ["statistic", *[m["model"] for m in models], "stratified over models"],
        [
            [
                label,
                *[_rho(per_model[m["model"]].get(label), holm=True) for m in models],
                _rho(strat.get(label)),
            ]
            for label in order
        ],
    )
    sel = pred.get("selected")
    if sel and sel.get("selected"):

        def sign(t):
            if t.get("sign_agrees") is None:
                return ""
            return ", same sign" if t["sign_agrees"] else ", opposite sign"

        tests = "; ".join(
            f"{name} ρ = {_rho(t)}{sign(t)}" for name, t in (sel.get("tests") or {}).items()
        )
        confirm = sel.get("confirm")
        page.p(
            f"Chosen on {sel.get('select_on')} (the most blocks) before looking at the others: "
            f"{sel['selected']} (ρ = {_rho(sel.get('selection'))}, a p that ignores the "
            f"choice); tested, as the one pre-registered statistic, on the others: {tests or '–'}"
            + (f"; over them together (stratified) ρ = {_rho(confirm)}" if confirm else "")
            + "."
        )
    plain = []
    for m in models:
        rows = per_model[m["model"]]
        holm = [r.get("p_holm") for r in rows.values() if r.get("p_holm") is not None]
        best = min(holm) if holm else None
        if best is None or best > 0.05:
            plain.append(
                f"in {m['model']} no statistic predicts the per-block cost once the "
                f"{len(rows)} tried are accounted for (smallest Holm-adjusted p "
                f"{fmt(best, '.2g')}; {n[m['model']]} blocks)"
            )
        else:
            winners = [
                k for k, r in rows.items() if r.get("p_holm") is not None and r["p_holm"] <= 0.05
            ]
            plain.append(f"in {m['model']} {', '.join(winners)} survive the correction")
    if plain:
        page.p("Plainly: " + "; ".join(plain) + ".")
    rules = pred.get("rules") or {}
    if rules:
        names = {
            "massive": "massive (median ≥ 30×)",
            "massive10": "median ≥ 10×",
            "spike": "any token ≥ 20×",
            "top1": "top 1 channel",
            "top4": "top 4 channels",
        }
        rule_list = list(next(iter(rules.values())))
        page.p(
            "The shift statistic (|μ| over σ of the ordinary channels) under each channel rule "
            "— which channels are left out of σ changes the statistic, and so what it "
            "predicts (ρ within model):"
        )
        page.table(
            ["rule", *rules],
            [[names.get(r, r), *[_rho(rules[mname].get(r)) for mname in rules]] for r in rule_list],
        )
    if figures.get("real_predictor"):
        page.figure(
            figures["real_predictor"],
            "Per-block statistics against the measured cost of centering that block alone "
            "(log-log; ρ: Spearman within each model).",
        )


def _counterfactual(page: Page, real: dict) -> None:
    bits = []
    for m in measured(real):
        if m["encoder"]:
            continue
        weights = _stats(m).get("massive_weights", [])
        pre = [w for w in weights if w["kind"] == "pre-norm"]
        zero = [
            w
            for w in pre
            if any(c["over_median"] is not None and c["over_median"] < 0.05 for c in w["channels"])
        ]
        if pre:
            bits.append(
                f"{m['model']}'s norms weight a massive channel below 5% of their median weight "
                f"at {len(zero)} of the {len(pre)} pre-norm sites that have one"
            )
    page.p(
        "**What these numbers answer.** Adding the centering to a model trained with RMSNorm, "
        "without fine-tuning, measures how much that model relies on the mean its norms keep, "
        "not whether centering would matter had it been trained with it: "
        + (
            "; ".join(bits) + " — such a channel reaches the sublayer only through the RMS, and, "
            "once centered, through μ. "
            if bits
            else ""
        )
        + "The direct test of the seeds' direction (LayerNorm → RMSNorm) is MiniLM's naive "
        "swap, and what fine-tuning recovers after each change is measured by `rmsnorm "
        "recover`."
    )


def model_markdown(m: dict) -> str:
    """One model's study (:func:`~rmsnorm.lab.experiments.realmodels.run_model`) as Markdown: its
    statistics per kind of site, massive channels, the centering's cost (what ``rmsnorm inspect
    --swap`` prints)."""
    page = Page(f"{m['model']}: norm sites and the centering's cost")
    if "missing" in m:
        page.p(m["missing"])
        return page.markdown(Path("."))
    _model_part(page, m, {})
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
                fmt(sim["pooled_median"], ".3g"),
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
                    fmt(r["pooled_ratio_trained_mean"], ".3g"),
                    f"{r['pooled_ratio_trained_mean'] / tr['iid_median']:.2f} (seed mean)",
                ]
            )
    for m in measured(real):
        for r in _kind_rows(_stats(m)):
            if r["kind"] in ("pre-norm", "post-ln"):
                rows.append(
                    [
                        f"{m['model']}, {r['kind']} sites ({r['sites']})",
                        r["width"],
                        f"{fmt(_med(r['ratio']), '.3g')} ({_span(r['ratio'])})",
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
