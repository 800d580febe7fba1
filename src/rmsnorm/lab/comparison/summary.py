"""The statistics and verdicts of a training comparison: per variant the final validation loss
over seeds and its difference from LayerNorm's, judged by the seed-spread rule, and the step and
norm-only times as ratios to LayerNorm's."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .config import BASELINE, LABELS

# How the summary decides "within the seed spread": |Δ mean| ≤ SPREAD_FACTOR · max(seed std).
SPREAD_FACTOR = 2.0
RULE = (
    "a variant's final validation loss is called *within the seed spread* of LayerNorm's when "
    "|mean(variant) − mean(LayerNorm)| ≤ 2 × max(std(variant), std(LayerNorm)), with std the "
    "sample standard deviation over seeds. It is a rule of thumb for a handful of seeds, not a "
    "significance test."
)
# The first steps of every run allocate buffers and warm caches; step-time statistics skip them.
TIMING_SKIP_STEPS = 2


def _std(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def summarize(results: dict) -> dict:
    """Per variant: final validation loss (mean, std over seeds, per seed, paired Δ vs LayerNorm),
    the verdict of :data:`RULE`, median step time and tokens/s, and the norm-only time, each with
    its ratio to LayerNorm."""
    runs = results["runs"]
    cases = results["norm_timing"]["cases"]
    n_norms = results["norm_layers_per_model"]
    out: dict[str, dict] = {}
    for variant, seed_runs in runs.items():
        finals = [r["val_loss"][-1] for r in seed_runs]
        times = [t for r in seed_runs for t in r["step_time_s"][TIMING_SKIP_STEPS:]]
        times = times or [t for r in seed_runs for t in r["step_time_s"]]
        step_median = statistics.median(times)
        norm = statistics.median(cases[variant]["per_call_s"]) if variant in cases else 0.0
        out[variant] = {
            "label": LABELS[variant],
            "final_val_loss_mean": statistics.fmean(finals),
            "final_val_loss_std": _std(finals),
            "final_val_loss_per_seed": finals,
            "final_train_loss_mean": statistics.fmean(
                statistics.fmean(r["train_loss"][-10:]) for r in seed_runs
            ),
            "step_time_median_s": step_median,
            "tokens_per_s_median": seed_runs[0]["tokens_per_step"] / step_median,
            "norm_time_median_s": norm,
            "norm_share_of_step": n_norms * norm / step_median,
            "parameters": seed_runs[0]["parameters"],
            "norm_parameters": seed_runs[0]["norm_parameters"],
        }
    base = out[BASELINE]
    for variant, s in out.items():
        s["step_time_ratio"] = s["step_time_median_s"] / base["step_time_median_s"]
        s["norm_time_ratio"] = (
            s["norm_time_median_s"] / base["norm_time_median_s"] if variant in cases else None
        )
        paired = [
            a - b
            for a, b in zip(
                s["final_val_loss_per_seed"], base["final_val_loss_per_seed"], strict=True
            )
        ]
        s["delta_vs_layernorm_per_seed"] = paired
        s["delta_vs_layernorm"] = s["final_val_loss_mean"] - base["final_val_loss_mean"]
        stds = [v for v in (s["final_val_loss_std"], base["final_val_loss_std"]) if v is not None]
        s["spread_threshold"] = SPREAD_FACTOR * max(stds) if stds else None
        if variant == BASELINE or s["spread_threshold"] is None:
            s["within_spread"] = None
        else:
            s["within_spread"] = abs(s["delta_vs_layernorm"]) <= s["spread_threshold"]
    torch_cases = {}
    for name in ("torch_layer_norm", "torch_rms_norm"):
        if name in cases:
            torch_cases[name] = statistics.median(cases[name]["per_call_s"])
    if len(torch_cases) == 2:
        torch_cases["torch_rms_over_layer_norm"] = (
            torch_cases["torch_rms_norm"] / torch_cases["torch_layer_norm"]
        )
    for variant, s in out.items():
        s["verdict"] = None if variant == BASELINE else verdict(variant, s, base)
    return {"variants": out, "torch": torch_cases}


SUMMARY_COLUMNS = ("variant", "final val loss (nats/byte)", "step ratio", "norm-only ratio")


def summary_rows(results: dict) -> list[tuple[str, str, str, str]]:
    """The headline numbers per variant as text, under :data:`SUMMARY_COLUMNS` (for the CLI)."""
    rows = []
    for s in results["summary"]["variants"].values():
        std, ratio = s["final_val_loss_std"], s["norm_time_ratio"]
        rows.append(
            (
                s["label"],
                f"{s['final_val_loss_mean']:.4f}" + (f" ± {std:.4f}" if std is not None else ""),
                f"{s['step_time_ratio']:.2f}×",
                "—" if ratio is None else f"{ratio:.2f}×",
            )
        )
    return rows


def verdict(variant: str, s: dict, base: dict) -> str:
    """One plain sentence on a variant's final validation loss against LayerNorm's."""
    name = s["label"]
    loss = f"{s['final_val_loss_mean']:.3f}"
    if s["final_val_loss_std"] is not None:
        loss += f" ± {s['final_val_loss_std']:.3f}"
    speed = f" A whole training step took {s['step_time_ratio']:.2f}× LayerNorm's time" + (
        f", the norm layer alone {s['norm_time_ratio']:.2f}×."
        if s["norm_time_ratio"] is not None
        else " (no norm layers to time)."
    )
    if s["within_spread"] is None:
        return (
            f"**{name}**: final validation loss {loss} nats/byte; with one seed there is no "
            f"spread to judge the difference ({s['delta_vs_layernorm']:+.3f}) against." + speed
        )
    delta = s["delta_vs_layernorm"]
    head = (
        f"**{name}**: final validation loss {loss} nats/byte, {delta:+.3f} from LayerNorm's "
        f"{base['final_val_loss_mean']:.3f}"
    )
    if s["within_spread"]:
        body = (
            f"; that is within the seed spread (threshold {s['spread_threshold']:.3f}), so this "
            "run cannot tell it apart from LayerNorm."
        )
    else:
        side = "worse" if delta > 0 else "better"
        body = (
            f"; that is outside the seed spread (threshold {s['spread_threshold']:.3f}): "
            f"{name} is {side} than LayerNorm in this setting."
        )
    paired = s["delta_vs_layernorm_per_seed"]
    same_sign = all(d > 0 for d in paired) or all(d < 0 for d in paired)
    pairs = (
        f" Paired by seed (same initialization and data) the difference ranged from "
        f"{min(paired):+.3f} to {max(paired):+.3f}"
        + (f", the same sign in all {len(paired)} seeds." if same_sign else ", of both signs.")
    )
    return head + body + pairs + speed
