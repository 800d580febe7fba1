"""Every backend's launchers (reference, the CPU kernels, the Triton kernels — interpreted on CPU
tensors, native on a GPU) against the contract and the spec, with one set of cases: the signatures
of :class:`rmsnorm._contract.Backend`; every option in pairwise combinations, in each row and
parameter layout, against the float64 spec with the shared tolerance rule (:mod:`rmsnorm.testing`);
shapes at the edges (N = 1, non-power-of-two N, M = 0 and 1, row offsets past 2^31); special rows.
What only one backend has (CPU threads and bit conversions, Triton layouts) is tested in its own
file."""

from __future__ import annotations

import types

import pytest
import torch

from launcher_support import (
    ALL,
    EPS,
    bitwise_equal,
    case_id,
    check_all_ops,
    pairwise,
    param_layout,
    randn,
    relayout,
    target,
    uncovered,
)
from rmsnorm import _backend, _contract
from rmsnorm import reference as R
from rmsnorm.testing import check_launcher


@pytest.fixture(params=ALL)
def backend(request):
    return target(request.param)


# ----------------------------------------------------------------------------------------------
# The contract
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "module",
    [
        "rmsnorm.reference",
        "rmsnorm.kernels.cpu",
        "rmsnorm.kernels.cpu.launchers",
        "rmsnorm.kernels.cpu.gated_launchers",
        "rmsnorm.kernels.triton",
    ],
)
def test_every_backend_module_has_the_contracts_launchers(module):
    if module.startswith("rmsnorm.kernels.cpu.") and not _backend.cpu_kernels_available():
        pytest.skip("numba is not installed")
    if module == "rmsnorm.kernels.triton":
        pytest.importorskip("triton")
    mod = pytest.importorskip(module)
    found = _contract.mismatches(mod)
    if module.endswith(".launchers"):  # the CPU backend's plain launchers; the gated ones next
        found = [f for f in found if "gated_rms_norm" not in f]
    elif module.endswith(".gated_launchers"):
        found = [f for f in found if "gated_rms_norm" in f]
    assert found == []


def test_a_departure_from_the_contract_is_named():
    swapped = types.ModuleType("swapped")
    swapped.layer_norm_fwd = R.layer_norm_fwd
    swapped.layer_norm_bwd = lambda dy, x, weight, bias, rstd, mean, need_weight_grad=True: None
    found = _contract.mismatches(swapped)
    assert len(found) == 6 and found[0] == "swapped.rms_norm_fwd is missing"
    assert found[4] == "swapped.gated_rms_norm_fwd is missing"
    assert found[3].startswith(
        "swapped.layer_norm_bwd(dy, x, weight, bias, rstd, mean, need_weight_grad=True) differs"
    )


def test_the_three_way_check_notices_a_wrong_output():
    off = types.ModuleType("off")
    x, w = torch.randn(8, 32), torch.randn(32)
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 32)
    check_launcher(R, "rms_norm_fwd", x, w, None, opts)
    off.rms_norm_fwd = lambda *args: (R.rms_norm_fwd(*args)[0], None)
    check_launcher(off, "rms_norm_fwd", x, w, None, opts, False)  # no statistics asked for
    with pytest.raises(AssertionError, match="rms_norm_fwd rstd: None"):
        check_launcher(off, "rms_norm_fwd", x, w, None, opts)
    off.rms_norm_fwd = lambda *args: (R.rms_norm_fwd(*args)[0] * 1.001, R.rms_norm_fwd(*args)[1])
    with pytest.raises(AssertionError, match="rms_norm_fwd y: max abs error"):
        check_launcher(off, "rms_norm_fwd", x, w, None, opts)
    off.rms_norm_fwd = lambda *args: (R.rms_norm_fwd(*args)[0].bfloat16(), None)
    with pytest.raises(AssertionError, match="dtype torch.bfloat16 != expected torch.float32"):
        check_launcher(off, "rms_norm_fwd", x, w, None, opts)


def test_launchers_take_rows_in_their_own_shape(backend):
    """Rows (*, N) contiguous of any rank, or (M, N) with strided rows; outputs in x's shape as
    tensors of their own; statistics (M,); row tensors of different ranks in one call."""
    mod, dev = backend.mod, backend.device
    x3, r3 = randn(2, 3, 16, device=dev), randn(2, 3, 16, device=dev)
    w = randn(16, device=dev)
    strided = randn(6, 32, device=dev)[:, :16]  # the same rows, 2-D with a row stride of 32
    strided.copy_(x3.reshape(6, 16))
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 16)
    for x in (x3, randn(16, device=dev), strided):
        y, rstd = mod.rms_norm_fwd(x, w, None, opts)
        assert y.shape == x.shape and y.is_contiguous() and y._base is None
        assert rstd.shape == (x.numel() // 16,)
        dx, dw, _ = mod.rms_norm_bwd(torch.ones_like(x), x, w, None, rstd, None, opts, x.dtype)
        assert dx.shape == x.shape and dw.shape == (16,)
        y, h, rstd = mod.add_rms_norm_fwd(x, x.clone(), w, None, opts._replace(eps_mode="rms"))
        assert y.shape == h.shape == x.shape and rstd.shape == (x.numel() // 16,)
        y, mean, rstd = mod.layer_norm_fwd(x, w, w, 1e-5)
        assert y.shape == x.shape and mean.shape == rstd.shape == (x.numel() // 16,)
        dx, dw, db = mod.layer_norm_bwd(torch.ones_like(x), x, w, w, mean, rstd, True)
        assert dx.shape == x.shape and dw.shape == db.shape == (16,)
    y3, _ = mod.rms_norm_fwd(x3, w, None, opts)
    y2, _ = mod.rms_norm_fwd(strided, w, None, opts)
    torch.testing.assert_close(y3.reshape(6, 16), y2)
    _, h, _ = mod.add_rms_norm_fwd(x3, r3.reshape(6, 16), w, None, opts._replace(k=8))
    torch.testing.assert_close(h.reshape(6, 16), (x3 + r3).reshape(6, 16))  # mixed ranks


def test_forward_launchers_may_skip_the_statistics(backend):
    """stats=False (an eager call without gradients): same output; the statistics are either
    skipped (None) or the same as with stats=True."""
    mod, dev = backend.mod, backend.device
    x, r, w = randn(4, 3, 24, device=dev), randn(4, 3, 24, device=dev), randn(24, device=dev)
    # (call, how many leading outputs are tensors the caller gets: y, and h for add_rms_norm)
    llama, gemma = (
        R.RMSOptions(1e-6, "rms", "llama", 0.5, 12),
        R.RMSOptions(1e-6, "rms", "gemma", 0.0, 24),
    )
    calls = [
        (lambda stats: mod.rms_norm_fwd(x, w, None, llama, stats), 1),
        (lambda stats: mod.add_rms_norm_fwd(x, r, w, w, gemma, stats), 2),
        (lambda stats: mod.layer_norm_fwd(x, w, w, 1e-5, stats), 1),
    ]
    for call, outputs in calls:
        full, lean = call(True), call(False)
        assert len(full) == len(lean)
        for i, (a, b) in enumerate(zip(full, lean, strict=True)):
            assert (b is None and i >= outputs) or torch.equal(a, b)


# ----------------------------------------------------------------------------------------------
# The pairwise generator
# ----------------------------------------------------------------------------------------------
def test_pairwise_covers_every_allowed_pair_and_only_allowed_cases():
    factors = {"a": (0, 1, 2), "b": ("x", "y"), "c": (False, True), "d": (None, 0.5)}

    def valid(c):
        return not (c.get("a") == 2 and c.get("c") is True)

    cases = pairwise(factors, valid)
    assert uncovered(factors, cases, valid) == []
    assert len(cases) < 3 * 2 * 2 * 2
    assert pairwise(factors, valid) == cases  # deterministic: stable test ids
    assert uncovered(factors, cases[1:], valid)  # and the check does notice a missing pair


# ----------------------------------------------------------------------------------------------
# RMSNorm and the residual form, forward and backward: every option, pairwise
# ----------------------------------------------------------------------------------------------
RMS_FACTORS = {
    "dtype": (torch.float32, torch.bfloat16, torch.float16, torch.float64),
    "weight": ("none", "same", "fp32"),  # γ absent, in x's dtype, or fp32
    "bias": (False, True),
    "eps_mode": R.EPS_MODES,
    "casting": R.CASTING_MODES,
    "offset": (0.0, 1.0),
    "partial": (None, 0.29),
    "need_wgrad": (True, False),
    # (M, N): N off powers of two; N = 1; M = 1; M past the CPU backward's first block of rows
    # (55 at N = 300), ragged end; rows in several Triton tiles, ragged end (40 in tiles of 16)
    "shape": ((67, 300), (1, 257), (9, 1), (40, 129)),
    "layout": ("contiguous", "strided", "every_other_row"),
    "params": ("contiguous", "strided", "expanded", "offset"),
}
# add_rms_norm: the same options with a residual in x's dtype, fp32 or the other 16-bit dtype, and
# with or without a gradient reaching h directly; (45, 200) rows, contiguous parameters.
ADD_FACTORS = {
    **{k: v for k, v in RMS_FACTORS.items() if k not in ("shape", "params")},
    "residual": ("same", "fp32", "other_half"),
    "dresidual": (False, True),
}


def _rms_valid(c: dict) -> bool:
    return not (c.get("offset", 0.0) != 0.0 and c.get("weight") == "none")  # offset needs γ


RMS_CASES = pairwise(RMS_FACTORS, _rms_valid)
ADD_CASES = pairwise(ADD_FACTORS, _rms_valid)


def _dtype(kind: str, dt: torch.dtype) -> torch.dtype | None:
    if kind == "other_half":
        return torch.float16 if dt == torch.bfloat16 else torch.bfloat16
    return {"none": None, "same": dt, "fp32": torch.float32}[kind]


def test_rms_tables_cover_every_pair():
    assert uncovered(RMS_FACTORS, RMS_CASES, _rms_valid) == []
    assert uncovered(ADD_FACTORS, ADD_CASES, _rms_valid) == []


def _check_rms_case(backend, c: dict) -> None:
    (m, n), dt, dev, lay = c.get("shape", (45, 200)), c["dtype"], backend.device, c["layout"]
    x = relayout(randn(m, n, dtype=dt, device=dev, scale=2.0, shift=0.5), lay)
    wdt = _dtype(c["weight"], dt)
    w = None if wdt is None else randn(n, dtype=wdt, device=dev)
    if w is not None and c["offset"]:
        w = w * 0.1  # Gemma-style γ near 0 with offset 1
    b = randn(n, dtype=dt, device=dev) if c["bias"] else None
    w, b = (
        param_layout(w, c.get("params", "contiguous")),
        param_layout(b, c.get("params", "contiguous")),
    )
    k = R.partial_size(n, c["partial"])
    opts = R.RMSOptions(EPS, c["eps_mode"], c["casting"], c["offset"], k)
    mod = backend.mod
    if "residual" not in c:
        (y, rstd), eager, exact = check_launcher(mod, "rms_norm_fwd", x, w, b, opts)
        xin, dres = x, None
    else:
        rdt = _dtype(c["residual"], dt)
        res = relayout(randn(m, n, dtype=rdt, device=dev, scale=3.0), lay)
        (y, h, rstd), eager, exact = check_launcher(mod, "add_rms_norm_fwd", x, res, w, b, opts)
        xin = eager[1]
        dres = relayout(randn(m, n, dtype=rdt, device=dev), lay) if c["dresidual"] else None
        if backend.bitwise:  # h is one add rounded to the residual's dtype: the spec's exactly
            assert h.dtype == rdt and torch.equal(h, xin)
    if backend.bitwise:  # the element-wise part rounds where the spec rounds
        assert torch.equal(y, R.rms_norm_apply(xin, rstd, w, b, opts, dt))

    dy = relayout(randn(m, n, dtype=y.dtype, device=dev), lay)
    rstd = exact[-1].to(eager[-1].dtype)
    check_launcher(mod, "rms_norm_bwd", dy, xin, w, b, rstd, dres, opts, dt, c["need_wgrad"])


@pytest.mark.parametrize("case", RMS_CASES, ids=case_id)
def test_rms_norm(backend, case):
    _check_rms_case(backend, case)


@pytest.mark.parametrize("case", ADD_CASES, ids=case_id)
def test_add_rms_norm(backend, case):
    _check_rms_case(backend, case)


# ----------------------------------------------------------------------------------------------
# LayerNorm, forward and backward: every option, pairwise
# ----------------------------------------------------------------------------------------------
LN_FACTORS = {
    "dtype": (torch.float32, torch.bfloat16, torch.float16, torch.float64),
    "weight": ("none", "same", "fp32"),
    "bias": ("none", "same", "fp32"),
    "need_wgrad": (True, False),
    "shape": RMS_FACTORS["shape"],
    "layout": RMS_FACTORS["layout"],
    "params": RMS_FACTORS["params"],
}
LN_CASES = pairwise(LN_FACTORS)


def test_layer_norm_table_covers_every_pair():
    assert uncovered(LN_FACTORS, LN_CASES) == []


@pytest.mark.parametrize("case", LN_CASES, ids=case_id)
def test_layer_norm(backend, case):
    (m, n), dt, dev, lay = case["shape"], case["dtype"], backend.device, case["params"]
    # a large mean next to the spread: the variance must not come from E[x²] − μ²
    x = relayout(randn(m, n, dtype=dt, device=dev, scale=0.5, shift=30.0), case["layout"])
    wdt, bdt = _dtype(case["weight"], dt), _dtype(case["bias"], dt)
    w = None if wdt is None else param_layout(randn(n, dtype=wdt, device=dev), lay)
    b = None if bdt is None else param_layout(randn(n, dtype=bdt, device=dev), lay)
    (y, mean, rstd), eager, exact = check_launcher(backend.mod, "layer_norm_fwd", x, w, b, EPS)
    if backend.bitwise:  # same statistics in, same bits out as the spec's element-wise ops
        cd = R.compute_dtype(dt)
        want = (x.to(cd) - mean[:, None]) * rstd[:, None]
        want = want * w.to(cd) if w is not None else want
        want = want + b.to(cd) if b is not None else want
        assert torch.equal(y, want.to(dt))

    dy = relayout(randn(m, n, dtype=dt, device=dev), case["layout"])
    mean, rstd = exact[1].to(eager[1].dtype), exact[2].to(eager[2].dtype)
    check_launcher(backend.mod, "layer_norm_bwd", dy, x, w, b, mean, rstd, case["need_wgrad"])


# ----------------------------------------------------------------------------------------------
# Shapes and layouts the tables do not reach
# ----------------------------------------------------------------------------------------------
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
def test_shapes(backend, m, n):
    dev = backend.device
    x = randn(m, n, dtype=torch.bfloat16, device=dev)
    w = randn(n, dtype=torch.bfloat16, device=dev, shift=1.0)
    b = randn(n, dtype=torch.bfloat16, device=dev, scale=0.1)
    check_all_ops(backend.mod, x, w, b)


def test_rows_of_stride_zero(backend):
    x = relayout(randn(6, 50, dtype=torch.bfloat16, device=backend.device), "broadcast")
    assert x.stride(0) == 0
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 50)
    (y, rstd), _, _ = check_launcher(backend.mod, "rms_norm_fwd", x, None, None, opts)
    assert torch.equal(y[0], y[5]) and y.is_contiguous()
    if backend.bitwise:
        assert torch.equal(y, R.rms_norm_apply(x, rstd, None, None, opts, x.dtype))


@pytest.mark.parametrize("need_weight_grad", [True, False])
def test_no_rows_and_absent_gradients(backend, need_weight_grad):
    """M = 0 (and 3): outputs of no rows; d weight / d bias of no rows are zeros; gradients not
    asked for, or of absent parameters, are empty."""
    mod, dev = backend.mod, backend.device
    w = randn(16, dtype=torch.bfloat16, device=dev)
    b = randn(16, device=dev)
    for m in (0, 3):
        x, dy = randn(m, 16, device=dev), randn(m, 16, device=dev)
        opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 16)
        y, rstd = mod.rms_norm_fwd(x, w, None, opts)
        assert y.shape == (m, 16) and rstd.shape == (m,) and rstd.dtype == torch.float32
        y, h, rstd = mod.add_rms_norm_fwd(x, x, w, b, opts)
        assert y.shape == h.shape == (m, 16) and rstd.shape == (m,)
        dx, dw, db = mod.rms_norm_bwd(dy, x, w, None, rstd, None, opts, x.dtype, need_weight_grad)
        assert dx.shape == (m, 16)
        assert db.shape == (0,) and db.dtype == torch.float32
        if need_weight_grad:
            assert dw.shape == (16,) and dw.dtype == torch.bfloat16
            assert m or not dw.float().any()
        else:
            assert dw.shape == (0,) and dw.dtype == torch.float32
        y, mean, rstd = mod.layer_norm_fwd(x, w, b, 1e-5)
        dx, dw, db = mod.layer_norm_bwd(dy, x, w, b, mean, rstd, need_weight_grad)
        assert dx.shape == (m, 16)
        if need_weight_grad:
            assert dw.shape == db.shape == (16,) and (m or not (dw.any() or db.any()))
        else:
            assert dw.shape == db.shape == (0,)
        _, mean, rstd = mod.layer_norm_fwd(x, None, None, 1e-5)
        dx, dw, db = mod.layer_norm_bwd(dy, x, None, None, mean, rstd, need_weight_grad)
        assert dx.shape == (m, 16) and dw.shape == db.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_parameters_are_read_with_their_stride(backend, dtype):
    """A strided, offset or expanded (stride 0) weight or bias gives the bits of its contiguous
    copy, in every launcher (in a casting mode per layout, with an offset in one)."""
    mod, dev = backend.mod, backend.device
    m, n = 33, 96
    x, dy = randn(m, n, device=dev), randn(m, n, device=dev)
    base = randn(n, dtype=dtype, device=dev)
    for layout, cast, off in (
        ("strided", "gemma", 0.0),
        ("offset", "none", 1.0),
        ("expanded", "llama", 0.0),
    ):
        w = param_layout(base, layout)
        b = w.flip(0) if layout != "expanded" else w
        wc, bc = w.contiguous(), b.contiguous()
        opts = R.RMSOptions(1e-6, "mean_square", cast, off, n)
        y, rstd = mod.rms_norm_fwd(x, w, b, opts)
        assert torch.equal(y, mod.rms_norm_fwd(x, wc, bc, opts)[0]), layout
        got = mod.add_rms_norm_fwd(x, dy, w, b, opts)
        assert bitwise_equal(got, mod.add_rms_norm_fwd(x, dy, wc, bc, opts)), layout
        got = mod.rms_norm_bwd(dy, x, w, b, rstd, None, opts, x.dtype, True)
        want = mod.rms_norm_bwd(dy, x, wc, bc, rstd, None, opts, x.dtype, True)
        assert bitwise_equal(got, want), layout
        y, mean, rstd = mod.layer_norm_fwd(x, w, b, 1e-5)
        assert torch.equal(y, mod.layer_norm_fwd(x, wc, bc, 1e-5)[0]), layout
        got = mod.layer_norm_bwd(dy, x, w, b, mean, rstd, True)
        assert bitwise_equal(got, mod.layer_norm_bwd(dy, x, wc, bc, mean, rstd, True)), layout


def test_row_offsets_are_int64(backend):
    """Row r starts at r · stride computed in int64: rows 2 · (2^31 − 64) elements apart address
    correctly although every scalar argument fits int32 (an int32 product would wrap to a negative
    offset). The storage is 8 GB of untouched virtual memory; only the 3 rows' pages are used.
    x starts 1024 elements into it, so a wrapped offset (−128) reads the padding (1e4s) and fails
    the comparison instead of crashing the process."""
    if backend.device == "cuda":
        pytest.skip("covered by test_gpu_more_than_2_31_elements; 8 GB is not free on a GPU")
    n, stride, pad = 8, 2**31 - 64, 1024
    store = torch.empty(pad + 2 * stride + n, dtype=torch.float16)
    store[:pad] = 1e4
    x = store[pad:].as_strided((3, n), (stride, 1))
    x.copy_(torch.randn(3, n))
    dy = torch.randn(3, n, dtype=torch.float16)
    opts = R.RMSOptions(EPS, "mean_square", "gemma", 0.0, n)
    mod, xc = backend.mod, x.clone()
    y, _ = mod.rms_norm_fwd(x, None, None, opts)
    assert torch.equal(y, mod.rms_norm_fwd(xc, None, None, opts)[0])
    _, rstd = R.rms_norm_fwd(xc, None, None, opts)
    dx, _, _ = mod.rms_norm_bwd(dy, x, None, None, rstd, None, opts, x.dtype, True)
    assert torch.equal(dx, mod.rms_norm_bwd(dy, xc, None, None, rstd, None, opts, x.dtype)[0])
    y, _, _ = mod.layer_norm_fwd(x, None, None, EPS)
    assert torch.equal(y, mod.layer_norm_fwd(xc, None, None, EPS)[0])
    check_launcher(mod, "rms_norm_fwd", x, None, None, opts)


# ----------------------------------------------------------------------------------------------
# Special rows: all zeros, NaN
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps_mode", R.EPS_MODES)
def test_all_zero_row(backend, eps_mode):
    mod, dev = backend.mod, backend.device
    x = randn(4, 64, device=dev)
    x[2] = 0.0
    w = randn(64, device=dev)
    eps = 1e-6
    opts = R.RMSOptions(eps, eps_mode, "gemma", 0.0, 64)
    y, rstd = mod.rms_norm_fwd(x, w, None, opts)
    assert not y[2].any() and y.isfinite().all()
    dy = randn(4, 64, device=dev)
    dx, dw, _ = mod.rms_norm_bwd(dy, x, w, None, rstd, None, opts, x.dtype, True)
    assert dx.isfinite().all() and dw.isfinite().all()
    g = dy[2] * w
    # the limit of the derivative at a zero row: dx = g/sqrt(ε) or g/ε (a scale that does not move)
    expected = g / (eps**0.5 if eps_mode == "mean_square" else eps)
    torch.testing.assert_close(dx[2], expected, rtol=1e-6, atol=0)
    y, mean, rstd = mod.layer_norm_fwd(x, w, None, 1e-5)
    assert not y[2].any()
    dx, dw, _ = mod.layer_norm_bwd(dy, x, w, None, mean, rstd, True)
    assert dx.isfinite().all() and dw.isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nan_stays_in_its_row(backend, dtype):
    mod, dev = backend.mod, backend.device
    x = randn(70, 33, dtype=dtype, device=dev)
    x[40, 7] = float("nan")
    dy = randn(70, 33, dtype=dtype, device=dev)
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 33)
    y, rstd = mod.rms_norm_fwd(x, None, None, opts)
    dx, _, _ = mod.rms_norm_bwd(dy, x, None, None, rstd, None, opts, dtype, False)
    yl, mean, rl = mod.layer_norm_fwd(x, None, None, 1e-5)
    dxl, _, _ = mod.layer_norm_bwd(dy, x, None, None, mean, rl, False)
    for t in (y, dx, yl, dxl):
        bad = t.isnan().any(dim=1)
        assert bad[40] and bad.sum() == 1


def test_outputs_are_on_the_inputs_device(backend):
    """torch.set_default_device / ``with torch.device(...)`` redirect torch.empty; the launchers'
    outputs stay on their inputs' device."""
    if backend.name == "triton":
        pytest.skip("not checked for Triton: its interpreter allocates on the default device")
    mod, dev = backend.mod, backend.device
    x, dy, w = randn(4, 32, device=dev), randn(4, 32, device=dev), randn(32, device=dev)
    opts = R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 32)
    want = mod.rms_norm_fwd(x, w, w, opts)
    want_ln = mod.layer_norm_fwd(x, w, w, 1e-5)
    with torch.device("meta"):
        got = mod.rms_norm_fwd(x, w, w, opts)
        got_add = mod.add_rms_norm_fwd(x, x, w, w, opts)
        grads = mod.rms_norm_bwd(dy, x, w, w, want[1], None, opts, x.dtype, True)
        got_ln = mod.layer_norm_fwd(x, w, w, 1e-5)
        lgrads = mod.layer_norm_bwd(dy, x, w, w, want_ln[1], want_ln[2], True)
    for t in (*got, *got_add, *grads, *got_ln, *lgrads):
        assert t.device == x.device
    assert bitwise_equal(got, want) and bitwise_equal(got_ln, want_ln)


# ----------------------------------------------------------------------------------------------
# Grouped and gated RMSNorm, forward and backward: every option, pairwise
# ----------------------------------------------------------------------------------------------
GATED_FACTORS = {
    "dtype": (torch.float32, torch.bfloat16, torch.float16, torch.float64),
    "gate": ("none", "last", "first"),  # no gate, norm then gate, gate then norm
    "gate_dtype": ("same", "fp32", "fp64", "other_half"),
    "activation": R.ACTIVATIONS,
    # (M, N, group size): one group, groups of a power of two, of an odd size (3 × 43), g = 1,
    # one decoding row, rows past the CPU backward's first block (16 rows)
    "shape": ((67, 96, 32), (9, 129, 43), (4, 24, None), (1, 256, 64), (21, 6, 1), (40, 64, 16)),
    "weight": ("none", "same", "fp32"),
    "bias": (False, True),
    "eps_mode": R.EPS_MODES,
    "casting": R.CASTING_MODES,
    "offset": (0.0, 1.0),
    "partial": (None, 0.5),
    "input": ("x", "other"),  # the casting mode's input dtype: x's, or another (the residual form)
    "need_wgrad": (True, False),
    "dresidual": (False, True),
    "layout": ("contiguous", "strided", "every_other_row"),
    "params": ("contiguous", "strided", "expanded", "offset"),
}
_OTHER_INPUT = {
    torch.float32: torch.bfloat16,
    torch.bfloat16: torch.float32,
    torch.float16: torch.bfloat16,
    torch.float64: torch.float32,
}
GATED_CASES = pairwise(GATED_FACTORS, _rms_valid)


def test_gated_table_covers_every_pair():
    assert uncovered(GATED_FACTORS, GATED_CASES, _rms_valid) == []


def _gate_dtype(kind: str, dt: torch.dtype) -> torch.dtype:
    if kind == "fp64":
        return torch.float64
    return _dtype(kind, dt)


def _gated_inputs(c: dict, dev: str):
    """(x, gate, w, b, args of the forward launcher) for a case of GATED_FACTORS."""
    m, n, g = c["shape"]
    dt, lay = c["dtype"], c["layout"]
    x = relayout(randn(m, n, dtype=dt, device=dev, scale=2.0, shift=0.3), lay)
    z = None
    if c["gate"] != "none":
        z = relayout(
            randn(m, n, dtype=_gate_dtype(c["gate_dtype"], dt), device=dev, scale=3.0), lay
        )
    wdt = _dtype(c["weight"], dt)
    w = None if wdt is None else randn(n, dtype=wdt, device=dev, shift=0.5)
    if w is not None and c["offset"]:
        w = w * 0.1
    b = randn(n, dtype=dt, device=dev, scale=0.5) if c["bias"] else None
    w, b = param_layout(w, c["params"]), param_layout(b, c["params"])
    k = R.partial_size(n if g is None else g, c["partial"])
    in_dt = _OTHER_INPUT[dt] if c["input"] == "other" else None
    opts = R.RMSOptions(EPS, c["eps_mode"], c["casting"], c["offset"], k)
    gating = R.GateOptions(g, c["gate"] != "first", c["activation"])
    return (x, z, w, b, opts, gating), in_dt


@pytest.mark.parametrize("case", GATED_CASES, ids=case_id)
def test_gated_rms_norm(backend, case):
    dev, mod = backend.device, backend.mod
    args, in_dt = _gated_inputs(case, dev)
    x, z, w, b, opts, gating = args
    g = gating.group_size
    (y, rstd), eager, exact = check_launcher(mod, "gated_rms_norm_fwd", *args, in_dt, True)
    m, n = x.shape
    groups = 1 if g is None else n // g
    assert rstd.shape == (m * groups,) and y.shape == x.shape
    if backend.bitwise and z is None:  # no gate: the spec's roundings, group by group
        gs = n // groups
        want = R.rms_norm_apply(
            x.reshape(m, groups, gs),
            rstd.reshape(m, groups),
            None if w is None else w.reshape(groups, gs),
            None if b is None else b.reshape(groups, gs),
            opts,
            x.dtype if in_dt is None else in_dt,
        )
        assert torch.equal(y, want.reshape(m, n))
    dy = relayout(randn(m, n, dtype=y.dtype, device=dev), case["layout"])
    dres = (
        relayout(randn(m, n, dtype=x.dtype, device=dev), case["layout"])
        if case["dresidual"]
        else None
    )
    rstd = exact[1].to(eager[1].dtype)
    in_dtype = x.dtype if in_dt is None else in_dt
    grad_args = (dy, x, z, w, b, rstd, dres, opts, gating, in_dtype, case["need_wgrad"])
    check_launcher(mod, "gated_rms_norm_bwd", *grad_args)


@pytest.mark.parametrize("need_weight_grad", [True, False])
def test_gated_no_rows_and_absent_outputs(backend, need_weight_grad):
    """M = 0 and 3: outputs of no rows; d weight / d bias of no rows are zeros; d gate without a
    gate, and gradients not asked for, are empty."""
    mod, dev = backend.mod, backend.device
    w = randn(24, dtype=torch.bfloat16, device=dev)
    b = randn(24, device=dev)
    for m in (0, 3):
        x, dy, z = (randn(m, 24, device=dev) for _ in range(3))
        opts, gating = (
            R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 8),
            R.GateOptions(8, False, "silu"),
        )
        y, rstd = mod.gated_rms_norm_fwd(x, z, w, b, opts, gating)
        assert y.shape == (m, 24) and rstd.shape == (3 * m,) and rstd.dtype == torch.float32
        dx, dz, dw, db = mod.gated_rms_norm_bwd(
            dy, x, z, w, b, rstd, None, opts, gating, x.dtype, need_weight_grad
        )
        assert dx.shape == dz.shape == (m, 24) and dz.dtype == z.dtype
        if need_weight_grad:
            assert dw.shape == db.shape == (24,) and dw.dtype == torch.bfloat16
            assert m or not (dw.float().any() or db.any())
        else:
            assert dw.shape == db.shape == (0,)
        dx, dz, dw, db = mod.gated_rms_norm_bwd(
            dy, x, None, None, None, rstd, None, opts, gating, x.dtype, need_weight_grad
        )
        assert dz.shape == dw.shape == db.shape == (0,) and dz.dtype == torch.float32


def test_gated_forward_may_skip_the_statistics(backend):
    mod, dev = backend.mod, backend.device
    x, z, w = randn(4, 3, 24, device=dev), randn(4, 3, 24, device=dev), randn(24, device=dev)
    opts, gating = R.RMSOptions(1e-6, "rms", "llama", 0.5, 4), R.GateOptions(8, True, "sigmoid")
    full = mod.gated_rms_norm_fwd(x, z, w, w, opts, gating, None, True)
    lean = mod.gated_rms_norm_fwd(x, z, w, w, opts, gating, None, False)
    assert torch.equal(full[0], lean[0]) and full[0].shape == x.shape
    assert lean[1] is None or torch.equal(full[1], lean[1])


def test_gated_rows_in_their_own_shape(backend):
    """Rows of any rank, gate and x of different ranks and strides, in one call."""
    mod, dev = backend.mod, backend.device
    x3, z = randn(2, 3, 16, device=dev), randn(6, 32, device=dev)[:, :16]
    z.copy_(randn(6, 16, device=dev))
    w = randn(16, device=dev)
    opts, gating = (
        R.RMSOptions(1e-6, "mean_square", "gemma", 0.0, 4),
        R.GateOptions(4, False, "silu"),
    )
    y, rstd = mod.gated_rms_norm_fwd(x3, z, w, None, opts, gating)
    y2, rstd2 = mod.gated_rms_norm_fwd(x3.reshape(6, 16), z.contiguous(), w, None, opts, gating)
    assert y.shape == x3.shape and y.is_contiguous() and y._base is None
    torch.testing.assert_close(y.reshape(6, 16), y2)
    dx, dz, _, _ = mod.gated_rms_norm_bwd(
        torch.ones_like(x3), x3, z, w, None, rstd, None, opts, gating, x3.dtype, True
    )
    assert dx.shape == dz.shape == x3.shape


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_gated_degenerate_rows_match_the_spec(backend, eps):
    """Rows of zeros, of tiny values (squares below float32's range), holding ±inf or NaN, in x or
    in the gate: NaN and ±inf exactly where the spec (torch operations) has them, no exception."""
    mod, dev = backend.mod, backend.device
    n = 16
    x, z = randn(8, n, device=dev), randn(8, n, device=dev, scale=3.0)
    x[0] = 0.0
    x[1] = x[1] * 1e-30
    x[2, 3] = float("inf")
    x[3, 5] = float("nan")
    z[4, 2] = float("inf")
    z[5, 7] = -float("inf")
    z[6, 1] = float("nan")
    z[7] = -100.0
    w = randn(n, device=dev)
    for order in (True, False):
        opts, gating = (
            R.RMSOptions(eps, "mean_square", "gemma", 0.0, n),
            R.GateOptions(None, order, "silu"),
        )
        y, rstd = mod.gated_rms_norm_fwd(x, z, w, None, opts, gating)
        ye, re = R.gated_rms_norm_fwd(x, z, w, None, opts, gating)
        for a, e in ((y, ye), (rstd, re)):
            assert torch.equal(a.isnan(), e.isnan()) and torch.equal(a.isinf(), e.isinf()), order
        dy = randn(8, n, device=dev)
        got = mod.gated_rms_norm_bwd(dy, x, z, w, None, re, None, opts, gating, x.dtype, True)
        want = R.gated_rms_norm_bwd(dy, x, z, w, None, re, None, opts, gating, x.dtype, True)
        # where r = inf (ε = 0, squares below float32's range) the ±inf / NaN pattern depends on
        # summation order, as in torch's own autograd: there, non-finite where the spec is
        plain = re.isfinite()
        for name, a, e in zip(("dx", "dz"), got, want, strict=False):
            assert torch.equal(a.isfinite(), e.isfinite()), (order, name)
            assert torch.equal(a[plain].isnan(), e[plain].isnan()), (order, name)
