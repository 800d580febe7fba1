"""Known answers for the row statistics and the LayerNorm-vs-RMSNorm relation
(lab/stats.py)."""

import math

import numpy as np
import pytest
import torch

from rmsnorm.lab import stats

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rows_with_ratio(ratios, d=64, sigma=0.5, seed=0):
    """float64 rows whose |μ|/σ is exactly ``ratios``: centered unit noise, scaled, shifted."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(len(ratios), d, generator=gen, dtype=torch.float64)
    z = z - z.mean(-1, keepdim=True)
    z = z / z.square().mean(-1, keepdim=True).sqrt()
    r = torch.as_tensor(ratios, dtype=torch.float64)
    return sigma * z + (sigma * r)[:, None]


def test_row_stats_known_values():
    x = torch.tensor([[1.0, 3.0], [2.0, 2.0], [0.0, 0.0]])
    s = stats.row_stats(x)
    assert s.mean.tolist() == [2.0, 2.0, 0.0]
    assert s.std.tolist() == [1.0, 0.0, 0.0]
    torch.testing.assert_close(s.rms, torch.tensor([math.sqrt(5), 2.0, 0.0], dtype=torch.float64))
    assert s.mean.dtype == torch.float64
    # leading dims flatten to one row per token
    assert stats.row_stats(torch.randn(3, 5, 7)).mean.shape == (15,)


def test_identity_holds_to_rounding():
    x = torch.randn(500, 128, dtype=torch.float64) * 3 + torch.linspace(-10, 10, 500)[:, None]
    check = stats.identity_check(x)
    assert check["rows"] == 500
    assert check["max_rel_error"] < 1e-13


@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-2, 1.0])
@pytest.mark.parametrize("eps_mode", ["mean_square", "rms"])
def test_predicted_matches_measured_float64(eps, eps_mode):
    ratios = torch.logspace(-3, 3, 40).tolist() + [0.0]
    x = rows_with_ratio(ratios)
    x[::2] *= -1  # negative means too
    div = stats.divergence(x, eps=eps, eps_mode=eps_mode)
    torch.testing.assert_close(div.measured_cosine, div.predicted_cosine, rtol=0, atol=1e-6)
    # the analytic form in μ/σ
    r = torch.tensor(ratios, dtype=torch.float64)
    torch.testing.assert_close(div.predicted_cosine, 1 / torch.sqrt(1 + r * r), rtol=0, atol=1e-12)
    # the exact ε-aware distance; the ε-free one only when ε ≪ σ² (σ² = 0.25 here)
    torch.testing.assert_close(div.measured_sq_dist, div.predicted_sq_dist_eps, rtol=0, atol=1e-6)
    if eps <= 1e-6:
        torch.testing.assert_close(div.measured_sq_dist, div.predicted_sq_dist, rtol=0, atol=1e-5)
    else:
        assert (div.measured_sq_dist - div.predicted_sq_dist).abs().max() > 1e-5


def test_eps_free_distance_formula():
    x = rows_with_ratio([0.0, 0.5, 1.0, 4.0])
    div = stats.divergence(x)
    cos = div.predicted_cosine
    torch.testing.assert_close(div.predicted_sq_dist, 2 - 2 * cos)
    assert div.predicted_sq_dist[0] < 1e-12  # centered: identical outputs


def test_degenerate_rows():
    x = torch.tensor([[3.0] * 8, [0.0] * 8, [-2.0] * 8], dtype=torch.float64)
    div = stats.divergence(x, eps=1e-5)
    # constant row: LN output is 0, so the cosine is 0 (the σ/RMS limit); distance b²
    assert div.predicted_cosine.tolist() == [0.0, 1.0, 0.0]
    assert div.measured_cosine.tolist() == [0.0, 1.0, 0.0]
    torch.testing.assert_close(div.measured_sq_dist, div.predicted_sq_dist_eps, rtol=0, atol=1e-12)
    assert div.measured_sq_dist[1] == 0.0  # all-zero row: both outputs exactly zero
    no_eps = stats.divergence(x, eps=0.0)
    assert torch.isnan(no_eps.measured_cosine[0])  # 0/0 in LayerNorm, honestly NaN
    assert no_eps.predicted_sq_dist[0] == 2.0  # the σ → 0⁺ limit
    assert torch.isnan(no_eps.predicted_sq_dist[1])
    s = stats.row_stats(x)
    assert s.mean_energy_share.tolist() == [1.0, 0.0, 1.0]


def test_summarize_skips_nonfinite():
    out = stats.summarize(torch.tensor([1.0, 2.0, 3.0, float("inf"), float("nan")]))
    assert out["count"] == 3 and out["nonfinite"] == 2
    assert out["mean"] == 2.0 and out["q50"] == 2.0 and out["max"] == 3.0
    assert math.isnan(stats.summarize(torch.tensor([float("nan")]))["mean"])


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="eps must be"):
        stats.divergence(torch.randn(2, 4), eps=-1.0)
    with pytest.raises(ValueError, match="eps_mode"):
        stats.divergence(torch.randn(2, 4), eps_mode="bogus")
    with pytest.raises(TypeError, match="floating-point"):
        stats.row_stats(torch.ones(2, 3, dtype=torch.int64))


def test_median_is_numpys():
    from rmsnorm.lab.stats import median

    x = torch.tensor([3.0, 1.0, 4.0, 1.5, float("nan"), float("inf")])
    assert median(x) == np.median([3.0, 1.0, 4.0, 1.5]) == 2.25
    assert median(torch.tensor([2.0, 7.0, 1.0])) == 2.0
    assert math.isnan(median(torch.tensor([float("nan")])))
