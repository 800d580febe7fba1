"""The :class:`Convention` value (how one normalization class computes, in this library's terms),
the named conventions, and what a module's own attributes must be for its convention to run it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...reference import CASTING_MODES

__all__ = [
    "Convention",
    "NAMED_CONVENTIONS",
    "GATE_ACTIVATIONS",
    "ACT2FN_NAMES",
    "instance_problem",
    "group_size",
]

# The gate activations of rmsnorm.gated_rms_norm.
GATE_ACTIVATIONS = ("silu", "sigmoid")
# transformers' ACT2FN names of those activations -> this library's name of each: what a gated
# class's activation attribute may hold (the recognition checks that ACT2FN maps them so).
ACT2FN_NAMES = {"silu": "silu", "swish": "silu", "sigmoid": "sigmoid"}


@dataclass(frozen=True)
class Convention:
    """How one normalization class computes, in this library's terms.

    ``kind``: ``"rms"`` (RMSNorm, ``eps_mode="mean_square"``) or ``"layer"`` (LayerNorm), both
    over the last dimension unless ``shape_attr`` names the attribute holding the normalized shape
    (``"normalized_shape"`` for ``torch.nn.LayerNorm``).
    ``eps_attr``: the attribute holding ε (``variance_epsilon`` in Llama-derived classes, ``eps`` in
    Gemma's and torch's); ``None`` means the fixed ``eps``.
    ``casting_mode`` (RMSNorm only): ``"llama"``, ``"gemma"`` or ``"none"`` (see
    :func:`rmsnorm.rms_norm`).
    ``cast_to_weight`` (RMSNorm only): T5LayerNorm's rule, a variant of ``casting_mode="llama"``
    (which it requires): x̂ is normalized in fp32 and cast to the **weight's** dtype when that is
    fp16/bf16 (else kept in fp32), then multiplied by the weight, so the output dtype follows the
    weight rather than the input.
    ``offset``: the scale is offset + γ. ``weight`` / ``bias``: the module's ``weight`` / ``bias``
    attribute scales / is added; ``weight_flag`` names a boolean attribute that switches the weight
    on and off per instance (Gemma 3n's ``with_scale``).
    ``model_types``: for classes shared by every model (``torch.nn.LayerNorm``), patch only inside
    models whose ``config.model_type`` is listed.

    Gated and grouped RMSNorm (``kind="rms"`` only; see :func:`rmsnorm.gated_rms_norm`):
    ``gate``: ``None`` (the forward takes one input), ``"required"`` or ``"optional"`` (the
    forward takes ``(hidden_states, gate=None)``; an optional gate of ``None`` means no gate).
    ``norm_before_gate`` / ``activation`` (``"silu"`` or ``"sigmoid"``): the order and the gate's
    activation, or read per instance from the attribute ``norm_before_gate_attr`` / the
    ``ACT2FN`` name held in ``activation_attr``. ``group_size_attr`` names the attribute holding
    g (``None`` there: one group), ``n_groups_attr`` the one holding N / g. ``ranks``: the input
    ranks the class's forward takes (others raise), empty for any.
    ``offset_in_weight_dtype``: offset + γ is summed in the weight's dtype (then read in fp32),
    not in the compute dtype. ``optional_params``: ``weight`` and ``bias`` are both read and each
    may be ``None``. ``fp32_reductions_attr``: a boolean attribute that must be true (the class
    reduces in the input dtype where it is false, which this library does not do in half
    precision).
    """

    kind: str
    eps_attr: str | None
    casting_mode: str = "gemma"
    offset: float = 0.0
    bias: bool = False
    model_types: tuple[str, ...] = ()
    weight: bool = True
    weight_flag: str | None = None
    eps: float | None = None
    shape_attr: str | None = None
    cast_to_weight: bool = False
    gate: str | None = None
    norm_before_gate: bool = True
    norm_before_gate_attr: str | None = None
    activation: str = "silu"
    activation_attr: str | None = None
    group_size_attr: str | None = None
    n_groups_attr: str | None = None
    ranks: tuple[int, ...] = ()
    offset_in_weight_dtype: bool = False
    optional_params: bool = False
    fp32_reductions_attr: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("rms", "layer"):
            raise ValueError(f"Convention.kind must be 'rms' or 'layer', got {self.kind!r}")
        if self.casting_mode == "t5":
            raise ValueError(
                "Convention.casting_mode 't5' is not a casting mode: T5LayerNorm's rule is "
                "casting_mode='llama' with cast_to_weight=True (the named convention 't5')"
            )
        modes = CASTING_MODES if self.kind == "rms" else ("gemma",)
        if self.casting_mode not in modes:
            raise ValueError(
                f"Convention.casting_mode must be one of {modes} for kind={self.kind!r}, "
                f"got {self.casting_mode!r}"
            )
        if self.eps_attr is None:
            if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)):
                raise ValueError(
                    f"Convention.eps must be a number when eps_attr is None, got {self.eps!r}"
                )
        elif not isinstance(self.eps_attr, str) or self.eps is not None:
            raise ValueError(
                "Convention needs either eps_attr (an attribute name) or eps (a fixed number), "
                f"got eps_attr={self.eps_attr!r}, eps={self.eps!r}"
            )
        if not isinstance(self.offset, (int, float)) or not math.isfinite(self.offset):
            raise ValueError(f"Convention.offset must be a finite number, got {self.offset!r}")
        if self.kind == "layer" and self.offset != 0.0:
            raise ValueError("Convention.offset must be 0 for kind='layer' (layer_norm has none)")
        if not isinstance(self.cast_to_weight, bool):
            raise ValueError(
                f"Convention.cast_to_weight must be True or False, got {self.cast_to_weight!r}"
            )
        if self.cast_to_weight and (self.kind, self.casting_mode) != ("rms", "llama"):
            raise ValueError(
                "Convention.cast_to_weight=True is a variant of casting_mode='llama' for "
                f"kind='rms', got kind={self.kind!r}, casting_mode={self.casting_mode!r}"
            )
        needs_weight = self.offset != 0.0 or self.cast_to_weight or self.weight_flag
        if needs_weight and not self.weight:
            raise ValueError(
                "Convention with offset, cast_to_weight or weight_flag needs weight=True"
            )
        if not isinstance(self.model_types, tuple):
            raise ValueError(f"Convention.model_types must be a tuple, got {self.model_types!r}")
        self._check_gated()

    def _check_gated(self) -> None:
        if self.gate not in (None, "required", "optional"):
            raise ValueError(
                f"Convention.gate must be None, 'required' or 'optional', got {self.gate!r}"
            )
        if self.activation not in GATE_ACTIVATIONS:
            raise ValueError(
                f"Convention.activation must be one of {GATE_ACTIVATIONS}, got {self.activation!r}"
            )
        for name in ("norm_before_gate", "offset_in_weight_dtype", "optional_params"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"Convention.{name} must be True or False, got {getattr(self, name)!r}"
                )
        for name in _ATTRIBUTE_FIELDS:
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.isidentifier()):
                raise ValueError(f"Convention.{name} must be an attribute name, got {value!r}")
        if not (
            isinstance(self.ranks, tuple)
            and all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in self.ranks)
        ):
            raise ValueError(f"Convention.ranks must be a tuple of ranks, got {self.ranks!r}")
        if self.gate is None and self._gate_options():
            raise ValueError(
                "Convention: norm_before_gate, activation and their attributes need a gate "
                "(gate='required' or 'optional')"
            )
        if self.gate is not None or self.extended:
            if self.kind != "rms" or self.cast_to_weight or self.shape_attr:
                raise ValueError(
                    "Convention: gates, groups, ranks, offset_in_weight_dtype, optional_params "
                    "and fp32_reductions_attr are options of kind='rms' without cast_to_weight "
                    "or shape_attr"
                )
        if self.group_size_attr and self.n_groups_attr:
            raise ValueError("Convention: group_size_attr and n_groups_attr exclude each other")
        if self.offset_in_weight_dtype and (self.offset == 0.0 or not self.weight):
            raise ValueError("Convention.offset_in_weight_dtype needs an offset and weight=True")
        if self.optional_params and (
            not (self.weight and self.bias) or self.weight_flag or self.offset != 0.0
        ):
            raise ValueError(
                "Convention.optional_params reads weight and bias (weight=True, bias=True), "
                "without weight_flag or offset"
            )

    def eps_of(self, module: nn.Module) -> float:
        """ε of ``module``: its attribute ``eps_attr``, or the fixed ``eps``."""
        return getattr(module, self.eps_attr) if self.eps_attr else self.eps

    def _gate_options(self) -> bool:
        """Whether an option of the gate differs from its default."""
        by_attr = self.norm_before_gate_attr is not None or self.activation_attr is not None
        return by_attr or not self.norm_before_gate or self.activation != "silu"

    @property
    def extended(self) -> bool:
        """Whether an RMSNorm option beyond the common ones is set: groups, ``ranks``,
        ``offset_in_weight_dtype``, ``optional_params`` or ``fp32_reductions_attr`` (an ungated
        class with one of them runs the extended patched forward)."""
        return bool(
            self.group_size_attr
            or self.n_groups_attr
            or self.ranks
            or self.offset_in_weight_dtype
            or self.optional_params
            or self.fp32_reductions_attr
        )


# The fields of Convention that name an attribute of the module (checked as identifiers).
_ATTRIBUTE_FIELDS = (
    "norm_before_gate_attr",
    "activation_attr",
    "group_size_attr",
    "n_groups_attr",
    "fp32_reductions_attr",
)


def _rms(eps_attr: str, casting_mode: str = "gemma", **options) -> Convention:
    return Convention("rms", eps_attr, casting_mode, **options)


# Conventions by name, for register() and the docs.
NAMED_CONVENTIONS: dict[str, Convention] = {
    # x.to(fp32) normalized, cast back to the input dtype, then weight * that.
    "llama": _rms("variance_epsilon", "llama"),
    # x.float() normalized, × (1 + weight.float()), cast back at the end (`type_as(x)`).
    "gemma": _rms("eps", offset=1.0),
    # normalized in fp32, (weight * x̂) in fp32, cast to the input dtype at the end.
    "olmo2": _rms("variance_epsilon"),
    # fp32 variance, x̂ cast to the weight's dtype only when that is half precision.
    "t5": _rms("variance_epsilon", "llama", cast_to_weight=True),
    # torch.nn.LayerNorm: F.layer_norm over normalized_shape, with weight and bias.
    "layer_norm": Convention("layer", "eps", bias=True, shape_attr="normalized_shape"),
    # Gated (forward(hidden_states, gate)). Norm, then gate: x̂ as "llama", × act(z) in fp32, cast
    # to the input dtype; act is ACT2FN[self.activation].
    "qwen3_next_gated": _rms(
        "variance_epsilon", "llama", gate="required", activation_attr="activation"
    ),
    # Norm, then gate, all in fp32 (weight.to(float32)), one cast at the end.
    "kimi_linear_gated": _rms("variance_epsilon", gate="required", activation_attr="activation"),
    # Gate, then norm (x·silu(z) in fp32) per group of self.group_size, x̂ cast to the input dtype,
    # then weight * that; gate=None: no gate.
    "mamba2_gated": _rms(
        "variance_epsilon",
        "llama",
        gate="optional",
        norm_before_gate=False,
        group_size_attr="group_size",
    ),
    # Either order (self.norm_before_gate), self.n_groups groups, all in fp32, one cast at the end;
    # 2-D and 3-D inputs only.
    "falcon_h1_gated": _rms(
        "variance_epsilon",
        gate="optional",
        norm_before_gate_attr="norm_before_gate",
        n_groups_attr="n_groups",
        ranks=(2, 3),
    ),
}


def group_size(module: nn.Module, conv: Convention, n: int) -> int | None:
    """g, the elements per group of a row of ``n`` elements, from the module's attribute that
    ``conv`` names (``group_size_attr``, or ``n_groups_attr``: n / groups); ``None`` for one group
    (no such attribute, or g = n). Raises ``ValueError`` when the groups do not divide n."""
    if conv.group_size_attr is not None:
        g = getattr(module, conv.group_size_attr)
    elif conv.n_groups_attr is not None:
        groups = getattr(module, conv.n_groups_attr)
        if n % groups:
            raise ValueError(
                f"{type(module).__name__}: the last dimension of hidden_states ({n}) is not "
                f"divisible by its {conv.n_groups_attr} ({groups})"
            )
        g = n // groups
    else:
        return None
    return None if g == n else g


def instance_problem(module: nn.Module, conv: Convention) -> str | None:
    """Why this module cannot be run by ``conv`` although its class can (its ε, its weight and
    bias, its gate and group attributes), as a short reason; ``None`` when it can."""
    if conv.eps_attr is not None:
        eps = getattr(module, conv.eps_attr, None)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            return f"its {conv.eps_attr} is {eps!r}, not a number"
    if conv.shape_attr is not None:
        if getattr(module, conv.shape_attr, None) is None:
            return f"it has no {conv.shape_attr}"
        return None  # the op checks weight and bias against the shape
    with_weight = conv.weight
    if conv.weight_flag is not None:
        flag = getattr(module, conv.weight_flag, None)
        if not isinstance(flag, bool):
            return f"its {conv.weight_flag} is {flag!r}, not True or False"
        with_weight = flag
    for attr, used in (("weight", with_weight), ("bias", conv.bias)):
        value = getattr(module, attr, None)
        if conv.optional_params and value is None:
            continue
        if used and not (isinstance(value, torch.Tensor) and value.dim() == 1):
            shape = list(value.shape) if isinstance(value, torch.Tensor) else value
            return (
                f"its {attr} is {shape}: the convention applies a 1-D {attr} to the last "
                "dimension only"
            )
    return _gated_problem(module, conv)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _gated_problem(module: nn.Module, conv: Convention) -> str | None:
    """:func:`instance_problem` for the attributes of gated and grouped conventions."""
    weight = getattr(module, "weight", None)
    n = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 1 else None
    attr = conv.group_size_attr
    if attr is not None:
        g = getattr(module, attr, None)
        if g is not None and not (_is_int(g) and g > 0):
            return f"its {attr} is {g!r}, not a positive int (or None)"
        if g is not None and n is not None and n % g:
            return f"its {attr} {g} does not divide its weight's {n} elements"
    attr = conv.n_groups_attr
    if attr is not None:
        k = getattr(module, attr, None)
        if not (_is_int(k) and k > 0):
            return f"its {attr} is {k!r}, not a positive int"
        if n is not None and n % k:
            return f"its {attr} {k} does not divide its weight's {n} elements"
    attr = conv.norm_before_gate_attr
    if attr is not None and not isinstance(getattr(module, attr, None), bool):
        return f"its {attr} is {getattr(module, attr, None)!r}, not True or False"
    attr = conv.activation_attr
    if attr is not None and ACT2FN_NAMES.get(getattr(module, attr, None)) is None:
        return (
            f"its {attr} is {getattr(module, attr, None)!r}: the gate activations this library "
            f"computes are ACT2FN's {sorted(ACT2FN_NAMES)}"
        )
    attr = conv.fp32_reductions_attr
    if attr is not None and getattr(module, attr, None) is not True:
        return (
            f"its {attr} is {getattr(module, attr, None)!r}: it then reduces in the input dtype, "
            "which this library does not do in float16 / bfloat16 (it always reduces in float32; "
            "a half-precision sum of squares overflows float16 past |x| ≈ 256)"
        )
    return None
