"""What a patched module runs and is: one replacement forward per convention (made once, so that a
call does no lookups of its own), and the patched subclass that carries it, which pickles as "the
original class, patched with this convention"."""

from __future__ import annotations

import functools

import torch
from torch import nn

from ...functional import gated_rms_norm, layer_norm, rms_norm
from ...modules import _parameter
from .conventions import ACT2FN_NAMES, Convention, group_size

__all__ = ["forward_for", "is_replacement", "patched_class", "base_of", "rebuild_patched"]

_HALF = (torch.float16, torch.bfloat16)


@functools.cache
def forward_for(conv: Convention):
    """The replacement ``forward`` for classes of convention ``conv``: it reads the module's
    parameters and attributes as the convention says and calls this library's op. It carries the
    convention as ``forward._rmsnorm_convention``, the mark :func:`is_replacement` looks for."""
    eps_attr, casting, offset = conv.eps_attr, conv.casting_mode, conv.offset
    if conv.kind == "layer":
        shape_attr, with_weight, with_bias = conv.shape_attr, conv.weight, conv.bias

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return layer_norm(
                input,
                getattr(self, shape_attr) if shape_attr else input.shape[-1],
                _parameter(self, "weight") if with_weight else None,
                _parameter(self, "bias") if with_bias else None,
                conv.eps_of(self),
            )

    elif conv.cast_to_weight:

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return _t5_norm(hidden_states, _parameter(self, "weight"), conv.eps_of(self))

    elif conv.gate is not None:
        forward = _gated_forward(conv)

    elif conv.weight and not conv.bias and not conv.weight_flag and eps_attr and not conv.extended:
        # The hot path of nearly every decoder (Llama, Gemma, OLMo 2 and their copies): no
        # lookups beyond the weight and ε.
        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            n = hidden_states.shape[-1]
            eps = getattr(self, eps_attr)
            return rms_norm(
                hidden_states,
                n,
                _parameter(self, "weight"),
                eps,
                casting_mode=casting,
                offset=offset,
            )

    elif not conv.extended:
        flag, with_weight, with_bias = conv.weight_flag, conv.weight, conv.bias

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            use_weight = getattr(self, flag) if flag else with_weight
            weight = _parameter(self, "weight") if use_weight else None
            bias = _parameter(self, "bias") if with_bias else None
            n, eps = hidden_states.shape[-1], conv.eps_of(self)
            return rms_norm(
                hidden_states, n, weight, eps, casting_mode=casting, offset=offset, bias=bias
            )

    else:
        forward = _extended_forward(conv)

    forward.__qualname__ = forward.__name__ = "forward"
    forward.__doc__ = f"rmsnorm's op with the convention {conv}"
    forward._rmsnorm_convention = conv  # marks our forwards (unpatch, is_patched)
    return forward


def is_replacement(fn: object) -> bool:
    """Whether ``fn`` (a function or a bound method) is one of :func:`forward_for`'s."""
    return hasattr(getattr(fn, "__func__", fn), "_rmsnorm_convention")


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


def _check_rank(module: nn.Module, conv: Convention, x: torch.Tensor) -> None:
    if conv.ranks and x.dim() not in conv.ranks:
        ranks = " or ".join(f"{r}-D" for r in conv.ranks)
        raise ValueError(
            f"{type(module).__name__} takes {ranks} hidden_states, as its own forward does; got "
            f"shape {tuple(x.shape)}"
        )


def _gated_forward(conv: Convention):
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
            activation = ACT2FN_NAMES.get(name)
            if activation is None:
                raise ValueError(
                    f"{type(self).__name__}.{act_attr} is {name!r}; the gate activations this "
                    f"library computes are ACT2FN's {sorted(ACT2FN_NAMES)}"
                )
        return gated_rms_norm(
            hidden_states,
            gate,
            n,
            _parameter(self, "weight"),
            conv.eps_of(self),
            group_size=group_size(self, conv, n),
            norm_before_gate=getattr(self, order_attr) if order_attr else order,
            activation=activation,
            casting_mode=conv.casting_mode,
            offset=conv.offset,
        )

    return forward


def _extended_forward(conv: Convention):
    """The forward of an ungated RMSNorm with an option of :attr:`Convention.extended`."""
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
        weight = (
            _parameter(self, "weight") if (getattr(self, flag) if flag else with_weight) else None
        )
        bias = _parameter(self, "bias") if with_bias else None
        scale_offset = conv.offset
        if in_weight_dtype:  # offset + γ rounded in γ's dtype, as the class sums it
            weight, scale_offset = scale_offset + weight, 0.0
        eps = conv.eps_of(self)
        g = group_size(self, conv, n)
        casting = conv.casting_mode
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
            hidden_states,
            n,
            weight,
            eps,
            casting_mode=casting,
            offset=scale_offset,
            bias=bias,
            group_size=g,
        )

    return forward


# A patched module's class becomes a subclass of its own (same name, module and qualified name)
# whose forward is this library's. Nothing is stored in the instance, so the patch follows the
# module through copy.deepcopy, pickle and torch.save / torch.load: the subclass pickles as "the
# original class, patched with this convention" and is rebuilt on loading.
_patched_classes: dict[tuple[type, Convention], type] = {}


def patched_class(base: type, conv: Convention) -> type:
    """The subclass of ``base`` whose forward is :func:`forward_for` ``(conv)``, made once per
    (class, convention); it has ``base``'s name, module, qualified name and docstring."""
    cls = _patched_classes.get((base, conv))
    if cls is None:
        namespace = {
            "forward": forward_for(conv),
            "__reduce_ex__": _reduce_patched,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "__doc__": base.__doc__,
            "_rmsnorm_base": base,
            "_rmsnorm_convention": conv,
        }
        cls = type(base)(base.__name__, (base,), namespace)
        _patched_classes[(base, conv)] = cls
    return cls


def base_of(cls: type) -> type | None:
    """The original class when ``cls`` is one of :func:`patched_class`'s, else None."""
    return cls.__dict__.get("_rmsnorm_base")


def _reduce_patched(self: nn.Module, protocol: int):
    cls = type(self)
    base = base_of(cls)
    if base is None:  # a class derived from ours by someone else: the default rules apply
        return object.__reduce_ex__(self, protocol)
    _, _, *rest = object.__reduce_ex__(self, max(protocol, 2))
    return (rebuild_patched, (base, cls._rmsnorm_convention), *rest)


def rebuild_patched(base: type, convention: Convention) -> nn.Module:
    """Unpickling: an empty instance of ``base`` patched with ``convention`` (its state follows).
    Pickles of patched modules name this function: moving or renaming it breaks loading them."""
    cls = patched_class(base, convention)
    return cls.__new__(cls)
