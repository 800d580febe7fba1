"""The run of a training comparison: every variant at every learning rate for every seed, the runs
of a seed advancing in lockstep with norm-only timings interleaved (seeds side by side in worker
processes if asked), and the machine facts and load that the timings depend on."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import platform
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from queue import Empty

import torch
import torch.nn.functional as F

from .... import __version__, info
from ...._progress import ensure as ensure_progress
from ...._timing import interleaved
from ...models.train import Trainer
from ...models.transformer import TransformerConfig, make_norm
from .config import LABELS, CompareConfig, load_corpus, torch_threads
from .models import build_models, fingerprint, shared_parameters
from .summary import summarize


def _norm_case_labels(variants: Sequence[str]) -> dict[str, str]:
    """Name -> label of each norm-only timing case: the library's module for each variant with a
    norm, then torch's own F.layer_norm and F.rms_norm for context."""
    labels = {
        v: f"rmsnorm {'LayerNorm' if v == 'layernorm' else 'RMSNorm'} ({LABELS[v]})"
        for v in variants
        if v != "none"
    }
    return labels | {"torch_layer_norm": "torch F.layer_norm", "torch_rms_norm": "torch F.rms_norm"}


def _norm_timing_cases(model_cfg: TransformerConfig, variants: Sequence[str], batch: int, device):
    """(name, label, fn) per timed case (:func:`_norm_case_labels`); fn runs one forward +
    backward (input and parameter gradients) at (batch, seq_len, d_model) in fp32."""
    labels = _norm_case_labels(variants)
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

        cases.append((variant, labels[variant], fn))
    w = torch.ones(d, device=device, requires_grad=True)
    b = torch.zeros(d, device=device, requires_grad=True)
    cases.append(
        (
            "torch_layer_norm",
            labels["torch_layer_norm"],
            lambda: torch.autograd.grad(F.layer_norm(x, (d,), w, b, eps), [x, w, b], dy),
        )
    )
    cases.append(
        (
            "torch_rms_norm",
            labels["torch_rms_norm"],
            lambda: torch.autograd.grad(F.rms_norm(x, (d,), w, eps), [x, w], dy),
        )
    )
    return cases


def machine_info(device: str, threads: int | None = None) -> dict:
    """What the timings depend on: CPU model, cores and vector unit, threads, GPU, versions,
    backend, commit."""
    facts = {
        "cpu": info.cpu_model(),
        "cpu_cores": info.cpu_cores(),
        "cpu_vector_unit": info.cpu_vector_unit(),
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


def _rounded(values: list[float], digits: int) -> list[float]:
    """``values`` to ``digits`` significant digits (keeps results.json small; NaN and inf stay)."""
    return [float(f"{v:.{digits}g}") if math.isfinite(v) else v for v in values]


def _train_seed(cfg: CompareConfig, corpus, seed: int, advance: Callable[[int], None]) -> dict:
    """Every (variant, learning rate) run of one seed, from one shared initialization, advancing
    in lockstep (one step each, in a rotating order) with the norm-only timing blocks interleaved.
    Returns ``{"runs": {variant: [one run per rate]}, "norm_samples": {case: [s]},
    "cpu_time_s": ..., "wall_time_s": ...}``."""
    t0, c0 = time.perf_counter(), time.process_time()
    device, steps, variants = cfg.device, cfg.train.steps, cfg.variants
    pairs = [(v, lr) for lr in cfg.lrs for v in variants]
    timing_every = max(1, steps // 4)  # four norm-timing blocks per seed
    cases = _norm_timing_cases(cfg.model, variants, cfg.train.batch_size, device)
    norm_samples: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    trainers, models, init = {}, {}, {}
    for lr in cfg.lrs:
        # The same seed for every rate: all runs of a seed start from the same weights.
        for v, model in build_models(cfg.model, variants, seed, device).items():
            models[v, lr] = model
            init[v, lr] = fingerprint(shared_parameters(model))
            # Validation windows are fixed across seeds (eval_seed = the first seed), so the seed
            # spread measures training randomness, not which bytes were scored.
            train_cfg = replace(cfg.train, lr=lr, seed=seed, eval_seed=cfg.seed)
            trainers[v, lr] = Trainer(model, corpus, train_cfg)
    for step in range(steps):
        for j in range(len(pairs)):
            trainer = trainers[pairs[(step + j) % len(pairs)]]
            if not trainer.done:  # a diverged run has stopped
                trainer.step()
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
        advance(len(pairs))
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for v, lr in pairs:
        hist, model = trainers[v, lr].history, models[v, lr]
        select, report = hist.val_loss_parts  # the two disjoint halves of the held-out bytes
        runs[v].append(
            {
                "seed": seed,
                "lr": lr,
                "parameters": sum(p.numel() for p in model.parameters()),
                "norm_parameters": model.norm_parameter_count(),
                "shared_init_sha256": init[v, lr],
                "tokens_per_step": hist.tokens_per_step,
                "diverged_at": hist.diverged_at,
                "train_loss": _rounded(hist.train_loss, 7),
                "grad_norm": _rounded(hist.grad_norm, 5),
                "step_time_s": _rounded(hist.step_time_s, 4),
                "val_steps": hist.val_steps,
                "val_loss": report,
                "val_loss_select": select,
                # after the last step, on final_eval_batches windows of each half (None without)
                "final_val_loss": (hist.final_val_loss_parts or [None, None])[1],
                "final_val_loss_select": (hist.final_val_loss_parts or [None, None])[0],
                # the report half's windows at the last (final) evaluation
                "val_windows": _rounded(hist.val_windows[-1], 6) if hist.val_steps else [],
            }
        )
    return {
        "seed": seed,
        "runs": runs,
        "norm_samples": norm_samples,
        "cpu_time_s": time.process_time() - c0,
        "wall_time_s": time.perf_counter() - t0,
    }


# Worker processes (``workers`` > 1): each trains whole seeds, one at a time, with its own torch
# threads, and reports progress through a queue that the parent drains.
_WORKER: dict = {}


def _worker_init(queue, threads: int) -> None:
    torch.set_num_threads(threads)
    _WORKER["queue"] = queue
    _WORKER["parent"] = os.getppid()


def _worker_seed(cfg: CompareConfig, seed: int) -> dict:
    queue = _WORKER["queue"]
    if "corpus" not in _WORKER:
        _WORKER["corpus"] = load_corpus(cfg)
    pending = [0, time.monotonic()]

    def advance(n: int) -> None:  # a message at most every 0.5 s
        pending[0] += n
        if time.monotonic() - pending[1] >= 0.5:
            if os.getppid() != _WORKER["parent"]:
                # The parent was killed (SIGTERM, not Ctrl-C, which reaches every process): nobody
                # will read this seed, so stop rather than train on for up to an hour.
                os._exit(1)
            queue.put(pending[0])
            pending[:] = [0, time.monotonic()]

    with torch.random.fork_rng(devices=[]):
        out = _train_seed(cfg, _WORKER["corpus"], seed, advance)
    queue.put(pending[0])
    return out


class _LoadSampler:
    """The 1-minute load average every ``every`` seconds while the run goes on."""

    def __init__(self, every: float = 60.0) -> None:
        self.every, self.samples, self.t0 = every, [], time.monotonic()
        self._last = -math.inf

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._last >= self.every and (load := info.load_average()) is not None:
            self._last = now
            self.samples.append([round(now - self.t0, 1), load[0]])


def run_comparison(
    cfg: CompareConfig, progress=None, on_seed: Callable[[dict], object] | None = None
) -> dict:
    """Train every variant at every learning rate for every seed and return the results (what
    :func:`write_outputs` saves). The runs of one seed advance in lockstep, one step each in a
    rotating order, so that their step times are measured under the same machine load; the
    norm-only timing blocks are interleaved with the training in the same way. With ``workers``
    > 1, seeds train side by side in that many processes (the losses are the same: each run
    depends only on its configuration and thread count). ``progress``: an
    :mod:`rmsnorm._progress` object (one bar for the run), or None. ``on_seed``: called with
    the results of the seeds finished so far (``seeds_completed`` says how many) after each seed
    but the last, so that an interrupted run can leave what it finished."""
    corpus = load_corpus(cfg)
    t_start, cpu_start = time.perf_counter(), time.process_time()
    started = (t_start, cpu_start, _load_average())
    progress = ensure_progress(progress)
    sampler = _LoadSampler()
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    done: dict[int, dict] = {}
    workers = min(cfg.workers, cfg.seeds)
    threads = cfg.threads if cfg.threads is not None else (1 if workers > 1 else None)
    total = cfg.seeds * cfg.runs_per_seed * cfg.train.steps
    bar = (
        f"{cfg.seeds} seeds x {len(cfg.variants)} variants x {len(cfg.lrs)} rates x "
        f"{cfg.train.steps} steps" + (f", {workers} workers" if workers > 1 else "")
    )

    def finished(out: dict) -> None:
        done[out["seed"]] = out
        if on_seed is not None and len(done) < cfg.seeds:
            on_seed(_results(cfg, corpus, machine, done, started, sampler, workers))

    # fork_rng: the run seeds torch's global generator; the caller's stream is left as it was.
    # No torch.use_deterministic_algorithms: every op here is deterministic on CPU for a fixed
    # thread count (tests/lab/test_comparison.py checks a rerun bit for bit), and the switch
    # imports torch._inductor, which costs seconds.
    with torch.random.fork_rng(devices=[]), torch_threads(threads):
        machine = machine_info(cfg.device, torch.get_num_threads())  # before training
        with progress.task(bar, total) as advance:

            def tick(n: int) -> None:
                advance(n)
                sampler()

            if workers == 1:
                for seed in seeds:
                    finished(_train_seed(cfg, corpus, seed, tick))
            else:
                _run_workers(cfg, seeds, workers, threads, tick, finished)
    return _results(cfg, corpus, machine, done, started, sampler, workers)


def _run_workers(cfg, seeds, workers, threads, tick, finished) -> None:
    """Seeds in ``workers`` spawned processes; progress from their queue; results as they end."""
    ctx = mp.get_context("spawn")  # fork would copy torch's thread pool state
    queue = ctx.Queue()
    pool = ProcessPoolExecutor(workers, ctx, initializer=_worker_init, initargs=(queue, threads))
    try:
        futures = {pool.submit(_worker_seed, cfg, seed) for seed in seeds}
        while futures:
            ready, futures = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
            while True:
                try:
                    tick(queue.get_nowait())
                except Empty:
                    break
            for future in ready:
                finished(future.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _results(cfg, corpus, machine, done, started, sampler, workers) -> dict:
    """The results dict of the seeds in ``done`` (all of them at the end of a run)."""
    t_start, cpu_start, load_start = started
    wall = time.perf_counter() - t_start
    seeds = sorted(done)
    runs = {v: [] for v in cfg.variants}
    for lr in cfg.lrs:
        for seed in seeds:
            for v in cfg.variants:
                runs[v] += [r for r in done[seed]["runs"][v] if r["lr"] == lr]
    cases = _norm_case_labels(cfg.variants)
    samples = {name: [t for s in seeds for t in done[s]["norm_samples"][name]] for name in cases}
    shape = [cfg.train.batch_size, cfg.model.seq_len, cfg.model.d_model]
    results = {
        "schema": "rmsnorm.compare/2",
        "config": cfg.to_dict(),
        "machine": machine | {"workers": workers},
        "corpus": {
            "name": corpus.name,
            "train_bytes": int(corpus.train.numel()),
            "val_bytes": int(corpus.val.numel()),
            "val_parts": {
                "select": "first half of the held-out bytes: chooses each variant's rate",
                "report": "second half: every reported validation loss",
                "bytes_each": int(corpus.val.numel()) // 2,
            },
            "sources": [Path(s).name if cfg.text else _stdlib_rel(s) for s in corpus.sources],
        },
        "units": {"loss": "nats/byte", "time": "s"},
        "seeds_completed": len(seeds),
        "runs": runs,
        "norm_timing": {
            "shape": shape,
            "dtype": "float32",
            "seconds_per_sample": cfg.norm_timing_s,
            "method": "torch.utils.benchmark blocked_autorange median (rmsnorm._timing)",
            "what": "forward + backward (input and parameter gradients) of one norm layer",
            "cases": {
                name: {"label": label, "per_call_s": samples[name]} for name, label in cases.items()
            },
        },
        "norm_layers_per_model": 2 * cfg.model.n_layers + (cfg.model.norm_position == "pre"),
        "wall_time_s": wall,
        # user + system seconds of the training, summed over seeds (in whichever process ran them)
        "cpu_time_s": sum(done[s]["cpu_time_s"] for s in seeds),
        "seed_wall_time_s": {str(s): done[s]["wall_time_s"] for s in seeds},
        "load_average": {
            "start": load_start,
            "end": _load_average(),
            "samples": list(sampler.samples),  # [seconds since start, 1-minute load]
        },
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
