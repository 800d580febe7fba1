"""``rmsnorm compare``: the training comparison of the norms."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .._tables import show_table
from .._validate import ArgumentError
from ._shared import (
    _check_out,
    _fail,
    _non_negative,
    _positive,
    _positive_number,
    _progress,
    _reported,
    _require,
    _Threads,
    console,
    err_console,
    options,
)


def _override(what: str, *spelling: str):
    """An optional positive-integer option overriding the preset's value."""
    return typer.Option(*spelling, callback=_positive, help=f"{what} (default: the preset's).")


def compare(
    ctx: typer.Context,
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
    text: Annotated[
        Path | None,
        typer.Option("--text-file", help="Train on this text file instead of the stdlib corpus."),
    ] = None,
    device: Annotated[str, typer.Option(help="auto (cuda when available), cpu or cuda.")] = "auto",
    steps: Annotated[int | None, _override("Training steps")] = None,
    batch_size: Annotated[int | None, _override("Sequences per step", "--batch")] = None,
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
            text = None if text is None else str(text)
            skip = ("out", "full", "preset", "overwrite", "from_results")
            cfg = compare_config("full" if full else preset, **options(ctx, *skip, text=text))
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
    from ..lab.present import comparison_lines, comparison_table

    show_table(console, comparison_table(results))
    for line in comparison_lines(results, paths):
        console.print(line)
