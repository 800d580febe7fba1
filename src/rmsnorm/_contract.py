"""The backend contract: the seven launchers every backend module defines, as one typed protocol,
and the check that a module matches it (names, parameter names, order and defaults).

A backend is a module (:mod:`rmsnorm.reference`, ``rmsnorm.kernels.cpu``,
``rmsnorm.kernels.triton``) whose seven functions have the signatures of :class:`Backend`'s methods;
:func:`mismatches` is what the test suite runs on each of them.
"""

from __future__ import annotations

import inspect
from typing import Protocol

from torch import Tensor, dtype

from .reference import GateOptions, RMSOptions

__all__ = ["LAUNCHERS", "Backend", "mismatches"]

LAUNCHERS = (
    "rms_norm_fwd",
    "add_rms_norm_fwd",
    "rms_norm_bwd",
    "layer_norm_fwd",
    "layer_norm_bwd",
    "gated_rms_norm_fwd",
    "gated_rms_norm_bwd",
)


class Backend(Protocol):
    """What :func:`rmsnorm._backend.launchers` returns: a module with these seven functions.

    Rows: ``x`` (and ``residual``, ``dy``, ``dresidual``) of shape (*, N) — a contiguous tensor of
    any rank whose last dim is the row, or (M, N) with a unit last stride and any row stride (read
    in place). The row tensors of one call hold the same M rows but may differ in rank (a (2, 3, N)
    x with a (6, N) residual). Parameters ``weight`` / ``bias``: (N,) of any stride (strided,
    expanded, at an offset), or None.

    Outputs: y, h and dx are fresh tensors of x's shape (never views, never aliasing an input);
    per-row statistics (rstd, mean) are (M,) in the compute dtype
    (:func:`rmsnorm.reference.compute_dtype`); d weight / d bias are (N,) in the parameter's dtype,
    or empty tensors where there is no parameter or ``need_weight_grad`` is false. With
    ``stats=False`` (a caller that needs no backward) a backend may return None in place of the
    statistics. What each output holds is the spec's, :mod:`rmsnorm.reference`, which states every
    formula; :mod:`rmsnorm.testing` says how close to it a backend must be.

    Options: ``opts``, one :class:`rmsnorm.reference.RMSOptions` (``eps`` ≥ 0; ``eps_mode`` one
    of :data:`rmsnorm.reference.EPS_MODES`; ``casting_mode`` one of
    :data:`rmsnorm.reference.CASTING_MODES`; ``offset`` added to the weight; ``k`` (1 ≤ k ≤ N) the
    leading elements the RMS is estimated from), and for the grouped and gated launchers
    ``gating``, one :class:`rmsnorm.reference.GateOptions`. A backend reads their fields (by
    unpacking or by name) and passes them on whole; LayerNorm has no options but ``eps``. Callers
    validate the tensors' shapes, dtypes and devices first (:mod:`rmsnorm._ops`,
    :mod:`rmsnorm.functional`).

    Order: the tensors, then the options (``opts``, then ``gating``; LayerNorm's ``eps``), then
    ``input_dtype`` where the launcher takes one, then the one flag with a default (``stats`` in
    the forwards, ``need_weight_grad`` in the backwards). :mod:`rmsnorm._launch` and the custom
    ops keep the same order.
    """

    def rms_norm_fwd(
        self,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        opts: RMSOptions,
        stats: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """RMSNorm forward: (y, rstd)."""
        ...

    def add_rms_norm_fwd(
        self,
        x: Tensor,
        residual: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        opts: RMSOptions,
        stats: bool = True,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """h = x + residual (any float dtype, h in the residual's), then RMSNorm of h with x's
        dtype as the input dtype: (y, h, rstd)."""
        ...

    def rms_norm_bwd(
        self,
        dy: Tensor,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        rstd: Tensor,
        dresidual: Tensor | None,
        opts: RMSOptions,
        input_dtype: dtype,
        need_weight_grad: bool = True,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """RMSNorm backward: (dx, dweight, dbias). ``x`` is the normalized input (h for
        add_rms_norm, whose dresidual, the gradient reaching h directly, is added to dx);
        ``input_dtype`` the forward's input dtype (x's for add_rms_norm); ``bias`` only by its
        presence and dtype."""
        ...

    def layer_norm_fwd(
        self,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
        stats: bool = True,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """LayerNorm forward: (y, mean, rstd)."""
        ...

    def layer_norm_bwd(
        self,
        dy: Tensor,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        mean: Tensor,
        rstd: Tensor,
        need_weight_grad: bool = True,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """LayerNorm backward: (dx, dweight, dbias)."""
        ...

    def gated_rms_norm_fwd(
        self,
        x: Tensor,
        gate: Tensor | None,
        weight: Tensor | None,
        bias: Tensor | None,
        opts: RMSOptions,
        gating: GateOptions,
        input_dtype: dtype | None = None,
        stats: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Grouped and gated RMSNorm forward: (y, rstd). ``gate`` (x's rows, any float dtype, read
        in the compute dtype) or None; ``gating.group_size`` a divisor g of N, or None (g = N):
        each group of g elements has its own r, from its first k (1 ≤ k ≤ g), and rstd is
        (M·N/g,), the (M, N/g) statistics in row-major order; ``input_dtype`` the dtype the
        casting mode rounds to (None: x's; the residual form passes its input's for x = h). y is
        in :func:`rmsnorm.reference.gated_output_dtype`."""
        ...

    def gated_rms_norm_bwd(
        self,
        dy: Tensor,
        x: Tensor,
        gate: Tensor | None,
        weight: Tensor | None,
        bias: Tensor | None,
        rstd: Tensor,
        dresidual: Tensor | None,
        opts: RMSOptions,
        gating: GateOptions,
        input_dtype: dtype,
        need_weight_grad: bool = True,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Grouped and gated RMSNorm backward: (dx, dgate, dweight, dbias), dgate of x's shape in
        the gate's dtype (an empty tensor without a gate). ``bias`` is read (norm-then-gate's d
        gate needs the norm's value); ``dresidual``, where given, is added to dx."""
        ...


def _parameters(fn, drop_self: bool = False) -> list[tuple[str, object, object]]:
    params = list(inspect.signature(fn).parameters.values())[int(drop_self) :]
    return [(p.name, p.kind, p.default) for p in params]


def _spelled(params: list[tuple[str, object, object]]) -> str:
    parts = [
        name if default is inspect.Parameter.empty else f"{name}={default!r}"
        for name, _, default in params
    ]
    return "(" + ", ".join(parts) + ")"


def mismatches(module: object) -> list[str]:
    """How ``module`` departs from :class:`Backend`: one line per launcher that is missing or
    whose parameters differ in name, order, kind or default (annotations are not compared). An
    empty list: the module is a backend."""
    name = getattr(module, "__name__", repr(module))
    found = []
    for launcher in LAUNCHERS:
        fn = getattr(module, launcher, None)
        if not callable(fn):
            found.append(f"{name}.{launcher} is missing")
            continue
        want = _parameters(getattr(Backend, launcher), drop_self=True)
        got = _parameters(fn)
        if got != want:
            found.append(
                f"{name}.{launcher}{_spelled(got)} differs from the contract's "
                f"{launcher}{_spelled(want)}"
            )
    return found
