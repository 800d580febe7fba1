"""The Triton kernels against the spec (rmsnorm.reference) with the shared tolerance rule.

Without a GPU every test runs on CPU tensors under TRITON_INTERPRET=1 (set by conftest), with small
shapes and few programs; with a GPU the same tests run natively on CUDA tensors, plus the tests
marked ``gpu`` (opcheck, torch.compile, CUDA graphs, > 2^31 elements, large N).
"""

from __future__ import annotations

import itertools
import math
import os

import pytest
import torch

import rmsnorm
import rmsnorm.reference as R
from rmsnorm.testing import assert_close_to_reference

triton = pytest.importorskip("triton")
T = pytest.importorskip("rmsnorm.kernels.triton")
from rmsnorm.kernels.triton import Config, _config, override  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
EPS = 1e-5


@pytest.fixture(autouse=True)
def _triton_backend():
    with rmsnorm.use_backend("triton"):
        yield


def _d(t):
    return None if t is None else t.detach().to(torch.float64)


def _close(actual, expected, eager, name, rows=1):
    assert_close_to_reference(actual, expected, eager, name=name, rows=rows)


def _rand(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
    return (torch.randn(*shape, dtype=torch.float32) * scale + shift).to(dtype).to(DEVICE)


# ----------------------------------------------------------------------------------------------
# Every RMSNorm option, chosen pairwise (all pairs of values of any two options appear together in
# some case) instead of the full cross product: 12–14 cases instead of ~3,500.
# ----------------------------------------------------------------------------------------------
_FACTORS = {
    "dtype": (torch.float32, torch.bfloat16, torch.float16, torch.float64),
    "eps_mode": ("mean_square", "rms"),
    "casting": ("gemma", "llama", "none"),
    "weight": ("same", "fp32", None),  # γ in x's dtype, in fp32, or absent
    "offset": (0.0, 1.0),
    "bias": (False, True),
    "partial": (None, 0.3),
    "residual": (None, "same", "fp32"),  # add_rms_norm with a residual in x's dtype or fp32
    "need_wgrad": (True, False),
}


def _valid(case: dict) -> bool:
    return not (case["offset"] != 0.0 and case["weight"] is None)


def _pairwise(factors: dict, valid) -> list[dict]:
    """A deterministic greedy covering array: repeatedly take the valid case covering the most
    value pairs not yet covered (AETG-style, over the full product, which is small here)."""
    names = list(factors)
    every = [dict(zip(names, vals, strict=True)) for vals in itertools.product(*factors.values())]
    every = [c for c in every if valid(c)]

    def pairs(c):
        return {((a, repr(c[a])), (b, repr(c[b]))) for a, b in itertools.combinations(names, 2)}

    covers = [pairs(c) for c in every]
    todo = set().union(*covers)
    chosen = []
    while todo:
        i = max(range(len(every)), key=lambda i: len(covers[i] & todo))
        chosen.append(every[i])
        todo -= covers[i]
    return chosen


_CASES = _pairwise(_FACTORS, _valid)


def _case_id(c: dict) -> str:
    return "-".join(
        [str(c["dtype"])[6:], c["eps_mode"], c["casting"], f"w{c['weight']}", f"o{c['offset']:g}",
         "b" if c["bias"] else "nob", f"p{c['partial']}", f"r{c['residual']}",
         "wg" if c["need_wgrad"] else "nowg"]
    )  # fmt: skip


def test_pairwise_table_covers_all_pairs():
    names = list(_FACTORS)
    for a, b in itertools.combinations(names, 2):
        seen = {(repr(c[a]), repr(c[b])) for c in _CASES}
        for va, vb in itertools.product(_FACTORS[a], _FACTORS[b]):
            if _valid({**{n: _FACTORS[n][0] for n in names}, a: va, b: vb}):
                assert (repr(va), repr(vb)) in seen, (a, va, b, vb)


def _rms_inputs(c: dict, m: int, n: int):
    dt = c["dtype"]
    x = _rand(m, n, dtype=dt)
    wdt = {"same": dt, "fp32": torch.float32, None: None}[c["weight"]]
    w = None if wdt is None else _rand(n, dtype=wdt, scale=0.5, shift=0.5 - c["offset"])
    b = _rand(n, dtype=w.dtype if w is not None else dt, scale=0.1) if c["bias"] else None
    rdt = {"same": dt, "fp32": torch.float32, None: None}[c["residual"]]
    res = None if rdt is None else _rand(m, n, dtype=rdt)
    return x, w, b, res


@pytest.mark.parametrize("c", _CASES, ids=[_case_id(c) for c in _CASES])
def test_rms_norm_options(c):
    """Forward (y, h, rstd) and backward (dx, dw, db) of the launchers for one option combination,
    at a non-power-of-two N."""
    m, n = 11, 67
    x, w, b, res = _rms_inputs(c, m, n)
    k = R.partial_size(n, c["partial"])
    opts = (EPS, c["eps_mode"], c["casting"], c["offset"], k)
    if res is None:
        y, rstd = T.rms_norm_fwd(x, w, b, *opts)
        y_e, rstd_e = R.rms_norm_fwd(x, w, b, *opts)
        y_x, rstd_x = R.rms_norm_fwd(_d(x), _d(w), _d(b), *opts)
        xin, dres = x, None
    else:
        y, h, rstd = T.add_rms_norm_fwd(x, res, w, b, *opts)
        y_e, h_e, rstd_e = R.add_rms_norm_fwd(x, res, w, b, *opts)
        y_x, h_x, rstd_x = R.add_rms_norm_fwd(_d(x), _d(res), _d(w), _d(b), *opts)
        _close(h, h_x, h_e, "h")
        xin, dres = h_e, _rand(m, n, dtype=res.dtype)
    _close(y, y_x, y_e, "y")
    _close(rstd, rstd_x, rstd_e, "rstd")

    # Backward from the spec's own saved tensors, so only the backward's error is measured.
    dy = _rand(m, n, dtype=y_e.dtype)
    r_in = rstd_x.to(rstd_e.dtype)
    args = (xin, w, b, r_in, dres, *opts, x.dtype, c["need_wgrad"])
    got = T.rms_norm_bwd(dy, *args)
    eager = R.rms_norm_bwd(dy, *args)
    exact = R.rms_norm_bwd(
        _d(dy), _d(xin), _d(w), _d(b), _d(r_in), _d(dres), *opts, torch.float64,
        c["need_wgrad"],
    )  # fmt: skip
    _close(got[0], exact[0], eager[0], "dx")
    _close(got[1], exact[1], eager[1], "dweight", rows=m)
    _close(got[2], exact[2], eager[2], "dbias", rows=m)


# ----------------------------------------------------------------------------------------------
# Shapes and layouts
# ----------------------------------------------------------------------------------------------
def _check_all_ops(x, w, b, *, eps_mode="mean_square", k=None, res=None, dtype_in=None):
    """rms_norm / add_rms_norm / layer_norm forward + backward launchers on x vs the spec."""
    m, n = x.shape
    k = n if k is None else k
    opts = (EPS, eps_mode, "gemma", 0.0, k)
    if res is None:
        y, rstd = T.rms_norm_fwd(x, w, b, *opts)
        y_e, rstd_e = R.rms_norm_fwd(x, w, b, *opts)
        y_x, rstd_x = R.rms_norm_fwd(_d(x), _d(w), _d(b), *opts)
        xin, dres = x, None
    else:
        y, h, rstd = T.add_rms_norm_fwd(x, res, w, b, *opts)
        y_e, h_e, rstd_e = R.add_rms_norm_fwd(x, res, w, b, *opts)
        y_x, h_x, rstd_x = R.add_rms_norm_fwd(_d(x), _d(res), _d(w), _d(b), *opts)
        _close(h, h_x, h_e, "h")
        xin, dres = h_e, _rand(m, n, dtype=res.dtype)
    _close(y, y_x, y_e, "y")
    _close(rstd, rstd_x, rstd_e, "rstd")
    dy = _rand(m, n, dtype=y.dtype)
    r_in = rstd_x.to(rstd_e.dtype)
    args = (xin, w, b, r_in, dres, *opts, x.dtype, True)
    got, eager = T.rms_norm_bwd(dy, *args), R.rms_norm_bwd(dy, *args)
    exact = R.rms_norm_bwd(_d(dy), _d(xin), _d(w), _d(b), _d(r_in), _d(dres), *opts,
                           torch.float64, True)  # fmt: skip
    for a, e, g, name in zip(got, exact, eager, ("dx", "dweight", "dbias"), strict=True):
        _close(a, e, g, name, rows=m if name != "dx" else 1)

    y, mean, rstd = T.layer_norm_fwd(x, w, b, EPS)
    y_e, mean_e, rstd_e = R.layer_norm_fwd(x, w, b, EPS)
    y_x, mean_x, rstd_x = R.layer_norm_fwd(_d(x), _d(w), _d(b), EPS)
    for a, e, g, name in ((y, y_x, y_e, "ln y"), (mean, mean_x, mean_e, "ln mean"),
                          (rstd, rstd_x, rstd_e, "ln rstd")):  # fmt: skip
        _close(a, e, g, name)
    dy = _rand(m, n, dtype=x.dtype)
    mu_in, r_in = mean_x.to(mean_e.dtype), rstd_x.to(rstd_e.dtype)
    got = T.layer_norm_bwd(dy, x, w, b, mu_in, r_in, True)
    eager = R.layer_norm_bwd(dy, x, w, b, mu_in, r_in, True)
    exact = R.layer_norm_bwd(_d(dy), _d(x), _d(w), _d(b), _d(mu_in), _d(r_in), True)
    for a, e, g, name in zip(got, exact, eager, ("ln dx", "ln dweight", "ln dbias"), strict=True):
        _close(a, e, g, name, rows=m if name != "ln dx" else 1)


@pytest.mark.parametrize(
    "m, n",
    [
        (1, 1),  # a single element: rstd of one value, N below any vector width
        (1, 4096),  # one decoding row
        (3, 1000),  # non-power-of-two N, masked tail inside one tile
        (2, 129),  # N just past a power of two (128): a mostly-empty second half of the tile
        (130, 16),  # more row blocks than programs: the persistent loop runs several times
    ],
)
def test_shapes(m, n):
    x = _rand(m, n, dtype=torch.bfloat16)
    w = _rand(n, dtype=torch.bfloat16, shift=1.0)
    b = _rand(n, dtype=torch.bfloat16, scale=0.1)
    _check_all_ops(x, w, b)


@pytest.mark.parametrize(
    "has_w, has_b, need",
    [(False, False, True), (True, False, True), (False, True, True), (True, True, False)],
)
def test_layer_norm_optional_affine(has_w, has_b, need):
    """LayerNorm with each of weight / bias optional, and without parameter gradients."""
    m, n = 9, 40
    x = _rand(m, n, dtype=torch.bfloat16, shift=3.0)
    w = _rand(n, dtype=torch.bfloat16, shift=1.0) if has_w else None
    b = _rand(n, dtype=torch.bfloat16) if has_b else None
    y, mean, rstd = T.layer_norm_fwd(x, w, b, EPS)
    y_e, mean_e, rstd_e = R.layer_norm_fwd(x, w, b, EPS)
    _close(y, R.layer_norm_fwd(_d(x), _d(w), _d(b), EPS)[0], y_e, "y")
    dy = _rand(m, n, dtype=torch.bfloat16)
    got = T.layer_norm_bwd(dy, x, w, b, mean_e, rstd_e, need)
    eager = R.layer_norm_bwd(dy, x, w, b, mean_e, rstd_e, need)
    exact = R.layer_norm_bwd(_d(dy), _d(x), _d(w), _d(b), _d(mean_e), _d(rstd_e), need)
    for a, e, g, name in zip(got, exact, eager, ("dx", "dweight", "dbias"), strict=True):
        assert a.shape == g.shape and a.dtype == g.dtype, name
        _close(a, e, g, name, rows=m if name != "dx" else 1)


def test_zero_rows():
    """M = 0 launches nothing; d weight / d bias of no rows are zeros."""
    x = _rand(0, 32)
    w, b = _rand(32), _rand(32)
    y, rstd = T.rms_norm_fwd(x, w, b, EPS, "mean_square", "gemma", 0.0, 32)
    assert y.shape == (0, 32) and rstd.shape == (0,)
    y, h, rstd = T.add_rms_norm_fwd(x, x, w, b, EPS, "mean_square", "gemma", 0.0, 32)
    assert y.shape == h.shape == (0, 32)
    dx, dw, db = T.rms_norm_bwd(x, x, w, b, rstd, None, EPS, "mean_square", "gemma", 0.0, 32,
                                x.dtype, True)  # fmt: skip
    assert dx.shape == (0, 32) and torch.equal(dw, torch.zeros_like(w))
    assert torch.equal(db, torch.zeros_like(b))
    y, mean, rstd = T.layer_norm_fwd(x, w, b, EPS)
    dx, dw, db = T.layer_norm_bwd(x, x, w, b, mean, rstd, True)
    assert torch.equal(dw, torch.zeros_like(w)) and torch.equal(db, torch.zeros_like(b))


def _loop(block_n):
    return Config(2, block_n, 4, loop=True, programs=3)


def _split(block_n, n):
    return Config(2, block_n, 4, split=-(-n // block_n), programs=2 * -(-n // block_n))


@pytest.mark.parametrize(
    "layout, n",
    [
        ("loop", 33),  # 16-column blocks: 2 full blocks and a 1-column tail
        ("loop", 48),  # N an exact multiple of the block: no tail
        ("split", 33),  # 3 cooperating programs, the last holding 1 column
        ("split", 64),  # 4 full chunks
    ],
)
def test_wide_row_layouts(layout, n):
    """The looped and split paths (used on GPU for rows longer than a register tile) forced at
    small N, with a residual in fp32, the "rms" eps placement, partial k across block edges, and a
    large mean (LayerNorm's block-wise variance merge must stay exact)."""
    cfg = _loop(16) if layout == "loop" else _split(16, n)
    m = 7
    x = _rand(m, n, dtype=torch.bfloat16, shift=50.0)
    w = _rand(n, dtype=torch.bfloat16, shift=1.0)
    b = _rand(n, dtype=torch.bfloat16, scale=0.1)
    res = _rand(m, n, dtype=torch.float32)
    with override(fwd=cfg, bwd=cfg, ln_fwd=cfg, ln_bwd=cfg):
        _check_all_ops(x, w, b, eps_mode="rms", k=n // 2 + 3, res=res)


def test_one_row_block_per_program():
    """The GPU forward default: a grid of one program per row block (no persistent loop, so no
    prefetch), here for every kernel, with rows in several blocks and a masked last block."""
    cfg = Config(8, 64, 4, programs=0)
    m, n = 37, 48
    x = _rand(m, n, dtype=torch.float16)
    w = _rand(n, dtype=torch.float16, shift=1.0)
    b = _rand(n, dtype=torch.float16, scale=0.1)
    with override(fwd=cfg, bwd=cfg, ln_fwd=cfg, ln_bwd=cfg):
        _check_all_ops(x, w, b, res=_rand(m, n, dtype=torch.float16))


def test_strided_rows():
    """Row-strided inputs (a column slice of a wider tensor) are read in place."""
    base = _rand(9, 100, dtype=torch.float16)
    x = base[:, 10:74]  # (9, 64) with row stride 100
    assert x.stride() == (100, 1)
    w = _rand(64, dtype=torch.float16, shift=1.0)
    b = _rand(64, dtype=torch.float16, scale=0.1)
    res_base = _rand(9, 80, dtype=torch.float16)
    _check_all_ops(x, w, b, res=res_base[:, :64])


def _param_layout(t, layout):
    """The same (N,) values as t, laid out as a strided view (every other element), an expanded
    scalar (stride 0; t's first value repeated) or a view at a storage offset."""
    if layout == "strided":
        return torch.stack([t, torch.full_like(t, float("nan"))], dim=1).reshape(-1)[::2]
    if layout == "expanded":
        return t[:1].expand(t.shape[0])
    assert layout == "offset"
    return torch.cat([torch.full((5,), float("nan"), dtype=t.dtype, device=t.device), t])[5:]


@pytest.mark.parametrize("layout", ["single", "loop", "split"])
@pytest.mark.parametrize("param", ["strided", "expanded", "offset"])
def test_parameter_layouts(param, layout):
    """Weights and biases that are strided, expanded (stride 0) or at a storage offset are read as
    their values, by every launcher in every layout (NaN sits where a unit-stride read from the
    view's first element would land)."""
    m, n = 5, 33
    cfg = {"single": Config(2, 64, 4, programs=2), "loop": _loop(16), "split": _split(16, n)}
    x = _rand(m, n, dtype=torch.bfloat16)
    w = _param_layout(_rand(n, dtype=torch.float32, shift=1.0), param)
    b = _param_layout(_rand(n, dtype=torch.float32, scale=0.1), param)
    assert param != "strided" or w.stride() == (2,)
    with override(fwd=cfg[layout], bwd=cfg[layout], ln_fwd=cfg[layout], ln_bwd=cfg[layout]):
        _check_all_ops(x, w, b, res=_rand(m, n, dtype=torch.bfloat16))
        _check_all_ops(x, w, b)


def test_weight_gradient_many_rows():
    """d weight / d bias summed over 3000 rows: several row blocks per program and several
    programs' partials; tolerance grows with √rows."""
    m, n = 3000, 24
    x = _rand(m, n, dtype=torch.bfloat16)
    w = _rand(n, dtype=torch.bfloat16, shift=1.0)
    b = _rand(n, dtype=torch.bfloat16)
    dy = _rand(m, n, dtype=torch.bfloat16)
    _, rstd = R.rms_norm_fwd(_d(x), _d(w), None, EPS, "mean_square", "gemma", 0.0, n)
    rstd = rstd.float()
    args = (x, w, b, rstd, None, EPS, "mean_square", "gemma", 0.0, n, x.dtype, True)
    got, eager = T.rms_norm_bwd(dy, *args), R.rms_norm_bwd(dy, *args)
    exact = R.rms_norm_bwd(_d(dy), _d(x), _d(w), _d(b), _d(rstd), None, *args[5:10],
                           torch.float64, True)  # fmt: skip
    _close(got[1], exact[1], eager[1], "dweight", rows=m)
    _close(got[2], exact[2], eager[2], "dbias", rows=m)


def test_deterministic():
    """Same inputs, same bits: d weight / d bias are fixed-order sums of per-program partials."""
    m, n = 600, 40
    x = _rand(m, n, dtype=torch.bfloat16)
    w = _rand(n, dtype=torch.bfloat16, shift=1.0)
    b = _rand(n, dtype=torch.bfloat16)
    dy = _rand(m, n, dtype=torch.bfloat16)
    rstd = torch.rand(m, device=DEVICE) + 0.5
    args = (x, w, b, rstd, None, EPS, "mean_square", "gemma", 0.0, n, x.dtype, True)
    first = T.rms_norm_bwd(dy, *args)
    second = T.rms_norm_bwd(dy, *args)
    for a, b_ in zip(first, second, strict=True):
        assert torch.equal(a, b_)
    mean = torch.randn(m, device=DEVICE)
    first = T.layer_norm_bwd(dy, x, w, b, mean, rstd, True)
    second = T.layer_norm_bwd(dy, x, w, b, mean, rstd, True)
    for a, b_ in zip(first, second, strict=True):
        assert torch.equal(a, b_)


def test_row_offsets_are_int64():
    """Row r starts at r · stride computed in int64: rows 2 · (2^31 − 64) elements apart address
    correctly although every scalar argument fits int32 (an int32 product would wrap to a negative
    offset). The storage is 8 GB of untouched virtual memory; only the 3 rows' pages are used.
    x starts 1024 elements into it, so a wrapped offset (−128) reads the padding (1e4s) and fails
    the comparison instead of crashing the process."""
    n, stride, pad = 8, 2**31 - 64, 1024
    if HAS_CUDA:
        pytest.skip("covered natively by test_more_than_2_31_elements; 8 GB is not free on a GPU")
    store = torch.empty(pad + 2 * stride + n, dtype=torch.float16)
    store[:pad] = 1e4
    x = store[pad:].as_strided((3, n), (stride, 1))
    x.copy_(torch.randn(3, n))
    dy = torch.randn(3, n, dtype=torch.float16)
    xc = x.clone()
    y, rstd = T.rms_norm_fwd(x, None, None, EPS, "mean_square", "gemma", 0.0, n)
    y_e, rstd_e = R.rms_norm_fwd(xc, None, None, EPS, "mean_square", "gemma", 0.0, n)
    _close(y, R.rms_norm_fwd(_d(xc), None, None, EPS, "mean_square", "gemma", 0.0, n)[0], y_e, "y")
    dx, _, _ = T.rms_norm_bwd(dy, x, None, None, rstd_e, None, EPS, "mean_square", "gemma", 0.0,
                              n, x.dtype, True)  # fmt: skip
    dx_e, _, _ = R.rms_norm_bwd(dy, xc, None, None, rstd_e, None, EPS, "mean_square", "gemma",
                                0.0, n, x.dtype, True)  # fmt: skip
    dx_x, _, _ = R.rms_norm_bwd(_d(dy), _d(xc), None, None, _d(rstd_e), None, EPS, "mean_square",
                                "gemma", 0.0, n, torch.float64, True)  # fmt: skip
    _close(dx, dx_x, dx_e, "dx")
    y, mean, rstd = T.layer_norm_fwd(x, None, None, EPS)
    y_e, _, _ = R.layer_norm_fwd(xc, None, None, EPS)
    _close(y, R.layer_norm_fwd(_d(xc), None, None, EPS)[0], y_e, "ln y")


# ----------------------------------------------------------------------------------------------
# The public API (custom ops + autograd) on the Triton backend
# ----------------------------------------------------------------------------------------------
def _grads(fn, inputs, gouts=None):
    """(outputs, input gradients) of fn; output gradients random in the outputs' dtypes unless
    given (converted to each output's dtype)."""
    out = fn(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    if gouts is None:
        gouts = [_rand(*o.shape, dtype=o.dtype) for o in out]
    torch.autograd.backward(out, [g.to(o.dtype) for g, o in zip(gouts, out, strict=True)])
    return [o.detach() for o in out], [None if i.grad is None else i.grad for i in inputs], gouts


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_(True)


def _compare_api(fn, inputs, rows):
    """fn on the Triton backend vs the reference backend in the same dtype and in float64."""
    outs, grads, gouts = _grads(fn, [_leaf(t) for t in inputs])
    with rmsnorm.use_backend("reference"):
        outs_e, grads_e, _ = _grads(fn, [_leaf(t) for t in inputs], gouts)
        outs_x, grads_x, _ = _grads(fn, [_leaf(_d(t)) for t in inputs], gouts)
    for i, (a, e, g) in enumerate(zip(outs, outs_x, outs_e, strict=True)):
        _close(a, e, g, f"output {i}")
    for i, (a, e, g) in enumerate(zip(grads, grads_x, grads_e, strict=True)):
        if a is not None:
            _close(a, e, g, f"grad {i}", rows=rows if inputs[i].dim() == 1 else 1)


def test_api_rms_norm_3d_autograd():
    x = _rand(2, 5, 48, dtype=torch.bfloat16)
    w = _rand(48, dtype=torch.bfloat16, shift=1.0)
    _compare_api(lambda x, w: rmsnorm.rms_norm(x, (48,), w, 1e-6), (x, w), rows=10)


def test_api_add_rms_norm_fp32_residual():
    """bf16 input with an fp32 residual stream: h in fp32, y in bf16, gradients to both."""
    x = _rand(6, 40, dtype=torch.bfloat16)
    res = _rand(6, 40, dtype=torch.float32)
    w = _rand(40, dtype=torch.bfloat16, shift=1.0)
    b = _rand(40, dtype=torch.bfloat16, scale=0.1)

    def fn(x, res, w, b):
        return rmsnorm.add_rms_norm(x, res, 40, w, 1e-6, offset=0.0, bias=b, partial=0.5)

    _compare_api(fn, (x, res, w, b), rows=6)


def test_api_layer_norm_strided_autograd():
    base = _rand(8, 70, dtype=torch.float16)
    x = base[:, 3:67]
    w = _rand(64, dtype=torch.float16, shift=1.0)
    b = _rand(64, dtype=torch.float16)
    _compare_api(lambda x, w, b: rmsnorm.layer_norm(x, 64, w, b), (x, w, b), rows=8)


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "layer_norm"])
def test_gradcheck_float64(op):
    """Analytical vs numerical derivatives in float64: the kernels accumulate in float64 for
    float64 inputs (fast mode: a few random directions)."""
    m, n = 3, 8
    x = _rand(m, n, dtype=torch.float64).requires_grad_()
    w = _rand(n, dtype=torch.float64, shift=1.0).requires_grad_()
    b = _rand(n, dtype=torch.float64).requires_grad_()
    if op == "rms_norm":
        inputs = (x, w, b)

        def fn(x, w, b):
            return rmsnorm.rms_norm(x, n, w, 1e-3, eps_mode="rms", bias=b, partial=0.5)
    elif op == "add_rms_norm":
        res = _rand(m, n, dtype=torch.float64).requires_grad_()
        inputs = (x, res, w)

        def fn(x, res, w):
            return rmsnorm.add_rms_norm(x, res, n, w, 1e-3, offset=0.5)
    else:
        inputs = (x, w, b)

        def fn(x, w, b):
            return rmsnorm.layer_norm(x, n, w, b, 1e-3)

    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


# ----------------------------------------------------------------------------------------------
# Launch configs (pure Python: the GPU table is checked without a GPU)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", _config.KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_gpu_config_table(kind, dtype):
    """Every N from 1 to 2^21 gets a config that covers the row: power-of-two tiles, a split grid
    no larger than the SM count (its programs must be co-resident), or a looped one."""
    sms = 132
    ns = sorted({1, 2, 3} | {2**e + d for e in range(1, 22) for d in (-1, 0, 1)})
    for n in ns:
        cfg = _config._gpu_config(kind, n, dtype.itemsize, sms)
        assert cfg.block_n & (cfg.block_n - 1) == 0 and cfg.block_m & (cfg.block_m - 1) == 0
        if cfg.split > 1:
            assert cfg.block_n * cfg.split >= n > cfg.block_n * (cfg.split - 1)
            assert cfg.programs <= sms and cfg.programs % cfg.split == 0
        elif not cfg.loop:
            assert cfg.block_n >= n
        for m in (1, 7, 4096, 2**20):
            assert cfg.slots(m) * cfg.block_m * cfg.split >= 1
            if cfg.programs:
                assert cfg.slots(m) * cfg.split <= max(cfg.programs, cfg.split)


# ----------------------------------------------------------------------------------------------
# The FLAGS bits (pure Python and source checks: a misnumbered bit fails here, not in results)
# ----------------------------------------------------------------------------------------------
_FLAG_OPTIONS = {
    "LOOP": {"loop": True}, "PREFETCH": {"prefetch": True}, "PHASE": {"phase": 3},
    "RES": {"res": True}, "W": {"w": True}, "B": {"b": True}, "DW": {"dw": True},
    "DB": {"db": True}, "RMS_EPS": {"rms_eps": True}, "PARTIAL": {"partial": True},
    "CAST": {"cast": 3},
}  # fmt: skip


def test_flag_fields_are_disjoint_and_each_option_sets_its_own():
    from rmsnorm.kernels.triton import _flags as flag

    fields = flag.BITS
    for (a, va), (b, vb) in itertools.combinations(fields.items(), 2):
        assert va & vb == 0, f"flag fields {a} and {b} overlap"
    assert all(0 < v < 1 << flag.FINGERPRINT_SHIFT for v in fields.values())
    assert fields["PHASE"] == flag.FIELD_MASK << flag.PHASE_SHIFT
    assert fields["CAST"] == flag.FIELD_MASK << flag.CAST_SHIFT
    assert max(flag.CAST_GEMMA, flag.CAST_LLAMA, flag.CAST_NONE) <= flag.FIELD_MASK
    base = flag.flags()
    assert base >> flag.FINGERPRINT_SHIFT == flag.FINGERPRINT
    assert bool(base & flag.RNE) == flag.INTERPRETED
    assert set(_FLAG_OPTIONS) | {"RNE"} == set(fields)
    for name, kwargs in _FLAG_OPTIONS.items():
        assert flag.flags(**kwargs) ^ base == fields[name], name


def test_fingerprint_changes_with_the_numbering():
    """Renumbering a bit changes FLAGS for every launch, so Triton's on-disk cache never serves a
    kernel compiled under the old numbering (FLAGS is in its key; the bit values are not)."""
    import zlib

    from rmsnorm.kernels.triton import _flags as flag

    def fingerprint(bits):
        return zlib.crc32(repr(sorted(bits.items())).encode()) & 0xFFFF

    assert fingerprint(flag.BITS) == flag.FINGERPRINT
    swapped = dict(flag.BITS, RES=flag.BITS["W"], W=flag.BITS["RES"])
    assert fingerprint(swapped) != flag.FINGERPRINT


def test_kernels_decode_flags_by_name_only():
    """Every FLAGS test in the kernels goes through a name of ``_flags`` (``FLAGS & flag.RES``);
    a bare number there would silently keep the old meaning when a bit is renumbered."""
    import inspect
    import re

    from rmsnorm.kernels.triton import _common, _flags, _layer_norm, _rms

    decoded = 0
    for mod in (_common, _rms, _layer_norm):
        src = inspect.getsource(mod)
        assert not re.search(r"FLAGS\s*(&|>>|<<|\||==)\s*\(?\s*\d", src), mod.__name__
        for name in re.findall(r"FLAGS\s*(?:&|>>)\s*flag\.(\w+)", src):
            assert hasattr(_flags, name), name
            decoded += 1
    assert decoded >= 30  # the four kernels' prologues


# ----------------------------------------------------------------------------------------------
# Version floor and the split layout's co-residency (pure Python: no GPU needed)
# ----------------------------------------------------------------------------------------------
def test_an_older_triton_is_refused_with_its_version_and_the_way_out():
    import subprocess
    import sys

    code = (
        "import triton; triton.__version__ = '3.3.1'\n"
        "try:\n    import rmsnorm.kernels.triton\n"
        "except ImportError as e:\n    print(e)\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "need triton >= 3.4, found triton 3.3.1" in out.stdout, out.stdout + out.stderr
    assert "RMSNORM_BACKEND=reference" in out.stdout
    assert T._version("3.10.0+git1234") == (3, 10) >= T.MIN_TRITON


def test_split_launches_are_cooperative(monkeypatch):
    """On a GPU a split layout's programs wait for each other: the launch asks the driver to make
    them co-resident (or refuse), never to hope they are."""
    monkeypatch.setattr(T.flag, "INTERPRETED", False)
    split = T._launches(_split(16, 64), 0, {})
    assert [kw.get("launch_cooperative_grid") for kw in split] == [True]
    assert "launch_cooperative_grid" not in T._launches(_loop(16), 0, {})[0]


def test_a_refused_cooperative_launch_falls_back_to_the_looped_layout(monkeypatch):
    calls = []
    real = T._launch

    def launch(kernel, cfg, launches, m, args):
        calls.append(cfg.split)
        if len(calls) == 1:
            raise T._SplitRefused("too many blocks in cooperative launch")
        return real(kernel, cfg, launches, m, args)

    monkeypatch.setattr(T, "_launch", launch)
    monkeypatch.setattr(_config, "_split_refused", False)
    x = _rand(3, 40)
    with pytest.warns(RuntimeWarning, match="looped layout"):
        y, _ = T.rms_norm_fwd(x, None, None, EPS, "mean_square", "gemma", 0.0, 40)
    assert len(calls) == 2 and _config._split_refused
    y_e, _ = R.rms_norm_fwd(x, None, None, EPS, "mean_square", "gemma", 0.0, 40)
    _close(y, R.rms_norm_fwd(_d(x), None, None, EPS, "mean_square", "gemma", 0.0, 40)[0], y_e, "y")
    for n in (65536, 262144, 2**20):  # no split config once refused
        assert _config._gpu_config("fwd", n, 2, 132).split == 1
    monkeypatch.setattr(_config, "_split_refused", False)
    _config._gpu_config.cache_clear()
    assert _config._gpu_config("fwd", 65536, 2, 132).split > 1


def test_override_is_scoped():
    cfg = Config(1, 16, 4, loop=True)
    with override(fwd=cfg):
        assert _config.choose("fwd", 1000, torch.float32, torch.device("cpu")) is cfg
    assert _config.choose("fwd", 1000, torch.float32, torch.device("cpu")) is not cfg
    with pytest.raises(ValueError, match="unknown kernel kinds"):
        with override(backward=cfg):
            pass


# ----------------------------------------------------------------------------------------------
# GPU only
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("n", [8192, 16384, 65536, 1048576])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_large_rows(n, dtype):
    """The production configs of the wide shape classes (bf16 / fp32): a persistent single tile
    (16384 / 8192 forward), rows split over cooperating programs (forward past 16384 / 8192,
    backward past 8192 / 4096), and the looped fallback (fp32 backward at 2^20 needs more chunks
    than SMs)."""
    m = max(4, min(512, 2**24 // n))
    x = _rand(m, n, dtype=dtype)
    w = _rand(n, dtype=dtype, shift=1.0)
    b = _rand(n, dtype=dtype, scale=0.1)
    _check_all_ops(x, w, b, res=_rand(m, n, dtype=torch.float32) if n == 65536 else None)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_qk_norm_shape():
    x = _rand(2**16, 128, dtype=torch.bfloat16)
    w = _rand(128, dtype=torch.bfloat16, shift=1.0)
    _check_all_ops(x, w, None)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_more_than_2_31_elements():
    """A (2^31 + 2 rows) bf16 tensor (~8.6 GB in, ~8.6 GB out): the last rows sit past 2^31."""
    n = 4096
    m = 2**31 // n + 2
    free, _ = torch.cuda.mem_get_info()
    if free < 4 * m * n * 2 + 2**30:
        pytest.skip("needs ~18 GB of free GPU memory")
    x = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    y, rstd = T.rms_norm_fwd(x, None, None, EPS, "mean_square", "gemma", 0.0, n)
    tail = x[-3:]
    y_e, _ = R.rms_norm_fwd(tail, None, None, EPS, "mean_square", "gemma", 0.0, n)
    y_x, _ = R.rms_norm_fwd(_d(tail), None, None, EPS, "mean_square", "gemma", 0.0, n)
    _close(y[-3:], y_x, y_e, "y tail")
    del y
    dy = torch.randn_like(x)
    dx, _, _ = T.rms_norm_bwd(dy, x, None, None, rstd, None, EPS, "mean_square", "gemma", 0.0,
                              n, x.dtype, True)  # fmt: skip
    args = (None, None, rstd[-3:], None, EPS, "mean_square", "gemma", 0.0, n)
    dx_e, _, _ = R.rms_norm_bwd(dy[-3:], tail, *args, x.dtype, True)
    dx_x, _, _ = R.rms_norm_bwd(_d(dy[-3:]), _d(tail), None, None, _d(rstd[-3:]), None,
                                *args[4:], torch.float64, True)  # fmt: skip
    _close(dx[-3:], dx_x, dx_e, "dx tail")


@pytest.mark.gpu
def test_gpu_opcheck():
    x = _rand(8, 64, dtype=torch.bfloat16)
    w = _rand(64, dtype=torch.bfloat16, shift=1.0)
    b = _rand(64, dtype=torch.bfloat16)
    res = _rand(8, 64, dtype=torch.float32)
    _, rstd = torch.ops.rmsnorm.rms_norm_fwd(x, 1, w, b, EPS, "rms", "llama", 1.0, 40)
    _, mean, lrstd = torch.ops.rmsnorm.layer_norm_fwd(x, 1, w, b, EPS)
    dy = _rand(8, 64, dtype=torch.float32)
    samples = [
        (torch.ops.rmsnorm.rms_norm_fwd, (x, 1, w, b, EPS, "rms", "llama", 1.0, 40)),
        (torch.ops.rmsnorm.add_rms_norm_fwd, (x, res, 1, w, None, EPS, "mean_square", "gemma",
                                              0.0, 64)),
        (torch.ops.rmsnorm.rms_norm_bwd, (dy, x, 1, w, b, rstd, None, EPS, "rms", "llama", 1.0,
                                          40, torch.bfloat16, True)),
        (torch.ops.rmsnorm.layer_norm_fwd, (x, 1, w, b, EPS)),
        (torch.ops.rmsnorm.layer_norm_bwd, (dy.bfloat16(), x, 1, w, b, mean, lrstd, True)),
    ]  # fmt: skip
    for op, args in samples:
        torch.library.opcheck(op, args)


@pytest.mark.gpu
def test_gpu_compile_fullgraph():
    x = _rand(4, 6, 256, dtype=torch.bfloat16).requires_grad_()
    res = _rand(4, 6, 256, dtype=torch.bfloat16)
    w = _rand(256, dtype=torch.bfloat16, shift=1.0).requires_grad_()

    def fn(x, res, w):
        y, h = rmsnorm.add_rms_norm(x, res, 256, w, 1e-6)
        return rmsnorm.rms_norm(y, 256, w, 1e-6) + rmsnorm.layer_norm(h, 256, w)

    compiled = torch.compile(fn, fullgraph=True)
    out = compiled(x, res, w)
    out.sum().backward()
    assert x.grad is not None and w.grad is not None
    ref = fn(x.detach(), res, w.detach())
    # Our ops are opaque nodes; only the final add is compiled (one bf16 rounding either way).
    torch.testing.assert_close(out.detach(), ref)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    x = _rand(32, 4096, dtype=torch.bfloat16)
    w = _rand(4096, dtype=torch.bfloat16, shift=1.0)
    y = rmsnorm.rms_norm(x, 4096, w, 1e-6)  # compile + warm-up outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rmsnorm.rms_norm(x, 4096, w, 1e-6)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g = rmsnorm.rms_norm(x, 4096, w, 1e-6)
    x.copy_(_rand(32, 4096, dtype=torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_g, rmsnorm.rms_norm(x, 4096, w, 1e-6))
    assert not torch.equal(y_g, y)


def _split_shape_inputs(m=256, n=65536, dtype=torch.bfloat16):
    """Inputs at a shape whose production config is the split layout (checked)."""
    assert _config._gpu_config("fwd", n, dtype.itemsize, _config._sm_count(0)).split > 1
    assert _config._gpu_config("bwd", n, dtype.itemsize, _config._sm_count(0)).split > 1
    x = _rand(m, n, dtype=dtype)
    w = _rand(n, dtype=dtype, shift=1.0)
    return x, w, _rand(m, n, dtype=dtype)


def _split_norms(x, w, dy):
    """Forward and backward (dx, d weight) of RMSNorm and LayerNorm on split-layout shapes."""
    n = x.shape[1]
    y, rstd = T.rms_norm_fwd(x, w, None, EPS, "mean_square", "gemma", 0.0, n)
    g = T.rms_norm_bwd(dy, x, w, None, rstd, None, EPS, "mean_square", "gemma", 0.0, n,
                       x.dtype, True)  # fmt: skip
    yl, mean, lr = T.layer_norm_fwd(x, w, None, EPS)
    gl = T.layer_norm_bwd(dy, x, w, None, mean, lr, True)
    return (y, rstd, *g[:2], yl, mean, lr, *gl[:2])


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_split_rows_under_contention():
    """Split-layout norms on two streams while a third runs a long matmul loop: every launch
    must finish (the caller bounds the run with a timeout) and give the bits of a quiet run."""
    x, w, dy = _split_shape_inputs()
    quiet = _split_norms(x, w, dy)
    torch.cuda.synchronize()
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    side, s1, s2 = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    results = []
    with torch.cuda.stream(side):
        for _ in range(60):  # ~1 s of matmuls on an H200
            a = (a @ a).clamp_(-1, 1)
    for _ in range(10):
        for s in (s1, s2):
            with torch.cuda.stream(s):
                results.append(_split_norms(x, w, dy))
    torch.cuda.synchronize()
    for got in results:
        for q, g in zip(quiet, got, strict=True):
            assert torch.equal(q, g)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(4096, 4096), (256, 65536)])
def test_gpu_weight_gradient_is_bitwise_deterministic(m, n):
    """d weight / d bias are fixed-order sums: the same bits on every run, in the single-tile and
    the split layouts at production configs."""
    x, dy = _rand(m, n, dtype=torch.bfloat16), _rand(m, n, dtype=torch.bfloat16)
    w = _rand(n, dtype=torch.bfloat16)
    b = _rand(n, dtype=torch.bfloat16)
    rstd = torch.rand(m, device=DEVICE) + 0.5
    mean = torch.randn(m, device=DEVICE)
    args = (x, w, b, rstd, None, EPS, "mean_square", "gemma", 0.0, n, x.dtype, True)
    first = T.rms_norm_bwd(dy, *args)
    first_ln = T.layer_norm_bwd(dy, x, w, b, mean, rstd, True)
    for _ in range(3):
        for a, b_ in zip(first, T.rms_norm_bwd(dy, *args), strict=True):
            assert torch.equal(a, b_)
        for a, b_ in zip(first_ln, T.layer_norm_bwd(dy, x, w, b, mean, rstd, True), strict=True):
            assert torch.equal(a, b_)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_of_split_rows():
    """A split-layout (cooperative) launch captured in a CUDA graph replays to the eager bits."""
    x, w, dy = _split_shape_inputs(m=64)
    n = x.shape[1]
    eager = rmsnorm.rms_norm(x, n, w, EPS)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rmsnorm.rms_norm(x, n, w, EPS)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g = rmsnorm.rms_norm(x, n, w, EPS)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_g, eager)


def test_float_scalars_reach_kernels_exactly():
    """eps and offset are fp64 kernel arguments: an fp64 row sees eps = 0.1 exactly (an fp32 eps
    would differ from the reference by ~1e-9 relative, far outside the float64 tolerance)."""
    x = _rand(4, 16, dtype=torch.float64, scale=0.1)
    w = _rand(16, dtype=torch.float64)
    y, rstd = T.rms_norm_fwd(x, w, None, 0.1, "mean_square", "gemma", 0.3, 16)
    y_e, rstd_e = R.rms_norm_fwd(x, w, None, 0.1, "mean_square", "gemma", 0.3, 16)
    assert math.isclose(rstd[0].item(), rstd_e[0].item(), rel_tol=1e-15)
    _close(y, y_e, y_e, "y")
