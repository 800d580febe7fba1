"""Per-channel outliers of rows (tokens × channels): how far the largest element stands above the
row's RMS, the rows' excess kurtosis, the share of Σx² that the top channels carry and which
channels those are; and the blind spot of |μ|/σ that :func:`blind_spot` demonstrates.

The blind spot, derived: a row dominated by one channel of amplitude A (x ≈ A·e_i) has μ = A/d and
σ = A·√(d − 1)/d, so |μ|/σ → 1/√(d − 1), 0.063 at d = 256, inside the i.i.d. band: the metric cannot
see a massive activation. m channels of the same sign and amplitude give μ = mA/d and
σ = A·√(m(d − m))/d, so |μ|/σ → √(m/(d − m)): only a group of same-sign channels raises it.
"""

from __future__ import annotations

import math

import torch

from .rows import median, row_stats

__all__ = [
    "MASSIVE_SHARE_FACTOR",
    "channel_outliers",
    "iid_max_over_rms",
    "blind_spot",
    "OutlierAccumulator",
]

# A channel "dominates" when it carries this many times its i.i.d. share 1/d of Σx² (at d = 128:
# 7.8% instead of 0.8%); the massive activations of large trained models carry far more.
MASSIVE_SHARE_FACTOR = 10.0


def iid_max_over_rms(d: int) -> float:
    """Median of max_i |x_i| / RMS for a row of ``d`` i.i.d. standard Gaussian entries, with RMS
    taken as 1 (its value for large d): the x with P(max |x_i| ≤ x) = ½, i.e.
    Φ⁻¹((1 + 2^(−1/d))/2)."""
    from statistics import NormalDist

    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be a positive integer, got {d!r}")
    return NormalDist().inv_cdf((1 + 0.5 ** (1 / d)) / 2)


def _rows(x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise TypeError("x must be a floating-point tensor of rows (..., channels)")
    return x.detach().to(torch.float64).reshape(-1, x.shape[-1])


class OutlierAccumulator:
    """Collects rows over several calls (a hook's) and summarises them as
    :func:`channel_outliers` does, keeping per-channel energy sums and per-row statistics only."""

    def __init__(self, top: int = 3, max_rows: int | None = None) -> None:
        self.top = top
        self.max_rows = max_rows
        self.energy: torch.Tensor | None = None  # Σ_t x_t,i² per channel
        self.max_over_rms: list[torch.Tensor] = []
        self.kurtosis: list[torch.Tensor] = []
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        rows = _rows(x)
        energy = rows.square().sum(dim=0)
        self.energy = energy if self.energy is None else self.energy + energy
        self.rows += rows.shape[0]
        have = sum(t.numel() for t in self.max_over_rms)
        if self.max_rows is not None:
            rows = rows[: max(0, self.max_rows - have)]
        if rows.shape[0] == 0:
            return
        s = row_stats(rows)
        rms = s.rms.clamp_min(1e-300)
        self.max_over_rms.append(rows.abs().max(dim=1).values / rms)
        centered = rows - s.mean[:, None]
        var = centered.square().mean(dim=1)
        kurt = centered.pow(4).mean(dim=1) / var.square() - 3.0
        self.kurtosis.append(torch.where(var > 0, kurt, torch.full_like(kurt, math.nan)))

    def summary(self) -> dict:
        if self.energy is None:
            return {}
        d = int(self.energy.numel())
        total = float(self.energy.sum())
        order = torch.argsort(self.energy, descending=True)
        share = self.energy / total if total > 0 else torch.zeros_like(self.energy)
        k = max(1, math.ceil(0.01 * d))  # the top 1% of channels
        mor = torch.cat(self.max_over_rms)
        kurt = torch.cat(self.kurtosis)
        kurt = kurt[torch.isfinite(kurt)]
        return {
            "d": d,
            "rows": self.rows,
            "max_over_rms_median": median(mor),
            "max_over_rms_max": float(mor.max()),
            "iid_max_over_rms_median": iid_max_over_rms(d),
            "excess_kurtosis_median": median(kurt),
            "top1_share": float(share[order[0]]),
            "top_k": k,
            "top_k_share": float(share[order[:k]].sum()),
            "iid_top_k_share": k / d,
            "dominant_channels": [
                {"channel": int(i), "share": float(share[i])} for i in order[: self.top]
            ],
        }


def channel_outliers(x: torch.Tensor, top: int = 3) -> dict:
    """Rows ``x`` (..., d), float64 internally. Returns: the median and the largest over rows of
    max_i |x_i| / RMS (and its i.i.d. Gaussian median :func:`iid_max_over_rms`), the median excess
    kurtosis of the rows' entries (0 for Gaussian rows), the share of Σx² over all rows carried by
    the top channel and by the top 1% of channels (``top_k`` of them; i.i.d. share k/d), and the
    ``top`` dominant channels with their shares."""
    acc = OutlierAccumulator(top)
    acc.add(x)
    return acc.summary()


def blind_spot(
    d: int = 256,
    counts: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32),
    amplitude: float = 100.0,
    rows: int = 1024,
    seed: int = 0,
) -> list[dict]:
    """Rows of ``d`` i.i.d. N(0, 1) entries with ``m`` channels (for each m in ``counts``) set to
    +``amplitude`` (same sign), and for even m ≥ 2 also a mixed-sign case (half +A, half −A).
    Per case: the median |μ|/σ measured and its large-A limit √(m/(d − m)) (0 for mixed signs),
    the mean predicted cosine, and the outlier statistics that do see the channels."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, d, generator=gen, dtype=torch.float64)
    out = []
    for m in counts:
        if not 0 <= m < d:
            raise ValueError(f"counts must lie in [0, d), got {m}")
        signs = [("same", 1.0)] + ([("mixed", -1.0)] if m >= 2 and m % 2 == 0 else [])
        for name, second in signs:
            x = base.clone()
            if m:
                vals = torch.full((m,), amplitude, dtype=torch.float64)
                if second < 0:
                    vals[m // 2 :] = -amplitude
                x[:, :m] = vals
            s = row_stats(x)
            o = channel_outliers(x)
            limit = math.sqrt(m / (d - m)) if name == "same" else 0.0
            out.append(
                {
                    "m": m,
                    "signs": name if m else "none",
                    "amplitude": amplitude if m else 0.0,
                    "median_mu_over_sigma": median(s.ratio),
                    "limit_mu_over_sigma": limit,
                    "mean_cosine": float(s.cosine.mean()),
                    "max_over_rms_median": o["max_over_rms_median"],
                    "top_m_share": float(
                        x.square().sum(0).sort(descending=True).values[: max(m, 1)].sum()
                        / x.square().sum()
                    ),
                }
            )
    return out
