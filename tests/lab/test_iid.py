"""|μ|/σ of rows of i.i.d. Gaussian entries (lab/iid.py): the exact Student-t distribution against
tabulated t quantiles and against Monte Carlo of the statistic as the lab computes it."""

import math
import statistics

import pytest
import torch

from rmsnorm.lab.iid import iid_ratio_cdf, iid_ratio_quantile, iid_reference
from rmsnorm.lab.stats import row_stats

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def iid_ratios(d: int, rows: int, seed: int = 0) -> torch.Tensor:
    """|μ|/σ of ``rows`` rows of ``d`` i.i.d. N(0, 0.02²) entries, by row_stats (population σ)."""
    gen = torch.Generator().manual_seed(seed)
    chunks = []
    for _ in range(0, rows, 20_000):  # 20 000 × 256 float64 = 41 MB at a time
        x = 0.02 * torch.randn(min(20_000, rows), d, generator=gen, dtype=torch.float64)
        chunks.append(row_stats(x).ratio)
        rows -= chunks[-1].numel()
    return torch.cat(chunks)


@pytest.mark.parametrize(
    "q, nu, t",  # two-sided: P(|T| ≤ t) = q, from tables of Student's t
    [
        (0.95, 30, 2.042272),
        (0.5, 30, 0.682756),
        (0.90, 5, 2.015048),
        (0.95, 10, 2.228139),
        (0.5, 1, 1.0),
        (0.95, 2, 4.302653),
    ],
)
def test_tabulated_t_quantiles(q, nu, t):
    assert iid_ratio_quantile(q, nu + 1) * math.sqrt(nu) == pytest.approx(t, abs=2e-6)
    assert iid_ratio_cdf(t / math.sqrt(nu), nu + 1) == pytest.approx(q, abs=2e-6)


@pytest.mark.parametrize("d", [32, 256])  # the quick report's width and the report's
def test_reference_matches_monte_carlo(d):
    rows = 200_000
    r = iid_ratios(d, rows)
    ref = iid_reference(d)
    # 4 standard errors of each sample statistic
    se_median = ref.median * ref.median_relative_error(rows)
    assert abs(float(r.median()) - ref.median) < 4 * se_median
    for q, expected in ((0.05, ref.q05), (0.25, ref.q25), (0.75, ref.q75), (0.95, ref.q95)):
        measured = float(torch.quantile(r, q))
        assert measured == pytest.approx(expected, rel=0.02), q
    assert float(r.mean()) == pytest.approx(ref.mean, abs=4 * float(r.std()) / math.sqrt(rows))
    # The normal limit is off by more than the sampling error at d = 32, not at d = 256.
    normal = statistics.NormalDist().inv_cdf(0.75) / math.sqrt(d)
    assert (abs(float(r.median()) - normal) > 5 * se_median) == (d == 32)


def test_median_standard_error_matches_the_spread_of_medians():
    d, rows, repeats = 16, 1024, 300
    medians = iid_ratios(d, rows * repeats, seed=1).reshape(repeats, rows).median(dim=1).values
    ref = iid_reference(d)
    spread = float(medians.std()) / ref.median
    assert spread == pytest.approx(ref.median_relative_error(rows), rel=0.15)


def test_limits_and_errors():
    for q in (0.05, 0.5, 0.95):
        assert iid_ratio_cdf(iid_ratio_quantile(q, 300), 300) == pytest.approx(q, abs=1e-12)
    # beyond the exact range the normal limit takes over without a step
    a, b = iid_reference(20_001).median, iid_reference(20_002).median
    assert a / b == pytest.approx(math.sqrt(20_001 / 20_000), rel=1e-4)
    assert iid_reference(2).mean == math.inf and iid_reference(2).median == pytest.approx(1.0)
    with pytest.raises(ValueError, match="d must be an integer >= 2"):
        iid_reference(1)
    with pytest.raises(ValueError, match="q must be in"):
        iid_ratio_quantile(1.0, 8)
    with pytest.raises(ValueError, match="rows must be a positive integer"):
        iid_reference(8).median_relative_error(0)
