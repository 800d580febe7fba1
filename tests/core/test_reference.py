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
    opts = ref.RMSOptions(eps, eps_mode, "gemma", offset, k)
    y_ref, rstd = ref.rms_norm_fwd(x.detach(), wd, bd, opts)
    torch.testing.assert_close(y_ref, y.detach(), rtol=1e-12, atol=1e-12)
    dy = torch.randn(m, n, dtype=torch.float64)
    inputs = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(y, inputs, dy)
    dx, dw, db = ref.rms_norm_bwd(dy, x.detach(), w, b, rstd, None, opts, torch.float64)
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
    opts = ref.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 9)
    y2, h2, rstd = ref.add_rms_norm_fwd(x.detach(), res.detach(), w.detach(), None, opts)
    torch.testing.assert_close(y2, y.detach())
    dx, dw, _ = ref.rms_norm_bwd(dy, h2, w, None, rstd, dh, opts, torch.float64)
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
    opts = ref.RMSOptions(eps, eps_mode, "gemma", 0.0, 8)
    y, rstd = ref.rms_norm_fwd(x, None, None, opts)
    assert torch.equal(y[0], torch.zeros(8, dtype=torch.float64))
    dy = torch.randn(2, 8, dtype=torch.float64)
    dx, _, _ = ref.rms_norm_bwd(dy, x, None, None, rstd, None, opts, torch.float64)
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
        y, rstd = ref.rms_norm_fwd(x, w32, None, ref.RMSOptions(1e-6, "mean_square", mode, 0.0, 8))
        assert y.dtype == expected, mode
        assert rstd.dtype == torch.float32
    opts = ref.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 8)
    y, rstd = ref.rms_norm_fwd(x.double(), w32, None, opts)
    assert y.dtype == torch.float64 and rstd.dtype == torch.float64


# ------------------------------------------------------------------------------------------------
# Grouped and gated RMSNorm
# ------------------------------------------------------------------------------------------------
ACTIVATIONS = {"silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid}


def _gated_autograd(x, z, w, b, eps, eps_mode, offset, k, g, norm_before_gate, activation):
    """Grouped and gated RMSNorm written directly from the formulas (float64), for autograd: each
    group of g is a row of its own, the gate multiplies after the norm or before it."""
    act = ACTIVATIONS[activation]
    v = x * act(z) if z is not None and not norm_before_gate else x
    vg = v.reshape(*v.shape[:-1], -1, g)
    ms = vg[..., :k].square().mean(-1, keepdim=True)
    r = torch.rsqrt(ms + eps) if eps_mode == "mean_square" else 1 / (ms.sqrt() + eps)
    y = (vg * r).reshape(x.shape)
    if w is not None:
        y = y * (offset + w)
    if b is not None:
        y = y + b
    return y * act(z) if z is not None and norm_before_gate else y


# (M, N, g, k, weight, bias, offset, gate): groups, partial per group, k = 1, no weight, bias with
# the Gemma offset, no gate (grouped RMSNorm alone)
GATED_CASES = [
    (3, 12, 12, 12, True, False, 0.0, True),  # one group: the gated norm of Qwen3-Next / Mamba2
    (4, 12, 4, 4, True, True, 1.0, True),  # three groups, bias, offset
    (2, 12, 6, 3, True, False, 0.0, True),  # partial inside each group
    (3, 10, 5, 1, False, False, 0.0, True),  # k = 1, no weight
    (3, 12, 3, 3, True, True, -0.5, False),  # groups without a gate
]


@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("eps_mode", EPS_MODES)
@pytest.mark.parametrize("case", GATED_CASES)
def test_gated_backward_matches_autograd(case, eps_mode, norm_before_gate, activation):
    m, n, g, k, has_w, has_b, offset, has_z = case
    f64 = dict(dtype=torch.float64, requires_grad=True)
    x, z = torch.randn(m, n, **f64), (torch.randn(m, n, **f64) if has_z else None)
    w = torch.randn(n, **f64) if has_w else None
    b = torch.randn(n, **f64) if has_b else None
    eps = 1e-3
    y = _gated_autograd(x, z, w, b, eps, eps_mode, offset, k, g, norm_before_gate, activation)
    dy, dres = torch.randn(m, n, dtype=torch.float64), torch.randn(m, n, dtype=torch.float64)
    inputs = [t for t in (x, z, w, b) if t is not None]
    names = [s for s, t in zip("xzwb", (x, z, w, b), strict=True) if t is not None]
    grads = dict.fromkeys("xzwb")
    grads.update(zip(names, torch.autograd.grad(y, inputs, dy), strict=True))
    det = [None if t is None else t.detach() for t in (x, z, w, b)]
    gating = ref.GateOptions(g, norm_before_gate, activation)
    for mode in CASTING:  # in float64 every casting mode is the same function
        opts = ref.RMSOptions(eps, eps_mode, mode, offset, k)
        y_ref, rstd = ref.gated_rms_norm_fwd(*det, opts, gating)
        assert rstd.shape == (m * n // g,)
        torch.testing.assert_close(y_ref, y.detach(), rtol=1e-12, atol=1e-12)
        dx, dz, dw, db = ref.gated_rms_norm_bwd(dy, *det, rstd, dres, opts, gating, torch.float64)
        torch.testing.assert_close(dx, grads["x"] + dres, rtol=1e-10, atol=1e-12)
        for got, name in ((dz, "z"), (dw, "w"), (db, "b")):
            if grads[name] is None:
                assert got.numel() == 0, name
            else:
                torch.testing.assert_close(got, grads[name], rtol=1e-10, atol=1e-12)


def test_gated_all_zero_group_is_finite_both_orders():
    x = torch.randn(2, 8, dtype=torch.float64)
    x[0, :4] = 0.0  # one all-zero group
    z = torch.randn(2, 8, dtype=torch.float64)
    dy = torch.randn(2, 8, dtype=torch.float64)
    for eps_mode in EPS_MODES:
        for nbg in (True, False):
            args = ref.RMSOptions(1e-4, eps_mode, "gemma", 0.0, 4), ref.GateOptions(4, nbg, "silu")
            y, rstd = ref.gated_rms_norm_fwd(x, z, None, None, *args)
            assert torch.equal(y[0, :4], torch.zeros(4, dtype=torch.float64))
            grads = ref.gated_rms_norm_bwd(dy, x, z, None, None, rstd, None, *args, torch.float64)
            assert all(t.isfinite().all() for t in grads)


def test_groups_are_normalized_on_their_own():
    x = torch.randn(3, 5, 12, dtype=torch.float64) * torch.tensor([1.0, 10.0, 0.1]).repeat(4)
    w = torch.randn(12, dtype=torch.float64)
    y = ref.rms_norm(x, w, 1e-6, group_size=4)
    for i in range(3):
        part = slice(4 * i, 4 * i + 4)
        torch.testing.assert_close(y[..., part], ref.rms_norm(x[..., part], w[part], 1e-6))
    # one group of N is the plain norm; partial takes the first ⌊p·g⌋ of each group
    torch.testing.assert_close(ref.rms_norm(x, w, group_size=12), ref.rms_norm(x, w))
    yp = ref.rms_norm(x, None, 0.0, group_size=4, partial=0.5)
    first = x.reshape(3, 5, 3, 4)[..., :2]
    torch.testing.assert_close(
        yp.reshape(3, 5, 3, 4), x.reshape(3, 5, 3, 4) / first.square().mean(-1, True).sqrt()
    )
    with pytest.raises(ValueError, match="group_size"):
        ref.rms_norm(x, w, group_size=5)


def test_grouped_add_rms_norm_is_add_then_grouped_norm():
    x = torch.randn(4, 12, dtype=torch.bfloat16)
    res = torch.randn(4, 12)
    w = torch.randn(12)
    y, h = ref.add_rms_norm(x, res, w, 1e-6, casting_mode="llama", group_size=6)
    assert torch.equal(h, (x.float() + res))
    opts, gating = (
        ref.RMSOptions(1e-6, "mean_square", "llama", 0.0, 6),
        ref.GateOptions(6, True, "silu"),
    )
    expected, _ = ref.gated_rms_norm_fwd(h, None, w, None, opts, gating, torch.bfloat16)
    assert torch.equal(y, expected) and y.dtype == torch.float32


def _literal_gated(x, z, w, eps, mode, norm_before_gate, act):
    """Each casting mode's rounding order spelled out with torch operations on one group (the
    way the Hugging Face classes write them for "gemma" and "llama")."""
    a = act(z.float())
    if mode == "none":
        if not norm_before_gate:
            x = x * act(z.float()).to(x.dtype)
        r = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)
        n = x * r * w.to(x.dtype)
        return n * a.to(x.dtype) if norm_before_gate else n
    v = x.float() * a if not norm_before_gate else x.float()
    xhat = v * torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)
    if mode == "gemma":
        n = xhat * w.float()
        return (n * a if norm_before_gate else n).to(x.dtype)
    n = w * xhat.to(x.dtype)  # llama: x̂ rounded to the input dtype, × weight in promote(x, w)
    return (n * a).to(x.dtype) if norm_before_gate else n


@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("mode", CASTING)
@pytest.mark.parametrize("wdtype", [None, torch.float32])  # the input's dtype, or fp32 weights
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gated_rounding_order_per_casting_mode(dtype, wdtype, mode, norm_before_gate, activation):
    x = torch.randn(6, 16).to(dtype)
    z = (torch.randn(6, 16) * 2).to(dtype)
    w = (torch.randn(16) * 0.5 + 1).to(wdtype or dtype)
    opts = ref.RMSOptions(1e-3, "mean_square", mode, 0.0, 16)
    y, rstd = ref.gated_rms_norm_fwd(
        x, z, w, None, opts, ref.GateOptions(None, norm_before_gate, activation)
    )
    expected = _literal_gated(x, z, w, 1e-3, mode, norm_before_gate, ACTIVATIONS[activation])
    assert y.dtype == expected.dtype == ref.gated_output_dtype(dtype, w, mode, norm_before_gate)
    assert rstd.dtype == torch.float32
    assert torch.equal(y, expected)


# Roundings to the input dtype on the way to one output element, at most: "gemma" the output;
# "llama" x̂, offset + γ, the weight product and the gate product; "none" act(z), r, x·r (or
# x·act(z)), offset + γ, the weight product and the gate product.
_MODE_ROUNDINGS = {"gemma": 1, "llama": 4, "none": 6}


@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("mode", CASTING)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gated_spec_in_low_precision_against_float64(dtype, mode, norm_before_gate):
    """Forward: each element within its mode's roundings (each at most half an ulp of the input
    dtype, so c/2 relative for c roundings; in absolute terms below the smallest normal number,
    where fp16 outputs of silu(z ≈ −10) land) plus 8 float32 ulps for the compute dtype's own
    operations (sum of squares, rsqrt, offset, activation, three products) of the float64 value;
    the written-out backward
    within the shared tolerance rule against float64, eager being autograd of the spec's
    forward."""
    from rmsnorm.testing import assert_close_to_reference

    m, n, g = 64, 24, 8
    x = (torch.randn(m, n) * torch.logspace(-2, 2, m).unsqueeze(1)).to(dtype)
    z, w, b = (torch.randn(m, n) * 2).to(dtype), (torch.randn(n) + 1).to(dtype), None
    args = (
        ref.RMSOptions(1e-5, "mean_square", mode, 1.0, g),
        ref.GateOptions(g, norm_before_gate, "silu"),
    )
    y, rstd = ref.gated_rms_norm_fwd(x, z, w, b, *args)
    f64 = [t.double() for t in (x, z, w)]
    y64, rstd64 = ref.gated_rms_norm_fwd(*f64, b, *args)
    u, tiny = torch.finfo(dtype).eps, torch.finfo(dtype).tiny
    c = _MODE_ROUNDINGS[mode]
    bound = (c * u / 2 + 8 * torch.finfo(torch.float32).eps) * y64.abs() + c * tiny
    assert ((y.double() - y64).abs() <= bound).all()
    # backward
    dy = torch.randn(m, n).to(dtype)
    got = ref.gated_rms_norm_bwd(dy, x, z, w, b, rstd, None, *args, dtype)
    exact = ref.gated_rms_norm_bwd(dy.double(), *f64, b, rstd64, None, *args, torch.float64)
    xs, zs, ws = (t.clone().requires_grad_() for t in (x, z, w))
    y_eager, _ = ref.gated_rms_norm_fwd(xs, zs, ws, b, *args)
    eager = torch.autograd.grad(y_eager, (xs, zs, ws), dy)
    assert got[3].numel() == 0  # no bias
    for name, a, e, ea, rows in zip(
        ("dx", "dz", "dw"), got[:3], exact[:3], eager, (1, 1, m), strict=True
    ):
        assert_close_to_reference(a, e, ea, name=f"{mode} {name}", rows=rows)


def test_gated_output_dtypes():
    x, w32 = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8)
    z = torch.randn(4, 8, dtype=torch.bfloat16)
    for mode in CASTING:
        for nbg in (True, False):
            opts = ref.RMSOptions(1e-6, "mean_square", mode, 0.0, 8)
            y, _ = ref.gated_rms_norm_fwd(x, z, w32, None, opts, ref.GateOptions(None, nbg, "silu"))
            # the gate product last: the input dtype; the weight product last: as rms_norm
            last_weight = mode == "llama" and not nbg
            assert y.dtype == (torch.float32 if last_weight else torch.bfloat16), (mode, nbg)
    # an fp64 gate is read in the input's compute dtype (fp32 here), as the HF classes do
    args = ref.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 8), ref.GateOptions(None, True, "silu")
    y64, _ = ref.gated_rms_norm_fwd(x, z.double(), None, None, *args)
    y32, _ = ref.gated_rms_norm_fwd(x, z.float(), None, None, *args)
    assert torch.equal(y64, y32)


def test_activation_derivatives():
    z = torch.linspace(-30, 30, 601, dtype=torch.float64, requires_grad=True)
    for name, act in ACTIVATIONS.items():
        (expected,) = torch.autograd.grad(act(z).sum(), z)
        torch.testing.assert_close(ref.gate_activation_grad(z.detach(), name), expected)
        assert torch.equal(ref.gate_activation(z.detach(), name), act(z.detach()))
    with pytest.raises(ValueError, match="activation"):
        ref.gate_activation(z, "gelu")


def test_the_eps_form_is_one_function_with_the_backwards_limit_at_zero():
    ms = torch.tensor([0.0, 0.25, 4.0, float("nan")], dtype=torch.float64, requires_grad=True)
    r_ms = ref.rstd_from_mean_square(ms, 1e-2, "mean_square")
    r_rms = ref.rstd_from_mean_square(ms, 1e-2, "rms")
    with torch.no_grad():
        assert torch.allclose(r_ms[:3], (ms[:3] + 1e-2).rsqrt())
        assert torch.allclose(r_rms[:3], 1 / (ms[:3].sqrt() + 1e-2))
        assert r_ms[3].isnan() and r_rms[3].isnan()  # NaN rows stay NaN
    (g,) = torch.autograd.grad(r_rms[:3].sum(), ms)
    assert g[0] == 0 and g[:3].isfinite().all()  # sqrt's derivative at 0 taken as its limit, 0
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    opts = ref.RMSOptions(1e-2, "rms", "gemma", 0.0, 2)
    assert torch.equal(
        ref.rms_rstd(x, opts), ref.rstd_from_mean_square(x.square().mean(-1), *opts[:2])
    )
    for check, name in (
        (ref.check_eps_mode, "eps_mode"),
        (ref.check_casting_mode, "casting_mode"),
        (ref.check_activation, "activation"),
    ):
        with pytest.raises(ValueError, match=f"^op: {name} must be one of .*, got 'x'$"):
            check("x", "op: ")
