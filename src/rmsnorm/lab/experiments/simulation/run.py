"""The chapter's experiment, reproducible (``rmsnorm simulate``): run the simulated transformer and
record, per token and per layer, the mean μ, standard deviation σ and RMS of the residual stream;
optionally train it briefly and record the same numbers again.

The residual stream is measured after the embedding and after each block (n_layers + 1 points);
in a post-norm network, where the stream after a block is its norm's output, the rows measured are
those that norm reads (x + MLP(x)). μ is split into its token-shared and per-token parts
(:mod:`~rmsnorm.lab.stats.decomposition`).
A ``planted_mean`` c adds c to every element of the input embeddings: every row's μ moves by c, and
in a LayerNorm network no block sees it (each norm subtracts it). A ``planted_bias`` c is a bias
of c on every unit of block 1's MLP output: a mean planted inside a block, which the blocks after
it see through an RMSNorm (and not through a LayerNorm).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ...._progress import ensure
from ...._validate import finite_number, non_negative_int, one_of, positive_int
from ...models.transformer import Transformer, TransformerConfig
from ...stats.decomposition import MeanDecomposition, capture_writes
from ...stats.rows import (
    RowStats,
    identity_check,
    measured_divergence,
    predicted_cosine,
    row_stats,
    summarize,
)

__all__ = [
    "SimulationConfig",
    "StageStats",
    "SimulationResult",
    "simulate",
    "INPUTS",
]

INPUTS = ("auto", "tokens", "gaussian", "text")


@dataclass
class SimulationConfig:
    """What to simulate. ``inputs``: ``"tokens"`` (uniform random token ids through the model's
    own, randomly initialised, embedding tables), ``"gaussian"`` (i.i.d. N(0, init_std²) vectors fed
    as embeddings), ``"text"`` (validation windows of the corpus) or ``"auto"`` (tokens without
    training, text with it). ``train_steps`` > 0 trains the same model on ``text`` (a path; the
    Python standard-library corpus when None) and measures it again. ``activation``: the MLP's
    (``"gelu"``, ``"relu"``, ``"swiglu"``); ``center_activation`` removes each MLP unit's mean over
    the batch's tokens before the output projection (an ablation: no token-shared MLP write)."""

    n_layers: int = 12
    d_model: int = 256
    n_heads: int = 4
    seq_len: int = 64
    batch: int = 16
    seed: int = 0
    norm: str = "layernorm"
    norm_position: str = "pre"
    init_std: float = 0.02
    activation: str = "gelu"
    center_activation: bool = False
    inputs: str = "auto"
    text: str | None = None
    planted_mean: float = 0.0
    planted_bias: float = 0.0
    train_steps: int = 0
    train_batch: int = 16
    lr: float = 3e-3
    raw_tokens: int = 256  # per layer and stage, kept in the JSON

    def __post_init__(self) -> None:
        self.transformer_config()  # the model's own checks: sizes, heads, norm, init_std
        for name in ("batch", "train_batch"):
            positive_int(name, getattr(self, name))
        for name in ("train_steps", "raw_tokens", "seed"):
            non_negative_int(name, getattr(self, name))
        finite_number("planted_mean", self.planted_mean)
        finite_number("planted_bias", self.planted_bias)
        one_of("inputs", self.inputs, INPUTS)
        if self.text is not None and not Path(self.text).is_file():
            raise FileNotFoundError(f"text: no such file {self.text!r}")

    @property
    def resolved_inputs(self) -> str:
        if self.inputs != "auto":
            return self.inputs
        return "text" if self.train_steps > 0 else "tokens"

    def transformer_config(self) -> TransformerConfig:
        return TransformerConfig.of(self)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StageStats:
    """Residual-stream statistics of one model state: (n_layers + 1, tokens) float64 tensors.
    ``measured_cosine`` is cos(LayerNorm(h), RMSNorm(h)) from the two actual outputs (γ = 1, β = 0,
    the model's ε) of each token's residual vector h, next to the prediction σ/RMS;
    ``decomposition`` splits μ into its token-shared and per-token parts."""

    mean: torch.Tensor
    std: torch.Tensor
    rms: torch.Tensor
    measured_cosine: torch.Tensor
    decomposition: MeanDecomposition | None = None

    def layer(self, i: int) -> RowStats:
        return RowStats(self.mean[i], self.std[i], self.rms[i])

    @property
    def ratio(self) -> torch.Tensor:
        return self.mean.abs() / self.std

    @property
    def cosine(self) -> torch.Tensor:
        return predicted_cosine(self.mean, self.std)

    def summary(self) -> list[dict]:
        out = []
        for i in range(self.mean.shape[0]):
            s = self.layer(i)
            out.append(
                {
                    "mu": summarize(s.mean),
                    "sigma": summarize(s.std),
                    "rms": summarize(s.rms),
                    "mu_over_sigma": summarize(s.ratio),
                    "mean_energy_share": summarize(s.mean_energy_share),
                    "predicted_cosine": summarize(s.cosine),
                    "measured_cosine": summarize(self.measured_cosine[i]),
                    "cosine_max_abs_diff": float((s.cosine - self.measured_cosine[i]).abs().max()),
                    "identity": identity_check(s),
                }
            )
        return out

    def raw(self, tokens: int) -> dict:
        def r(t: torch.Tensor) -> list[list[float]]:
            return [[float(f"{v:.6g}") for v in row[:tokens].tolist()] for row in t]

        return {"mu": r(self.mean), "sigma": r(self.std), "rms": r(self.rms)}


@dataclass
class SimulationResult:
    config: SimulationConfig
    layer_names: list[str]
    init: StageStats
    trained: StageStats | None = None
    train_history: dict | None = None
    val_loss: dict = field(default_factory=dict)  # {"init": ..., "trained": ...} with training
    seconds: dict = field(default_factory=dict)

    @property
    def stages(self) -> dict[str, StageStats]:
        out = {"init": self.init}
        if self.trained is not None:
            out["trained"] = self.trained
        return out

    def to_dict(self) -> dict:
        cfg = self.config
        return {
            "config": cfg.to_dict(),
            "inputs": cfg.resolved_inputs,
            "tokens_per_layer": int(self.init.mean.shape[1]),
            "layers": self.layer_names,
            "stages": {
                name: {
                    "per_layer": st.summary(),
                    "decomposition": None
                    if st.decomposition is None
                    else st.decomposition.to_dict(),
                    "raw": st.raw(cfg.raw_tokens),
                }
                for name, st in self.stages.items()
            },
            "val_loss": self.val_loss,
            "train_history": self.train_history,
            "seconds": self.seconds,
        }


def _layer_names(n_layers: int) -> list[str]:
    return ["embedding"] + [f"block {i + 1}" for i in range(n_layers)]


@torch.no_grad()
def _measure(
    model: Transformer, cfg: SimulationConfig, inputs: torch.Tensor, kind: str
) -> StageStats:
    """Residual stream statistics with the planted mean added to the input embeddings."""
    model.eval()
    if kind == "gaussian":
        emb = inputs
    else:
        emb = model.embed(inputs)
    emb = emb + cfg.planted_mean
    post = cfg.norm_position == "post" and cfg.norm != "none"
    norm_inputs: list[torch.Tensor] = []
    handles = []
    if post:  # the rows each block's second norm reads, not that norm's (centered) output
        for block in model.blocks:
            handles.append(
                block.norm2.register_forward_pre_hook(lambda m, args: norm_inputs.append(args[0]))
            )
    try:
        with capture_writes(model, cfg.center_activation) as writes:
            _, residuals = model(embeddings=emb, return_residuals=True)
    finally:
        for h in handles:
            h.remove()
    if post:
        residuals = [residuals[0], *norm_inputs]
    stats = [row_stats(h) for h in residuals]  # each over the (batch·seq) tokens
    measured = [measured_divergence(h.double(), model.cfg.eps)[0] for h in residuals]
    means = torch.stack([s.mean for s in stats])
    additive = cfg.norm_position == "pre" or cfg.norm == "none"
    return StageStats(
        means,
        torch.stack([s.std for s in stats]),
        torch.stack([s.rms for s in stats]),
        torch.stack(measured),
        MeanDecomposition.of(means, writes, additive),
    )


def _corpus(cfg: SimulationConfig):
    from ...models.corpus import stdlib_corpus, text_corpus

    return text_corpus(cfg.text) if cfg.text is not None else stdlib_corpus()


def simulate(
    cfg: SimulationConfig | None = None, progress=None, label: str = "simulate"
) -> SimulationResult:
    """Run the experiment described by ``cfg`` (defaults: the chapter's 12-layer pre-LN
    transformer at initialization on random tokens); ``label`` names its progress bars."""
    cfg = cfg or SimulationConfig()
    progress = ensure(progress)
    kind = cfg.resolved_inputs
    seconds: dict = {}
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.transformer_config())
    if cfg.planted_bias:
        with torch.no_grad():
            model.blocks[0].mlp.proj.bias.fill_(cfg.planted_bias)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    corpus = None
    if kind == "text" or cfg.train_steps > 0:
        corpus = _corpus(cfg)
    if kind == "tokens":
        inputs = torch.randint(0, model.cfg.vocab_size, (cfg.batch, cfg.seq_len), generator=gen)
    elif kind == "gaussian":
        inputs = cfg.init_std * torch.randn(cfg.batch, cfg.seq_len, cfg.d_model, generator=gen)
    else:
        inputs, _ = corpus.batch("val", cfg.batch, cfg.seq_len, gen)
    with progress.task(f"{label}: forward at init", total=1) as advance:
        init = _measure(model, cfg, inputs, kind)
        advance()
    seconds["init"] = time.perf_counter() - t0
    result = SimulationResult(cfg, _layer_names(cfg.n_layers), init, seconds=seconds)
    if cfg.train_steps > 0:
        from ...models.train import TrainConfig, evaluate, train

        tcfg = TrainConfig(
            steps=cfg.train_steps,
            batch_size=cfg.train_batch,
            lr=cfg.lr,
            warmup=max(1, min(20, cfg.train_steps // 10)),
            eval_interval=max(1, cfg.train_steps),
            seed=cfg.seed,
        )
        t1 = time.perf_counter()
        loss0 = evaluate(model, corpus, tcfg.eval_batches, tcfg.batch_size, tcfg.seed)
        with progress.task(f"{label}: train {cfg.train_steps} steps", total=cfg.train_steps) as adv:
            hist = train(model, corpus, tcfg, on_step=lambda step, loss: adv())
        result.trained = _measure(model, cfg, inputs, kind)
        result.val_loss = {"init": loss0, "trained": hist.val_loss[-1]}
        result.train_history = {
            "corpus": corpus.name,
            "steps": cfg.train_steps,
            "train_loss": [round(v, 5) for v in hist.train_loss],
            "mean_step_s": sum(hist.step_time_s) / len(hist.step_time_s),
        }
        seconds["train"] = time.perf_counter() - t1
    seconds["total"] = time.perf_counter() - t0
    return result
