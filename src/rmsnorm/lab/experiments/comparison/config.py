"""What a training comparison runs: the variants, the presets (model and schedule per machine
class), the checked configuration with errors that name the option, the corpus, and a lower bound
of the run's time on this CPU."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch

from ...._validate import ArgumentError, divisible, non_negative_int, positive_int, positive_number
from ...models.corpus import Corpus, stdlib_corpus, text_corpus
from ...models.train import TrainConfig
from ...models.transformer import NORM_NAMES, NORMS, TransformerConfig

VARIANTS = NORMS  # ("layernorm", "rmsnorm", "prmsnorm", "none")
DEFAULT_VARIANTS = ("layernorm", "rmsnorm", "prmsnorm")
BASELINE = "layernorm"
LABELS = NORM_NAMES

# Presets: the model, the schedule and the design (variants, seeds, learning rates, workers) for a
# purpose; every field can be overridden.
# - "cpu", the default: a quick look (tens of seconds on 2 cores). d_model 128 gives pRMSNorm only
#   k = 8 elements, one rate, 3 seeds: it shows the workflow and the early-training picture; it
#   cannot answer the question (its summary says what it can detect).
# - "full": the run that can. d_model 512, where pRMSNorm's p = 6.25% is k = 32 elements; every
#   variant, no-norm included, at 3 rates spanning a factor of 10; 8 paired seeds in 2 worker
#   processes. Sized to finish within an hour on 2 cores (docs/compare.md has the budget).
# - "gpu": a larger model for one accelerator (not measured yet); "tiny": tests (seconds).
PRESETS: dict[str, dict[str, dict]] = {
    "cpu": {
        "model": dict(n_layers=4, d_model=128, n_heads=4, seq_len=64),
        "train": dict(steps=100, batch_size=16, lr=3e-3, warmup=10, eval_interval=20,
                      eval_batches=4, final_eval_batches=16),
        "design": dict(variants=DEFAULT_VARIANTS, seeds=3, lrs=(3e-3,), workers=1),
    },
    "full": {
        "model": dict(n_layers=2, d_model=512, n_heads=8, seq_len=64),
        "train": dict(steps=200, batch_size=8, lr=3e-4, warmup=20, eval_interval=20,
                      eval_batches=4, final_eval_batches=32),
        "design": dict(variants=VARIANTS, seeds=8, lrs=(1e-4, 3e-4, 1e-3), workers=2),
    },
    "gpu": {
        "model": dict(n_layers=8, d_model=512, n_heads=8, seq_len=256),
        "train": dict(steps=2000, batch_size=32, lr=1e-3, warmup=100, eval_interval=100,
                      eval_batches=16, final_eval_batches=64),
        "design": dict(variants=VARIANTS, seeds=8, lrs=(3e-4, 1e-3, 3e-3), workers=1),
    },
    "tiny": {
        "model": dict(n_layers=2, d_model=32, n_heads=2, seq_len=16),
        "train": dict(steps=40, batch_size=8, lr=3e-3, warmup=4, eval_interval=10,
                      eval_batches=2, final_eval_batches=4),
        "design": dict(variants=DEFAULT_VARIANTS, seeds=3, lrs=(3e-3,), workers=1),
    },
}  # fmt: skip
MODEL_OPTIONS = ("n_layers", "d_model", "n_heads", "seq_len")
TRAIN_OPTIONS = ("steps", "batch_size", "lr", "eval_interval", "eval_batches", "final_eval_batches")


@dataclass
class CompareConfig:
    """Everything a comparison run depends on. ``model.norm`` is replaced per variant,
    ``train.lr`` per learning rate of ``lrs`` and ``train.seed`` per seed (seeds ``seed``,
    ``seed + 1``, ...); the rest is shared by every run. ``workers`` processes train seeds side by
    side (each with ``threads`` torch threads, 1 when unset); the losses do not depend on it."""

    variants: tuple[str, ...] = DEFAULT_VARIANTS
    seeds: int = 3
    seed: int = 0
    preset: str = "cpu"
    lrs: tuple[float, ...] = (3e-3,)
    workers: int = 1
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

    @property
    def runs_per_seed(self) -> int:
        return len(self.variants) * len(self.lrs)


def parse_lrs(lrs: str | Sequence[float]) -> tuple[float, ...]:
    """``"1e-3,3e-3"`` or a sequence of numbers -> a tuple of distinct positive rates, ascending."""
    items = lrs.split(",") if isinstance(lrs, str) else list(lrs)
    rates = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            continue
        try:
            rate = float(item)
        except (TypeError, ValueError):
            raise ArgumentError(
                "lrs", f"{item!r} is not a number; expected comma-separated rates like 1e-3,3e-3"
            ) from None
        rates.append(positive_number("lrs", rate))
    if not rates:
        raise ArgumentError("lrs", "no learning rate given; expected e.g. 1e-3,3e-3,1e-2")
    if len(set(rates)) != len(rates):
        raise ArgumentError("lrs", f"a rate is repeated in {rates}")
    return tuple(sorted(rates))


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
    batches = (t.steps // t.eval_interval + 1) * t.eval_batches + (t.final_eval_batches or 0)
    evals = batches * t.val_parts * per_token * tokens
    return float(cfg.runs_per_seed * cfg.seeds * (train + evals))


def cpu_matmul_rate(cfg: CompareConfig) -> float:
    """FLOP/s of this CPU for the run's largest matrix product (rows × d_model @ d_model × 4
    d_model, with the run's threads), best of three after a warm-up: the fastest the training can
    go, so ``training_flops / rate`` is a lower bound of its time. Takes ~0.1 s at d_model 512."""
    d, hidden = cfg.model.d_model, cfg.model.mlp_ratio * cfg.model.d_model
    rows = min(cfg.train.batch_size * cfg.model.seq_len, 2048)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, d, generator=gen), torch.randn(d, hidden, generator=gen)
    with torch_threads(cfg.threads):
        torch.mm(a, b)
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
    return 2 * rows * d * hidden / max(best, 1e-9)


def estimate_seconds(cfg: CompareConfig) -> float:
    """A lower bound of the run's wall time on this CPU (:func:`training_flops` at
    :func:`cpu_matmul_rate`, shared by ``workers`` processes). Small models stay far from a
    matrix product's peak: the default cpu preset took 111 s on 2 cores against an estimate of
    14 s."""
    return training_flops(cfg) / cpu_matmul_rate(cfg) / min(cfg.workers, cfg.seeds)


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
    variants: str | Sequence[str] | None = None,
    seeds: int | None = None,
    seed: int = 0,
    lrs: str | Sequence[float] | None = None,
    workers: int | None = None,
    text: str | os.PathLike | None = None,
    device: str = "auto",
    threads: int | None = None,
    **overrides: int | float | None,
) -> CompareConfig:
    """A checked :class:`CompareConfig` from a preset (``"cpu"``, ``"full"``, ``"gpu"``,
    ``"tiny"``) and overrides: ``variants``, ``seeds``, ``lrs`` (the learning rates swept per
    variant), ``workers``, and ``n_layers``, ``d_model``, ``n_heads``, ``seq_len``, ``steps``,
    ``batch_size``, ``lr`` (one rate: the same as ``lrs=[lr]``), ``eval_interval``,
    ``eval_batches``, ``final_eval_batches``. ``None`` keeps the preset's value. Bad values raise
    :class:`ArgumentError` naming the option."""
    if preset not in PRESETS:
        raise ArgumentError("preset", f"must be one of {', '.join(PRESETS)}, got {preset!r}")
    model_kw = dict(PRESETS[preset]["model"])
    train_kw = dict(PRESETS[preset]["train"])
    design = dict(PRESETS[preset]["design"])
    for name, value in overrides.items():
        if name not in MODEL_OPTIONS + TRAIN_OPTIONS:
            raise TypeError(f"compare_config() got an unexpected option {name!r}")
        if value is None:
            continue
        if name == "lr":
            positive_number("lr", value)
        else:
            positive_int(name, value)
        (model_kw if name in MODEL_OPTIONS else train_kw)[name] = value
    if overrides.get("lr") is not None:
        if lrs is not None:
            raise ArgumentError("lr", "give one rate (lr) or a sweep (lrs), not both")
        lrs = (overrides["lr"],)
    rates = parse_lrs(design["lrs"] if lrs is None else lrs)
    train_kw["lr"] = rates[0]  # each run replaces it with its own rate
    divisible("d_model", model_kw["d_model"], "n_heads", model_kw["n_heads"])
    train_kw["warmup"] = min(train_kw["warmup"], max(1, train_kw["steps"] // 10))
    # Two disjoint halves of the held-out bytes: the first chooses each variant's learning rate,
    # the second is reported; a diverged run stops and is reported as diverged. The rate decays
    # to 0, so a run ends with its validation loss flat (at a fixed budget of steps, the schedule
    # is what flattens it: 2-layer d_model 512, 1e-3, 220 steps: the last 20% of the steps
    # lowered the loss by 0.5% with a floor of 0, by 1.4% with a floor of 10%).
    train_kw |= dict(val_parts=2, stop_on_divergence=True, min_lr_ratio=0.0)
    workers = design["workers"] if workers is None else positive_int("workers", workers)
    if threads is None and workers > 1:
        threads = 1  # one thread per worker: two workers of two threads on two cores stall
    cfg = CompareConfig(
        variants=parse_variants(design["variants"] if variants is None else variants),
        seeds=positive_int("seeds", design["seeds"] if seeds is None else seeds),
        seed=non_negative_int("seed", seed),
        preset=preset,
        lrs=rates,
        workers=workers,
        model=TransformerConfig(**model_kw),
        train=TrainConfig(**train_kw),
        text=None if text is None else str(text),
        device=resolve_device(device),
        threads=None if threads is None else positive_int("threads", threads),
    )
    if cfg.workers > 1 and cfg.device == "cuda":
        raise ArgumentError("workers", "more than one worker is for CPU runs; on cuda use 1")
    if preset == "gpu" and device == "auto" and cfg.device == "cpu":
        # Sized for an accelerator: on a CPU it runs for days. Asking for the CPU explicitly
        # (device="cpu") still runs it.
        flops, rate = training_flops(cfg), cpu_matmul_rate(cfg)
        estimate = flops / rate
        if estimate > CPU_REFUSE_S:
            raise ArgumentError(
                "preset",
                f"'gpu' is sized for a GPU, and torch sees none: on this CPU the run "
                f"({len(cfg.variants)} variants × {len(cfg.lrs)} rates × {cfg.seeds} seeds × "
                f"{cfg.train.steps} steps) "
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


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU thread count set to ``n`` inside (None: left as it is), restored on leaving."""
    previous = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
