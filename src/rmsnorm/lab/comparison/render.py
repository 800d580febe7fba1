"""What a training comparison writes: ``results.json``, ``loss_curves.png`` (losses per variant)
and ``summary.md`` (the table, the verdicts, the norm-only timing, the setup and the command that
reproduces the run)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from ..io import write_json
from .config import (
    BASELINE,
    DEFAULT_VARIANTS,
    LABELS,
    MODEL_OPTIONS,
    PRESETS,
    TRAIN_OPTIONS,
    ArgumentError,
)
from .summary import RULE, TIMING_SKIP_STEPS


def _fmt_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def reproduce_command(cfg: dict) -> str:
    """The ``rmsnorm compare`` command line that repeats a run (``cfg`` as in the JSON)."""
    args = ["rmsnorm compare"]
    preset = PRESETS[cfg["preset"]]
    if cfg["preset"] != "cpu":
        args.append(f"--preset {cfg['preset']}")
    if tuple(cfg["variants"]) != DEFAULT_VARIANTS:
        args.append(f"--variants {','.join(cfg['variants'])}")
    for name, default in (("seeds", 3), ("seed", 0), ("threads", None)):
        if cfg[name] != default:
            args.append(f"--{name} {cfg[name]}")
    for group, names in (("model", MODEL_OPTIONS), ("train", TRAIN_OPTIONS)):
        for name in names:
            if cfg[group][name] != preset[group][name]:
                args.append(f"--{name.replace('_', '-')} {cfg[group][name]}")
    if cfg["text"] is not None:
        args.append(f"--text-file {cfg['text']}")
    return " ".join(args + ["--out DIR"])


def render_markdown(results: dict) -> str:
    """The Markdown summary (``summary.md``)."""
    cfg, m, summ = results["config"], results["machine"], results["summary"]
    sv, base = summ["variants"], summ["variants"][BASELINE]
    mc, tc, corpus = cfg["model"], cfg["train"], results["corpus"]
    nt = results["norm_timing"]
    seeds = results.get("seeds_completed", cfg["seeds"])
    lines = [
        "# Training comparison: LayerNorm vs RMSNorm vs partial RMSNorm",
        "",
    ]
    if seeds < cfg["seeds"]:
        lines += [
            f"**Partial results: {seeds} of {cfg['seeds']} seeds finished** (the run was "
            "stopped or is still running; the file is rewritten after every seed).",
            "",
        ]
    lines += [
        f"Same GPT-style byte-level language model, same {seeds} seed(s) "
        f"({cfg['seed']}–{cfg['seed'] + seeds - 1}), same data order, same initialization of every "
        "shared parameter (checked by SHA-256 in the JSON), same optimizer and schedule; only the "
        "normalization changes. Losses in nats/byte (cross-entropy of the next byte).",
        "",
        "## Results",
        "",
        "| variant | final val loss (mean ± std) | Δ vs LayerNorm | Δ per seed (paired) "
        "| step time (median) | tokens/s | step ratio vs LN | norm-only ratio vs LN |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, s in sv.items():
        std = s["final_val_loss_std"]
        loss = f"{s['final_val_loss_mean']:.4f}" + (f" ± {std:.4f}" if std is not None else "")
        paired = ", ".join(f"{d:+.4f}" for d in s["delta_vs_layernorm_per_seed"])
        norm_ratio = f"{s['norm_time_ratio']:.2f}×" if s["norm_time_ratio"] is not None else "—"
        delta = "—" if variant == BASELINE else f"{s['delta_vs_layernorm']:+.4f}"
        paired = "—" if variant == BASELINE else paired
        lines.append(
            f"| {s['label']} | {loss} | {delta} "
            f"| {paired} | {_fmt_time(s['step_time_median_s'])} "
            f"| {s['tokens_per_s_median']:,.0f} | {s['step_time_ratio']:.2f}× | {norm_ratio} |"
        )
    lines += ["", *[f"- {s['verdict']}" for v, s in sv.items() if v != BASELINE], ""]
    lines += [f"**Warning**: {w}\n" for w in results.get("warnings", [])]
    lines += [
        f"Rule: {RULE}",
        "",
        "## Norm layers alone",
        "",
        f"One {nt['what']} at the model's activation shape {tuple(nt['shape'])} {nt['dtype']}, "
        "timed with `torch.utils.benchmark`'s `blocked_autorange` (at least "
        f"{nt['seconds_per_sample']:g} s of back-to-back calls per sample, the cases taking "
        "turns), in samples interleaved with the training; median per call over "
        f"{len(next(iter(nt['cases'].values()))['per_call_s'])} samples. The model "
        f"calls its norm {results['norm_layers_per_model']} times per forward pass.",
        "",
        "| norm | per call (fwd+bwd) | ratio vs rmsnorm LayerNorm | share of a training step |",
        "|---|---|---|---|",
    ]
    base_norm = base["norm_time_median_s"]
    for name, case in nt["cases"].items():
        med = statistics.median(case["per_call_s"])
        share = f"{sv[name]['norm_share_of_step']:.1%}" if name in sv else "— (not in the model)"
        lines.append(f"| {case['label']} | {_fmt_time(med)} | {med / base_norm:.2f}× | {share} |")
    backend = m["backend"]
    lines += [
        "",
        f"The library's modules ran on the `{backend}` backend"
        + (
            " (the plain-PyTorch spec: the fast CPU kernels were not available to this run)."
            if backend == "reference"
            else "."
        ),
        "",
        "## Setup",
        "",
        f"- Model: {mc['n_layers']} layers, d_model {mc['d_model']}, {mc['n_heads']} heads, "
        f"seq_len {mc['seq_len']}, MLP ×{mc['mlp_ratio']}, {mc['norm_position']}-norm, "
        f"eps {mc['eps']}, pRMSNorm p = {mc['partial']:.2%}; "
        + ", ".join(f"{s['label']} {s['parameters']:,} parameters" for s in sv.values())
        + ".",
        f"- Training: {tc['steps']} steps, batch {tc['batch_size']} × {mc['seq_len']} = "
        f"{tc['batch_size'] * mc['seq_len']:,} bytes/step, AdamW lr {tc['lr']} (β = 0.9, 0.95, "
        f"weight decay {tc['weight_decay']}), {tc['warmup']} warm-up steps then cosine to 10%, "
        f"gradient clip {tc['grad_clip']}; validation every {tc['eval_interval']} steps on "
        f"{tc['eval_batches']} × {tc['batch_size']} fixed windows.",
        f"- Data: {corpus['name']}, {corpus['train_bytes']:,} training bytes, "
        f"{corpus['val_bytes']:,} held-out validation bytes (the last 10%), "
        f"{len(corpus['sources'])} source file(s).",
        f"- Machine: {m['cpu']}, {m['cpu_cores']} cores, torch threads: {m['torch_threads']}"
        + (f", GPU {m['gpu']}" if m["gpu"] else "")
        + f"; device {m['device']}; torch {m['torch']}, Python {m['python']}, "
        f"rmsnorm {m['rmsnorm']} at commit {m['commit']}.",
        f"- Wall time {results['wall_time_s']:.0f} s; load average at start "
        f"{results['load_average']['start']}, at end {results['load_average']['end']}. Step "
        f"times are medians over every step after the first {TIMING_SKIP_STEPS} of every seed; "
        "variants ran in lockstep (one step each, rotating order) so they share the machine's "
        "load.",
        "",
        f"Reproduce: `{reproduce_command(cfg)}`.",
        "",
    ]
    return "\n".join(lines)


def _moving_average(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_losses(results: dict, path: str | os.PathLike) -> None:
    """Training loss (moving average, mean ± std over seeds) and validation loss (mean ± std) of
    every variant on one figure."""
    from matplotlib.figure import Figure  # lazy: matplotlib is the lab extra

    cfg = results["config"]
    steps = cfg["train"]["steps"]
    window = max(1, steps // 20)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax_train, ax_val = fig.subplots(1, 2)
    colors = {"layernorm": "C0", "rmsnorm": "C1", "prmsnorm": "C2", "none": "C3"}
    late_values = []
    for variant, seed_runs in results["runs"].items():
        color, label = colors[variant], LABELS[variant]
        smooth = [_moving_average(r["train_loss"], window) for r in seed_runs]
        x = list(range(1, steps + 1))
        mean = [statistics.fmean(col) for col in zip(*smooth, strict=True)]
        std = [statistics.pstdev(col) for col in zip(*smooth, strict=True)]
        ax_train.plot(x, mean, color=color, label=label)
        ax_train.fill_between(
            x, [m - s for m, s in zip(mean, std, strict=True)],
            [m + s for m, s in zip(mean, std, strict=True)], color=color, alpha=0.2, linewidth=0,
        )  # fmt: skip
        # nudge each variant's validation points sideways so the error bars do not hide each other
        dodge = (list(results["runs"]).index(variant) - 1) * steps / 150
        vx = [v + dodge for v in seed_runs[0]["val_steps"]]
        vals = list(zip(*(r["val_loss"] for r in seed_runs), strict=True))
        vmean = [statistics.fmean(v) for v in vals]
        vstd = [statistics.pstdev(v) for v in vals]
        ax_val.errorbar(vx, vmean, yerr=vstd, color=color, label=label, marker="o", capsize=3)
        late_values += mean[len(mean) // 10 :] + vmean
    # The first steps fall from ln 256 ≈ 5.5 nats; clip the top so the late differences show.
    if late_values:
        top = max(late_values) + 0.05
        bottom = min(late_values) - 0.05
        ax_train.set_ylim(bottom, top)
    n = len(next(iter(results["runs"].values())))  # seeds finished
    spread = "± std over seeds (shaded)" if n > 1 else "one seed"
    ax_train.set_title(f"Training loss, moving average over {window} steps, {spread}")
    ax_val.set_title(f"Validation loss (held-out bytes), mean ± std over {n} seed(s)")
    for ax in (ax_train, ax_val):
        ax.set_xlabel("training step")
        ax.set_ylabel("cross-entropy (nats/byte)")
        ax.grid(alpha=0.3)
        ax.legend()
    mc = cfg["model"]
    machine = results["machine"]
    where = machine["gpu"] or machine["cpu"]
    fig.suptitle(
        f"LayerNorm vs RMSNorm vs pRMSNorm: {mc['n_layers']}-layer d={mc['d_model']} byte-level "
        f"GPT on {results['corpus']['name']}, {n} seed(s), {where}"
    )
    fig.savefig(path, dpi=120)


OUTPUT_FILES = {"json": "results.json", "png": "loss_curves.png", "md": "summary.md"}


def output_dir(out_dir: str | os.PathLike) -> Path:
    """``out_dir``, created if needed; an :class:`ArgumentError` naming ``out`` if it cannot be
    (the CLI calls it before training, so a bad --out fails at once)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArgumentError("out", f"cannot create the output folder {str(out)!r}: {exc}") from exc
    return out


def write_outputs(results: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``results.json``, ``loss_curves.png`` and ``summary.md`` into ``out_dir``
    (created if needed); returns their paths."""
    out = output_dir(out_dir)
    paths = {kind: out / name for kind, name in OUTPUT_FILES.items()}
    # A diverged run has NaN losses; strict JSON has no NaN, so they are written as null.
    write_json(results, paths["json"])
    plot_losses(results, paths["png"])
    paths["md"].write_text(render_markdown(results))
    return paths
