"""Per-channel outliers and the blind spot of |μ|/σ (lab/outliers.py), and the same columns in
`rmsnorm inspect` (lab/capture.py)."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from rmsnorm.lab import inspect_model
from rmsnorm.lab.outliers import OutlierAccumulator, blind_spot, channel_outliers, iid_max_over_rms
from rmsnorm.lab.transformer import Transformer, TransformerConfig


def test_channel_outliers_against_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 64))
    x[:, 7] *= 5  # one loud channel
    out = channel_outliers(torch.tensor(x), top=2)
    rms = np.sqrt((x**2).mean(axis=1))
    assert out["max_over_rms_median"] == pytest.approx(np.median(np.abs(x).max(axis=1) / rms))
    assert out["max_over_rms_max"] == pytest.approx((np.abs(x).max(axis=1) / rms).max())
    kurt = stats.kurtosis(x, axis=1, fisher=True, bias=True)  # population moments, as the lab's
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
