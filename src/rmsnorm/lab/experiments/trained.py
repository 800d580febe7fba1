"""Networks of both kinds, trained: the same small model trained with LayerNorm and with RMSNorm
(same seeds, same initial weights, same data order and steps, the shared
:class:`~rmsnorm.lab.models.train.Trainer`), measured before and after on the same held-out bytes.

Per layer of the residual stream: the medians over tokens of |μ|, σ and |μ|/σ (μ and σ apart, so
that a falling ratio can be read: did μ shrink or σ grow?), the token-shared share of E[μ²], what a
per-feature β can absorb, the per-channel outliers, and the share of ∂L/∂residual along 𝟙:
Σ_t (Σ_i g_ti)²/d ÷ Σ_t Σ_i g_ti², which is 1/d for a gradient of random direction. In a pre-LN
LayerNorm network it is zero up to rounding: every path from the stream to the loss passes a
LayerNorm, which ignores a constant added to its input (LN(x + c𝟙) = LN(x)), so the loss never pulls
on the stream's mean. The trained LayerNorm models are kept for the swap
(:mod:`~rmsnorm.lab.experiments.swap`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from ..._progress import ensure
from ..._validate import positive_int
from ..models.transformer import Transformer, TransformerConfig
from ..stats.conventions import beta_fit
from ..stats.decomposition import shared_share
from ..stats.outliers import channel_outliers
from ..stats.rows import median, row_stats

__all__ = ["TrainStudyConfig", "TrainedRun", "TrainStudy", "measure_state", "run_training_study"]

EVAL_SEED = 0  # the held-out windows every run is measured and scored on


@dataclass
class TrainStudyConfig:
    """The model, the schedule and the seeds. ``warmup`` None: a tenth of the steps (at least 1,
    at most 20), as ``rmsnorm simulate --train-steps`` uses."""

    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    seq_len: int = 64
    steps: int = 60
    train_batch: int = 8
    eval_batch: int = 16
    lr: float = 3e-3
    warmup: int | None = None
    seeds: int = 3
    norms: tuple[str, ...] = ("layernorm", "rmsnorm")
    text: str | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "train_batch", "eval_batch", "seeds"):
            positive_int(name, getattr(self, name))
        self.model_config("layernorm")  # the model's own checks
        if "layernorm" not in self.norms:
            raise ValueError("norms must include 'layernorm' (the swap needs the LayerNorm models)")

    @property
    def resolved_warmup(self) -> int:
        return self.warmup if self.warmup is not None else max(1, min(20, self.steps // 10))

    def model_config(self, norm: str) -> TransformerConfig:
        return TransformerConfig.of(self, norm=norm)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["norms"] = list(self.norms)
        out["warmup"] = self.resolved_warmup
        return out


def measure_state(model: Transformer, tokens: torch.Tensor, targets: torch.Tensor) -> dict:
    """Per layer of the residual stream (after the embedding and after each block), from a float64
    copy of ``model`` on ``tokens``: medians of |μ|, σ, |μ|/σ; mean predicted cosine; the
    token-shared share of E[μ²]; :func:`~rmsnorm.lab.stats.conventions.beta_fit`'s left share; the
    outliers; the share of ∂L/∂residual along 𝟙 (L: the next-token loss on ``targets``); and the
    loss itself. Lists run over layers."""
    m = copy.deepcopy(model).double().eval()
    logits, residuals = m(tokens, return_residuals=True)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    grads = torch.autograd.grad(loss, residuals)
    out: dict = {
        k: []
        for k in (
            "median_abs_mu",
            "median_sigma",
            "median_ratio",
            "mean_cosine",
            "shared_share",
            "beta_left_share",
            "beta_mean_term_left_share",
            "grad_ones_share",
            "outliers",
        )
    }
    ratios = []
    for h, g in zip(residuals, grads, strict=True):
        rows = h.detach().reshape(-1, h.shape[-1])
        s = row_stats(rows)
        ratios.append(s.ratio)
        out["median_abs_mu"].append(median(s.mean.abs()))
        out["median_sigma"].append(median(s.std))
        out["median_ratio"].append(median(s.ratio))
        out["mean_cosine"].append(float(s.cosine.mean()))
        out["shared_share"].append(shared_share(s.mean)[2])
        fit = beta_fit(rows, model.cfg.eps)
        out["beta_left_share"].append(fit["left_share"])
        out["beta_mean_term_left_share"].append(fit["mean_term_left_share"])
        g = g.reshape(-1, g.shape[-1])
        d = g.shape[-1]
        along = float(g.sum(dim=-1).square().sum()) / d
        out["grad_ones_share"].append(along / float(g.square().sum()))
        out["outliers"].append(channel_outliers(rows))
    out["pooled_median_ratio"] = median(torch.cat(ratios))
    out["loss"] = float(loss.detach())
    return out


@dataclass
class TrainedRun:
    """One model (``norm``, ``seed``): measured at init and after ``steps`` steps, its validation
    losses, its training seconds; ``model`` is the trained model (not serialised)."""

    norm: str
    seed: int
    steps: int
    init: dict
    trained: dict
    val_loss: dict
    train_seconds: float
    train_loss: list[float]
    model: Transformer | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {
            "norm": self.norm,
            "seed": self.seed,
            "steps": self.steps,
            "val_loss": self.val_loss,
            "train_seconds": self.train_seconds,
            "train_loss": [round(v, 5) for v in self.train_loss],
            "init": self.init,
            "trained": self.trained,
        }


@dataclass
class TrainStudy:
    config: TrainStudyConfig
    corpus: str
    runs: list[TrainedRun]
    eval_tokens: torch.Tensor = field(repr=False)
    eval_targets: torch.Tensor = field(repr=False)
    seconds: float = 0.0

    def of(self, norm: str) -> list[TrainedRun]:
        return [r for r in self.runs if r.norm == norm]

    def layer_names(self) -> list[str]:
        return ["embedding"] + [f"block {i + 1}" for i in range(self.config.n_layers)]

    def to_dict(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "corpus": self.corpus,
            "eval_tokens": list(self.eval_tokens.shape),
            "layers": self.layer_names(),
            "runs": [r.to_dict() for r in self.runs],
            "seconds": self.seconds,
        }


def _corpus(text: str | None):
    from ..models.corpus import stdlib_corpus, text_corpus

    return text_corpus(text) if text is not None else stdlib_corpus()


def run_training_study(cfg: TrainStudyConfig | None = None, progress=None) -> TrainStudy:
    """Train ``cfg.seeds`` seeds × ``cfg.norms`` models (each seed: the same initial weights and
    data order for every norm) and measure each before and after (:func:`measure_state`)."""
    from ..models.train import TrainConfig, Trainer, evaluate

    cfg = cfg or TrainStudyConfig()
    progress = ensure(progress)
    t0 = time.perf_counter()
    corpus = _corpus(cfg.text)
    gen = torch.Generator().manual_seed(EVAL_SEED)
    tokens, targets = corpus.batch("val", cfg.eval_batch, cfg.seq_len, gen)
    runs = []
    for seed in range(cfg.seeds):
        for norm in cfg.norms:
            label = f"train {norm} seed {seed}: {cfg.steps} steps"
            torch.manual_seed(seed)
            model = Transformer(cfg.model_config(norm))
            tcfg = TrainConfig(
                steps=cfg.steps,
                batch_size=cfg.train_batch,
                lr=cfg.lr,
                warmup=cfg.resolved_warmup,
                eval_interval=cfg.steps,
                seed=seed,
                eval_seed=EVAL_SEED,
            )
            init = measure_state(model, tokens, targets)
            loss0 = evaluate(model, corpus, tcfg.eval_batches, tcfg.batch_size, EVAL_SEED)
            trainer = Trainer(model, corpus, tcfg)
            t1 = time.perf_counter()
            with progress.task(label, total=cfg.steps) as advance:
                while not trainer.done:
                    trainer.step()
                    advance()
            seconds = time.perf_counter() - t1
            hist = trainer.history
            runs.append(
                TrainedRun(
                    norm,
                    seed,
                    cfg.steps,
                    init,
                    measure_state(model, tokens, targets),
                    {"init": loss0, "trained": hist.val_loss[-1]},
                    seconds,
                    hist.train_loss,
                    model,
                )
            )
    return TrainStudy(cfg, corpus.name, runs, tokens, targets, time.perf_counter() - t0)
