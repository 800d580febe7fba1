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


def _log(message: str) -> None:
    console.print(message, markup=False, highlight=False)


@app.command()
def bench(
    device: str = typer.Option("cuda", help="cuda or cpu"),
    quick: bool = typer.Option(
        False, "--quick", help="a handful of shapes instead of the full run"
    ),
    out: str = typer.Option("benchmarks/results", help="directory for <device>_bench.csv/.md/.png"),
    variants: bool = typer.Option(
        False, "--variants", help="also time forced kernel layouts of this library (tuning data)"
    ),
    budget: float = typer.Option(
        None, help="seconds for the main plan; what does not fit is skipped and logged"
    ),
) -> None:
    """Time this library against its peers; write a long-form CSV, a markdown table and a plot."""
    from .bench import run, summary

    try:
        rows = run(
            device=device, quick=quick, out=out, variants=variants, budget_s=budget, log=_log
        )
    except (NotImplementedError, RuntimeError, ValueError) as exc:
        console.print(f"[red]rmsnorm bench: {exc}[/red]")
        raise typer.Exit(2) from exc
    _log(summary(rows))


def main() -> None:
    app()
