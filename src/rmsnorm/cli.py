"""The ``rmsnorm`` command. Each subcommand parses its options and calls a library function; no
logic lives here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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


@app.command()
def warmup() -> None:
    """Compile (or load from the cache) the CPU kernels now, so that the first CPU op is fast."""
    from .kernels import cpu

    status = cpu.warmup()
    if not status["available"]:
        typer.echo("rmsnorm warmup: the CPU kernels are unavailable here (numba is missing)")
        return
    how = "compiled" if status["compiled"] else "loaded"
    where = status["cached_in"] or "nowhere: no writable cache directory"
    seconds = status["seconds"]
    typer.echo(f"rmsnorm warmup: CPU kernels {how} in {seconds:.1f} s (cached in {where})")


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


# --- centering lab: simulate / inspect / report ---
_LAB_FLAGS = {  # library argument names → the options of these commands, for error messages
    "n_layers": "--layers",
    "d_model": "--width",
    "n_heads": "--heads",
    "seq_len": "--seq-len",
    "train_steps": "--train-steps",
    "train_batch": "--train-batch",
    "init_std": "--init-std",
    "planted_mean": "--planted-mean",
    "norm_position": "--position",
}
_SIM_DIR = Path("simulation")
_REPORT_DIR = Path("report")
_Threads = Annotated[
    int | None, typer.Option("--threads", min=1, help="torch CPU threads (default: torch's).")
]
# The lab's models are small (width ≤ 256). On a 2-core machine shared with other processes a
# training step of the report's model took 0.2 s with one torch thread and 2.5 s with two (the
# worker threads wait on each other), so these commands default to one.
_LabThreads = Annotated[
    int | None,
    typer.Option(
        "--threads", min=1, help="torch CPU threads; 1 suits these small models on a shared CPU."
    ),
]
_TextFile = Annotated[
    Path | None, typer.Option(exists=True, dir_okay=False, help="A text file to run.")
]


def _lab_error(exc: Exception) -> typer.Exit:
    import re

    msg = str(exc)
    for name, flag in _LAB_FLAGS.items():
        msg = re.sub(rf"\b{name}\b", flag, msg)
    console.print(f"[bold red]error:[/] {msg}")
    return typer.Exit(code=2)


def _threads(n: int | None) -> None:
    if n is not None:
        import torch

        torch.set_num_threads(n)


@app.command()
def simulate(
    out: Annotated[Path, typer.Option(help="Output directory.")] = _SIM_DIR,
    layers: Annotated[int, typer.Option(min=1, help="Transformer blocks.")] = 12,
    width: Annotated[int, typer.Option(min=1, help="Model width d, divisible by --heads.")] = 256,
    heads: Annotated[int, typer.Option(min=1, help="Attention heads.")] = 4,
    seq_len: Annotated[int, typer.Option(min=1, help="Tokens per sequence.")] = 64,
    batch: Annotated[int, typer.Option(min=1, help="Sequences; tokens = batch × seq-len.")] = 16,
    seed: Annotated[int, typer.Option(min=0, help="Seed of weights and inputs.")] = 0,
    norm: Annotated[str, typer.Option(help="layernorm, rmsnorm, prmsnorm or none.")] = "layernorm",
    position: Annotated[str, typer.Option(help="pre (pre-LN) or post (post-LN).")] = "pre",
    init_std: Annotated[float, typer.Option(help="Std of the weights at init.")] = 0.02,
    inputs: Annotated[
        str, typer.Option(help="tokens, gaussian, text, or auto (tokens; text when training).")
    ] = "auto",
    text: _TextFile = None,
    planted_mean: Annotated[
        float, typer.Option(help="Constant added to every element of the input embeddings.")
    ] = 0.0,
    train_steps: Annotated[
        int, typer.Option(min=0, help="Train this many steps, then measure again.")
    ] = 0,
    train_batch: Annotated[int, typer.Option(min=1, help="Training batch size.")] = 16,
    threads: _LabThreads = 1,
) -> None:
    """The chapter's experiment: per-token μ, σ, RMS of the residual stream at every layer."""
    from .analysis.progress import RichProgress
    from .analysis.simulate import SimulationConfig, write_simulation
    from .analysis.simulate import simulate as run

    _threads(threads)
    try:
        cfg = SimulationConfig(
            n_layers=layers,
            d_model=width,
            n_heads=heads,
            seq_len=seq_len,
            batch=batch,
            seed=seed,
            norm=norm,
            norm_position=position,
            init_std=init_std,
            inputs=inputs,
            text=None if text is None else str(text),
            planted_mean=planted_mean,
            train_steps=train_steps,
            train_batch=train_batch,
        )
    except (ValueError, FileNotFoundError) as exc:
        raise _lab_error(exc) from None
    with RichProgress(console) as progress:
        result = run(cfg, progress)
        files = write_simulation(result, out, progress)
    table = Table(title=f"residual stream, {cfg.resolved_inputs} inputs", title_justify="left")
    for col in ("layer", "stage", "median |μ|/σ", "95% |μ|/σ", "mean cos(LN, RMS)"):
        table.add_column(col, justify="left" if col in ("layer", "stage") else "right")
    for stage, st in result.stages.items():
        for name, s in zip(result.layer_names, st.summary(), strict=True):
            r = s["mu_over_sigma"]
            cos = s["predicted_cosine"]["mean"]
            table.add_row(name, stage, f"{r['q50']:.4f}", f"{r['q95']:.4f}", f"{cos:.6f}")
    console.print(table)
    console.print(f"{result.seconds['total']:.1f} s; wrote " + ", ".join(map(str, files.values())))


@app.command()
def inspect(
    model: Annotated[
        str,
        typer.Option(
            help="A local Hugging Face model directory or a built-in name "
            "(builtin, builtin-rms, tiny-gpt2, tiny-llama)."
        ),
    ] = "builtin",
    text: Annotated[str | None, typer.Option(help="Text to run (default: random tokens).")] = None,
    text_file: _TextFile = None,
    batch: Annotated[int, typer.Option(min=1, help="Random-token sequences.")] = 4,
    seq_len: Annotated[int, typer.Option(min=1, help="Random-token sequence length.")] = 64,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the random tokens.")] = 0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the numbers to this file.")
    ] = None,
    threads: _Threads = None,
) -> None:
    """Hook every norm layer of a model: how centered are its inputs, what would a swap change?"""
    from .analysis.inspection import inspect_source, render_table
    from .analysis.io import write_json

    _threads(threads)
    if text_file is not None:
        text = text_file.read_text(errors="replace")
    try:
        with console.status(f"running {model} with hooks on its norm layers"):
            result = inspect_source(model, text, batch=batch, seq_len=seq_len, seed=seed)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise _lab_error(exc) from None
    console.print(render_table(result))
    if json_out is not None:
        write_json(result.to_dict(), json_out)
        console.print(f"wrote {json_out}")


@app.command()
def report(
    out: Annotated[Path, typer.Option(help="Output directory.")] = _REPORT_DIR,
    model: Annotated[
        str | None,
        typer.Option(help="Also inspect this model (local HF directory or built-in name)."),
    ] = None,
    text_file: _TextFile = None,
    train_steps: Annotated[
        int, typer.Option(min=0, help="Steps of the short training run (0 skips it).")
    ] = 60,
    planted_mean: Annotated[
        float, typer.Option(help="Offset of the planted-mean contrast run (0 skips it).")
    ] = 0.02,
    quick: Annotated[bool, typer.Option(help="Tiny sizes: every file in seconds.")] = False,
    threads: _LabThreads = 1,
) -> None:
    """The main job: the centering report (report.md, self-contained report.html, figures)."""
    from .analysis.progress import RichProgress
    from .analysis.report import ReportConfig, build_report

    _threads(threads)
    text = None if text_file is None else text_file.read_text(errors="replace")
    cfg = ReportConfig.from_options(
        quick=quick, model=model, text=text, planted_mean=planted_mean, train_steps=train_steps
    )
    try:
        with RichProgress(console) as progress:
            summary = build_report(cfg, out, progress)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise _lab_error(exc) from None
    sim, ident = summary["simulation"], summary["identity"]
    console.print(
        f"median |μ|/σ {sim['median_mu_over_sigma']:.4f}, mean cos(LN, RMSNorm) "
        f"{sim['mean_cosine']:.6f}; identity max rel error {ident['max_rel_error']:.1e}"
    )
    console.print(
        f"{summary['seconds']['total']:.1f} s; open {out / 'report.html'} (or {out / 'report.md'})"
    )


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
    from .analysis.progress import RichProgress
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
        with RichProgress(console) as progress:
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
