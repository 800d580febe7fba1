"""The ``rmsnorm`` command. Each subcommand parses its options and calls a library function; no
logic lives here."""

from __future__ import annotations

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError as exc:  # the CLI's dependencies are the "lab" extra
    raise SystemExit(
        f"the rmsnorm command needs the lab extra ({exc.name} is missing): "
        "pip install 'rmsnorm[lab]'"
    ) from exc

app = typer.Typer(
    help="rmsnorm: RMSNorm / LayerNorm kernels and the lab that compares them.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


@app.callback()
def _root() -> None:
    """rmsnorm: RMSNorm / LayerNorm kernels and the lab that compares them."""


@app.command()
def info() -> None:
    """Versions of rmsnorm / torch / triton, the devices torch sees and the backend used on each."""
    from .info import environment

    table = Table(title="rmsnorm info", show_header=False)
    for key, value in environment().items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(value)
        table.add_row(key, "not installed" if value is None else str(value))
    console.print(table)


# --- training comparison (issue 7) ---
@app.command()
def compare(
    out: str = typer.Option(
        "compare-results", help="Folder for results.json, loss_curves.png, summary.md."
    ),
    variants: str = typer.Option(
        "layernorm,rmsnorm,prmsnorm",
        help="Comma-separated norms to train: layernorm (required: the baseline), rmsnorm, "
        "prmsnorm (p = 6.25%), none.",
    ),
    seeds: int = typer.Option(3, help="Runs per variant (seeds --seed, --seed + 1, ...)."),
    seed: int = typer.Option(0, help="First seed."),
    preset: str = typer.Option(
        "cpu", help="Model and schedule: cpu (≤ 3 min on 2 cores), gpu, tiny."
    ),
    text: str | None = typer.Option(
        None, help="Train on this text file instead of the stdlib corpus."
    ),
    device: str = typer.Option("auto", help="auto (cuda when available), cpu or cuda."),
    steps: int | None = typer.Option(None, help="Training steps (default: the preset's)."),
    batch_size: int | None = typer.Option(None, help="Sequences per step (default: the preset's)."),
    lr: float | None = typer.Option(None, help="Peak learning rate (default: the preset's)."),
    n_layers: int | None = typer.Option(None, help="Transformer blocks (default: the preset's)."),
    d_model: int | None = typer.Option(None, help="Model width (default: the preset's)."),
    n_heads: int | None = typer.Option(None, help="Attention heads (default: the preset's)."),
    seq_len: int | None = typer.Option(
        None, help="Context length in bytes (default: the preset's)."
    ),
    eval_interval: int | None = typer.Option(None, help="Steps between validation losses."),
    eval_batches: int | None = typer.Option(None, help="Batches per validation loss."),
    threads: int | None = typer.Option(
        None,
        help="torch CPU threads (default: torch's, one per core); 1 is steadier on a busy machine.",
    ),
) -> None:
    """Train the same small GPT-style LM with LayerNorm, RMSNorm and partial RMSNorm (only the norm
    changes) and write losses, step-time ratios and a summary into --out."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from .compare import (
        SUMMARY_COLUMNS,
        ArgumentError,
        compare_config,
        run_comparison,
        summary_rows,
        write_outputs,
    )

    try:
        cfg = compare_config(
            preset, variants=variants, seeds=seeds, seed=seed, text=text, device=device,
            steps=steps, batch_size=batch_size, lr=lr, n_layers=n_layers, d_model=d_model,
            n_heads=n_heads, seq_len=seq_len, eval_interval=eval_interval,
            eval_batches=eval_batches, threads=threads,
        )  # fmt: skip
        columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("training", total=None)

            def progress(done: int, total: int, description: str) -> None:
                bar.update(task, completed=done, total=total, description=description)

            results = run_comparison(cfg, progress)
        paths = write_outputs(results, out)
    except ArgumentError as exc:
        raise typer.BadParameter(exc.detail, param_hint=f"--{exc.param.replace('_', '-')}") from exc
    table = Table(title=f"rmsnorm compare ({results['wall_time_s']:.0f} s)")
    for column in SUMMARY_COLUMNS:
        table.add_column(column)
    for row in summary_rows(results):
        table.add_row(*row)
    console.print(table)
    for warning in results["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    for path in paths.values():
        console.print(f"wrote {path}")


def main() -> None:
    app()
