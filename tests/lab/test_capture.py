"""Norm-layer detection and the capture hooks (lab/capture.py) on torch modules: which modules are
norm layers and of which kind, what the hooks record, and the swap they measure."""

import pytest
import torch
from torch import nn

import rmsnorm
from rmsnorm.lab import capture
from rmsnorm.lab.inspection import inspect_model
from rmsnorm.lab.transformer import Transformer, TransformerConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class T5StyleLayerNorm(nn.Module):
    """Named LayerNorm but does not subtract the mean (T5's): the probe must call it RMSNorm."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, x):
        return (
            self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )


class GemmaStyleRMSNorm(nn.Module):
    """Offset weight (1 + w), w initialised to zeros."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)


class MyLayerNorm(nn.Module):
    """A hand-written LayerNorm with the usual attribute names."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias


@pytest.mark.parametrize(
    "module, kind",
    [
        (nn.LayerNorm(16), "layernorm"),
        (nn.RMSNorm(16), "rmsnorm"),
        (rmsnorm.LayerNorm(16), "layernorm"),
        (rmsnorm.RMSNorm(16), "rmsnorm"),
        (T5StyleLayerNorm(16), "rmsnorm"),  # the name says LayerNorm, the probe says otherwise
        (GemmaStyleRMSNorm(16), "rmsnorm"),
        (MyLayerNorm(16), "layernorm"),
        (nn.BatchNorm1d(16), None),
        (nn.GroupNorm(2, 16), None),
        (nn.Linear(16, 16), None),
    ],
)
def test_norm_kind(module, kind):
    assert capture.norm_kind(module) == kind


def test_counts_in_torch_models():
    model = nn.Sequential(
        nn.Linear(8, 8), nn.LayerNorm(8), nn.ReLU(), T5StyleLayerNorm(8), nn.BatchNorm1d(8),
        nn.Sequential(rmsnorm.RMSNorm(8), MyLayerNorm(8)),
    )  # fmt: skip
    kinds = [k for _, _, k in capture.find_norm_layers(model)]
    assert kinds == ["layernorm", "rmsnorm", "rmsnorm", "layernorm"]
    cfg = TransformerConfig(n_layers=3, d_model=32, n_heads=2, seq_len=8)
    found = capture.find_norm_layers(Transformer(cfg))
    assert len(found) == 2 * 3 + 1  # norm1, norm2 per block + the final norm


def test_hooks_record_and_are_removed():
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), GemmaStyleRMSNorm(16))
    x = torch.randn(4, 5, 16)
    with capture.NormCapture(model) as cap:
        model(x)
        model(x)
    for module in model:
        assert not module._forward_hooks
    summary = cap.summary()
    assert [s["calls"] for s in summary] == [2, 2]
    assert [s["tokens"] for s in summary] == [40, 40]
    assert summary[0]["swap_to"] == "rmsnorm" and summary[1]["swap_to"] == "layernorm"
    # the output of an LN layer is centered, so the RMS layer after it loses nothing by a swap
    assert summary[1]["swap_max_abs_diff"] < 1e-4
    assert summary[1]["mu_over_sigma"]["max"] < 1e-5


def test_swap_difference_matches_the_relation():
    """LN swapped for RMSNorm (γ = 1, β = 0): ‖Δy‖²/d per row = 2 − 2σ/RMS (tiny ε)."""
    ln = nn.LayerNorm(64, eps=1e-12, dtype=torch.float64)
    x = torch.randn(200, 64, dtype=torch.float64) + 0.3
    res = inspect_model(ln, x)
    layer = res.layers[0]
    s = rmsnorm.lab.row_stats(x)
    expected = (2 - 2 * s.std / s.rms).mean()  # Σ‖Δ‖² / Σ‖y‖², with ‖y‖²/d = 1 per row
    assert layer["swap_rel_diff"] == pytest.approx(float(expected.sqrt()), rel=1e-6)
    assert layer["mu_over_sigma"]["q50"] == pytest.approx(
        float(s.ratio.median()), rel=1e-3, abs=1e-3
    )
