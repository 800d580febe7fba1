"""What the lab's commands print: the tables (rich tables, which the command shows as a box table on
a terminal and as Markdown elsewhere) and the lines of plain text under them, drawn from the
results the experiments return. rich is imported inside the functions: importing the lab needs
none of the extras."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

    from .experiments.simulation.seeds import SeedStudy

__all__ = [
    "comparison_lines",
    "comparison_table",
    "simulation_lines",
    "simulation_table",
    "verdict_line",
]


def verdict_line(name: str, verdict: Mapping) -> str:
    """The verdict on the centering over seeds (``SeedVerdict.to_dict()``) in one line."""
    v = verdict
    if v["n"] < 2:
        return f"{name}: one seed has no spread; --seeds 8 gives a verdict"
    return (
        f"{name}: median |μ|/σ ÷ i.i.d. median {v['ratio']:.3f} over {v['n']} seeds, "
        f"{100 * v['confidence']:.0f}% interval {v['ci_low']:.3f}–{v['ci_high']:.3f} "
        f"(seed SD {100 * v['seed_sd']:.0f}%): {v['verdict']}"
    )


def _stages(study: SeedStudy) -> dict[str, SeedStudy]:
    """The study at initialization and, where the runs trained, the same runs after training."""
    from .experiments.simulation.seeds import SeedStudy

    studies = {"init": study}
    if study.results[0].trained is not None:
        studies["trained"] = SeedStudy(study.config, study.results, stage="trained")
    return studies


def simulation_table(study: SeedStudy) -> Table:
    """``rmsnorm simulate``'s table: one row per layer and stage, the median |μ|/σ and the
    token-shared share of μ² with, over several seeds, their range and the layer's verdict, or at
    one seed the 95th percentile of |μ|/σ and the mean cosine of the two norms' outputs."""
    from rich.table import Table

    result = study.results[0]
    seeds = len(study.results)
    many = seeds > 1
    title = f"residual stream, {study.config.resolved_inputs} inputs" + (
        f", median over {seeds} seeds" if many else f", seed {study.config.seed}"
    )
    table = Table(title=title, title_justify="left")
    columns = ["layer", "stage", "median |μ|/σ"]
    columns += ["seed range", "verdict"] if many else ["95% |μ|/σ", "mean cos(LN, RMS)"]
    columns += ["shared\nshare"]
    for col in columns:
        table.add_column(
            col,
            justify="left" if col in ("layer", "stage", "verdict") else "right",
            overflow="fold",
        )
    for stage, st in _stages(study).items():
        band = st.band("median_ratio")
        shares = st.band("shared_share")
        per_layer = result.stages[stage].summary()
        for i, name in enumerate(result.layer_names):
            row = [name, stage, f"{band['median'][i]:.4f}"]
            if many:
                row += [f"{band['min'][i]:.3g}–{band['max'][i]:.3g}", st.layer_verdicts[i].verdict]
            else:
                s = per_layer[i]
                row += [f"{s['mu_over_sigma']['q95']:.4f}", f"{s['predicted_cosine']['mean']:.6f}"]
            row.append(f"{100 * shares['median'][i]:.1f}%")
            table.add_row(*row)
    return table


def simulation_lines(study: SeedStudy) -> list[str]:
    """The lines under the table: each stage's verdict over all layers and, at initialization,
    where the token-shared offset of the last layer came from."""
    lines = []
    last = study.results[0].layer_names[-1]
    for stage, st in _stages(study).items():
        lines.append(verdict_line(f"{stage}, all layers", st.verdict.to_dict()))
        origin = st.origin()
        if origin is not None and stage == "init":
            lines.append(
                f"token-shared offset at {last}: the MLPs wrote "
                f"{100 * origin['mlp_explained']:.0f}% of Σ m̄² (activation mean over tokens: "
                f"{origin['activation_mean']:.4f} averaged over units)"
            )
    return lines


def comparison_table(results: Mapping) -> Table:
    """``rmsnorm compare``'s headline table (nats per byte) of a comparison's results."""
    from rich.table import Table

    from .experiments.comparison import SUMMARY_COLUMNS, summary_rows

    table = Table(title=f"rmsnorm compare ({results['wall_time_s']:.0f} s), nats/byte")
    for column in SUMMARY_COLUMNS:
        table.add_column(column)
    for row in summary_rows(results):
        table.add_row(*row)
    return table


def comparison_lines(results: Mapping, paths: Mapping) -> list[str]:
    """The lines under the table, in rich markup: the comparison's warnings and the files
    written."""
    lines = [f"[yellow]warning:[/yellow] {warning}" for warning in results["warnings"]]
    return lines + [f"wrote {path}" for path in paths.values()]
