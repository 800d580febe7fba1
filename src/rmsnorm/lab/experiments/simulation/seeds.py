"""The simulation replicated over seeds, and a verdict on its centering that rests on the
seed-to-seed spread.

The tokens of one run share one random network, so they are not independent draws: the run's
median |μ|/σ varies from seed to seed by far more than the standard error of a median over
independent tokens (about 11% at the defaults, against ±3.6%). The verdict therefore compares the
median of each seed, divided by the median of i.i.d. Gaussian rows of the same width, across seeds:
a t interval on the log of that ratio (the ratio is skewed; its log is close to symmetric).

- :func:`centering_verdict`: the architecture's verdict from N seeds. "less centered" or "more
  centered" when the 95% interval of the geometric-mean ratio excludes 1; "as centered" when it
  contains 1 and lies within ±:data:`EQUIVALENCE_MARGIN`; otherwise "cannot tell".
- :func:`seed_verdicts`: each seed's own verdict, against a prediction band around the i.i.d. level
  whose width comes from the other seeds' spread (leave-one-out, so that a seed never widens its
  own band).
- :func:`token_test_verdicts`: the per-run test that treats the tokens as independent, kept to show
  how often it cries wolf.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from functools import cached_property

import torch

from ...._progress import ensure
from ...._validate import positive_int
from ...stats.iid import IIDReference, iid_reference
from ...stats.rows import identity_check, median
from .run import SimulationConfig, SimulationResult, simulate

__all__ = [
    "EQUIVALENCE_MARGIN",
    "CONFIDENCE",
    "Verdict",
    "centering_verdict",
    "seed_verdicts",
    "token_test_verdicts",
    "paired_spread_test",
    "StageSummary",
    "SeedStudy",
    "replicate",
    "identity_over_seeds",
]

CONFIDENCE = 0.95
# "As centered as i.i.d." needs the whole interval within a factor 1.25 of the i.i.d. median: wide
# enough for 8 seeds at the defaults (seed SD ≈ 11% gives a half-width of ≈ 10%), narrow enough that
# 2 or 3 seeds (t quantiles 12.7 and 4.3) cannot claim it.
EQUIVALENCE_MARGIN = 0.25
# The per-run test the seed-calibrated one replaces: three standard errors of a median over
# independent tokens.
TOKEN_TEST_STANDARD_ERRORS = 3.0


def _t_quantile(q: float, df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


def _check_ratios(ratios) -> list[float]:
    values = [float(r) for r in ratios]
    bad = [r for r in values if not (math.isfinite(r) and r > 0)]
    if bad:
        raise ValueError(f"ratios must be finite and > 0, got {bad[:3]}")
    return values


@dataclass(frozen=True)
class Verdict:
    """Seeds' median |μ|/σ ÷ the i.i.d. median: ``n`` seeds, geometric mean ``ratio`` with its
    ``confidence`` interval [``ci_low``, ``ci_high``] (t on the logs, n − 1 degrees of freedom),
    ``seed_sd`` the standard deviation over seeds of the log ratio (≈ the relative spread), and
    ``verdict``: ``"as centered"``, ``"more centered"``, ``"less centered"`` or
    ``"cannot tell"``."""

    n: int
    ratio: float
    ci_low: float
    ci_high: float
    seed_sd: float
    verdict: str
    confidence: float = CONFIDENCE
    margin: float = EQUIVALENCE_MARGIN

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def centering_verdict(
    ratios, confidence: float = CONFIDENCE, margin: float = EQUIVALENCE_MARGIN
) -> Verdict:
    """The verdict from per-seed ratios (median ÷ i.i.d. median), see the module docstring. One seed
    has no spread: its verdict is "cannot tell"."""
    values = _check_ratios(ratios)
    if not values:
        raise ValueError("ratios must hold at least one seed's ratio")
    logs = [math.log(r) for r in values]
    n = len(logs)
    mean = sum(logs) / n
    if n == 1:
        return Verdict(
            1, math.exp(mean), math.nan, math.nan, math.nan, "cannot tell", confidence, margin
        )
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1))
    half = _t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    lo, hi = math.exp(mean - half), math.exp(mean + half)
    if lo > 1:
        verdict = "less centered"
    elif hi < 1:
        verdict = "more centered"
    elif lo >= 1 / (1 + margin) and hi <= 1 + margin:
        verdict = "as centered"
    else:
        verdict = "cannot tell"
    return Verdict(n, math.exp(mean), lo, hi, sd, verdict, confidence, margin)


def seed_verdicts(ratios, confidence: float = CONFIDENCE) -> list[str]:
    """Each seed's verdict against the i.i.d. level, with a band from the *other* seeds: the seed's
    log ratio must lie within t·s·√(1 + 1/(n − 1)) of 0, s the other n − 1 seeds' standard
    deviation and t their (1 + confidence)/2 quantile with n − 2 degrees of freedom (a prediction
    interval). Needs at least three seeds."""
    logs = [math.log(r) for r in _check_ratios(ratios)]
    n = len(logs)
    if n < 3:
        raise ValueError(f"a seed's verdict needs at least 3 seeds (2 others), got {n}")
    t = _t_quantile((1 + confidence) / 2, n - 2)
    out = []
    for i, v in enumerate(logs):
        others = logs[:i] + logs[i + 1 :]
        m = sum(others) / (n - 1)
        sd = math.sqrt(sum((o - m) ** 2 for o in others) / (n - 2))
        half = t * sd * math.sqrt(1 + 1 / (n - 1))
        out.append("as centered" if abs(v) <= half else ("less" if v > 0 else "more") + " centered")
    return out


def token_test_verdicts(ratios, d: int, tokens: int) -> list[str]:
    """The per-run test that treats one layer's ``tokens`` as independent rows: "as centered" within
    three standard errors of a median over that many i.i.d. rows (±11% at d = 256, 1,024 tokens).
    Its null is violated (the tokens share a network), so it flags too many seeds."""
    tol = TOKEN_TEST_STANDARD_ERRORS * iid_reference(d).median_relative_error(tokens)
    return [
        "as centered" if abs(r - 1) <= tol else ("more" if r < 1 else "less") + " centered"
        for r in _check_ratios(ratios)
    ]


def paired_spread_test(ratios_a, ratios_b) -> dict:
    """Do two settings run at the same seeds differ in their seed-to-seed spread? The
    Pitman–Morgan test on the log ratios: the variances of a and b are equal exactly when a + b and
    a − b are uncorrelated, so the p value is that of Pearson's r between them (t with n − 2
    degrees of freedom; paired seeds, so the F test's independent samples do not apply). Returns
    both standard deviations, r and the two-sided p (NaN below 3 seeds)."""
    from scipy import stats

    a = [math.log(r) for r in _check_ratios(ratios_a)]
    b = [math.log(r) for r in _check_ratios(ratios_b)]
    if len(a) != len(b):
        raise ValueError(f"the two settings need the same seeds, got {len(a)} and {len(b)} ratios")
    n = len(a)
    if n < 3:
        return {"n": n, "sd_a": math.nan, "sd_b": math.nan, "r": math.nan, "p": math.nan}
    sums = [x + y for x, y in zip(a, b, strict=True)]
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    res = stats.pearsonr(sums, diffs)
    return {
        "n": n,
        "sd_a": statistics.stdev(a),
        "sd_b": statistics.stdev(b),
        "r": float(res.statistic),
        "p": float(res.pvalue),
    }


@dataclass
class StageSummary:
    """One seed, one model state: per layer the medians over tokens of |μ|/σ, |μ| and σ, the
    token-shared offset m̄ and its share of E[μ²]; the median |μ|/σ pooled over all layers' tokens
    and the mean predicted cosine; and, where the stream is a sum of its writes, the parts of the
    last layer's m̄ written by the MLPs and by the attentions."""

    seed: int
    median_ratio: list[float]
    median_abs_mu: list[float]
    median_sigma: list[float]
    shared_mean: list[float]
    shared_share: list[float]
    pooled_median_ratio: float
    mean_cosine: float
    last_from_mlp: float | None
    last_from_attention: float | None
    activation_mean: list[float]
    activation_mean_rms: list[float]

    @classmethod
    def of(cls, result: SimulationResult, stage: str = "init") -> StageSummary:
        st = result.stages[stage]
        dec = st.decomposition
        return cls(
            seed=result.config.seed,
            median_ratio=[median(r) for r in st.ratio],
            median_abs_mu=[median(m.abs()) for m in st.mean],
            median_sigma=[median(s) for s in st.std],
            shared_mean=list(dec.shared),
            shared_share=list(dec.share),
            pooled_median_ratio=median(st.ratio.flatten()),
            mean_cosine=float(st.cosine.mean()),
            last_from_mlp=None if dec.from_mlp is None else dec.from_mlp[-1],
            last_from_attention=None if dec.from_attention is None else dec.from_attention[-1],
            activation_mean=list(dec.activation_mean),
            activation_mean_rms=list(dec.activation_mean_rms),
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _band(values: list[list[float]]) -> dict:
    """Per layer across seeds: median, min, max (lists over layers)."""
    t = torch.tensor(values, dtype=torch.float64)  # (seeds, layers)
    return {
        "median": [median(t[:, i]) for i in range(t.shape[1])],
        "min": t.min(dim=0).values.tolist(),
        "max": t.max(dim=0).values.tolist(),
    }


@dataclass
class SeedStudy:
    """One configuration run at ``len(results)`` seeds (``config.seed``, ``config.seed + 1``, …);
    ``results`` are the full runs, the first one drawn in the per-token figures."""

    config: SimulationConfig
    results: list[SimulationResult]
    stage: str = "init"
    seconds: float = 0.0
    summaries: list[StageSummary] = field(init=False)

    def __post_init__(self) -> None:
        self.summaries = [StageSummary.of(r, self.stage) for r in self.results]

    @property
    def seeds(self) -> list[int]:
        return [r.config.seed for r in self.results]

    @property
    def reference(self) -> IIDReference:
        return iid_reference(self.config.d_model)

    @property
    def tokens_per_layer(self) -> int:
        return int(self.results[0].init.mean.shape[1])

    @property
    def layer_names(self) -> list[str]:
        return self.results[0].layer_names

    @property
    def ratios(self) -> list[float]:
        """Per seed: the pooled median |μ|/σ ÷ the i.i.d. median at the same d."""
        return [s.pooled_median_ratio / self.reference.median for s in self.summaries]

    @cached_property
    def verdict(self) -> Verdict:
        return centering_verdict(self.ratios)

    @cached_property
    def layer_verdicts(self) -> list[Verdict]:
        """Per layer, at a confidence Bonferroni-adjusted for the number of layers (so that, for an
        architecture at the i.i.d. level, no layer is flagged in 95% of studies)."""
        n_layers = len(self.summaries[0].median_ratio)
        conf = 1 - (1 - CONFIDENCE) / n_layers
        ref = self.reference.median
        return [
            centering_verdict([s.median_ratio[i] / ref for s in self.summaries], conf)
            for i in range(n_layers)
        ]

    @cached_property
    def seed_verdicts(self) -> list[str] | None:
        ratios = self.ratios
        return seed_verdicts(ratios) if len(ratios) >= 3 else None

    @cached_property
    def token_test_verdicts(self) -> list[str]:
        return token_test_verdicts(self.ratios, self.config.d_model, self.tokens_per_layer)

    def band(self, key: str) -> dict:
        """Across seeds, per layer: median, min and max of a :class:`StageSummary` list field."""
        return _band([getattr(s, key) for s in self.summaries])

    def origin(self) -> dict | None:
        """How much of the last layer's token-shared offset the MLPs wrote: over seeds, 1 −
        Σ(m̄ − m̄_MLP)² / Σ m̄² (1: the MLPs wrote all of it), with the attentions' and the
        embedding's parts; None where the stream is not a plain sum of its writes."""
        if self.summaries[0].last_from_mlp is None:
            return None
        total = sum(s.shared_mean[-1] ** 2 for s in self.summaries)
        rest = sum((s.shared_mean[-1] - s.last_from_mlp) ** 2 for s in self.summaries)
        att = sum(s.last_from_attention**2 for s in self.summaries)
        return {
            "mlp_explained": 1 - rest / total if total > 0 else math.nan,
            "rms_shared_last": math.sqrt(total / len(self.summaries)),
            "rms_from_mlp_last": math.sqrt(
                sum(s.last_from_mlp**2 for s in self.summaries) / len(self.summaries)
            ),
            "rms_from_attention_last": math.sqrt(att / len(self.summaries)),
            "activation_mean": float(
                torch.tensor([s.activation_mean for s in self.summaries]).mean()
            ),
            "activation_mean_rms": float(
                torch.tensor([s.activation_mean_rms for s in self.summaries]).square().mean().sqrt()
            ),
        }

    def to_dict(self) -> dict:
        ref = self.reference
        return {
            "config": self.config.to_dict(),
            "stage": self.stage,
            "seeds": self.seeds,
            "d": self.config.d_model,
            "tokens_per_layer": self.tokens_per_layer,
            "layers": self.layer_names,
            "iid_median": ref.median,
            "ratios": self.ratios,
            "verdict": self.verdict.to_dict(),
            "layer_verdicts": [v.to_dict() for v in self.layer_verdicts],
            "seed_verdicts": self.seed_verdicts,
            "token_test_verdicts": self.token_test_verdicts,
            "token_test_tolerance": TOKEN_TEST_STANDARD_ERRORS
            * ref.median_relative_error(self.tokens_per_layer),
            "per_seed": [s.to_dict() for s in self.summaries],
            "bands": {
                key: self.band(key)
                for key in ("median_ratio", "median_abs_mu", "median_sigma", "shared_share")
            },
            "origin": self.origin(),
            "seconds": self.seconds,
        }


def replicate(cfg: SimulationConfig, seeds: int, progress=None, label: str = "seeds") -> SeedStudy:
    """Run ``cfg`` at ``seeds`` seeds (``cfg.seed``, ``cfg.seed + 1``, …) into a :class:`SeedStudy`
    (progress: one task, one step per seed)."""
    import time

    positive_int("seeds", seeds)
    progress = ensure(progress)
    t0 = time.perf_counter()
    results = []
    with progress.task(f"{label}: {seeds} seed{'s' if seeds > 1 else ''}", total=seeds) as advance:
        for i in range(seeds):
            results.append(simulate(replace(cfg, seed=cfg.seed + i)))
            advance()
    return SeedStudy(cfg, results, seconds=time.perf_counter() - t0)


def identity_over_seeds(study: SeedStudy) -> dict:
    """RMS² = σ² + μ² checked on every row of every layer of every seed at initialization: the
    number of rows and the largest relative and absolute errors."""
    checks = [
        identity_check(res.init.layer(i))
        for res in study.results
        for i in range(res.init.mean.shape[0])
    ]
    return {
        "rows": sum(c["rows"] for c in checks),
        "max_rel_error": max(c["max_rel_error"] for c in checks),
        "max_abs_error": max(c["max_abs_error"] for c in checks),
    }
