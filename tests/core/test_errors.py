"""Bad input gets a clear error that names the argument and the expected form."""

import pytest
import torch

import rmsnorm

X = torch.randn(4, 8)
W = torch.randn(8)


def _rms(**kw):
    args = dict(input=X, normalized_shape=8)
    args.update(kw)
    return rmsnorm.rms_norm(**args)


# (call, exception type, words the message must contain)
CASES = [
    (lambda: _rms(normalized_shape=7), ValueError, ["normalized_shape", "trailing"]),
    (lambda: _rms(normalized_shape=(2, 8)), ValueError, ["normalized_shape"]),
    (lambda: _rms(normalized_shape=()), ValueError, ["normalized_shape"]),
    (lambda: _rms(normalized_shape="8"), TypeError, ["normalized_shape"]),
    (lambda: _rms(weight=torch.randn(7)), ValueError, ["weight", "[8]"]),
    (lambda: _rms(bias=torch.randn(4, 8)), ValueError, ["bias", "[8]"]),
    (lambda: _rms(weight=torch.ones(8, dtype=torch.int32)), TypeError, ["weight", "floating"]),
    (lambda: _rms(eps=-1e-6), ValueError, ["eps", ">= 0"]),
    (lambda: _rms(eps=float("nan")), ValueError, ["eps"]),
    (lambda: _rms(eps=float("inf")), ValueError, ["eps"]),
    (lambda: _rms(eps="1e-6"), TypeError, ["eps"]),
    (lambda: _rms(partial=0.0), ValueError, ["partial", "(0, 1]"]),
    (lambda: _rms(partial=1.5), ValueError, ["partial"]),
    (lambda: _rms(eps_mode="sqrt"), ValueError, ["eps_mode", "mean_square"]),
    (lambda: _rms(casting_mode="fp32"), ValueError, ["casting_mode", "gemma"]),
    (lambda: _rms(offset=1.0), ValueError, ["offset", "weight"]),
    (lambda: _rms(offset=float("nan"), weight=W), ValueError, ["offset"]),
    (lambda: _rms(input=torch.ones(4, 8, dtype=torch.int64)), TypeError, ["input", "floating"]),
    (lambda: _rms(input=torch.ones(4, 8, dtype=torch.bool)), TypeError, ["input"]),
    (lambda: _rms(input=torch.ones(4, 8, dtype=torch.complex64)), TypeError, ["input"]),
    (lambda: _rms(input=[1.0, 2.0]), TypeError, ["input", "Tensor"]),
    (lambda: rmsnorm.add_rms_norm(X, torch.randn(4, 7), 8), ValueError, ["residual", "shape"]),
    (
        lambda: rmsnorm.add_rms_norm(X, torch.ones(4, 8, dtype=torch.int8), 8),
        TypeError,
        ["residual"],
    ),
    (lambda: rmsnorm.add_rms_norm(X, X, 8, partial=-1), ValueError, ["partial"]),
    (lambda: rmsnorm.layer_norm(X, 9), ValueError, ["normalized_shape"]),
    (lambda: rmsnorm.layer_norm(X, 8, eps=-1.0), ValueError, ["eps"]),
    (lambda: rmsnorm.layer_norm(X, 8, torch.randn(8, 1)), ValueError, ["weight"]),
    (lambda: rmsnorm.RMSNorm(8, eps_mode="bad"), ValueError, ["eps_mode"]),
    (lambda: rmsnorm.RMSNorm(8, elementwise_affine=False, bias=True), ValueError, ["bias"]),
    (lambda: rmsnorm.RMSNorm(8, elementwise_affine=False, offset=1.0), ValueError, ["offset"]),
    (lambda: rmsnorm.use_backend("cuda"), ValueError, ["backend", "auto"]),
]


@pytest.mark.parametrize("call,exc,words", CASES)
def test_bad_input_is_named(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_device_mismatch_is_named():
    xc = torch.randn(4, 8, device="cuda")
    with pytest.raises(ValueError, match="weight"):
        rmsnorm.rms_norm(xc, 8, W)
    with pytest.raises(ValueError, match="residual"):
        rmsnorm.add_rms_norm(xc, X, 8)


def test_device_mismatch_is_named_on_meta():
    # the meta device stands in for a second device on machines without a GPU
    xm = torch.randn(4, 8, device="meta")
    with pytest.raises(ValueError, match="weight is on cpu but input is on meta"):
        rmsnorm.rms_norm(xm, 8, W)
    with pytest.raises(ValueError, match="residual is on cpu"):
        rmsnorm.add_rms_norm(xm, X, 8)


def test_bad_environment_backend_is_named(monkeypatch):
    monkeypatch.setenv("RMSNORM_BACKEND", "fast")
    with pytest.raises(ValueError, match="RMSNORM_BACKEND"):
        rmsnorm.rms_norm(X, 8)
