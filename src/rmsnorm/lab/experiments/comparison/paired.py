"""Paired statistics of a training comparison: per-seed differences of a variant against the
baseline (same initialization, same data), their mean with a t confidence interval, a Wilcoxon
signed-rank and an exact sign test, and what the design can detect (the minimal detectable effect
at a given power, and the seeds a given difference would need). scipy does the distributions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

CONFIDENCE = 0.95
POWER = 0.80
ALPHA = 1 - CONFIDENCE
MAX_SEEDS = 100_000  # seeds_needed gives up beyond this


@dataclass
class Paired:
    """The paired comparison of one variant with the baseline over n seeds (loss differences,
    variant − baseline: positive means the variant is worse).

    ``diffs`` holds one difference per seed: +inf where only the variant diverged, −inf where only
    the baseline did, NaN where both did. The t statistics (``mean``, ``ci``, ``t_p``, ``mde``) need
    every difference finite and n ≥ 2; the rank tests (``wilcoxon_p``, ``sign_p``) count a
    divergence as the worst outcome and drop pairs where both diverged."""

    n: int
    diffs: list[float]
    mean: float | None
    sd: float | None
    ci_low: float | None
    ci_high: float | None
    t: float | None
    t_p: float | None
    wilcoxon_p: float | None
    sign_p: float | None
    worse: int  # seeds where the variant's loss is higher
    better: int
    ties: int  # equal losses, or both diverged
    mde: float | None  # smallest |Δ| the paired t test detects with POWER at ALPHA
    confidence: float = CONFIDENCE

    @property
    def detected(self) -> bool | None:
        """True when the confidence interval excludes 0 (None when there is no interval)."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return self.ci_low > 0 or self.ci_high < 0

    @property
    def bound(self) -> float | None:
        """The largest |Δ| the interval allows: "within ``bound`` of the baseline"."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return max(abs(self.ci_low), abs(self.ci_high))

    def to_dict(self) -> dict:
        return asdict(self) | {"detected": self.detected, "bound": self.bound}


def differences(variant: Sequence[float | None], baseline: Sequence[float | None]) -> list[float]:
    """Per-seed ``variant − baseline``; None or a non-finite value is a diverged run (see
    :class:`Paired`)."""
    if len(variant) != len(baseline):
        raise ValueError(f"unpaired: {len(variant)} variant values, {len(baseline)} baseline")
    out = []
    for a, b in zip(variant, baseline, strict=True):
        a_ok = a is not None and math.isfinite(a)
        b_ok = b is not None and math.isfinite(b)
        if a_ok and b_ok:
            out.append(a - b)
        elif a_ok:
            out.append(-math.inf)
        elif b_ok:
            out.append(math.inf)
        else:
            out.append(math.nan)
    return out


def power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t test at level ``alpha`` with ``n`` pairs whose differences
    have standard deviation ``sd``, when the true mean difference is ``effect`` (noncentral t)."""
    from scipy import stats

    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if effect != 0 else alpha
    df = n - 1
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = abs(effect) * math.sqrt(n) / sd
    upper = float(stats.nct.sf(crit, df, nc))
    lower = float(stats.nct.cdf(-crit, df, nc))  # the wrong-sign tail: NaN where it underflows
    return min(1.0, upper + (lower if math.isfinite(lower) else 0.0))


def minimal_detectable_effect(
    sd: float, n: int, target: float = POWER, alpha: float = ALPHA
) -> float | None:
    """The smallest true |mean difference| that the paired t test with ``n`` pairs of spread
    ``sd`` detects with probability ``target`` (None for n < 2)."""
    from scipy import optimize

    if n < 2:
        return None
    if sd <= 0:
        return 0.0
    hi = sd
    while power(hi, sd, n, alpha) < target:
        hi *= 2
    return float(optimize.brentq(lambda e: power(e, sd, n, alpha) - target, 0.0, hi, xtol=1e-12))


def seeds_needed(
    effect: float, sd: float, target: float = POWER, alpha: float = ALPHA
) -> int | None:
    """How many paired seeds the paired t test needs to detect a true difference ``effect`` with
    probability ``target``, when the differences spread by ``sd``; None beyond
    :data:`MAX_SEEDS` or for a zero effect."""
    if effect == 0 or not math.isfinite(effect):
        return None
    if sd <= 0:
        return 2
    if power(effect, sd, MAX_SEEDS, alpha) < target:
        return None
    lo, hi = 2, 2
    while power(effect, sd, hi, alpha) < target:
        lo, hi = hi, hi * 2
    while lo < hi:  # power grows with n: the smallest n reaching the target
        mid = (lo + hi) // 2
        if power(effect, sd, mid, alpha) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def paired(
    variant: Sequence[float | None],
    baseline: Sequence[float | None],
    confidence: float = CONFIDENCE,
) -> Paired:
    """The paired comparison of per-seed ``variant`` and ``baseline`` losses (same order)."""
    from scipy import stats

    diffs = differences(variant, baseline)
    n = len(diffs)
    worse = sum(d > 0 for d in diffs)
    better = sum(d < 0 for d in diffs)
    ties = n - worse - better  # zeros and NaNs
    mean = sd = lo = hi = t = t_p = mde = None
    if n >= 2 and all(math.isfinite(d) for d in diffs):
        mean = math.fsum(diffs) / n
        sd = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
        lo, hi = float(mean - half), float(mean + half)
        if sd > 0:
            t = mean / (sd / math.sqrt(n))
            t_p = float(2 * stats.t.sf(abs(t), n - 1))
        mde = minimal_detectable_effect(sd, n, alpha=1 - confidence)
    ranked = [d for d in diffs if not math.isnan(d) and d != 0]
    wilcoxon_p = None
    if ranked:
        # A divergence ranks above every finite difference: only the ranks enter the test.
        top = 2 * max((abs(d) for d in ranked if math.isfinite(d)), default=1.0) + 1
        finite = [d if math.isfinite(d) else math.copysign(top, d) for d in ranked]
        wilcoxon_p = float(stats.wilcoxon(finite, zero_method="wilcox").pvalue)
    sign_p = float(stats.binomtest(worse, worse + better, 0.5).pvalue) if worse + better else None
    return Paired(
        n=n,
        diffs=diffs,
        mean=mean,
        sd=sd,
        ci_low=lo,
        ci_high=hi,
        t=t,
        t_p=t_p,
        wilcoxon_p=wilcoxon_p,
        sign_p=sign_p,
        worse=worse,
        better=better,
        ties=ties,
        mde=mde,
        confidence=confidence,
    )
