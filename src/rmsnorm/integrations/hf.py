"""Hugging Face transformers integration: make the normalization layers of a model run this
library's ops. A class is recognised when its ``forward`` is one of a few known normalization
forwards (compared as code), by an explicit table, or by :func:`register`; transformers itself is
imported only by :func:`patch_classes` with no argument, never at import time."""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import inspect
import math
import os
import sys
import textwrap
import types
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional
from torch import nn

from .. import gated_rms_norm, layer_norm, rms_norm
from ..reference import CASTING_MODES

__all__ = [
    "Convention",
    "CONVENTIONS",
    "NAMED_CONVENTIONS",
    "register",
    "convention_of",
    "patch",
    "unpatch",
    "patch_classes",
    "unpatch_classes",
    "is_patched",
]

_HALF = (torch.float16, torch.bfloat16)
# The gate activations of rmsnorm.gated_rms_norm, and the names transformers' ACT2FN gives them.
GATE_ACTIVATIONS = ("silu", "sigmoid")
_ACT2FN_NAMES = {"silu": "silu", "swish": "silu", "sigmoid": "sigmoid"}


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
        for name in (
            "norm_before_gate_attr", "activation_attr", "group_size_attr", "n_groups_attr",
            "fp32_reductions_attr",
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.isidentifier()):
                raise ValueError(f"Convention.{name} must be an attribute name, got {value!r}")
        if not (
            isinstance(self.ranks, tuple)
            and all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in self.ranks)
        ):
            raise ValueError(f"Convention.ranks must be a tuple of ranks, got {self.ranks!r}")
        gate_options = (
            not self.norm_before_gate or self.norm_before_gate_attr is not None
            or self.activation != "silu" or self.activation_attr is not None
        )  # fmt: skip
        if self.gate is None and gate_options:
            raise ValueError(
                "Convention: norm_before_gate, activation and their attributes need a gate "
                "(gate='required' or 'optional')"
            )
        extended = (
            self.gate is not None or self.group_size_attr or self.n_groups_attr or self.ranks
            or self.offset_in_weight_dtype or self.optional_params or self.fp32_reductions_attr
        )  # fmt: skip
        if extended and (self.kind != "rms" or self.cast_to_weight or self.shape_attr):
            raise ValueError(
                "Convention: gates, groups, ranks, offset_in_weight_dtype, optional_params and "
                "fp32_reductions_attr are options of kind='rms' without cast_to_weight or "
                "shape_attr"
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


def _conv(eps_attr: str | None, casting_mode: str = "gemma", **kwargs) -> Convention:
    return Convention("rms", eps_attr, casting_mode, **kwargs)


# Conventions by name, for :func:`register` and the docs.
NAMED_CONVENTIONS: dict[str, Convention] = {
    # x.to(fp32) normalized, cast back to the input dtype, then weight * that.
    "llama": _conv("variance_epsilon", "llama"),
    # x.float() normalized, × (1 + weight.float()), cast back at the end (`type_as(x)`).
    "gemma": _conv("eps", offset=1.0),
    # normalized in fp32, (weight * x̂) in fp32, cast to the input dtype at the end.
    "olmo2": _conv("variance_epsilon"),
    # fp32 variance, x̂ cast to the weight's dtype only when that is half precision.
    "t5": _conv("variance_epsilon", "llama", cast_to_weight=True),
    # torch.nn.LayerNorm: F.layer_norm over normalized_shape, with weight and bias.
    "layer_norm": Convention("layer", "eps", bias=True, shape_attr="normalized_shape"),
    # Gated (forward(hidden_states, gate)). Norm, then gate: x̂ as "llama", × act(z) in fp32, cast
    # to the input dtype; act is ACT2FN[self.activation].
    "qwen3_next_gated": _conv(
        "variance_epsilon", "llama", gate="required", activation_attr="activation"
    ),
    # Norm, then gate, all in fp32 (weight.to(float32)), one cast at the end.
    "kimi_linear_gated": _conv("variance_epsilon", gate="required", activation_attr="activation"),
    # Gate, then norm (x·silu(z) in fp32) per group of self.group_size, x̂ cast to the input dtype,
    # then weight * that; gate=None: no gate.
    "mamba2_gated": _conv(
        "variance_epsilon",
        "llama",
        gate="optional",
        norm_before_gate=False,
        group_size_attr="group_size",
    ),
    # Either order (self.norm_before_gate), self.n_groups groups, all in fp32, one cast at the end;
    # 2-D and 3-D inputs only.
    "falcon_h1_gated": _conv(
        "variance_epsilon",
        gate="optional",
        norm_before_gate_attr="norm_before_gate",
        n_groups_attr="n_groups",
        ranks=(2, 3),
    ),
}


# ----------------------------------------------------------------------------------------------
# Recognition by code: the known forwards. A class is recognised when its forward (and every
# method of its own that the forward reaches through ``self``) is one of these, up to local
# variable names, annotations, docstrings, comments and layout, with the same globals (torch, nn,
# F, and transformers' ACT2FN in the gated ones). Each entry is written once here, the way
# transformers 5.24 writes it, with the class it was taken from ("model.Class":
# transformers.models.<model>.modeling_<model>.<Class>). A gated forward takes (hidden_states,
# gate); its patched forward takes the same two.
# ----------------------------------------------------------------------------------------------
_NORM_HELPER = """
def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
"""

_KNOWN_FORWARDS: tuple[tuple[str, Convention, str], ...] = (
    (
        "llama.LlamaRMSNorm",
        NAMED_CONVENTIONS["llama"],
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
""",
    ),
    (
        "gemma.GemmaRMSNorm",
        NAMED_CONVENTIONS["gemma"],
        """
def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight.float())
    return output.type_as(x)
"""
        + _NORM_HELPER,
    ),
    (
        "olmo2.Olmo2RMSNorm",
        NAMED_CONVENTIONS["olmo2"],
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return (self.weight * hidden_states).to(input_dtype)
""",
    ),
    (
        "helium.HeliumRMSNorm",
        NAMED_CONVENTIONS["olmo2"],
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return (self.weight.to(torch.float32) * hidden_states).to(input_dtype)
""",
    ),
    (
        "t5.T5LayerNorm",
        NAMED_CONVENTIONS["t5"],
        """
def forward(self, hidden_states):
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states
""",
    ),
    (
        "gemma3n.Gemma3nRMSNorm",  # no offset; the weight only where with_scale is True
        _conv("eps", weight_flag="with_scale"),
        """
def forward(self, hidden_states):
    normed_output = self._norm(hidden_states.float())
    if self.with_scale:
        normed_output = normed_output * self.weight.float()
    return normed_output.type_as(hidden_states)

def _norm(self, hidden_states):
    mean_squared = hidden_states.pow(2).mean(-1, keepdim=True) + self.eps
    return hidden_states * torch.pow(mean_squared, -0.5)
""",
    ),
    (
        "moshi.MoshiRMSNorm",
        _conv("eps"),
        """
def forward(self, x):
    output = self._norm(x.float())
    output = output * self.weight.float()
    return output.type_as(x)
"""
        + _NORM_HELPER,
    ),
    (
        "llama4.Llama4TextRMSNorm",
        _conv("eps", "llama"),
        """
def forward(self, x):
    output = self._norm(x.float()).type_as(x)
    return output * self.weight
"""
        + _NORM_HELPER,
    ),
    (
        # x / sqrt(mean(x²) + ε) · weight, all in the input dtype: "llama" computes x̂ in fp32 and
        # rounds it to the input dtype before the weight, so it is the same in fp32 and closer to
        # exact in half precision, with the same output dtype.
        "imagegpt.ImageGPTLayerNorm",
        _conv("eps", "llama"),
        """
def forward(self, tensor):
    tensor = tensor / torch.sqrt(torch.mean(torch.square(tensor), axis=-1, keepdim=True) + self.eps)
    tensor = tensor * self.weight
    return tensor
""",
    ),
    (
        "nanochat.NanoChatRMSNorm",  # no weight
        _conv("eps", weight=False),
        """
def forward(self, x):
    return self._norm(x.float()).type_as(x)
"""
        + _NORM_HELPER,
    ),
    (
        "inkling2.Inkling2UnweightedRMSNorm",
        _conv("eps", weight=False),
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.float()
    hidden_states = hidden_states * torch.rsqrt(hidden_states.square().mean(-1, keepdim=True) + self.eps)
    return hidden_states.to(input_dtype)
""",  # noqa: E501
    ),
    (
        # r in fp32, rounded to the input dtype, x·r in the input dtype: casting_mode "none".
        "deepseek_v4.DeepseekV4UnweightedRMSNorm",
        _conv("eps", "none", weight=False),
        """
def forward(self, x):
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps).to(x.dtype)
""",
    ),
    (
        "cohere.CohereLayerNorm",  # LayerNorm without bias, fp32 throughout, cast at the end
        Convention("layer", "variance_epsilon"),
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    mean = hidden_states.mean(-1, keepdim=True)
    variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
    hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = self.weight.to(torch.float32) * hidden_states
    return hidden_states.to(input_dtype)
""",
    ),
    (
        # Gemma's convention per group of self.group_size (None: the whole row).
        "qwen4_exp.Qwen4ExpTextRMSNorm",
        _conv("eps", offset=1.0, group_size_attr="group_size"),
        """
def _norm(self, x):
    if self.group_size is not None:
        x = x.reshape(*x.shape[:-1], -1, self.group_size)
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    return out.flatten(-2) if self.group_size is not None else out

def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight.float())
    return output.type_as(x)
""",
    ),
    (
        # Gemma's, but 1 + weight is summed in the weight's dtype before .float().
        "muse_spark.MuseSparkTextCenteredRMSNorm",
        _conv("eps", offset=1.0, offset_in_weight_dtype=True),
        """
def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight).float()
    return output.type_as(x)
"""
        + _NORM_HELPER,
    ),
    (
        # Llama's with an optional weight and bias; force_float32_reductions=False reduces in the
        # input dtype (refused).
        "xlstm.xLSTMRMSNorm",
        _conv(
            "eps",
            "llama",
            bias=True,
            optional_params=True,
            fp32_reductions_attr="force_float32_reductions",
        ),
        """
def _apply_weight_bias(self, x):
    if self.weight is not None:
        x = x * self.weight
    if self.bias is not None:
        x = x + self.bias
    return x

def _rms_normalize(self, x):
    in_dtype = x.dtype
    if self.force_float32_reductions:
        x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
    return x.to(in_dtype)

def forward(self, x):
    x = self._rms_normalize(x)
    x = self._apply_weight_bias(x)
    return x
""",
    ),
    (
        "qwen3_next.Qwen3NextRMSNormGated",
        NAMED_CONVENTIONS["qwen3_next_gated"],
        """
def forward(self, hidden_states, gate):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = self.weight * hidden_states.to(input_dtype)
    hidden_states = hidden_states * ACT2FN[self.activation](gate.to(torch.float32))
    return hidden_states.to(input_dtype)
""",
    ),
    (
        "kimi_linear.KimiLinearRMSNormGated",
        NAMED_CONVENTIONS["kimi_linear_gated"],
        """
def forward(self, hidden_states, gate=None):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = self.weight.to(torch.float32) * hidden_states
    hidden_states = hidden_states * ACT2FN[self.activation](gate.to(torch.float32))
    return hidden_states.to(input_dtype)
""",
    ),
    (
        "mamba2.MambaRMSNormGated",
        NAMED_CONVENTIONS["mamba2_gated"],
        """
def forward(self, hidden_states, gate=None):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    if gate is not None:
        hidden_states = hidden_states * nn.functional.silu(gate.to(torch.float32))
    *prefix_dims, last_dim = hidden_states.shape
    group_count = last_dim // self.group_size
    hidden_states_group = hidden_states.view(*prefix_dims, group_count, self.group_size)
    variance = hidden_states_group.pow(2).mean(-1, keepdim=True)
    hidden_states_group = hidden_states_group * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = hidden_states_group.view(*prefix_dims, group_count * self.group_size)
    return self.weight * hidden_states.to(input_dtype)
""",
    ),
    (
        "falcon_h1.FalconH1RMSNormGated",
        NAMED_CONVENTIONS["falcon_h1_gated"],
        """
def forward(self, hidden_states, gate=None):
    input_dtype = hidden_states.dtype
    input_ndim = hidden_states.ndim
    if not self.norm_before_gate and gate is not None:
        hidden_states = hidden_states * F.silu(gate.to(torch.float32))
    if len(hidden_states.shape) == 3:
        batch_size, seq_len, dim = hidden_states.shape
    else:
        batch_size, dim = hidden_states.shape
        seq_len = 1
    hidden_states = hidden_states.to(torch.float32)
    hidden_states = hidden_states.view(batch_size, seq_len, self.n_groups, int(dim // self.n_groups))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = self.weight.view(self.n_groups, int(dim // self.n_groups)) * hidden_states
    hidden_states = hidden_states.view(batch_size, seq_len, dim)
    if input_ndim == 2:
        hidden_states = hidden_states.squeeze(1)
    if self.norm_before_gate and gate is not None:
        hidden_states = hidden_states * F.silu(gate.to(torch.float32))
    return hidden_states.to(input_dtype)
""",  # noqa: E501
    ),
    (
        "olmo.OlmoLayerNorm",  # LayerNorm without parameters, ε fixed at 1e-5
        Convention("layer", None, weight=False, eps=1e-5, shape_attr="normalized_shape"),
        """
def forward(self, hidden_states):
    orig_dtype = hidden_states.dtype
    return F.layer_norm(hidden_states.to(dtype=torch.float32), self.normalized_shape, None, None, eps=1e-5).to(orig_dtype)
""",  # noqa: E501
    ),
)

# Known forwards that are refused, with the reason, so that the warning says what they are.
_KNOWN_REFUSALS: tuple[tuple[str, str, str], ...] = (
    (
        "axk2.AXK2GatedRMSNorm",
        "it is a container, not one norm: it returns y = self.norm(x), an RMSNorm patched on its "
        "own, times a sigmoid gate that self.mlp computes from y, which no single call of this "
        "library computes",
        """
def forward(self, x):
    y = self.norm(x)
    return (y * torch.sigmoid(self.mlp(y).float())).to(y.dtype)
""",
    ),
)

# The global names the known forwards use, and what they must be in the candidate's module
# (ACT2FN, transformers' activation table, is looked up only where a candidate reads it: its
# module imported transformers already).
_KNOWN_GLOBALS = {"torch": torch, "nn": nn, "F": torch.nn.functional}


def _expected_global(name: str) -> object:
    if name == "ACT2FN":
        return getattr(sys.modules.get("transformers.activations"), "ACT2FN", None)
    return _KNOWN_GLOBALS.get(name, getattr(builtins, name, None))


_SILU_FORWARD = """
def forward(self, input):
    return nn.functional.silu(input)
"""


def _act2fn_problem() -> str | None:
    """Why transformers' ACT2FN does not map the names of ``_ACT2FN_NAMES`` to SiLU / the
    sigmoid (None when it does): torch's modules, or transformers' SiLUActivation when its forward
    is ``nn.functional.silu``, recognised by code as the norms are."""
    table = _expected_global("ACT2FN")
    if table is None:
        return "transformers.activations.ACT2FN is not loaded"
    for name, kind in _ACT2FN_NAMES.items():
        try:
            act = type(table[name])
        except Exception as exc:  # a table that changed shape
            return f"ACT2FN[{name!r}] fails: {type(exc).__name__}: {exc}"
        if act in (nn.SiLU, nn.Sigmoid):
            found = "silu" if act is nn.SiLU else "sigmoid"
        else:
            forward = inspect.getattr_static(act, "forward", None)
            methods = (
                _source_methods(act, forward) if isinstance(forward, types.FunctionType) else None
            )
            silu = {"forward": _normalize(_SILU_FORWARD)[0]}
            found = "silu" if methods == silu else None
        if found != kind:
            return f"ACT2FN[{name!r}] is {act.__qualname__}, not the {kind} this library computes"
    return None


# Classes that need an entry because their forward is not one of the known ones: qualified class
# name -> convention. torch's LayerNorm is shared by every model, so it is patched only inside the
# models that use it as their own norm.
CONVENTIONS: dict[str, Convention] = {
    "torch.nn.modules.normalization.LayerNorm": Convention(
        "layer", "eps", bias=True, model_types=("gpt2", "gpt_neox"), shape_attr="normalized_shape"
    ),
}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class _Normalizer(ast.NodeTransformer):
    """Renames the arguments and locals of one function to a0, a1, ... / v0, v1, ... in order of
    appearance and drops what cannot change the result (annotations, the docstring, the name);
    records the global names it reads and the attributes it reads from the first argument."""

    def __init__(self, fn: ast.FunctionDef) -> None:
        args = fn.args
        params = args.posonlyargs + args.args + args.kwonlyargs
        params += [a for a in (args.vararg, args.kwarg) if a is not None]
        self.names = {a.arg: f"a{i}" for i, a in enumerate(params)}
        self.self_name = params[0].arg if params else None
        stored = {
            n.id
            for n in ast.walk(fn)
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
        }
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and node.id in stored:
                self.names.setdefault(node.id, f"v{len(self.names)}")
        self.globals: set[str] = set()
        self.self_attrs: set[str] = set()

    def visit_arg(self, node: ast.arg) -> ast.arg:
        return ast.arg(arg=self.names[node.arg])

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.names:
            return ast.Name(id=self.names[node.id], ctx=node.ctx)
        self.globals.add(node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == self.self_name:
            self.self_attrs.add(node.attr)
        return self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return ast.Pass()
        return self.generic_visit(ast.Assign(targets=[node.target], value=node.value))


def _normalize(source: str) -> tuple[str, set[str], set[str]]:
    """(canonical dump, global names read, attributes read from self) of the one function in
    ``source``."""
    fn = ast.parse(textwrap.dedent(source)).body[0]
    if not isinstance(fn, ast.FunctionDef):
        raise ValueError("not a function")
    norm = _Normalizer(fn)
    body = fn.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
        body = body[1:]  # the docstring
    args = norm.visit(fn.args)
    body = [norm.visit(stmt) for stmt in body]
    decorators = [norm.visit(d) for d in fn.decorator_list]
    dump = ast.dump(ast.Module([*decorators, args, *body], type_ignores=[]))
    return dump, norm.globals, norm.self_attrs


@functools.cache
def _known() -> dict[tuple[str, ...], list[tuple[dict[str, str], Convention | str, str]]]:
    """The known forwards and known refusals, keyed by their ``co_names`` (a cheap first filter):
    for each, the canonical dumps of its methods by name, its convention (or the reason it is
    refused) and the class it comes from."""
    known: dict = {}
    for origin, conv, source in (*_KNOWN_FORWARDS, *_KNOWN_REFUSALS):
        source = textwrap.dedent(source)
        module_code = compile(source, f"<known forward of {origin}>", "exec")
        forward_code = next(
            c for c in module_code.co_consts if getattr(c, "co_name", 0) == "forward"
        )
        methods = {node.name: _normalize(ast.unparse(node))[0] for node in ast.parse(source).body}
        known.setdefault(forward_code.co_names, []).append((methods, conv, origin))
    return known


def _source_methods(cls: type, forward: types.FunctionType) -> dict[str, str] | str:
    """The canonical dumps of ``forward`` and of every method of ``cls`` it reaches through self,
    or the reason they cannot be compared."""
    methods: dict[str, str] = {}
    todo = [("forward", forward)]
    while todo:
        name, fn = todo.pop()
        try:
            dump, global_names, attrs = _normalize(inspect.getsource(fn))
        except (OSError, TypeError, SyntaxError, ValueError, IndexError):
            return f"the source of its {name} is not available to compare with the known forwards"
        for g in global_names:
            expected = _expected_global(g)
            actual = fn.__globals__.get(g, getattr(builtins, g, None))
            if expected is None or actual is not expected:
                return f"its {name} reads the global {g!r}, which none of the known forwards use"
        methods[name] = dump
        for attr in sorted(attrs):
            static = inspect.getattr_static(cls, attr, None)
            if isinstance(static, types.FunctionType):
                if attr not in methods and all(attr != t[0] for t in todo):
                    todo.append((attr, static))
            elif static is not None and hasattr(type(static), "__get__"):
                return f"it reads self.{attr} through a {type(static).__name__} of the class"
    return methods


def _match_source(cls: type) -> Convention | str:
    return _match_known(cls)[0]


def _known_origin(cls: type) -> str | None:
    """The class ("model.Class") whose known forward (or known refusal) ``cls``'s code is, or
    None."""
    return _match_known(cls)[1]


def _match_known(cls: type) -> tuple[Convention | str, str | None]:
    """(:func:`_match_source`'s decision, the origin of the known forward it matched or None)."""
    forward = inspect.getattr_static(cls, "forward", None)
    if forward is nn.Module.forward:
        return "it has no forward", None
    if forward is nn.LayerNorm.forward:  # a subclass that keeps torch's forward
        return NAMED_CONVENTIONS["layer_norm"], None
    if not isinstance(forward, types.FunctionType):
        return f"its forward is a {type(forward).__name__}, not a plain function", None
    code = forward.__code__
    inputs = list(code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount])
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
        inputs.append("*args/**kwargs")
    # one input, or two (a gated norm's x and z); *args/**kwargs only alone, as one input
    if len(inputs) != 1 and (len(inputs) != 2 or inputs[-1] == "*args/**kwargs"):
        return (
            f"its forward takes {', '.join(inputs) or 'nothing'} besides self; this library's "
            "ops normalize one tensor, or one and its gate (conditioned norms keep their own "
            "forward)"
        ), None
    candidates = _known().get(code.co_names)
    if candidates is not None:
        methods = _source_methods(cls, forward)
        if isinstance(methods, str):
            return methods, None
        for known_methods, conv, origin in candidates:
            if methods == known_methods:
                if isinstance(conv, Convention) and conv.activation_attr is not None:
                    return _act2fn_problem() or conv, origin
                return conv, origin
    if len(inputs) == 2:
        return (
            f"its forward takes {', '.join(inputs)} besides self and is none of the known gated "
            "normalization forwards (hf._KNOWN_FORWARDS; a gated norm that computes one of the "
            "conventions can be declared with hf.register)"
        ), None
    return (
        "its forward is none of the known normalization forwards (hf._KNOWN_FORWARDS; if it "
        "computes one of the conventions, declare it with hf.register)"
    ), None


# ----------------------------------------------------------------------------------------------
# Registry and the per-class decision (cached: a dict lookup per class after the first).
# ----------------------------------------------------------------------------------------------
_registered_classes: dict[type, Convention | None] = {}
_registered_names: dict[str, Convention | None] = {}
# class -> (its forward when decided, the decision); weak keys: classes can be garbage-collected.
_recognized: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register(cls: type | str, convention: Convention | str | None) -> None:
    """Declare how ``cls`` computes: a :class:`Convention`, the name of one in
    :data:`NAMED_CONVENTIONS`, or ``None`` to never patch the class. ``cls`` is a class or its
    qualified name (``"package.module.ClassName"``; nothing is imported). A registration wins over
    the table and the automatic recognition; register before patching.

    Args:
        cls (type or str): a ``torch.nn.Module`` subclass or its qualified name.
        convention (Convention or str or None): how it computes; a name is one of
            :data:`NAMED_CONVENTIONS` (``"llama"``, ``"gemma"``, ``"olmo2"``, ``"t5"``,
            ``"layer_norm"``, and the gated ``"qwen3_next_gated"``, ``"kimi_linear_gated"``,
            ``"mamba2_gated"``, ``"falcon_h1_gated"``).

    Example::

        >>> from rmsnorm.integrations import hf
        >>> class Norm(torch.nn.Module):  # computes as Llama's RMSNorm
        ...     def __init__(self, n):
        ...         super().__init__()
        ...         self.weight = torch.nn.Parameter(torch.ones(n))
        ...         self.variance_epsilon = 1e-6
        ...     def forward(self, x):
        ...         h = x.float()
        ...         h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        ...         return self.weight * h.to(x.dtype)
        >>> hf.register(Norm, "llama")
        >>> hf.convention_of(Norm).casting_mode
        'llama'
        >>> hf.register("mypackage.modeling.OtherNorm", None)  # never patch this one
    """
    if isinstance(convention, str):
        if convention not in NAMED_CONVENTIONS:
            raise ValueError(
                f"convention must be a Convention, None or one of {sorted(NAMED_CONVENTIONS)}, "
                f"got {convention!r}"
            )
        convention = NAMED_CONVENTIONS[convention]
    elif convention is not None and not isinstance(convention, Convention):
        raise TypeError(
            f"convention must be a Convention, a name or None, got {type(convention).__name__}"
        )
    if isinstance(cls, type):
        if not issubclass(cls, nn.Module):
            raise TypeError(f"cls must be a torch.nn.Module subclass, got {_qualname(cls)}")
        _registered_classes[cls] = convention
    elif isinstance(cls, str) and "." in cls and all(p.isidentifier() for p in cls.split(".")):
        _registered_names[cls] = convention
    else:
        raise TypeError(
            f"cls must be a class or a qualified class name 'package.module.Class', got {cls!r}"
        )


def _decide(cls: type) -> Convention | str:
    """The convention of ``cls``, or why it has none (a short reason)."""
    if cls in _registered_classes or _qualname(cls) in _registered_names:
        conv = _registered_classes.get(cls, _registered_names.get(_qualname(cls)))
        return conv if conv is not None else "it is registered as not to be patched"
    conv = CONVENTIONS.get(_qualname(cls))
    if conv is not None:
        return conv
    forward = getattr(cls, "forward", None)
    cached = _recognized.get(cls)
    if cached is not None and cached[0] is forward:  # the class's forward has not been replaced
        return cached[1]
    own = getattr(forward, "_rmsnorm_convention", None)  # patched by patch_classes
    result = own if own is not None else _match_source(cls)
    _recognized[cls] = (forward, result)
    return result


def convention_of(cls_or_module: type | nn.Module) -> Convention:
    """The convention :func:`patch` uses for a class (or a module: its class, and the module's own
    attributes are checked), from :func:`register`, :data:`CONVENTIONS` or the known forwards.
    Raises ``ValueError`` naming the class and why it is not patched.

    Args:
        cls_or_module (type or torch.nn.Module): a norm class, or one of its instances.

    Returns:
        Convention: how :func:`patch` would run it.

    Example::

        >>> from rmsnorm.integrations import hf
        >>> hf.convention_of(torch.nn.LayerNorm).model_types  # patched only inside these models
        ('gpt2', 'gpt_neox')
        >>> hf.convention_of(torch.nn.Linear)
        Traceback (most recent call last):
        ...
        ValueError: torch.nn.modules.linear.Linear is not patched: its forward is none of ...
    """
    module = cls_or_module if isinstance(cls_or_module, nn.Module) else None
    cls = type(module) if module is not None else cls_or_module
    if not isinstance(cls, type):
        raise TypeError(f"expected a class or a torch.nn.Module, got {cls_or_module!r}")
    cls = _base_of(cls) or cls
    result = _decide(cls)
    if isinstance(result, str):
        raise ValueError(f"{_qualname(cls)} is not patched: {result}")
    if module is not None:
        problem = _instance_problem(module, result)
        if problem is not None:
            raise ValueError(f"{_qualname(cls)} is not patched: {problem}")
    return result


def _instance_problem(module: nn.Module, conv: Convention) -> str | None:
    """Why this module cannot be run by ``conv`` although its class can (None when it can)."""
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
    params = [("weight", with_weight), ("bias", conv.bias)]
    for attr, used in params:
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
    """:func:`_instance_problem` for the attributes of gated and grouped conventions."""
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
    if attr is not None and _ACT2FN_NAMES.get(getattr(module, attr, None)) is None:
        return (
            f"its {attr} is {getattr(module, attr, None)!r}: the gate activations this library "
            f"computes are ACT2FN's {sorted(_ACT2FN_NAMES)}"
        )
    attr = conv.fp32_reductions_attr
    if attr is not None and getattr(module, attr, None) is not True:
        return (
            f"its {attr} is {getattr(module, attr, None)!r}: it then reduces in the input dtype, "
            "which this library does not do in float16 / bfloat16 (it always reduces in float32; "
            "a half-precision sum of squares overflows float16 past |x| ≈ 256)"
        )
    return None


# ----------------------------------------------------------------------------------------------
# The replacement forwards: one function per convention, made once (no lookups per call).
# ----------------------------------------------------------------------------------------------
def _t5_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """T5LayerNorm: x̂ = x·rsqrt(mean(x²) + ε) in promote(x, fp32); x̂ is cast to the weight's dtype
    when that is fp16/bf16; the result is weight * x̂ (so fp32 weights give an fp32 output)."""
    shape = x.shape[-1]
    if weight.dtype in _HALF:
        if x.dtype == weight.dtype:
            return rms_norm(x, shape, weight, eps, casting_mode="llama")
        # Mixed half weight / other input (rare): the literal T5 expression, normalization fused.
        xhat = rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), shape, None, eps)
        return weight * xhat.to(weight.dtype)
    # fp32/fp64 weight: x̂ stays in fp32 (exact upcast of a half input), product in promote(x̂, w).
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return rms_norm(x, shape, weight, eps, casting_mode="llama")


@functools.cache
def _forward_for(conv: Convention):
    eps_attr, fixed_eps, casting, offset = conv.eps_attr, conv.eps, conv.casting_mode, conv.offset
    if conv.kind == "layer":
        shape_attr, with_weight, with_bias = conv.shape_attr, conv.weight, conv.bias

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return layer_norm(
                input,
                getattr(self, shape_attr) if shape_attr else input.shape[-1],
                self.weight if with_weight else None,
                self.bias if with_bias else None,
                getattr(self, eps_attr) if eps_attr else fixed_eps,
            )

    elif conv.cast_to_weight:

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            eps = getattr(self, eps_attr) if eps_attr else fixed_eps
            return _t5_norm(hidden_states, self.weight, eps)

    elif conv.gate is not None:
        forward = _gated_forward(conv)

    elif conv.weight and not conv.bias and not conv.weight_flag and eps_attr and not _grouped(conv):
        # The hot path of nearly every decoder (Llama, Gemma, OLMo 2 and their copies).
        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return rms_norm(
                hidden_states, hidden_states.shape[-1], self.weight, getattr(self, eps_attr),
                casting_mode=casting, offset=offset,
            )  # fmt: skip

    elif not _grouped(conv):
        flag, with_weight, with_bias = conv.weight_flag, conv.weight, conv.bias

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            use_weight = getattr(self, flag) if flag else with_weight
            return rms_norm(
                hidden_states, hidden_states.shape[-1], self.weight if use_weight else None,
                getattr(self, eps_attr) if eps_attr else fixed_eps,
                casting_mode=casting, offset=offset, bias=self.bias if with_bias else None,
            )  # fmt: skip

    else:
        forward = _grouped_forward(conv)

    forward.__qualname__ = forward.__name__ = "forward"
    forward.__doc__ = f"rmsnorm's op with the convention {conv}"
    forward._rmsnorm_convention = conv  # marks our forwards (unpatch, is_patched)
    return forward


def _grouped(conv: Convention) -> bool:
    """Whether ``conv`` uses an option of the plain forward beyond the common ones."""
    return bool(
        conv.group_size_attr or conv.n_groups_attr or conv.ranks or conv.offset_in_weight_dtype
        or conv.optional_params or conv.fp32_reductions_attr
    )  # fmt: skip


def _group_size(module: nn.Module, conv: Convention, n: int) -> int | None:
    """g for a row of n elements from the module's group attribute (None: the whole row)."""
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


def _check_rank(module: nn.Module, conv: Convention, x: torch.Tensor) -> None:
    if conv.ranks and x.dim() not in conv.ranks:
        ranks = " or ".join(f"{r}-D" for r in conv.ranks)
        raise ValueError(
            f"{type(module).__name__} takes {ranks} hidden_states, as its own forward does; got "
            f"shape {tuple(x.shape)}"
        )


def _gated_forward(conv: Convention):
    eps_attr, fixed_eps, casting, offset = conv.eps_attr, conv.eps, conv.casting_mode, conv.offset
    required = conv.gate == "required"
    order, order_attr = conv.norm_before_gate, conv.norm_before_gate_attr
    act, act_attr = conv.activation, conv.activation_attr

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None):
        if gate is None and required:
            raise TypeError(
                f"{type(self).__name__}.forward needs a gate: its own forward multiplies by "
                "act(gate) and fails without one; got gate=None"
            )
        _check_rank(self, conv, hidden_states)
        n = hidden_states.shape[-1]
        activation = act
        if act_attr is not None:
            name = getattr(self, act_attr)
            activation = _ACT2FN_NAMES.get(name)
            if activation is None:
                raise ValueError(
                    f"{type(self).__name__}.{act_attr} is {name!r}; the gate activations this "
                    f"library computes are ACT2FN's {sorted(_ACT2FN_NAMES)}"
                )
        return gated_rms_norm(
            hidden_states, gate, n, self.weight,
            getattr(self, eps_attr) if eps_attr else fixed_eps,
            group_size=_group_size(self, conv, n),
            norm_before_gate=getattr(self, order_attr) if order_attr else order,
            activation=activation, casting_mode=casting, offset=offset,
        )  # fmt: skip

    return forward


def _grouped_forward(conv: Convention):
    eps_attr, fixed_eps, casting, offset = conv.eps_attr, conv.eps, conv.casting_mode, conv.offset
    flag, with_weight, with_bias = conv.weight_flag, conv.weight, conv.bias
    in_weight_dtype, reductions = conv.offset_in_weight_dtype, conv.fp32_reductions_attr

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        _check_rank(self, conv, hidden_states)
        if reductions and hidden_states.dtype in _HALF and getattr(self, reductions) is not True:
            raise ValueError(
                f"{type(self).__name__}.{reductions} is not True: it reduces in the input dtype, "
                f"which this library does not do in {hidden_states.dtype} (unpatch the class)"
            )
        n = hidden_states.shape[-1]
        weight = self.weight if (getattr(self, flag) if flag else with_weight) else None
        bias = self.bias if with_bias else None
        scale_offset = offset
        if in_weight_dtype:  # offset + γ rounded in γ's dtype, as the class sums it
            weight, scale_offset = offset + weight, 0.0
        eps = getattr(self, eps_attr) if eps_attr else fixed_eps
        g = _group_size(self, conv, n)
        if bias is not None and casting == "llama":
            out = (
                hidden_states.dtype
                if weight is None
                else torch.promote_types(hidden_states.dtype, weight.dtype)
            )
            if torch.promote_types(out, bias.dtype) != out:  # the class adds in promote(y, β)
                y = rms_norm(hidden_states, n, weight, eps, casting_mode=casting, group_size=g)
                return y + bias
        return rms_norm(
            hidden_states, n, weight, eps, casting_mode=casting, offset=scale_offset, bias=bias,
            group_size=g,
        )  # fmt: skip

    return forward


def _is_ours(fn: object) -> bool:
    return hasattr(getattr(fn, "__func__", fn), "_rmsnorm_convention")


# ----------------------------------------------------------------------------------------------
# Instances: a patched module's class becomes a subclass of its own (same name, module and
# qualified name) whose forward is this library's. Nothing is stored in the instance, so the patch
# follows the module through copy.deepcopy, pickle and torch.save / torch.load: the subclass
# pickles as "the original class, patched with this convention" and is rebuilt on loading.
# ----------------------------------------------------------------------------------------------
_patched_types: dict[tuple[type, Convention], type] = {}
# A module that already had its own instance-level forward (e.g. another library's hook) gets it
# back on unpatch; weak keys so a patched model can still be garbage-collected.
_instance_originals: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _reduce_patched(self: nn.Module, protocol: int):
    cls = type(self)
    base = cls.__dict__.get("_rmsnorm_base")
    if base is None:  # a class derived from ours by someone else: the default rules apply
        return object.__reduce_ex__(self, protocol)
    _, _, *rest = object.__reduce_ex__(self, max(protocol, 2))
    return (_new_patched, (base, cls._rmsnorm_convention), *rest)


def _new_patched(base: type, convention: Convention) -> nn.Module:
    """Unpickling: an empty instance of ``base`` patched with ``convention`` (state follows)."""
    cls = _patched_type(base, convention)
    return cls.__new__(cls)


def _patched_type(base: type, conv: Convention) -> type:
    cls = _patched_types.get((base, conv))
    if cls is None:
        namespace = {
            "forward": _forward_for(conv),
            "__reduce_ex__": _reduce_patched,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "__doc__": base.__doc__,
            "_rmsnorm_base": base,
            "_rmsnorm_convention": conv,
        }
        cls = type(base)(base.__name__, (base,), namespace)
        _patched_types[(base, conv)] = cls
    return cls


def _base_of(cls: type) -> type | None:
    """The original class when ``cls`` is one of our patched subclasses."""
    return cls.__dict__.get("_rmsnorm_base")


def _model_type(model: nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "model_type", None)


def _looks_like_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return "Norm" in name and not name.endswith(("Model", "Layer", "Block"))


def patch(model: nn.Module) -> list[str]:
    """Make every normalization layer of a recognised class in ``model`` run this library's op.

    A class is recognised by :func:`register`, by :data:`CONVENTIONS` (``torch.nn.LayerNorm``
    only inside GPT-2 / GPT-NeoX models) or when its forward is one of the known normalization
    forwards (see :func:`convention_of`), the gated ones (``forward(hidden_states, gate)``)
    among them. Each such module gets a forward reading the same parameters and attributes with
    the class's convention; nothing else changes (parameters, ``state_dict``,
    hooks, the class name) and no tensor is modified. The patch survives ``copy.deepcopy``,
    pickling and ``torch.save``. Returns the names of the patched modules. Raises ``ValueError``
    when there is none; warns, with the reason, about norm layers it leaves alone. Undo with
    :func:`unpatch`.

    Args:
        model (torch.nn.Module): a Hugging Face model, or any model holding recognised norm
            layers; changed in place.

    Returns:
        list[str]: the names of the patched modules.

    Example::

        >>> import types
        >>> from rmsnorm.integrations import hf
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        >>> model.config = types.SimpleNamespace(model_type="gpt2")  # as in a GPT-2 model
        >>> x = torch.randn(4, 8)
        >>> before = model(x)
        >>> hf.patch(model)
        ['1']
        >>> hf.is_patched(model[1]), type(model[1]).__name__
        (True, 'LayerNorm')
        >>> torch.allclose(model(x), before, atol=1e-6)
        True
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    model_type = _model_type(model)
    patched: list[str] = []
    left: dict[str, str] = {}  # class -> why it was left alone
    odd: dict[tuple[str, str], list[str]] = {}  # (class, why) -> modules of a patchable class
    for name, module in model.named_modules():
        cls = type(module)
        if _base_of(cls) is not None or _is_ours(getattr(cls, "forward", None)):
            patched.append(name)  # patched already (this instance, or its whole class)
            continue
        conv = _decide(cls)
        if isinstance(conv, str):
            if _looks_like_norm(module):
                left.setdefault(_qualname(cls), conv)
            continue
        if conv.model_types and model_type not in conv.model_types:
            left.setdefault(
                _qualname(cls),
                f"it is shared by every model and patched only in models of type "
                f"{list(conv.model_types)}; use rmsnorm.integrations.replace_norms for others",
            )
            continue
        problem = _instance_problem(module, conv)
        if problem is not None:
            odd.setdefault((_qualname(cls), problem), []).append(name)
            continue
        foreign = module.__dict__.pop("forward", None)
        if foreign is not None:
            _instance_originals[module] = foreign
        module.__class__ = _patched_type(cls, conv)
        patched.append(name)
    for (cls_name, why), names in odd.items():
        left[f"{cls_name} in {len(names)} module(s), e.g. {names[0]!r}"] = why
    reasons = "; ".join(f"{cls}: {why}" for cls, why in sorted(left.items()))
    if not patched:
        raise ValueError(
            f"no normalization layer of a known class in {type(model).__name__} "
            f"(model_type={model_type!r})" + (f"; left alone: {reasons}" if reasons else "")
        )
    if reasons:
        warnings.warn(
            f"rmsnorm.integrations.hf.patch: left these norm layers unpatched: {reasons}",
            stacklevel=2,
        )
    return patched


def unpatch(model: nn.Module) -> list[str]:
    """Restore the original class (and any instance-level forward it had) of every module
    :func:`patch` patched in ``model``, also in a copy or an unpickled copy of a patched model.
    Returns the names of the restored modules.

    Args:
        model (torch.nn.Module): a model :func:`patch` changed (or a copy of one).

    Returns:
        list[str]: the names of the restored modules.

    Example::

        >>> import copy, types
        >>> from rmsnorm.integrations import hf
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        >>> model.config = types.SimpleNamespace(model_type="gpt2")  # as in a GPT-2 model
        >>> hf.patch(model)
        ['1']
        >>> hf.unpatch(copy.deepcopy(model)), hf.unpatch(model)
        (['1'], ['1'])
        >>> hf.is_patched(model[1])
        False
    """
    restored = []
    for name, module in model.named_modules():
        base = _base_of(type(module))
        if base is None:
            continue
        module.__class__ = base
        original = _instance_originals.pop(module, None)
        if original is not None:
            module.forward = original
        restored.append(name)
    return restored


def is_patched(module: nn.Module) -> bool:
    """True when ``module``'s forward (its own or its class's) is one of this library's.

    Args:
        module (torch.nn.Module): any module.

    Example::

        >>> from rmsnorm.integrations import hf
        >>> hf.is_patched(torch.nn.LayerNorm(8))
        False
    """
    return _is_ours(module.forward)


# ----------------------------------------------------------------------------------------------
# Classes (before a model is built)
# ----------------------------------------------------------------------------------------------
_class_originals: dict[type, object] = {}  # class -> its own forward (None: it inherited one)
_MISSING = object()


def _resolve(cls_or_name: type | str) -> tuple[type, Convention]:
    if isinstance(cls_or_name, str) and "." in cls_or_name:
        module_name, _, attr = cls_or_name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import the class {cls_or_name!r}: {exc}") from exc
    elif isinstance(cls_or_name, type):
        cls = cls_or_name
    else:
        raise ValueError(f"classes must be classes or qualified class names, got {cls_or_name!r}")
    if not issubclass(cls, nn.Module):
        raise ValueError(f"{_qualname(cls)} is not a torch.nn.Module class")
    conv = convention_of(cls)
    if conv.model_types:
        raise ValueError(
            f"{_qualname(cls)} is shared by every model; patching the class would change all of "
            "them. Use patch(model) on a built model, or rmsnorm.integrations.replace_norms(model)"
        )
    return cls, conv


def _modeling_module_names() -> list[str]:
    """``transformers.models.<model>.modeling_<name>`` of the installed transformers, found on
    disk without importing them (none when transformers is not installed)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = os.path.join(spec.submodule_search_locations[0], "models")
    names = []
    for model in sorted(os.listdir(root)):
        folder = os.path.join(root, model)
        if not os.path.isdir(folder):
            continue
        for file in sorted(os.listdir(folder)):
            if file.startswith("modeling_") and file.endswith(".py"):
                if not file.startswith(("modeling_tf_", "modeling_flax_")):
                    names.append(f"transformers.models.{model}.{file[:-3]}")
    return names


def _module_classes(module: types.ModuleType) -> list[type]:
    """The torch.nn.Module classes defined in ``module``."""
    return [
        c
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, nn.Module) and c.__module__ == module.__name__
    ]


def _recognised_classes(names: list[str], skip_missing: bool) -> list[tuple[type, Convention]]:
    found = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a model whose optional dependency is missing (e.g. torchaudio)
            if skip_missing:
                continue
            raise
        for cls in _module_classes(module):
            conv = _decide(cls)
            if isinstance(conv, Convention) and not conv.model_types:
                found.append((cls, conv))
    return found


def _expand(item: type | str) -> list[tuple[type, Convention]]:
    """A class, a qualified class name, or a model (a package of ``transformers.models``: its
    recognised classes)."""
    if not (isinstance(item, str) and item.isidentifier()):
        return [_resolve(item)]
    modules = [n for n in _modeling_module_names() if n.split(".")[2] == item]
    if not modules:
        raise ValueError(
            f"{item!r} is neither a class nor a model of the installed transformers "
            "(a package name of transformers.models, e.g. 'qwen3_moe')"
        )
    found = _recognised_classes(modules, skip_missing=False)
    if not found:
        raise ValueError(f"transformers model {item!r} has no recognised normalization class")
    return found


def _expand_all(classes: Iterable[type | str]) -> list[tuple[type, Convention]]:
    """:func:`_expand` of each item of a list of classes, class names and model names."""
    if isinstance(classes, (str, type)):
        raise TypeError("classes must be a list of classes or names (or None), not one")
    return [pair for item in classes for pair in _expand(item)]


def patch_classes(classes: Iterable[type | str] | None = None) -> list[str]:
    """Swap the ``forward`` of whole classes, so models built afterwards use this library's ops.

    ``classes``: classes or qualified class names, each recognised as by :func:`convention_of`
    (else ``ValueError`` naming it and why), or model names (packages of ``transformers.models``,
    e.g. ``"qwen3_moe"``: their recognised classes). ``None`` means every recognised class of the
    installed transformers, which imports all its modeling files (about 9 s and 330 MB with
    transformers 5.24). ``torch.nn.LayerNorm`` is refused: it is shared by every model. Instances
    are not checked one by one as :func:`patch` does; the op's own checks reject one it cannot run
    (e.g. a 2-D weight). Returns the qualified names patched. Undo with :func:`unpatch_classes`.

    Args:
        classes (iterable of type or str, optional): classes, qualified class names or model
            names; ``None`` for every recognised class of the installed transformers.

    Returns:
        list[str]: the qualified names of the classes patched.

    Example::

        >>> from rmsnorm.integrations import hf
        >>> class Norm(torch.nn.Module):  # its forward as Llama's RMSNorm (left out here)
        ...     def __init__(self, n):
        ...         super().__init__()
        ...         self.weight = torch.nn.Parameter(torch.ones(n))
        ...         self.variance_epsilon = 1e-6
        >>> hf.register(Norm, "llama")
        >>> [name.rsplit(".", 1)[-1] for name in hf.patch_classes([Norm])]
        ['Norm']
        >>> hf.is_patched(Norm(8))  # built after: runs this library's op
        True
        >>> [name.rsplit(".", 1)[-1] for name in hf.unpatch_classes([Norm])]
        ['Norm']
    """
    if classes is None:
        resolved = _recognised_classes(_modeling_module_names(), skip_missing=True)
    else:
        resolved = _expand_all(classes)
    done = []
    for cls, conv in resolved:
        if cls not in _class_originals:
            _class_originals[cls] = cls.__dict__.get("forward", _MISSING)
            cls.forward = _forward_for(conv)
        done.append(_qualname(cls))
    return done


def unpatch_classes(classes: Iterable[type | str] | None = None) -> list[str]:
    """Restore the forward of classes patched by :func:`patch_classes` (``None``: all of them).
    Returns the qualified names restored.

    Args:
        classes (iterable of type or str, optional): as :func:`patch_classes`; ``None`` for every
            class it patched.

    Returns:
        list[str]: the qualified names of the classes restored (those not patched are skipped).

    Example::

        >>> from rmsnorm.integrations import hf
        >>> class Norm(torch.nn.Module):  # its forward as Llama's RMSNorm (left out here)
        ...     def __init__(self, n):
        ...         super().__init__()
        ...         self.weight = torch.nn.Parameter(torch.ones(n))
        ...         self.variance_epsilon = 1e-6
        >>> hf.register(Norm, "llama")
        >>> patched = hf.patch_classes([Norm])
        >>> hf.unpatch_classes([Norm]) == patched, hf.unpatch_classes([Norm])  # once
        (True, [])
        >>> hf.is_patched(Norm(8))
        False
    """
    targets = list(_class_originals) if classes is None else [c for c, _ in _expand_all(classes)]
    done = []
    for cls in targets:
        original = _class_originals.pop(cls, None)
        if original is None:
            continue
        if original is _MISSING:
            del cls.forward
        else:
            cls.forward = original
        done.append(_qualname(cls))
    return done
