"""Per-row statistics (μ, σ, RMS), the identity RMS² = σ² + μ², and how far LayerNorm and RMSNorm
outputs of the same rows diverge: predicted from (μ, σ) alone and measured from the two outputs.

The relation (docs/conventions.md, "The two norms and how far apart they are"): with γ = 1,
β = 0, write u = LN₀(x) = (x − μ)/σ and v = RMS₀(x) = x/RMS, the ε-free outputs. Both have mean
square 1 and u·v/d = σ/RMS, so cos(u, v) = σ/RMS = 1/sqrt(1 + (μ/σ)²) and ‖u − v‖²/d = 2 − 2σ/RMS.

With ε > 0 each output is its ε-free value times one positive scalar per row,
    LN_ε(x) = a·u,  a = σ/sqrt(σ² + ε);
    RMS_ε(x) = b·v, b = RMS/sqrt(RMS² + ε)  (eps_mode "mean_square")  or  RMS/(RMS + ε)  ("rms"),
so the cosine is unchanged and the exact distance is ‖a·u − b·v‖²/d = a² + b² − 2ab·σ/RMS
(:func:`predicted_divergence` returns both the ε-free and this ε-aware distance).

Degenerate rows, handled the same way in the predicted and the measured numbers:
- σ = 0 < RMS (a constant row): LN_ε is the zero vector (ε > 0), so the cosine is taken as 0
  (the limit of σ/RMS); the ε-aware distance is b². With ε = 0, LN is 0/0: the measured numbers
  are NaN, as the outputs are, and the predicted ones are the σ → 0⁺ limits (cos 0, distance 2).
- all-zero rows (RMS = 0): with ε > 0 both outputs are exactly zero, so the cosine is taken as 1
  (identical outputs) and the distance is 0; with ε = 0 both outputs are NaN and so is the distance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ... import functional
from ...reference import check_eps_mode
from ...reference import row_stats as _row_stats

__all__ = [
    "RowStats",
    "Divergence",
    "row_stats",
    "identity_check",
    "predicted_cosine",
    "predicted_divergence",
    "measured_divergence",
    "divergence",
    "summarize",
    "median",
]

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


@dataclass
class RowStats:
    """Per-row mean, population standard deviation and RMS, float64, each of shape (rows,)."""

    mean: torch.Tensor
    std: torch.Tensor
    rms: torch.Tensor

    @property
    def ratio(self) -> torch.Tensor:
        """|μ|/σ per row (inf where σ = 0 < |μ|, NaN for all-zero rows)."""
        return self.mean.abs() / self.std

    @property
    def mean_energy_share(self) -> torch.Tensor:
        """μ²/RMS², the share of the row's energy held by its mean (= 1 − cos²); 0 for zero rows."""
        share = self.mean.square() / self.rms.square()
        return torch.where(self.rms > 0, share, torch.zeros_like(share))

    @property
    def cosine(self) -> torch.Tensor:
        """Predicted cos(LayerNorm(x), RMSNorm(x)) = σ/RMS (see :func:`predicted_cosine`)."""
        return predicted_cosine(self.mean, self.std)


def _validated_rows(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last dimension, got shape {list(x.shape)}")
    return x.reshape(-1, x.shape[-1])


def row_stats(x: torch.Tensor) -> RowStats:
    """μ, σ (two-pass, never from the identity) and RMS of every row of ``x`` over its last dim,
    in float64; leading dims are flattened, so the result has one entry per row (token)."""
    mean, std, rms = _row_stats(_validated_rows(x))
    return RowStats(mean, std, rms)


def identity_check(x: torch.Tensor | RowStats) -> dict:
    """How exactly RMS² = σ² + μ² holds on the rows of ``x`` (each side computed independently in
    float64): the largest absolute error and the largest error relative to RMS² (rows with RMS = 0
    are exact and skipped in the relative error)."""
    s = x if isinstance(x, RowStats) else row_stats(x)
    lhs = s.rms.square()
    err = (lhs - (s.std.square() + s.mean.square())).abs()
    nonzero = lhs > 0
    rel = err[nonzero] / lhs[nonzero]
    return {
        "rows": int(lhs.numel()),
        "max_abs_error": float(err.max()) if err.numel() else 0.0,
        "max_rel_error": float(rel.max()) if rel.numel() else 0.0,
    }


def predicted_cosine(mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """cos(LN(x), RMSNorm(x)) = σ/RMS = 1/sqrt(1 + (μ/σ)²), for any ε; 0 where σ = 0 < |μ| and 1
    for all-zero rows (see the module docstring)."""
    mean = mean.to(torch.float64)
    std = std.to(torch.float64)
    rms = torch.sqrt(std.square() + mean.square())
    cos = std / rms
    cos = torch.where(rms > 0, cos, torch.ones_like(cos))
    return cos


def _scales(
    std: torch.Tensor, rms: torch.Tensor, eps: float, eps_mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b: LN_ε = a·LN₀ and RMS_ε = b·RMS₀ per row. With ε = 0 both are 1 (also in the σ → 0⁺
    limit, where LN₀ keeps unit mean square)."""
    if eps == 0.0:
        return torch.ones_like(std), torch.ones_like(rms)
    a = std / torch.sqrt(std.square() + eps)
    if eps_mode == "mean_square":
        b = rms / torch.sqrt(rms.square() + eps)
    else:
        b = rms / (rms + eps)
    return a, b


def _check_eps(eps: float, eps_mode: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    check_eps_mode(eps_mode)
    return float(eps)


@dataclass
class Divergence:
    """Per-row LayerNorm-vs-RMSNorm divergence (γ = 1, β = 0, same ε), float64, shape (rows,).

    ``predicted_*`` come from (μ, σ) alone; ``measured_*`` from the two actual outputs (NaN when
    only predictions were asked for). ``predicted_sq_dist`` is the ε-free 2 − 2σ/RMS;
    ``predicted_sq_dist_eps`` the exact a² + b² − 2ab·σ/RMS for the ε used. Distances are
    ‖LN(x) − RMSNorm(x)‖²/d."""

    predicted_cosine: torch.Tensor
    predicted_sq_dist: torch.Tensor
    predicted_sq_dist_eps: torch.Tensor
    measured_cosine: torch.Tensor
    measured_sq_dist: torch.Tensor
    eps: float
    eps_mode: str

    def max_errors(self) -> dict:
        """Largest |predicted − measured| over rows where both are finite."""

        def worst(p: torch.Tensor, m: torch.Tensor) -> float:
            ok = torch.isfinite(p) & torch.isfinite(m)
            return float((p[ok] - m[ok]).abs().max()) if ok.any() else float("nan")

        return {
            "cosine": worst(self.predicted_cosine, self.measured_cosine),
            "sq_dist_eps": worst(self.predicted_sq_dist_eps, self.measured_sq_dist),
        }


def predicted_divergence(
    mean: torch.Tensor, std: torch.Tensor, eps: float = 0.0, eps_mode: str = "mean_square"
) -> Divergence:
    """The divergence predicted from per-row μ and σ (formulas in the module docstring); the
    measured fields are NaN."""
    eps = _check_eps(eps, eps_mode)
    mean = mean.to(torch.float64)
    std = std.to(torch.float64)
    rms = torch.sqrt(std.square() + mean.square())
    cos = predicted_cosine(mean, std)
    a, b = _scales(std, rms, eps, eps_mode)
    sq = 2.0 - 2.0 * cos
    sq_eps = a.square() + b.square() - 2.0 * a * b * cos
    if eps == 0.0:
        # all-zero rows: both outputs are 0/0 (NaN) without ε
        nan = torch.full_like(sq, math.nan)
        sq = torch.where(rms > 0, sq, nan)
        sq_eps = torch.where(rms > 0, sq_eps, nan)
    nan = torch.full_like(cos, math.nan)
    return Divergence(cos, sq, sq_eps, nan, nan.clone(), eps, eps_mode)


def _cosine_rows(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine with the degenerate conventions: both zero → 1, one zero → 0."""
    nu = u.norm(dim=-1)
    nv = v.norm(dim=-1)
    dot = (u * v).sum(dim=-1)
    cos = dot / (nu * nv)
    both_zero = (nu == 0) & (nv == 0)
    one_zero = (nu == 0) ^ (nv == 0)
    cos = torch.where(one_zero, torch.zeros_like(cos), cos)
    return torch.where(both_zero, torch.ones_like(cos), cos)


def measured_divergence(
    x: torch.Tensor, eps: float = 0.0, eps_mode: str = "mean_square"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cosine, ‖LN(x) − RMSNorm(x)‖²/d) per row from the two outputs of this library's
    ``layer_norm`` and ``rms_norm`` (γ = 1, β = 0, the same ε), computed in ``x``'s dtype; pass
    float64 rows for a comparison with the predictions at 1e-6 or better."""
    eps = _check_eps(eps, eps_mode)
    rows = _validated_rows(x)
    d = rows.shape[-1]
    ln = functional.layer_norm(rows, (d,), eps=eps).to(torch.float64)
    rms = functional.rms_norm(rows, (d,), eps=eps, eps_mode=eps_mode).to(torch.float64)
    return _cosine_rows(ln, rms), (ln - rms).square().mean(dim=-1)


def divergence(x: torch.Tensor, eps: float = 0.0, eps_mode: str = "mean_square") -> Divergence:
    """Predicted and measured LayerNorm-vs-RMSNorm divergence of every row of ``x``."""
    s = row_stats(x)
    out = predicted_divergence(s.mean, s.std, eps, eps_mode)
    out.measured_cosine, out.measured_sq_dist = measured_divergence(x, eps, eps_mode)
    return out


def summarize(values: torch.Tensor, quantiles: tuple[float, ...] = QUANTILES) -> dict:
    """Mean, min, max and quantiles of the finite entries of ``values`` (JSON-ready floats);
    ``count`` is the number of finite entries, ``nonfinite`` the rest."""
    v = values.detach().to(torch.float64).flatten()
    finite = v[torch.isfinite(v)]
    out: dict = {"count": int(finite.numel()), "nonfinite": int(v.numel() - finite.numel())}
    if finite.numel() == 0:
        out.update({"mean": math.nan, "min": math.nan, "max": math.nan})
        out.update({f"q{round(q * 100):02d}": math.nan for q in quantiles})
        return out
    out.update(
        {"mean": float(finite.mean()), "min": float(finite.min()), "max": float(finite.max())}
    )
    qs = torch.quantile(finite, torch.tensor(quantiles, dtype=torch.float64))
    out.update({f"q{round(q * 100):02d}": float(val) for q, val in zip(quantiles, qs, strict=True)})
    return out


def median(values) -> float:
    """The lab's one median: of the finite entries of ``values`` (a tensor, an array, or any
    iterable of numbers; None entries skipped) as numpy and scipy define it, the mean of the two
    middle values for an even count (torch's ``median`` takes the lower one, and the middle index
    of a sorted list the upper one); NaN when none is finite."""
    if isinstance(values, torch.Tensor):
        v = values.detach().to(torch.float64).flatten()
    else:
        try:
            v = torch.as_tensor(values, dtype=torch.float64).flatten()
        except (TypeError, ValueError, RuntimeError):
            kept = [float(x) for x in values if x is not None]
            v = torch.tensor(kept, dtype=torch.float64)
    v = v[torch.isfinite(v)]
    if v.numel() == 0:
        return math.nan
    k = (v.numel() - 1) // 2
    low = torch.kthvalue(v, k + 1).values
    if v.numel() % 2:
        return float(low)
    return float((low + torch.kthvalue(v, k + 2).values) / 2)


def spread(values) -> dict:
    """{min, median, max} of the finite entries of ``values`` (None entries skipped; NaN for each
    when none is finite): the spread over seeds that ``report.json`` gives a measurement."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"min": math.nan, "median": math.nan, "max": math.nan}
    return {"min": min(vals), "median": median(vals), "max": max(vals)}
