"""The figures of the report's pretrained-models section, from the ``real_models`` part of
``report.json`` (the primary text's results): |μ|/σ per block and kind of site against the i.i.d.
reference, with and without the first token; the largest activations per block; the cost of
centering each block alone; the interventions' costs beside the plain centering's; the per-block
statistics against the per-block cost."""

from __future__ import annotations

from pathlib import Path

from ...figures import legend_below, pyplot, save_figure

__all__ = [
    "ratio_by_block",
    "largest_by_block",
    "block_costs",
    "mechanism_bars",
    "predictor_scatter",
    "measured",
    "primary",
]

_KIND_COLORS = {
    "pre-norm": "tab:blue",
    "post-sublayer": "tab:orange",
    "qk-norm": "tab:green",
    "final": "tab:red",
    "post-ln": "tab:purple",
    "embedding": "tab:brown",
    "other": "tab:gray",
}


def measured(real: dict) -> list[dict]:
    """The models with results (not missing)."""
    return [m for m in real.get("models", []) if "texts" in m]


def primary(m: dict) -> dict:
    """A model's result on the primary text: ``{"stats", "swap"}``."""
    return next(iter(m["texts"].values()))


def _position(site: dict, n_blocks: int) -> float:
    """x of a site: its block, the final norm one past the last, embeddings at −1."""
    if site["layer"] is not None:
        return site["layer"]
    return n_blocks if site["kind"] == "final" else -1


def _by_kind(model: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in primary(model)["stats"]["sites"]:
        out.setdefault(s["kind"], []).append(s)
    return out


def _blocks(model: dict) -> int:
    layers = [s["layer"] for s in primary(model)["stats"]["sites"] if s["layer"] is not None]
    return max(layers) + 1 if layers else 0


def _mean_by_x(sites: list[dict], n: int, value) -> tuple[list[float], list[float]]:
    groups: dict[float, list[float]] = {}
    for s in sites:
        groups.setdefault(_position(s, n), []).append(value(s))
    xs = sorted(groups)
    return xs, [sum(groups[x]) / len(groups[x]) for x in xs]


def ratio_by_block(real: dict, path: Path) -> Path:
    """Per model, per kind of site: the median |μ|/σ (solid: all tokens; dashed: without the first
    token) and the 95th percentile (dotted) per block, against the i.i.d. median and 95% point at
    the residual width (grey)."""
    plt = pyplot()
    models = measured(real)
    fig, axes = plt.subplots(
        1, len(models), figsize=(4.6 * len(models), 4.2), squeeze=False, layout="constrained"
    )
    for ax, m in zip(axes[0], models, strict=True):
        n = _blocks(m)
        for kind, sites in _by_kind(m).items():
            color = _KIND_COLORS.get(kind, "tab:gray")
            for var, stat, style, label in (
                ("all", "ratio_median", "-", f"{kind}: median"),
                ("no_first", "ratio_median", "--", f"{kind}: median, no first token"),
                ("all", "ratio_p95", ":", f"{kind}: p95"),
            ):
                xs, ys = _mean_by_x(sites, n, lambda s, v=var, k=stat: s["variants"][v][k]["value"])
                ax.plot(xs, ys, style, color=color, marker="o", ms=2.5, lw=1.2, label=label)
        sites = primary(m)["stats"]["sites"]
        width = max(s["width"] for s in sites)
        iid = next(s["iid"] for s in sites if s["width"] == width)
        ax.axhline(iid["median"], color="0.45", lw=1, label=f"i.i.d. median, d = {width}")
        ax.axhline(iid["q95"], color="0.7", lw=1, label=f"i.i.d. 95% point, d = {width}")
        ax.set_yscale("log")
        ax.set_title(m["model"], fontsize=10)
        ax.set_xlabel(f"block (−1: embeddings; {n}: final norm)")
        ax.set_ylabel("|μ|/σ at the norm's input")
        ax.legend(fontsize=6, ncol=1)
    return save_figure(
        fig, path, "|μ|/σ per block and kind of site, with and without the first token"
    )


def largest_by_block(real: dict, path: Path) -> Path:
    """Per model: the largest |x| entering any norm of each block, on the first token and on the
    others (log scale)."""
    plt = pyplot()
    models = measured(real)
    fig, axes = plt.subplots(
        1, len(models), figsize=(4.6 * len(models), 3.8), squeeze=False, layout="constrained"
    )
    for ax, m in zip(axes[0], models, strict=True):
        n = _blocks(m)
        sites = primary(m)["stats"]["sites"]
        for key, label, color in (
            ("max_abs_first_token", "first token", "tab:red"),
            ("max_abs_other_tokens", "other tokens", "tab:blue"),
        ):
            groups: dict[float, float] = {}
            for s in sites:
                x = _position(s, n)
                groups[x] = max(groups.get(x, 0.0), s[key])
            xs = sorted(groups)
            ax.plot(xs, [groups[x] for x in xs], marker="o", ms=3, color=color, label=label)
        ax.set_yscale("log")
        ax.set_title(m["model"], fontsize=10)
        ax.set_xlabel(f"block (−1: embeddings; {n}: final norm)")
        ax.set_ylabel("largest |x| entering a norm")
        ax.legend(fontsize=7)
    return save_figure(fig, path, "The largest activations per block (log scale)")


def _cost_label(m: dict) -> str:
    return "KL, nats/token" if m["cost"] == "kl" else "1 − cosine of sentence embeddings"


def _errorbars(rows: list[dict]):
    values = [r["value"] for r in rows]
    lower = [max(r["value"] - r["lo"], 0.0) for r in rows]
    upper = [max(r["hi"] - r["value"], 0.0) for r in rows]
    return values, [lower, upper]


def block_costs(real: dict, path: Path) -> Path:
    """Per model: the cost of centering (MiniLM: swapping) the norms of one block alone, for every
    block, with its 95% interval over sequences (sentences), beside the cost of all of them at
    once (dashed), log scale."""
    plt = pyplot()
    models = [m for m in measured(real) if m["points"]]
    fig, axes = plt.subplots(
        1,
        max(1, len(models)),
        figsize=(4.6 * max(1, len(models)), 3.8),
        squeeze=False,
        layout="constrained",
    )
    for ax, m in zip(axes[0], models, strict=False):
        variants = primary(m)["swap"]["variants"]
        metric = m["cost"]
        rows = [(p["block"], variants[p["variant"]][metric]) for p in m["points"]]
        values, err = _errorbars([r for _, r in rows])
        ax.errorbar(
            [b for b, _ in rows],
            values,
            yerr=err,
            fmt="o",
            ms=3,
            capsize=2,
            label="one block alone",
        )
        whole = variants.get("all" if metric == "kl" else "naive:all")
        if whole is not None:
            ax.axhline(
                whole[metric]["value"], ls="--", color="tab:red", lw=1, label="every norm at once"
            )
        ax.set_yscale("log")
        ax.set_title(m["model"], fontsize=10)
        ax.set_xlabel("block")
        ax.set_ylabel(_cost_label(m))
        ax.legend(fontsize=7)
    return save_figure(fig, path, "The cost of centering one block at a time (95% intervals)")


def mechanism_bars(real: dict, path: Path) -> Path:
    """Per RMSNorm model: the cost (KL per token, log scale, 95% intervals over sequences) of the
    plain centering at every norm beside each intervention of the mechanism."""
    plt = pyplot()
    models = [m for m in measured(real) if m["cost"] == "kl"]
    fig, axes = plt.subplots(
        1,
        max(1, len(models)),
        figsize=(5.4 * max(1, len(models)), 4.0),
        squeeze=False,
        layout="constrained",
    )
    for ax, m in zip(axes[0], models, strict=False):
        variants = primary(m)["swap"]["variants"]
        names = ["all", *[k for k in variants if k.startswith("mech:")]]
        rows = [variants[k]["kl"] for k in names]
        values, err = _errorbars(rows)
        ys = list(range(len(names)))
        ax.barh(
            ys, values, xerr=err, color=["tab:red", *["tab:blue"] * (len(names) - 1)], capsize=2
        )
        ax.set_yticks(ys, ["centered (every norm)", *[k[5:] for k in names[1:]]], fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("KL(original ‖ variant), nats/token")
        ax.set_title(m["model"], fontsize=10)
    return save_figure(fig, path, "What removes the centering's cost? Interventions at every norm")


PANELS = (
    "|μ|/σ median",
    "|μ|/σ median, no massive channels",
    "shift / σ of ordinary channels",
    "largest |x|",
)


def predictor_scatter(real: dict, path: Path) -> Path:
    """Four per-block statistics against the measured cost of centering (MiniLM: swapping) that
    block alone (one point per block; KL for the causal models, 1 − cosine of the sentence
    embeddings for the encoder), log-log; Spearman's ρ within each model in the panel's title."""
    from matplotlib.ticker import NullFormatter

    plt = pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 4.4), layout="constrained")
    markers = ["o", "s", "^", "D"]
    per_model = (real.get("prediction") or {}).get("per_model", {})
    for ax, label in zip(axes, PANELS, strict=True):
        rhos = []
        for i, m in enumerate(measured(real)):
            pts = [p for p in m["points"] if p[label] and p["cost"] and p["cost"] > 0]
            rho = per_model.get(m["model"], {}).get(label, {}).get("rho")
            rhos.append(f"{m['model']} {'n/a' if rho is None else f'{rho:+.2f}'}")
            ax.scatter(
                [p[label] for p in pts],
                [p["cost"] for p in pts],
                s=14,
                marker=markers[i % len(markers)],
                label=f"{m['model']} (cost: {_cost_label(m)})",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap within a decade
        ax.set_xlabel(label)
        ax.set_ylabel("cost of centering this block alone")
        ax.set_title("Spearman ρ within model\n" + "\n".join(rhos), fontsize=8)
    legend_below(fig, axes[0], ncol=3)
    return save_figure(
        fig, path, "Does a per-block statistic predict the centering's end-to-end cost?"
    )
