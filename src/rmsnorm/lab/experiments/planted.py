"""A mean planted inside a block, where a network can see it: a bias of c on every unit of block 1's
MLP output, in the same random network with LayerNorm and with RMSNorm, against the clean network.

Derived: in a pre-LN LayerNorm network the stream after block 1 becomes h + c·𝟙 and stays exactly
that, because every later block reads it through a LayerNorm, which ignores a constant added to a
row; the logits do not move. With RMSNorm the later blocks read (h + c·𝟙)/RMS: they see the offset,
their writes change, and so do the logits. Measured in float64: how far the planted stream moves
beyond h + c·𝟙 (relative to ‖h‖), |μ|/σ per layer, and KL(clean ‖ planted) of the next-token
distributions with max |Δ logits|.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..models.transformer import Transformer, TransformerConfig
from ..stats.rows import median, row_stats

__all__ = ["planted_in_block"]


@torch.no_grad()
def _run(cfg: TransformerConfig, seed: int, tokens: torch.Tensor, bias: float):
    torch.manual_seed(seed)
    model = Transformer(cfg).double().eval()
    if bias:
        model.blocks[0].mlp.proj.bias.fill_(bias)
    return model(tokens, return_residuals=True)


def planted_in_block(
    bias: float = 0.02,
    seeds: int = 3,
    norms: tuple[str, ...] = ("layernorm", "rmsnorm"),
    base: TransformerConfig | None = None,
    batch: int = 16,
) -> dict:
    """Per norm and seed (seeds 0 … ``seeds`` − 1; the tokens of ``batch`` × seq_len drawn from
    seed + 1, as the simulation draws them): the median |μ|/σ per layer clean and planted, the
    largest ‖h_planted − h_clean − c·𝟙‖/‖h_clean‖ over tokens per layer (0 up to rounding where
    no block sees the offset; the embedding and block 1 are 0 by construction), and the logits'
    KL (mean over tokens, nats) and max |Δ|."""
    if not (isinstance(bias, (int, float)) and math.isfinite(bias)) or bias == 0:
        raise ValueError(f"bias must be a finite nonzero number, got {bias!r}")
    base = base or TransformerConfig()
    out: dict = {"bias": float(bias), "block": 1, "config": base.to_dict(), "runs": []}
    for norm in norms:
        cfg = TransformerConfig(**{**base.to_dict(), "norm": norm})
        for seed in range(seeds):
            gen = torch.Generator().manual_seed(seed + 1)
            tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=gen)
            logits_c, res_c = _run(cfg, seed, tokens, 0.0)
            logits_p, res_p = _run(cfg, seed, tokens, bias)
            beyond, clean_r, planted_r = [], [], []
            for i, (hc, hp) in enumerate(zip(res_c, res_p, strict=True)):
                shift = bias if i >= 1 else 0.0
                dev = (hp - hc - shift).norm(dim=-1) / hc.norm(dim=-1)
                beyond.append(float(dev.max()))
                clean_r.append(median(row_stats(hc).ratio))
                planted_r.append(median(row_stats(hp).ratio))
            lp, lq = F.log_softmax(logits_c, -1), F.log_softmax(logits_p, -1)
            kl = (lp.exp() * (lp - lq)).sum(-1)
            out["runs"].append(
                {
                    "norm": norm,
                    "seed": seed,
                    "median_ratio_clean": clean_r,
                    "median_ratio_planted": planted_r,
                    "beyond_shift": beyond,
                    "kl_mean": float(kl.mean().clamp_min(0)),
                    "max_abs_logit_diff": float((logits_p - logits_c).abs().max()),
                    "median_sigma_block1": median(row_stats(res_c[1]).std),
                }
            )
    return out
