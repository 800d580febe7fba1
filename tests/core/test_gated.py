"""Gated and grouped RMSNorm through the public API: ``gated_rms_norm``, ``group_size`` on
``rms_norm`` / ``add_rms_norm``, the ``GatedRMSNorm`` module; values against the spec and float64,
every transform torch's norms support, layouts, errors."""

import copy
import pickle

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch._dynamo.testing import CompileCounter
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import rmsnorm
from rmsnorm import reference as ref
from rmsnorm.testing import assert_close_to_reference

silu = torch.nn.functional.silu

# Pairwise over the options that change the function: order, groups, activation, casting mode,
# eps placement, offset, bias, partial, weight (N = 24: groups of 4, 6, 8 and 24).
OPTION_SETS = [
    dict(norm_before_gate=True),  # Qwen3-Next's order, one group
    dict(norm_before_gate=False, group_size=8, casting_mode="llama"),  # Mamba2's, 3 groups
    dict(norm_before_gate=True, group_size=6, activation="sigmoid", offset=1.0, bias=True),
    dict(norm_before_gate=False, casting_mode="none", eps_mode="rms", partial=0.5),
    dict(norm_before_gate=True, group_size=4, casting_mode="llama", partial=0.5, weight=False),
    dict(norm_before_gate=False, group_size=6, activation="sigmoid", bias=True, offset=-0.5),
    dict(norm_before_gate=True, casting_mode="none", group_size=8, eps_mode="rms"),
]
N = 24


def _make(shape, dtype, opts, wdtype=None):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(*shape, generator=g, dtype=torch.float64) * 2 + 0.3).to(dtype)
    z = (torch.randn(*shape, generator=g, dtype=torch.float64) * 2).to(dtype)
    use_w = opts.get("weight", True)
    w = torch.randn(N, generator=g, dtype=torch.float64).to(wdtype or dtype) if use_w else None
    b = torch.randn(N, generator=g, dtype=torch.float64).to(wdtype or dtype)
    kw = {k: v for k, v in opts.items() if k not in ("weight", "bias")}
    return x, z, w, (b if opts.get("bias") else None), kw


def _run(fn, tensors, dy):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in tensors]
    out = fn(*leaves)
    out.backward(dy)
    return out.detach(), [t.grad if t is not None else None for t in leaves]


@pytest.mark.parametrize("opts", OPTION_SETS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gated_rms_norm_against_the_spec_and_float64(opts, dtype):
    x, z, w, b, kw = _make((2, 3, N), dtype, opts)

    def ours(x, z, w, b):
        return rmsnorm.gated_rms_norm(x, z, N, w, 1e-5, bias=b, **kw)

    def spec(x, z, w, b):
        return ref.gated_rms_norm(x, z, w, 1e-5, bias=b, **kw)

    tensors = [x, z, w, b]
    dy = torch.randn(2, 3, N).to(ours(*tensors).dtype)
    y, grads = _run(ours, tensors, dy)
    y_spec, grads_spec = _run(spec, tensors, dy)
    y64, grads64 = _run(spec, [t.double() if t is not None else None for t in tensors], dy.double())
    assert_close_to_reference(y, y64, y_spec, name="y")
    for name, g, g64, ge in zip("xzwb", grads, grads64, grads_spec, strict=True):
        if g is not None:
            assert_close_to_reference(g, g64, ge, name=f"d{name}", rows=6 if name in "wb" else 1)


@pytest.mark.parametrize("order", [True, False])
@pytest.mark.parametrize("mode", ref.CASTING_MODES)
def test_output_dtype_with_fp32_weights_and_bf16_inputs(mode, order):
    x, z, w, _, _ = _make((4, N), torch.bfloat16, {}, wdtype=torch.float32)
    y = rmsnorm.gated_rms_norm(x, z, N, w, norm_before_gate=order, casting_mode=mode)
    assert y.dtype == ref.gated_output_dtype(torch.bfloat16, w, mode, order)
    assert torch.equal(y, ref.gated_rms_norm(x, z, w, norm_before_gate=order, casting_mode=mode))


def test_no_gate_is_rms_norm_and_one_group_is_the_plain_norm():
    x, z, w, b, _ = _make((5, N), torch.bfloat16, {})
    plain = rmsnorm.rms_norm(x, N, w, 1e-6, casting_mode="llama")
    assert torch.equal(rmsnorm.gated_rms_norm(x, None, N, w, 1e-6, casting_mode="llama"), plain)
    assert torch.equal(rmsnorm.rms_norm(x, N, w, 1e-6, casting_mode="llama", group_size=N), plain)
    module = rmsnorm.GatedRMSNorm(N, eps=1e-6, casting_mode="llama", dtype=torch.bfloat16)
    assert torch.equal(module(x), rmsnorm.rms_norm(x, N, module.weight, 1e-6, casting_mode="llama"))
    grouped = rmsnorm.gated_rms_norm(x, None, N, w, 1e-6, group_size=8)
    assert torch.equal(grouped, rmsnorm.rms_norm(x, N, w, 1e-6, group_size=8))


def test_no_gate_checks_the_arguments_once(monkeypatch):
    from rmsnorm import functional

    x, _, w, _, _ = _make((3, N), torch.float32, {})
    real, calls = functional._rms_arguments, []

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(functional, "_rms_arguments", counted)
    y = rmsnorm.gated_rms_norm(x, None, N, w, 1e-6, eps_mode="rms", partial=0.5)
    assert len(calls) == 1
    monkeypatch.setattr(functional, "_rms_arguments", real)
    assert torch.equal(y, rmsnorm.rms_norm(x, N, w, 1e-6, eps_mode="rms", partial=0.5))


def test_grouped_rms_norm_normalizes_each_group_on_its_own():
    scales = torch.tensor([0.01, 1.0, 100.0]).repeat_interleave(8)
    x = torch.randn(2, 5, N) * scales
    w = torch.randn(N)
    y = rmsnorm.rms_norm(x, N, w, 1e-6, group_size=8)
    for i in range(3):
        part = slice(8 * i, 8 * i + 8)
        expected = torch.nn.functional.rms_norm(x[..., part], (8,), w[part], 1e-6)
        torch.testing.assert_close(y[..., part], expected)
    # a multi-dim normalized_shape: groups run over the flattened (H, D) dims; g = D is a
    # per-head norm with an (H, D) weight
    xh, wh = x.reshape(2, 5, 3, 8), w.reshape(3, 8)
    yh = rmsnorm.rms_norm(xh, (3, 8), wh, 1e-6, group_size=8)
    torch.testing.assert_close(yh, y.reshape(2, 5, 3, 8))
    zh = torch.randn(2, 5, 3, 8)
    gated = rmsnorm.gated_rms_norm(xh, zh, (3, 8), wh, 1e-6, group_size=8)
    torch.testing.assert_close(gated, yh * silu(zh))


def test_grouped_add_rms_norm_and_its_module():
    x, r = torch.randn(4, N, dtype=torch.bfloat16), torch.randn(4, N)
    w = torch.randn(N)
    out, h = rmsnorm.add_rms_norm(x, r, N, w, 1e-6, group_size=6)
    assert h.dtype == torch.float32 and torch.equal(h, x.float() + r)
    assert torch.equal(out, ref.add_rms_norm(x, r, w, 1e-6, group_size=6)[0])
    module = rmsnorm.AddRMSNorm(N, eps=1e-6, group_size=6)
    with torch.no_grad():
        module.weight.copy_(w)
    for a, e in zip(module(x, r), (out, h), strict=True):
        assert torch.equal(a, e)
    xg, rg = x.float().requires_grad_(), r.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, r: rmsnorm.add_rms_norm(x, r, N, None, group_size=6)[0],
        (xg.double().detach().requires_grad_(), rg.double().detach().requires_grad_()),
    )


# ------------------------------------------------------------------------------------------------
# Transforms: autograd to second order, forward AD, torch.func, compile, export, traces
# ------------------------------------------------------------------------------------------------
# (name, ours(x, z, w, b), the spec in torch operations)
CASES = [
    ("norm_gate", lambda x, z, w, b: rmsnorm.gated_rms_norm(x, z, N, w, 1e-5),
     lambda x, z, w, b: ref.gated_rms_norm(x, z, w, 1e-5)),
    ("gate_norm_groups_llama", lambda x, z, w, b: rmsnorm.gated_rms_norm(
        x, z, N, w, 1e-5, group_size=8, norm_before_gate=False, casting_mode="llama"),
     lambda x, z, w, b: ref.gated_rms_norm(
        x, z, w, 1e-5, group_size=8, norm_before_gate=False, casting_mode="llama")),
    ("sigmoid_rms_partial_bias_offset", lambda x, z, w, b: rmsnorm.gated_rms_norm(
        x, z, N, w, 1e-5, group_size=6, activation="sigmoid", eps_mode="rms", partial=0.5,
        bias=b, offset=1.0),
     lambda x, z, w, b: ref.gated_rms_norm(
        x, z, w, 1e-5, group_size=6, activation="sigmoid", eps_mode="rms", partial=0.5, bias=b,
        offset=1.0)),
    ("grouped_rms", lambda x, z, w, b: rmsnorm.rms_norm(x, N, w, 1e-5, group_size=4, bias=b) * z,
     lambda x, z, w, b: ref.rms_norm(x, w, 1e-5, group_size=4, bias=b) * z),
]  # fmt: skip
IDS = [c[0] for c in CASES]


def _inputs(dtype=torch.float64, rows=3):
    return (torch.randn(rows, N, dtype=dtype) + 0.2, torch.randn(rows, N, dtype=dtype),
            torch.randn(N, dtype=dtype), torch.randn(N, dtype=dtype))  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradcheck_and_gradgradcheck(case):
    _, ours, _ = case
    tensors = [t.requires_grad_() for t in _inputs(rows=2)]
    assert torch.autograd.gradcheck(ours, tensors)
    assert torch.autograd.gradgradcheck(ours, tensors)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_ad_and_torch_func_transforms_equal_the_spec(case):
    _, ours, spec = case
    x, z, w, b = _inputs()
    vx, vz = torch.randn_like(x), torch.randn_like(z)
    with fwAD.dual_level():
        out = ours(fwAD.make_dual(x, vx), fwAD.make_dual(z, vz), w, b)
        tangent = fwAD.unpack_dual(out).tangent
    _, expected = jvp(lambda x, z: spec(x, z, w, b), (x, z), (vx, vz))
    torch.testing.assert_close(tangent, expected)
    assert expected.abs().max() > 0.1

    def transforms(fn):
        scalar = lambda x, z, w: fn(x, z, w, b).sin().sum()  # noqa: E731
        return {
            "grad": grad(scalar, argnums=(0, 1, 2))(x, z, w),
            "jacrev": jacrev(lambda z: fn(x, z, w, b))(z),
            "jacfwd": jacfwd(lambda w: fn(x, z, w, b))(w),
            "hessian": hessian(scalar, argnums=1)(x[:2], z[:2], w),
            "vjp": vjp(lambda x: fn(x, z, w, b), x)[1](torch.ones_like(x)),
            "vmap": vmap(lambda x, z: fn(x, z, w, b))(x.unsqueeze(1), z.unsqueeze(1)),
            "per_sample": vmap(grad(lambda w, x, z: scalar(x, z, w)), in_dims=(None, 0, 0))(
                w, x.unsqueeze(1), z.unsqueeze(1)
            ),
        }

    got, expected = transforms(ours), transforms(spec)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], msg=key)


def test_double_backward_through_the_module():
    x, z, w, _ = (t.requires_grad_() for t in _inputs())
    norm = rmsnorm.GatedRMSNorm(N, eps=1e-5, group_size=8, norm_before_gate=False)
    norm.double()
    with torch.no_grad():
        norm.weight.copy_(w)
    (gx, gz) = torch.autograd.grad(norm(x, z).sin().sum(), (x, z), create_graph=True)
    got = torch.autograd.grad((gx.square().sum() + gz.square().sum()), (x, z, norm.weight))
    y = ref.gated_rms_norm(x, z, w, 1e-5, group_size=8, norm_before_gate=False)
    (ex, ez) = torch.autograd.grad(y.sin().sum(), (x, z), create_graph=True)
    expected = torch.autograd.grad((ex.square().sum() + ez.square().sum()), (x, z, w))
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a, e)


def test_compile_fullgraph_functions_and_modules():
    x, z, w, b = (t.float().requires_grad_() for t in _inputs(rows=4))
    calls = [
        (lambda x, z, w: rmsnorm.gated_rms_norm(x, z, N, w, group_size=8), (x, z, w)),
        (lambda x, w, b: rmsnorm.rms_norm(x, N, w, bias=b, group_size=6, partial=0.5), (x, w, b)),
        (lambda x, z, w: rmsnorm.add_rms_norm(x, z, N, w, group_size=4), (x, z, w)),
        (rmsnorm.GatedRMSNorm(N, group_size=6, norm_before_gate=False, bias=True), (x, z)),
        (rmsnorm.RMSNorm(N, group_size=12, offset=1.0), (x,)),
    ]
    for fn, args in calls:
        torch._dynamo.reset()
        as_tuple = lambda out: out if isinstance(out, tuple) else (out,)  # noqa: E731
        eager = as_tuple(fn(*args))
        compiled = as_tuple(torch.compile(fn, fullgraph=True)(*args))
        for e, c in zip(eager, compiled, strict=True):
            torch.testing.assert_close(c, e)
        sum(t.sum() for t in compiled).backward()


def test_dynamic_rows_do_not_recompile():
    torch._dynamo.reset()
    counter = CompileCounter()
    w = torch.randn(N)
    fn = torch.compile(
        lambda x, z: rmsnorm.gated_rms_norm(x, z, N, w, group_size=8, norm_before_gate=False),
        backend=counter, dynamic=True, fullgraph=True,
    )  # fmt: skip
    for rows in (3, 5, 17, 64):
        x, z = torch.randn(rows, N), torch.randn(rows, N)
        torch.testing.assert_close(fn(x, z), ref.gated_rms_norm(
            x, z, w, group_size=8, norm_before_gate=False))  # fmt: skip
    assert counter.frame_count == 1


def test_export_with_a_dynamic_batch():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gated = rmsnorm.GatedRMSNorm(N, eps=1e-6, group_size=8, casting_mode="llama")
            self.grouped = rmsnorm.RMSNorm(N, eps=1e-6, group_size=6)

        def forward(self, x, z):
            return self.grouped(self.gated(x, z))

    net = Net()
    x, z = torch.randn(3, N), torch.randn(3, N)
    batch = torch.export.Dim("batch")
    ep = torch.export.export(net, (x, z), dynamic_shapes=({0: batch}, {0: batch}))
    torch.testing.assert_close(ep.module()(x, z), net(x, z))
    x5, z5 = torch.randn(5, N), torch.randn(5, N)
    torch.testing.assert_close(ep.module()(x5, z5), net(x5, z5))


def test_jit_trace_and_fx_symbolic_trace():
    norm = rmsnorm.GatedRMSNorm(N, group_size=8)
    x, z = torch.randn(3, N), torch.randn(3, N)
    traced = torch.jit.trace(norm, (x, z))
    x5, z5 = torch.randn(5, N), torch.randn(5, N)
    torch.testing.assert_close(traced(x5, z5), norm(x5, z5))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = rmsnorm.GatedRMSNorm(N, group_size=8)

        def forward(self, x, z):
            return self.norm(x, z) + rmsnorm.rms_norm(x, N, group_size=4)

    gm = torch.fx.symbolic_trace(Net())
    targets = {getattr(n.target, "__name__", n.target) for n in gm.graph.nodes}
    assert {"gated_rms_norm", "rms_norm"} <= targets
    torch.testing.assert_close(gm(x, z), Net()(x, z))


def test_torch_function_subclasses_see_the_function(logged_subclass):
    Logged, seen = logged_subclass

    x, z = torch.randn(3, N), torch.randn(3, N)
    y = rmsnorm.gated_rms_norm(x, z.as_subclass(Logged), N)  # the gate alone is enough
    assert "gated_rms_norm" in seen and type(y) is Logged
    torch.testing.assert_close(y.as_subclass(torch.Tensor), rmsnorm.gated_rms_norm(x, z, N))
    seen.clear()
    rmsnorm.rms_norm(x.as_subclass(Logged), N, group_size=4)
    assert "rms_norm" in seen


def test_autocast_cpu_leaves_the_gated_op_alone():
    x, z = torch.randn(4, N, dtype=torch.bfloat16), torch.randn(4, N, dtype=torch.bfloat16)
    w = torch.randn(N)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = rmsnorm.gated_rms_norm(x, z, N, w)
    assert y.dtype == torch.bfloat16 and torch.equal(y, rmsnorm.gated_rms_norm(x, z, N, w))


# ------------------------------------------------------------------------------------------------
# Layouts and edge rows
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2, 3, 4, N).to(memory_format=torch.channels_last),
        lambda: torch.randn(3, 4, N).permute(1, 0, 2),
        lambda: torch.randn(N, 6).t(),  # the normalized dim itself strided
    ],
    ids=["channels_last", "permuted", "transposed"],
)
def test_layouts_give_rms_norms_memory_format(make):
    x, z = make(), make()
    w = torch.randn(N)
    y = rmsnorm.gated_rms_norm(x, z, N, w, group_size=8)
    xc, zc = x.contiguous(), z.contiguous()
    torch.testing.assert_close(y, rmsnorm.gated_rms_norm(xc, zc, N, w, group_size=8))
    assert y.stride() == torch.nn.functional.rms_norm(x, (N,), w).stride()
    yg = rmsnorm.rms_norm(x, N, w, group_size=8)
    assert yg.stride() == y.stride()


def test_zero_rows_and_zero_groups():
    x, z = torch.randn(0, 3, N, requires_grad=True), torch.randn(0, 3, N, requires_grad=True)
    y = rmsnorm.gated_rms_norm(x, z, N, group_size=8)
    assert y.shape == (0, 3, N)
    y.sum().backward()
    assert x.grad.shape == x.shape and z.grad.shape == z.shape
    xz = torch.zeros(2, N)
    xz[1] = torch.randn(N)
    for order in (True, False):
        out = rmsnorm.gated_rms_norm(xz, torch.randn(2, N), N, group_size=8, norm_before_gate=order)
        assert torch.equal(out[0], torch.zeros(N)) and out.isfinite().all()


# ------------------------------------------------------------------------------------------------
# Errors: the argument is named, with the expected form
# ------------------------------------------------------------------------------------------------
X, Z, W = torch.randn(4, N), torch.randn(4, N), torch.randn(N)
ERRORS = [
    (lambda: rmsnorm.gated_rms_norm(X, torch.randn(4, N - 1), N), ValueError, ["gate", "shape"]),
    (lambda: rmsnorm.gated_rms_norm(X, torch.randn(N), N), ValueError, ["gate", "[4, 24]"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z.int(), N), TypeError, ["gate", "floating"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z.tolist(), N), TypeError, ["gate", "Tensor"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, N, group_size=5), ValueError, ["group_size", "24"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, N, group_size=0), ValueError, ["group_size"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, N, group_size=4.0), TypeError, ["group_size", "int"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, N, group_size=True), TypeError, ["group_size"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, N, norm_before_gate=1), TypeError,
     ["norm_before_gate"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, N, activation="gelu"), ValueError,
     ["activation", "silu"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, N, offset=1.0), ValueError, ["offset", "weight"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, 7), ValueError, ["normalized_shape"]),
    (lambda: rmsnorm.gated_rms_norm(X.int(), Z, N), TypeError, ["input", "floating"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, N, torch.randn(7)), ValueError, ["weight", "[24]"]),
    (lambda: rmsnorm.gated_rms_norm(X, Z, N, casting_mode="t5"), ValueError, ["casting_mode"]),
    (lambda: rmsnorm.rms_norm(X, N, group_size=7), ValueError, ["group_size", "divide", "24"]),
    (lambda: rmsnorm.rms_norm(X, N, group_size=-4), ValueError, ["group_size", "positive"]),
    (lambda: rmsnorm.add_rms_norm(X, Z, N, group_size=10), ValueError, ["group_size"]),
    (lambda: rmsnorm.RMSNorm(N, group_size=5), ValueError, ["group_size"]),
    (lambda: rmsnorm.GatedRMSNorm(N, group_size=5), ValueError, ["group_size"]),
    (lambda: rmsnorm.GatedRMSNorm(N, activation="relu"), ValueError, ["activation"]),
    (lambda: rmsnorm.GatedRMSNorm(N, norm_before_gate="yes"), TypeError, ["norm_before_gate"]),
    (lambda: rmsnorm.GatedRMSNorm(N, elementwise_affine=False, bias=True), ValueError, ["bias"]),
    (lambda: rmsnorm.GatedRMSNorm(N, elementwise_affine=False, offset=1.0), ValueError,
     ["offset"]),
]  # fmt: skip


@pytest.mark.parametrize("call,exc,words", ERRORS)
def test_bad_input_is_named(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_gate_on_another_device_is_named():
    # the meta device stands in for a second device on machines without a GPU
    with pytest.raises(ValueError, match="gate is on meta but input is on cpu"):
        rmsnorm.gated_rms_norm(X, torch.randn(4, N, device="meta"), N)


# ------------------------------------------------------------------------------------------------
# The module
# ------------------------------------------------------------------------------------------------
def test_module_parameters_init_and_state_dict():
    assert list(rmsnorm.GatedRMSNorm(N).state_dict()) == ["weight"]
    assert list(rmsnorm.GatedRMSNorm(N, bias=True).state_dict()) == ["weight", "bias"]
    assert list(rmsnorm.GatedRMSNorm(N, elementwise_affine=False).state_dict()) == []
    norm = rmsnorm.GatedRMSNorm((3, 8), offset=1.0, bias=True)
    assert norm.weight.shape == (3, 8) and torch.equal(norm.weight, torch.zeros(3, 8))
    assert torch.equal(norm.bias, torch.zeros(3, 8))
    x, z = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    torch.testing.assert_close(norm(x, z), torch.nn.functional.rms_norm(x, (3, 8)) * silu(z))
    # a state_dict of the same names loads both ways (the HF and mamba_ssm classes hold `weight`)
    other = rmsnorm.GatedRMSNorm((3, 8), bias=True)
    other.load_state_dict(norm.state_dict())
    assert torch.equal(other.weight, norm.weight)


def test_module_dtype_and_device_moves_copies_and_pickles():
    norm = rmsnorm.GatedRMSNorm(N, eps=1e-6, group_size=8, norm_before_gate=False, bias=True)
    with torch.no_grad():
        norm.weight.normal_()
    x, z = torch.randn(3, N, dtype=torch.bfloat16), torch.randn(3, N, dtype=torch.bfloat16)
    half = copy.deepcopy(norm).to(torch.bfloat16)
    assert half.weight.dtype == torch.bfloat16 and half(x, z).dtype == torch.bfloat16
    expected = rmsnorm.gated_rms_norm(
        x, z, N, half.weight, 1e-6, group_size=8, norm_before_gate=False, bias=half.bias
    )
    assert torch.equal(half(x, z), expected)
    assert norm.double()(x.double(), z.double()).dtype == torch.float64
    meta = rmsnorm.GatedRMSNorm(N, device="meta")
    assert meta.weight.is_meta
    meta.to_empty(device="cpu").reset_parameters()
    assert torch.equal(meta.weight, torch.ones(N))
    for clone in (copy.deepcopy(norm), pickle.loads(pickle.dumps(norm))):
        assert repr(clone) == repr(norm)
        torch.testing.assert_close(clone(x.double(), z.double()), norm(x.double(), z.double()))


def test_module_repr_names_every_option_away_from_its_default():
    assert repr(rmsnorm.GatedRMSNorm(8)) == "GatedRMSNorm((8,), eps=None, elementwise_affine=True)"
    full = rmsnorm.GatedRMSNorm(
        8, 1e-5, group_size=4, norm_before_gate=False, activation="sigmoid", eps_mode="rms",
        casting_mode="llama", offset=1.0, bias=True, partial=0.5,
    )  # fmt: skip
    assert repr(full) == (
        "GatedRMSNorm((8,), eps=1e-05, elementwise_affine=True, group_size=4, "
        "norm_before_gate=False, activation='sigmoid', eps_mode='rms', casting_mode='llama', "
        "offset=1.0, bias=True, partial=0.5)"
    )
    grouped = rmsnorm.RMSNorm(8, group_size=4)
    assert "group_size=4" in repr(grouped)
    assert isinstance(grouped, torch.nn.RMSNorm)  # grouped RMSNorm is an RMSNorm
    assert not isinstance(rmsnorm.GatedRMSNorm(8), torch.nn.RMSNorm)  # the gated one is not


def test_module_under_functional_call_and_vmap():
    norm = rmsnorm.GatedRMSNorm(N, group_size=6)
    params = {"weight": torch.randn(N)}
    x, z = torch.randn(3, N), torch.randn(3, N)
    out = torch.func.functional_call(norm, params, (x, z))
    torch.testing.assert_close(out, ref.gated_rms_norm(x, z, params["weight"], group_size=6))
    batched = vmap(lambda x, z: torch.func.functional_call(norm, params, (x, z)))(x, z)
    torch.testing.assert_close(batched, out)
