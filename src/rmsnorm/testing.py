"""The shared tolerance rule, used by every test that compares an implementation with the spec.

An implementation's error against the float64 reference may be at most twice the error of eager
PyTorch (the reference run in the same dtype) plus a small absolute term: one unit of rounding in
the output dtype and, for reductions over rows (d weight, d bias), the accumulator's rounding
growing with √rows. Derived once here; no test picks its own tolerance. :func:`check_launcher`
applies it to one call of a backend's launcher.
"""

from __future__ import annotations

import inspect
import math

import torch

from . import reference
from .reference import compute_dtype

__all__ = ["tolerance", "max_abs_error", "assert_close_to_reference", "check_launcher", "OUTPUTS"]

# The outputs of each launcher of the backend contract (rmsnorm._contract.Backend), in order.
OUTPUTS = {
    "rms_norm_fwd": ("y", "rstd"),
    "add_rms_norm_fwd": ("y", "h", "rstd"),
    "rms_norm_bwd": ("dx", "dweight", "dbias"),
    "layer_norm_fwd": ("y", "mean", "rstd"),
    "layer_norm_bwd": ("dx", "dweight", "dbias"),
    "gated_rms_norm_fwd": ("y", "rstd"),
    "gated_rms_norm_bwd": ("dx", "dgate", "dweight", "dbias"),
}
_SUMMED_OVER_ROWS = ("dweight", "dbias")


def max_abs_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual − expected| in float64; NaN where the NaN patterns differ, inf/inf of one sign
    match."""
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    if a.shape != e.shape:
        raise AssertionError(f"shape {list(a.shape)} != expected {list(e.shape)}")
    if a.numel() == 0:
        return 0.0
    nan_a, nan_e = a.isnan(), e.isnan()
    if not torch.equal(nan_a, nan_e):
        return math.nan
    inf_e = e.isinf()
    if not torch.equal(a[inf_e], e[inf_e]):
        return math.nan
    ok = ~(nan_e | inf_e)
    return (a[ok] - e[ok]).abs().max().item() if ok.any() else 0.0


def tolerance(
    expected: torch.Tensor, eager: torch.Tensor, dtype: torch.dtype, rows: int = 1
) -> float:
    """2 × eager error + scale · (u(dtype) + u(accumulator) · √rows), scale = max |expected|."""
    finite = expected[expected.isfinite()].detach().to(torch.float64)
    scale = finite.abs().max().item() if finite.numel() else 0.0
    u_out = torch.finfo(dtype).eps
    u_acc = torch.finfo(compute_dtype(dtype)).eps
    eager_err = max_abs_error(eager, expected)
    return 2.0 * eager_err + scale * (u_out + u_acc * math.sqrt(max(rows, 1)))


def assert_close_to_reference(
    actual: torch.Tensor,
    expected: torch.Tensor,
    eager: torch.Tensor,
    *,
    name: str = "output",
    rows: int = 1,
) -> None:
    """Assert ``actual`` is within :func:`tolerance` of the float64 ``expected``; ``eager`` is the
    reference computed in ``actual``'s dtype. ``rows`` is the number of rows reduced over (d
    weight)."""
    if actual is None:
        raise AssertionError(f"{name}: None, expected a {eager.dtype} tensor")
    if actual.dtype != eager.dtype:
        raise AssertionError(f"{name}: dtype {actual.dtype} != expected {eager.dtype}")
    err = max_abs_error(actual, expected)
    tol = tolerance(expected, eager, actual.dtype, rows)
    if not err <= tol:  # NaN fails
        raise AssertionError(
            f"{name}: max abs error {err:.3e} > tolerance {tol:.3e} "
            f"(eager {actual.dtype} error {max_abs_error(eager, expected):.3e})"
        )


def _float64(arg: object) -> object:
    if isinstance(arg, torch.Tensor):
        return arg.detach().to(torch.float64)
    return torch.float64 if isinstance(arg, torch.dtype) else arg


def check_launcher(backend: object, launcher: str, *args: object, label: str = "") -> tuple:
    """Call ``launcher`` (one of :data:`OUTPUTS`) of ``backend`` (a module of the backend contract)
    on ``args``, and the spec's (:mod:`rmsnorm.reference`) twice: on the same arguments ("eager")
    and in float64 (every tensor, and ``input_dtype``, converted). Asserts that each output the
    backend returns is within :func:`tolerance` of the float64 one, d weight and d bias as sums
    over the M rows. Returns the three output tuples (backend, eager, float64), so that a
    backward can be fed the spec's statistics.
    """
    spec = getattr(reference, launcher)
    got = getattr(backend, launcher)(*args)
    eager = spec(*args)
    exact = spec(*map(_float64, args))
    rows = args[0].numel() // max(args[0].shape[-1], 1)  # the rows of x (forward) or dy (backward)
    prefix = f"{label} {launcher}" if label else launcher
    params = list(inspect.signature(spec).parameters)  # the contract's, which the spec has
    at = params.index("stats") if "stats" in params else len(args)
    skippable = len(args) > at and not args[at]  # a forward called with stats=False
    for name, a, g, e in zip(OUTPUTS[launcher], got, eager, exact, strict=True):
        if a is None and skippable and name in ("rstd", "mean"):
            continue  # the contract lets a backend skip the statistics
        summed = rows if name in _SUMMED_OVER_ROWS else 1
        assert_close_to_reference(a, e, g, name=f"{prefix} {name}", rows=summed)
    return got, eager, exact
