"""A training comparison's figures: loss_curves.png (training loss, validation loss, the paired
difference from LayerNorm and the gradient norm, at LayerNorm's rate) and lr_sweep.png (final
loss and paired difference at every rate)."""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter

from ...stats.rows import median
from .config import BASELINE, LABELS
from .summary import lr_key, val_steps

COLORS = {"layernorm": "C0", "rmsnorm": "C1", "prmsnorm": "C2", "none": "C3"}


def _log_axis(ax, axis: str = "y") -> None:
    """A log axis labelled in plain numbers at 1, 1.5, 2, 2.5, 3, 4, 5, 7 × 10ⁿ (not 3×10⁰)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    target.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0)))
    target.set_minor_locator(NullLocator())
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


class _Deltas:
    """Paired differences from LayerNorm (mean and 95% interval per x) of every variant, drawn on
    one axis; where the no-norm baseline's differences dwarf the norms' (0.4 against 0.002), an
    inset shows the norms at their own scale, so neither hides the other."""

    def __init__(self) -> None:
        self.series: list[tuple[str, str, str, list, list, list, list]] = []

    def add(self, variant, label, xs, means, lows, highs) -> None:
        if xs:
            self.series.append((variant, COLORS[variant], label, xs, means, lows, highs))

    def _draw(self, ax, which) -> None:
        for _, color, label, xs, ys, lo, hi in which:
            err = [
                [y - a for y, a in zip(ys, lo, strict=True)],
                [b - y for y, b in zip(ys, hi, strict=True)],
            ]
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                color=color,
                marker="o",
                capsize=3,
                markersize=4,
                label=f"{label} − LayerNorm",
            )
        ax.axhline(0, color="0.4", linewidth=1)

    def draw(self, ax, log_x: bool = False) -> None:
        """Every series on ``ax``, with a legend clear of the inset when there is one."""
        self._draw(ax, self.series)
        norms = [s for s in self.series if s[0] != "none"]
        others = [s for s in self.series if s[0] == "none"]
        # typical sizes (medians: an early interval of two seeds can be wide)
        size = lambda group: median([abs(v) for s in group for v in s[5] + s[6]] or [0])
        small, big = size(norms), size(others)
        if not norms or not others or small == 0 or big < 5 * small:
            if self.series:
                ax.legend(fontsize=8)
            return
        ends = [v for s in others for v in s[5] + s[6]]
        up = abs(max(ends)) >= abs(min(ends))  # the baseline's differences lie above 0
        top = max(abs(v) for v in ends) * 1.1
        ax.set_ylim((-1.25 * top, top) if up else (-top, 1.25 * top))
        inset = ax.inset_axes([0.07, 0.04, 0.6, 0.4] if up else [0.07, 0.56, 0.6, 0.4])
        self._draw(inset, norms)
        if log_x:
            inset.set_xscale("log")
            inset.set_xticks(ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()])
            inset.minorticks_off()
        inset.set_title("the norms, zoomed", fontsize=8)
        inset.tick_params(labelsize=7)
        inset.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right" if up else "upper right")


def _runs_at(results: dict, variant: str, key: str) -> list[dict]:
    return sorted(
        (r for r in results["runs"][variant] if lr_key(r["lr"]) == key), key=lambda r: r["seed"]
    )


def _median_curve(series: list[list[float]]) -> list[float]:
    """Per step, the median over the runs that reached it (NaN where none did)."""
    length = max(len(x) for x in series)
    out = []
    for i in range(length):
        col = [x[i] for x in series if i < len(x) and math.isfinite(x[i])]
        out.append(median(col) if col else math.nan)
    return out


def _plot_shared_curves(results: dict, path: str | os.PathLike) -> None:
    """Four panels at LayerNorm's chosen rate (the most common over seeds): training loss of
    every run, unsmoothed, log axis; mean validation loss; the paired validation difference from
    LayerNorm with its 95% t interval at every evaluation; the gradient norm before clipping."""
    from matplotlib.figure import Figure  # lazy: matplotlib is the lab extra
    from scipy import stats

    cfg, summ = results["config"], results["summary"]
    tc, mc = cfg["train"], cfg["model"]
    key = Counter(summ["shared_rates"].values()).most_common(1)[0][0]
    n = len(summ["seeds"])
    fig = Figure(figsize=(13, 9.5), layout="constrained")
    (ax_tr, ax_val), (ax_d, ax_g) = fig.subplots(2, 2)
    chance = math.log(mc["vocab_size"])
    variants = list(summ["variants"])
    deltas = _Deltas()
    base = _runs_at(results, BASELINE, key)
    for vi, v in enumerate(variants):
        color, label = COLORS[v], LABELS[v]
        runs = _runs_at(results, v, key)
        losses = [[math.nan if x is None else x for x in r["train_loss"]] for r in runs]
        grads = [[math.nan if x is None else x for x in r["grad_norm"]] for r in runs]
        for r, y, g in zip(runs, losses, grads, strict=True):
            ax_tr.plot(range(1, len(y) + 1), y, color=color, alpha=0.25, linewidth=0.5)
            ax_g.plot(range(1, len(g) + 1), g, color=color, alpha=0.25, linewidth=0.5)
            if r.get("diverged_at") is not None:
                finite = [x for x in y if math.isfinite(x)]
                top = max(finite) if finite else chance
                ax_tr.plot([r["diverged_at"] + 1], [top], "x", color=color, markersize=9, mew=2)
        for ax, series in ((ax_tr, losses), (ax_g, grads)):
            med = _median_curve(series)
            ax.plot(range(1, len(med) + 1), med, color=color, linewidth=1.6, label=label)
        curve = summ["variants"][v]["by_lr"][key]["mean_val_curve"]
        steps = val_steps(runs)
        xs = [s for s, c in zip(steps, curve, strict=True) if c is not None]
        ys = [c for c in curve if c is not None]
        ax_val.plot(xs, ys, "o-", color=color, label=label, markersize=4)
        if v == BASELINE or n < 2:
            continue
        dx, dy, de = [], [], []
        for j, step in enumerate(steps):
            diffs = []
            for a, b in zip(runs, base, strict=True):
                va = a["val_loss"][j] if j < len(a["val_loss"]) else None
                vb = b["val_loss"][j] if j < len(b["val_loss"]) else None
                if va is not None and vb is not None and max(va, vb) <= chance:
                    diffs.append(va - vb)
            if len(diffs) == n:  # every seed below chance (so finite) at this evaluation
                mean = statistics.fmean(diffs)
                half = stats.t.ppf(0.975, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
                dx.append(step + (vi - 2) * tc["steps"] / 150)  # side by side, not on top
                dy.append(mean)
                de.append(half)
        deltas.add(
            v,
            label,
            dx,
            dy,
            [y - e for y, e in zip(dy, de, strict=True)],
            [y + e for y, e in zip(dy, de, strict=True)],
        )
    ax_tr.axhline(chance, color="0.4", linestyle=":", linewidth=1)
    ax_tr.text(
        tc["steps"],
        chance,
        f"ln {mc['vocab_size']} (chance) ",
        va="bottom",
        ha="right",
        fontsize=8,
        color="0.3",
    )
    for ax in (ax_tr, ax_g):
        ax.axvline(tc["warmup"], color="0.6", linestyle="--", linewidth=1)
    for ax in (ax_tr, ax_val, ax_g):
        _log_axis(ax)
    ax_g.axhline(tc["grad_clip"], color="0.4", linestyle=":", linewidth=1)
    deltas.draw(ax_d)
    ax_tr.set_title("Training loss per step (thin: each seed; thick: median; × diverged)")
    ax_val.set_title("Validation loss (report half), mean over seeds")
    ax_d.set_title(f"Paired Δ validation loss vs LayerNorm: mean, 95% t interval ({n} seeds)")
    ax_g.set_title("Gradient norm before clipping (thin: each seed; thick: median)")
    ax_tr.set_ylabel("cross-entropy (nats/byte, log scale)")
    ax_val.set_ylabel("cross-entropy (nats/byte, log scale)")
    ax_d.set_ylabel("Δ validation loss, variant − LayerNorm (nats/byte)")
    ax_g.set_ylabel(f"global L2 norm (log scale; dotted: clip at {tc['grad_clip']:g})")
    for ax in (ax_tr, ax_val, ax_d, ax_g):
        ax.set_xlabel(
            "training step" + (" (dashed: end of warm-up)" if ax in (ax_tr, ax_g) else "")
        )
        ax.grid(alpha=0.3)
        if ax is not ax_d and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    where = results["machine"]["gpu"] or results["machine"]["cpu"]
    fig.suptitle(
        f"{mc['n_layers']}-layer d={mc['d_model']} byte-level GPT on {results['corpus']['name']}, "
        f"every variant at LayerNorm's rate {key}, {n} paired seeds ({where})"
    )
    fig.savefig(path, dpi=110, format="png")


def plot_sweep(results: dict, path: str | os.PathLike) -> None:
    """Final report-half validation loss against the peak rate (every seed and the mean; a ring
    marks the rate each variant chose for most seeds), and the paired difference from LayerNorm
    at the same rate with its 95% t interval."""
    from matplotlib.figure import Figure

    cfg, summ = results["config"], results["summary"]
    mc = cfg["model"]
    n = len(summ["seeds"])
    fig = Figure(figsize=(13, 5.2), layout="constrained")
    ax_l, ax_d = fig.subplots(1, 2)
    lrs = summ["lrs"]
    deltas = _Deltas()
    every = [
        f
        for s in summ["variants"].values()
        for r in s["by_lr"].values()
        for f in r["final_val_loss_per_seed"]
        if f is not None and math.isfinite(f)
    ]
    top = max(every, default=math.log(mc["vocab_size"]))  # where "all diverged" is written
    for vi, (v, s) in enumerate(summ["variants"].items()):
        color, label = COLORS[v], LABELS[v]
        shift = 1.05 ** (vi - 1.5)  # the variants side by side along the log axis
        chosen = Counter(s["chosen_rates"].values()).most_common(1)[0][0]
        xs, means = [], []
        dx, dy, dlo, dhi = [], [], [], []
        for lr in lrs:
            r = s["by_lr"][lr_key(lr)]
            finite = [f for f in r["final_val_loss_per_seed"] if f is not None and math.isfinite(f)]
            ax_l.plot([lr * shift] * len(finite), finite, ".", color=color, alpha=0.4)
            if r["diverged"]:
                ax_l.annotate(
                    f"{r['diverged']}/{n}\ndiverged",
                    (lr * shift, max(finite, default=top)),
                    textcoords="offset points",
                    xytext=(0, 8),
                    ha="center",
                    fontsize=7,
                    color=color,
                )
            if r["final_val_loss_mean"] is not None:
                xs.append(lr * shift)
                means.append(r["final_val_loss_mean"])
                if lr_key(lr) == chosen:
                    ax_l.plot(
                        [lr * shift],
                        [r["final_val_loss_mean"]],
                        "o",
                        markersize=13,
                        markerfacecolor="none",
                        markeredgecolor=color,
                        mew=1.5,
                    )
            pv = r["paired_vs_layernorm"]
            if pv is not None and pv["mean"] is not None:
                dx.append(lr * shift)
                dy.append(pv["mean"])
                dlo.append(pv["ci_low"])
                dhi.append(pv["ci_high"])
            elif pv is not None and r["diverged"]:
                ax_d.annotate(
                    f"{r['diverged']}/{n} diverged",
                    (lr * shift, 0),
                    textcoords="offset points",
                    xytext=(0, 10 + 10 * vi),
                    ha="center",
                    fontsize=7,
                    color=color,
                )
        ax_l.plot(xs, means, "o-", color=color, label=label)
        if v != BASELINE:
            deltas.add(v, label, dx, dy, dlo, dhi)
    ax_l.plot(
        [],
        [],
        "o",
        markersize=11,
        markerfacecolor="none",
        markeredgecolor="0.3",
        label="rate chosen for most seeds",
    )
    for ax in (ax_l, ax_d):
        ax.set_xscale("log")
        ax.set_xticks(lrs, [lr_key(lr) for lr in lrs])
        ax.minorticks_off()
        ax.set_xlabel("peak learning rate (log scale)")
        ax.grid(alpha=0.3)
    deltas.draw(ax_d, log_x=True)
    ax_l.legend(fontsize=8)
    ax_l.set_ylabel("final validation loss (nats/byte)")
    ax_d.set_ylabel("Δ final validation loss, variant − LayerNorm (nats/byte)")
    ax_l.set_title("Final validation loss, report half (line: mean; dots: seeds)")
    ax_d.set_title(f"Paired Δ vs LayerNorm at the same rate, 95% t interval ({n} seeds)")
    fig.suptitle(
        f"Learning-rate sweep: {mc['n_layers']}-layer d={mc['d_model']} byte-level GPT, "
        f"{cfg['train']['steps']} steps per run"
    )
    fig.savefig(path, dpi=110, format="png")


def plot_losses(results: dict, path: str | os.PathLike) -> None:
    """``loss_curves.png``: the curves at LayerNorm's rate (see :func:`_plot_shared_curves`)."""
    _plot_shared_curves(results, path)
