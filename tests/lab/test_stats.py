"""The lab's statistics against known answers (lab/stats/rows.py, iid.py, conventions.py,
outliers.py): row statistics and the LayerNorm-vs-RMSNorm relation, |μ|/σ of i.i.d. rows, the two ε
placements with the least-squares β, and per-channel outliers."""

import math
import statistics

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

import rmsnorm
from rmsnorm.lab import inspect_model, stats
from rmsnorm.lab.models.transformer import Transformer, TransformerConfig
from rmsnorm.lab.stats import row_stats
from rmsnorm.lab.stats.conventions import beta_fit, eps_table, shrink_factors, stream_shrink
from rmsnorm.lab.stats.iid import iid_ratio_cdf, iid_ratio_quantile, iid_reference
from rmsnorm.lab.stats.outliers import (
    OutlierAccumulator,
    blind_spot,
    channel_outliers,
    iid_max_over_rms,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --------------------------------------------------------------------------------------------------
# Known answers for the row statistics and the LayerNorm-vs-RMSNorm relation
# (lab/stats/rows.py).


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


# --------------------------------------------------------------------------------------------------
# |μ|/σ of rows of i.i.d. Gaussian entries (lab/stats/iid.py): the exact Student-t distribution
# against tabulated t quantiles and against Monte Carlo of the statistic as the lab computes it.


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


# --------------------------------------------------------------------------------------------------
# The two ε placements and the least-squares β (lab/stats/conventions.py), against hand and numpy
# computations and this library's actual outputs.


def test_shrink_factors_by_hand():
    f = shrink_factors(0.02, 1e-5)
    assert f["layernorm"] == pytest.approx(0.02 / math.sqrt(0.02**2 + 1e-5))  # 0.9877
    assert f["mean_square"] == pytest.approx(0.02 / math.sqrt(0.0004 + 1e-5))
    assert f["rms_mode"] == pytest.approx(0.02 / 0.02001)  # 0.9995
    # the ε′ of x/(RMS + ε′) that shrinks as much as x/√(RMS² + ε)
    eq = f["equivalent_rms_eps"]
    assert 0.02 / (0.02 + eq) == pytest.approx(f["mean_square"])
    assert eq == pytest.approx(1e-5 / (2 * 0.02), rel=0.02)
    g = shrink_factors(0.05, 1e-5, sigma=0.03)
    assert g["layernorm"] == pytest.approx(0.03 / math.sqrt(0.0009 + 1e-5))


def test_eps_table_matches_the_library():
    for e in eps_table(rms_values=(1e-3, 0.1), eps_values=(1e-5,), d=64):
        assert e["measured_mean_square"] == pytest.approx(e["mean_square"], rel=1e-9)
        assert e["measured_rms_mode"] == pytest.approx(e["rms_mode"], rel=1e-9)
        assert e["measured_layernorm"] == pytest.approx(e["layernorm"], rel=1e-9)
    # the seed's form shrinks a row of small RMS far less at the same ε
    small = eps_table(rms_values=(1e-3,), eps_values=(1e-5,), d=64)[0]
    assert small["rms_mode"] > 0.98 > 0.31 > small["mean_square"]


def test_stream_shrink_from_rows_or_stats():
    x = torch.randn(100, 64, dtype=torch.float64) * 0.02
    a = stream_shrink(x, 1e-5)
    b = stream_shrink(row_stats(x), 1e-5)
    assert a == b
    rms = x.square().mean(dim=1).sqrt().numpy()
    assert a["rms_mode_shrink"] == pytest.approx(np.median(1 - rms / (rms + 1e-5)))
    y = rmsnorm.rms_norm(x, (64,), eps=1e-5, eps_mode="rms")
    assert a["rms_mode_shrink"] == pytest.approx(
        float(np.median(1 - y.square().mean(dim=1).sqrt().numpy())), rel=1e-9
    )


def test_beta_fit_is_least_squares():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(400, 32))
    x = base + rng.normal(0.3, 0.2, size=(400, 1))  # a shared and a per-token part of μ
    out = beta_fit(torch.tensor(x), eps=0.0)
    xt = torch.tensor(x)
    delta = (rmsnorm.rms_norm(xt, (32,), eps=0.0) - rmsnorm.layer_norm(xt, (32,), eps=0.0)).numpy()
    # the per-feature β minimising Σ‖Δ_t − β‖² (numpy's least squares on a column of ones)
    beta, *_ = np.linalg.lstsq(np.ones((400, 1)), delta, rcond=None)
    left = ((delta - beta) ** 2).sum() / (delta**2).sum()
    assert out["left_share"] == pytest.approx(left)
    m = x.mean(axis=1) / np.sqrt((x**2).mean(axis=1))
    assert out["mean_term_left_share"] == pytest.approx(((m - m.mean()) ** 2).sum() / (m**2).sum())
    # the same μ and σ in every token: the mean term is token-shared and β takes all of it
    same = torch.tensor(rng.normal(size=(50, 32)))
    same = same - same.mean(dim=1, keepdim=True)
    same = same / same.square().mean(dim=1, keepdim=True).sqrt() + 0.5
    assert beta_fit(same, eps=0.0)["mean_term_left_share"] < 1e-6


# --------------------------------------------------------------------------------------------------
# Per-channel outliers and the blind spot of |μ|/σ (lab/stats/outliers.py), and the same columns in
# `rmsnorm inspect` (lab/experiments/inspection/capture.py).


def test_channel_outliers_against_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 64))
    x[:, 7] *= 5  # one loud channel
    out = channel_outliers(torch.tensor(x), top=2)
    rms = np.sqrt((x**2).mean(axis=1))
    assert out["max_over_rms_median"] == pytest.approx(np.median(np.abs(x).max(axis=1) / rms))
    assert out["max_over_rms_max"] == pytest.approx((np.abs(x).max(axis=1) / rms).max())
    kurt = scipy_stats.kurtosis(
        x, axis=1, fisher=True, bias=True
    )  # population moments, as the lab's
    assert out["excess_kurtosis_median"] == pytest.approx(np.median(kurt))
    energy = (x**2).sum(axis=0)
    share = energy / energy.sum()
    order = np.argsort(-share)
    assert out["top1_share"] == pytest.approx(share[order[0]])
    assert out["top_k"] == 1 and out["top_k_share"] == pytest.approx(share[order[0]])
    assert [c["channel"] for c in out["dominant_channels"]] == [7, int(order[1])]
    assert out["iid_top_k_share"] == pytest.approx(1 / 64) and out["d"] == 64


def test_accumulating_in_pieces_equals_at_once():
    x = torch.randn(200, 32, dtype=torch.float64)
    acc = OutlierAccumulator()
    acc.add(x[:50])
    acc.add(x[50:])
    whole, parts = channel_outliers(x), acc.summary()
    for key in ("max_over_rms_median", "excess_kurtosis_median", "top1_share", "top_k_share"):
        assert parts[key] == pytest.approx(whole[key]), key
    assert [c["channel"] for c in parts["dominant_channels"]] == [
        c["channel"] for c in whole["dominant_channels"]
    ]
    capped = OutlierAccumulator(max_rows=60)
    capped.add(x[:50])
    capped.add(x[50:])
    s = capped.summary()
    assert s["rows"] == 200  # the channel energies use every row
    assert s["max_over_rms_median"] == pytest.approx(
        channel_outliers(x[:60])["max_over_rms_median"]
    )


def test_iid_max_over_rms_by_monte_carlo():
    x = torch.randn(20_000, 256, dtype=torch.float64)
    measured = float((x.abs().max(dim=1).values / x.square().mean(dim=1).sqrt()).median())
    assert iid_max_over_rms(256) == pytest.approx(measured, rel=0.02)
    with pytest.raises(ValueError, match="d must be a positive integer"):
        iid_max_over_rms(0)


def test_the_blind_spot():
    """One massive channel: |μ|/σ → 1/√(d − 1), inside the i.i.d. band; m same-sign channels:
    √(m/(d − m)); mixed signs cancel; the channel shares see every case."""
    d = 256
    rows = {(r["m"], r["signs"]): r for r in blind_spot(d=d, counts=(0, 1, 8), amplitude=1000.0)}
    one = rows[(1, "same")]
    assert one["limit_mu_over_sigma"] == pytest.approx(1 / math.sqrt(d - 1))
    assert one["median_mu_over_sigma"] == pytest.approx(1 / math.sqrt(d - 1), rel=0.01)
    assert one["top_m_share"] > 0.99 and one["max_over_rms_median"] > 15
    eight = rows[(8, "same")]
    assert eight["median_mu_over_sigma"] == pytest.approx(math.sqrt(8 / (d - 8)), rel=0.01)
    assert rows[(8, "mixed")]["median_mu_over_sigma"] < 0.01
    assert rows[(0, "none")]["top_m_share"] < 0.02
    with pytest.raises(ValueError, match="counts must lie in"):
        blind_spot(d=8, counts=(8,))


def test_inspect_reports_the_channels():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(n_layers=1, d_model=32, n_heads=2, seq_len=16))
    with torch.no_grad():  # a loud channel in the embedding: every norm input carries it
        model.tok_emb.weight[:, 5] += 1.0
    layers = inspect_model(model, torch.randint(0, 256, (2, 16))).to_dict()["layers"]
    first = layers[0]["outliers"]
    assert first["dominant_channels"][0]["channel"] == 5 and first["top1_share"] > 0.5
    assert first["rows"] == 32 and first["d"] == 32
