"""What a training comparison's summary.md says: the verdicts, the tables behind them (power,
the learning-rate sweep, stability, flattening, speed), the setup and the command that
reproduces the run, written through the lab's document model (:class:`~rmsnorm.lab.page.Page`),
the one the report's page is written with."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path

from ...page import Page
from ...stats.rows import median
from .config import BASELINE, MODEL_OPTIONS, PRESETS, TRAIN_OPTIONS
from .paired import ALPHA, POWER
from .summary import FLAT_TOLERANCE, FLAT_WINDOW, TIMING_SKIP_STEPS, lr_key, same_rates


def _fmt_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _num(value, fmt: str = ".4f", none: str = "—") -> str:
    if value is None:
        return none
    if isinstance(value, float) and math.isinf(value):
        return "diverged" if value > 0 else "−inf"
    return format(value, fmt)


def _p(value) -> str:
    return "—" if value is None else f"{value:.2g}"


def reproduce_command(cfg: dict) -> str:
    """The ``rmsnorm compare`` command line that repeats a run (``cfg`` as in the JSON)."""
    args = ["rmsnorm compare"]
    preset = PRESETS[cfg["preset"]]
    design = preset["design"]
    if cfg["preset"] == "full":
        args.append("--full")
    elif cfg["preset"] != "cpu":
        args.append(f"--preset {cfg['preset']}")
    if tuple(cfg["variants"]) != tuple(design["variants"]):
        args.append(f"--variants {','.join(cfg['variants'])}")
    if cfg["seeds"] != design["seeds"]:
        args.append(f"--seeds {cfg['seeds']}")
    if cfg["seed"] != 0:
        args.append(f"--seed {cfg['seed']}")
    if tuple(cfg["lrs"]) != tuple(design["lrs"]):
        if len(cfg["lrs"]) == 1:
            args.append(f"--lr {cfg['lrs'][0]:g}")
        else:
            args.append("--lrs " + ",".join(f"{lr:g}" for lr in cfg["lrs"]))
    if cfg.get("workers", 1) != design["workers"]:
        args.append(f"--workers {cfg['workers']}")
    threads_default = 1 if cfg.get("workers", 1) > 1 else None
    if cfg["threads"] != threads_default:
        args.append(f"--threads {cfg['threads']}")
    for group, names in (("model", MODEL_OPTIONS), ("train", TRAIN_OPTIONS)):
        for name in names:
            if name == "lr":
                continue
            value = cfg[group].get(name)
            if value is not None and value != preset[group].get(name):
                flag = "batch" if name == "batch_size" else name.replace("_", "-")
                args.append(f"--{flag} {value}")
    if cfg["text"] is not None:
        args.append(f"--text-file {cfg['text']}")
    return " ".join(args + ["--out DIR"])


def _rates_text(rates: dict[str, str]) -> str:
    counts = Counter(rates.values())
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{k} ×{n}" for k, n in sorted(counts.items(), key=lambda kv: float(kv[0])))


def _comparison_row(label: str, setting: str, c: dict) -> list[str]:
    p = c["paired"]
    rates = _rates_text(c["rates"])
    base_rates = _rates_text(c["baseline_rates"])
    w = c.get("with_windows")
    wide = "—" if w is None else f"[{w['ci_low']:+.4f}, {w['ci_high']:+.4f}]"
    if p["mean"] is None:
        ci = "—"
        diverged = sum(d is None or d == math.inf for d in p["diffs"])
        delta = f"diverged in {diverged}/{p['n']}" if diverged else "—"
    else:
        delta = f"{p['mean']:+.4f}"
        ci = f"[{p['ci_low']:+.4f}, {p['ci_high']:+.4f}]"
    need = c.get("seeds_to_detect_observed")
    we = c.get("window_standard_error")
    return [
        label,
        setting,
        f"{rates} / {base_rates}",
        delta,
        ci,
        wide,
        _num(p["sd"]),
        _p(p["t_p"]),
        _p(p["wilcoxon_p"]),
        f"{p['worse']}/{p['better']} ({_p(p['sign_p'])})",
        _num(p["mde"]),
        "—" if need is None else str(need),
        _num(we),
    ]


def render_markdown(results: dict) -> str:
    """The Markdown summary (``summary.md``)."""
    return summary_page(results).markdown(Path("."))


def summary_page(results: dict) -> Page:
    """``summary.md`` as a :class:`~rmsnorm.lab.page.Page`."""
    cfg, m, summ = results["config"], results["machine"], results["summary"]
    sv, base = summ["variants"], summ["variants"][BASELINE]
    mc, tc, corpus = cfg["model"], cfg["train"], results["corpus"]
    nt = results["norm_timing"]
    seeds = results.get("seeds_completed", cfg["seeds"])
    sweep = len(summ["lrs"]) > 1
    labels = " vs ".join(s["label"] for s in sv.values())
    page = Page(f"Training comparison: {labels}")
    if seeds < cfg["seeds"]:
        page.p(
            f"**Partial results: {seeds} of {cfg['seeds']} seeds finished** (the run was "
            "stopped or is still running; the file is rewritten after every seed)."
        )
    k = sv["prmsnorm"]["rms_elements"] if "prmsnorm" in sv else None
    page.p(
        f"The same GPT-style byte-level language model ({mc['n_layers']} layers, d_model "
        f"{mc['d_model']}) trained {seeds} times per setting (seeds {summ['seeds'][0]}–"
        f"{summ['seeds'][-1]}) with each normalization"
        + (
            f" at {len(summ['lrs'])} peak learning rates ({', '.join(map(lr_key, summ['lrs']))})"
            if sweep
            else f" at one peak learning rate ({lr_key(summ['lrs'][0])})"
        )
        + ". Within a seed every run starts from the same weights (SHA-256 of the shared "
        "parameters in the JSON) and sees the same data in the same order; only the normalization "
        "and the rate change. Losses in nats/byte (ln 256 ≈ 5.55 is chance). Every difference is "
        "*paired*: variant − LayerNorm, seed by seed; positive means worse than LayerNorm."
        + (
            f" pRMSNorm estimates the RMS from the first k = {k} of {mc['d_model']} elements "
            f"(p = {mc['partial']:.2%})."
            if k is not None
            else ""
        )
    )
    if k is not None and k < 32:
        page.p(
            f"**pRMSNorm here is not the paper's regime**: k = {k} elements give its RMS about "
            f"{1 / math.sqrt(2 * k):.0%} relative noise for Gaussian rows; `--full` trains at "
            "d_model 512, where k = 32."
        )
    page.h2("Answer", numbered=False)
    page.bullets(
        [text for v, s in sv.items() if v != BASELINE for text in s["verdicts"].values() if text]
    )
    if not sweep:
        page.p(
            "With one learning rate a difference can come from the rate suiting one norm better "
            "than another; `--lrs` (or `--full`) sweeps it and compares each norm at its own best "
            "rate too."
        )
    for w in results.get("warnings", []):
        page.p(f"**Warning**: {w}")
    page.h2("Paired differences in final validation loss", numbered=False)
    page.p(
        "Final validation loss on the report half of the held-out bytes"
        + (
            f" ({cfg['train']['final_eval_batches'] * cfg['train']['batch_size']} windows of "
            f"{mc['seq_len']} bytes)"
            if cfg["train"].get("final_eval_batches")
            else ""
        )
        + ". Δ = variant − "
        f"LayerNorm per seed; CI: {1 - ALPHA:.0%} t interval of the mean Δ over {seeds} seeds; "
        "sd: of the per-seed Δ; t p: paired t test; Wilcoxon p: signed-rank (exact for small "
        "n); sign: seeds worse/better (exact two-sided binomial p). MDE: the smallest true |Δ| "
        f"the paired t test detects with {POWER:.0%} power at α = {ALPHA:g}, given this sd and n. "
        "Seeds: how many a true Δ of the observed size would need. Window s.e.: the part of the "
        "mean Δ's error that comes from which validation windows were scored (fixed for every "
        "run, so not in the seed spread); the CI with windows adds it to the seeds' standard "
        "error (in quadrature, with the seeds' degrees of freedom) and is the interval for "
        "new text of the same kind."
    )
    rows = []
    for v, s in sv.items():
        if v == BASELINE:
            continue
        if not sweep:
            rows.append(_comparison_row(s["label"], "the one rate", s["at_shared_rate"]))
        elif same_rates(s):
            rows.append(_comparison_row(s["label"], "LayerNorm's = own", s["at_shared_rate"]))
        else:
            rows.append(_comparison_row(s["label"], "LayerNorm's", s["at_shared_rate"]))
            rows.append(_comparison_row(s["label"], "own", s["at_own_rate"]))
    page.table(
        [
            "variant",
            "rate setting",
            "rate (variant / LN)",
            "Δ mean",
            "95% CI (seeds)",
            "95% CI (seeds + windows)",
            "sd",
            "t p",
            "Wilcoxon p",
            "sign worse/better (p)",
            "MDE",
            "seeds",
            "window s.e.",
        ],
        rows,
    )
    page.p(
        f"The intervals are per comparison, not corrected for the {len(rows)} comparisons in this "
        "table: at 95% each, about one in twenty intervals misses its true value."
    )
    _power_section(page, results)
    _sweep_section(page, results)
    _stability_section(page, results)
    _flat_section(page, results)
    _speed_section(page, results, nt, sv, base)
    _setup_section(page, results, cfg, m, mc, tc, corpus, summ)
    return page


def _power_section(page: Page, results: dict) -> None:
    """What the design can and cannot detect, from the paired comparisons with finite runs."""
    summ = results["summary"]
    sv = summ["variants"]
    n = len(summ["seeds"])
    rows = []
    for v, s in sv.items():
        if v == BASELINE:
            continue
        for setting in ("at_shared_rate", "at_own_rate"):
            c = s[setting]
            p = c["paired"]
            if p["mde"] is None:
                continue
            base = [x for x in c["baseline_losses"] if x is not None and math.isfinite(x)]
            se = p["sd"] / math.sqrt(n)
            rows.append(
                (
                    s["label"],
                    p["sd"],
                    p["mde"],
                    p["mde"] / statistics.fmean(base),
                    se,
                    c.get("window_standard_error"),
                )
            )
    page.h2("What this design can and cannot detect", numbered=False)
    if not rows:
        page.p("No comparison has every run finite and two or more seeds: no interval.")
        return
    sds, mdes, rels = [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
    window = [(r[5], r[4]) for r in rows if r[5] is not None and r[4] > 0]
    page.p(
        f"With {n} paired seeds the per-seed differences spread by {min(sds):.4f}–{max(sds):.4f} "
        f"nats/byte (sd), so the smallest true differences detected with {POWER:.0%} power are "
        f"{min(mdes):.4f}–{max(mdes):.4f} nats/byte ({min(rels):.1%}–{max(rels):.1%} of "
        "LayerNorm's loss). A smaller difference is not excluded by an interval that contains 0; "
        "the interval's bound is all it says. The MDE falls as 1/√seeds: four times the seeds "
        "halve it."
    )
    if window:
        ratio = max(w / se for w, se in window)
        page.p(
            "The validation windows are the same for every run, so their own sampling error is "
            "not in the seed spread: the intervals over seeds are for these windows. Drawn anew, "
            f"the windows would move a mean difference by a standard error of up to {ratio:.1f}× "
            "the seeds' (the window s.e. column): "
            + (
                "small beside the seed spread."
                if ratio < 0.5
                else "not small, so the verdicts use the interval with the windows' error added; "
                "more validation windows (--final-eval-batches) would narrow it."
            )
        )


def _sweep_section(page: Page, results: dict) -> None:
    summ = results["summary"]
    sv = summ["variants"]
    n = len(summ["seeds"])
    page.h2("Every rate" if len(summ["lrs"]) > 1 else "Final losses", numbered=False)
    page.p(f"Selection: {summ['selection']}")
    rows = []
    for s in sv.values():
        for key, r in s["by_lr"].items():
            std = r["final_val_loss_std"]
            loss = _num(r["final_val_loss_mean"]) + (f" ± {std:.4f}" if std is not None else "")
            if r["diverged"]:
                loss += f" (of {n - r['diverged']} finite)"
            pv = r["paired_vs_layernorm"]
            if pv is None:
                delta = "—"
            elif pv["mean"] is None:
                delta = "— (a run diverged)" if n > 1 else "—"
            else:
                delta = f"{pv['mean']:+.4f} [{pv['ci_low']:+.4f}, {pv['ci_high']:+.4f}]"
            rows.append(
                [
                    s["label"],
                    key,
                    loss,
                    _num(r["select_val_loss_mean"]),
                    delta,
                    f"{r['diverged']}/{n}",
                    f"{r['chosen_for_seeds']}/{n}",
                ]
            )
    page.table(
        [
            "variant",
            "lr",
            "final val loss, report half (mean ± sd)",
            "selection half (mean)",
            "Δ vs LayerNorm at this rate [95% CI]",
            "diverged or above chance",
            "chosen for seeds",
        ],
        rows,
    )


def _stability_section(page: Page, results: dict) -> None:
    cfg, summ = results["config"], results["summary"]
    tc, mc = cfg["train"], cfg["model"]
    chance = math.log(mc["vocab_size"])
    page.h2("Stability", numbered=False)
    page.p(
        f"Per run, after the {tc['warmup']} warm-up steps: the largest training loss (the worst "
        f"seed, and at which step), the steps whose training loss was above ln {mc['vocab_size']} "
        f"= {chance:.2f} (chance; summed over seeds, with the worst seed), the gradient norm "
        f"before clipping (largest over seeds; median of the per-seed medians) and the share of "
        f"steps it was clipped at {tc['grad_clip']:g}. A run whose loss or gradient norm turns "
        "non-finite stops there; it, and a run whose final validation loss is above chance, "
        "counts as diverged."
    )
    rows = []
    for s in summ["variants"].values():
        for key, r in s["by_lr"].items():
            st = r["stability"]
            seeds = summ["seeds"]
            worst = max(range(len(st)), key=lambda i: _key(st[i]["max_train_loss_after_warmup"]))
            w = st[worst]
            above = [x["steps_above_chance"] for x in st]
            grads = [x["max_grad_norm_after_warmup"] for x in st]
            medians = [
                x["median_grad_norm_after_warmup"] for x in st if x["median_grad_norm_after_warmup"]
            ]
            clipped = [x["clipped_fraction"] for x in st if x["clipped_fraction"] is not None]
            div = [
                f"{seeds[i]} ({x['diverged_at']})"
                for i, x in enumerate(st)
                if x["diverged_at"] is not None
            ]
            rows.append(
                [
                    s["label"],
                    key,
                    f"{_num(w['max_train_loss_after_warmup'], '.2f')} "
                    f"({seeds[worst]}, {w['argmax_step']})",
                    f"{sum(above)} ({max(above)})",
                    _num(max(grads, key=_key), ".3g"),
                    _num(median(medians) if medians else None, ".3g"),
                    _num(statistics.fmean(clipped) if clipped else None, ".0%"),
                    ", ".join(div) if div else "none",
                ]
            )
    page.table(
        [
            "variant",
            "lr",
            "max train loss (seed, step)",
            "steps > ln V (worst seed)",
            "max grad norm",
            "median grad norm",
            "clipped",
            "diverged (step)",
        ],
        rows,
    )


def _key(value) -> float:
    """Sort key for a loss or norm that may be None or non-finite (None: -inf, NaN: inf)."""
    if value is None:
        return -math.inf
    return math.inf if math.isnan(value) else value


def _flat_section(page: Page, results: dict) -> None:
    summ = results["summary"]
    tc, mc = results["config"]["train"], results["config"]["model"]
    steps = tc["steps"]
    page.h2("Has the validation loss flattened?", numbered=False)
    page.p(
        f"Criterion: over the last {FLAT_WINDOW:.0%} of the steps the mean (over seeds) validation "
        f"loss falls by at most {FLAT_TOLERANCE:.0%} of its final value, on the report half's "
        f"{tc['eval_batches'] * tc['batch_size']} windows scored at every evaluation (the curve; "
        "the final losses compared above are on more windows, so they differ a little). The "
        "cosine schedule "
        f"takes the rate down to {tc.get('min_lr_ratio', 0.1):.0%} of its peak at the last step, "
        f"so this is a loss flattened at the end of a fixed budget of {steps} steps "
        f"({steps * tc['batch_size'] * mc['seq_len']:,} bytes), not a model trained to "
        "convergence: more steps would lower every loss."
    )
    used = {(v, k) for v, s in summ["variants"].items() for k in s["chosen_rates"].values()}
    used |= {(v, k) for v in summ["variants"] for k in summ["shared_rates"].values()}
    rows = []
    for v, s in summ["variants"].items():
        for key, r in s["by_lr"].items():
            f = r["flattening"]
            mark = " (compared)" if (v, key) in used else ""
            if f is None:
                rows.append([s["label"], f"{key}{mark}", *["—"] * 5, "n/a (diverged)"])
                continue
            rows.append(
                [
                    s["label"],
                    f"{key}{mark}",
                    str(f["from_step"]),
                    f"{f['loss_from']:.4f}",
                    f"{f['loss_to']:.4f}",
                    f"{f['drop']:+.4f}",
                    f"{f['relative_drop']:.2%}",
                    "yes" if f["flat"] else "**no**",
                ]
            )
    page.table(
        ["variant", "lr", "from step", "loss then", "final", "drop", "relative", "flat"], rows
    )
    compared = [summ["variants"][v]["by_lr"][k]["flattening"] for v, k in sorted(used)]
    ok = [f["flat"] for f in compared if f is not None]
    if ok:
        page.p(
            f"At the rates the comparisons use (marked), the criterion holds in {sum(ok)} of "
            f"{len(ok)} settings with finite runs."
        )


def _speed_section(page: Page, results, nt, sv, base) -> None:
    page.h2("Speed", numbered=False)
    page.p(
        f"Whole training step (forward, backward, clipping, update), median over every step after "
        f"the first {TIMING_SKIP_STEPS} of every run of the variant; the runs of a seed advance in "
        "lockstep, one step each in a rotating order, so every variant meets the same load."
    )
    rows = []
    for s in sv.values():
        norm_ratio = f"{s['norm_time_ratio']:.2f}×" if s["norm_time_ratio"] is not None else "—"
        rows.append(
            [
                s["label"],
                _fmt_time(s["step_time_median_s"]),
                f"{s['tokens_per_s_median']:,.0f}",
                f"{s['step_time_ratio']:.2f}×",
                norm_ratio,
            ]
        )
    page.table(
        [
            "variant",
            "step time (median)",
            "tokens/s",
            "step ratio vs LN",
            "norm-only ratio vs LN",
        ],
        rows,
    )
    samples = len(next(iter(nt["cases"].values()))["per_call_s"])
    page.p(
        f"Norm layers alone: one {nt['what']} at the model's activation shape "
        f"{tuple(nt['shape'])} {nt['dtype']}, timed with `torch.utils.benchmark`'s "
        f"`blocked_autorange` (at least {nt['seconds_per_sample']:g} s of back-to-back calls per "
        "sample, the cases taking turns), in samples interleaved with the training; median per "
        f"call over {samples} samples. The model calls its norm "
        f"{results['norm_layers_per_model']} times per forward pass."
    )
    base_norm = base["norm_time_median_s"]
    rows = []
    for name, case in nt["cases"].items():
        if not case["per_call_s"]:
            continue
        med = median(case["per_call_s"])
        share = f"{sv[name]['norm_share_of_step']:.1%}" if name in sv else "— (not in the model)"
        rows.append([case["label"], _fmt_time(med), f"{med / base_norm:.2f}×", share])
    page.table(
        ["norm", "per call (fwd+bwd)", "ratio vs rmsnorm LayerNorm", "share of a training step"],
        rows,
    )
    backend = results["machine"]["backend"]
    page.p(
        f"The library's modules ran on the `{backend}` backend"
        + (
            " (the plain-PyTorch spec: the fast CPU kernels were not available to this run)."
            if backend == "reference"
            else "."
        )
    )


def _setup_section(page: Page, results, cfg, m, mc, tc, corpus, summ) -> None:
    sv = summ["variants"]
    load = results["load_average"]
    samples = load.get("samples") or []
    during = [x[1] for x in samples]
    workers = m.get("workers", 1)
    items = [
        f"Model: {mc['n_layers']} layers, d_model {mc['d_model']}, {mc['n_heads']} heads, "
        f"seq_len {mc['seq_len']}, MLP ×{mc['mlp_ratio']} ({mc.get('activation', 'gelu')}), "
        f"{mc['norm_position']}-norm, eps {mc['eps']}; "
        + ", ".join(f"{s['label']} {s['parameters']:,} parameters" for s in sv.values())
        + ". RMS computed from: "
        + ", ".join(
            f"{s['label']} {s['rms_elements']} elements" for s in sv.values() if s["rms_elements"]
        )
        + ".",
        f"Training: {tc['steps']} steps, batch {tc['batch_size']} × {mc['seq_len']} = "
        f"{tc['batch_size'] * mc['seq_len']:,} bytes/step "
        f"({tc['steps'] * tc['batch_size'] * mc['seq_len']:,} bytes per run), AdamW (β = 0.9, "
        f"0.95, weight decay {tc['weight_decay']} on matrices), {tc['warmup']} warm-up steps then "
        f"cosine to {tc.get('min_lr_ratio', 0.1):.0%} of the peak rate, gradient clip "
        f"{tc['grad_clip']}; peak rates "
        f"{', '.join(map(lr_key, summ['lrs']))}.",
        f"Validation: every {tc['eval_interval']} steps, on {tc['eval_batches']} × "
        f"{tc['batch_size']} fixed windows of {mc['seq_len']} bytes in each half of the held-out "
        f"bytes ({corpus['val_parts']['bytes_each']:,} bytes each)"
        + (
            f", and after the last step on {tc['final_eval_batches']} × {tc['batch_size']} "
            "windows (the first of them the curve's): the final loss that is compared"
            if tc.get("final_eval_batches")
            else ""
        )
        + ". The selection half chooses rates, the report half is reported. The same windows for "
        "every seed, rate and variant.",
        f"Data: {corpus['name']}, {corpus['train_bytes']:,} training bytes, "
        f"{corpus['val_bytes']:,} held-out bytes (the last 10%), {len(corpus['sources'])} source "
        "file(s).",
        f"Machine: {m['cpu']}, {m['cpu_cores']} cores; {workers} worker process(es) × "
        f"{m['torch_threads']} torch thread(s)"
        + (f", GPU {m['gpu']}" if m["gpu"] else "")
        + f"; device {m['device']}; torch {m['torch']}, Python {m['python']}, "
        f"rmsnorm {m['rmsnorm']} at commit {m['commit']}"
        + (
            f"; this summary and the figures were written again from results.json by rmsnorm "
            f"{results['summarized_with']['rmsnorm']} at commit "
            f"{results['summarized_with']['commit']}."
            if results.get("summarized_with")
            and results["summarized_with"]["commit"] != m["commit"]
            else "."
        ),
        f"Wall time {results['wall_time_s'] / 60:.1f} min ({results['wall_time_s']:.0f} s; "
        f"training CPU time {results['cpu_time_s'] / 60:.1f} min); load average (1, 5, 15 min) "
        f"at start {load['start']}, at end {load['end']}"
        + (
            f"; the 1-minute load sampled every minute ranged {min(during):.2f}–{max(during):.2f} "
            f"(median {median(during):.2f}) on {m['cpu_cores']} cores"
            if during
            else ""
        )
        + ".",
    ]
    page.h2("Setup", numbered=False)
    page.bullets(items)
    page.p(f"Reproduce: `{reproduce_command(cfg)}`.")
