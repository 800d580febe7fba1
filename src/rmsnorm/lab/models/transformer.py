"""The simulated transformer: a small GPT-style model with residual connections, standard
initialization and a switchable normalization, reused by the simulation, the training comparison and
the conversion.

``Transformer(cfg)(tokens, return_residuals=True)`` also returns the residual stream after the
embedding and after every block, which is what the lab measures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from ..._validate import divisible, one_of, positive_int
from ...modules import LayerNorm, RMSNorm
from .norm_layers import norm_kind

NORMS = ("layernorm", "rmsnorm", "prmsnorm", "none")
# How the lab's figures, pages and tables name each of the norms.
NORM_NAMES = dict(zip(NORMS, ("LayerNorm", "RMSNorm", "pRMSNorm", "no norm"), strict=True))
NORM_POSITIONS = ("pre", "post")
ACTIVATIONS = ("gelu", "relu", "swiglu")


@dataclass
class TransformerConfig:
    """Architecture of the simulated transformer. ``norm``: ``"layernorm"``, ``"rmsnorm"``,
    ``"prmsnorm"`` (RMS from the first ``partial`` fraction of each row) or ``"none"``;
    ``norm_position``: ``"pre"`` (GPT-2 style, a final norm before the head) or ``"post"`` (original
    Transformer: norm after each residual add). ``init_std`` is the standard deviation of every
    weight matrix and embedding at initialization; the two projections writing into the residual
    stream are further scaled by 1/sqrt(2·n_layers) (GPT-2). ``activation``: the MLP's
    ``"gelu"`` (GPT-2), ``"relu"``, or ``"swiglu"`` (SiLU(a)·b, LLaMA; its first layer has two
    halves, a and b, of ``mlp_ratio·d_model`` each, so it holds twice GELU's first-layer
    weights)."""

    n_layers: int = 12
    d_model: int = 256
    n_heads: int = 4
    seq_len: int = 64
    vocab_size: int = 256  # bytes
    mlp_ratio: int = 4
    norm: str = "layernorm"
    norm_position: str = "pre"
    partial: float = 0.0625
    eps: float = 1e-5
    init_std: float = 0.02
    bias: bool = True
    activation: str = "gelu"

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size", "mlp_ratio"):
            positive_int(name, getattr(self, name))
        divisible("d_model", self.d_model, "n_heads", self.n_heads)
        one_of("norm", self.norm, NORMS)
        one_of("norm_position", self.norm_position, NORM_POSITIONS)
        one_of("activation", self.activation, ACTIVATIONS)
        if not 0.0 < self.partial <= 1.0:
            raise ValueError(f"partial must be in (0, 1], got {self.partial!r}")
        if not (isinstance(self.init_std, (int, float)) and 0 < self.init_std < math.inf):
            raise ValueError(f"init_std must be a finite number > 0, got {self.init_std!r}")

    @classmethod
    def of(cls, config, **overrides) -> TransformerConfig:
        """The architecture a study's ``config`` describes: its fields that are also this class's
        (the same names mean the same things throughout the lab), then ``overrides``."""
        shared = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        return cls(**{**shared, **overrides})

    def to_dict(self) -> dict:
        return asdict(self)


def make_norm(cfg: TransformerConfig) -> nn.Module:
    """The normalization the config names (this library's modules; Identity for ``"none"``)."""
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.d_model, eps=cfg.eps, bias=cfg.bias)
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, eps=cfg.eps)
    if cfg.norm == "prmsnorm":
        return RMSNorm(cfg.d_model, eps=cfg.eps, partial=cfg.partial)
    return nn.Identity()


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)  # writes the residual stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )  # (B, H, T, D/H)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model
        self.activation = cfg.activation
        gated = cfg.activation == "swiglu"
        self.fc = nn.Linear(cfg.d_model, 2 * hidden if gated else hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)  # writes the residual stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.activation == "swiglu":
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        elif self.activation == "relu":
            h = F.relu(h)
        else:
            h = F.gelu(h)
        return self.proj(h)


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.pre = cfg.norm_position == "pre"
        self.norm1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


class Transformer(nn.Module):
    """GPT-style decoder: token + position embeddings, ``n_layers`` blocks, final norm (pre-LN),
    head."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = make_norm(cfg) if cfg.norm_position == "pre" else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        norms = [m for m in self.modules() if norm_kind(m) is not None]
        own = {id(p) for m in norms for p in m.parameters(recurse=False)}
        for name, p in self.named_parameters():
            if id(p) in own:  # norms keep their own init (γ = 1, β = 0)
                continue
            if p.dim() == 1:  # linear biases start at 0
                p.zero_()
                continue
            scaled = name.endswith("proj.weight")  # the two layers writing into the residual stream
            p.normal_(0.0, std / math.sqrt(2 * self.cfg.n_layers) if scaled else std)
        for m in norms:
            m.reset_parameters()

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, D)
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"tokens must be a (batch, seq) integer tensor, got {tuple(tokens.shape)}"
            )
        if tokens.shape[1] > self.cfg.seq_len:
            raise ValueError(
                f"sequence length {tokens.shape[1]} exceeds seq_len {self.cfg.seq_len}"
            )
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok_emb(tokens) + self.pos_emb(pos)

    def forward(
        self,
        tokens: torch.Tensor | None = None,
        *,
        embeddings: torch.Tensor | None = None,
        return_residuals: bool = False,
    ):
        """Logits (B, T, vocab) from ``tokens`` (B, T) or from ready ``embeddings`` (B, T, D) (e.g.
        random token embeddings). With ``return_residuals``, returns ``(logits, residuals)`` where
        residuals is a list of n_layers + 1 tensors (B, T, D): the stream after the embedding and
        after each block."""
        if (tokens is None) == (embeddings is None):
            raise ValueError("pass exactly one of tokens or embeddings")
        x = self.embed(tokens) if tokens is not None else embeddings
        residuals = [x]
        for block in self.blocks:
            x = block(x)
            residuals.append(x)
        logits = self.head(self.norm_f(x))
        return (logits, residuals) if return_residuals else logits

    def norm_parameter_count(self) -> int:
        """Parameters held by the normalization layers alone (as
        :func:`~rmsnorm.lab.models.norm_layers.norm_kind` recognises them)."""
        return sum(
            p.numel()
            for m in self.modules()
            if norm_kind(m) is not None
            for p in m.parameters(recurse=False)
        )


def _register_conversion() -> None:
    """Make the Transformer convertible by :func:`rmsnorm.convert.layernorm_to_rmsnorm` and
    loadable by :func:`rmsnorm.convert.load_model`: its entry in the conversion's table (the lab
    imports the conversion; the conversion never imports the lab)."""
    from ...convert.architectures import (
        LAB_TRANSFORMER,
        POST_LN,
        Architecture,
        register_architecture,
    )

    register_architecture(
        Architecture(
            name=LAB_TRANSFORMER,
            description="the lab's Transformer (norm='layernorm', norm_position='pre')",
            embeddings=("tok_emb", "pos_emb"),
            layers="blocks",
            writers=(("attn.proj", "linear"), ("mlp.proj", "linear")),
            norms=("norm1", "norm2"),
            final_norm="norm_f",
            requires=(("norm_position", "pre", POST_LN),),
            model_class=lambda: Transformer,
            build=lambda config: Transformer(TransformerConfig(**config)),
            base="",
            config="cfg",
            context="seq_len",
            converted_config=(("norm", "layernorm", "rmsnorm"),),
        )
    )


_register_conversion()
