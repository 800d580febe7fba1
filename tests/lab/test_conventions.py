"""The two ε placements and the least-squares β (lab/conventions.py), against hand and numpy
computations and this library's actual outputs."""

import math

import numpy as np
import pytest
import torch

import rmsnorm
from rmsnorm.lab.conventions import beta_fit, eps_table, shrink_factors, stream_shrink
from rmsnorm.lab.stats import row_stats


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
