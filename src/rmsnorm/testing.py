"""The shared tolerance rule, used by every test that compares an implementation with the spec.

An implementation's error against the float64 reference may be at most twice the error of eager
PyTorch (the reference run in the same dtype) plus a small absolute term: one unit of rounding in
the output dtype and, for reductions over rows (d weight, d bias), the accumulator's rounding
growing with √rows. Derived once here; no test picks its own tolerance.
"""

from __future__ import annotations

import math

import torch

from .reference import compute_dtype

__all__ = ["tolerance", "max_abs_error", "assert_close_to_reference"]


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
    if actual.dtype != eager.dtype:
        raise AssertionError(f"{name}: dtype {actual.dtype} != expected {eager.dtype}")
    err = max_abs_error(actual, expected)
    tol = tolerance(expected, eager, actual.dtype, rows)
    if not err <= tol:  # NaN fails
        raise AssertionError(
            f"{name}: max abs error {err:.3e} > tolerance {tol:.3e} "
            f"(eager {actual.dtype} error {max_abs_error(eager, expected):.3e})"
        )
