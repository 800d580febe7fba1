"""Statistics of what one norm site normalizes, rows x of width w (one per token, or per head and
token for a QK-norm), with their uncertainty from a bootstrap over sequences (the tokens of one
sequence are not independent draws; each resample draws whole sequences with replacement).

Per row: μ, σ (population), RMS = √(μ² + σ²); |μ|/σ (set against the i.i.d. Gaussian reference at
width w, :mod:`~rmsnorm.lab.stats.iid`); 1 − σ/RMS (1 − the cosine of LayerNorm and RMSNorm
outputs); the angle between x and the uniform vector 𝟙, arccos(μ/RMS) in degrees (90° is orthogonal:
the measure of Gupta et al. 2024); the excess kurtosis over the row's channels; and the shift the
centering applies against the ordinary channels' scale, |μ| / σ_ord, μ over all channels and σ_ord
over the channels left after removing the outlier channels. Per site: the token-shared part of μ²,
(mean over tokens of μ)² / mean of μ² (per row position within a token, pooled).

Each is given four ways: over all tokens and without the first token of each sequence, each with
all channels and with the massive channels removed. Two channel rules, per site over all its rows:

- **massive** (the rule the ordinary channels and the interventions rest on): channel c is massive
  when its median |x_c| over the tokens after the first is at least 30 × the median |x| of every
  entry at the site: large on the typical token, not on one. For Gaussian entries a channel's median
  is the site's, so the factor is never reached by chance; in SmolLM2 it names 0–2 channels a site
  (507 and 247), in Gemma 3's pre-norms 0–11 (163, 400 and 87 most often). At 10 × it would name
  up to 45 of Gemma 3's 640 channels at one site, which is why the factor is 30;
- **spike** (:func:`outlier_channels`, listed, not removed): max |x_c| ≥ 20 × the site's median |x|
  on any token (20 median |x| is 13.5σ for Gaussian entries). It also flags channels that are large
  on the first token only: up to 393 of SmolLM2's 576 at one site, which is why it is not the rule
  σ over the ordinary channels uses. Each spike channel is listed with its largest |x|, the token
  positions where it is largest and the share of tokens past the threshold (``persistence``).

The shift statistic's sensitivity to the rule (:data:`SHIFT_RULES`: massive, the same at 10 ×,
spike, the top 1 and the top 4 channels by median |x|) is reported per site.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .iid import iid_reference
from .rows import median

__all__ = [
    "OUTLIER_FACTOR",
    "MASSIVE_FACTOR",
    "SHIFT_RULES",
    "VARIANTS",
    "outlier_channels",
    "massive_channels",
    "channel_medians",
    "row_quantities",
    "site_statistics",
]

OUTLIER_FACTOR = 20.0
MASSIVE_FACTOR = 30.0
VARIANTS = ("all", "no_first", "no_massive")
# The rules the shift statistic is given under: the massive channels (the default), the same at
# a factor of 10, the spike channels, and the top 1 and top 4 channels by median |x| over the
# tokens after the first.
SHIFT_RULES = ("massive", "massive10", "spike", "top1", "top4")
_BOOTSTRAP = 100
_CONFIDENCE = 0.95


def outlier_channels(
    x: torch.Tensor, top_positions: int = 3, *, site_median: float | None = None
) -> tuple[list[dict], float]:
    """The spike channels of ``x`` (sequences, tokens, rows, width) by the module's rule, and the
    threshold (20 × the median |x|). Each: channel, largest |x| and its sign, the token positions
    of its ``top_positions`` largest |x| (position within the sequence), persistence.
    ``site_median``: the median |x|, when already computed."""
    a = x.abs().to(torch.float64)
    threshold = OUTLIER_FACTOR * (median(a) if site_median is None else site_median)
    per_channel = a.amax(dim=(0, 1, 2))
    out = []
    for c in torch.nonzero(per_channel >= threshold).flatten().tolist():
        col = a[..., c]  # (S, T, R)
        by_position = col.amax(dim=(0, 2))  # (T,)
        top = torch.topk(by_position, min(top_positions, by_position.numel())).indices.tolist()
        where = col.argmax()
        value = float(x[..., c].reshape(-1)[where])
        out.append(
            {
                "channel": c,
                "max_abs": float(per_channel[c]),
                "sign": 1 if value >= 0 else -1,
                "top_positions": top,
                "persistence": float((col >= threshold).any(dim=2).to(torch.float64).mean()),
            }
        )
    out.sort(key=lambda o: -o["max_abs"])
    return out, threshold


def channel_medians(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per channel of ``x`` (sequences, tokens, rows, width): the median |x_c| over the tokens
    after the first (float64, (width,)), and the site's median |x| over every entry."""
    a = x.abs().to(torch.float64)
    rest = a[:, 1:].reshape(-1, a.shape[-1]).numpy()
    return torch.from_numpy(np.median(rest, axis=0)), median(a)


def massive_channels(x: torch.Tensor, medians=None) -> list[dict]:
    """The massive channels of ``x`` (sequences, tokens, rows, width) by the module's rule, largest
    first: channel, ``median_ratio`` (its median |x| over the tokens after the first ÷ the site's
    median |x|), its largest |x| on the first token and on the others, and the sign of its median
    value. ``medians``: :func:`channel_medians` of ``x``, when already computed."""
    per_channel, site = channel_medians(x) if medians is None else medians
    if not site > 0:
        return []
    ratio = per_channel / site
    first = x[:, 0].abs().amax(dim=(0, 1)).to(torch.float64)
    rest = x[:, 1:].abs().amax(dim=(0, 1, 2)).to(torch.float64)
    signs = np.sign(np.median(x[:, 1:].reshape(-1, x.shape[-1]).to(torch.float64).numpy(), 0))
    out = [
        {
            "channel": c,
            "median_ratio": float(ratio[c]),
            "max_abs_first": float(first[c]),
            "max_abs_others": float(rest[c]),
            "sign": 1 if signs[c] >= 0 else -1,
        }
        for c in torch.nonzero(ratio >= MASSIVE_FACTOR).flatten().tolist()
    ]
    out.sort(key=lambda o: -o["median_ratio"])
    return out


def _rule_channels(
    medians: tuple[torch.Tensor, float], rule: str, massive: list, spikes: list
) -> list:
    """The channels a rule of :data:`SHIFT_RULES` removes from the ordinary set, given
    :func:`channel_medians`."""
    per_channel, site = medians
    if rule == "massive":
        return [o["channel"] for o in massive]
    if rule == "massive10":
        return torch.nonzero(per_channel >= 10.0 * site).flatten().tolist() if site > 0 else []
    if rule == "spike":
        return [o["channel"] for o in spikes]
    k = int(rule[3:])
    return torch.topk(per_channel, min(k, per_channel.numel())).indices.tolist()


def _keep(width: int, removed: list[int]) -> torch.Tensor:
    keep = torch.ones(width, dtype=torch.bool)
    keep[removed] = False
    if not keep.any():
        keep[:] = True  # every channel removed: nothing is ordinary, keep them all
    return keep


def row_quantities(x: torch.Tensor, keep: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-row quantities of ``x`` (..., width), float64, each shaped like ``x`` without its last
    dim: mu, sigma, rms, ratio, one_minus_cos, angle, kurtosis (over the ``keep`` channels, all
    when None) and shift (|μ over all channels| / σ over ``keep``)."""
    x = x.to(torch.float64)
    mu_all = x.mean(-1)
    xs = x if keep is None else x[..., keep]
    mu = xs.mean(-1)
    dev = xs - mu[..., None]
    var = dev.square().mean(-1)
    sigma = var.sqrt()
    rms = (mu.square() + var).sqrt()
    kurt = dev.pow(4).mean(-1) / var.square() - 3.0
    return {
        "mu": mu,
        "sigma": sigma,
        "rms": rms,
        "ratio": mu.abs() / sigma,
        "one_minus_cos": 1.0 - sigma / rms,
        "angle": torch.rad2deg(torch.arccos((mu / rms).clamp(-1.0, 1.0))),
        "kurtosis": kurt,
        "shift": mu_all.abs() / sigma,
    }


def _shift(x: torch.Tensor, mu_all: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """|μ over all channels| / σ over the ``keep`` channels, per row of float64 ``x``."""
    return mu_all.abs() / x[..., keep].std(-1, correction=0)


def _shared_share(mu: torch.Tensor) -> torch.Tensor:
    """(mean over tokens of μ)² / mean μ², pooled over row positions; ``mu`` (..., S, T', R)."""
    mean = mu.mean(dim=(-3, -2))
    return mean.square().sum(-1) / mu.square().mean(dim=(-3, -2)).sum(-1)


# name -> (quantity, reduction); reductions act on the last dim of (B, N) samples
_STATS = {
    "ratio_median": ("ratio", 0.5),
    "ratio_p95": ("ratio", 0.95),
    "ratio_max": ("ratio", 1.0),
    "one_minus_cos_mean": ("one_minus_cos", "mean"),
    "angle_median": ("angle", 0.5),
    "kurtosis_median": ("kurtosis", 0.5),
    "shift_median": ("shift", 0.5),
    "mu_abs_mean": ("mu", "absmean"),
    "sigma_mean": ("sigma", "mean"),
    "rms_mean": ("rms", "mean"),
}


def _quantiles(v: np.ndarray, qs: list[float]) -> dict[float, np.ndarray]:
    """Quantiles of ``v`` (B, N) along N with linear interpolation (numpy's default), from one
    partial sort at every order statistic needed (5× faster than a full sort at N = 8192)."""
    if not qs:
        return {}
    n = v.shape[-1]
    need = sorted({k for q in qs for k in (math.floor(q * (n - 1)), math.ceil(q * (n - 1)))})
    part = np.partition(v, need, axis=-1)
    out = {}
    for q in qs:
        pos = q * (n - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        out[q] = part[..., lo] * (1 - (pos - lo)) + part[..., hi] * (pos - lo)
    return out


def _reduce(v: np.ndarray, how) -> dict:
    if how == "mean":
        return v.mean(-1)
    return np.abs(v).mean(-1)


def _interval(boot: np.ndarray) -> dict:
    alpha = (1 - _CONFIDENCE) / 2
    lo, hi = np.quantile(np.asarray(boot, dtype=np.float64), [alpha, 1 - alpha])
    return {"lo": float(lo), "hi": float(hi)}


def _variant(q: dict[str, torch.Tensor], draws: torch.Tensor | None) -> dict:
    """Point values (float64) and bootstrap intervals of :data:`_STATS` and the shared share, from
    per-row quantities (S, T', R) and resampled sequence indices (B, S); without ``draws``, the
    point values alone (lo and hi None). The resamples are reduced in float32 (the intervals' own
    spread is far wider than its rounding)."""
    out = {}
    keys = dict.fromkeys(key for key, _ in _STATS.values())
    if draws is None:
        for name, (key, how) in _STATS.items():
            full = q[key].reshape(1, -1).numpy()
            point = (
                _reduce(full, how)[0] if isinstance(how, str) else _quantiles(full, [how])[how][0]
            )
            out[name] = {"value": float(point), "lo": None, "hi": None}
        share = float(_shared_share(q["mu"]))
        out["shared_mu_share"] = {"value": share, "lo": None, "hi": None}
        return out
    for key in keys:
        v = q[key]
        full = v.reshape(1, -1).numpy()
        boot = v[draws].reshape(draws.shape[0], -1).float().numpy()
        wanted = {name: how for name, (k, how) in _STATS.items() if k == key}
        qs = [how for how in wanted.values() if not isinstance(how, str)]
        point_q, boot_q = _quantiles(full, qs), _quantiles(boot, qs)
        for name, how in wanted.items():
            if isinstance(how, str):
                point, samples = _reduce(full, how)[0], _reduce(boot, how)
            else:
                point, samples = point_q[how][0], boot_q[how]
            out[name] = {"value": float(point), **_interval(samples)}
    boot = _shared_share(q["mu"][draws]).numpy()
    out["shared_mu_share"] = {"value": float(_shared_share(q["mu"])), **_interval(boot)}
    return out


def site_statistics(x: torch.Tensor, *, seed: int = 0, bootstrap: int = _BOOTSTRAP) -> dict:
    """Everything the module docstring lists for one site's rows ``x`` (sequences, tokens, rows
    per token, width): the outlier channels, and per variant (:data:`VARIANTS`) each statistic as
    ``{"value", "lo", "hi"}`` (a 95% bootstrap interval over ``bootstrap`` resamples of whole
    sequences, seeded; 0: the values alone, lo and hi None), with the i.i.d. |μ|/σ reference at
    the site's width."""
    if x.dim() != 4 or x.shape[0] < 2 or x.shape[1] < 2:
        raise ValueError(
            f"x must be (sequences >= 2, tokens >= 2, rows, width), got {tuple(x.shape)}"
        )
    s, t, r, w = x.shape
    medians = channel_medians(x)
    outliers, threshold = outlier_channels(x, site_median=medians[1])
    massive = massive_channels(x, medians)
    keep = _keep(w, [o["channel"] for o in massive])
    draws = None
    if bootstrap:
        gen = torch.Generator().manual_seed(seed)
        draws = torch.randint(0, s, (bootstrap, s), generator=gen)
    ordinary = row_quantities(x, keep)
    all_channels = row_quantities(x) | {"shift": ordinary["shift"]}  # σ_ord in both
    variants = {}
    for name in VARIANTS:
        q = ordinary if "massive" in name else all_channels
        if name.startswith("no_first"):
            q = {k: v[:, 1:] for k, v in q.items()}
        variants[name] = _variant(q, draws)
    ref = iid_reference(w)
    a = x.abs()
    by_position = a.amax(dim=(0, 2, 3))
    shift_by_rule = {}
    x64 = x.to(torch.float64)
    mu_all = x64.mean(-1)
    for rule in SHIFT_RULES:
        removed = _rule_channels(medians, rule, massive, outliers)
        shift = _shift(x64, mu_all, _keep(w, removed))
        shift_by_rule[rule] = {"channels": len(removed), "shift_median": median(shift)}
    return {
        "sequences": s,
        "tokens": t,
        "rows_per_token": r,
        "width": w,
        "width_ordinary": int(keep.sum()),
        "iid": {"median": ref.median, "q95": ref.q95},
        "outlier_threshold": threshold,
        "outliers": outliers,
        "massive": massive,
        "massive_threshold": MASSIVE_FACTOR * medians[1],
        "shift_by_rule": shift_by_rule,
        "max_abs": float(a.max()),
        "max_abs_first_token": float(by_position[0]),
        "max_abs_other_tokens": float(by_position[1:].max()),
        "variants": variants,
    }
