"""The swap's cost on the trained LayerNorm models, naive and exact (measured by the run's
:func:`~rmsnorm.lab.experiments.swap.swap_over_seeds`): its part of ``report.json`` (:func:`data`,
the summary over seeds from :func:`numbers`), its figure (:func:`figures`, drawn by
:func:`swap_figure`) and its words."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...figures import legend_below, pyplot, save_figure
from ...page import Page
from ...stats.rows import spread
from .common import range_text

if TYPE_CHECKING:
    from ..run import ReportResults


def numbers(swap: dict) -> dict:
    """The summary over seeds of :func:`~rmsnorm.lab.experiments.swap.swap_over_seeds`'s costs
    (``swap``): every seed's costs, and the spreads and worst cases the words state."""
    per_seed = swap["per_seed"]
    names = per_seed[0]["norms"]

    def over_seeds(kind: str, key: str, scope: str = "all") -> dict:
        if scope == "all":
            return spread([c[kind]["all"][key] for c in per_seed])
        return spread([c[kind]["one"][n][key] for c in per_seed for n in names])

    one_worst = {n: max(c["naive"]["one"][n]["kl_mean"] for c in per_seed) for n in names}
    worst = max(one_worst, key=one_worst.get)
    exact = [
        abs(cost[key])
        for c in per_seed
        for cost in [c["exact"]["all"], *c["exact"]["one"].values()]
        for key in ("kl_mean", "max_abs_logit_diff", "delta_loss")
    ]
    exact_max = max(exact)
    return {
        "per_seed": per_seed,
        "reference": "Jiang et al., NeurIPS 2023",
        "tokens": swap["tokens"],
        "norms": names,
        "loss": spread([c["loss"] for c in per_seed]),
        "naive_all": {
            k: over_seeds("naive", k)
            for k in ("kl_mean", "kl_max", "delta_loss", "max_abs_logit_diff", "logit_rms")
        },
        "exact_all": {
            k: over_seeds("exact", k) for k in ("kl_mean", "delta_loss", "max_abs_logit_diff")
        },
        "naive_one_kl": over_seeds("naive", "kl_mean", "one"),
        "naive_one_worst_norm": worst,
        "naive_one_worst_kl": one_worst[worst],
        "naive_one_kl_max_by_norm": one_worst,
        "exact_max_abs": exact_max,
    }


def data(r: ReportResults) -> dict:
    """``swap``: :func:`numbers` of the run's swap costs ({} when training did not run)."""
    return {} if r.swap is None else {"swap": numbers(r.swap)}


def figures(r: ReportResults, out: Path) -> dict[str, Path]:
    """``swap``: :func:`swap_figure` ({} when training did not run)."""
    return {} if r.swap is None else {"swap": swap_figure(numbers(r.swap), out / "swap.png")}


def swap_figure(swap: dict, path: Path) -> Path:
    """KL(original ‖ swapped) per token for every LayerNorm swapped alone and for all at once,
    naive and exact, one point per seed (log axis; exact zeros drawn at the floor)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.4), layout="constrained")
    names = ["all at once"] + swap["norms"]
    floor = 1e-20
    for kind, color, dx in (("naive", "#ff7f0e", -0.12), ("exact", "#2ca02c", 0.12)):
        for j, c in enumerate(swap["per_seed"]):
            values = [c[kind]["all"]["kl_mean"]] + [c[kind]["one"][n]["kl_mean"] for n in names[1:]]
            ax.plot(
                [i + dx for i in range(len(names))],
                [max(v, floor) for v in values],
                "o",
                color=color,
                ms=5,
                alpha=0.8,
                mec="black",
                mew=0.3,
                label=f"{kind} swap, one point per seed" if j == 0 else None,
            )
    ax.axhline(floor, color="gray", lw=0.6, ls=":", label=f"0 is drawn at {floor:g}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("which LayerNorm is replaced by RMSNorm")
    ax.set_ylabel("KL(original ‖ swapped), mean over tokens (nats, log)")
    ax.set_title(
        "The swap's end-to-end cost on the trained LayerNorm models\n"
        "naive: same γ, β, ε; exact: residual writers centered first",
        fontsize=10,
    )
    ax.grid(alpha=0.3, which="both", axis="y")
    legend_below(fig, ax, ncol=3)
    return save_figure(fig, path)


def words(page: Page, j: dict, figures: dict[str, Path]) -> None:
    sw = j.get("swap")
    if sw is None:
        return
    page.h2("The swap's end-to-end cost")
    page.p(
        "On each trained LayerNorm model: every LayerNorm replaced by RMSNorm (a) naively, "
        "γ·x/√(mean(x²) + ε) + β with the same γ, β, ε, and (b) by the exact conversion "
        "(`rmsnorm.convert.layernorm_to_rmsnorm`: the layers writing into the residual stream "
        f"centered first, {sw['reference']}), all norms at once and one at a time; compared on "
        f"{sw['tokens'][0]} × {sw['tokens'][1]} of the held-out bytes in float64: "
        "KL(original ‖ swapped) of the next-byte distributions "
        "(mean over tokens), the change of the loss, and max |Δ logits|."
    )
    rows = []
    for c in sw["per_seed"]:
        for kind in ("naive", "exact"):
            a = c[kind]["all"]
            rows.append(
                [
                    str(c["seed"]),
                    kind,
                    f"{a['kl_mean']:.2e}",
                    f"{a['kl_max']:.2e}",
                    f"{a['delta_loss']:+.2e}",
                    f"{a['max_abs_logit_diff']:.2e}",
                    f"{a['logit_rms']:.2f}",
                ]
            )
    page.table(
        [
            "seed",
            "swap",
            "KL mean (nats)",
            "KL worst token",
            "Δ loss (nats/byte)",
            "max |Δ logits|",
            "RMS of the logits",
        ],
        rows,
    )
    page.p(
        f"One norm at a time, the naive swap costs KL {range_text(sw['naive_one_kl'], '.1e')} "
        "nats; "
        f"the costliest is {sw['naive_one_worst_norm']} (up to {sw['naive_one_worst_kl']:.1e}). "
        f"The exact conversion's largest |difference| over every variant and measure is "
        f"{sw['exact_max_abs']:.0e}: rounding, since it computes the same function. The naive "
        "cost is the real price of dropping the centering in these models; per layer it follows "
        f"from the |μ|/σ of what each norm reads ({page.ref('divergence')}) through "
        "cos = 1/√(1 + (μ/σ)²)."
    )
    page.figure(
        figures["swap"],
        "KL(original ‖ swapped) per token, naive and exact, per swapped norm and for all at once; "
        "one point per seed.",
    )
