"""The section 'What a short fine-tune recovers': the cost of changing the norm of the pretrained
models after a short distillation to the original (:mod:`~rmsnorm.lab.experiments.recovery`),
beside the same fine-tuning of the unchanged model and beside the published recovered costs of
removing LayerNorm from GPT-2; its figure, the verdict table's cells, and ``rmsnorm recover``'s
files (``recovery.json``, ``recovery.md``, ``recovery.png``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from ...figures import legend_below, pyplot, save_figure
from ...io import write_json, write_text
from ...page import Page
from .common import fmt

if TYPE_CHECKING:
    from ..run import ReportResults

__all__ = [
    "BARONI",
    "numbers",
    "data",
    "figures",
    "recovery_figure",
    "markdown",
    "write_recovery",
    "words",
    "verdict_cells",
]

# Baroni et al. 2025 (arXiv:2507.02559), the evaluation table of their released models: every
# LayerNorm removed from GPT-2 during fine-tuning on OpenWebText (0.5M tokens a step), the
# cross-entropy on OpenWebText's validation set (4.5M tokens) against the best model of that size
# (the same fine-tuning with the LayerNorms kept), nats per token.
BARONI = {
    "source": "Baroni et al. 2025, arXiv:2507.02559",
    "setting": (
        "every LayerNorm removed from GPT-2 (pre-LN decoders) while fine-tuning on OpenWebText, "
        "0.5M tokens a step; Δ cross-entropy on OpenWebText's validation set (4.5M tokens) "
        "against the same fine-tuning with the LayerNorms kept"
    ),
    "tokens_per_step_millions": 0.5,
    "models": [
        {"model": "GPT-2 Small", "parameters": "124M", "steps": 300, "delta_ce": 0.0671},
        {"model": "GPT-2 Medium", "parameters": "355M", "steps": 500, "delta_ce": 0.0252},
        {"model": "GPT-2 Large", "parameters": "774M", "steps": 600, "delta_ce": 0.0144},
        {"model": "GPT-2 XL", "parameters": "1.5B", "steps": 800, "delta_ce": 0.0253},
    ],
}

_UNITS = {
    "one_minus_cosine": "1 − cos of sentence embeddings",
    "kl": "KL(original ‖ model), nats per token",
    "delta_ce": "Δ cross-entropy, nats per token",
}
_SHORT = {"one_minus_cosine": "1 − cos", "kl": "KL", "delta_ce": "Δ CE"}


def numbers(recovery_json: dict) -> dict:
    """The section's part of ``report.json`` from a ``recovery.json``: its settings, machine and
    per-model summaries (the per-sequence values stay in ``recovery.json``), and the published
    recovered costs beside them."""
    lit = BARONI | {
        "min_tokens_millions": BARONI["tokens_per_step_millions"]
        * min(b["steps"] for b in BARONI["models"])
    }
    models = []
    for m in recovery_json["models"]:
        if "missing" in m:
            models.append({k: m[k] for k in ("model", "missing", "install")})
            continue
        keep = (
            "model",
            "encoder",
            "kind",
            "metrics",
            "change",
            "loss",
            "trainable",
            "parameters",
            "parameters_trained",
            "steps",
            "lr",
            "batch",
            "checkpoints",
            "held_in",
            "held_out",
            "summary",
        )
        row = {k: m[k] for k in keep}
        # what the fine-tune saw: steps × batch sentences (encoder) or tokens (causal model)
        seq = m["held_in"].get("seq_len") or 1
        row["train_items"] = m["steps"] * m["batch"] * seq
        row["parameters_millions"] = m["parameters"] / 1e6
        models.append(row)
    return {
        "config": recovery_json["config"],
        "machine": recovery_json["machine"],
        "threads": recovery_json.get("threads"),
        "load_average": recovery_json.get("load_average"),
        "load_average_end": recovery_json.get("load_average_end"),
        "seconds": recovery_json.get("seconds"),
        "models": models,
        "literature": lit,
    }


def _measured(rec: dict) -> list[dict]:
    return [m for m in rec.get("models", []) if "summary" in m]


def _ci(s: dict, spec: str = ".2g") -> str:
    """'value [lo, hi]' of an interval dict."""
    if s.get("lo") is None or not _finite(s.get("lo")):
        return fmt(s.get("value"), spec)
    return f"{fmt(s['value'], spec)} [{fmt(s['lo'], spec)}, {fmt(s['hi'], spec)}]"


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


# ----------------------------------------------------------------------------------------------
# The figure
# ----------------------------------------------------------------------------------------------
def _panels(rec: dict) -> list[tuple[dict, str]]:
    return [(m, metric) for m in _measured(rec) for metric in m["metrics"]]


def recovery_figure(rec: dict, path: Path) -> Path:
    """Per model and metric: the cost against the fine-tuning step, the changed model (swapped)
    and the unchanged one (control), the mean over seeds with its 95% t band; log y (symlog
    where a value is 0 or below) where the values span more than 20×."""
    plt = pyplot()
    panels = _panels(rec)
    fig, axes = plt.subplots(
        1, max(1, len(panels)), figsize=(4.4 * max(1, len(panels)), 3.9), squeeze=False
    )
    fig.set_layout_engine("constrained")
    handles = []
    for ax, (m, metric) in zip(axes[0], panels, strict=False):
        values = []
        for arm, color, label in (
            ("swapped", "tab:red", "changed norm, fine-tuned"),
            ("control", "tab:blue", "unchanged model, same fine-tuning (control)"),
        ):
            curve = m["summary"][arm][metric]["curve"]
            xs = [c["step"] for c in curve]
            ys = [c["value"] for c in curve]
            # the costs are ≥ 0 except Δ CE: a t band's lower end below 0 is drawn at 0
            floor = -math.inf if metric == "delta_ce" else 0.0
            lo = [max(floor, c["lo"]) if _finite(c["lo"]) else c["value"] for c in curve]
            hi = [c["hi"] if _finite(c["hi"]) else c["value"] for c in curve]
            (line,) = ax.plot(xs, ys, marker="o", ms=3, color=color, label=label)
            ax.fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0)
            values += [v for v in ys + lo + hi if _finite(v)]
            if len(handles) < 2:
                handles.append(line)
        positive = [v for v in values if v > 0]
        if positive and max(positive) / min(positive) > 20 and metric != "delta_ce":
            if min(values) > 0:
                ax.set_yscale("log")
            else:
                ax.set_yscale("symlog", linthresh=min(positive))
        ax.axhline(0, color="0.6", lw=0.8)
        ax.set_title(f"{m['model']}: {_SHORT[metric]}", fontsize=10)
        ax.set_xlabel(f"fine-tuning step (batch {m['batch']}, lr {m['lr']:g})")
        ax.set_ylabel(_UNITS[metric])
    n = rec["config"]["seeds"]
    legend_below(fig, axes[0][0], ncol=2, handles=handles)
    return save_figure(
        fig,
        path,
        f"Cost of the changed norm against fine-tuning steps (mean of {n} seeds, 95% band)",
    )


def data(r: ReportResults) -> dict:
    """``recovery``: :func:`numbers` of the recovery read or run, or why there is none."""
    if r.recovery is None:
        return {
            "recovery": {"skipped": "no recovery.json given (`--recovery FILE`) and not `--full`"}
        }
    return {"recovery": numbers(r.recovery)}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``recovery``: :func:`recovery_figure` ({} when the recovery did not run)."""
    if r.recovery is None:
        return {}
    rec = numbers(r.recovery)
    if not _measured(rec):
        return {}
    return {"recovery": recovery_figure(rec, Path(out) / "recovery.png")}


# ----------------------------------------------------------------------------------------------
# The table (recovery.md and the section)
# ----------------------------------------------------------------------------------------------
HEADERS = [
    "model",
    "metric",
    "arm",
    "step 0",
    "last step: mean over seeds [95% t] (n seeds)",
    "last step over sequences [95%] (n)",
    "recovered",
    "s per run",
]


def table_rows(rec: dict) -> list[list[str]]:
    rows = []
    for m in _measured(rec):
        unit = "sentences" if m["encoder"] else "sequences"
        for metric in m["metrics"]:
            for arm in ("swapped", "control"):
                s = m["summary"][arm][metric]
                final, seq = s["final"], s["final_sequences"]
                frac = s.get("recovered_fraction")
                secs = m["summary"][arm]["seconds_per_run"]
                rows.append(
                    [
                        m["model"],
                        _SHORT[metric],
                        "changed norm" if arm == "swapped" else "control",
                        _start(s["start"], ".3g"),
                        f"{_ci(final, '.3g')} (n = {final['n']})",
                        f"{_ci(seq, '.3g')} (n = {seq['n']} {unit})",
                        f"{fmt(100 * frac['value'], '.0f')}% ({fmt(100 * frac['min'], '.0f')}%–"
                        f"{fmt(100 * frac['max'], '.0f')}% over seeds)"
                        if frac
                        else "",
                        f"{fmt(min(secs), '.0f')}–{fmt(max(secs), '.0f')}",
                    ]
                )
    return rows


def markdown(rec: dict) -> str:
    """``recovery.md``: what ran and the table."""
    c = rec["config"]
    lines = [
        "# What a short fine-tune recovers",
        "",
        f"`rmsnorm recover`, {c['seeds']} seeds per arm, machine: {rec['machine']} "
        f"(load average {fmt(rec.get('load_average'), '.2f')} at the start, "
        f"{fmt(rec.get('load_average_end'), '.2f')} at the end), "
        f"{fmt(rec.get('seconds'), '.0f')} s in all.",
        "",
    ]
    for m in _measured(rec):
        lines.append(
            f"- **{m['model']}**: {m['change']}; loss {m['loss']}; {m['trainable']} parameters "
            f"train ({m['parameters_trained']:,} of {m['parameters']:,}), AdamW lr {m['lr']:g}, "
            f"batch {m['batch']}, {m['steps']} steps, checkpoints {m['checkpoints']}."
        )
    for m in rec.get("models", []):
        if "missing" in m:
            lines.append(f"- **{m['model']}**: not run, {m['missing']}")
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(rec)]
    lines += [
        "",
        "Recovered: 1 − (last step ÷ step 0) of the changed model. The control is the same "
        "fine-tuning of the unchanged model (0 at step 0).",
        "",
    ]
    return "\n".join(lines)


def write_recovery(result: dict, out: str | Path) -> dict[str, Path]:
    """``recovery.json`` (the whole result), ``recovery.md`` and ``recovery.png`` into ``out``,
    each atomically; returns {name: path}."""
    out = Path(out)
    rec = numbers(result)
    files = {"recovery.json": write_json(result, out / "recovery.json")}
    files["recovery.md"] = write_text(markdown(rec), out / "recovery.md")
    if _measured(rec):
        files["recovery.png"] = recovery_figure(rec, out / "recovery.png")
    return files


# ----------------------------------------------------------------------------------------------
# The words
# ----------------------------------------------------------------------------------------------
def verdict_cells(j: dict) -> dict[str, str]:
    """{model: the verdict table's 'after a short fine-tune' cell}."""
    rec = j.get("recovery") or {}
    cells = {}
    for m in _measured(rec):
        metric = m["metrics"][0]
        s = m["summary"]["swapped"][metric]
        ctl = m["summary"]["control"][metric]["final"]
        cells[m["model"]] = (
            f"{_SHORT[metric]} {_ci(s['final'], '.2g')} (n = {s['final']['n']} seeds) after "
            f"{m['steps']} steps, {fmt(100 * s['recovered_fraction']['value'], '.0f')}% recovered; "
            f"control {fmt(ctl['value'], '.2g')}"
        )
    return cells


def _start(value: float, spec: str = ".2g") -> str:
    """A cost at step 0; the control's is the unchanged model against itself, 0 but for rounding
    (1 − cos of a vector with itself comes out as −2e-16 in float64)."""
    if _finite(value) and 0 < abs(value) < 1e-12:
        return "0 (to rounding)"
    return fmt(value, spec)


def _model_words(m: dict) -> str:
    unit = "sentences" if m["encoder"] else "sequences"
    parts = []
    for metric in m["metrics"]:
        sw, ctl = m["summary"]["swapped"][metric], m["summary"]["control"][metric]
        frac = sw["recovered_fraction"]
        parts.append(
            f"{_SHORT[metric]} went from **{fmt(sw['start'], '.3g')}** at step 0 to "
            f"**{_ci(sw['final'], '.3g')}** after {m['steps']} steps (n = {sw['final']['n']} "
            f"seeds; over {unit}: {_ci(sw['final_sequences'], '.3g')}, n = "
            f"{sw['final_sequences']['n']}), {fmt(100 * frac['value'], '.0f')}% recovered "
            f"({fmt(100 * frac['min'], '.0f')}%–{fmt(100 * frac['max'], '.0f')}% over seeds); the "
            f"control went from {_start(ctl['start'])} to {_ci(ctl['final'], '.2g')}"
        )
    head = (
        f"**{m['model']}** ({m['change']}; {m['trainable']} parameters train, "
        f"{m['parameters_trained']:,}; AdamW, lr {m['lr']:g}, batch {m['batch']}; loss: "
        f"{m['loss']}): "
    )
    return head + "; ".join(parts) + "."


def _reading(m: dict) -> str:
    """What one model's numbers say, from its primary metric."""
    metric = m["metrics"][0]
    sw, ctl = m["summary"]["swapped"][metric], m["summary"]["control"][metric]
    frac = sw["recovered_fraction"]["value"]
    floor = ctl["final"]["value"]
    if not _finite(frac):
        return f"For {m['model']} the recovered fraction could not be computed."
    if _recovered(m):
        return (
            f"For {m['model']} the fine-tune took the cost down to about the distance the same "
            f"fine-tuning moves the unchanged model ({fmt(floor, '.2g')}): within this budget the "
            "change is recovered as far as this fine-tuning can tell."
        )
    also = ""
    if "delta_ce" in m["metrics"] and metric != "delta_ce":
        d = m["summary"]["swapped"]["delta_ce"]["recovered_fraction"]["value"]
        also = f" (of its Δ cross-entropy, {fmt(100 * d, '.0f')}%)"
    if frac >= 0.5:
        return (
            f"For {m['model']} most of the cost is recovered ({fmt(100 * frac, '.0f')}%), but it "
            f"is still above the control's {fmt(floor, '.2g')}: more steps would tell whether it "
            "goes all the way."
        )
    if frac > 0:
        return (
            f"For {m['model']} the budget recovered only {fmt(100 * frac, '.0f')}% of the "
            f"{_SHORT[metric]}{also}: "
            f"{m['steps']} steps of {m['batch']} {'sentences' if m['encoder'] else 'windows'} "
            "are too few to tell what fine-tuning can do; "
            "more steps and more held-in data (`rmsnorm recover --steps`) would tell."
        )
    return (
        f"For {m['model']} the fine-tune did not lower the cost within {m['steps']} steps; "
        "a longer run, or a smaller learning rate, would tell whether it can."
    )


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    rec = j.get("recovery") or {}
    page.h2("What a short fine-tune recovers")
    if "skipped" in rec:
        page.p(
            f"Not run ({rec['skipped']}): `rmsnorm recover --out DIR` measures it, and "
            "`rmsnorm report --recovery DIR/recovery.json` (what `make report` passes) reads it "
            "into the report; `rmsnorm report --full` runs it as a stage."
        )
        return
    for m in rec.get("models", []):
        if "missing" in m:
            page.p(f"**{m['model']}: missing.** {m['missing']}")
    models = _measured(rec)
    if not models:
        page.p("No model could be fine-tuned, so this section has no numbers.")
        return
    c = rec["config"]
    page.p(
        "The costs above are unrecovered: the norm changed and nothing else. Someone who swaps "
        "the norm would fine-tune afterwards, so here each changed model is distilled to the "
        "original for a few steps on held-in text (the statistics part, never the held-out "
        "documents evaluated), and measured at checkpoints on the same held-out sentences and "
        "windows as above; step 0 is the unrecovered cost. The control is the same fine-tuning "
        "(steps, data, learning rate, seed) of the unchanged model, whose distance to the "
        f"original starts at 0. {c['seeds']} seeds per arm; a seed sets the order of the "
        "training data (dropout is off). Intervals: over seeds, Student's t at n = seeds; over "
        "sequences at the last step, each sequence's value averaged over seeds, the "
        "interval the real-model section uses. Machine: "
        f"{rec['machine']}, load average "
        f"{fmt(rec.get('load_average'), '.2f')}–{fmt(rec.get('load_average_end'), '.2f')}, "
        f"{fmt(rec.get('seconds'), '.0f')} s in all."
    )
    for m in models:
        page.p(_model_words(m))
    page.table(HEADERS, table_rows(rec))
    if figures.get("recovery"):
        page.figure(
            figures["recovery"],
            "The cost of the changed norm (red) and of the unchanged model under the same "
            "fine-tuning (blue) at each checkpoint: the mean over seeds with its 95% t band.",
        )
    lit = rec["literature"]
    costs = ", ".join(
        f"{b['model']} +{fmt(b['delta_ce'], '.3f')} ({b['steps']} steps)" for b in lit["models"]
    )
    here = ", ".join(
        f"{m['model']} ({m['parameters_millions']:.1f}M parameters) {m['train_items']:,} "
        + ("sentences" if m["encoder"] else "tokens")
        for m in models
    )
    text = (
        f"Beside the published yardstick ({lit['source']}: {lit['setting']}): {costs} nats of "
        "cross-entropy. Their setting is not this one: they remove the norm altogether from "
        f"pre-LN GPT-2 and fine-tune on at least {lit['min_tokens_millions']:.0f}M tokens; here "
        "the norm is only changed (LayerNorm → RMSNorm in a post-LN encoder, RMSNorm → "
        f"LayerNorm without its bias in a pre-norm decoder), and the fine-tune sees {here}."
    )
    for m in models:
        if "delta_ce" not in m["metrics"]:
            continue
        s = m["summary"]["swapped"]["delta_ce"]
        ctl = m["summary"]["control"]["delta_ce"]
        text += (
            f" {m['model']}'s Δ cross-entropy after its fine-tune is "
            f"{_ci(s['final'], '+.3f')} nats per token (n = {s['final']['n']} seeds; control "
            f"{fmt(ctl['final']['value'], '+.2g')}), from {fmt(s['start'], '+.3f')} at step 0"
        )
        lo = min(b["delta_ce"] for b in lit["models"])
        hi = max(b["delta_ce"] for b in lit["models"])
        value = s["final"]["value"]
        where = (
            "inside the published range"
            if lo <= value <= hi
            else "below the published range"
            if value < lo
            else "above the published range"
        )
        text += (
            f": {where} (+{fmt(lo, '.3f')} to +{fmt(hi, '.3f')}) after a fine-tune on "
            f"{m['train_items']:,} tokens, though on other text, another model and another "
            "change, so the likeness is of scale only."
        )
    page.p(text)
    readings = " ".join(_reading(m) for m in models)
    done = [m for m in models if _recovered(m)]
    if len(done) == len(models):
        close = (
            "So for these models yes, after a fine-tune: the naive change costs something, and "
            "a short distillation to the original takes it down to what the fine-tuning itself "
            "moves."
        )
    elif done:
        close = (
            "So the answer differs by model within this budget: "
            + ", ".join(m["model"] for m in done)
            + " recovered, the others not yet; the budget, not the answer, is what ran out "
            "for them, and a longer run would tell."
        )
    else:
        close = (
            "Within this budget no model recovered fully, so these runs do not say whether "
            "fine-tuning makes the change free; what they say is how far this many steps get."
        )
    page.p("**Can RMSNorm replace LayerNorm in a pretrained model?** " + readings + " " + close)


def _recovered(m: dict) -> bool:
    """Whether the primary cost ended at least 90% recovered and within the control's interval
    reach (its interval overlapping the control's)."""
    metric = m["metrics"][0]
    sw, ctl = m["summary"]["swapped"][metric], m["summary"]["control"][metric]
    frac = sw["recovered_fraction"]["value"]
    lo, hi = sw["final"].get("lo"), ctl["final"].get("hi")
    return _finite(frac) and frac >= 0.9 and _finite(lo) and _finite(hi) and lo <= hi
