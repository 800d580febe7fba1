"""The training comparison behind ``rmsnorm compare``: the same small GPT-style language model
trained with LayerNorm, RMSNorm, partial RMSNorm (and optionally no normalization), changing nothing
but the normalization, with losses, step times and norm-only timings written as JSON, PNG and
Markdown."""

from __future__ import annotations

import hashlib
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import __version__, info
from ..bench.measure import interleaved
from ..modules import LayerNorm, RMSNorm
from .corpus import Corpus, stdlib_corpus, text_corpus
from .io import write_json
from .progress import ensure as ensure_progress
from .train import TrainConfig, Trainer
from .transformer import NORMS, Transformer, TransformerConfig, make_norm

VARIANTS = NORMS  # ("layernorm", "rmsnorm", "prmsnorm", "none")
DEFAULT_VARIANTS = ("layernorm", "rmsnorm", "prmsnorm")
BASELINE = "layernorm"
LABELS = {
    "layernorm": "LayerNorm",
    "rmsnorm": "RMSNorm",
    "prmsnorm": "pRMSNorm",
    "none": "no norm",
}
# How the summary decides "within the seed spread": |Δ mean| ≤ SPREAD_FACTOR · max(seed std).
SPREAD_FACTOR = 2.0
RULE = (
    "a variant's final validation loss is called *within the seed spread* of LayerNorm's when "
    "|mean(variant) − mean(LayerNorm)| ≤ 2 × max(std(variant), std(LayerNorm)), with std the "
    "sample standard deviation over seeds. It is a rule of thumb for a handful of seeds, not a "
    "significance test."
)
# The first steps of every run allocate buffers and warm caches; step-time statistics skip them.
TIMING_SKIP_STEPS = 2

# Presets: the model and schedule for a machine class; every field can be overridden.
# "cpu" is sized for 3 variants x 3 seeds within 3 minutes on 2 idle cores: measured on an AMD
# EPYC with 2 threads, a step of this model takes ≈ 0.12 s (0.18 s on 1 thread) and 9 x 120 steps
# took 186 s in all, so 100 steps leave ≈ 15% of margin. "gpu" is a larger model for one
# accelerator; "tiny" is for tests and smoke runs (seconds).
PRESETS: dict[str, dict[str, dict]] = {
    "cpu": {
        "model": dict(n_layers=4, d_model=128, n_heads=4, seq_len=64),
        "train": dict(steps=100, batch_size=16, lr=3e-3, warmup=10, eval_interval=20,
                      eval_batches=8),
    },
    "gpu": {
        "model": dict(n_layers=8, d_model=512, n_heads=8, seq_len=256),
        "train": dict(steps=2000, batch_size=32, lr=1e-3, warmup=100, eval_interval=100,
                      eval_batches=16),
    },
    "tiny": {
        "model": dict(n_layers=2, d_model=32, n_heads=2, seq_len=16),
        "train": dict(steps=40, batch_size=8, lr=3e-3, warmup=4, eval_interval=10,
                      eval_batches=2),
    },
}  # fmt: skip
MODEL_OPTIONS = ("n_layers", "d_model", "n_heads", "seq_len")
TRAIN_OPTIONS = ("steps", "batch_size", "lr", "eval_interval", "eval_batches")


class ArgumentError(ValueError):
    """A bad option of the comparison; ``param`` names it (the CLI shows it as ``--param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.detail = message


@dataclass
class CompareConfig:
    """Everything a comparison run depends on. ``model.norm`` is replaced per variant and
    ``train.seed`` per seed (seeds ``seed``, ``seed + 1``, ...); the rest is shared by every run."""

    variants: tuple[str, ...] = DEFAULT_VARIANTS
    seeds: int = 3
    seed: int = 0
    preset: str = "cpu"
    model: TransformerConfig = field(
        default_factory=lambda: TransformerConfig(**PRESETS["cpu"]["model"])
    )
    train: TrainConfig = field(default_factory=lambda: TrainConfig(**PRESETS["cpu"]["train"]))
    text: str | None = None  # None: the standard-library corpus
    device: str = "cpu"
    # seconds of back-to-back forward+backward calls per norm-timing sample (blocked_autorange's
    # min_run_time): ~0.1–1 ms per call at the presets' shapes, so tens to hundreds of calls
    norm_timing_s: float = 0.05
    # torch CPU threads during the run; None keeps torch's setting (one per core). On a machine
    # that other jobs also load, 1 thread avoids stalls of the threads waiting for each other.
    threads: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def parse_variants(variants: str | Sequence[str]) -> tuple[str, ...]:
    """``"layernorm,rmsnorm"`` or a sequence of names -> a tuple in the given order, checked."""
    names = variants.split(",") if isinstance(variants, str) else list(variants)
    names = [str(n).strip().lower() for n in names if str(n).strip()]
    expected = f"a comma-separated subset of {', '.join(VARIANTS)}"
    if not names:
        raise ArgumentError("variants", f"no variant given; expected {expected}")
    for name in names:
        if name not in VARIANTS:
            raise ArgumentError("variants", f"unknown variant {name!r}; expected {expected}")
    if len(set(names)) != len(names):
        raise ArgumentError("variants", f"a variant is repeated in {names}")
    if BASELINE not in names:
        raise ArgumentError(
            "variants",
            f"must include {BASELINE!r}: it is the baseline every ratio and verdict refers to",
        )
    return tuple(names)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(name, f"must be a positive integer, got {value!r}")
    return value


def _int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError(name, f"must be a non-negative integer, got {value!r}")
    return value


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"``; checks explicit choices."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ArgumentError("device", f"must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ArgumentError("device", "'cuda' was asked for but torch sees no CUDA device")
    return device


def training_flops(cfg: CompareConfig) -> float:
    """Floating-point operations of the matrix products of the whole run (every variant and seed,
    training and validation): 2 per multiply-add, backward twice the forward, causal attention
    counted at half of the full T×T. A lower bound of the work: norms, activations, softmax and
    the optimizer are left out."""
    m, t = cfg.model, cfg.train
    d, n_layers, seq = m.d_model, m.n_layers, m.seq_len
    weights = n_layers * (4 + 2 * m.mlp_ratio) * d * d + m.vocab_size * d  # used once per token
    per_token = 2 * weights + n_layers * 2 * seq * d  # forward; QKᵀ and AV at half of T×T each
    tokens = t.batch_size * seq
    train = t.steps * 3 * per_token * tokens
    evals = (t.steps // t.eval_interval + 1) * t.eval_batches * per_token * tokens
    return float(len(cfg.variants) * cfg.seeds * (train + evals))


def cpu_matmul_rate(cfg: CompareConfig) -> float:
    """FLOP/s of this CPU for the run's largest matrix product (rows × d_model @ d_model × 4
    d_model, with the run's threads), best of three after a warm-up: the fastest the training can
    go, so ``training_flops / rate`` is a lower bound of its time. Takes ~0.1 s at d_model 512."""
    d, hidden = cfg.model.d_model, cfg.model.mlp_ratio * cfg.model.d_model
    rows = min(cfg.train.batch_size * cfg.model.seq_len, 2048)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, d, generator=gen), torch.randn(d, hidden, generator=gen)
    with _threads(cfg.threads):
        torch.mm(a, b)
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
    return 2 * rows * d * hidden / max(best, 1e-9)


def estimate_seconds(cfg: CompareConfig) -> float:
    """A lower bound of the run's wall time on this CPU (:func:`training_flops` at
    :func:`cpu_matmul_rate`). Small models stay far from a matrix product's peak: the default cpu
    preset took 111 s on 2 cores against an estimate of 14 s."""
    return training_flops(cfg) / cpu_matmul_rate(cfg)


def format_duration(seconds: float) -> str:
    """``90`` -> ``"2 min"``, ``7200`` -> ``"2.0 h"``."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


# A gpu-preset run that "auto" put on the CPU is refused above this estimate (a lower bound); the
# default gpu preset is ~2.2e16 FLOP, two days and more on a 2-core CPU.
CPU_REFUSE_S = 1800.0


def compare_config(
    preset: str = "cpu",
    *,
    variants: str | Sequence[str] = DEFAULT_VARIANTS,
    seeds: int = 3,
    seed: int = 0,
    text: str | os.PathLike | None = None,
    device: str = "auto",
    threads: int | None = None,
    **overrides: int | float | None,
) -> CompareConfig:
    """A checked :class:`CompareConfig` from a preset (``"cpu"``, ``"gpu"``, ``"tiny"``) and
    overrides of ``n_layers``, ``d_model``, ``n_heads``, ``seq_len``, ``steps``, ``batch_size``,
    ``lr``, ``eval_interval``, ``eval_batches`` (``None`` keeps the preset's value). Bad values
    raise :class:`ArgumentError` naming the option."""
    if preset not in PRESETS:
        raise ArgumentError("preset", f"must be one of {', '.join(PRESETS)}, got {preset!r}")
    model_kw = dict(PRESETS[preset]["model"])
    train_kw = dict(PRESETS[preset]["train"])
    for name, value in overrides.items():
        if name not in MODEL_OPTIONS + TRAIN_OPTIONS:
            raise TypeError(f"compare_config() got an unexpected option {name!r}")
        if value is None:
            continue
        if name == "lr":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ArgumentError("lr", f"must be a number > 0, got {value!r}")
        else:
            _positive_int(name, value)
        (model_kw if name in MODEL_OPTIONS else train_kw)[name] = value
    if model_kw["d_model"] % model_kw["n_heads"]:
        raise ArgumentError(
            "n_heads",
            f"d_model ({model_kw['d_model']}) must be divisible by n_heads ({model_kw['n_heads']})",
        )
    train_kw["warmup"] = min(train_kw["warmup"], max(1, train_kw["steps"] // 10))
    cfg = CompareConfig(
        variants=parse_variants(variants),
        seeds=_positive_int("seeds", seeds),
        seed=_int("seed", seed),
        preset=preset,
        model=TransformerConfig(**model_kw),
        train=TrainConfig(**train_kw),
        text=None if text is None else str(text),
        device=resolve_device(device),
        threads=None if threads is None else _positive_int("threads", threads),
    )
    if preset == "gpu" and device == "auto" and cfg.device == "cpu":
        # Sized for an accelerator: on a CPU it runs for days. Asking for the CPU explicitly
        # (device="cpu") still runs it.
        flops, rate = training_flops(cfg), cpu_matmul_rate(cfg)
        estimate = flops / rate
        if estimate > CPU_REFUSE_S:
            raise ArgumentError(
                "preset",
                f"'gpu' is sized for a GPU, and torch sees none: on this CPU the run "
                f"({len(cfg.variants)} variants × {cfg.seeds} seeds × {cfg.train.steps} steps) "
                f"would take at least {format_duration(estimate)} ({flops:.1e} FLOP of matrix "
                f"products at this CPU's {rate / 1e9:.0f} GFLOP/s). "
                "Use --preset cpu, fewer --steps, or --device cpu to run it on the CPU anyway",
            )
    return cfg


def load_corpus(cfg: CompareConfig) -> Corpus:
    """The standard-library corpus, or ``cfg.text``; errors name ``text``."""
    if cfg.text is None:
        corpus = stdlib_corpus()
    else:
        try:
            corpus = text_corpus(cfg.text)
        except (OSError, ValueError) as exc:
            raise ArgumentError("text", f"cannot use {cfg.text!r} as training text: {exc}") from exc
    need = cfg.model.seq_len + 2
    if corpus.val.numel() < need:
        raise ArgumentError(
            "text",
            f"the validation split of {corpus.name} has {corpus.val.numel()} bytes; seq_len "
            f"{cfg.model.seq_len} needs at least {need} (use a longer text)",
        )
    return corpus


# ----------------------------------------------------------------------------------------------
# Models that differ only in the norm
# ----------------------------------------------------------------------------------------------
def norm_parameter_names(model: torch.nn.Module) -> set[str]:
    """Names of the parameters owned by normalization layers."""
    return {
        f"{mod_name}.{p_name}" if mod_name else p_name
        for mod_name, mod in model.named_modules()
        if isinstance(mod, (LayerNorm, RMSNorm))
        for p_name, _ in mod.named_parameters(recurse=False)
    }


def shared_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Every parameter that is not a norm's, by name: what all variants have in common."""
    norm = norm_parameter_names(model)
    return {n: p for n, p in model.named_parameters() if n not in norm}


def fingerprint(params: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the parameters' bytes in name order: equal fingerprints, equal tensors."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def build_models(
    model_cfg: TransformerConfig, variants: Sequence[str], seed: int, device: str = "cpu"
) -> dict[str, Transformer]:
    """One model per variant whose shared parameters are bit-identical: a norm-free template is
    built from ``seed`` and its parameters are copied by name into every variant; the norms keep
    their own init (γ = 1, β = 0)."""
    torch.manual_seed(seed)
    template = shared_parameters(Transformer(replace(model_cfg, norm="none")))
    models = {}
    for variant in variants:
        torch.manual_seed(seed)
        model = Transformer(replace(model_cfg, norm=variant))
        shared = shared_parameters(model)
        if shared.keys() != template.keys():
            raise RuntimeError(
                f"variant {variant!r} does not share the template's parameters: "
                f"{sorted(shared.keys() ^ template.keys())}"
            )
        with torch.no_grad():
            for name, p in shared.items():
                p.copy_(template[name])
        models[variant] = model.to(device)
    return models


# ----------------------------------------------------------------------------------------------
# Norm-only timing: forward + backward of the norm layers alone, at the model's activation shape
# ----------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------
@contextmanager
def _threads(n: int | None):
    previous = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


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
    # thread count (tests/test_compare.py checks a rerun bit for bit), and the switch imports
    # torch._inductor, which costs seconds.
    with torch.random.fork_rng(devices=[]), _threads(cfg.threads):
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
    results["warnings"] = _load_warnings(results)
    results["summary"] = summarize(results)
    return results


def _load_warnings(results: dict) -> list[str]:
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


# ----------------------------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------------------------
def _std(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def summarize(results: dict) -> dict:
    """Per variant: final validation loss (mean, std over seeds, per seed, paired Δ vs LayerNorm),
    the verdict of :data:`RULE`, median step time and tokens/s, and the norm-only time, each with
    its ratio to LayerNorm."""
    runs = results["runs"]
    cases = results["norm_timing"]["cases"]
    n_norms = results["norm_layers_per_model"]
    out: dict[str, dict] = {}
    for variant, seed_runs in runs.items():
        finals = [r["val_loss"][-1] for r in seed_runs]
        times = [t for r in seed_runs for t in r["step_time_s"][TIMING_SKIP_STEPS:]]
        times = times or [t for r in seed_runs for t in r["step_time_s"]]
        step_median = statistics.median(times)
        norm = statistics.median(cases[variant]["per_call_s"]) if variant in cases else 0.0
        out[variant] = {
            "label": LABELS[variant],
            "final_val_loss_mean": statistics.fmean(finals),
            "final_val_loss_std": _std(finals),
            "final_val_loss_per_seed": finals,
            "final_train_loss_mean": statistics.fmean(
                statistics.fmean(r["train_loss"][-10:]) for r in seed_runs
            ),
            "step_time_median_s": step_median,
            "tokens_per_s_median": seed_runs[0]["tokens_per_step"] / step_median,
            "norm_time_median_s": norm,
            "norm_share_of_step": n_norms * norm / step_median,
            "parameters": seed_runs[0]["parameters"],
            "norm_parameters": seed_runs[0]["norm_parameters"],
        }
    base = out[BASELINE]
    for variant, s in out.items():
        s["step_time_ratio"] = s["step_time_median_s"] / base["step_time_median_s"]
        s["norm_time_ratio"] = (
            s["norm_time_median_s"] / base["norm_time_median_s"] if variant in cases else None
        )
        paired = [
            a - b
            for a, b in zip(
                s["final_val_loss_per_seed"], base["final_val_loss_per_seed"], strict=True
            )
        ]
        s["delta_vs_layernorm_per_seed"] = paired
        s["delta_vs_layernorm"] = s["final_val_loss_mean"] - base["final_val_loss_mean"]
        stds = [v for v in (s["final_val_loss_std"], base["final_val_loss_std"]) if v is not None]
        s["spread_threshold"] = SPREAD_FACTOR * max(stds) if stds else None
        if variant == BASELINE or s["spread_threshold"] is None:
            s["within_spread"] = None
        else:
            s["within_spread"] = abs(s["delta_vs_layernorm"]) <= s["spread_threshold"]
    torch_cases = {}
    for name in ("torch_layer_norm", "torch_rms_norm"):
        if name in cases:
            torch_cases[name] = statistics.median(cases[name]["per_call_s"])
    if len(torch_cases) == 2:
        torch_cases["torch_rms_over_layer_norm"] = (
            torch_cases["torch_rms_norm"] / torch_cases["torch_layer_norm"]
        )
    for variant, s in out.items():
        s["verdict"] = None if variant == BASELINE else verdict(variant, s, base)
    return {"variants": out, "torch": torch_cases}


SUMMARY_COLUMNS = ("variant", "final val loss (nats/byte)", "step ratio", "norm-only ratio")


def summary_rows(results: dict) -> list[tuple[str, str, str, str]]:
    """The headline numbers per variant as text, under :data:`SUMMARY_COLUMNS` (for the CLI)."""
    rows = []
    for s in results["summary"]["variants"].values():
        std, ratio = s["final_val_loss_std"], s["norm_time_ratio"]
        rows.append(
            (
                s["label"],
                f"{s['final_val_loss_mean']:.4f}" + (f" ± {std:.4f}" if std is not None else ""),
                f"{s['step_time_ratio']:.2f}×",
                "—" if ratio is None else f"{ratio:.2f}×",
            )
        )
    return rows


def verdict(variant: str, s: dict, base: dict) -> str:
    """One plain sentence on a variant's final validation loss against LayerNorm's."""
    name = s["label"]
    loss = f"{s['final_val_loss_mean']:.3f}"
    if s["final_val_loss_std"] is not None:
        loss += f" ± {s['final_val_loss_std']:.3f}"
    speed = f" A whole training step took {s['step_time_ratio']:.2f}× LayerNorm's time" + (
        f", the norm layer alone {s['norm_time_ratio']:.2f}×."
        if s["norm_time_ratio"] is not None
        else " (no norm layers to time)."
    )
    if s["within_spread"] is None:
        return (
            f"**{name}**: final validation loss {loss} nats/byte; with one seed there is no "
            f"spread to judge the difference ({s['delta_vs_layernorm']:+.3f}) against." + speed
        )
    delta = s["delta_vs_layernorm"]
    head = (
        f"**{name}**: final validation loss {loss} nats/byte, {delta:+.3f} from LayerNorm's "
        f"{base['final_val_loss_mean']:.3f}"
    )
    if s["within_spread"]:
        body = (
            f"; that is within the seed spread (threshold {s['spread_threshold']:.3f}), so this "
            "run cannot tell it apart from LayerNorm."
        )
    else:
        side = "worse" if delta > 0 else "better"
        body = (
            f"; that is outside the seed spread (threshold {s['spread_threshold']:.3f}): "
            f"{name} is {side} than LayerNorm in this setting."
        )
    paired = s["delta_vs_layernorm_per_seed"]
    same_sign = all(d > 0 for d in paired) or all(d < 0 for d in paired)
    pairs = (
        f" Paired by seed (same initialization and data) the difference ranged from "
        f"{min(paired):+.3f} to {max(paired):+.3f}"
        + (f", the same sign in all {len(paired)} seeds." if same_sign else ", of both signs.")
    )
    return head + body + pairs + speed


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
        args.append(f"--text {cfg['text']}")
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


# ----------------------------------------------------------------------------------------------
# Figure and files
# ----------------------------------------------------------------------------------------------
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
