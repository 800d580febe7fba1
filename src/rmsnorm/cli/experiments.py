"""The lab's commands: ``simulate``, ``inspect``, ``report`` and ``recover``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .._tables import show_table
from ._shared import (
    _check_json_target,
    _check_out,
    _fail,
    _Json,
    _LabThreads,
    _non_negative,
    _OverwriteOut,
    _positive,
    _progress,
    _reported,
    _require,
    _set_torch_threads,
    _TextFile,
    console,
    err_console,
    options,
)

_SIM_DIR = Path("simulation")
_REPORT_DIR = Path("report")


_Seeds = Annotated[
    int | None,
    typer.Option(
        callback=_positive,
        help="Run at this many seeds (--seed, --seed + 1, ...) for a verdict on the centering "
        "that rests on the seed-to-seed spread (default 8; 1 with --train-steps, where each seed "
        "trains).",
    ),
]


def simulate(
    ctx: typer.Context,
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
    norm_position: Annotated[
        str, typer.Option("--position", help="pre (pre-LN) or post (post-LN).")
    ] = "pre",
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
    text: _TextFile = None,
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
    from ..lab.experiments.simulation.seeds import replicate
    from ..lab.present import simulation_lines, simulation_table

    _require("simulate", "matplotlib", "scipy")
    _check_out("simulate", out, overwrite, ("simulation.json",))
    _set_torch_threads(threads)
    with _reported("simulate", ValueError, OSError):
        skip = ("out", "seeds", "threads", "overwrite")
        text = None if text is None else str(text)
        cfg = SimulationConfig(**options(ctx, *skip, text=text))
    if seeds is None:
        seeds = 1 if cfg.train_steps else 8
    with _reported("simulate", OSError), _progress() as progress:
        study = replicate(cfg, seeds, progress, "simulate")
        files = write_simulation(study.results[0], out, progress)
        if seeds > 1:
            files.update(write_seed_study(study, out, progress))
    show_table(console, simulation_table(study))
    for line in simulation_lines(study):
        console.print(line, markup=False)
    console.print(f"{study.seconds:.1f} s; wrote " + ", ".join(map(str, files.values())))


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


def report(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Output directory.")] = _REPORT_DIR,
    model: Annotated[
        str | None,
        typer.Option(help="Also inspect this model (local HF directory or built-in name)."),
    ] = None,
    text: _TextFile = None,
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
    from ..lab.present import verdict_line
    from ..lab.report import ReportConfig, build_report
    from ..lab.report.render import REPORT_FILES

    _require("report", "matplotlib", "scipy")
    _check_out("report", out, overwrite, ("report.json",), own=REPORT_FILES)
    _set_torch_threads(threads)
    text = None if text is None else text.read_text(errors="replace")
    had = out.is_dir() and any(out.iterdir())
    kept = f"the earlier report in {out} is as it was" if had else "nothing was written"
    with _reported("report", ValueError, OSError, ImportError):
        recovery = None if recovery is None else str(recovery)
        skip = ("out", "threads", "overwrite")
        cfg = ReportConfig.from_options(**options(ctx, *skip, text=text, recovery=recovery))
        try:
            with _progress() as progress:
                summary = build_report(cfg, out, progress)
        except KeyboardInterrupt:
            raise _fail("report", f"interrupted; {kept}", code=130) from None
    sim, ident = summary["simulation"], summary["identity"]
    console.print(
        verdict_line("at initialization", sim["verdict"])
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


def recover(
    ctx: typer.Context,
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
        # options not given keep the configuration's values
        given = options(ctx, "out", "quick", "overwrite", "steps", "model")
        overrides = {name: value for name, value in given.items() if value is not None}
        if steps is not None:
            overrides["encoder_steps"] = overrides["causal_steps"] = steps
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


COMMANDS = (simulate, inspect, report, recover)
