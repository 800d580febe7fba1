"""Memory layouts as torch gives them: the outputs of rms_norm / add_rms_norm / layer_norm and the
gradients d input and d residual, for channels_last and channels_last_3d inputs and gradients of
every layout, on every backend and every call path (the eager autograd.Function, the custom ops,
torch.compile, double backward, torch.func); PyTorch's own module memory-format test, adapted;
and the helpers of ``rmsnorm._layout`` against the torch behaviour they copy."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import rmsnorm
from launcher_support import AVAILABLE as BACKENDS
from rmsnorm import _layout

CL, CL3D = torch.channels_last, torch.channels_last_3d
SHAPE4, SHAPE5 = (2, 3, 4, 5), (2, 3, 2, 3, 4)


def _sliced_channels_last(t: torch.Tensor) -> torch.Tensor:
    """t's values in a channels_last tensor with gaps (every other element of a wider one)."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    return wide.to(memory_format=CL)[..., ::2].copy_(t)


# Input layouts: (shape, maker).
INPUTS = {
    "contiguous": (SHAPE4, lambda t: t.contiguous()),
    "channels_last": (SHAPE4, lambda t: t.to(memory_format=CL)),
    "channels_last_sliced": (SHAPE4, _sliced_channels_last),
    "channels_last_3d": (SHAPE5, lambda t: t.to(memory_format=CL3D)),
}


def _same_format_as(t: torch.Tensor) -> torch.memory_format:
    return {4: CL, 5: CL3D}[t.dim()]


# Gradient layouts, given the output they are the gradient of ("like_output": PyTorch's test,
# torch.empty_like(output).copy_(grad)).
GRADS = {
    "like_output": lambda g, y: torch.empty_like(y).copy_(g),
    "contiguous": lambda g, y: g.contiguous(),
    "channels_last": lambda g, y: g.to(memory_format=_same_format_as(g)),
    "permuted": lambda g, y: g.transpose(1, 2).contiguous().transpose(1, 2),
    "expanded": lambda g, y: g[:1].expand(g.shape),  # .sum()'s gradient is of this kind
}


def _key(t: torch.Tensor) -> tuple[int, ...]:
    """The strides that say a layout: those of dims longer than 1."""
    return tuple(s for s, n in zip(t.stride(), t.shape, strict=True) if n != 1)


# (name, ours(x, r, w, b) -> outputs, torch's(x, r, w, b) -> outputs): the normalized shape is the
# last dim, or the last three.
def _cases(shape):
    last, three = shape[-1:], shape[-3:]
    return {
        "rms_norm": (
            lambda x, r, w, b: (rmsnorm.rms_norm(x, last, w[0, 0]),),
            lambda x, r, w, b: (F.rms_norm(x, last, w[0, 0]),),
        ),
        "rms_norm_3_dims": (
            lambda x, r, w, b: (rmsnorm.rms_norm(x, three, w),),
            lambda x, r, w, b: (F.rms_norm(x, three, w),),
        ),
        "add_rms_norm": (
            lambda x, r, w, b: rmsnorm.add_rms_norm(x, r, last, w[0, 0]),
            lambda x, r, w, b: (F.rms_norm(x + r, last, w[0, 0]), x + r),
        ),
        "layer_norm": (
            lambda x, r, w, b: (rmsnorm.layer_norm(x, last, w[0, 0], b),),
            lambda x, r, w, b: (F.layer_norm(x, last, w[0, 0], b),),
        ),
    }


class _Passthrough(TorchDispatchMode):
    """Any dispatch mode sends the functions to the custom ops (not the autograd.Function)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _leaves(input_name, seed=0, dtype=torch.float64):
    shape, make = INPUTS[input_name]
    g = torch.Generator().manual_seed(seed)
    x = make(torch.randn(shape, generator=g, dtype=dtype) + 0.3).requires_grad_()
    r = make(torch.randn(shape, generator=g, dtype=dtype)).requires_grad_()
    w = torch.randn(shape[-3:], generator=g, dtype=dtype)
    b = torch.randn(shape[-1], generator=g, dtype=dtype)
    return x, r, w, b


def _grads(outs, x, r, grad_name, seed=1):
    g = torch.Generator().manual_seed(seed)
    cots = [GRADS[grad_name](torch.randn(o.shape, generator=g, dtype=o.dtype), o) for o in outs]
    inputs = [x, r] if len(outs) == 2 else [x]
    return torch.autograd.grad(outs, inputs, cots, create_graph=torch.is_grad_enabled()), cots


def _compare(what, outs, grads, outs_t, grads_t):
    """Values and layouts of (outs, grads), ours, against torch's."""
    for o, o_t in zip(outs, outs_t, strict=True):
        torch.testing.assert_close(o, o_t, msg=lambda m: f"{what}: {m}")
        assert _key(o) == _key(o_t), (what, "output", o.stride(), o_t.stride())
    for i, (gr, gr_t) in enumerate(zip(grads, grads_t, strict=True)):
        torch.testing.assert_close(gr, gr_t, msg=lambda m, i=i: f"{what}, gradient {i}: {m}")
        assert _key(gr) == _key(gr_t), (what, f"gradient {i}", gr.stride(), gr_t.stride())


def _run(fn, input_name, grad_name, create_graph=False):
    x, r, w, b = _leaves(input_name)
    with torch.set_grad_enabled(True):
        outs = fn(x, r, w, b)
    with torch.set_grad_enabled(create_graph):
        grads, cots = _grads(outs, x, r, grad_name)
    return outs, grads, (x, r, cots)


_ALL = list(itertools.product(INPUTS, GRADS))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", ["function", "op"])
def test_outputs_and_gradients_have_torchs_layout(backend, path):
    """Eager: the autograd.Function (plain tensors) and the custom ops (here under a dispatch
    mode, as under tensor subclasses): every case, input layout and gradient layout. torch's d
    input is laid out as elementwise arithmetic on dy is: a channels_last dy gives a
    channels_last d input whatever the input's layout, a contiguous or expanded one a contiguous
    d input; layer_norm's is always contiguous."""
    for input_name, grad_name in _ALL:
        for name, (ours, theirs) in _cases(INPUTS[input_name][0]).items():
            what = f"{name}, {input_name} input, {grad_name} gradient"
            with rmsnorm.use_backend(backend):
                if path == "op":
                    with _Passthrough():
                        outs, grads, _ = _run(ours, input_name, grad_name)
                else:
                    outs, grads, _ = _run(ours, input_name, grad_name)
            outs_t, grads_t, _ = _run(theirs, input_name, grad_name)
            _compare(what, outs, grads, outs_t, grads_t)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_without_gradients_have_torchs_layout(backend):
    """The eager fast path (no gradient wanted: the launchers called directly)."""
    for input_name in INPUTS:
        for name, (ours, theirs) in _cases(INPUTS[input_name][0]).items():
            x, r, w, b = _leaves(input_name)
            with torch.no_grad():
                with rmsnorm.use_backend(backend):
                    outs = ours(x, r, w, b)
                outs_t = theirs(x, r, w, b)
            _compare(f"{name}, {input_name} input, no grad", outs, [], outs_t, [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_backward_keeps_torchs_layouts(backend):
    """create_graph=True: d input (computed by the spec's differentiable backward) has torch's
    layout, and so has the second-order gradient through it."""
    for input_name, grad_name in _ALL:
        for name, (ours, theirs) in _cases(INPUTS[input_name][0]).items():
            what = f"{name}, {input_name} input, {grad_name} gradient, double backward"
            runs = []
            for fn in (ours, theirs):
                with rmsnorm.use_backend(backend):
                    outs, grads, (x, r, cots) = _run(fn, input_name, grad_name, create_graph=True)
                    v = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator())
                    (ddx,) = torch.autograd.grad((grads[0] * v).sum(), x)
                runs.append((outs, [*grads, ddx]))
            _compare(what, *runs[0], *runs[1])


def test_compiled_functions_keep_torchs_layouts():
    """torch.compile (fullgraph, aot_eager): compiled backward graphs receive the gradient in the
    layout of the output it was traced with, for torch's ops as for ours; outputs and d input
    then have the layouts torch's compiled ops give."""
    for input_name, grad_name in itertools.product(INPUTS, ("like_output", "contiguous")):
        for name, (ours, theirs) in _cases(INPUTS[input_name][0]).items():
            what = f"{name}, {input_name} input, {grad_name} gradient, compiled"
            runs = []
            for fn in (ours, theirs):
                torch._dynamo.reset()
                compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
                outs, grads, _ = _run(compiled, input_name, grad_name)
                runs.append((outs, grads))
            _compare(what, *runs[0], *runs[1])


def test_torch_func_vjp_keeps_torchs_layouts():
    """The transforms run the spec as torch operations; over the last dim they keep torch's
    layouts too (d input channels_last for a channels_last gradient)."""
    for input_name, grad_name in _ALL:
        cases = _cases(INPUTS[input_name][0])
        for name in ("rms_norm", "add_rms_norm", "layer_norm"):
            x, r, w, b = _leaves(input_name)
            runs = []
            for fn in cases[name]:
                out, pullback = torch.func.vjp(functools.partial(_first, fn, r, w, b), x.detach())
                g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator())
                runs.append(((out,), pullback(GRADS[grad_name](g, out))))
            _compare(f"{name}, {input_name}, {grad_name}, vjp", *runs[0], *runs[1])


def _first(fn, r, w, b, x):
    return fn(x, r, w, b)[0]


# ----------------------------------------------------------------------------------------------
# PyTorch's TestModule.test_memory_format, adapted to this library's modules: outputs and
# gradients (torch.autograd.grad with gradients in the outputs' layout) equal to those of the
# contiguous run, channels_last for channels_last inputs (RMSNorm), contiguous for LayerNorm.
# ----------------------------------------------------------------------------------------------
_MODULE_INPUTS = [  # (constructor args, input shape) as PyTorch's module_inputs_torch_nn_RMSNorm
    (([5], 1e-3), (4, 5, 5)),
    (([5], 1e-3), (128, 5, 5)),
    (([2, 2, 5], 1e-3), (4, 2, 2, 5)),
    (([5], 1e-3), (4, 3, 2, 5)),
    (([2, 5], 1e-3), (2, 3, 2, 2, 5)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls", ["RMSNorm", "LayerNorm"])
def test_pytorch_module_memory_format_test(backend, cls):
    for (args, shape), affine in itertools.product(_MODULE_INPUTS, (True, False)):
        module = getattr(rmsnorm, cls)(*args, elementwise_affine=affine).double()
        with torch.no_grad():
            for p in module.parameters():
                p.add_(0.1 * torch.randn_like(p))
        x0 = torch.randn(shape, dtype=torch.float64)
        formats = [torch.contiguous_format]
        formats += [CL] if len(shape) == 4 else [CL3D] if len(shape) == 5 else []
        with rmsnorm.use_backend(backend):
            ref_x = x0.clone().requires_grad_()
            ref_out = module(ref_x)
            ref_cot = torch.rand_like(ref_out)
            ref_grads = torch.autograd.grad(ref_out, (ref_x, *module.parameters()), ref_cot)
            for fmt in formats:
                x = x0.clone().to(memory_format=fmt).requires_grad_()
                out = module(x)
                cot = torch.empty_like(out).copy_(ref_cot)
                grads = torch.autograd.grad(out, (x, *module.parameters()), cot)
                torch.testing.assert_close(out, ref_out)
                torch.testing.assert_close(grads, ref_grads)
                expected = fmt if cls == "RMSNorm" else torch.contiguous_format
                for t in (out, grads[0]):
                    assert t.is_contiguous(memory_format=expected), (cls, args, shape, fmt)
                for g in grads[1:]:
                    assert g.is_contiguous()


# ----------------------------------------------------------------------------------------------
# The helpers against the torch behaviour they copy
# ----------------------------------------------------------------------------------------------
def _layouts(shape):
    """Tensors of ``shape`` in many layouts: dense permutations, slices, expansions, size-1
    dims."""
    n = len(shape)
    out = []
    for perm in itertools.permutations(range(n)):
        base = torch.randn([shape[p] for p in perm])
        dense = base.permute([perm.index(d) for d in range(n)])
        out.append(dense)
        out.append(
            torch.randn([shape[p] * 2 if i == n - 1 else shape[p] for i, p in enumerate(perm)])[
                ..., ::2
            ].permute([perm.index(d) for d in range(n)])
        )
    out.append(torch.randn(()).expand(shape))
    out.append(torch.randn(shape[-1]).expand(shape))
    out.append(torch.randn(shape[:1] + (1,) * (n - 1)).expand(shape))
    return out


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 1, 4, 1), (3, 4), (2, 3, 1, 2, 4)])
def test_iteration_order_is_tensoriterators(shape):
    """The layout of elementwise results, one operand or two (dims of size 1 aside: their stride
    does not change where any element is)."""

    def key(strides):
        return tuple(s for s, n in zip(strides, shape, strict=True) if n != 1)

    layouts = _layouts(shape)
    for a in layouts:
        order = _layout.iteration_order(shape, [a.stride()])
        assert key(_layout.dense_strides(shape, order)) == key((a * 2).stride()), a.stride()
    for a, b in itertools.product(layouts[::3], layouts[1::3]):
        order = _layout.iteration_order(shape, [a.stride(), b.stride()])
        want = key((a + b).stride())
        assert key(_layout.dense_strides(shape, order)) == want, (a.stride(), b.stride())


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 1, 4, 1), (1, 3, 1, 1), (2, 3, 2, 3, 4)])
def test_channels_last_format_is_what_torchs_rms_norm_follows(shape):
    """F.rms_norm returns channels_last exactly for the inputs torch suggests channels_last for."""
    n = shape[-1]
    for x in _layouts(shape):
        y = F.rms_norm(x, (n,))
        fmt = _layout.channels_last_format(x)
        if fmt is None:
            assert y.is_contiguous(), x.stride()
        else:
            assert y.is_contiguous(memory_format=fmt), x.stride()
        assert _key(rmsnorm.rms_norm(x, n)) == _key(y), x.stride()


def test_in_order_copies_only_when_needed():
    t = torch.randn(2, 3, 4, 5)
    assert _layout.in_order(t, [3, 2, 1, 0]) is t
    cl = _layout.in_order(t, [1, 3, 2, 0])
    assert cl.is_contiguous(memory_format=CL) and torch.equal(cl, t)
    assert _layout.in_order(cl, [1, 3, 2, 0]) is cl
