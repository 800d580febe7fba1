"""The spec checks itself: forward formulas in float64, the written-out backward against autograd,
the statistics against exact rational arithmetic."""

from fractions import Fraction

import pytest
import torch

from rmsnorm import reference as ref

EPS_MODES = ref.EPS_MODES
CASTING = ref.CASTING_MODES


def _rms_autograd(x, w, b, eps, eps_mode, offset, k):
    """RMSNorm written directly from the formulas, differentiated by autograd (float64)."""
    ms = x[:, :k].square().mean(-1, keepdim=True)
    r = torch.rsqrt(ms + eps) if eps_mode == "mean_square" else 1 / (ms.sqrt() + eps)
    y = x * r
    if w is not None:
        y = y * (offset + w)
    if b is not None:
        y = y + b
    return y


# (M, N, k, weight, bias, offset): partial k < N, k = 1, no weight, offset with bias
BACKWARD_CASES = [
    (3, 8, 8, True, False, 0.0),
    (4, 7, 3, True, True, 1.0),  # partial, bias, Gemma offset
    (2, 5, 1, False, False, 0.0),  # k = 1, no weight
    (3, 6, 6, True, True, -0.5),
]


@pytest.mark.parametrize("eps_mode", EPS_MODES)
@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_rms_backward_matches_autograd(eps_mode, case):
    m, n, k, has_w, has_b, offset = case
    x = torch.randn(m, n, dtype=torch.float64, requires_grad=True)
    w = torch.randn(n, dtype=torch.float64, requires_grad=True) if has_w else None
    b = torch.randn(n, dtype=torch.float64, requires_grad=True) if has_b else None
    eps = 1e-3
    y = _rms_autograd(x, w, b, eps, eps_mode, offset, k)
    wd = None if w is None else w.detach()
    bd = None if b is None else b.detach()
    y_ref, rstd = ref.rms_norm_fwd(x.detach(), wd, bd, eps, eps_mode, "gemma", offset, k)
    torch.testing.assert_close(y_ref, y.detach(), rtol=1e-12, atol=1e-12)
    dy = torch.randn(m, n, dtype=torch.float64)
    inputs = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(y, inputs, dy)
    dx, dw, db = ref.rms_norm_bwd(
        dy, x.detach(), w, b, rstd, None, eps, eps_mode, "gemma", offset, k, torch.float64
    )
    torch.testing.assert_close(dx, grads[0], rtol=1e-10, atol=1e-12)
    if has_w:
        torch.testing.assert_close(dw, grads[1], rtol=1e-10, atol=1e-12)
    if has_b:
        torch.testing.assert_close(db, grads[-1], rtol=1e-10, atol=1e-12)


def test_add_rms_backward_matches_autograd():
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    res = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, dtype=torch.float64, requires_grad=True)
    h = x + res
    y = _rms_autograd(h, w, None, 1e-6, "mean_square", 0.0, 9)
    dy, dh = torch.randn(4, 9, dtype=torch.float64), torch.randn(4, 9, dtype=torch.float64)
    gx, gr, gw = torch.autograd.grad((y, h), (x, res, w), (dy, dh))
    y2, h2, rstd = ref.add_rms_norm_fwd(
        x.detach(), res.detach(), w.detach(), None, 1e-6, "mean_square", "gemma", 0.0, 9
    )
    torch.testing.assert_close(y2, y.detach())
    dx, dw, _ = ref.rms_norm_bwd(
        dy, h2, w, None, rstd, dh, 1e-6, "mean_square", "gemma", 0.0, 9, torch.float64
    )
    torch.testing.assert_close(dx, gx, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dx, gr, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw, gw, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("has_w,has_b", [(True, True), (False, False), (True, False)])
def test_layer_norm_backward_matches_autograd(has_w, has_b):
    x = torch.randn(5, 11, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, dtype=torch.float64, requires_grad=True) if has_w else None
    b = torch.randn(11, dtype=torch.float64, requires_grad=True) if has_b else None
    y = torch.nn.functional.layer_norm(x, (11,), w, b, 1e-5)
    y2, mean, rstd = ref.layer_norm_fwd(x.detach(), w, b, 1e-5)
    torch.testing.assert_close(y2, y.detach(), rtol=1e-12, atol=1e-12)
    dy = torch.randn(5, 11, dtype=torch.float64)
    inputs = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(y, inputs, dy)
    dx, dw, db = ref.layer_norm_bwd(dy, x.detach(), w, b, mean, rstd)
    torch.testing.assert_close(dx, grads[0], rtol=1e-10, atol=1e-12)
    if has_w:
        torch.testing.assert_close(dw, grads[1], rtol=1e-10, atol=1e-12)
    if has_b:
        torch.testing.assert_close(db, grads[-1], rtol=1e-10, atol=1e-12)


def test_rms_mode_is_x_over_rms_plus_eps():
    x = torch.randn(16, 33, dtype=torch.float64) * 3 + 0.5
    eps = 1e-2
    rms = x.square().mean(-1, keepdim=True).sqrt()
    got = ref.rms_norm(x, eps=eps, eps_mode="rms")
    torch.testing.assert_close(got, x / (rms + eps), rtol=0, atol=1e-12)
    got_ms = ref.rms_norm(x, eps=eps)
    torch.testing.assert_close(got_ms, x / (rms.square() + eps).sqrt(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("eps_mode", EPS_MODES)
def test_all_zero_row_forward_and_backward(eps_mode):
    x = torch.zeros(2, 8, dtype=torch.float64)
    x[1] = torch.randn(8, dtype=torch.float64)
    eps = 1e-4
    y, rstd = ref.rms_norm_fwd(x, None, None, eps, eps_mode, "gemma", 0.0, 8)
    assert torch.equal(y[0], torch.zeros(8, dtype=torch.float64))
    dy = torch.randn(2, 8, dtype=torch.float64)
    dx, _, _ = ref.rms_norm_bwd(
        dy, x, None, None, rstd, None, eps, eps_mode, "gemma", 0.0, 8, torch.float64
    )
    assert dx.isfinite().all()
    if eps_mode == "rms":  # the limit dx = g / ε at x = 0
        torch.testing.assert_close(dx[0], dy[0] / eps, rtol=1e-12, atol=0)
    else:  # r = 1/sqrt(ε) and the correction vanishes
        torch.testing.assert_close(dx[0], dy[0] / eps**0.5, rtol=1e-12, atol=0)


def test_partial_size_definition():
    assert ref.partial_size(100, 0.29) == 29  # 0.29 * 100 = 28.999999999999996 in binary
    assert ref.partial_size(4096, 0.0625) == 256
    assert ref.partial_size(10, 0.01) == 1  # never 0
    assert ref.partial_size(7, 1.0) == 7
    assert ref.partial_size(7, None) == 7


def test_partial_uses_first_k_elements_only():
    x = torch.randn(3, 10, dtype=torch.float64)
    y = ref.rms_norm(x, eps=0.0, partial=0.3)
    rms3 = x[:, :3].square().mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(y, x / rms3, rtol=1e-14, atol=0)


# ------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------
def _exact_stats(row: list[float]):
    """μ, σ², RMS² of a float64 row in exact rational arithmetic."""
    fr = [Fraction(v) for v in row]
    d = len(fr)
    mu = sum(fr) / d
    var = sum((v - mu) ** 2 for v in fr) / d
    ms = sum(v * v for v in fr) / d
    return mu, var, ms


@pytest.mark.parametrize("ratio", [0.0, 0.3, 10.0, 1e3])  # |μ|/σ up to 10³
def test_row_stats_against_fractions(ratio):
    torch.manual_seed(1)
    x = torch.randn(6, 37, dtype=torch.float64) + ratio * torch.randn(6, 1, dtype=torch.float64)
    mean, std, rms = ref.row_stats(x)
    for i in range(x.shape[0]):
        mu, var, ms = _exact_stats(x[i].tolist())
        assert abs(mean[i].item() - float(mu)) <= 1e-12 * max(abs(float(mu)), float(ms) ** 0.5)
        assert abs(std[i].item() ** 2 - float(var)) <= 1e-12 * float(var)
        assert abs(rms[i].item() ** 2 - float(ms)) <= 1e-12 * float(ms)
        # the identity RMS² = σ² + μ² holds exactly in rationals...
        assert ms == var + mu * mu
        # ...and to 1e-12 relative in floats, σ computed two-pass (not from the identity)
        lhs, rhs = rms[i].item() ** 2, std[i].item() ** 2 + mean[i].item() ** 2
        assert abs(lhs - rhs) <= 1e-12 * lhs


def test_output_dtypes_per_casting_mode():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w32 = torch.randn(8)
    expected_dtypes = {"gemma": torch.bfloat16, "llama": torch.float32, "none": torch.bfloat16}
    for mode, expected in expected_dtypes.items():
        y, rstd = ref.rms_norm_fwd(x, w32, None, 1e-6, "mean_square", mode, 0.0, 8)
        assert y.dtype == expected, mode
        assert rstd.dtype == torch.float32
    y, rstd = ref.rms_norm_fwd(x.double(), w32, None, 1e-6, "mean_square", "gemma", 0.0, 8)
    assert y.dtype == torch.float64 and rstd.dtype == torch.float64
