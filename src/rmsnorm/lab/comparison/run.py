"""The run of a training comparison: every variant for every seed, advancing in lockstep, with
norm-only timings interleaved, and the machine facts and load that the timings depend on."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ... import __version__, info
from ...bench.measure import interleaved
from ..progress import ensure as ensure_progress
from ..train import Trainer
from ..transformer import TransformerConfig, make_norm
from .config import LABELS, CompareConfig, load_corpus, torch_threads
from .models import build_models, fingerprint, shared_parameters
from .summary import RULE, summarize


def _norm_timing_cases(model_cfg: TransformerConfig, variants: Sequence[str], batch: int, device):
    """(name, label, fn) per timed case; fn runs one forward + backward (input and parameter
    gradients) at (batch, seq_len, d_model) in fp32. The library's module for each variant, plus
    torch's own F.layer_norm / F.rms_norm for context."""
    gen = torch.Generator().manual_seed(1234)
    shape = (batch, model_cfg.seq_len, model_cfg.d_model)
    x = torch.randn(shape, generator=gen).to(device).requires_grad_(True)
    dy = torch.randn(shape, generator=gen).to(device)
    d, eps = model_cfg.d_model, model_cfg.eps
    cases = []
    for variant in variants:
        if variant == "none":
            continue
        module = make_norm(replace(model_cfg, norm=variant)).to(device)
        inputs = [x, *module.parameters()]

        def fn(module=module, inputs=inputs):
            torch.autograd.grad(module(x), inputs, dy)

        cases.append((variant, f"rmsnorm {type(module).__name__} ({LABELS[variant]})", fn))
    w = torch.ones(d, device=device, requires_grad=True)
    b = torch.zeros(d, device=device, requires_grad=True)
    cases.append(
        (
            "torch_layer_norm",
            "torch F.layer_norm",
            lambda: torch.autograd.grad(F.layer_norm(x, (d,), w, b, eps), [x, w, b], dy),
        )
    )
    cases.append(
        (
            "torch_rms_norm",
            "torch F.rms_norm",
            lambda: torch.autograd.grad(F.rms_norm(x, (d,), w, eps), [x, w], dy),
        )
    )
    return cases


def machine_info(device: str, threads: int | None = None) -> dict:
    """What the timings depend on: CPU model and cores, threads, GPU, versions, backend, commit."""
    facts = {
        "cpu": info.cpu_model(),
        "cpu_cores": info.cpu_cores(),
        "torch_threads": torch.get_num_threads() if threads is None else threads,
        "gpu": info.gpu_name() if device == "cuda" else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "rmsnorm": __version__,
        "commit": info.source_commit(),
        "device": device,
        "backend": info.describe_backend(device),
    }
    if device == "cuda":
        facts["triton"] = info.package_version("triton")
    return facts


def _load_average() -> list[float] | None:
    load = info.load_average()
    return None if load is None else list(load)


def run_comparison(
    cfg: CompareConfig, progress=None, on_seed: Callable[[dict], object] | None = None
) -> dict:
    """Train every variant for every seed and return the results (what :func:`write_outputs`
    saves). Variants of one seed advance in lockstep, one step each in a rotating order, so that
    their step times are measured under the same machine load; the norm-only timing blocks are
    interleaved with the training in the same way. ``progress``: an
    :mod:`rmsnorm.lab.progress` object (one bar per seed), or None. ``on_seed``: called with
    the results of the seeds finished so far (``seeds_completed`` says how many) after each seed
    but the last, so that an interrupted run can leave what it finished."""
    corpus = load_corpus(cfg)
    device = cfg.device
    t_start, cpu_start = time.perf_counter(), time.process_time()
    started = (t_start, cpu_start, _load_average())
    steps, variants = cfg.train.steps, cfg.variants
    progress = ensure_progress(progress)
    timing_every = max(1, steps // 4)  # four norm-timing blocks per seed
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    cases = _norm_timing_cases(cfg.model, variants, cfg.train.batch_size, device)
    norm_samples: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    # fork_rng: the run seeds torch's global generator; the caller's stream is left as it was.
    # No torch.use_deterministic_algorithms: every op here is deterministic on CPU for a fixed
    # thread count (tests/test_lab_comparison_run.py checks a rerun bit for bit), and the switch
    # imports torch._inductor, which costs seconds.
    with torch.random.fork_rng(devices=[]), torch_threads(cfg.threads):
        machine = machine_info(device, torch.get_num_threads())  # before training: the code run
        for i in range(cfg.seeds):
            seed = cfg.seed + i
            models = build_models(cfg.model, variants, seed, device)
            # Validation windows are fixed across seeds (eval_seed = the first seed), so the seed
            # spread measures training randomness, not which bytes were scored.
            train_cfg = replace(cfg.train, seed=seed, eval_seed=cfg.seed)
            trainers = {v: Trainer(m, corpus, train_cfg) for v, m in models.items()}
            init = {v: fingerprint(shared_parameters(m)) for v, m in models.items()}
            bar = f"seed {seed} ({i + 1}/{cfg.seeds}): {len(variants)} variants x {steps} steps"
            with progress.task(bar, steps * len(variants)) as advance:
                for step in range(steps):
                    for j in range(len(variants)):
                        trainers[variants[(step + j) % len(variants)]].step()
                    if step % timing_every == 0:
                        # one sample per case, the cases taking turns from a rotating start
                        block = interleaved(
                            {name: fn for name, _, fn in cases},
                            rounds=1,
                            min_run_time=cfg.norm_timing_s,
                            start=step,
                        )
                        for name, secs in block.items():
                            norm_samples[name] += secs
                    advance(len(variants))
            for v, trainer in trainers.items():
                hist = trainer.history
                model = models[v]
                runs[v].append(
                    {
                        "seed": seed,
                        "parameters": sum(p.numel() for p in model.parameters()),
                        "norm_parameters": model.norm_parameter_count(),
                        "shared_init_sha256": init[v],
                        "tokens_per_step": hist.tokens_per_step,
                        "train_loss": hist.train_loss,
                        "step_time_s": hist.step_time_s,
                        "tokens_per_s": [hist.tokens_per_step / t for t in hist.step_time_s],
                        "val_steps": hist.val_steps,
                        "val_loss": hist.val_loss,
                    }
                )
            if on_seed is not None and i + 1 < cfg.seeds:
                on_seed(_results(cfg, corpus, machine, runs, cases, norm_samples, started))
    return _results(cfg, corpus, machine, runs, cases, norm_samples, started)


def _results(cfg, corpus, machine, runs, cases, norm_samples, started) -> dict:
    """The results dict of the seeds in ``runs`` (all of them at the end of a run)."""
    t_start, cpu_start, load_start = started
    wall, cpu = time.perf_counter() - t_start, time.process_time() - cpu_start
    shape = [cfg.train.batch_size, cfg.model.seq_len, cfg.model.d_model]
    results = {
        "schema": "rmsnorm.compare/1",
        "config": cfg.to_dict(),
        "machine": machine,
        "corpus": {
            "name": corpus.name,
            "train_bytes": int(corpus.train.numel()),
            "val_bytes": int(corpus.val.numel()),
            "sources": [Path(s).name if cfg.text else _stdlib_rel(s) for s in corpus.sources],
        },
        "units": {"loss": "nats/byte", "time": "s"},
        "seeds_completed": len(runs[cfg.variants[0]]),
        "runs": {v: list(r) for v, r in runs.items()},
        "norm_timing": {
            "shape": shape,
            "dtype": "float32",
            "seconds_per_sample": cfg.norm_timing_s,
            "method": "torch.utils.benchmark blocked_autorange median (rmsnorm.bench.measure)",
            "what": "forward + backward (input and parameter gradients) of one norm layer",
            "cases": {
                name: {"label": label, "per_call_s": list(norm_samples[name])}
                for name, label, _ in cases
            },
        },
        "norm_layers_per_model": 2 * cfg.model.n_layers + (cfg.model.norm_position == "pre"),
        "rule": RULE,
        "wall_time_s": wall,
        "cpu_time_s": cpu,  # user + system time of all this process's threads
        "load_average": {"start": load_start, "end": _load_average()},
    }
    results["warnings"] = busy_machine_warnings(results)
    results["summary"] = summarize(results)
    return results


def busy_machine_warnings(results: dict) -> list[str]:
    """A warning when other processes loaded the CPU while several torch threads ran: the threads
    then stall waiting for each other and step times grow many-fold and unevenly."""
    m, load = results["machine"], results["load_average"]
    peaks = [v[0] for v in (load["start"], load["end"]) if v]
    if m["device"] != "cpu" or m["torch_threads"] < 2 or not peaks or not m["cpu_cores"]:
        return []
    if max(peaks) <= m["cpu_cores"]:
        return []
    return [
        f"the machine was busy (1-minute load average up to {max(peaks)} on {m['cpu_cores']} "
        f"cores) while torch ran {m['torch_threads']} threads: its threads stall waiting for each "
        "other under contention, so these step times are inflated and noisy. Re-run on an idle "
        "machine, or with --threads 1."
    ]


def _stdlib_rel(path: str) -> str:
    parts = Path(path).parts
    for k in range(len(parts) - 1, -1, -1):
        if parts[k].startswith("python3") or parts[k] == "Lib":
            return "/".join(parts[k + 1 :])
    return Path(path).name
