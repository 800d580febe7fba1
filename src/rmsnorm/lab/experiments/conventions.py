"""The seeds' conventions measured: the two ε placements and the least-squares β on the simulated
stream (:func:`measure_conventions`), and a worked example of what ε does to the two norms'
divergence (:func:`eps_demo`). The formulas are :mod:`rmsnorm.lab.stats.conventions` and
:mod:`rmsnorm.lab.stats.rows`; this module runs them on data."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..stats.conventions import eps_table, stream_shrink
from ..stats.rows import RowStats, measured_divergence, predicted_divergence, spread

if TYPE_CHECKING:
    from .simulation.seeds import SeedStudy

__all__ = ["measure_conventions", "eps_demo"]


def measure_conventions(study: SeedStudy) -> dict:
    """On the simulation at initialization: the ε table at its width (predicted and measured from
    this library's outputs), how much each ε placement shrinks the first seed's tokens at ε = 1e-5
    and 1e-6, and the share of the mean term (μ/RMS)·𝟙 that the least-squares β leaves, per layer
    and seed (min, median, max, in %)."""
    st = study.results[0].init
    d = study.config.d_model
    stats = RowStats(st.mean.flatten(), st.std.flatten(), st.rms.flatten())  # every layer's tokens
    rows_ms = [stream_shrink(stats, eps) for eps in (1e-5, 1e-6)]
    # β: the mean term μ/RMS per token, per layer and seed, with its mean over tokens removed
    left = []
    for res in study.results:
        s = res.init
        for i in range(s.mean.shape[0]):
            m = torch.where(s.rms[i] > 0, s.mean[i] / s.rms[i], torch.zeros_like(s.mean[i]))
            total = float(m.square().sum())
            left.append(float((m - m.mean()).square().sum()) / total if total > 0 else math.nan)
    return {
        "d": d,
        "eps_table": eps_table(d=d),
        "stream": rows_ms,
        "beta_mean_term_left_pct_init": {k: 100 * v for k, v in spread(left).items()},
    }


def eps_demo() -> dict:
    """ε leaves the cosine alone but moves the distance: a worked example on three rows."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, generator=gen, dtype=torch.float64) * 0.02
    x = x + torch.tensor([[0.0], [0.01], [0.02]], dtype=torch.float64)
    s_mean, s_std = x.mean(-1), (x - x.mean(-1, keepdim=True)).square().mean(-1).sqrt()
    out = []
    for eps in (0.0, 1e-5, 1e-3):
        p = predicted_divergence(s_mean, s_std, eps)
        cos, sq = measured_divergence(x, eps)
        out.append(
            {
                "eps": eps,
                "mu_over_sigma": (s_mean.abs() / s_std).tolist(),
                "cos_measured": cos.tolist(),
                "cos_predicted": p.predicted_cosine.tolist(),
                "sq_dist_measured": sq.tolist(),
                "sq_dist_eps_free": p.predicted_sq_dist.tolist(),
                "sq_dist_eps_aware": p.predicted_sq_dist_eps.tolist(),
            }
        )
    return {"rows": 3, "d": 256, "sigma": 0.02, "shifts": [0.0, 0.01, 0.02], "cases": out}
