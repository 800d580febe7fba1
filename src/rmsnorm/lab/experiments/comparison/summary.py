"""The statistics and verdicts of a training comparison: each variant's learning rate chosen on
held-out bytes apart from the reported ones and on the other seeds, the paired differences from
LayerNorm (at every rate, at LayerNorm's rate and at each variant's own), the stability of every
run, whether the validation loss has flattened, and the step and norm-only times."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ....reference import partial_size
from ...stats.rows import median
from .config import BASELINE, LABELS
from .paired import POWER, Paired, paired, seeds_needed

# The first steps of every run allocate buffers and warm caches; step-time statistics skip them.
TIMING_SKIP_STEPS = 2
# Flattened: over the last FLAT_WINDOW of the steps, the mean validation loss fell by at most
# FLAT_TOLERANCE of its final value.
FLAT_WINDOW = 0.2
FLAT_TOLERANCE = 0.01
SELECTION = (
    "each variant's learning rate is chosen, for each seed, as the rate with the lowest mean final "
    "validation loss on the *selection* half of the held-out bytes over the *other* seeds "
    "(leave one seed out); that seed's loss on the *report* half, which no choice looked at, is "
    "what is reported. A choice that saw neither the reported bytes nor the reported seed cannot "
    "favour it by chance. The shared rate is LayerNorm's choice."
)


def lr_key(lr: float) -> str:
    """A learning rate as a results.json key: ``0.003`` -> ``"0.003"``."""
    return f"{lr:g}"


def _last(run: dict, part: str) -> float:
    """The final loss on a half: the larger final evaluation where the run has one, else the last
    point of the curve; inf where there is none or it is not finite."""
    value = run.get(f"final_{part}")
    if value is None:
        values = run.get(part) or []
        value = values[-1] if values else None
    return value if value is not None and math.isfinite(value) else math.inf


def failed(run: dict, ceiling: float = math.inf) -> bool:
    """A run that stopped at a non-finite loss or gradient, or whose final validation loss on
    either half of the held-out bytes is above ``ceiling`` (ln vocab: worse than guessing
    uniformly, a model that did not learn)."""
    if run.get("diverged_at") is not None:
        return True
    return any(_last(run, part) > ceiling for part in ("val_loss", "val_loss_select"))


def final_loss(run: dict, part: str = "val_loss", ceiling: float = math.inf) -> float:
    """The run's last validation loss on ``part`` (``val_loss``: the report half,
    ``val_loss_select``: the selection half); inf for a run that :func:`failed`."""
    return math.inf if failed(run, ceiling) else _last(run, part)


def stability(run: dict, warmup: int, vocab_size: int, grad_clip: float) -> dict:
    """Per run, from the step after warm-up on: the largest training loss, how many steps were
    above ln(vocab) (chance; a non-finite loss counts), the largest and median gradient norm
    (before clipping), the share of steps clipped, and the step it diverged at (or None)."""
    chance = math.log(vocab_size)
    # A non-finite value (NaN, or null in the JSON) is the worst there is: inf.
    losses = [v if v is not None and math.isfinite(v) else math.inf for v in run["train_loss"]]
    grads = [v if v is not None and math.isfinite(v) else math.inf for v in run["grad_norm"]]
    losses, grads = losses[warmup:], grads[warmup:]
    finite_grads = [g for g in grads if math.isfinite(g)]
    return {
        "max_train_loss_after_warmup": max(losses, default=None),
        "argmax_step": warmup + losses.index(max(losses)) if losses else None,
        "steps_above_chance": sum(v > chance for v in losses),
        "steps_after_warmup": len(losses),
        "max_grad_norm_after_warmup": max(grads, default=None),
        "median_grad_norm_after_warmup": median(finite_grads) if finite_grads else None,
        "clipped_fraction": (
            sum(g > grad_clip for g in grads) / len(grads) if grads and grad_clip > 0 else None
        ),
        "diverged_at": run.get("diverged_at"),
    }


def flattening(seed_runs: Sequence[dict], steps: int, ceiling: float = math.inf) -> dict | None:
    """How much the mean (over seeds) report-half validation loss fell over the last
    :data:`FLAT_WINDOW` of the steps, absolute and relative to its final value; None when a run
    :func:`failed` or there is no evaluation before the window."""
    if any(failed(r, ceiling) for r in seed_runs):
        return None
    val_steps = seed_runs[0]["val_steps"]
    start = (1 - FLAT_WINDOW) * steps
    before = [i for i, s in enumerate(val_steps) if s <= start + 1e-9]
    if not before or val_steps[-1] != steps:
        return None
    i = before[-1]
    mean_at = [statistics.fmean(r["val_loss"][j] for r in seed_runs) for j in (i, -1)]
    drop = mean_at[0] - mean_at[1]
    return {
        "from_step": val_steps[i],
        "to_step": steps,
        "loss_from": mean_at[0],
        "loss_to": mean_at[1],
        "drop": drop,
        "relative_drop": drop / mean_at[1],
        "flat": drop / mean_at[1] <= FLAT_TOLERANCE,
    }


def choose_rates(
    by_lr: dict[str, list[dict]], seeds: Sequence[int], ceiling: float = math.inf
) -> dict[int, str]:
    """Per seed, the rate key with the lowest mean selection-half final loss over the other
    seeds (all seeds when there is only one: then the choice has seen the reported seed). A rate
    where any of those runs :func:`failed` scores inf; ties go to the smaller rate."""
    chosen = {}
    for i, seed in enumerate(seeds):
        others = [j for j in range(len(seeds)) if j != i] or [i]
        scores = {
            key: statistics.fmean(final_loss(runs[j], "val_loss_select", ceiling) for j in others)
            for key, runs in by_lr.items()
        }
        chosen[seed] = min(scores, key=lambda k: (scores[k], float(k)))
    return chosen


def window_error(
    a: Sequence[dict], b: Sequence[dict], ceiling: float = math.inf
) -> tuple[float, int] | None:
    """The standard error of the mean paired difference that comes from which validation windows
    were scored, and the number of windows W: the per-window differences (a − b, averaged over
    seeds) spread by s, so s/√W. None when a run :func:`failed` or has no window losses."""
    diffs = None
    for ra, rb in zip(a, b, strict=True):
        wa, wb = ra.get("val_windows"), rb.get("val_windows")
        if not wa or not wb or failed(ra, ceiling) or failed(rb, ceiling):
            return None
        d = [x - y for x, y in zip(wa, wb, strict=True)]
        diffs = d if diffs is None else [p + q for p, q in zip(diffs, d, strict=True)]
    if not diffs or len(diffs) < 2:
        return None
    mean_over_seeds = [d / len(a) for d in diffs]
    return statistics.stdev(mean_over_seeds) / math.sqrt(len(diffs)), len(diffs)


def with_windows(stats: Paired, window: tuple[float, int] | None) -> dict | None:
    """The paired interval widened by the windows' own sampling error: the seeds' and the
    windows' standard errors added in quadrature, with the seeds' n − 1 degrees of freedom, so it
    is never narrower than the interval over seeds (conservative twice: the seed-by-window
    interaction is in both errors). None without both."""
    from scipy import stats as sp

    if window is None or stats.mean is None or stats.sd is None:
        return None
    se_w, w = window
    se_s = stats.sd / math.sqrt(stats.n)
    se = math.hypot(se_s, se_w)
    if se == 0:
        return None
    df = stats.n - 1
    half = float(sp.t.ppf(0.5 + stats.confidence / 2, df)) * se
    lo, hi = stats.mean - half, stats.mean + half
    return {
        "window_se": se_w,
        "windows": w,
        "seed_se": se_s,
        "se": se,
        "df": df,
        "ci_low": lo,
        "ci_high": hi,
        "detected": lo > 0 or hi < 0,
        "bound": max(abs(lo), abs(hi)),
    }


def _comparison(
    runs: dict[str, dict[str, list[dict]]],
    variant: str,
    rates: dict[int, str],
    base_rates: dict[int, str],
    seeds: Sequence[int],
    ceiling: float,
) -> dict:
    """The paired comparison of ``variant`` at ``rates`` (per seed) with LayerNorm at
    ``base_rates``: the per-seed losses, the paired statistics and the seeds a difference of the
    observed size would need."""
    pos = {s: i for i, s in enumerate(seeds)}
    a = [runs[variant][rates[s]][pos[s]] for s in seeds]
    b = [runs[BASELINE][base_rates[s]][pos[s]] for s in seeds]
    losses = [final_loss(r, ceiling=ceiling) for r in a]
    base_losses = [final_loss(r, ceiling=ceiling) for r in b]
    stats = paired(losses, base_losses)
    need = None
    if stats.mean is not None and stats.sd is not None:
        need = seeds_needed(stats.mean, stats.sd)
    window = window_error(a, b, ceiling)
    return {
        "rates": {str(s): rates[s] for s in seeds},
        "baseline_rates": {str(s): base_rates[s] for s in seeds},
        "losses": losses,
        "baseline_losses": base_losses,
        "paired": stats.to_dict(),
        "seeds_to_detect_observed": need,
        "window_standard_error": None if window is None else window[0],
        "with_windows": with_windows(stats, window),
    }


def _step_time_median(seed_runs: Sequence[dict]) -> float | None:
    times = [t for r in seed_runs for t in r["step_time_s"][TIMING_SKIP_STEPS:]]
    times = times or [t for r in seed_runs for t in r["step_time_s"]]
    return median(times) if times else None


def summarize(results: dict) -> dict:
    """Everything the summary, the figures and the command print, from ``results["runs"]``."""
    cfg = results["config"]
    mc, tc = cfg["model"], cfg["train"]
    warmup, steps = tc["warmup"], tc["steps"]
    cases = results["norm_timing"]["cases"]
    n_norms = results["norm_layers_per_model"]
    lrs = sorted({r["lr"] for seed_runs in results["runs"].values() for r in seed_runs})
    keys = [lr_key(lr) for lr in lrs]
    # runs[variant][rate key] = the runs in seed order
    runs: dict[str, dict[str, list[dict]]] = {
        v: {
            lr_key(lr): sorted((r for r in rs if r["lr"] == lr), key=lambda r: r["seed"])
            for lr in lrs
        }
        for v, rs in results["runs"].items()
    }
    seeds = [r["seed"] for r in runs[BASELINE][keys[0]]]
    chance = math.log(mc["vocab_size"])  # a run that ends above it has failed
    chosen = {v: choose_rates(by_lr, seeds, chance) for v, by_lr in runs.items()}
    shared = chosen[BASELINE]
    out: dict[str, dict] = {}
    for variant, by_lr in runs.items():
        all_runs = [r for rs in by_lr.values() for r in rs]
        per_rate = {}
        for key, seed_runs in by_lr.items():
            finals = [final_loss(r, ceiling=chance) for r in seed_runs]
            finite = [f for f in finals if math.isfinite(f)]
            base = runs[BASELINE][key]
            per_rate[key] = {
                "lr": float(key),
                "final_val_loss_per_seed": finals,
                "final_val_loss_mean": statistics.fmean(finite) if finite else None,
                "final_val_loss_std": statistics.stdev(finite) if len(finite) > 1 else None,
                "select_val_loss_mean": statistics.fmean(
                    final_loss(r, "val_loss_select", chance) for r in seed_runs
                ),
                # stopped at a non-finite value, or ended above chance
                "diverged": sum(failed(r, chance) for r in seed_runs),
                "chosen_for_seeds": sum(c == key for c in chosen[variant].values()),
                "paired_vs_layernorm": (
                    None
                    if variant == BASELINE
                    else paired(finals, [final_loss(r, ceiling=chance) for r in base]).to_dict()
                ),
                "stability": [
                    stability(r, warmup, mc["vocab_size"], tc["grad_clip"]) for r in seed_runs
                ],
                "flattening": flattening(seed_runs, steps, chance),
                "mean_val_curve": _mean_curve(seed_runs),
            }
        step_median = _step_time_median(all_runs)
        norm = median(cases[variant]["per_call_s"]) if variant in cases else None
        d = mc["d_model"]
        out[variant] = {
            "label": LABELS[variant],
            "rms_elements": (
                partial_size(d, mc["partial"])
                if variant == "prmsnorm"
                else None
                if variant == "none"
                else d
            ),
            "parameters": all_runs[0]["parameters"],
            "norm_parameters": all_runs[0]["norm_parameters"],
            "by_lr": per_rate,
            "chosen_rates": {str(s): k for s, k in chosen[variant].items()},
            "step_time_median_s": step_median,
            "tokens_per_s_median": all_runs[0]["tokens_per_step"] / step_median,
            "norm_time_median_s": norm,
            "norm_share_of_step": None if norm is None else n_norms * norm / step_median,
        }
        if variant != BASELINE:
            own = chosen[variant]
            out[variant]["at_shared_rate"] = _comparison(
                runs, variant, shared, shared, seeds, chance
            )
            out[variant]["at_own_rate"] = _comparison(runs, variant, own, shared, seeds, chance)
    base = out[BASELINE]
    for variant, s in out.items():
        s["step_time_ratio"] = s["step_time_median_s"] / base["step_time_median_s"]
        s["norm_time_ratio"] = (
            s["norm_time_median_s"] / base["norm_time_median_s"] if variant in cases else None
        )
    torch_cases = {}
    for name in ("torch_layer_norm", "torch_rms_norm"):
        if name in cases and cases[name]["per_call_s"]:
            torch_cases[name] = median(cases[name]["per_call_s"])
    if len(torch_cases) == 2:
        torch_cases["torch_rms_over_layer_norm"] = (
            torch_cases["torch_rms_norm"] / torch_cases["torch_layer_norm"]
        )
    summary = {
        "seeds": seeds,
        "lrs": lrs,
        "selection": SELECTION,
        "shared_rates": {str(s): k for s, k in shared.items()},
        "variants": out,
        "torch": torch_cases,
        "flat_criterion": {"window": FLAT_WINDOW, "tolerance": FLAT_TOLERANCE},
    }
    for variant, s in out.items():
        s["verdicts"] = {} if variant == BASELINE else verdicts(variant, s, base, summary)
    return summary


def val_steps(seed_runs: Sequence[dict]) -> list[int]:
    """The evaluation steps of the runs that went furthest (a diverged run stopped early)."""
    return max((r["val_steps"] for r in seed_runs), key=len)


def _mean_curve(seed_runs: Sequence[dict]) -> list[float | None]:
    """Mean report-half validation loss over the seeds at each evaluation (None where a run had
    diverged by then)."""
    curve = []
    for j in range(len(val_steps(seed_runs))):
        values = [r["val_loss"][j] if j < len(r["val_loss"]) else None for r in seed_runs]
        ok = all(v is not None and math.isfinite(v) for v in values)
        curve.append(statistics.fmean(values) if ok else None)
    return curve


def _rate_text(rates: dict[str, str]) -> str:
    """``"lr 0.003"`` when every seed used one rate, else the rates with their seed counts."""
    counts: dict[str, int] = {}
    for key in rates.values():
        counts[key] = counts.get(key, 0) + 1
    if len(counts) == 1:
        return f"lr {next(iter(counts))}"
    return "lr " + ", ".join(f"{k} ({n} seeds)" for k, n in sorted(counts.items()))


def conclusion(label: str, comparison: dict, baseline_loss: float | None) -> str:
    """The verdict on a paired comparison, written from its confidence intervals alone: over
    seeds (for the validation windows scored), and with the windows' own sampling error added
    (for new text of the same kind), which decides where the two disagree."""
    p = Paired(**{k: v for k, v in comparison["paired"].items() if k not in ("detected", "bound")})
    n = p.n
    ties = f", {p.ties} tied" if p.ties else ""
    counts = f"worse in {p.worse} of {n} seeds, better in {p.better}{ties}"
    sign = "" if p.sign_p is None else f", sign test p = {p.sign_p:.2g}"
    if p.mean is None:
        diverged = sum(d == math.inf for d in p.diffs)
        both = sum(math.isnan(d) for d in p.diffs)
        if n < 2:
            return f"{label}: one seed, no interval ({counts})."
        return (
            f"{label} diverged (or ended above chance) in {diverged + both} of {n} seeds"
            + (f", LayerNorm too in {both}" if both else "")
            + f"; no t interval with a diverged run ({counts}{sign})."
        )
    rel = f" ({p.mean / baseline_loss:+.2%} of LayerNorm's loss)" if baseline_loss else ""
    w = comparison.get("with_windows")
    ci = f"95% CI over seeds [{p.ci_low:+.4f}, {p.ci_high:+.4f}]"
    if w is not None:
        ci += f", with the windows' sampling error [{w['ci_low']:+.4f}, {w['ci_high']:+.4f}]"
    numbers = f"Δ = {p.mean:+.4f} nats/byte{rel}; {ci}; {counts}{sign}"
    side = "worse" if p.mean > 0 else "better"
    if p.detected and (w is None or w["detected"]):
        return f"{label} is {side} than LayerNorm: {numbers}."
    if p.detected:
        return (
            f"On these validation windows {label} is {side} than LayerNorm, but the windows' own "
            f"sampling error (s.e. {w['window_se']:.4f}, {w['window_se'] / w['seed_se']:.1f}× the "
            "seeds') is as large as the difference, so on new text of this kind we cannot tell: "
            f"{numbers}. Scoring more validation windows would tell."
        )
    bound = p.bound if w is None else w["bound"]
    text = (
        f"{label} is within {bound:.4f} nats/byte of LayerNorm at 95% confidence and we cannot "
        f"tell them apart: {numbers}"
    )
    if p.mde is not None:
        text += f". Over seeds this design detects |Δ| ≥ {p.mde:.4f} with {POWER:.0%} power"
    need = comparison.get("seeds_to_detect_observed")
    if need is not None and abs(p.mean) > 0:
        text += f"; a true Δ of {abs(p.mean):.4f} would need about {need} seeds"
    return text + "."


def same_rates(s: dict) -> bool:
    """True when a variant's own chosen rate is LayerNorm's for every seed (then its two
    comparisons are one)."""
    return s["at_own_rate"]["rates"] == s["at_shared_rate"]["rates"]


def verdicts(variant: str, s: dict, base: dict, summary: dict) -> dict[str, str | None]:
    """The verdict sentences of a variant: at the shared rate and at its own chosen rate (None
    when that is the shared rate for every seed)."""
    out: dict[str, str | None] = {}
    sweep = len(summary["lrs"]) > 1
    for setting, name in (("at_shared_rate", "shared"), ("at_own_rate", "own")):
        comparison = s[setting]
        rates = _rate_text(comparison["rates"])
        finite = [v for v in comparison["baseline_losses"] if math.isfinite(v)]
        base_loss = statistics.fmean(finite) if finite else None
        if name == "own" and same_rates(s):
            out[name] = None
            continue
        if not sweep:
            where = f"at the one rate ({rates})"
        elif name == "shared":
            where = f"at LayerNorm's rate ({rates}" + (
                ", also its own choice)" if same_rates(s) else ")"
            )
        else:
            where = (
                f"each at its own rate ({s['label']} {rates}, LayerNorm "
                f"{_rate_text(comparison['baseline_rates'])[3:]})"
            )
        out[name] = f"**{where}**: " + conclusion(s["label"], comparison, base_loss)
    edges = {
        label: _edge(chosen, summary["lrs"])
        for label, chosen in ((s["label"], s["chosen_rates"]), ("LayerNorm", base["chosen_rates"]))
    }
    notes = [
        f"{label}'s chosen rate is the {edge} of the sweep" for label, edge in edges.items() if edge
    ]
    if sweep and notes:
        out["edge"] = (
            "; ".join(notes) + ": the best rate may lie beyond it, so an own-rate comparison "
            "shows what tuning within the sweep gives, not the optimum."
        )
    return out


def _edge(chosen: dict[str, str], lrs: Sequence[float]) -> str | None:
    """``"highest"`` / ``"lowest"`` when the rate chosen for most seeds is an end of the sweep."""
    if len(lrs) < 2:
        return None
    counts: dict[str, int] = {}
    for key in chosen.values():
        counts[key] = counts.get(key, 0) + 1
    mode = float(max(counts, key=lambda k: (counts[k], -float(k))))
    if mode == max(lrs):
        return "highest"
    return "lowest" if mode == min(lrs) else None


SUMMARY_COLUMNS = (
    "variant",
    "Δ vs LN, LN's rate [95% CI]",
    "Δ vs LN, own rate [95% CI]",
    "step ratio",
    "norm-only ratio",
)


def _delta_text(comparison: dict | None) -> str:
    if comparison is None:
        return "—"
    p = comparison["paired"]
    if p["mean"] is None:
        diverged = sum(d is None or d == math.inf for d in p["diffs"])
        return f"diverged ({diverged}/{p['n']})" if diverged else "one seed"
    return f"{p['mean']:+.4f} [{p['ci_low']:+.4f}, {p['ci_high']:+.4f}]"


def summary_rows(results: dict) -> list[tuple[str, ...]]:
    """The headline numbers per variant as text, under :data:`SUMMARY_COLUMNS` (for the CLI)."""
    rows = []
    for variant, s in results["summary"]["variants"].items():
        ratio = s["norm_time_ratio"]
        rows.append(
            (
                s["label"],
                _delta_text(s.get("at_shared_rate")) if variant != BASELINE else "—",
                _delta_text(s.get("at_own_rate")) if variant != BASELINE else "—",
                f"{s['step_time_ratio']:.2f}×",
                "—" if ratio is None else f"{ratio:.2f}×",
            )
        )
    return rows
