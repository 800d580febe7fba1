"""The library's commands: ``info``, ``warmup``, ``bench`` and ``convert``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .._tables import show_table
from ._shared import (
    _check_json_target,
    _check_out,
    _Json,
    _log,
    _positive,
    _positive_number,
    _reported,
    console,
    options,
)


def info() -> None:
    """Versions of rmsnorm / torch / triton, the devices torch sees and the backend used on each."""
    from ..info import environment

    env = environment()
    served = env.pop("served on cpu")
    table = Table(title="rmsnorm info", show_header=False)
    for key, value in env.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(value)
        table.add_row(key, "not installed" if value is None else str(value))
    show_table(console, table)
    # which path and backend serve a small CPU call: one row per function, one column per dtype,
    # each reason for a hand-off to the reference said once below
    calls = Table(title="served on cpu (a 2 × 8 call of each function): path · backend")
    calls.add_column("function")
    for dtype in served:
        calls.add_column(dtype)
    reasons: list[str] = []

    def cell(text: str) -> str:
        how, _, why = text.partition(" → reference: ")
        short = how.replace(" path, ", " · ").removesuffix(" backend")
        if not why:
            return short
        if why not in reasons:
            reasons.append(why)
        return f"{short} → reference ({reasons.index(why) + 1})"

    for op in next((v for v in served.values() if isinstance(v, dict)), {}):
        calls.add_row(op, *(cell(v[op]) if isinstance(v, dict) else v for v in served.values()))
    show_table(console, calls)
    for i, why in enumerate(reasons, 1):
        console.print(f"({i}) the backend hands the call to the reference: {why}")


def warmup() -> None:
    """Compile (or load from the cache) the CPU kernels now, so that the first CPU op is fast."""
    from ..kernels import cpu

    status = cpu.warmup()
    if not status["available"]:
        typer.echo("rmsnorm warmup: the CPU kernels are unavailable here (numba is missing)")
        return
    how = "compiled" if status["compiled"] else "loaded"
    where = status["cached_in"] or "nowhere: no writable cache directory"
    seconds = status["seconds"]
    typer.echo(f"rmsnorm warmup: CPU kernels {how} in {seconds:.1f} s (cached in {where})")


_BENCH_DIR = Path("benchmarks/results")


def bench(
    ctx: typer.Context,
    device: Annotated[
        str, typer.Option(help="auto (cuda when torch sees a GPU, else cpu), cuda or cpu.")
    ] = "auto",
    quick: Annotated[
        bool, typer.Option("--quick", help="A handful of shapes instead of the full run.")
    ] = False,
    out: Annotated[
        Path, typer.Option(help="Directory for <device>_bench.csv/.md/.png.")
    ] = _BENCH_DIR,
    variants: Annotated[
        bool,
        typer.Option(
            "--variants", help="Also time forced kernel layouts of this library (tuning data)."
        ),
    ] = False,
    budget_s: Annotated[
        float | None,
        typer.Option(
            "--budget",
            callback=_positive_number,
            help="Seconds for the main plan; what does not fit is skipped and logged.",
        ),
    ] = None,
    latency: Annotated[
        bool,
        typer.Option(
            "--latency",
            help="Time per call over M × N × dtype × pass against torch's norms and the targets; "
            "writes <device>_latency.csv/.md/.png.",
        ),
    ] = False,
    ops: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated ops to time (rms_norm, add_rms_norm, layer_norm, "
            "gated_rms_norm, gated_rms_norm_grouped); default: every op of the plan."
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace the files of an earlier run in --out."),
    ] = False,
) -> None:
    """Time this library against its peers; write a long-form CSV, a markdown table and a plot."""
    from .._progress import RichProgress
    from ..bench import resolve_device, run, summary

    _check_out("bench", out, overwrite=True)  # a file or a read-only folder; its files: run's check
    with _reported("bench", RuntimeError, ValueError, OSError):
        device = resolve_device(device)
        with RichProgress(console) as progress:
            ops = None if ops is None else [o.strip() for o in ops.split(",") if o.strip()]
            rows = run(**options(ctx, device=device, ops=ops), log=_log, progress=progress)
    if not latency:  # the latency mode logs its own summary
        _log(summary(rows))


# --- ecosystem: exact LayerNorm -> RMSNorm conversion ---
def convert(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(help="A local model directory.")],
    destination: Annotated[str, typer.Argument(help="Where to write the converted model.")],
    check_dtypes: Annotated[
        str, typer.Option(help="Comma-separated dtypes to compare the logits in.")
    ] = "float32,float64",
    batch: Annotated[int, typer.Option(callback=_positive, help="Random-token sequences.")] = 2,
    seq_len: Annotated[int, typer.Option(callback=_positive, help="Tokens per sequence.")] = 32,
    repeats: Annotated[
        int, typer.Option(callback=_positive, help="Forwards per median inference time.")
    ] = 10,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace DESTINATION if it is a non-empty directory (once the new model is "
            "complete), and an existing --json file.",
        ),
    ] = False,
    json_out: _Json = None,
) -> None:
    """Exact LayerNorm -> RMSNorm conversion of a pre-LN model.

    Reads the local model directory SOURCE (Hugging Face GPT-2 / GPT-NeoX,
    or the lab transformer), centers every layer writing into the residual
    stream, swaps each LayerNorm for an RMSNorm with the same weights
    (Jiang et al., NeurIPS 2023) and writes the result to DESTINATION:
    a new directory, or an empty one (--overwrite replaces a non-empty
    one), never SOURCE or a directory inside or around it. The model is
    written beside DESTINATION and renamed into place once complete, so
    a failure or Ctrl-C leaves DESTINATION as it was.
    Then compares the logits of both models on random tokens in each of
    --check-dtypes (comma-separated) and reports their median inference
    time over --repeats forwards; --json also writes the report.
    """
    import json

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .._files import write_text
    from ..convert import ConversionError, convert_directory
    from ..lab.models import transformer  # noqa: F401 (registers the lab's Transformer for it)

    _check_json_target("convert", json_out, overwrite)
    columns = SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()
    # The error line comes after the spinner has stopped (the with blocks close inside out).
    with (
        _reported("convert", ConversionError, OSError, ValueError, ImportError),
        Progress(*columns, console=console) as bar,
    ):
        task = bar.add_task("starting", total=None)

        def progress(message: str) -> None:
            bar.update(task, description=message)

        dtypes = tuple(check_dtypes.split(","))
        args = options(ctx, "json_out", check_dtypes=dtypes, progress=progress)
        report = convert_directory(**args)
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
    show_table(console, table)
    if json_out is not None:
        with _reported("convert", OSError):
            write_text(json.dumps(report.to_dict(), indent=2) + "\n", json_out)


COMMANDS = (info, warmup, bench, convert)
