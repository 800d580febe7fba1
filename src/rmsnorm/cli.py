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


# --- ecosystem: exact LayerNorm -> RMSNorm conversion ---
@app.command()
def convert(
    source: str,
    destination: str,
    check_dtypes: str = "float32,float64",
    batch: int = 2,
    seq_len: int = 32,
    repeats: int = 10,
    json_out: str = "",
) -> None:
    """Exact LayerNorm -> RMSNorm conversion of a pre-LN model.

    Reads the local model directory SOURCE (Hugging Face GPT-2 / GPT-NeoX,
    or the lab transformer), centers every layer writing into the residual
    stream, swaps each LayerNorm for an RMSNorm with the same weights
    (Jiang et al., NeurIPS 2023) and writes the result to DESTINATION.
    Then compares the logits of both models on random tokens in each of
    --check-dtypes (comma-separated) and reports their median inference
    time over --repeats forwards; --json-out also writes the report.
    """
    import json

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .convert import ConversionError, convert_directory

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as bar:
        task = bar.add_task("starting", total=None)
        try:
            report = convert_directory(
                source, destination, check_dtypes=tuple(check_dtypes.split(",")), batch=batch,
                seq_len=seq_len, repeats=repeats,
                progress=lambda message: bar.update(task, description=message),
            )  # fmt: skip
        except (ConversionError, FileNotFoundError, ValueError, ImportError) as exc:
            bar.stop()
            console.print(f"[red]rmsnorm convert: {exc}[/red]")
            raise typer.Exit(code=1) from exc
    table = Table(title=f"{report.architecture}: {source} -> {destination}")
    table.add_column("check")
    table.add_column("value", justify="right")
    for dtype, diff in report.max_abs_logit_diff.items():
        table.add_row(f"max |Δ logits| ({dtype})", f"{diff:.3e}")
    batch_shape = "×".join(map(str, report.tokens_shape))
    for variant, seconds in report.inference_s.items():
        table.add_row(f"inference {variant}, {batch_shape} tokens", f"{seconds * 1e3:.2f} ms")
    table.add_row("output head untied", "yes" if report.untied_head else "no (was not tied)")
    table.add_row("rmsnorm backend, torch threads", f"{report.backend}, {report.threads}")
    console.print(table)
    if json_out:
        with open(json_out, "w") as fh:
            json.dump(report.to_dict(), fh, indent=2)


def main() -> None:
    app()
