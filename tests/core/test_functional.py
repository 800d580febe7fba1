"""The public functions: shapes, dtypes, options, gradients and edge rows, against the spec."""

import numpy as np
import pytest
import torch

import rmsnorm
from rmsnorm import reference as ref
from rmsnorm.testing import assert_close_to_reference

# One row per option combination, chosen pairwise over (eps_mode, casting_mode, offset, bias,
# partial, weight) rather than the full product.
OPTION_SETS = [
    dict(eps_mode="mean_square", casting_mode="gemma"),
    dict(eps_mode="rms", casting_mode="llama", offset=1.0, bias=True),
    dict(eps_mode="mean_square", casting_mode="none", partial=0.25, bias=True),
    dict(eps_mode="rms", casting_mode="gemma", partial=0.0625, offset=-0.5),
    dict(eps_mode="mean_square", casting_mode="llama", partial=0.5, weight=False),
    dict(eps_mode="rms", casting_mode="none", weight=False),
]


def _make(shape, n, dtype, opts, wdtype=None):
    x = (torch.randn(*shape, dtype=torch.float64) * 2 + 0.3).to(dtype)
    use_w = opts.get("weight", True)
    w = torch.randn(n, dtype=torch.float64).to(wdtype or dtype) if use_w else None
    b = torch.randn(n, dtype=torch.float64).to(wdtype or dtype) if opts.get("bias") else None
    kw = {k: v for k, v in opts.items() if k not in ("weight", "bias")}
    return x, w, b, kw


def _run(fn, tensors, dy):
    """Forward + backward; returns the output and the grads of every tensor that requires one."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in tensors]
    out = fn(*leaves)
    out.backward(dy)
    return out.detach(), [t.grad if t is not None else None for t in leaves]


def _compare(fn_ours, fn_ref, tensors, dtype, rows):
    y, grads = _run(fn_ours, tensors, dy := torch.randn_like(fn_ref(*tensors).detach()))
    tensors64 = [t.double() if t is not None else None for t in tensors]
    y64, grads64 = _run(fn_ref, tensors64, dy.double())
    y_eager, grads_eager = _run(fn_ref, tensors, dy)
    assert_close_to_reference(y, y64, y_eager, name="y")
    for i, (g, g64, ge) in enumerate(zip(grads, grads64, grads_eager, strict=True)):
        if g is not None:
            assert_close_to_reference(g, g64, ge, name=f"grad{i}", rows=rows if i else 1)


@pytest.mark.parametrize("opts", OPTION_SETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_options_against_spec(opts, dtype):
    n = 48
    x, w, b, kw = _make((2, 3, n), n, dtype, opts)

    def ours(x, w, b):
        return rmsnorm.rms_norm(x, (n,), w, 1e-5, bias=b, **kw)

    def spec(x, w, b):  # the reference differentiated by autograd
        return ref.rms_norm(x, w, 1e-5, bias=b, **kw)

    _compare(ours, spec, [x, w, b], dtype, rows=6)


@pytest.mark.parametrize("res_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("opts", OPTION_SETS[:3])
def test_add_rms_norm_against_spec(res_dtype, opts):
    n = 40
    x, w, b, kw = _make((5, n), n, torch.bfloat16, opts)
    r = torch.randn(5, n).to(res_dtype)
    out, res = rmsnorm.add_rms_norm(x, r, n, w, 1e-5, bias=b, **kw)
    assert res.dtype == res_dtype  # stored in the residual's dtype
    assert out.dtype == ref.output_dtype(x.dtype, w, kw["casting_mode"])

    def ours(x, r, w, b):
        out, res = rmsnorm.add_rms_norm(x, r, n, w, 1e-5, bias=b, **kw)
        return out.float() + 0.5 * res.float()  # both outputs carry gradient

    def spec(x, r, w, b):
        out, res = ref.add_rms_norm(x, r, w, 1e-5, bias=b, **kw)
        return out.to(torch.promote_types(out.dtype, torch.float32)) + 0.5 * res.to(out.dtype)

    _compare(ours, spec, [x, r, w, b], torch.bfloat16, rows=5)


def test_add_rms_norm_residual_out_is_fp32_sum():
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    r = torch.randn(3, 16, dtype=torch.bfloat16)
    _, res = rmsnorm.add_rms_norm(x, r, 16)
    assert torch.equal(res, (x.float() + r.float()).to(torch.bfloat16))


@pytest.mark.parametrize("has_w,has_b", [(True, True), (False, True), (False, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_against_spec(has_w, has_b, dtype):
    n = 36
    x = (torch.randn(4, 2, n) * 2 + 1).to(dtype)
    w = torch.randn(n).to(dtype) if has_w else None
    b = torch.randn(n).to(dtype) if has_b else None
    _compare(
        lambda x, w, b: rmsnorm.layer_norm(x, (n,), w, b),
        lambda x, w, b: ref.layer_norm(x, w, b),
        [x, w, b],
        dtype,
        rows=8,
    )


def test_matches_torch_layer_norm():
    x, w, b = torch.randn(6, 50), torch.randn(50), torch.randn(50)
    torch.testing.assert_close(
        rmsnorm.layer_norm(x, 50, w, b), torch.nn.functional.layer_norm(x, (50,), w, b)
    )


def test_gradcheck_float64():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    opts = dict(eps_mode="rms", offset=0.5, partial=0.5)
    gradcheck = torch.autograd.gradcheck
    assert gradcheck(lambda x, w, b: rmsnorm.rms_norm(x, 7, w, 1e-3, bias=b, **opts), (x, w, b))
    assert gradcheck(lambda x, r, w: rmsnorm.add_rms_norm(x, r, 7, w, 1e-3), (x, r, w))
    assert gradcheck(lambda x, w, b: rmsnorm.layer_norm(x, 7, w, b), (x, w, b))


# ------------------------------------------------------------------------------------------------
# Shapes and layouts
# ------------------------------------------------------------------------------------------------
def test_multi_dim_normalized_shape():
    x, w = torch.randn(2, 3, 4, 5), torch.randn(4, 5)
    y = rmsnorm.rms_norm(x, (4, 5), w, 1e-6)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (4, 5), w, 1e-6))


def test_non_contiguous_inputs():
    close, tf = torch.testing.assert_close, torch.nn.functional
    base = torch.randn(8, 64)
    x = base[:, ::2]  # last dim strided: must be made contiguous
    close(rmsnorm.rms_norm(x, 32), tf.rms_norm(x, (32,)))
    xt = torch.randn(16, 4).t()  # transposed
    close(rmsnorm.layer_norm(xt, 16), tf.layer_norm(xt, (16,)))
    rows = torch.randn(10, 48)[::3]  # strided rows, unit last stride
    close(rmsnorm.rms_norm(rows, 48), tf.rms_norm(rows, (48,)))


def test_zero_rows_forward_and_backward():
    x = torch.randn(0, 3, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    y = rmsnorm.rms_norm(x, 16, w)
    assert y.shape == (0, 3, 16)
    y.sum().backward()
    assert x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros(16))
    out, res = rmsnorm.add_rms_norm(x.detach(), x.detach(), 16)
    assert out.shape == res.shape == (0, 3, 16)


def test_input_is_not_modified_and_outputs_are_fresh():
    x, r = torch.randn(4, 8), torch.randn(4, 8)
    x0, r0 = x.clone(), r.clone()
    out, res = rmsnorm.add_rms_norm(x, r, 8)
    assert torch.equal(x, x0) and torch.equal(r, r0)
    assert res.data_ptr() not in (x.data_ptr(), r.data_ptr())


# ------------------------------------------------------------------------------------------------
# Edge rows
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps_mode", ["mean_square", "rms"])
def test_all_zero_row_gives_zeros_and_finite_grads(eps_mode):
    x = torch.randn(3, 16)
    x[1] = 0
    x.requires_grad_()
    w = torch.randn(16, requires_grad=True)
    y = rmsnorm.rms_norm(x, 16, w, 1e-6, eps_mode=eps_mode)
    assert torch.equal(y[1].detach(), torch.zeros(16))
    y.backward(torch.randn_like(y))
    assert x.grad.isfinite().all() and w.grad.isfinite().all()
    ln = rmsnorm.layer_norm(x.detach(), 16)
    assert torch.equal(ln[1], torch.zeros(16))


def test_nan_and_inf_stay_in_their_row():
    x = torch.randn(4, 16)
    x[1, 3] = float("nan")
    x[2, 0] = float("inf")
    for y in (rmsnorm.rms_norm(x, 16), rmsnorm.layer_norm(x, 16)):
        assert y[0].isfinite().all() and y[3].isfinite().all()
        assert y[1].isnan().any()
        assert not y[2].isfinite().all()


def test_default_eps_is_torchs():
    x = torch.full((1, 4), 1e-4, dtype=torch.bfloat16)
    torch.testing.assert_close(rmsnorm.rms_norm(x, 4), torch.nn.functional.rms_norm(x, (4,)))
    x64 = torch.full((1, 4), 1e-5, dtype=torch.float64)
    torch.testing.assert_close(
        rmsnorm.rms_norm(x64, 4), torch.nn.functional.rms_norm(x64, (4,)), rtol=1e-15, atol=0
    )


def test_autocast_cpu_leaves_ops_alone_like_torch():
    # On CPU torch's autocast has no rule for rms_norm / layer_norm; neither do we.
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = rmsnorm.rms_norm(x, 8, w)
        theirs = torch.nn.functional.rms_norm(x, (8,), w)
        assert ours.dtype == theirs.dtype
        assert rmsnorm.layer_norm(x.float(), 8).dtype == torch.float32


# ------------------------------------------------------------------------------------------------
# What torch's norms accept and return, beyond values
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape_arg, eps",
    [
        (np.int64(8), np.float32(1e-6)),
        ([np.int32(8)], np.float64(1e-6)),
        (torch.tensor(8), torch.tensor(1e-6)),
        ((torch.tensor(8),), 1),
        (torch.Size([8]), 1e-6),
    ],
    ids=["np-scalars", "np-list", "0d-tensors", "tuple-of-0d", "Size"],
)
def test_numpy_scalars_and_0d_tensors_are_accepted(shape_arg, eps):
    x, w, b = torch.randn(3, 8), torch.randn(8), torch.randn(8)
    tf = torch.nn.functional
    expected = tf.rms_norm(x, (8,), w, float(eps))
    torch.testing.assert_close(rmsnorm.rms_norm(x, shape_arg, w, eps), expected)
    torch.testing.assert_close(rmsnorm.add_rms_norm(x, x, shape_arg, w, eps)[1], x + x)
    torch.testing.assert_close(
        rmsnorm.layer_norm(x, shape_arg, w, b, eps), tf.layer_norm(x, (8,), w, b, float(eps))
    )
    if not isinstance(shape_arg, torch.Tensor):  # as torch.nn.RMSNorm, which iterates it
        module = rmsnorm.RMSNorm(shape_arg, eps=eps)
        torch.testing.assert_close(module(x), tf.rms_norm(x, (8,), None, float(eps)))
    torch.testing.assert_close(
        rmsnorm.rms_norm(x, 8, w, offset=np.float32(0.5)), tf.rms_norm(x, (8,), w + 0.5)
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        lambda: torch.randn(3, 4, 5).permute(1, 0, 2),  # rows contiguous, leading dims permuted
        lambda: torch.randn(4, 6).t(),  # the normalized dim itself strided
    ],
    ids=["channels_last", "permuted", "transposed"],
)
def test_output_memory_format_is_torchs(make):
    # torch's rms_norm keeps a channels_last input's format, its layer_norm returns contiguous rows
    tf = torch.nn.functional
    x = make()
    n = x.shape[-1]
    w = torch.randn(n)
    for ours, theirs in (
        (rmsnorm.rms_norm(x, n, w), tf.rms_norm(x, (n,), w)),
        (rmsnorm.layer_norm(x, n, w), tf.layer_norm(x, (n,), w)),
        (rmsnorm.add_rms_norm(x, x, n, w)[0], tf.rms_norm(x + x, (n,), w)),
        (rmsnorm.add_rms_norm(x, x, n, w)[1], x + x),
    ):
        torch.testing.assert_close(ours, theirs)
        assert ours.stride() == theirs.stride()
    xg = x.detach().clone().requires_grad_()  # the autograd path returns the same layout
    assert rmsnorm.rms_norm(xg, n, w).stride() == tf.rms_norm(x, (n,), w).stride()


@pytest.mark.parametrize("grad", [False, True])
def test_outputs_are_tensors_of_their_own_not_views(grad):
    x = torch.randn(2, 3, 16, requires_grad=grad)
    w = torch.randn(4, 4, requires_grad=grad)
    outs = [
        rmsnorm.rms_norm(x, 16),
        *rmsnorm.add_rms_norm(x, x, 16),
        rmsnorm.layer_norm(x, 16),
        rmsnorm.rms_norm(x.view(2, 3, 4, 4), (4, 4), w),
        rmsnorm.RMSNorm(16)(x),
    ]
    for out in outs:
        assert out._base is None and not out._is_view()


def test_jit_trace_records_the_ops_and_generalises_over_rows():
    fn = lambda x: rmsnorm.rms_norm(x, 8) + rmsnorm.layer_norm(x, 8)  # noqa: E731
    traced = torch.jit.trace(fn, torch.randn(3, 8))
    assert "rmsnorm::rms_norm_fwd" in str(traced.graph)
    x = torch.randn(5, 8)
    torch.testing.assert_close(traced(x), fn(x))


def test_fx_symbolic_trace_of_models_holding_the_modules():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = rmsnorm.RMSNorm(8, offset=1.0)
            self.add = rmsnorm.AddRMSNorm(8)
            self.ln = rmsnorm.LayerNorm(8)

        def forward(self, x):
            y, h = self.add(self.norm(x), x)
            return self.ln(y + h) + rmsnorm.rms_norm(h, 8)

    net = Net()
    gm = torch.fx.symbolic_trace(net)
    targets = {getattr(n.target, "__name__", n.target) for n in gm.graph.nodes}
    assert {"rms_norm", "add_rms_norm", "layer_norm"} <= targets
    x = torch.randn(4, 8)
    torch.testing.assert_close(gm(x), net(x))


def test_torch_function_subclasses_see_the_function(logged_subclass):
    Logged, seen = logged_subclass

    x = torch.randn(3, 8).as_subclass(Logged)
    y = rmsnorm.rms_norm(x, 8)
    assert "rms_norm" in seen and type(y) is Logged
    torch.testing.assert_close(y.as_subclass(torch.Tensor), rmsnorm.rms_norm(torch.Tensor(x), 8))


# ----------------------------------------------------------------------------------------------
# The four call paths: each forced, its result checked, and the path taken checked twice — by the
# record rmsnorm.set_debug keeps and by which path implementation actually ran.
# ----------------------------------------------------------------------------------------------
class _NoOpDispatchMode(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _forced(path, fn, *tensors):
    """fn(*tensors) on ``path``: "launch" (plain tensors, no gradient), "function" (a tensor needs
    a gradient), "op" (under a dispatch mode, as the tracers are) or "spec" (forward-mode AD)."""
    if path == "function":
        return fn(tensors[0].detach().requires_grad_(), *tensors[1:]).detach()
    if path == "op":
        with _NoOpDispatchMode():
            return fn(*tensors)
    if path == "spec":
        with torch.autograd.forward_ad.dual_level():
            return fn(*tensors)
    return fn(*tensors)


def _call_gated(x, z, w):
    return rmsnorm.gated_rms_norm(x, z, 8, w, 1e-6, group_size=4, casting_mode="llama")


def _spec_gated(x, z, w):
    opts, gating = (
        ref.RMSOptions(1e-6, "mean_square", "llama", 0.0, 4),
        ref.GateOptions(4, True, "silu"),
    )
    y, _ = ref.gated_rms_norm_fwd(x, z, w, None, opts, gating)
    return y


PATH_CASES = {
    "rms_norm": (
        lambda x, z, w: rmsnorm.rms_norm(x, 8, w, 1e-6, eps_mode="rms", offset=0.5, partial=0.5),
        lambda x, z, w: ref.rms_norm(x, w, 1e-6, eps_mode="rms", offset=0.5, partial=0.5),
    ),
    "add_rms_norm": (
        lambda x, z, w: rmsnorm.add_rms_norm(x, z, 8, w, 1e-6, casting_mode="none")[0],
        lambda x, z, w: ref.add_rms_norm(x, z, w, 1e-6, casting_mode="none")[0],
    ),
    "gated_rms_norm": (_call_gated, _spec_gated),
    "layer_norm": (
        lambda x, z, w: rmsnorm.layer_norm(x, 8, w, z[0]),
        lambda x, z, w: ref.layer_norm(x, w, z[0]),
    ),
}


@pytest.mark.parametrize("op", PATH_CASES)
@pytest.mark.parametrize("path", ["launch", "function", "op", "spec"])
def test_each_call_path_is_taken_and_agrees_with_the_spec(op, path, monkeypatch):
    from rmsnorm import functional

    taken = []
    impls = dict(zip(rmsnorm._calls.PATHS, functional._PATHS, strict=True))
    for name, impl in impls.items():
        method = getattr(impl, op)

        def spy(*args, _method=method, _name=name):
            taken.append(_name)
            return _method(*args)

        monkeypatch.setattr(impl, op, staticmethod(spy))
    x, z = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    w = torch.rand(8, dtype=torch.float64) + 0.5
    ours, spec = PATH_CASES[op]
    monkeypatch.setattr(rmsnorm._calls, "recording", True)
    y = _forced(path, ours, x, z, w)
    assert taken == [path]
    assert rmsnorm.last_calls()[op]["path"] == path
    torch.testing.assert_close(y, spec(x, z, w), rtol=1e-12, atol=1e-12)


def test_debug_log_names_the_path_and_backend_and_a_fallback_is_not_silent(caplog, monkeypatch):
    from rmsnorm import _backend, _calls

    monkeypatch.setattr(_calls, "recording", False)
    _calls.clear()
    x = torch.randn(2, 8, dtype=torch.float64)
    with caplog.at_level("DEBUG", logger="rmsnorm.calls"):
        rmsnorm.rms_norm(x, 8)  # not recorded: no record of the path, but a fallback still logs
        assert rmsnorm.last_calls() == {}
        backend = _backend.describe("cpu")
        if backend == "cpu":
            assert any("runs the reference" in r.getMessage() for r in caplog.records)
            assert any(k[:2] == ("cpu", "rms_norm_fwd") for k in _calls.fallbacks())
        caplog.clear()
        rmsnorm.set_debug(True)
        try:
            rmsnorm.rms_norm(x.requires_grad_(), 8)
        finally:
            rmsnorm.set_debug(False)
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"function path, {backend} backend" in m for m in messages), messages
    call = rmsnorm.last_calls()["rms_norm"]
    assert (call["path"], call["backend"], call["dtype"]) == ("function", backend, "float64")
    if backend == "cpu":
        assert call["fallback"].startswith("cpu rms_norm_fwd → reference")
    with pytest.raises(TypeError, match="on must be True or False"):
        rmsnorm.set_debug("yes")
