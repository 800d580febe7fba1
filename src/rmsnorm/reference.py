"""The spec: plain-PyTorch RMSNorm / LayerNorm forward and written-out backward, correct in float64.

Every kernel, benchmark and fallback in this package is compared against this module, and it is also
a backend of its own (``RMSNORM_BACKEND=reference``): its seven launchers (``*_fwd``, ``*_bwd``)
have the signatures every backend has (:class:`rmsnorm._contract.Backend`, which says what they
take and return) and define what every backend computes. The formulas are those of
``docs/conventions.md`` and ``docs/spec.md``; each function's docstring states the one it
implements.

Notation (one row of N elements; M rows, the leading dims (*) flattened): x the row, γ the weight,
β the bias, k the number of leading elements the RMS is estimated from (k = N unless ``partial``
is set), r the per-row reciprocal scale.

Rows whose statistics overflow the compute dtype (Σx² past 3.4e38 in float32, i.e. |x| ≳ 1e19 in
float32 or bfloat16 input) are rescaled rather than returned as 0 (which is what torch gives):
with s = :func:`overflow_scale` (2^-80 in float32, a power of two, so scaling is exact),

    mean(x²) = mean((s·x)²) / s²,    r = s · rsqrt(mean((s·x)²) + ε·s²)
    μ = mean(s·x) / s,               σ² = mean((s·x − s·μ)²) / s²

computed only for the rows whose plain sum is not finite (both sums come from the same read of the
row: one reduction when compiled). The results are those of exact arithmetic rounded as for any
other row, except that r, an fp32 output, is itself subnormal for RMS (or σ) past 2^126 ≈ 8.5e37
(up to 2^-21 relative error at 3e38). Rows holding inf or NaN keep torch's results.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "RMSOptions",
    "GateOptions",
    "EPS_MODES",
    "CASTING_MODES",
    "check_eps_mode",
    "check_casting_mode",
    "check_activation",
    "compute_dtype",
    "default_eps",
    "partial_size",
    "output_dtype",
    "overflow_scale",
    "row_stats",
    "rstd_from_mean_square",
    "rms_rstd",
    "rms_norm_apply",
    "row_matrix",
    "param_vector",
    "rms_norm",
    "add_rms_norm",
    "layer_norm",
    "rms_norm_fwd",
    "add_rms_norm_fwd",
    "rms_norm_bwd",
    "ACTIVATIONS",
    "group_count",
    "gate_activation",
    "gate_activation_grad",
    "gated_output_dtype",
    "gated_rms_norm_fwd",
    "gated_rms_norm_bwd",
    "gated_rms_norm",
    "residual_sum",
    "layer_norm_fwd",
    "layer_norm_bwd",
]

EPS_MODES = ("mean_square", "rms")
CASTING_MODES = ("gemma", "llama", "none")
ACTIVATIONS = ("silu", "sigmoid")


class RMSOptions(NamedTuple):
    """The options of one RMSNorm call, resolved (``eps`` a float, ``k`` a count), as one immutable
    value: the functional API builds it once per call after its checks, and autograd, the launch
    layer, the backends' launchers and the custom ops take it whole. A NamedTuple rather than a
    dataclass: it costs a tuple to build (~0.2 µs), it hashes and compares at C speed (the CPU and
    Triton launchers look their cached plans up by it, and a plan holds the fields as the kernels
    take them), and ``*options`` gives the flat arguments of the ops' schemas (:mod:`rmsnorm._ops`
    writes them from the fields' annotations, which are schema types). A new option is a new
    field here, with its check in :func:`rmsnorm.functional.check_rms_options`, its formula in
    the spec's functions that take the value (:func:`rms_rstd`, :func:`rms_norm_apply`,
    :func:`rms_norm_bwd`, the gated forms'), and its kernel arguments in the one function of each
    backend's launchers that reads the fields.

    Fields: ``eps`` (ε ≥ 0), ``eps_mode`` (one of :data:`EPS_MODES`), ``casting_mode`` (one of
    :data:`CASTING_MODES`), ``offset`` (added to the weight), ``k`` (1 ≤ k ≤ N, the leading elements
    of a row, or of a group, the RMS is estimated from).
    """

    eps: float
    eps_mode: str
    casting_mode: str
    offset: float
    k: int


class GateOptions(NamedTuple):
    """The grouping and gating of one grouped / gated RMSNorm call, as one immutable value beside
    :class:`RMSOptions` (carried and flattened the same way): ``group_size`` (a divisor g of the
    row size N, or None: one group, the row), ``norm_before_gate`` (y = RMSNorm(x) ⊙ act(z), else
    RMSNorm(x ⊙ act(z))) and ``activation`` (one of :data:`ACTIVATIONS`). Plain RMSNorm in groups
    is ``GateOptions(g, True, "silu")`` without a gate."""

    group_size: int | None
    norm_before_gate: bool
    activation: str


# ----------------------------------------------------------------------------------------------
# The checks of the option values: the one place each is written. The functional API, the custom
# ops, every backend's launchers and the lab call these; ``where`` prefixes the message (the custom
# ops name themselves there).
# ----------------------------------------------------------------------------------------------
def check_eps_mode(eps_mode: str, where: str = "") -> str:
    """``eps_mode`` itself when it is one of :data:`EPS_MODES`, else ``ValueError``."""
    if not isinstance(eps_mode, str) or eps_mode not in EPS_MODES:
        raise ValueError(f"{where}eps_mode must be one of {EPS_MODES}, got {eps_mode!r}")
    return eps_mode


def check_casting_mode(casting_mode: str, where: str = "") -> str:
    """``casting_mode`` itself when it is one of :data:`CASTING_MODES`, else ``ValueError``."""
    if not isinstance(casting_mode, str) or casting_mode not in CASTING_MODES:
        raise ValueError(
            f"{where}casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}"
        )
    return casting_mode


def check_activation(activation: str, where: str = "") -> str:
    """``activation`` itself when it is one of :data:`ACTIVATIONS`, else ``ValueError``."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{where}activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation


# ----------------------------------------------------------------------------------------------
# Conventions shared by every backend
# ----------------------------------------------------------------------------------------------
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for everything else (fp32, bf16, fp16)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_eps(dtype: torch.dtype) -> float:
    """What ``eps=None`` means, as in ``torch.nn.functional.rms_norm``: the machine epsilon of the
    compute dtype (so ≈1.19e-7 for fp32/bf16/fp16 inputs and ≈2.2e-16 for float64)."""
    return torch.finfo(compute_dtype(dtype)).eps


def partial_size(n: int, partial: float | None) -> int:
    """k, the number of leading elements pRMSNorm estimates the RMS from.

    k = max(1, ⌊p·n⌋) as in the paper authors' code (``int(d * p)``), with p·n rounded to 9 decimals
    first so that a decimal p such as 0.29 of n = 100 gives 29 rather than 28. ``partial=None``
    is k = n.
    """
    if partial is None:
        return n
    return max(1, math.floor(round(partial * n, 9)))


def output_dtype(
    input_dtype: torch.dtype, weight: torch.Tensor | None, casting_mode: str
) -> torch.dtype:
    """``"llama"`` returns promote(input, weight) (fp32 weights with bf16 inputs give fp32, as HF
    Llama); ``"gemma"`` and ``"none"`` return the input dtype."""
    if casting_mode == "llama" and weight is not None:
        return torch.promote_types(input_dtype, weight.dtype)
    return input_dtype


def overflow_scale(dtype: torch.dtype) -> float:
    """s, the power of two a row is scaled by when its statistics overflow ``dtype`` (a compute
    dtype): 2^-80 for float32 (|s·x| ≤ 2^48, so k ≤ 2^31 squares sum to at most 2^127) and
    2^-560 for float64 (|s·x| ≤ 2^464)."""
    return 2.0**-560 if dtype == torch.float64 else 2.0**-80


def _flat(stat: torch.Tensor) -> torch.Tensor:
    """A per-row statistic of shape (*) as the launchers return it: (M,)."""
    return stat if stat.dim() == 1 else stat.reshape(-1)


def _lead(stat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-row statistic (M,) in the leading shape (*) of x (*, N)."""
    return stat if stat.dim() == x.dim() - 1 else stat.reshape(x.shape[:-1])


def _as(t: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """t, rows of the same (M, N) as x but possibly of another rank, in x's shape."""
    return t if t is None or t.shape == x.shape else t.reshape(x.shape)


# A row is summed in blocks of _ROW_BLOCK elements, then the block sums: torch splits one
# reduction over threads where it has fewer rows than threads and ≥ 32768 elements (a single row of
# 65536 summed on two threads rounds differently from the same row in a batch), and a block never
# reaches that size, so every row is summed in the same order whatever batch it is in and however
# many threads run (docs/spec.md, "Batch invariance").
_ROW_BLOCK = 4096


def _row_sum(t: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """Σ over the last dim of t, in an order fixed by that dim's size alone."""
    n = t.shape[-1]
    if not torch.jit.is_tracing() and n > _ROW_BLOCK:  # (a trace fixes the shapes anyway)
        blocks = -(-n // _ROW_BLOCK)
        if blocks * _ROW_BLOCK != n:
            t = torch.nn.functional.pad(t, (0, blocks * _ROW_BLOCK - n))
        t = t.reshape(*t.shape[:-1], blocks, _ROW_BLOCK).sum(dim=-1)
    return t.sum(dim=-1, keepdim=keepdim)


def _row_mean(t: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    return _row_sum(t, keepdim) / t.shape[-1]


def _column_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over the rows of t (*, N): (N,)."""
    return t.reshape(-1, t.shape[-1]).sum(dim=0)


def _ones_but(mask: torch.Tensor, value: float, like: torch.Tensor) -> torch.Tensor:
    """1 where not mask, value where mask, in like's dtype (value may underflow float32)."""
    return torch.ones_like(like).masked_fill(mask, value)


def row_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row mean μ, population standard deviation σ and RMS over the last dim, in float64.

    μ = (1/d) Σ x_i;  σ = sqrt((1/d) Σ (x_i − μ)²) computed two-pass (never from the identity);
    RMS = sqrt((1/d) Σ x_i²). They satisfy RMS² = σ² + μ² up to rounding.
    """
    xd = x.to(torch.float64)
    mean = xd.mean(dim=-1)
    std = (xd - mean.unsqueeze(-1)).square().mean(dim=-1).sqrt()
    rms = xd.square().mean(dim=-1).sqrt()
    return mean, std, rms


# ----------------------------------------------------------------------------------------------
# RMSNorm
# ----------------------------------------------------------------------------------------------
def _mean_square(xf: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ms, sc) per row of the first k elements of xf (compute dtype): ms = mean(x²) and sc = 1,
    or, where mean(x²) overflows, ms = mean((s·x)²) and sc = s (see the module docstring)."""
    xk = xf[..., :k]
    s = overflow_scale(xf.dtype)
    ms = _row_mean(xk.square())  # (*)
    ms_s = _row_mean((xk * s).square())  # the same read of x: one fused reduction when compiled
    over = ms == math.inf
    return torch.where(over, ms_s, ms), _ones_but(over, s, ms)


def rstd_from_mean_square(
    ms: torch.Tensor, eps: float, eps_mode: str, sc: torch.Tensor | None = None
) -> torch.Tensor:
    """r from ms = mean(x²) per row (the ε form): ``"mean_square"`` r = 1/sqrt(ms + ε);
    ``"rms"`` r = 1/(sqrt(ms) + ε). With ``sc`` (per row: s where ms is that of s·x, its
    statistics having overflowed, else 1) r = sc/sqrt(ms + ε·sc²) or sc/(sqrt(ms) + ε·sc). The
    one statement of the ε form: :func:`rms_rstd` and the sharded RMSNorm of DTensors (which
    all-reduces Σx² first) both call it. Differentiable: in ``"rms"`` form the derivative of
    sqrt at ms = 0 is taken as 0, the limit :func:`rms_norm_bwd` uses (an all-zero row gets
    dx = g/ε, finite)."""
    if eps_mode == "mean_square":
        if sc is None:
            return torch.rsqrt(ms + eps)
        return torch.rsqrt(ms + eps * sc * sc) * sc
    check_eps_mode(eps_mode)  # "rms", the other
    zero = ms == 0
    root = torch.where(zero, 0.0, torch.where(zero, 1.0, ms).sqrt())
    if sc is None:
        return 1.0 / (root + eps)
    return 1.0 / (root + eps * sc) * sc


def rms_rstd(xf: torch.Tensor, opts: RMSOptions) -> torch.Tensor:
    """r per row of xf (*, N), in its dtype (a compute dtype), from the first k elements of each
    row (ε, the ε form and k from ``opts``; :func:`rstd_from_mean_square`): ``"mean_square"``
    r = 1/sqrt(mean(x²) + ε); ``"rms"`` r = 1/(sqrt(mean(x²)) + ε); for a row whose mean(x²)
    overflows, the same from s·x: r = s/sqrt(mean((s·x)²) + ε·s²) or
    s/(sqrt(mean((s·x)²)) + ε·s)."""
    ms, sc = _mean_square(xf, opts.k)  # (*), (*)
    return rstd_from_mean_square(ms, opts.eps, opts.eps_mode, sc)


def _scale(
    weight: torch.Tensor | None, opts: RMSOptions, dtype: torch.dtype
) -> torch.Tensor | None:
    """The factor the normalized row is multiplied by: offset + γ, in ``dtype``."""
    if weight is None:
        return None
    w, offset = weight.to(dtype), opts.offset
    return w + offset if offset != 0.0 else w


def _affine(y, weight, bias, opts: RMSOptions, dtype: torch.dtype) -> torch.Tensor:
    """y ⊙ (offset + γ) + β, each product and sum rounded to ``dtype`` (an absent γ or β: no
    product or sum)."""
    s = _scale(weight, opts, dtype)
    if s is not None:
        y = y * s
    return y if bias is None else y + bias.to(dtype)


def rms_norm_apply(
    x: torch.Tensor,  # (*, N), any float dtype
    rstd: torch.Tensor,  # (*), compute dtype
    weight: torch.Tensor | None,  # (N,)
    bias: torch.Tensor | None,  # (N,)
    opts: RMSOptions,
    in_dtype: torch.dtype,
) -> torch.Tensor:
    """y from x and its per-row r in the casting mode of ``opts`` (the table in
    docs/conventions.md), with its offset, ``in_dtype`` the input dtype the mode rounds to (x's
    own, or the forward input's for h)."""
    casting_mode = opts.casting_mode
    cd = compute_dtype(in_dtype)
    out_dtype = output_dtype(in_dtype, weight, casting_mode)
    if casting_mode == "gemma":
        # statistics and the weight product in fp32; one cast at the end.
        return _affine(x.to(cd) * rstd[..., None], weight, bias, opts, cd).to(out_dtype)
    if casting_mode == "llama":
        # normalize in fp32, cast to the input dtype, then × weight in promote(input, weight).
        y = (x.to(cd) * rstd[..., None]).to(in_dtype).to(out_dtype)
        return _affine(y, weight, bias, opts, out_dtype)
    check_casting_mode(casting_mode)  # "none", the last
    # rstd rounded to the input dtype; x·rstd and × weight each rounded in the input dtype.
    y = x.to(in_dtype) * rstd.to(in_dtype)[..., None]
    return _affine(y, weight, bias, opts, in_dtype)


def rms_norm_fwd(x, weight, bias, opts, stats=True):
    """RMSNorm forward: y = (offset + γ) ⊙ x · r + β with r from the first k elements (``opts``
    an :class:`RMSOptions`).

    Returns (y in :func:`output_dtype`, r in the compute dtype); the spec returns r also with
    ``stats=False``.
    """
    cd = compute_dtype(x.dtype)
    rstd = rms_rstd(x.to(cd), opts)
    y = rms_norm_apply(x, rstd, weight, bias, opts, x.dtype)
    return y, _flat(rstd)


def add_rms_norm_fwd(x, residual, weight, bias, opts, stats=True):
    """Fused residual form: h = x + residual (summed in the compute dtype, stored in the residual's
    dtype), y = RMSNorm(h) with x's dtype as the input dtype of the casting mode.

    Returns (y, h, r). r is computed from the stored h, so y is exactly RMSNorm of the h returned.
    """
    cd = torch.promote_types(compute_dtype(x.dtype), compute_dtype(residual.dtype))
    h = (x.to(cd) + _as(residual, x).to(cd)).to(residual.dtype)  # (*, N)
    rstd = rms_rstd(h.to(cd), opts)
    y = rms_norm_apply(h, rstd, weight, bias, opts, x.dtype)
    return y, h, _flat(rstd)


def _finite_or_one(r: torch.Tensor) -> torch.Tensor:
    return torch.where(r.isinf(), torch.ones_like(r), r)


def _inf_or_one(r: torch.Tensor) -> torch.Tensor:
    return torch.where(r.isinf(), r, torch.ones_like(r))


def rms_norm_bwd(dy, x, weight, bias, rstd, dresidual, opts, input_dtype, need_weight_grad=True):
    """RMSNorm backward, written out. With x̂ = x·r, g = dy ⊙ (offset + γ), S = Σ_i g_i x̂_i over the
    row and m_j = 1 for the first k elements (0 after):

    - ``"mean_square"`` (r = (ms + ε)^-½):  dx_j = r·g_j − m_j · x̂_j · r · S / k
    - ``"rms"`` (r = 1/(s + ε), s = sqrt(ms)): dx_j = r·g_j − m_j · x̂_j · S / (k·s), and the second
      term is 0 where s = 0 (its limit; so an all-zero row gets dx = g/ε, finite).
    - dγ = Σ_rows dy ⊙ x̂ (x̂ first cast to ``input_dtype`` in ``"llama"`` mode, as the forward
      did); dβ = Σ_rows dy. For add_rms_norm, dresidual (the gradient reaching h directly) is added
      to dx.

    Computed in the compute dtype; ``"none"`` mode differentiates the unrounded function. Returns
    (dx in x's dtype, dγ in γ's dtype, dβ in β's dtype); dγ / dβ are empty tensors where there is no
    weight / bias or ``need_weight_grad`` is false.
    """
    eps_mode, k = opts.eps_mode, opts.k
    cd = torch.promote_types(compute_dtype(x.dtype), compute_dtype(input_dtype))
    xf = x.to(cd)
    dyf = _as(dy, x).to(cd)
    r = _lead(rstd.to(cd), x)[..., None]  # (*, 1)
    xhat = xf * r  # (*, N)
    s = _scale(weight, opts, cd)
    g = dyf * s if s is not None else dyf
    # Where r = inf (eps = 0 on a row whose squares underflow), S = r·Σ g·x: the sum stays finite
    # and the products after it are ±inf where torch's autograd has them, not inf − inf = NaN.
    S = _row_sum(g * (xf * _finite_or_one(r)), keepdim=True) * _inf_or_one(r)  # (*, 1)
    n = x.shape[-1]
    if eps_mode == "mean_square":
        corr = xhat * (r * S / k)
    else:
        check_eps_mode(eps_mode)  # "rms", the other
        ms, sc = _mean_square(xf, k)
        root = ms.sqrt()[..., None]  # (*, 1): RMS, or s·RMS where mean(x²) overflows
        coef = torch.where(root > 0, S / (k * root), torch.zeros_like(S)) * sc[..., None]
        corr = xhat * coef
    if k < n:
        corr = corr * (torch.arange(n, device=x.device) < k)
    dx = r * g - corr
    if dresidual is not None:
        dx = dx + _as(dresidual, x).to(cd)
    dw = x.new_empty((0,), dtype=compute_dtype(x.dtype))  # distinct tensors: outputs never alias
    db = x.new_empty((0,), dtype=compute_dtype(x.dtype))
    if need_weight_grad and weight is not None:
        xh = xhat.to(input_dtype).to(cd) if opts.casting_mode == "llama" else xhat
        dw = _column_sum(dyf * xh).to(weight.dtype)
    if need_weight_grad and bias is not None:
        db = _column_sum(dyf).to(bias.dtype)
    return dx.to(x.dtype), dw, db


# ----------------------------------------------------------------------------------------------
# Grouped and gated RMSNorm
#
# A row of N elements is cut into G = N / g groups of g consecutive elements, each normalized on
# its own (its own r, from its own first k elements) and scaled by its slice of the (N,) weight;
# g = N (``group_size=None``) is the plain RMSNorm above. A gate z of the row's shape enters
# through act(z) (``"silu"``: z·σ(z); ``"sigmoid"``: σ(z)) either after the norm,
# y = RMSNorm(x) ⊙ act(z) (``norm_before_gate=True``), or before it, y = RMSNorm(x ⊙ act(z)).
# ----------------------------------------------------------------------------------------------
def group_count(n: int, group_size: int | None) -> int:
    """G, the number of groups of a row of n elements: n / group_size, 1 for ``None`` (one group,
    the whole row). ``ValueError`` unless group_size divides n."""
    if group_size is None:
        return 1
    if group_size < 1 or n % group_size:
        raise ValueError(f"group_size must divide the row size {n}, got {group_size}")
    return n // group_size


def gate_activation(z: torch.Tensor, activation: str) -> torch.Tensor:
    """act(z) in z's dtype: ``"silu"`` z·σ(z) (``F.silu``), ``"sigmoid"`` σ(z)."""
    if activation == "silu":
        return torch.nn.functional.silu(z)
    check_activation(activation)  # "sigmoid", the other
    return torch.sigmoid(z)


def gate_activation_grad(z: torch.Tensor, activation: str) -> torch.Tensor:
    """act'(z): ``"silu"`` σ(z)·(1 + z·(1 − σ(z))), ``"sigmoid"`` σ(z)·(1 − σ(z))."""
    sig = torch.sigmoid(z)
    if activation == "silu":
        return sig * (1.0 + z * (1.0 - sig))
    check_activation(activation)  # "sigmoid", the other
    return sig * (1.0 - sig)


def gated_output_dtype(
    input_dtype: torch.dtype,
    weight: torch.Tensor | None,
    casting_mode: str,
    gate_last: bool,
) -> torch.dtype:
    """The output dtype of the gated form: the dtype of its last rounding. Where the gate product
    comes last (``norm_before_gate`` with a gate) it is computed in the compute dtype and rounded
    to the input dtype, in every mode (as HF Qwen3-Next); otherwise the weight product is last and
    the dtype is :func:`output_dtype`'s (``"llama"``: promote(input, weight), as HF Mamba2)."""
    return input_dtype if gate_last else output_dtype(input_dtype, weight, casting_mode)


def _grouped(t: torch.Tensor | None, g: int) -> torch.Tensor | None:
    """t (*, N) as (*, G, g); a (N,) parameter as (G, g). None stays None."""
    return t if t is None else t.reshape(*t.shape[:-1], t.shape[-1] // g, g)


def _gated_compute_dtype(x: torch.Tensor, input_dtype: torch.dtype) -> torch.dtype:
    """The compute dtype: x's, promoted with the casting's input dtype's (they differ for the
    residual form, whose x is h). The gate is read in it: an fp64 gate of an fp32 input is
    rounded to fp32 first, as ``gate.to(torch.float32)`` in the HF classes."""
    return torch.promote_types(compute_dtype(x.dtype), compute_dtype(input_dtype))


def _gated_input(x, gate, opts, gating, in_dtype, cd):
    """u = x ⊙ act(z), what gate-then-norm normalizes: in the compute dtype, unrounded (HF
    Mamba2's ``x.float() * silu(gate.float())``), or, in ``"none"`` mode, act(z) rounded to the
    input dtype and the product rounded in it."""
    a = gate_activation(gate.reshape(x.shape).to(cd), gating.activation)
    if opts.casting_mode == "none":
        return x.to(in_dtype) * a.to(in_dtype)
    return x.to(cd) * a


def _normed_then_gated(vg, rstd, weight, bias, a, opts, in_dtype, cd):
    """y = n ⊙ act(z) for norm-then-gate, n the norm of vg (*, G, g), a = act(z) (*, G, g) in
    the compute dtype: ``"gemma"`` n and the product in the compute dtype, one cast at the end;
    ``"llama"`` n as the plain ``"llama"`` mode gives it (x̂ rounded to the input dtype, × weight in
    promote(input, weight)), the product in the compute dtype, rounded to the input dtype;
    ``"none"`` n in the input dtype, a rounded to it and the product rounded in it."""
    casting_mode = opts.casting_mode
    if casting_mode == "gemma":
        n = rms_norm_apply(vg, rstd, weight, bias, opts, cd)  # unrounded, in cd
        return (n * a).to(in_dtype)
    if casting_mode == "llama":
        n = rms_norm_apply(vg, rstd, weight, bias, opts, in_dtype)
        return (n.to(cd) * a).to(in_dtype)
    check_casting_mode(casting_mode)  # "none", the last
    n = rms_norm_apply(vg, rstd, weight, bias, opts, in_dtype)
    return n * a.to(in_dtype)


def gated_rms_norm_fwd(x, gate, weight, bias, opts, gating, input_dtype=None, stats=True):
    """Grouped and gated RMSNorm forward. x (*, N) rows, gate of x's rows or None, weight and
    bias (N,), ``opts`` an :class:`RMSOptions`, ``gating`` a :class:`GateOptions`; each group of
    ``group_size`` elements (``None``: the row) is normalized with its own r from its first k
    elements (k ≤ group_size):

    - no gate: y = (offset + γ) ⊙ x · r + β per group (:func:`rms_norm_fwd` when G = 1);
    - ``norm_before_gate=True``: y = ((offset + γ) ⊙ x · r + β) ⊙ act(z);
    - ``norm_before_gate=False``: u = x ⊙ act(z), y = (offset + γ) ⊙ u · r(u) + β.

    Rounding (fp16 / bf16 inputs): the casting mode's, with the gate product in the compute dtype
    (the input dtype in ``"none"``): see :func:`_gated_input` and :func:`_normed_then_gated`.
    ``input_dtype`` is the dtype the casting mode rounds to (x's own by default; the residual
    form's input for h). Returns (y in :func:`gated_output_dtype`, r of shape (M·G,): the (M, G)
    statistics in row-major order, (M,) when G = 1), r in the compute dtype.
    """
    group_size, norm_before_gate, activation = gating
    in_dtype = x.dtype if input_dtype is None else input_dtype
    cd = _gated_compute_dtype(x, in_dtype)
    g = x.shape[-1] if group_size is None else group_size
    gate_first = gate is not None and not norm_before_gate
    v = _gated_input(x, gate, opts, gating, in_dtype, cd) if gate_first else x
    vg = _grouped(v, g)  # (*, G, g)
    rstd = rms_rstd(vg.to(cd), opts)  # (*, G)
    w, b = _grouped(weight, g), _grouped(bias, g)  # (G, g)
    if gate is None or gate_first:
        y = rms_norm_apply(vg, rstd, w, b, opts, in_dtype)
    else:
        a = gate_activation(_grouped(gate.reshape(x.shape), g).to(cd), activation)  # (*, G, g)
        y = _normed_then_gated(vg, rstd, w, b, a, opts, in_dtype, cd)
    # a tensor of its own, not a view of the grouped result (the backend contract's outputs)
    return y.reshape(x.shape).clone(), _flat(rstd)


def gated_rms_norm_bwd(
    dy, x, gate, weight, bias, rstd, dresidual, opts, gating, input_dtype, need_weight_grad=True
):
    """Grouped and gated RMSNorm backward, written out as the chain rule around the RMSNorm
    backward of each group (:func:`rms_norm_bwd`, its formulas with the group as the row). With
    s = offset + γ, a = act(z), v the normalized input (x, or u = x ⊙ a gate-first), v̂ = v · r
    and n = s ⊙ v̂ + β per group:

    - norm, then gate (y = n ⊙ a): dn = dy ⊙ a, dz = dy ⊙ n ⊙ act'(z), dx = RMSNorm-backward of dn
      at x; dγ = Σ_rows dn ⊙ v̂, dβ = Σ_rows dn.
    - gate, then norm (y = n(u)): du = RMSNorm-backward of dy at u; dx = du ⊙ a,
      dz = du ⊙ x ⊙ act'(z); dγ = Σ_rows dy ⊙ v̂, dβ = Σ_rows dy.
    - no gate: dx = RMSNorm-backward of dy at x (dz is empty).

    In ``"llama"`` mode v̂ (in dγ) and n (in dz) are rounded as the forward rounded them;
    ``"none"`` differentiates the unrounded function at the forward's u and r. ``dresidual`` (the
    residual form's gradient reaching h directly) is added to dx. Computed in the compute dtype;
    returns (dx in x's dtype, dz in the gate's, dγ in γ's, dβ in β's), each of the last three an
    empty tensor where there is none (or ``need_weight_grad`` is false, for dγ and dβ).
    """
    group_size, norm_before_gate, activation = gating
    cd = _gated_compute_dtype(x, input_dtype)
    g = x.shape[-1] if group_size is None else group_size
    gate_first = gate is not None and not norm_before_gate
    dyf = _as(dy, x).to(cd)
    xf = x.to(cd)
    if gate is not None:
        zf = _as(gate, x).to(cd)
        a = gate_activation(zf, activation)
        da = gate_activation_grad(zf, activation)
    v = xf
    if gate_first:
        v = _gated_input(x, gate, opts, gating, input_dtype, cd).to(cd)
    vg = _grouped(v, g)  # (*, G, g)
    r = _lead(rstd.to(cd), vg)  # (*, G)
    vhat = vg * r[..., None]  # (*, G, g)
    w, b = _grouped(weight, g), _grouped(bias, g)  # (G, g)
    s = _scale(w, opts, cd)
    llama = opts.casting_mode == "llama"
    dz = None
    if gate is not None and norm_before_gate:
        # n as the forward multiplied it by the gate: rounded in "llama", exact otherwise
        if llama:
            n = rms_norm_apply(vg, r, w, b, opts, input_dtype)
        else:
            n = rms_norm_apply(vg, r, w, b, opts._replace(casting_mode="gemma"), cd)
        dz = dyf * n.reshape(x.shape).to(cd) * da
        dn = dyf * a
    else:
        dn = dyf
    dng = _grouped(dn, g)
    gs = dng * s if s is not None else dng
    # no weight (s is applied above) and no d weight (the one thing the casting mode rounds)
    dv, _, _ = rms_norm_bwd(gs, vg, None, None, r, None, opts, cd, need_weight_grad=False)
    dv = dv.reshape(x.shape)  # (*, N)
    if gate_first:
        dx = dv * a
        dz = dv * xf * da
    else:
        dx = dv
    if dresidual is not None:
        dx = dx + _as(dresidual, x).to(cd)
    empty = compute_dtype(x.dtype)
    dgate = x.new_empty((0,), dtype=empty) if dz is None else dz.to(gate.dtype)
    dw = x.new_empty((0,), dtype=empty)  # distinct tensors: outputs never alias
    db = x.new_empty((0,), dtype=empty)
    if need_weight_grad and weight is not None:
        vh = vhat.to(input_dtype).to(cd) if llama else vhat
        dw = _column_sum(dn * vh.reshape(x.shape)).to(weight.dtype)
    if need_weight_grad and bias is not None:
        db = _column_sum(dn).to(bias.dtype)
    dx = dx.to(x.dtype)
    return (dx if dx._base is None else dx.clone()), dgate, dw, db


# ----------------------------------------------------------------------------------------------
# LayerNorm
# ----------------------------------------------------------------------------------------------
# r below which x − μ may overflow float32: |x − μ| ≤ sqrt(N)·σ ≤ 2^16·σ, so overflow needs
# σ > 2^112, r < 2^-112; rows with r < 2^-100 take the scaled form (same value, no overflow).
_RISK_R = 2.0**-100


def _ln_mean(xf: torch.Tensor) -> torch.Tensor:
    """The mean of each row of xf, or its first element c where Σ (x − c) = 0: a constant row's
    mean is then exactly its value, so x − μ = 0 and σ² = 0 as in torch (a float32 mean of
    64 × 0.1 rounds, and eps = 0 then gave finite values where torch has NaN)."""
    c = xf[..., :1]
    return torch.where(_row_sum(xf - c) == 0, c[..., 0], _row_mean(xf))


def layer_norm_fwd(x, weight, bias, eps, stats=True):
    """LayerNorm forward: y = γ ⊙ (x − μ)·r + β with r = 1/sqrt(σ² + ε), σ² the population variance
    (two-pass). Computed in the compute dtype, returned in x's dtype, as ``F.layer_norm``. A row
    whose μ, x − μ or σ² overflows is normalized from s·x (the module docstring): x − μ is then
    s·x − s·μ, r_s = 1/sqrt(σ_s² + ε·s²) normalizes it, and r = s·r_s is returned.

    Returns (y, μ, r); the spec returns the statistics also with ``stats=False``.
    """
    cd = compute_dtype(x.dtype)
    xf = x.to(cd)
    mean = _ln_mean(xf)  # (*)
    xc = xf - mean[..., None]
    var = _row_mean(xc.square())
    s = overflow_scale(cd)
    xs = xf * s  # the same reads as the plain statistics: fused into their reductions when compiled
    mean_s = _ln_mean(xs)
    xc_s = xs - mean_s[..., None]
    over = ~torch.isfinite(var)  # also NaN: a NaN or inf input gives NaN either way
    xc = torch.where(over[..., None], xc_s, xc)
    sc = _ones_but(over, s, var)
    r = torch.rsqrt(torch.where(over, _row_mean(xc_s.square()), var) + eps * sc * sc)  # (*)
    mean = torch.where(over, mean_s / s, mean)
    rstd = r * sc
    y = xc * r[..., None]
    if weight is not None:
        y = y * weight.to(cd)
    if bias is not None:
        y = y + bias.to(cd)
    return y.to(x.dtype), _flat(mean), _flat(rstd)


def layer_norm_bwd(dy, x, weight, bias, mean, rstd, need_weight_grad=True):
    """LayerNorm backward: x̂ = (x − μ)·r, g = dy ⊙ γ,
    dx = r·(g − mean(g) − x̂·mean(g ⊙ x̂)); dγ = Σ_rows dy ⊙ x̂; dβ = Σ_rows dy.
    Where r < 2^-100 (σ > 1e30, where x − μ may overflow) x̂ = (s·x − s·μ)·(r/s): the same value,
    with s of :func:`overflow_scale`. Returns (dx, dγ, dβ) like :func:`rms_norm_bwd`."""
    cd = compute_dtype(x.dtype)
    dyf = _as(dy, x).to(cd)
    r = _lead(rstd.to(cd), x)[..., None]  # (*, 1)
    sc = _ones_but(r < _RISK_R, overflow_scale(cd), r)  # (*, 1)
    xhat = (x.to(cd) * sc - _lead(mean.to(cd), x)[..., None] * sc) * (r / sc)
    g = dyf * weight.to(cd) if weight is not None else dyf
    dx = r * (g - _row_mean(g, keepdim=True) - xhat * _row_mean(g * xhat, keepdim=True))
    dw = x.new_empty((0,), dtype=compute_dtype(x.dtype))  # distinct tensors: outputs never alias
    db = x.new_empty((0,), dtype=compute_dtype(x.dtype))
    if need_weight_grad and weight is not None:
        dw = _column_sum(dyf * xhat).to(weight.dtype)
    if need_weight_grad and bias is not None:
        db = _column_sum(dyf).to(bias.dtype)
    return dx.to(x.dtype), dw, db


# ----------------------------------------------------------------------------------------------
# Tensors of any shape as the launchers take them, and friendly forms over the last dim of any
# shape (what tests and the lab call)
# ----------------------------------------------------------------------------------------------
def row_matrix(t: torch.Tensor | None, n: int | None = None) -> torch.Tensor | None:
    """t (*, n) as its (M, n) rows, n = t's last dim unless given (several trailing dims
    normalized together); None stays None."""
    return None if t is None else t.reshape(-1, t.shape[-1] if n is None else n)


def param_vector(p: torch.Tensor | None) -> torch.Tensor | None:
    """A weight or bias of any shape as the (N,) vector the launchers take; None stays None."""
    return p if p is None or p.dim() == 1 else p.reshape(-1)


# The keywords of the friendly RMS forms, with rmsnorm.rms_norm's defaults (gated_rms_norm's
# norm_before_gate and activation besides).
_RMS_KEYWORDS = dict(
    group_size=None,
    eps_mode="mean_square",
    casting_mode="gemma",
    offset=0.0,
    bias=None,
    partial=None,
)
_GATE_KEYWORDS = dict(norm_before_gate=True, activation="silu")


def _friendly(fn: str, x: torch.Tensor, eps: float | None, keywords: dict, gated: bool = False):
    """(opts, bias, gating) of a friendly form's call on x: ``keywords`` over the defaults,
    ``gating`` None for an ungrouped, ungated call; an unknown keyword is a TypeError."""
    allowed = {**_RMS_KEYWORDS, **_GATE_KEYWORDS} if gated else _RMS_KEYWORDS
    unknown = keywords.keys() - allowed.keys()
    if unknown:
        raise TypeError(f"{fn}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    kw = {**_RMS_KEYWORDS, **_GATE_KEYWORDS, **keywords}
    group_size = kw["group_size"]
    g = x.shape[-1] if group_size is None else group_size
    eps = default_eps(x.dtype) if eps is None else eps
    opts = RMSOptions(
        eps, kw["eps_mode"], kw["casting_mode"], kw["offset"], partial_size(g, kw["partial"])
    )
    gating = None
    if group_size is not None or gated:
        group_count(x.shape[-1], g)
        gating = GateOptions(group_size, kw["norm_before_gate"], kw["activation"])
    return opts, kw["bias"], gating


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float | None = None, **options
) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` (see :func:`rms_norm_fwd`); ``options`` are the keywords
    of :func:`rmsnorm.rms_norm` (``eps_mode``, ``casting_mode``, ``offset``, ``bias``,
    ``partial``, ``group_size``) with its defaults. With ``group_size`` each group of that many
    elements is normalized on its own (:func:`gated_rms_norm_fwd`); ``eps=None`` is
    :func:`default_eps`."""
    opts, bias, gating = _friendly("rms_norm", x, eps, options)
    if gating is None:
        y, _ = rms_norm_fwd(row_matrix(x), weight, bias, opts)
    else:
        y, _ = gated_rms_norm_fwd(row_matrix(x), None, weight, bias, opts, gating)
    return y.reshape(x.shape)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    **options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual) over the last dim (see :func:`add_rms_norm_fwd`),
    with the keywords and grouping of :func:`rms_norm`."""
    opts, bias, gating = _friendly("add_rms_norm", x, eps, options)
    if gating is not None:
        h = residual_sum(x, residual)
        y, _ = gated_rms_norm_fwd(row_matrix(h), None, weight, bias, opts, gating, x.dtype)
        return y.reshape(x.shape), h
    y, h, _ = add_rms_norm_fwd(row_matrix(x), row_matrix(residual), weight, bias, opts)
    return y.reshape(x.shape), h.reshape(x.shape)


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    **options,
) -> torch.Tensor:
    """Grouped and gated RMSNorm over the last dim of ``x`` (see :func:`gated_rms_norm_fwd`):
    the keywords of :func:`rms_norm` and ``norm_before_gate`` (default True) and ``activation``
    (default ``"silu"``); ``partial`` takes the first ⌊p·g⌋ elements of each group of g."""
    opts, bias, gating = _friendly("gated_rms_norm", x, eps, options, gated=True)
    y, _ = gated_rms_norm_fwd(row_matrix(x), row_matrix(gate), weight, bias, opts, gating)
    return y.reshape(x.shape)


def residual_sum(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """h = x + residual, summed in the compute dtype and stored in the residual's dtype (as
    :func:`add_rms_norm_fwd`)."""
    cd = torch.promote_types(compute_dtype(x.dtype), compute_dtype(residual.dtype))
    return (x.to(cd) + _as(residual, x).to(cd)).to(residual.dtype)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm over the last dim of ``x`` (see :func:`layer_norm_fwd`)."""
    y, _, _ = layer_norm_fwd(row_matrix(x), weight, bias, eps)
    return y.reshape(x.shape)
