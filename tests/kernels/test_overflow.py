"""Rows whose statistics overflow float32 (Σx² past 3.4e38: |x| from ~4e18 up to 3e38) get the
exact answer on every backend (reference, CPU kernels, Triton kernels in each layout), forward and
backward, RMSNorm (both eps placements, partial k, residual add) and LayerNorm. torch's own
functions return 0 there; the spec rescales such rows (reference.py, docs/spec.md)."""

from __future__ import annotations

import pytest
import torch

import rmsnorm.reference as R
from launcher_support import target, triton_layouts
from rmsnorm.testing import max_abs_error

# One ordinary row, then rows whose fp32 Σx² overflows although no 16-column chunk's does
# (5e18: the split layout's exchange must notice), up to 3e38 (x − μ overflows too).
SCALES = (1.0, 5e18, 1e19, 1e25, 1e31, 1e37, 3e38)
N = 40
pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning"
)  # NumPy, interpreted kernels
EPS = 1e-5


def _overflowing_rows(dtype):
    """(M, N) rows: random signs × uniform(0.5, 1) × the row's scale, and the scales (M, 1)."""
    g = torch.Generator().manual_seed(7)
    mag = torch.rand(len(SCALES), N, generator=g, dtype=torch.float64) * 0.5 + 0.5
    sign = torch.randint(0, 2, (len(SCALES), N), generator=g).to(torch.float64) * 2 - 1
    sign[-1] = -1.0  # the last row: μ ≈ −2e38, so x − μ at its one positive element is ≈ 5e38
    sign[-1, 0] = 1.0
    c = torch.tensor(SCALES, dtype=torch.float64)[:, None]
    x = (mag * sign * c).to(dtype)
    assert x.isfinite().all()
    ss = x.float().square().sum(-1)
    assert ss[0].isfinite() and ss[1:].isinf().all()  # the rows really overflow float32
    assert x[1].float()[:16].square().sum().isfinite()  # ... and a 16-column chunk does not
    assert (x[-1].float() - x[-1].float().mean()).isinf().any()  # x − μ overflows in one row
    return x, c


def _check(actual, exact, name, c=None, rows=1):
    """actual within one rounding of the output dtype plus the accumulator's (√rows for sums over
    rows) of the float64 result, row by row after scaling row i by c_i (rstd, mean, dx scale with
    the row; y, d weight, d bias do not). Strict: the eager error term is 0."""
    a, e = actual.detach().double(), exact.detach().double()
    if c is not None:
        a, e = a * (c if a.dim() == 2 else c[:, 0]), e * (c if e.dim() == 2 else c[:, 0])
    u_acc = torch.finfo(torch.float32).eps
    tol = e.abs().max().item() * (torch.finfo(actual.dtype).eps + u_acc * rows**0.5)
    err = max_abs_error(a, e)
    assert err <= tol, f"{name}: error {err:.3e} > {tol:.3e}"


BACKENDS = ["reference", "cpu", "triton-single", "triton-loop", "triton-split", "triton-default"]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _backend(name):
    """(launcher module, context manager forcing its layout, device of its tensors)."""
    import contextlib

    backend = target(name.split("-")[0])
    layout = name.partition("-")[2]
    if name == "reference":  # the spec runs on any device: on the GPU where there is one
        return backend.mod, contextlib.nullcontext(), DEVICE
    if layout in ("", "default"):
        if layout and backend.device == "cpu":
            pytest.skip("the interpreter's default config is the single-tile one, tested above")
        return backend.mod, contextlib.nullcontext(), backend.device
    cfg = triton_layouts(N)[layout]
    forced = backend.mod.override(fwd=cfg, bwd=cfg, ln_fwd=cfg, ln_bwd=cfg)
    return backend.mod, forced, backend.device


def _inputs(dtype, device):
    x, c = _overflowing_rows(dtype)
    w = (torch.rand(N, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype)
    bias = torch.full((N,), 0.25, dtype=dtype)
    dy = torch.randn(x.shape[0], N, generator=torch.Generator().manual_seed(2)).to(dtype)
    return x.to(device), c.to(device), w.to(device), bias.to(device), dy.to(device)


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@DTYPES
@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_rows_whose_sum_of_squares_overflows(backend, dtype):
    B, layout, device = _backend(backend)
    x, c, w, bias, dy = _inputs(dtype, device)
    m = x.shape[0]
    x64, w64, b64, dy64 = x.double(), w.double(), bias.double(), dy.double()
    with layout:
        for eps_mode, k in (("mean_square", N), ("rms", N // 2 + 3)):
            opts = R.RMSOptions(EPS, eps_mode, "gemma", 0.0, k)
            y, r = B.rms_norm_fwd(x, w, bias, opts)
            y_x, r_x = R.rms_norm_fwd(x64, w64, b64, opts)
            _check(y, y_x, f"{eps_mode} y")
            _check(r, r_x, f"{eps_mode} rstd", c)
            assert torch.equal(y[1:] == 0, y_x[1:] == 0)  # not torch's zeros
            rin = r_x.float()
            dx, dw, db = B.rms_norm_bwd(dy, x, w, bias, rin, None, opts, dtype, True)
            g_x = R.rms_norm_bwd(dy64, x64, w64, b64, r_x, None, opts, torch.float64, True)
            _check(dx, g_x[0], f"{eps_mode} dx", c)
            _check(dw, g_x[1], f"{eps_mode} dweight", rows=m)
            _check(db, g_x[2], f"{eps_mode} dbias", rows=m)
        # residual add: h = x + residual stays in range; its statistics overflow as x's do
        res = torch.randn(m, N, generator=torch.Generator().manual_seed(3)).to(dtype).to(device)
        opts = R.RMSOptions(EPS, "mean_square", "gemma", 0.0, N)
        y, h, r = B.add_rms_norm_fwd(x, res, w, None, opts)
        assert torch.equal(h, (x.float() + res.float()).to(dtype))
        y_x, r_x = R.rms_norm_fwd(h.double(), w64, None, opts)  # y is RMSNorm of the h returned
        _check(y, y_x, "add y")
        _check(r, r_x, "add rstd", c)


@DTYPES
@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_rows_whose_statistics_overflow(backend, dtype):
    B, layout, device = _backend(backend)
    x, c, w, bias, dy = _inputs(dtype, device)
    m = x.shape[0]
    x64, w64, b64, dy64 = x.double(), w.double(), bias.double(), dy.double()
    with layout:
        y, mean, r = B.layer_norm_fwd(x, w, bias, EPS)
        y_x, mean_x, r_x = R.layer_norm_fwd(x64, w64, b64, EPS)
        _check(y, y_x, "ln y")
        _check(mean, mean_x, "ln mean", 1 / c)
        _check(r, r_x, "ln rstd", c)
        dx, dw, db = B.layer_norm_bwd(dy, x, w, bias, mean_x.float(), r_x.float(), True)
        g_x = R.layer_norm_bwd(dy64, x64, w64, b64, mean_x, r_x, True)
        _check(dx, g_x[0], "ln dx", c)
        _check(dw, g_x[1], "ln dweight", rows=m)
        _check(db, g_x[2], "ln dbias", rows=m)


def test_torch_returns_zeros_where_the_spec_rescales():
    """The documented difference: torch's rms_norm gives 0 for such a row, the spec its value."""
    x, _ = _overflowing_rows(torch.float32)
    y_torch = torch.nn.functional.rms_norm(x, (N,), eps=EPS)
    y, _ = R.rms_norm_fwd(x, None, None, R.RMSOptions(EPS, "mean_square", "gemma", 0.0, N))
    assert not y_torch[1:].any() and y[1:].abs().min() > 0.4
    assert torch.equal(
        y[0],
        R.rms_norm_fwd(x[:1], None, None, R.RMSOptions(EPS, "mean_square", "gemma", 0.0, N))[0][0],
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_inf_and_nan_rows_keep_torchs_results(backend):
    """A row holding inf or NaN is not 'rescaled' into finite numbers: RMSNorm gives what torch
    gives (0 beside an inf, NaN at it; NaN throughout a NaN row), LayerNorm NaN."""
    B, layout, device = _backend(backend)
    x = torch.randn(3, N)
    x[0, 5] = float("inf")
    x[1, 7] = float("nan")
    x[2, 9] = -float("inf")
    x = x.to(device)
    with layout:
        y, _ = B.rms_norm_fwd(x, None, None, R.RMSOptions(EPS, "mean_square", "gemma", 0.0, N))
        y_t = torch.nn.functional.rms_norm(x, (N,), eps=EPS)
        assert torch.equal(y.isnan(), y_t.isnan()) and torch.equal(y.nan_to_num(), y_t.nan_to_num())
        y, _, _ = B.layer_norm_fwd(x, None, None, EPS)
        assert y.isnan().all()
