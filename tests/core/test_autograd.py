"""Autograd beyond a first backward, on every backend: gradcheck and gradgradcheck (double
backward), forward-mode AD, the torch.func transforms (jvp, vjp, vmap, grad, jacrev, jacfwd,
hessian, per-sample gradients), inference-mode inputs. Each is compared with torch's own op where
torch has one, and with the spec otherwise."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import rmsnorm
from launcher_support import AVAILABLE as BACKENDS
from rmsnorm import reference as ref

N = 8

# (name, our function of (x, w, b), the same computed by torch's op or the spec in torch ops).
# Pairwise over the options that change the derivative: eps_mode, partial, offset, bias, casting.
CASES = [
    (
        "rms",
        lambda x, w, b: rmsnorm.rms_norm(x, N, w, 1e-5),
        lambda x, w, b: F.rms_norm(x, (N,), w, 1e-5),
    ),
    (
        "rms_eps_rms_partial_bias",
        lambda x, w, b: rmsnorm.rms_norm(x, N, w, 1e-5, eps_mode="rms", partial=0.5, bias=b),
        lambda x, w, b: ref.rms_norm(x, w, 1e-5, eps_mode="rms", partial=0.5, bias=b),
    ),
    (
        "rms_offset_llama",
        lambda x, w, b: rmsnorm.rms_norm(x, N, w, 1e-5, offset=1.0, casting_mode="llama"),
        lambda x, w, b: ref.rms_norm(x, w, 1e-5, offset=1.0, casting_mode="llama"),
    ),
    (
        "add_rms",
        lambda x, w, b: _sum_both(rmsnorm.add_rms_norm(x, x.cos(), N, w, bias=b)),
        lambda x, w, b: _sum_both(ref.add_rms_norm(x, x.cos(), w, None, bias=b)),
    ),
    (
        "layer",
        lambda x, w, b: rmsnorm.layer_norm(x, N, w, b),
        lambda x, w, b: F.layer_norm(x, (N,), w, b),
    ),
]
IDS = [c[0] for c in CASES]


def _sum_both(pair):
    out, residual = pair
    return out + 0.5 * residual


def _inputs(dtype=torch.float64, rows=3):
    x = torch.randn(rows, N, dtype=dtype) + 0.2
    return x, torch.randn(N, dtype=dtype), torch.randn(N, dtype=dtype)


# ----------------------------------------------------------------------------------------------
# Reverse mode, first and second order, on every backend (float64: the CPU kernels hand float64
# to the reference; the Triton kernels accumulate in float64)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradcheck_and_gradgradcheck(backend, case):
    _, ours, _ = case
    x, w, b = (t.requires_grad_() for t in _inputs(rows=2))
    with rmsnorm.use_backend(backend):
        assert torch.autograd.gradcheck(ours, (x, w, b))
        assert torch.autograd.gradgradcheck(ours, (x, w, b))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_double_backward_equals_torch_or_the_spec(backend, case):
    _, ours, theirs = case
    x, w, b = _inputs()

    def second_order(fn):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        gx, gw = torch.autograd.grad(fn(xs, ws, bs).sin().sum(), (xs, ws), create_graph=True)
        return torch.autograd.grad(
            gx.square().sum() + gw.square().sum(),
            (xs, ws, bs),
            allow_unused=True,
            materialize_grads=True,
        )

    with rmsnorm.use_backend(backend):
        got = second_order(ours)
    for g, e in zip(got, second_order(theirs), strict=True):
        torch.testing.assert_close(g, e)


# ----------------------------------------------------------------------------------------------
# Forward mode and torch.func
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_ad_gives_the_tangent(backend, case):
    _, ours, theirs = case
    x, w, b = _inputs()
    vx, vw = torch.randn_like(x), torch.randn_like(w)
    with rmsnorm.use_backend(backend):
        with fwAD.dual_level():
            out = ours(fwAD.make_dual(x, vx), fwAD.make_dual(w, vw), b)
            tangent = fwAD.unpack_dual(out).tangent
        primal, jvp_out = jvp(lambda x, w: ours(x, w, b), (x, w), (vx, vw))
    _, expected = jvp(lambda x, w: theirs(x, w, b), (x, w), (vx, vw))
    assert tangent is not None
    torch.testing.assert_close(tangent, expected)
    torch.testing.assert_close(jvp_out, expected)
    torch.testing.assert_close(primal, theirs(x, w, b))
    assert expected.abs().max() > 0.1  # a tangent of zeros would not pass unnoticed


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_torch_func_transforms_equal_torch(backend, case):
    _, ours, theirs = case
    x, w, b = _inputs()

    def transforms(fn):
        """Every torch.func transform of fn(x, w, b) the test compares."""
        scalar = lambda x, w: fn(x, w, b).sin().sum()  # noqa: E731
        return {
            "grad": grad(scalar, argnums=(0, 1))(x, w),
            "jacrev": jacrev(lambda x: fn(x, w, b))(x),
            "jacfwd": jacfwd(lambda w: fn(x, w, b))(w),
            "hessian": hessian(scalar)(x[:2], w),
            "vjp": vjp(lambda x: fn(x, w, b), x)[1](torch.ones_like(x)),
            "vmap": vmap(lambda x: fn(x, w, b))(x.unsqueeze(1)),
            # per-sample gradients of the weight: vmap over grad
            "per_sample": vmap(grad(lambda w, x: scalar(x, w)), in_dims=(None, 0))(
                w, x.unsqueeze(1)
            ),
        }

    with rmsnorm.use_backend(backend):
        got = transforms(ours)
    expected = transforms(theirs)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], msg=key)


def test_vmap_over_batched_weights_equals_torch():
    x, w = torch.randn(4, 3, N), torch.randn(4, N)
    got = vmap(lambda x, w: rmsnorm.rms_norm(x, N, w))(x, w)
    torch.testing.assert_close(got, vmap(lambda x, w: F.rms_norm(x, (N,), w))(x, w))


def test_modules_under_functional_call_and_vmap():
    norm, ln = rmsnorm.RMSNorm(N), rmsnorm.LayerNorm(N)
    params = {"weight": torch.randn(5, N)}
    x = torch.randn(5, 2, N)

    def call(module):
        return vmap(lambda p, x: torch.func.functional_call(module, {"weight": p}, (x,)))

    torch.testing.assert_close(
        call(norm)(params["weight"], x),
        vmap(lambda w, x: F.rms_norm(x, (N,), w))(params["weight"], x),
    )
    torch.testing.assert_close(
        vmap(lambda p, x: torch.func.functional_call(ln, {"weight": p, "bias": ln.bias}, (x,)))(
            params["weight"], x
        ),
        vmap(lambda w, x: F.layer_norm(x, (N,), w, ln.bias))(params["weight"], x),
    )


# ----------------------------------------------------------------------------------------------
# Inputs made under torch.inference_mode
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_mode_inputs_with_a_trainable_weight(backend):
    with torch.inference_mode():
        x = torch.randn(4, N)
    w = torch.randn(N, requires_grad=True)
    b = torch.randn(N, requires_grad=True)
    w_ref, b_ref = (t.detach().clone().requires_grad_() for t in (w, b))
    with rmsnorm.use_backend(backend):
        (rmsnorm.rms_norm(x, N, w) + rmsnorm.layer_norm(x, N, w, b)).square().sum().backward()
    # torch's layer_norm refuses such an input (it saves it); ours matches it on a normal copy
    (
        F.rms_norm(x, (N,), w_ref) + F.layer_norm(x.clone(), (N,), w_ref, b_ref)
    ).square().sum().backward()
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b.grad, b_ref.grad, rtol=1e-4, atol=1e-5)
    # and through the custom op, which dispatch modes and tensor subclasses use
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    w.grad = None
    with Passthrough():
        y = rmsnorm.rms_norm(x, N, w) + rmsnorm.layer_norm(x, N, w, b)
    y.square().sum().backward()
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Non-contiguous samples and memory formats, forward and backward, on every backend
# ----------------------------------------------------------------------------------------------
_LAYOUTS = {
    "strided rows": lambda: torch.randn(6, 2 * N)[::2, :N],
    "strided elements": lambda: torch.randn(4, 2 * N)[:, ::2],
    "transposed": lambda: torch.randn(N, 5).t(),
    "expanded": lambda: torch.randn(1, N).expand(4, N),
    "channels_last": lambda: torch.randn(2, 3, 4, N).to(memory_format=torch.channels_last),
    "storage offset": lambda: torch.randn(5 * N)[N - 1 : 4 * N - 1].view(3, N),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_launch_layers_common_case_and_general_path_give_the_same_bits(backend, monkeypatch):
    """Contiguous rows of one normalized dim go straight to the backend; the same values in
    strided rows take the general path (rows presented, outputs reshaped). Both are taken, and
    every output and gradient agrees to the bit, add_rms_norm's d residual and the gated norm's
    d gate included."""
    from rmsnorm import _launch

    general = []
    as_rows = _launch._as_rows
    monkeypatch.setattr(_launch, "_as_rows", lambda t, d: general.append(1) or as_rows(t, d))
    base = torch.randn(2, 3, 2 * N)
    res, w, b = torch.randn(2, 3, N), torch.randn(N), torch.randn(N)

    def run(x0):
        x = x0.detach().requires_grad_()
        r = res.clone().requires_grad_()
        wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
        with rmsnorm.use_backend(backend):
            outs = [rmsnorm.rms_norm(x, N, wg), rmsnorm.layer_norm(x, N, wg, bg)]
            outs += list(rmsnorm.add_rms_norm(x, r, N, wg))
            outs.append(rmsnorm.gated_rms_norm(x, r, N, wg, group_size=N // 2))
        grads = torch.autograd.grad(sum(o.square().sum() for o in outs), (x, r, wg, bg))
        return [o.detach().contiguous() for o in outs] + [g.contiguous() for g in grads]

    contiguous = run(base[..., :N].contiguous())
    assert not general  # the common case: no row presentation
    strided = run(base[..., :N])
    assert general  # the general path
    for got, exp in zip(strided, contiguous, strict=True):
        assert torch.equal(got, exp)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_layouts_on_every_backend(backend, layout):
    x0 = _LAYOUTS[layout]()
    w = torch.randn(N)
    x = x0.detach().requires_grad_()  # a leaf with the layout under test
    wg = w.clone().requires_grad_()
    with rmsnorm.use_backend(backend):
        outs = [rmsnorm.rms_norm(x, N, wg), rmsnorm.layer_norm(x, N, wg)]
        outs += list(rmsnorm.add_rms_norm(x, x.sin(), N, wg))
    expected = [F.rms_norm(x0, (N,), w), F.layer_norm(x0, (N,), w)]
    expected += [F.rms_norm(x0 + x0.sin(), (N,), w), x0 + x0.sin()]
    for got, exp in zip(outs, expected, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-5)
        assert got.stride() == exp.stride()
    sum(o.square().sum() for o in outs).backward()
    xr, wr = x0.detach().requires_grad_(), w.clone().requires_grad_()
    ref_outs = [F.rms_norm(xr, (N,), wr), F.layer_norm(xr, (N,), wr)]
    h = xr + xr.sin()
    ref_outs += [F.rms_norm(h, (N,), wr), h]
    sum(o.square().sum() for o in ref_outs).backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wg.grad, wr.grad, rtol=1e-4, atol=1e-4)
