"""The custom-op boundary: opcheck on every op, torch.compile(fullgraph=True) of every public
function and module, no recompiles when the number of rows changes, torch.export."""

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.library import opcheck

import rmsnorm

ops = torch.ops.rmsnorm


def _t(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _rms_samples():
    x, w, b = _t(6, 16, grad=True), _t(16, grad=True), _t(16, grad=True)
    xb = _t(5, 12, dtype=torch.bfloat16, grad=True)
    strided = _t(12, 16)[::2]  # strided rows reach the op as they are
    return [
        (x, 1, w, b, 1e-6, "mean_square", "gemma", 0.0, 16),
        (x, 1, w, None, 1e-5, "rms", "llama", 1.0, 4),
        (xb, 1, _t(12, grad=True), None, 1e-6, "mean_square", "llama", 0.0, 12),
        (xb, 1, None, None, 1e-6, "rms", "none", 0.0, 12),
        (strided, 1, w.detach(), None, 1e-6, "mean_square", "gemma", 0.0, 16),
        (_t(0, 16, grad=True), 1, w, None, 1e-6, "mean_square", "gemma", 0.0, 16),
        # the ops take inputs in their own shape: 3-d, 1-d, and two normalized dims
        (_t(2, 3, 16, grad=True), 1, w, b, 1e-6, "mean_square", "gemma", 0.0, 16),
        (_t(16, grad=True), 1, w, None, 1e-6, "mean_square", "gemma", 0.0, 16),
        (_t(2, 4, 4, grad=True), 2, _t(4, 4, grad=True), None, 1e-6, "rms", "gemma", 0.0, 8),
    ]


@pytest.mark.parametrize("args", _rms_samples())
def test_opcheck_rms_norm_fwd(args):
    opcheck(ops.rms_norm_fwd.default, args)


@pytest.mark.parametrize("res_dtype", [torch.float32, torch.bfloat16])
def test_opcheck_add_rms_norm_fwd(res_dtype):
    x = _t(2, 4, 16, dtype=torch.bfloat16, grad=True)
    r = _t(2, 4, 16, dtype=res_dtype, grad=True)
    opcheck(
        ops.add_rms_norm_fwd.default,
        (x, r, 1, _t(16, grad=True), _t(16, grad=True), 1e-6, "rms", "gemma", 1.0, 8),
    )


def test_opcheck_layer_norm_fwd():
    opcheck(ops.layer_norm_fwd.default, (_t(5, 24, grad=True), 1, _t(24, grad=True), None, 1e-5))
    opcheck(ops.layer_norm_fwd.default, (_t(5, 24, dtype=torch.float16), 1, None, _t(24), 1e-5))
    opcheck(ops.layer_norm_fwd.default, (_t(2, 3, 4, grad=True), 2, _t(3, 4), _t(3, 4), 1e-5))


def test_opcheck_backward_ops():
    x, dy, w = _t(2, 3, 16), _t(2, 3, 16), _t(16)
    rstd = torch.rand(2, 3) + 0.5
    for need in (True, False):
        args = (dy, x, 1, w, _t(16), rstd, _t(2, 3, 16), 1e-6, "mean_square", "llama", 0.0, 16,
                torch.bfloat16, need)  # fmt: skip
        opcheck(ops.rms_norm_bwd.default, args)
        opcheck(ops.layer_norm_bwd.default, (dy, x, 1, w, None, torch.randn(2, 3), rstd, need))


def test_statistics_have_the_leading_shape():
    x = _t(2, 3, 4, 5)
    assert ops.rms_norm_fwd(x, 1, None, None, 1e-6, "mean_square", "gemma", 0.0, 5)[1].shape == (
        2, 3, 4,
    )  # fmt: skip
    _, mean, rstd = ops.layer_norm_fwd(x, 2, None, None, 1e-5)
    assert mean.shape == rstd.shape == (2, 3)


# ------------------------------------------------------------------------------------------------
# The ops are public through torch.ops: they check what their kernels rely on
# ------------------------------------------------------------------------------------------------
_X = _t(4, 16)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ops.rms_norm_fwd(_X, 1, _t(8), None, 1e-6, "mean_square", "gemma", 0.0, 16),
         "weight must hold one element per row element"),
        (lambda: ops.rms_norm_fwd(_X, 1, None, _t(32), 1e-6, "mean_square", "gemma", 0.0, 16),
         "bias must hold"),
        (lambda: ops.rms_norm_fwd(_X, 3, None, None, 1e-6, "mean_square", "gemma", 0.0, 16),
         "norm_dims must be in"),
        (lambda: ops.rms_norm_fwd(_X, 1, None, None, 1e-6, "bogus", "gemma", 0.0, 16),
         "eps_mode"),
        (lambda: ops.rms_norm_fwd(_X, 1, None, None, 1e-6, "rms", "gemma", 0.0, 17), "k must"),
        (lambda: ops.rms_norm_fwd(_X, 1, None, None, -1.0, "rms", "gemma", 0.0, 16), "eps"),
        (lambda: ops.rms_norm_fwd(_X.int(), 1, None, None, 1e-6, "rms", "gemma", 0.0, 16),
         "x must be float32"),
        (lambda: ops.add_rms_norm_fwd(_X, _t(4, 8), 1, None, None, 1e-6, "rms", "gemma", 0.0, 8),
         "residual must have the shape of x"),
        (lambda: ops.layer_norm_fwd(_X, 1, _t(15), None, 1e-5), "weight must hold"),
        (lambda: ops.layer_norm_bwd(_X, _X, 1, None, None, _t(3), _t(4), True),
         "mean must hold one value per row"),
        (lambda: ops.rms_norm_bwd(_t(4, 8), _X, 1, None, None, _t(4), None, 1e-6, "rms",
                                  "gemma", 0.0, 16, torch.float32, True), "dy must have the shape"),
        (lambda: ops.rms_norm_bwd(_X, _X, 1, _t(16), None, _t(4).int(), None, 1e-6, "rms",
                                  "gemma", 0.0, 16, torch.float32, True), "rstd must be float32"),
    ],
)  # fmt: skip
def test_raw_ops_refuse_what_their_kernels_cannot_read(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_raw_ops_accept_any_layout():
    # A transposed input has no unit stride along the row; the op copies it, never misreads it.
    x = _t(16, 6).t()
    y, _ = ops.rms_norm_fwd(x, 1, None, None, 1e-6, "mean_square", "gemma", 0.0, 16)
    torch.testing.assert_close(y, rmsnorm.reference.rms_norm(x.contiguous()))


# ------------------------------------------------------------------------------------------------
# Double backward: create_graph=True runs the spec's backward as differentiable torch operations
# ------------------------------------------------------------------------------------------------
def test_double_backward_matches_torch():
    x = _t(3, 8, dtype=torch.float64, grad=True)
    w = _t(8, dtype=torch.float64, grad=True)

    def penalty(fn):
        (gx,) = torch.autograd.grad(fn(x, w).sin().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), (x, w))

    ours = penalty(lambda x, w: rmsnorm.rms_norm(x, 8, w, 1e-6))
    theirs = penalty(lambda x, w: torch.nn.functional.rms_norm(x, (8,), w, 1e-6))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_backward_ops_say_they_are_not_differentiable_themselves():
    x, dy = _t(3, 8, grad=True), _t(3, 8)
    dx, _, _ = ops.rms_norm_bwd(dy, x, 1, None, None, torch.ones(3), None, 1e-6, "mean_square",
                                "gemma", 0.0, 8, torch.float32, False)  # fmt: skip
    with pytest.raises(NotImplementedError, match="double backward through rms_norm"):
        dx.sum().backward()


# ------------------------------------------------------------------------------------------------
# torch.compile / export
# ------------------------------------------------------------------------------------------------
def _compile_and_check(fn, *args):
    torch._dynamo.reset()
    as_tuple = lambda out: out if isinstance(out, tuple) else (out,)
    eager = as_tuple(fn(*args))
    compiled = as_tuple(torch.compile(fn, fullgraph=True)(*args))
    for e, c in zip(eager, compiled, strict=True):
        torch.testing.assert_close(c, e)
    loss = sum(t.float().sum() for t in compiled)
    loss.backward()


def test_compile_functions_fullgraph():
    x, r, w, b = _t(4, 32, grad=True), _t(4, 32, grad=True), _t(32, grad=True), _t(32, grad=True)
    _compile_and_check(lambda x, w, b: rmsnorm.rms_norm(x, 32, w, bias=b, partial=0.5), x, w, b)
    _compile_and_check(lambda x, r, w: rmsnorm.add_rms_norm(x, r, 32, w, eps_mode="rms"), x, r, w)
    _compile_and_check(lambda x, w, b: rmsnorm.layer_norm(x, 32, w, b), x, w, b)


def test_compile_modules_fullgraph():
    x, r = _t(2, 3, 32, grad=True), _t(2, 3, 32, grad=True)
    for module, args in (
        (rmsnorm.RMSNorm(32, offset=1.0, casting_mode="llama"), (x,)),
        (rmsnorm.AddRMSNorm(32, eps=1e-6), (x, r)),
        (rmsnorm.LayerNorm(32), (x,)),
    ):
        _compile_and_check(module, *args)


def test_dynamic_rows_do_not_recompile():
    torch._dynamo.reset()
    counter = CompileCounter()
    w = _t(16)
    fn = torch.compile(
        lambda x: rmsnorm.rms_norm(x, 16, w), backend=counter, dynamic=True, fullgraph=True
    )
    for rows in (3, 5, 17, 64):
        torch.testing.assert_close(fn(_t(rows, 16)).shape, torch.Size([rows, 16]))
    assert counter.frame_count == 1


def test_export():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = rmsnorm.RMSNorm(16)
            self.add = rmsnorm.AddRMSNorm(16)
            self.ln = rmsnorm.LayerNorm(16)

        def forward(self, x, r):
            y, h = self.add(self.norm(x), r)
            return self.ln(y + h)

    net = Net()
    x, r = _t(3, 16), _t(3, 16)
    ep = torch.export.export(net, (x, r))
    torch.testing.assert_close(ep.module()(x, r), net(x, r))
    assert "rmsnorm.rms_norm_fwd" in str(ep.graph)


# ------------------------------------------------------------------------------------------------
# The eager fast path: launchers called directly only where the dispatcher had nothing else to do
# ------------------------------------------------------------------------------------------------
def test_fast_path_matches_the_op_and_steps_aside_for_modes_and_autograd():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x, r, w = _t(5, 16), _t(5, 16), _t(16)
    direct = [
        rmsnorm.rms_norm(x, 16, w),
        *rmsnorm.add_rms_norm(x, r, 16, w),
        rmsnorm.layer_norm(x, 16),
    ]
    with Record() as mode:
        via_op = [rmsnorm.rms_norm(x, 16, w), *rmsnorm.add_rms_norm(x, r, 16, w)]
        via_op.append(rmsnorm.layer_norm(x, 16))
    assert {"rmsnorm.rms_norm_fwd.default", "rmsnorm.add_rms_norm_fwd.default",
            "rmsnorm.layer_norm_fwd.default"} <= set(mode.seen)  # fmt: skip
    for a, b in zip(direct, via_op, strict=True):
        assert torch.equal(a, b)
    assert rmsnorm.rms_norm(x, 16, w.requires_grad_()).grad_fn is not None
    with torch.no_grad():
        assert rmsnorm.rms_norm(x, 16, w).grad_fn is None


def _recording_backend():
    """A torch.compile backend (AOT autograd) that keeps the forward and backward graphs' code:
    (backend, {"fw": code, "bw": code})."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    code = {}

    def keep(name):
        def compiler(gm, example_inputs):
            code[name] = gm.code
            return make_boxed_func(gm)

        return compiler

    torch._dynamo.reset()
    return aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw")), code


def test_compiled_training_runs_the_backward_ops():
    backend, code = _recording_backend()
    x, w = _t(4, 16, grad=True), _t(16, grad=True)
    fn = torch.compile(
        lambda x, w: (
            rmsnorm.rms_norm(x, 16, w)
            + rmsnorm.layer_norm(x, 16, w)
            + rmsnorm.add_rms_norm(x, x, 16, w)[0]
        ),
        backend=backend,
        fullgraph=True,
    )
    fn(x, w).sum().backward()
    for op in ("rms_norm_fwd", "add_rms_norm_fwd", "layer_norm_fwd"):
        assert f"torch.ops.rmsnorm.{op}" in code["fw"]
    for op in ("rms_norm_bwd", "layer_norm_bwd"):
        assert f"torch.ops.rmsnorm.{op}" in code["bw"]


# ------------------------------------------------------------------------------------------------
# The grouped / gated ops
# ------------------------------------------------------------------------------------------------
def _gated_samples():
    x, z, w, b = _t(6, 24, grad=True), _t(6, 24, grad=True), _t(24, grad=True), _t(24, grad=True)
    xb, zb = _t(5, 24, dtype=torch.bfloat16, grad=True), _t(5, 24, dtype=torch.bfloat16, grad=True)
    opts = (1e-6, "mean_square", "gemma", 0.0)
    return [
        (x, z, 1, w, b, *opts, 8, 8, True, "silu", None),  # Qwen3-Next's order, 3 groups
        (x, z, 1, w, None, 1e-5, "rms", "llama", 1.0, 3, 6, False, "sigmoid", None),
        (xb, zb, 1, _t(24, grad=True), None, 1e-6, "mean_square", "llama", 0.0, 8, 8, False,
         "silu", None),  # Mamba2's: fp32 weight, bf16 input (promote in "llama")
        (xb, zb, 1, None, None, 1e-6, "rms", "none", 0.0, 24, None, True, "silu", None),
        (x, None, 1, w, b, *opts, 4, 4, True, "silu", None),  # grouped, no gate
        (x, z.detach().double(), 1, w, None, *opts, 12, 12, False, "silu", None),  # fp64 gate
        (x, None, 1, w, None, *opts, 6, 6, True, "silu", torch.bfloat16),  # residual form's h
        (_t(0, 24, grad=True), _t(0, 24), 1, w, None, *opts, 8, 8, True, "silu", None),
        (_t(2, 3, 4, 6, grad=True), _t(2, 3, 4, 6, grad=True), 2, _t(4, 6, grad=True), None,
         *opts, 6, 6, True, "silu", None),  # two normalized dims, a per-head norm
    ]  # fmt: skip


@pytest.mark.parametrize("args", _gated_samples())
def test_opcheck_gated_rms_norm_fwd(args):
    opcheck(ops.gated_rms_norm_fwd.default, args)


def test_opcheck_gated_backward_op():
    x, dy, z, w = _t(2, 3, 24), _t(2, 3, 24), _t(2, 3, 24), _t(24)
    rstd = torch.rand(2, 3, 3) + 0.5
    for need in (True, False):
        for gate in (z, None):
            args = (dy, x, gate, 1, w, _t(24), rstd, _t(2, 3, 24), 1e-6, "mean_square", "llama",
                    0.0, 8, 8, gate is None, "silu", torch.bfloat16, need)  # fmt: skip
            opcheck(ops.gated_rms_norm_bwd.default, args)


def test_gated_statistics_have_the_leading_shape_and_the_groups():
    x = _t(2, 3, 4, 6)
    rstd = ops.gated_rms_norm_fwd(x, x, 2, None, None, 1e-6, "mean_square", "gemma", 0.0, 2, 2,
                                  True, "silu", None)[1]  # fmt: skip
    assert rstd.shape == (2, 3, 12)
    rstd = ops.gated_rms_norm_fwd(x, None, 1, None, None, 1e-6, "mean_square", "gemma", 0.0, 6,
                                  None, True, "silu", None)[1]  # fmt: skip
    assert rstd.shape == (2, 3, 4, 1)


_G = (1e-6, "mean_square", "gemma", 0.0)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ops.gated_rms_norm_fwd(_X, _t(4, 8), 1, None, None, *_G, 4, 4, True, "silu",
                                        None), "gate must have the shape of x"),
        (lambda: ops.gated_rms_norm_fwd(_X, None, 1, None, None, *_G, 5, 5, True, "silu", None),
         "group_size must divide"),
        (lambda: ops.gated_rms_norm_fwd(_X, None, 1, None, None, *_G, 8, 4, True, "silu", None),
         "k must be in"),
        (lambda: ops.gated_rms_norm_fwd(_X, _X, 1, None, None, *_G, 4, 4, True, "relu", None),
         "activation"),
        (lambda: ops.gated_rms_norm_fwd(_X, _X.int(), 1, None, None, *_G, 4, 4, True, "silu",
                                        None), "gate must be a floating-point"),
        (lambda: ops.gated_rms_norm_bwd(_X, _X, _X, 1, None, None, _t(4), None, *_G, 4, 4, True,
                                        "silu", torch.float32, True), "rstd must hold one value"),
    ],
)  # fmt: skip
def test_raw_gated_ops_refuse_what_their_kernels_cannot_read(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_gated_backward_op_says_it_is_not_differentiable_itself():
    x, dy = _t(3, 8, grad=True), _t(3, 8)
    dx, _, _, _ = ops.gated_rms_norm_bwd(dy, x, x, 1, None, None, torch.ones(3), None, *_G, 8,
                                         None, True, "silu", torch.float32, False)  # fmt: skip
    with pytest.raises(NotImplementedError, match="gated_rms_norm"):
        dx.sum().backward()


def test_gated_fast_path_matches_the_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x, z, w = _t(5, 24), _t(5, 24), _t(24)
    direct = [rmsnorm.gated_rms_norm(x, z, 24, w, group_size=8, norm_before_gate=False),
              rmsnorm.rms_norm(x, 24, w, group_size=6)]  # fmt: skip
    with Record() as mode:
        via_op = [rmsnorm.gated_rms_norm(x, z, 24, w, group_size=8, norm_before_gate=False),
                  rmsnorm.rms_norm(x, 24, w, group_size=6)]  # fmt: skip
    assert "rmsnorm.gated_rms_norm_fwd.default" in mode.seen
    for a, b in zip(direct, via_op, strict=True):
        assert torch.equal(a, b)
    assert rmsnorm.gated_rms_norm(x, z.requires_grad_(), 24, w).grad_fn is not None


def test_compiled_gated_training_runs_the_gated_backward_op():
    backend, code = _recording_backend()
    x, z, w = _t(4, 24, grad=True), _t(4, 24, grad=True), _t(24, grad=True)
    fn = torch.compile(
        lambda x, z, w: rmsnorm.gated_rms_norm(x, z, 24, w, group_size=8, norm_before_gate=False),
        backend=backend, fullgraph=True,
    )  # fmt: skip
    fn(x, z, w).sum().backward()
    assert "gated_rms_norm_fwd" in code["fw"] and "gated_rms_norm_bwd" in code["bw"]
    eager_x, eager_z = x.grad.clone(), z.grad.clone()
    x.grad = z.grad = None
    rmsnorm.gated_rms_norm(x, z, 24, w, group_size=8, norm_before_gate=False).sum().backward()
    torch.testing.assert_close(x.grad, eager_x)
    torch.testing.assert_close(z.grad, eager_z)
