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


def main() -> None:
    app()
