"""A small, deterministic language-model training loop over a :class:`~.corpus.Corpus`, shared by
the simulation's "trained" case and the training comparison: any norm variant, any seed, with the
per-step loss, gradient norm, learning rate and time recorded."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from ..._validate import non_negative_int, positive_int, positive_number
from .corpus import Corpus
from .transformer import Transformer


@dataclass
class TrainConfig:
    """AdamW, linear warm-up then cosine decay to ``min_lr_ratio`` (10%) of ``lr``; data order
    fixed by ``seed``."""

    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup: int = 20
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    eval_interval: int = 50
    eval_batches: int = 4
    seed: int = 0
    # Seed of the fixed validation windows; None: ``seed``. The training comparison fixes it so
    # that every seed is scored on the same held-out bytes.
    eval_seed: int | None = None
    # The held-out split cut into this many contiguous, disjoint parts, each scored on
    # ``eval_batches`` fixed windows of its own (``TrainHistory.val_loss_parts``): one part to
    # choose a setting on, another to report, with no byte in common. ``val_loss`` is their mean.
    val_parts: int = 1
    # Batches of each part scored once more after the last step (None: no extra evaluation):
    # more windows where the final number is what is compared, the curve staying on the same
    # ``eval_batches`` windows throughout (``TrainHistory.final_val_loss_parts``).
    final_eval_batches: int | None = None
    # Stop a run at its first non-finite training loss or gradient norm
    # (``TrainHistory.diverged_at``) instead of stepping on with inf or NaN weights; off by
    # default, so a run always has ``steps`` entries.
    stop_on_divergence: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_interval", "eval_batches", "val_parts"):
            positive_int(name, getattr(self, name))
        if self.final_eval_batches is not None:
            positive_int("final_eval_batches", self.final_eval_batches)
        positive_number("lr", self.lr)
        non_negative_int("warmup", self.warmup)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        floor = self.min_lr_ratio
        return self.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


@dataclass
class TrainHistory:
    """Per step: training loss, step time, global gradient L2 norm before clipping, learning
    rate. Per evaluation: the step count, the validation loss (mean over parts) and the loss of
    each part of the held-out split. ``diverged_at``: the step whose training loss or gradient
    norm was not finite (with ``stop_on_divergence``), or None."""

    train_loss: list[float] = field(default_factory=list)  # one per step
    step_time_s: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    tokens_per_step: int = 0
    grad_norm: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    val_loss_parts: list[list[float]] = field(default_factory=list)  # [part][evaluation]
    # [part][window]: the loss of each validation window at the last evaluation (the final one
    # with ``final_eval_batches``), which says how much of a difference between two models is the
    # sampling of the windows
    val_windows: list[list[float]] = field(default_factory=list)
    # [part]: the loss on ``final_eval_batches`` batches after the last step (empty without)
    final_val_loss_parts: list[float] = field(default_factory=list)
    diverged_at: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def evaluate(
    model: Transformer,
    corpus: Corpus,
    batches: int,
    batch_size: int,
    seed: int,
    windows: list[float] | None = None,
) -> float:
    """Mean next-byte cross-entropy (nats) over ``batches`` fixed validation windows (drawn with
    a generator seeded from ``seed``: the same windows for every model). ``windows``, if given,
    receives the mean loss of each window (``batches × batch_size`` values, in order)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    device = next(model.parameters()).device
    total = 0.0
    for _ in range(batches):
        x, y = corpus.batch("val", batch_size, model.cfg.seq_len, gen)
        logits = model(x.to(device))
        total += F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten()).item()
        if windows is not None:
            per_byte = F.cross_entropy(logits.transpose(1, 2), y.to(device), reduction="none")
            windows += per_byte.mean(dim=1).tolist()
    model.train(was_training)
    return total / batches


class Trainer:
    """One model's training state (optimizer, data generator, history), advanced one step at a time.

    :func:`train` runs it to the end; the training comparison advances several trainers in lockstep
    so that every variant's steps are timed under the same machine load."""

    def __init__(self, model: Transformer, corpus: Corpus, cfg: TrainConfig) -> None:
        self.model, self.corpus, self.cfg = model, corpus, cfg
        self.device = next(model.parameters()).device
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": no_decay, "weight_decay": 0},
            ],
            lr=cfg.lr,
            betas=(0.9, 0.95),
        )
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.history = TrainHistory(tokens_per_step=cfg.batch_size * model.cfg.seq_len)
        self.history.val_loss_parts = [[] for _ in range(cfg.val_parts)]
        self.val_corpora = val_parts(corpus, cfg.val_parts, model.cfg.seq_len)
        self.step_index = 0

    @property
    def done(self) -> bool:
        return self.step_index >= self.cfg.steps or self.history.diverged_at is not None

    def step(self) -> float:
        """One optimizer step (timed: forward, backward, clipping, update), then the validation
        loss if one is due. Returns the training loss."""
        if self.done:
            if self.history.diverged_at is not None:
                raise RuntimeError(f"training stopped at step {self.history.diverged_at}: diverged")
            raise RuntimeError(f"training already ran its {self.cfg.steps} steps")
        cfg, model, hist, step = self.cfg, self.model, self.history, self.step_index
        model.train()
        lr = cfg.lr_at(step)
        for group in self.opt.param_groups:
            group["lr"] = lr
        x, y = self.corpus.batch("train", cfg.batch_size, model.cfg.seq_len, self.gen)
        t0 = time.perf_counter()
        logits = model(x.to(self.device))
        loss = F.cross_entropy(logits.flatten(0, 1), y.to(self.device).flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm(
                [p.grad for p in model.parameters() if p.grad is not None]
            )
        self.opt.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        hist.step_time_s.append(time.perf_counter() - t0)
        hist.train_loss.append(loss.item())
        hist.grad_norm.append(grad_norm.item())
        hist.lr.append(lr)
        self.step_index += 1
        finite = math.isfinite(hist.train_loss[-1]) and math.isfinite(hist.grad_norm[-1])
        if cfg.stop_on_divergence and not finite:
            hist.diverged_at = step
            return hist.train_loss[-1]
        eval_seed = cfg.seed if cfg.eval_seed is None else cfg.eval_seed
        if self.step_index % cfg.eval_interval == 0 or self.step_index == cfg.steps:
            hist.val_steps.append(self.step_index)
            hist.val_windows = [[] for _ in self.val_corpora]
            losses = [
                evaluate(model, part, cfg.eval_batches, cfg.batch_size, eval_seed, windows)
                for part, windows in zip(self.val_corpora, hist.val_windows, strict=True)
            ]
            for part_losses, value in zip(hist.val_loss_parts, losses, strict=True):
                part_losses.append(value)
            hist.val_loss.append(losses[0] if len(losses) == 1 else sum(losses) / len(losses))
        if self.step_index == cfg.steps and cfg.final_eval_batches is not None:
            hist.val_windows = [[] for _ in self.val_corpora]
            hist.final_val_loss_parts = [
                evaluate(model, part, cfg.final_eval_batches, cfg.batch_size, eval_seed, windows)
                for part, windows in zip(self.val_corpora, hist.val_windows, strict=True)
            ]
        return hist.train_loss[-1]


def val_parts(corpus: Corpus, parts: int, seq_len: int) -> list[Corpus]:
    """``corpus`` with its held-out split cut into ``parts`` contiguous, disjoint, equal parts
    (one :class:`Corpus` each, sharing the training split); ``[corpus]`` for one part. Each part
    must hold a window of ``seq_len`` + 2 bytes."""
    positive_int("val_parts", parts)
    if parts == 1:
        return [corpus]
    size = corpus.val.numel() // parts
    if size < seq_len + 2:
        raise ValueError(
            f"the validation split of {corpus.name} has {corpus.val.numel()} bytes: {parts} parts "
            f"of {size} bytes are shorter than seq_len + 2 = {seq_len + 2}"
        )
    return [
        Corpus(
            f"{corpus.name} (held-out part {i + 1}/{parts})",
            corpus.train,
            corpus.val[i * size : (i + 1) * size],
            corpus.sources,
        )
        for i in range(parts)
    ]


def train(
    model: Transformer,
    corpus: Corpus,
    cfg: TrainConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainHistory:
    """Train ``model`` in place for ``cfg.steps`` steps; validation loss every ``eval_interval``
    steps and after the last. ``on_step(step, loss)`` is called after each step (progress bars)."""
    trainer = Trainer(model, corpus, cfg)
    while not trainer.done:
        step = trainer.step_index
        loss = trainer.step()
        if on_step is not None:
            on_step(step, loss)
    return trainer.history
