"""Degenerate rows get torch's answer on every backend (reference, CPU kernels, Triton kernels,
interpreted on CPU tensors): all-zero and constant rows, rows holding ±inf or NaN, rows whose
squares underflow float32, with every eps placement and eps = 0, forward and backward, RMSNorm,
the fused residual form and LayerNorm. NaN and ±inf where torch's own ops have them, finite values
close to torch's, and never an exception from a kernel.

The references are torch's own ops (``F.rms_norm``, ``F.layer_norm``, ``x + r`` then
``F.rms_norm``) and, for ``eps_mode="rms"`` (which torch has no op for), torch's composite
x / (sqrt(mean(x²)) + ε). Two documented departures are left out here: rows whose statistics
overflow float32 (rescaled: tests/kernels/test_overflow.py) and the ``"rms"`` backward of a row with
mean(x²) = 0 and ε > 0, which is the formula's finite limit g/ε (docs/spec.md, section 3) where
the composite's autograd divides 0 by 0.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

import rmsnorm
from launcher_support import ALL, target, triton_layouts

N = 40


def _row(kind: str) -> torch.Tensor:
    """One row of N elements (float64) of the given kind."""
    g = torch.Generator().manual_seed(sum(map(ord, kind)))
    rand = torch.randn(N, generator=g, dtype=torch.float64)
    row = {
        "zero": torch.zeros(N, dtype=torch.float64),
        "const 0.1": torch.full((N,), 0.1, dtype=torch.float64),
        "const -3": torch.full((N,), -3.0, dtype=torch.float64),
        "const 1e4": torch.full((N,), 1e4, dtype=torch.float64),
        "one-hot": torch.zeros(N, dtype=torch.float64).index_fill_(0, torch.tensor([5]), 2.5),
        "tiny": rand * 1e-30,  # squares underflow float32: Σx² = 0 there
        "subnormal": rand.abs() * 1e-40 + 1e-41,
        "random": rand,
    }.get(kind)
    if row is not None:
        return row
    specials = {
        "inf": {3: math.inf},
        "-inf": {5: -math.inf},
        "nan": {7: math.nan},
        "inf, -inf": {1: math.inf, 2: -math.inf},
        "inf, nan": {0: math.inf, 9: math.nan},
        "zero, inf": {4: math.inf},
    }[kind]
    if kind == "zero, inf":
        rand = torch.zeros(N, dtype=torch.float64)
    for j, v in specials.items():
        rand[j] = v
    return rand


FINITE = ("zero", "const 0.1", "const -3", "const 1e4", "one-hot", "tiny", "subnormal", "random")
NONFINITE = ("inf", "-inf", "nan", "inf, -inf", "inf, nan", "zero, inf")
OPS = ("rms_norm", "rms_norm_rms", "add_rms_norm", "layer_norm")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
EPSES = (0.0, 1e-6, None)  # None: the default (the compute dtype's machine epsilon; 1e-5 for LN)
# Finite values: close to torch's (their NaN / inf placement is what this module is about; the
# launcher tests hold ordinary rows to the shared tolerance rule).
RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def eps_of(eps):
    """The ε of the "rms" placement in this module (torch has no default for it)."""
    return 1e-6 if eps is None else eps


def _torch_ref(op: str, x, res, w, b, eps):
    """torch's answer: (outputs, what the gradient is taken with respect to). eps=None is
    float32's machine epsilon (also for float64 leaves: the inputs' compute dtype)."""
    shape = (N,)
    if eps is None and op in ("rms_norm", "add_rms_norm"):
        eps = torch.finfo(torch.float32).eps
    if op == "rms_norm":
        return (F.rms_norm(x, shape, w, eps),), (x, w)
    if op == "rms_norm_rms":
        xf = x.float()
        y = xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps_of(eps)) * w.float()
        return (y.to(x.dtype),), (x, w)
    if op == "add_rms_norm":
        h = x + res
        return (F.rms_norm(h, shape, w, eps), h), (x, res, w)
    return (F.layer_norm(x, shape, w, b, 1e-5 if eps is None else eps),), (x, w, b)


def _ours(op: str, x, res, w, b, eps):
    shape = (N,)
    if op == "rms_norm":
        return (rmsnorm.rms_norm(x, shape, w, eps),), (x, w)
    if op == "rms_norm_rms":
        return (rmsnorm.rms_norm(x, shape, w, eps_of(eps), eps_mode="rms"),), (x, w)
    if op == "add_rms_norm":
        return rmsnorm.add_rms_norm(x, res, shape, w, eps), (x, res, w)
    return (rmsnorm.layer_norm(x, shape, w, b, 1e-5 if eps is None else eps),), (x, w, b)


def _assert_like_torch(ours, ref, exact, what: str, skip_rows=None) -> None:
    """NaN exactly where torch (`ref`, in the inputs' dtype) has NaN, ±inf exactly where it has
    them, finite values close to torch's float64 answer `exact` (torch's own float32 LayerNorm
    backward is off by 2% on a constant row of 1e4: its dx cancels terms of 1e4·r)."""
    a, e, x = ours.detach().double(), ref.detach().double(), exact.detach().double()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    if skip_rows is not None and a.dim() == 2:
        keep = ~skip_rows
        a, e, x = a[keep], e[keep], x[keep]
    nan_a, nan_e = a.isnan(), e.isnan()
    bad = (nan_a != nan_e) | (a.isinf() != e.isinf()) | (e.isinf() & (a != e))
    if bad.any():
        where = bad.nonzero()[:4].tolist()
        raise AssertionError(
            f"{what}: NaN / inf placement differs from torch at {where}: "
            f"ours {a[bad][:4].tolist()}, torch {e[bad][:4].tolist()}"
        )
    fin = e.isfinite() & x.isfinite()
    tol = RTOL[ours.dtype]
    err = (a[fin] - x[fin]).abs()
    # per row where possible: a value is compared with the largest magnitude of its row
    scale = x.where(fin, 0.0).abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    scale = scale.expand_as(e)[fin]
    assert (err <= tol * scale).all(), (
        f"{what}: finite values differ from torch's by up to "
        f"{(err / scale).max().item():.3g} of the row's scale (allowed {tol})"
    )


def _torch_answer(op, tensors, eps, dy, dtype=None):
    """torch's outputs and gradients on `tensors` (converted to `dtype` where given)."""
    leaves = [(t if dtype is None else t.to(dtype)).clone().requires_grad_() for t in tensors]
    outs, wrt = _torch_ref(op, *leaves, eps)
    grad_out = dy if dtype is None else dy.to(dtype)
    return outs, torch.autograd.grad(outs, wrt, [grad_out] * len(outs))


def _batch(kinds, dtype):
    """(x, residual) of the kinds stacked as rows, in dtype (x alone carries the row; h = x)."""
    x = torch.stack([_row(k) for k in kinds]).to(dtype)
    return x, torch.zeros_like(x)


def _layout(name: str):
    """The backend of `name` and a context (factory) forcing its layout: "triton-loop" walks a
    row in 16-column blocks, "triton-split" splits it over cooperating programs."""
    backend, _, layout = name.partition("-")
    target(backend)  # skips where the backend cannot run
    if not layout:
        return backend, contextlib.nullcontext
    cfg = triton_layouts(N)[layout]
    mod = target(backend).mod
    return backend, lambda: mod.override(fwd=cfg, bwd=cfg, ln_fwd=cfg, ln_bwd=cfg)


# Every backend in its default layout, with every op and dtype; the Triton kernels' looped and
# split layouts (which merge per-chunk statistics) with the two norms in float32 and bfloat16.
CASES = [(name, op, dt) for name in ALL for op in OPS for dt in DTYPES] + [
    (name, op, dt)
    for name in ("triton-loop", "triton-split")
    for op in ("rms_norm", "layer_norm")
    for dt in DTYPES[:2]
]


@pytest.mark.parametrize(
    ("name", "op", "dtype"),
    CASES,
    ids=[f"{n}-{o}-{str(d).removeprefix('torch.')}" for n, o, d in CASES],
)
def test_degenerate_rows_give_torchs_answer(name, op, dtype):
    backend, layout = _layout(name)
    g = torch.Generator().manual_seed(3)
    w = (torch.rand(N, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    b = (torch.rand(N, generator=g, dtype=torch.float64) - 0.5).to(dtype)
    for kinds in (FINITE, NONFINITE + ("random",)):
        x, res = _batch(kinds, dtype)
        dy = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
        for eps in EPSES:
            label = f"{name} {op} {dtype} eps={eps} rows {kinds}"
            # Documented: the "rms" backward's limit g/ε where mean(x²) = 0 and ε > 0.
            ms_zero = x.float().pow(2).mean(-1) == 0
            skip_dx = ms_zero if op == "rms_norm_rms" and eps != 0.0 else None
            with rmsnorm.use_backend(backend), layout():
                with torch.no_grad():  # the direct launcher path (no statistics kept)
                    plain = _ours(op, x, res, w, b, eps)[0]
                leaves = [t.clone().requires_grad_() for t in (x, res, w, b)]
                outs, wrt = _ours(op, *leaves, eps)
                grads = torch.autograd.grad(outs, wrt, [dy] * len(outs))
            # torch's LayerNorm in bfloat16 / float16 forms x·r − μ·r, so where r = inf (eps = 0,
            # a variance that underflows) it has NaN where its float32 op, (x − μ)·r, has ±inf;
            # the library computes (x − μ)·r in every dtype: the float32 op is the reference.
            half_ln = op == "layer_norm" and dtype != torch.float32
            t_outs, t_grads = _torch_answer(
                op, (x, res, w, b), eps, dy, torch.float32 if half_ln else None
            )
            x_outs, x_grads = _torch_answer(op, (x, res, w, b), eps, dy, torch.float64)
            for i, (o, p, t, e) in enumerate(zip(outs, plain, t_outs, x_outs, strict=True)):
                _assert_like_torch(o, t, e, f"{label}: output {i}")
                _assert_like_torch(p, t, e, f"{label}: output {i} under no_grad")
            names = {"x": 0, "res": 1} if op == "add_rms_norm" else {"x": 0}
            for name, i in names.items():
                _assert_like_torch(grads[i], t_grads[i], x_grads[i], f"{label}: d {name}", skip_dx)
                if skip_dx is not None and skip_dx.any():  # g / ε, rounded to the dtype
                    limit = (dy.double() * w.double() / eps_of(eps))[skip_dx]
                    what = f"{label}: d {name} = g/ε"
                    _assert_like_torch(grads[i][skip_dx], limit.to(dtype), limit, what)
            for i in range(len(names), len(wrt)):
                if skip_dx is None or not skip_dx.any():  # a skipped row feeds every column
                    what = f"{label}: d param {i}"
                    _assert_like_torch(grads[i], t_grads[i], x_grads[i], what)
