"""Two conventions the seeds leave loose, measured: where ε goes, and whether a learned β can undo
the centering.

**ε.** The paper's PyTorch code and the seeds divide by RMS + ε; torch and Hugging Face by
√(mean(x²) + ε). Each output is the ε-free one times a shrink factor per row: b = RMS/(RMS + ε) and
b = RMS/√(RMS² + ε); LayerNorm's is a = σ/√(σ² + ε). ε is added to a quantity in units of x in the
first form and of x² in the others, so "the same ε" is not the same regularization: the ε′ that
makes RMS/(RMS + ε′) equal RMS/√(RMS² + ε) is √(RMS² + ε) − RMS ≈ ε/(2·RMS).

**β.** A learned β is one vector per feature; the mean μ that LayerNorm subtracts is one number per
token. RMSNorm(x) − LayerNorm(x) (γ = 1, β = 0) varies from token to token, and the best constant
β, fitted by least squares over tokens, is its mean over tokens: it removes only the token-shared
part. :func:`beta_fit` measures what it leaves.
"""

from __future__ import annotations

import math

import torch

from ... import functional
from .rows import RowStats, median, row_stats

__all__ = ["shrink_factors", "eps_table", "stream_shrink", "beta_fit"]


def shrink_factors(rms: float, eps: float, sigma: float | None = None) -> dict:
    """Predicted per-row output scale for a row of RMS ``rms`` (and standard deviation ``sigma``,
    default ``rms``: a centered row): LayerNorm a = σ/√(σ² + ε), RMSNorm b = RMS/√(RMS² + ε)
    (``"mean_square"``) and RMS/(RMS + ε) (``"rms"``), and the ε′ of the ``"rms"`` form that
    shrinks as much as ``"mean_square"`` does with ε."""
    sigma = rms if sigma is None else sigma
    return {
        "rms": rms,
        "eps": eps,
        "layernorm": sigma / math.sqrt(sigma * sigma + eps),
        "mean_square": rms / math.sqrt(rms * rms + eps),
        "rms_mode": rms / (rms + eps),
        "equivalent_rms_eps": math.sqrt(rms * rms + eps) - rms,
    }


def _measured_scale(x: torch.Tensor, eps: float, eps_mode: str) -> torch.Tensor:
    d = x.shape[-1]
    y = functional.rms_norm(x, (d,), eps=eps, eps_mode=eps_mode)
    return y.square().mean(dim=-1).sqrt()


def eps_table(
    rms_values: tuple[float, ...] = (1e-3, 1e-2, 0.02, 0.1, 1.0),
    eps_values: tuple[float, ...] = (1e-6, 1e-5),
    d: int = 256,
) -> list[dict]:
    """:func:`shrink_factors` for each RMS and ε, with the scales measured from this library's
    ``rms_norm`` (both ``eps_mode`` values) and ``layer_norm`` outputs of a centered Gaussian row
    rescaled to that RMS (float64)."""
    gen = torch.Generator().manual_seed(0)
    row = torch.randn(1, d, generator=gen, dtype=torch.float64)
    row = row - row.mean()
    row = row / row.square().mean().sqrt()
    out = []
    for eps in eps_values:
        for rms in rms_values:
            x = row * rms
            entry = shrink_factors(rms, eps)
            entry["measured_mean_square"] = float(_measured_scale(x, eps, "mean_square")[0])
            entry["measured_rms_mode"] = float(_measured_scale(x, eps, "rms")[0])
            ln = functional.layer_norm(x, (d,), eps=eps)
            entry["measured_layernorm"] = float(ln.square().mean().sqrt())
            out.append(entry)
    return out


def stream_shrink(rows: torch.Tensor | RowStats, eps: float) -> dict:
    """Over the tokens ``rows`` (..., d), or their :class:`~rmsnorm.lab.stats.RowStats`: the median
    shrink 1 − scale of LayerNorm and of both RMSNorm forms at ``eps``, and the medians of RMS
    and σ."""
    s = rows if isinstance(rows, RowStats) else row_stats(rows)
    std, rms = s.std.flatten(), s.rms.flatten()
    a = std / torch.sqrt(std.square() + eps)
    b_ms = rms / torch.sqrt(rms.square() + eps)
    b_rms = rms / (rms + eps)
    return {
        "eps": eps,
        "median_rms": median(rms),
        "median_sigma": median(std),
        "layernorm_shrink": median(1 - a),
        "mean_square_shrink": median(1 - b_ms),
        "rms_mode_shrink": median(1 - b_rms),
    }


def beta_fit(rows: torch.Tensor, eps: float = 1e-5) -> dict:
    """How much of RMSNorm(x) − LayerNorm(x) (γ = 1, β = 0, same ε) a per-feature β can absorb.
    The least-squares β over the tokens ``rows`` (..., d) is the mean difference; returned: the
    share of Σ‖Δ‖² it leaves (``left_share``), and for the mean term alone, m_t = μ_t/RMS_t (the
    coefficient of 𝟙 in RMSNorm(x) = (σ/RMS)·LN(x) + (μ/RMS)·𝟙), the share of Σ m_t² left after
    subtracting its mean over tokens (``mean_term_left_share``)."""
    x = rows.detach().to(torch.float64).reshape(-1, rows.shape[-1])
    d = x.shape[-1]
    delta = functional.rms_norm(x, (d,), eps=eps) - functional.layer_norm(x, (d,), eps=eps)
    beta = delta.mean(dim=0)
    total = float(delta.square().sum())
    left = float((delta - beta).square().sum())
    s = row_stats(x)
    m = torch.where(s.rms > 0, s.mean / s.rms, torch.zeros_like(s.mean))
    msq = float(m.square().sum())
    mleft = float((m - m.mean()).square().sum())
    return {
        "tokens": int(x.shape[0]),
        "left_share": left / total if total > 0 else math.nan,
        "mean_term_left_share": mleft / msq if msq > 0 else math.nan,
        "beta_rms": float(beta.square().mean().sqrt()),
    }
