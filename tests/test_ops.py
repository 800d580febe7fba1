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
        (x, w, b, 1e-6, "mean_square", "gemma", 0.0, 16),
        (x, w, None, 1e-5, "rms", "llama", 1.0, 4),
        (xb, _t(12, grad=True), None, 1e-6, "mean_square", "llama", 0.0, 12),
        (xb, None, None, 1e-6, "rms", "none", 0.0, 12),
        (strided, w.detach(), None, 1e-6, "mean_square", "gemma", 0.0, 16),
        (_t(0, 16, grad=True), w, None, 1e-6, "mean_square", "gemma", 0.0, 16),
    ]


@pytest.mark.parametrize("args", _rms_samples())
def test_opcheck_rms_norm_fwd(args):
    opcheck(ops.rms_norm_fwd.default, args)


@pytest.mark.parametrize("res_dtype", [torch.float32, torch.bfloat16])
def test_opcheck_add_rms_norm_fwd(res_dtype):
    x = _t(4, 16, dtype=torch.bfloat16, grad=True)
    r = _t(4, 16, dtype=res_dtype, grad=True)
    opcheck(
        ops.add_rms_norm_fwd.default,
        (x, r, _t(16, grad=True), _t(16, grad=True), 1e-6, "rms", "gemma", 1.0, 8),
    )


def test_opcheck_layer_norm_fwd():
    opcheck(ops.layer_norm_fwd.default, (_t(5, 24, grad=True), _t(24, grad=True), None, 1e-5))
    opcheck(ops.layer_norm_fwd.default, (_t(5, 24, dtype=torch.float16), None, _t(24), 1e-5))


def test_opcheck_backward_ops():
    x, dy, w = _t(6, 16), _t(6, 16), _t(16)
    rstd = torch.rand(6) + 0.5
    for need in (True, False):
        opcheck(
            ops.rms_norm_bwd.default,
            (
                dy,
                x,
                w,
                _t(16),
                rstd,
                _t(6, 16),
                1e-6,
                "mean_square",
                "llama",
                0.0,
                16,
                torch.bfloat16,
                need,
            ),
        )
        opcheck(ops.layer_norm_bwd.default, (dy, x, w, None, torch.randn(6), rstd, need))


def test_double_backward_is_refused_clearly():
    x = _t(3, 8, grad=True)
    w = _t(8, grad=True)
    y = rmsnorm.rms_norm(x, 8, w)
    (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gx.sum().backward()


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
