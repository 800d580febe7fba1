"""The CPU kernels (``rmsnorm.kernels.cpu``) against the float64 spec with the shared tolerance
rule: every option in pairwise combinations, the shape edge cases, rounding identical to the
reference's, determinism and thread-count independence, autograd through the public API, and the
fallback where numba is missing or broken."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch

import rmsnorm
from rmsnorm import reference as R
from rmsnorm.kernels import cpu
from rmsnorm.testing import assert_close_to_reference

pytestmark = pytest.mark.skipif(not cpu.available(), reason="numba is not installed")

HALF = (torch.bfloat16, torch.float16)
DTYPES = (torch.float32, *HALF)


def _pairwise(factors: dict[str, tuple], valid=lambda case: True) -> list[dict]:
    """A small covering array: every pair of values of any two factors that some valid case can hold
    appears in at least one case. Greedy and deterministic, so test ids are stable."""
    names = list(factors)
    combos = [dict(zip(names, c, strict=True)) for c in itertools.product(*factors.values())]
    combos = [c for c in combos if valid(c)]

    def pairs(case):
        return {(a, repr(case[a]), b, repr(case[b])) for a, b in itertools.combinations(names, 2)}

    todo = set().union(*(pairs(c) for c in combos))
    cases = []
    while todo:
        best = max(combos, key=lambda c: len(pairs(c) & todo))
        cases.append(best)
        todo -= pairs(best)
    return cases


def _case_id(case: dict) -> str:
    def short(v):
        return str(v).replace("torch.", "") if not isinstance(v, tuple) else "x".join(map(str, v))

    return "-".join(short(v) for v in case.values())


def _rows(m: int, n: int, dtype: torch.dtype, layout: str, scale: float = 1.0, shift: float = 0.0):
    """(M, N) random normals · scale + shift in `dtype`, laid out as `layout` (see _relayout)."""
    return _relayout((torch.randn(m, n) * scale + shift).to(dtype), layout)


def _relayout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as t in `layout` (strided rows, every other row, or stride-0 rows)."""
    m, n = t.shape
    if layout == "strided":
        buf = torch.full((m, n + 7), float("nan"), dtype=t.dtype)
        buf[:, 3 : 3 + n] = t
        return buf[:, 3 : 3 + n]
    if layout == "every_other_row":
        buf = torch.full((2 * m, n), float("nan"), dtype=t.dtype)
        buf[::2] = t
        return buf[::2]
    if layout == "broadcast":
        return t[:1].expand(m, n)
    return t


def _check(actual, exact, eager, name, rows=1):
    assert_close_to_reference(actual, exact, eager, name=name, rows=rows)


def _f64(t):
    return None if t is None else t.detach().to(torch.float64)


def _param(n: int, kind: str, dtype: torch.dtype, scale: float = 1.0, layout="contiguous"):
    """weight / bias: None, in the input dtype ("same") or float32 ("fp32"); laid out contiguous,
    as every other element of a buffer ("strided"), one value expanded (stride 0, "expanded") or
    at a storage offset ("offset"), with NaN where a unit-stride read would wrongly land."""
    if kind == "none":
        return None
    t = (torch.randn(n) * scale).to(dtype if kind == "same" else torch.float32)
    if layout == "strided":
        return torch.stack([t, torch.full_like(t, float("nan"))], dim=1).reshape(-1)[::2]
    if layout == "expanded":
        return t[:1].expand(n)
    if layout == "offset":
        return torch.cat([torch.full((3,), float("nan"), dtype=t.dtype), t])[3:]
    return t


# ----------------------------------------------------------------------------------------------
# RMSNorm forward and backward: every option, pairwise
# ----------------------------------------------------------------------------------------------
RMS_FACTORS = {
    "dtype": DTYPES,
    "weight": ("none", "same", "fp32"),
    "bias": (False, True),
    "eps_mode": R.EPS_MODES,
    "casting": R.CASTING_MODES,
    "offset": (0.0, 1.0),
    "partial": (None, 0.29),
    # (M, N): N off powers of two; N = 1; M = 1; M past one d-weight block (32 rows), ragged end
    "shape": ((67, 300), (1, 257), (9, 1), (70, 129)),
    "layout": ("contiguous", "strided", "every_other_row"),
    "params": ("contiguous", "strided", "expanded", "offset"),
}
RMS_CASES = _pairwise(RMS_FACTORS, valid=lambda c: c["offset"] == 0.0 or c["weight"] != "none")


def _rms_inputs(case):
    m, n = case["shape"]
    dt = case["dtype"]
    x = _rows(m, n, dt, case["layout"], scale=2.0, shift=0.5)
    w = _param(n, case["weight"], dt, layout=case["params"])
    if w is not None and case["offset"]:
        w = w * 0.1  # Gemma-style γ near 0 with offset 1
    b = _param(n, "same" if case["bias"] else "none", dt, layout=case["params"])
    k = R.partial_size(n, case["partial"])
    return x, w, b, k


@pytest.mark.parametrize("case", RMS_CASES, ids=_case_id)
def test_rms_norm_forward_and_backward(case):
    x, w, b, k = _rms_inputs(case)
    eps, mode, cast, off = 1e-5, case["eps_mode"], case["casting"], case["offset"]
    m = x.shape[0]
    y, rstd = cpu.rms_norm_fwd(x, w, b, eps, mode, cast, off, k)
    ye, re = R.rms_norm_fwd(x, w, b, eps, mode, cast, off, k)
    y64, r64 = R.rms_norm_fwd(_f64(x), _f64(w), _f64(b), eps, mode, cast, off, k)
    _check(y, y64, ye, "y")
    _check(rstd, r64, re, "rstd")
    # The element-wise part rounds exactly where the reference rounds: same r in, same bits out.
    assert torch.equal(y, R._rms_norm_apply(x, rstd, w, b, cast, off, x.dtype))

    dy = _relayout(torch.randn(x.shape).to(y.dtype), case["layout"])
    dx, dw, db = cpu.rms_norm_bwd(dy, x, w, b, rstd, None, eps, mode, cast, off, k, x.dtype, True)
    ge = R.rms_norm_bwd(dy, x, w, b, re, None, eps, mode, cast, off, k, x.dtype, True)
    g64 = R.rms_norm_bwd(
        _f64(dy), _f64(x), _f64(w), _f64(b), r64, None, eps, mode, cast, off, k, torch.float64
    )
    _check(dx, g64[0], ge[0], "dx")
    _check(dw, g64[1], ge[1], "dweight", rows=m)
    _check(db, g64[2], ge[2], "dbias", rows=m)


ADD_FACTORS = {
    "dtype": DTYPES,
    "residual": ("same", "fp32", "other_half"),
    "weight": ("none", "same", "fp32"),
    "casting": R.CASTING_MODES,
    "eps_mode": R.EPS_MODES,
    "dresidual": (False, True),
    "layout": ("contiguous", "strided"),
}
ADD_CASES = _pairwise(ADD_FACTORS)


def _residual_dtype(case):
    dt = case["dtype"]
    if case["residual"] == "same":
        return dt
    if case["residual"] == "fp32":
        return torch.float32
    return torch.float16 if dt == torch.bfloat16 else torch.bfloat16


@pytest.mark.parametrize("case", ADD_CASES, ids=_case_id)
def test_add_rms_norm_forward_and_backward(case):
    m, n = 45, 200
    dt, rdt = case["dtype"], _residual_dtype(case)
    x = _rows(m, n, dt, case["layout"])
    res = _rows(m, n, rdt, case["layout"], scale=3.0)
    w = _param(n, case["weight"], dt)
    b = _param(n, "same", dt)
    args = (w, b, 1e-6, case["eps_mode"], case["casting"], 0.0, n)
    y, h, rstd = cpu.add_rms_norm_fwd(x, res, *args)
    ye, he, re = R.add_rms_norm_fwd(x, res, *args)
    y64, h64, r64 = R.add_rms_norm_fwd(_f64(x), _f64(res), _f64(w), _f64(b), *args[2:])
    # h is one fp32 add rounded to the residual's dtype: exactly the reference's
    assert h.dtype == rdt and torch.equal(h, he)
    _check(y, y64, ye, "y")
    _check(rstd, r64, re, "rstd")
    assert torch.equal(y, R._rms_norm_apply(h, rstd, w, b, case["casting"], 0.0, dt))

    dy = torch.randn(m, n).to(y.dtype)
    dres = torch.randn(m, n).to(rdt) if case["dresidual"] else None
    bargs = (1e-6, case["eps_mode"], case["casting"], 0.0, n)
    dx, dw, db = cpu.rms_norm_bwd(dy, h, w, b, rstd, dres, *bargs, dt, True)
    ge = R.rms_norm_bwd(dy, h, w, b, re, dres, *bargs, dt, True)
    g64 = R.rms_norm_bwd(
        _f64(dy), _f64(h), _f64(w), _f64(b), r64, _f64(dres), *bargs, torch.float64
    )
    assert dx.dtype == rdt
    _check(dx, g64[0], ge[0], "dx")
    _check(dw, g64[1], ge[1], "dweight", rows=m)
    _check(db, g64[2], ge[2], "dbias", rows=m)


# ----------------------------------------------------------------------------------------------
# LayerNorm forward and backward
# ----------------------------------------------------------------------------------------------
LN_CASES = _pairwise(
    {
        "dtype": DTYPES,
        "weight": ("none", "same", "fp32"),
        "bias": ("none", "same", "fp32"),
        "shape": ((67, 300), (1, 257), (9, 1), (70, 129)),
        "layout": ("contiguous", "strided", "every_other_row"),
        "params": ("contiguous", "strided", "expanded", "offset"),
    }
)


@pytest.mark.parametrize("case", LN_CASES, ids=_case_id)
def test_layer_norm_forward_and_backward(case):
    m, n = case["shape"]
    dt = case["dtype"]
    # a large mean next to the spread: the variance must not come from E[x²] − μ²
    x = _rows(m, n, dt, case["layout"], scale=0.5, shift=30.0)
    lay = case["params"]
    w, b = _param(n, case["weight"], dt, layout=lay), _param(n, case["bias"], dt, layout=lay)
    y, mean, rstd = cpu.layer_norm_fwd(x, w, b, 1e-5)
    ye, me, re = R.layer_norm_fwd(x, w, b, 1e-5)
    y64, m64, r64 = R.layer_norm_fwd(_f64(x), _f64(w), _f64(b), 1e-5)
    _check(y, y64, ye, "y")
    _check(mean, m64, me, "mean")
    _check(rstd, r64, re, "rstd")
    # same statistics in, same bits out as the reference's element-wise ops
    yy = (x.float() - mean[:, None]) * rstd[:, None]
    yy = yy * w.float() if w is not None else yy
    yy = yy + b.float() if b is not None else yy
    assert torch.equal(y, yy.to(dt))

    dy = _relayout(torch.randn(m, n).to(dt), case["layout"])
    dx, dw, db = cpu.layer_norm_bwd(dy, x, w, b, mean, rstd, True)
    ge = R.layer_norm_bwd(dy, x, w, b, me, re, True)
    g64 = R.layer_norm_bwd(_f64(dy), _f64(x), _f64(w), _f64(b), m64, r64, True)
    _check(dx, g64[0], ge[0], "dx")
    _check(dw, g64[1], ge[1], "dweight", rows=m)
    _check(db, g64[2], ge[2], "dbias", rows=m)


# ----------------------------------------------------------------------------------------------
# Shapes and layouts the pairwise cases do not reach
# ----------------------------------------------------------------------------------------------
def test_broadcast_rows_with_stride_zero():
    x = _rows(6, 50, torch.bfloat16, "broadcast")
    assert x.stride(0) == 0
    y, rstd = cpu.rms_norm_fwd(x, None, None, 1e-6, "mean_square", "gemma", 0.0, 50)
    ye, _ = R.rms_norm_fwd(x.contiguous(), None, None, 1e-6, "mean_square", "gemma", 0.0, 50)
    assert torch.equal(y, R._rms_norm_apply(x, rstd, None, None, "gemma", 0.0, x.dtype))
    assert torch.equal(y[0], y[5]) and y.is_contiguous()
    y64, r64 = R.rms_norm_fwd(_f64(x), None, None, 1e-6, "mean_square", "gemma", 0.0, 50)
    _check(y, y64, ye, "y")


@pytest.mark.parametrize("need_weight_grad", [True, False])
def test_empty_rows_and_absent_grads(need_weight_grad):
    for m in (0, 3):
        x, dy = torch.randn(m, 16), torch.randn(m, 16)
        w = torch.randn(16, dtype=torch.bfloat16)
        y, rstd = cpu.rms_norm_fwd(x, w, None, 1e-6, "mean_square", "gemma", 0.0, 16)
        assert y.shape == (m, 16) and rstd.shape == (m,) and rstd.dtype == torch.float32
        dx, dw, db = cpu.rms_norm_bwd(
            dy, x, w, None, rstd, None, 1e-6, "mean_square", "gemma", 0.0, 16, x.dtype,
            need_weight_grad,
        )  # fmt: skip
        assert dx.shape == (m, 16)
        assert db.shape == (0,) and db.dtype == torch.float32
        if need_weight_grad:
            assert dw.shape == (16,) and dw.dtype == torch.bfloat16
            if m == 0:
                assert not dw.float().any()
        else:
            assert dw.shape == (0,) and dw.dtype == torch.float32
        y, mean, rstd = cpu.layer_norm_fwd(x, None, None, 1e-5)
        dx, dw, db = cpu.layer_norm_bwd(dy, x, None, None, mean, rstd, need_weight_grad)
        assert dx.shape == (m, 16) and dw.shape == (0,) and db.shape == (0,)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_rows_and_many_blocks(dtype):
    # N past every vector width / unroll and M past many forward and d-weight blocks
    m, n = 300, 5003
    x = _rows(m, n, dtype, "contiguous")
    w = _param(n, "same", dtype)
    y, rstd = cpu.rms_norm_fwd(x, w, None, 1e-6, "mean_square", "gemma", 0.0, n)
    assert torch.equal(y, R._rms_norm_apply(x, rstd, w, None, "gemma", 0.0, dtype))
    dy = torch.randn(m, n).to(dtype)
    dx, dw, _ = cpu.rms_norm_bwd(
        dy, x, w, None, rstd, None, 1e-6, "mean_square", "gemma", 0.0, n, dtype, True
    )
    _, re = R.rms_norm_fwd(x, w, None, 1e-6, "mean_square", "gemma", 0.0, n)
    _, r64 = R.rms_norm_fwd(_f64(x), _f64(w), None, 1e-6, "mean_square", "gemma", 0.0, n)
    ge = R.rms_norm_bwd(dy, x, w, None, re, None, 1e-6, "mean_square", "gemma", 0.0, n, dtype)
    g64 = R.rms_norm_bwd(
        _f64(dy), _f64(x), _f64(w), None, r64, None, 1e-6, "mean_square", "gemma", 0.0, n,
        torch.float64,
    )  # fmt: skip
    _check(dx, g64[0], ge[0], "dx")
    _check(dw, g64[1], ge[1], "dweight", rows=m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_caller_tensors_stay_resizable(dtype):
    # Tensor.numpy() marks a storage non-resizable for good; FSDP2 frees parameters by resizing
    # their storage to 0, which then failed
    x, dy = torch.randn(300, 300).to(dtype), torch.randn(300, 300).to(dtype)
    w, b = torch.randn(300).to(dtype), torch.randn(300).to(dtype)
    y, rstd = cpu.rms_norm_fwd(x, w, b, 1e-6, "mean_square", "gemma", 0.0, 300)
    grads = cpu.rms_norm_bwd(dy, x, w, b, rstd, dy, 1e-6, "mean_square", "gemma", 0.0, 300, dtype)
    yl, mean, rl = cpu.layer_norm_fwd(x, w, b, 1e-5)
    for t in (x, dy, w, b, y, rstd, *grads, yl, mean, rl):
        t.untyped_storage().resize_(0)


def test_float64_and_mixed_float64_go_to_the_reference():
    x = torch.randn(5, 12, dtype=torch.float64)
    w = torch.randn(12, dtype=torch.float64)
    assert torch.equal(
        cpu.rms_norm_fwd(x, w, None, 1e-6, "rms", "gemma", 0.0, 12)[0],
        R.rms_norm_fwd(x, w, None, 1e-6, "rms", "gemma", 0.0, 12)[0],
    )
    # "llama" with a float64 weight promotes the output to float64
    xf = x.float()
    y, rstd = cpu.rms_norm_fwd(xf, w, None, 1e-6, "mean_square", "llama", 0.0, 12)
    assert y.dtype == torch.float64
    assert torch.equal(y, R.rms_norm_fwd(xf, w, None, 1e-6, "mean_square", "llama", 0.0, 12)[0])
    # "gemma" casts a float64 weight to the fp32 compute dtype and stays on the kernels
    y, _ = cpu.rms_norm_fwd(xf, w, None, 1e-6, "mean_square", "gemma", 0.0, 12)
    assert y.dtype == torch.float32
    assert cpu.layer_norm_fwd(x, None, None, 1e-5)[0].dtype == torch.float64


# ----------------------------------------------------------------------------------------------
# Rounding: bit conversions match torch's, special values included
# ----------------------------------------------------------------------------------------------
def _stored_sum(x: torch.Tensor, residual_dtype: torch.dtype) -> torch.Tensor:
    """h = x + (−0.0) stored in residual_dtype by the kernel: x converted to float32 and rounded to
    residual_dtype, with nothing else in between (adding −0.0 is exact, signed zeros included)."""
    res = torch.full(x.shape, -0.0, dtype=residual_dtype)
    n = x.shape[1]
    _, h, _ = cpu.add_rms_norm_fwd(x, res, None, None, 1e-6, "mean_square", "gemma", 0.0, n)
    return h


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns, except that any NaN matches any NaN (torch's own NaN bits differ between
    its scalar and vector paths)."""
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    ints = {2: torch.int16, 4: torch.int32}
    return torch.equal(a[~nan].view(ints[a.element_size()]), b[~nan].view(ints[b.element_size()]))


@pytest.mark.parametrize("dtype", HALF)
def test_every_half_bit_pattern_converts_exactly(dtype):
    # all 65536 patterns: NaNs, infinities, subnormals, signed zeros
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)[None]
    assert _same_bits(_stored_sum(x, torch.float32), x.float())  # half -> float32
    assert _same_bits(_stored_sum(x, dtype), x)  # and back


@pytest.mark.parametrize("dtype", HALF)
def test_float32_to_half_rounds_like_torch(dtype):
    # rounding ties of the half grid, the overflow threshold, subnormals, special values
    fi = torch.finfo(dtype)
    grid = torch.randn(3000).to(dtype)
    above = torch.nextafter(grid, torch.full_like(grid, float("inf")))
    ties = (grid.float() + above.float()) / 2
    vals = torch.cat(
        [
            torch.randn(4000) * 10.0 ** torch.randint(-9, 6, (4000,)).float(),
            ties,
            torch.nextafter(ties, torch.zeros_like(ties)),
            torch.tensor([fi.max, fi.max * 1.0004, fi.max * 1.001, fi.tiny, fi.tiny / 3, 2e-8]),
            torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -1.0 - 2.0**-9]),
        ]
    )[None]
    assert _same_bits(_stored_sum(vals, dtype), vals.to(dtype))


# ----------------------------------------------------------------------------------------------
# Special rows: all zeros, NaN
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps_mode", R.EPS_MODES)
def test_all_zero_row(eps_mode):
    x = torch.randn(4, 64)
    x[2] = 0.0
    w = torch.randn(64)
    eps = 1e-6
    y, rstd = cpu.rms_norm_fwd(x, w, None, eps, eps_mode, "gemma", 0.0, 64)
    assert not y[2].any() and y.isfinite().all()
    dy = torch.randn(4, 64)
    dx, dw, _ = cpu.rms_norm_bwd(dy, x, w, None, rstd, None, eps, eps_mode, "gemma", 0.0, 64,
                                 x.dtype, True)  # fmt: skip
    assert dx.isfinite().all() and dw.isfinite().all()
    g = dy[2] * w
    # the limit of the derivative at a zero row: dx = g/sqrt(ε) or g/ε (a scale that does not move)
    expected = g / (eps**0.5 if eps_mode == "mean_square" else eps)
    torch.testing.assert_close(dx[2], expected, rtol=1e-6, atol=0)
    y, mean, rstd = cpu.layer_norm_fwd(x, w, None, 1e-5)
    assert not y[2].any()
    dx, dw, _ = cpu.layer_norm_bwd(dy, x, w, None, mean, rstd, True)
    assert dx.isfinite().all() and dw.isfinite().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_stays_in_its_row(dtype):
    x = torch.randn(70, 33).to(dtype)
    x[40, 7] = float("nan")
    dy = torch.randn(70, 33).to(dtype)
    y, rstd = cpu.rms_norm_fwd(x, None, None, 1e-6, "mean_square", "gemma", 0.0, 33)
    dx, _, _ = cpu.rms_norm_bwd(dy, x, None, None, rstd, None, 1e-6, "mean_square", "gemma", 0.0,
                                33, dtype, False)  # fmt: skip
    yl, mean, rl = cpu.layer_norm_fwd(x, None, None, 1e-5)
    dxl, _, _ = cpu.layer_norm_bwd(dy, x, None, None, mean, rl, False)
    for t in (y, dx, yl, dxl):
        bad = t.isnan().any(dim=1)
        assert bad[40] and bad.sum() == 1


# ----------------------------------------------------------------------------------------------
# Determinism and thread-count independence
# ----------------------------------------------------------------------------------------------
def _everything(dtype):
    gen = torch.Generator().manual_seed(1)
    m, n = 257, 300  # 9 d-weight blocks, the last one short
    x = torch.randn(m, n, generator=gen).to(dtype)
    r = torch.randn(m, n, generator=gen).to(dtype)
    dy = torch.randn(m, n, generator=gen).to(dtype)
    w = torch.randn(n, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    y, h, rstd = cpu.add_rms_norm_fwd(x, r, w, b, 1e-6, "rms", "llama", 0.0, n)
    grads = cpu.rms_norm_bwd(dy, h, w, b, rstd, dy, 1e-6, "rms", "llama", 0.0, n, dtype, True)
    yl, mean, rl = cpu.layer_norm_fwd(x, w, b, 1e-5)
    lgrads = cpu.layer_norm_bwd(dy, x, w, b, mean, rl, True)
    return [y, h, rstd, *grads, yl, mean, rl, *lgrads]


def _bitwise_equal(a, b):
    pairs = zip(a, b, strict=True)
    return all(torch.equal(u.view(torch.uint8), v.view(torch.uint8)) for u, v in pairs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_and_independent_of_thread_count(dtype):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the kernels use as many threads as torch does
        first, second = _everything(dtype), _everything(dtype)
        torch.set_num_threads(1)
        single = _everything(dtype)
    finally:
        torch.set_num_threads(before)
    assert _bitwise_equal(first, second)
    assert _bitwise_equal(first, single)


# ----------------------------------------------------------------------------------------------
# Through the public API with autograd
# ----------------------------------------------------------------------------------------------
def _grads(fn, leaves):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum((o.double() * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in outs)
    loss.backward()
    return [o.detach() for o in outs] + [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES)
def test_public_api_autograd_on_the_cpu_backend(dtype):
    shape = (2, 3, 5, 48)  # leading dims are flattened into rows
    x = torch.randn(shape).to(dtype)
    r = torch.randn(shape).to(dtype)
    w = torch.randn(48).to(dtype)
    b = torch.randn(48).to(dtype)
    ops = {
        "rms_norm": (
            lambda x, w, b: rmsnorm.rms_norm(x, 48, w, 1e-6, offset=1.0, bias=b, partial=0.5),
            (x, w, b),
        ),
        "add_rms_norm": (
            lambda x, r, w: rmsnorm.add_rms_norm(x, r, 48, w, casting_mode="llama", eps_mode="rms"),
            (x, r, w),
        ),
        "layer_norm": (lambda x, w, b: rmsnorm.layer_norm(x, 48, w, b), (x, w, b)),
    }
    for name, (fn, leaves) in ops.items():
        with rmsnorm.use_backend("cpu"):
            got = _grads(fn, leaves)
        with rmsnorm.use_backend("reference"):
            eager = _grads(fn, leaves)
            exact = _grads(fn, [t.double() for t in leaves])
        for i, (g, e, e64) in enumerate(zip(got, eager, exact, strict=True)):
            _check(g, e64, e, f"{name} output/grad {i}", rows=30)


def test_auto_picks_the_cpu_kernels():
    from rmsnorm import _backend

    assert _backend.launchers("cpu") is cpu


# ----------------------------------------------------------------------------------------------
# Loading: lazy, and a clean fallback where numba cannot be used
# ----------------------------------------------------------------------------------------------
def test_numba_is_imported_on_first_use_not_on_import():
    code = (
        "import sys, torch, rmsnorm; assert 'numba' not in sys.modules; "
        "from rmsnorm.kernels import cpu; assert cpu.available(); assert 'numba' not in sys.modules"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_without_numba_the_reference_runs():
    code = (
        "import sys; sys.modules['numba'] = None\n"  # as if numba were not installed
        "import torch, rmsnorm\n"
        "from rmsnorm import _backend\n"
        "from rmsnorm.kernels import cpu\n"
        "assert not cpu.available()\n"
        "assert _backend.launchers('cpu').__name__ == 'rmsnorm.reference'\n"
        "x = torch.randn(3, 8, requires_grad=True)\n"
        "rmsnorm.rms_norm(x, 8).sum().backward()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _run(code: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (this checkout's package first on the path)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def test_a_broken_numba_warns_once_and_falls_back():
    code = (
        "import importlib, warnings, torch\n"
        "from rmsnorm import reference as R\n"
        "from rmsnorm.kernels import cpu\n"
        "real = importlib.import_module\n"
        "def broken(name, package=None):\n"
        "    if name == '.launchers':\n"
        "        raise ImportError('numba built for another numpy')\n"
        "    return real(name, package)\n"
        "importlib.import_module = broken\n"
        "x = torch.randn(3, 8)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    y, _ = cpu.rms_norm_fwd(x, None, None, 1e-6, 'mean_square', 'gemma', 0.0, 8)\n"
        "    cpu.rms_norm_fwd(x, None, None, 1e-6, 'mean_square', 'gemma', 0.0, 8)\n"
        "msgs = [w for w in caught if 'CPU kernels are unavailable' in str(w.message)]\n"
        "assert len(msgs) == 1, caught\n"
        "assert not cpu.available() and not cpu.warmup()['available']\n"
        "ref = R.rms_norm_fwd(x, None, None, 1e-6, 'mean_square', 'gemma', 0.0, 8)[0]\n"
        "assert torch.equal(y, ref)\n"
    )
    res = _run(code)
    assert res.returncode == 0, res.stderr


def test_this_process_runs_the_compiled_kernels():
    # the suite would otherwise pass on the reference fallback without noticing
    assert cpu.warmup()["available"]
    assert cpu._launchers().__name__ == "rmsnorm.kernels.cpu.launchers"


# ----------------------------------------------------------------------------------------------
# Parameters of any layout, outputs on the inputs' device
# ----------------------------------------------------------------------------------------------
def _param_layouts(n: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    base = torch.randn(n).to(dtype)
    every_other = torch.zeros(2 * n, dtype=dtype)
    every_other[::2] = base
    shifted = torch.zeros(n + 3, dtype=dtype)
    shifted[3:] = base
    return {
        "every_other": every_other[::2],
        "offset": shifted[3:],
        "expanded": base[:1].expand(n),
        "contiguous": base,
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_strided_offset_and_expanded_parameters(dtype):
    # weights and biases are read with their stride: the same values as a contiguous copy
    m, n = 70, 96
    x = torch.randn(m, n)
    dy = torch.randn(m, n)
    for name, w in _param_layouts(n, dtype).items():
        b = w.flip(0) if name != "expanded" else w
        wc, bc = w.contiguous(), b.contiguous()
        for cast, off in (("gemma", 0.0), ("none", 1.0)):
            args = (1e-6, "mean_square", cast, off, n)
            y, rstd = cpu.rms_norm_fwd(x, w, b, *args)
            assert torch.equal(y, cpu.rms_norm_fwd(x, wc, bc, *args)[0]), (name, cast)
            assert torch.equal(y, R._rms_norm_apply(x, rstd, wc, bc, cast, off, x.dtype)), name
            got = cpu.rms_norm_bwd(dy, x, w, b, rstd, None, *args, x.dtype, True)
            want = cpu.rms_norm_bwd(dy, x, wc, bc, rstd, None, *args, x.dtype, True)
            assert _bitwise_equal(got, want), (name, cast)
        y, mean, rstd = cpu.layer_norm_fwd(x, w, b, 1e-5)
        assert torch.equal(y, cpu.layer_norm_fwd(x, wc, bc, 1e-5)[0]), name
        got = cpu.layer_norm_bwd(dy, x, w, b, mean, rstd, True)
        assert _bitwise_equal(got, cpu.layer_norm_bwd(dy, x, wc, bc, mean, rstd, True)), name
        exact = R.layer_norm_fwd(x.double(), wc.double(), bc.double(), 1e-5)[0]
        _check(y, exact, R.layer_norm_fwd(x, wc, bc, 1e-5)[0], f"layer_norm y, {name} weight")


def test_outputs_ignore_the_default_device():
    # torch.set_default_device / `with torch.device(...)` redirect torch.empty; the launchers'
    # outputs must stay on the CPU, next to their inputs
    x, dy, w = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)
    want = cpu.rms_norm_fwd(x, w, w, 1e-6, "mean_square", "gemma", 0.0, 32)
    want_ln = cpu.layer_norm_fwd(x, w, w, 1e-5)
    with torch.device("meta"):
        got = cpu.rms_norm_fwd(x, w, w, 1e-6, "mean_square", "gemma", 0.0, 32)
        got_add = cpu.add_rms_norm_fwd(x, x, w, w, 1e-6, "mean_square", "gemma", 0.0, 32)
        grads = cpu.rms_norm_bwd(
            dy, x, w, w, want[1], None, 1e-6, "mean_square", "gemma", 0.0, 32, x.dtype, True
        )
        got_ln = cpu.layer_norm_fwd(x, w, w, 1e-5)
        lgrads = cpu.layer_norm_bwd(dy, x, w, w, want_ln[1], want_ln[2], True)
    for t in (*got, *got_add, *grads, *got_ln, *lgrads):
        assert t.device.type == "cpu"
    assert _bitwise_equal(got, want) and _bitwise_equal(got_ln, want_ln)


# ----------------------------------------------------------------------------------------------
# Threads: torch's settings untouched, Python threads, forked children
# ----------------------------------------------------------------------------------------------
_WORK = (
    "import torch, rmsnorm\n"
    "def work(m=512, n=512):\n"  # 2^18 elements: the work-sharing path where threads allow it
    "    x = torch.randn(m, n, requires_grad=True)\n"
    "    w = torch.randn(n, requires_grad=True)\n"
    "    y = rmsnorm.rms_norm(x, n, w)\n"
    "    y.sum().backward()\n"
    "    rmsnorm.layer_norm(x.detach(), n, w.detach())\n"
    "    return y\n"
)


def test_torch_thread_settings_are_left_as_set():
    # numba's OpenMP threading layer shares libgomp with torch: starting it reset torch's count
    code = _WORK + (
        "for threads in (1, 3, 2, 1):\n"
        "    torch.set_num_threads(threads)\n"
        "    work()\n"
        "    work(2, 64)\n"
        "    assert torch.get_num_threads() == threads, (threads, torch.get_num_threads())\n"
    )
    res = _run(code, timeout=300)
    assert res.returncode == 0, res.stderr


def test_concurrent_calls_from_python_threads():
    import threading

    gen = torch.Generator().manual_seed(3)
    cases = []
    for m, n in ((1, 768), (300, 300), (512, 512), (64, 4096)):
        x = torch.randn(m, n, generator=gen)
        dy = torch.randn(m, n, generator=gen)
        w = torch.randn(n, generator=gen).to(torch.bfloat16)
        cases.append((x, dy, w))

    def run(x, dy, w):
        n = x.shape[1]
        y, rstd = cpu.rms_norm_fwd(x, w, None, 1e-6, "mean_square", "gemma", 0.0, n)
        g = cpu.rms_norm_bwd(dy, x, w, None, rstd, None, 1e-6, "mean_square", "gemma", 0.0, n,
                             x.dtype, True)  # fmt: skip
        yl, mean, rl = cpu.layer_norm_fwd(x, w, w, 1e-5)
        gl = cpu.layer_norm_bwd(dy, x, w, w, mean, rl, True)
        return [y, rstd, *g, yl, mean, rl, *gl]

    want = [run(*c) for c in cases]
    barrier = threading.Barrier(4)
    failures: list[str] = []

    def worker(t: int) -> None:
        barrier.wait()
        for i in range(12):
            c = (t + i) % len(cases)
            if not _bitwise_equal(run(*cases[c]), want[c]):
                failures.append(f"thread {t}, case {c}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not failures, failures


@pytest.mark.parametrize("team", ["openmp", "futex", "lock"])
def test_shared_calls_match_single_threaded_ones(team, monkeypatch):
    # Every call that can be shared is shared (no adaptive choice): on torch's OpenMP threads, or
    # on the pool's helpers sleeping in futex_wait (Linux) or on Python locks (elsewhere). Results
    # are bitwise those of one thread, and the helpers do take blocks.
    from rmsnorm.kernels.cpu import launchers as L

    if team == "openmp" and not L._gomp:
        pytest.skip("torch does not use an OpenMP runtime here")
    if team == "futex" and not L._libc_addresses()[2]:
        pytest.skip("no futex on this platform")
    if team == "lock":
        monkeypatch.setattr(L, "_libc_addresses", lambda: (0, 0, 0))
    monkeypatch.setattr(L, "_pool", None)
    monkeypatch.setattr(L, "ADAPTIVE", False)
    monkeypatch.setattr(L, "USE_OPENMP", team == "openmp")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [_everything(dtype) for dtype in (torch.float32, torch.bfloat16)]
        torch.set_num_threads(2)
        helped = 0
        for _ in range(50):  # the helpers join calls that outlast their wake-up
            got = [_everything(dtype) for dtype in (torch.float32, torch.bfloat16)]
            assert _bitwise_equal(got[0], want[0]) and _bitwise_equal(got[1], want[1])
            if team == "openmp":
                break
            pool = L._pool
            if pool.max_helpers < 1:
                pytest.skip("one core: nothing to share")
            helped = int(pool.block[L.K.HELPED])
            if helped:
                break
    finally:
        torch.set_num_threads(before)
    if team != "openmp":
        assert L._pool.futex == (team == "futex")
        if not helped:  # possible only where another process holds every other core throughout
            pytest.skip("the helpers never got a core in time")


def test_sharing_follows_the_measured_cost():
    # The choice between a shared and a lone call, fed made-up timings: warm-up calls are ignored,
    # the cheaper way wins (sharing within 1.25x), the other is retried at growing intervals and
    # a change of cost turns the choice round.
    from rmsnorm.kernels.cpu.launchers import _Cost

    cost = _Cost()

    def run(calls: int, shared_s: float, alone_s: float) -> list[bool]:
        ways = []
        for _ in range(calls):
            shared = cost.choose()
            cost.record(shared, shared_s if shared else alone_s)
            ways.append(shared)
        return ways

    ways = run(400, shared_s=5.0, alone_s=1.0)  # an oversubscribed machine: sharing is slow
    assert ways[:2] == [True, True]  # warm-up: each way is tried first
    tail = ways[100:]
    assert 0 < sum(tail) <= 3  # alone, with a retry of sharing now and then (every 128-256)
    ways = run(400, shared_s=0.5, alone_s=1.0)  # the machine is quiet again
    assert sum(ways[-200:]) >= 197  # noticed at the next retry; lone calls only as retries
    ways = run(200, shared_s=1.2, alone_s=1.0)  # within 1.25x: still shared
    assert sum(ways[-100:]) >= 99


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_dataloader_workers_forked_after_multithreaded_work_run_the_kernels():
    # A parent that ran multi-threaded torch work and the kernels forks DataLoader workers (which
    # set one torch thread) that call rms_norm: they used to hang. A timeout makes a hang a failure.
    code = _WORK + (
        "import warnings\n"
        "import torch.nn.functional as F\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "torch.set_num_threads(2)\n"
        "a = torch.randn(512, 512)\n"
        "for _ in range(3):\n"
        "    a = F.layer_norm(a @ a, (512,))\n"  # torch's own OpenMP pool, two threads
        "    work()\n"
        "class Rows(Dataset):\n"
        "    def __len__(self):\n"
        "        return 8\n"
        "    def __getitem__(self, i):\n"
        "        g = torch.Generator().manual_seed(i)\n"
        "        x = torch.randn(256, 512, generator=g)\n"
        "        with warnings.catch_warnings():\n"  # no fallback to the reference, no warning
        "            warnings.simplefilter('error')\n"
        "            y = rmsnorm.rms_norm(x, 512)\n"
        "        return y, F.rms_norm(x, (512,))\n"
        "loader = DataLoader(Rows(), batch_size=2, num_workers=2, multiprocessing_context='fork')\n"
        "for y, ref in loader:\n"
        "    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)\n"
        "print('ok')\n"
    )
    res = _run(code, timeout=240)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_keeps_two_threads_and_the_kernels():
    # A plain fork keeps torch's thread count: the child starts its own helper threads (torch's
    # OpenMP pool, by contrast, hangs such a child at its first multi-threaded op)
    code = _WORK + (
        "import os\n"
        "torch.set_num_threads(2)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randn(512, 512, generator=g)\n"
        "want = rmsnorm.rms_norm(x, 512)\n"
        "work()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        # compared through numpy: torch's own multi-threaded ops (torch.equal) hang in such a child
        "    want = want.numpy().tobytes()\n"
        "    ok = all(rmsnorm.rms_norm(x, 512).numpy().tobytes() == want for _ in range(20))\n"
        "    os._exit(0 if ok and torch.get_num_threads() == 2 else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0, status\n"
    )
    res = _run(code, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr


# ----------------------------------------------------------------------------------------------
# Compilation: said once; done ahead of time by warmup(); without a writable cache, in-process
# ----------------------------------------------------------------------------------------------
_COMPILE_CHECK = (
    "import torch, rmsnorm\n"
    "from rmsnorm.kernels import cpu\n"
    "x = torch.randn(8, 64, requires_grad=True)\n"
    "for _ in range(2):\n"
    "    rmsnorm.rms_norm(x, 64).sum().backward()\n"
    "    rmsnorm.layer_norm(x, 64).sum().backward()\n"
    "status = cpu.warmup()\n"
    "assert status['available'], status\n"
    "print('STATUS', status)\n"
)


def test_the_first_compilation_is_announced_once_and_cached(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    first = _run(_COMPILE_CHECK, timeout=600, env=env)
    assert first.returncode == 0, first.stderr
    lines = [line for line in first.stderr.splitlines() if "compiling the CPU kernels" in line]
    assert len(lines) == 1, first.stderr
    assert "once" in lines[0] and str(tmp_path / "cache") in lines[0]
    second = _run(_COMPILE_CHECK, timeout=600, env=env)
    assert second.returncode == 0, second.stderr
    assert "compiling" not in second.stderr and "'compiled': False" in second.stdout


def test_without_a_writable_cache_the_kernels_compile_in_process(tmp_path):
    # A read-only install: the package directory, NUMBA_CACHE_DIR and the user cache directory all
    # refuse writes (paths under a regular file, which fail even for root).
    import shutil

    pkg = tmp_path / "site"
    shutil.copytree(
        os.path.dirname(rmsnorm.__file__), pkg / "rmsnorm",
        ignore=shutil.ignore_patterns("__pycache__"),
    )  # fmt: skip
    (pkg / "rmsnorm" / "kernels" / "cpu" / "__pycache__").write_text("not a directory")
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {
        "PYTHONPATH": str(pkg),
        "PYTHONDONTWRITEBYTECODE": "1",
        "NUMBA_CACHE_DIR": str(blocker / "numba"),
        "XDG_CACHE_HOME": str(blocker / "cache"),
        "HOME": str(blocker),
    }
    res = _run(
        _COMPILE_CHECK + "assert rmsnorm.__file__.startswith(" + repr(str(pkg)) + ")\n",
        timeout=600, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "'compiled': True" in res.stdout and "'cached_in': None" in res.stdout, res.stdout
    lines = [line for line in res.stderr.splitlines() if "rmsnorm:" in line]
    assert len(lines) == 1 and "no writable cache directory" in lines[0], res.stderr


def test_warmup_command():
    pytest.importorskip("typer")
    res = subprocess.run(
        [sys.executable, "-m", "rmsnorm", "warmup"], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr
    assert "rmsnorm warmup: CPU kernels" in res.stdout and "cached in" in res.stdout
