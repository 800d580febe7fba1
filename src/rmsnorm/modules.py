"""Drop-in ``torch.nn`` modules: same constructors, parameter names, init and ``state_dict`` as
torch's.

:class:`RMSNorm` subclasses ``torch.nn.RMSNorm`` and :class:`LayerNorm` subclasses
``torch.nn.LayerNorm``, so ``isinstance`` checks and checkpoints keep working; the conventions are
extra keyword options.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .functional import (
    _check_gating,
    _group_arguments,
    add_rms_norm,
    check_rms_options,
    gated_rms_norm,
    layer_norm,
    rms_norm,
)
from .reference import RMSOptions

__all__ = ["RMSNorm", "AddRMSNorm", "GatedRMSNorm", "LayerNorm"]


def _parameter(module: nn.Module, name: str) -> torch.Tensor | None:
    """``getattr(module, name)`` for a parameter, read from the module's parameter dict where it
    is registered there (None included): ``nn.Module.__getattr__`` is the larger part of a
    module's cost over the function on a decoding-size call. Anything else under that name (a
    parametrization's property, a data-parallel replica's tensor, a plain attribute) is read as
    an attribute."""
    params = module._parameters
    return params[name] if name in params else getattr(module, name)


def _init_options(
    norm: nn.Module,
    elementwise_affine,
    device,
    dtype,
    eps_mode,
    casting_mode,
    offset,
    bias,
    partial,
    group_size,
) -> None:
    """What RMSNorm and GatedRMSNorm set up alike once ``norm.normalized_shape`` is set: the
    options, checked and stored, and the ``bias`` parameter (or its None)."""
    weight_marker = True if elementwise_affine else None
    n = math.prod(norm.normalized_shape)
    # a call's checks of the options (eps is checked per call: None is the input dtype's)
    opts = check_rms_options(
        RMSOptions(0.0, eps_mode, casting_mode, offset, n), partial, weight_marker
    )
    if bias and not elementwise_affine:
        raise ValueError("bias=True needs elementwise_affine=True (no parameters otherwise)")
    if group_size is not None:
        _group_arguments(group_size, n, partial)
    norm.eps_mode = eps_mode
    norm.casting_mode = casting_mode
    norm.offset = opts.offset
    norm.partial = partial
    norm.group_size = group_size
    if bias:
        norm.bias = nn.Parameter(torch.empty(norm.normalized_shape, device=device, dtype=dtype))
    else:
        norm.register_parameter("bias", None)


def _options_repr(norm: nn.Module) -> list[str]:
    """The options shown in RMSNorm's and GatedRMSNorm's repr where they are not the default."""
    extra = []
    if norm.eps_mode != "mean_square":
        extra.append(f"eps_mode={norm.eps_mode!r}")
    if norm.casting_mode != "gemma":
        extra.append(f"casting_mode={norm.casting_mode!r}")
    if norm.offset != 0.0:
        extra.append(f"offset={norm.offset}")
    if norm.bias is not None:
        extra.append("bias=True")
    if norm.partial is not None:
        extra.append(f"partial={norm.partial}")
    return extra


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` with this library's kernels and named conventions.

    Keyword options (see :func:`rmsnorm.rms_norm`): ``eps_mode``, ``casting_mode``, ``offset`` (the
    weight then starts at 1 − offset so the effective scale offset + γ starts at 1: Gemma's offset 1
    gives γ = 0), ``bias`` (adds a zero-initialised ``bias`` parameter), ``partial`` and
    ``group_size``. With offset 0 and no bias its ``state_dict`` is interchangeable with
    ``torch.nn.RMSNorm``'s.

    Args:
        normalized_shape (int or list or torch.Size): the trailing dims of the input normalized
            together.
        eps (float, optional): ε. Default: ``None``, the machine epsilon of the compute dtype.
        elementwise_affine (bool): a learnable ``weight`` γ of shape ``normalized_shape``.
            Default: ``True``.
        device, dtype: of the parameters, as for any ``torch.nn`` module.
        eps_mode (str): keyword-only, as :func:`rmsnorm.rms_norm`. Default: ``"mean_square"``.
        casting_mode (str): keyword-only, as :func:`rmsnorm.rms_norm`. Default: ``"gemma"``.
        offset (float): keyword-only; the scale is offset + γ. Default: ``0.0``.
        bias (bool): keyword-only; adds a learnable ``bias``. Default: ``False``.
        partial (float, optional): keyword-only, as :func:`rmsnorm.rms_norm`. Default: ``None``.
        group_size (int, optional): keyword-only; a divisor of the normalized size: each group of
            that many elements is normalized on its own, as :func:`rmsnorm.rms_norm`.
            Default: ``None``.

    Shape:
        - Input: (*, normalized_shape)
        - Output: same shape as input

    Example::

        >>> norm = rmsnorm.RMSNorm(8, eps=1e-6)
        >>> x = torch.randn(2, 5, 8)
        >>> norm(x).shape
        torch.Size([2, 5, 8])
        >>> torch.allclose(norm(x), torch.nn.RMSNorm(8, eps=1e-6)(x), atol=1e-6)
        True
        >>> norm.load_state_dict(torch.nn.RMSNorm(8).state_dict())
        <All keys matched successfully>
        >>> gemma = rmsnorm.RMSNorm(8, offset=1.0)  # scale 1 + γ with γ = 0 at the start
        >>> gemma.weight.sum().item()
        0.0
        >>> rmsnorm.RMSNorm(8, group_size=4)  # Qwen4-Exp's grouped norm, Mamba2's n_groups = 2
        RMSNorm((8,), eps=None, elementwise_affine=True, group_size=4)
    """

    group_size: int | None = None  # also for instances made by replace_norms, which sets none

    def __init__(
        self,
        normalized_shape: int | list[int] | torch.Size,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        eps_mode: str = "mean_square",
        casting_mode: str = "gemma",
        offset: float = 0.0,
        bias: bool = False,
        partial: float | None = None,
        group_size: int | None = None,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        options = (eps_mode, casting_mode, offset, bias, partial, group_size)
        _init_options(self, elementwise_affine, device, dtype, *options)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Called once by torch's __init__ before our attributes exist, then again by ours.
        if self.elementwise_affine:
            nn.init.constant_(self.weight, 1.0 - getattr(self, "offset", 0.0))
        if getattr(self, "bias", None) is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(
            x,
            self.normalized_shape,
            _parameter(self, "weight"),
            self.eps,
            eps_mode=self.eps_mode,
            casting_mode=self.casting_mode,
            offset=self.offset,
            bias=_parameter(self, "bias"),
            partial=self.partial,
            group_size=self.group_size,
        )

    def extra_repr(self) -> str:
        extra = [super().extra_repr(), *_options_repr(self)]
        if self.group_size is not None:
            extra.append(f"group_size={self.group_size}")
        return ", ".join(extra)


class AddRMSNorm(RMSNorm):
    """The fused residual form: ``forward(x, residual) -> (out, residual_out)`` with
    residual_out = x + residual (stored in residual's dtype) and out = RMSNorm(residual_out).
    Same parameters and options as :class:`RMSNorm`.

    Args:
        normalized_shape, eps, elementwise_affine, device, dtype, eps_mode, casting_mode, offset,
            bias, partial, group_size: as :class:`RMSNorm`.

    Shape:
        - Input: x and residual, (*, normalized_shape) each
        - Output: (out, residual_out), both of x's shape

    Example::

        >>> norm = rmsnorm.AddRMSNorm(8)
        >>> x, h = torch.randn(4, 8), torch.randn(4, 8)
        >>> out, h = norm(x, h)
        >>> torch.allclose(out, rmsnorm.RMSNorm(8)(h), atol=1e-6)
        True
    """

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(
            x,
            residual,
            self.normalized_shape,
            _parameter(self, "weight"),
            self.eps,
            eps_mode=self.eps_mode,
            casting_mode=self.casting_mode,
            offset=self.offset,
            bias=_parameter(self, "bias"),
            partial=self.partial,
            group_size=self.group_size,
        )


class GatedRMSNorm(nn.Module):
    """Gated RMSNorm (:func:`rmsnorm.gated_rms_norm`): ``forward(input, gate=None)``.

    The parameters are those of HF's ``*RMSNormGated`` classes and mamba_ssm's ``RMSNormGated``:
    ``weight`` (ones, or 1 − offset; with ``elementwise_affine``) and, with ``bias=True``, ``bias``
    (zeros); so their ``state_dict`` loads as it is. The constructor is :class:`RMSNorm`'s with
    ``group_size``, ``norm_before_gate`` and ``activation``. Not a subclass of
    ``torch.nn.RMSNorm``: its forward takes the gate, and code that folds or replaces plain
    RMSNorm layers must not take it for one.

    Args:
        normalized_shape (int or list or torch.Size): the trailing dims of the input normalized
            together.
        eps (float, optional): ε. Default: ``None``, the machine epsilon of the compute dtype.
        elementwise_affine (bool): a learnable ``weight`` γ of shape ``normalized_shape``.
            Default: ``True``.
        device, dtype: of the parameters, as for any ``torch.nn`` module.
        group_size (int, optional): keyword-only; a divisor of the normalized size N: each group
            of that many elements is normalized on its own. Default: ``None`` (one group of N).
        norm_before_gate (bool): keyword-only; ``True``: y = RMSNorm(x) ⊙ act(z); ``False``:
            y = RMSNorm(x ⊙ act(z)). Default: ``True``.
        activation (str): keyword-only; ``"silu"`` or ``"sigmoid"``. Default: ``"silu"``.
        eps_mode, casting_mode, offset, bias, partial: keyword-only, as :class:`RMSNorm`.

    Shape:
        - Input: input and gate, (*, normalized_shape) each; gate may be ``None``
        - Output: same shape as input

    Example::

        >>> norm = rmsnorm.GatedRMSNorm(8, eps=1e-6, group_size=4, norm_before_gate=False)
        >>> norm
        GatedRMSNorm((8,), eps=1e-06, elementwise_affine=True, group_size=4, norm_before_gate=False)
        >>> x, z = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
        >>> norm(x, z).shape
        torch.Size([2, 5, 8])
        >>> list(norm.state_dict())
        ['weight']
    """

    def __init__(
        self,
        normalized_shape: int | list[int] | torch.Size,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        group_size: int | None = None,
        norm_before_gate: bool = True,
        activation: str = "silu",
        eps_mode: str = "mean_square",
        casting_mode: str = "gemma",
        offset: float = 0.0,
        bias: bool = False,
        partial: float | None = None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        _check_gating(None, None, norm_before_gate, activation)
        if elementwise_affine:
            shape = self.normalized_shape
            self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        options = (eps_mode, casting_mode, offset, bias, partial, group_size)
        _init_options(self, elementwise_affine, device, dtype, *options)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.norm_before_gate = norm_before_gate
        self.activation = activation
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.offset)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        return gated_rms_norm(
            input,
            gate,
            self.normalized_shape,
            _parameter(self, "weight"),
            self.eps,
            group_size=self.group_size,
            norm_before_gate=self.norm_before_gate,
            activation=self.activation,
            eps_mode=self.eps_mode,
            casting_mode=self.casting_mode,
            offset=self.offset,
            bias=_parameter(self, "bias"),
            partial=self.partial,
        )

    def extra_repr(self) -> str:
        extra = [
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        ]
        if self.group_size is not None:
            extra.append(f"group_size={self.group_size}")
        if not self.norm_before_gate:
            extra.append("norm_before_gate=False")
        if self.activation != "silu":
            extra.append(f"activation={self.activation!r}")
        return ", ".join(extra + _options_repr(self))


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` running this library's LayerNorm op; constructor, parameters and
    ``state_dict`` are torch's.

    Args:
        normalized_shape (int or list or torch.Size): the trailing dims of the input normalized
            together.
        eps (float): ε. Default: ``1e-5``.
        elementwise_affine (bool): a learnable ``weight`` (ones at the start). Default: ``True``.
        bias (bool): and a learnable ``bias`` (zeros), with ``elementwise_affine``.
            Default: ``True``.
        device, dtype: of the parameters.

    Shape:
        - Input: (*, normalized_shape)
        - Output: same shape as input

    Example::

        >>> norm = rmsnorm.LayerNorm(8)
        >>> x = torch.randn(2, 5, 8)
        >>> torch.allclose(norm(x), torch.nn.LayerNorm(8)(x), atol=1e-5)
        True
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = _parameter(self, "weight"), _parameter(self, "bias")
        return layer_norm(x, self.normalized_shape, weight, bias, self.eps)
